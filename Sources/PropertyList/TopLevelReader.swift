// A few top-level keys of a property list's dictionary, read from a stream in chunks: what `opqueuectl list` and
// `clean` and the outbox's retention need of a result.plist (job, status, finishedAt…) without building — or even
// holding — the rest. A result of a million operations is ~300 MB of XML; its `operations` array is skipped by
// counting tags, never held, and reading stops once every key asked for has been seen.
//
// Strategy: a small tokenizer walks the document's structure (prolog, <plist>, the top <dict>, its keys); a value
// whose key is asked for is copied out, start tag to end tag, and read as a document of its own by the ordinary XML
// reader (a plain string or number directly). A file that declares ISO-8859-1 or US-ASCII has its declaration put
// before each value, so that it reads the same. A binary property list (never what the daemon writes) is read whole,
// up to a bound, and parsed as usual. Scanning goes through memchr and memcmp: 100,000 small results are read in
// well under a second, and a debug build is not many times slower.
// What it trusts: nothing: every value kept is bounded, errors name the byte offset, and skipping keeps no stack.

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

public enum PlistTopLevel {
    /// The entries of the top-level dictionary whose keys are in `keys`, in document order, from the property list
    /// that `source` yields (it fills the buffer it is given and returns the bytes written, 0 at the end, or a
    /// negative number on an error). A value over `maxValueBytes` of XML, or a binary list over `maxBinaryBytes`,
    /// is refused. Reading stops once every key has been seen: a later repetition of a key is not looked for.
    public static func read(keys: Set<String>, maxValueBytes: Int = 1 << 20, maxBinaryBytes: Int = 64 << 20,
                            from source: (UnsafeMutableRawBufferPointer) -> Int) throws(PlistError) -> PlistDictionary {
        do {
            let chunk = 16 << 10
            let buffer = UnsafeMutablePointer<UInt8>.allocate(capacity: chunk)
            defer { buffer.deallocate() }
            return try withoutActuallyEscaping(source) { source throws -> PlistDictionary in
                var stream = ChunkStream(source: source, buffer: buffer, capacity: chunk)
                guard try stream.fill(6) != nil else { throw PlistError("the document is empty") }
                if stream.startsWith("bplist") { return try readBinary(&stream, keys: keys, limit: maxBinaryBytes) }
                var reader = TopLevelXMLReader(stream: stream, keys: keys, maxValueBytes: maxValueBytes)
                return try reader.read()
            }
        } catch let error as PlistError {
            throw error
        } catch {
            throw PlistError("\(error)")
        }
    }

    private static func readBinary(_ stream: inout ChunkStream, keys: Set<String>, limit: Int) throws -> PlistDictionary {
        var bytes: [UInt8] = []
        while let available = try stream.fill(1) {
            guard bytes.count + available <= limit else { throw PlistError("binary property list: larger than \(limit) bytes") }
            bytes += stream.take(available)
        }
        guard case .dictionary(let top) = try PropertyList.parse(bytes) else { throw PlistError("the top level is not a dictionary") }
        return PlistDictionary(top.entries.filter { keys.contains($0.key) })
    }
}

/// Bytes from a source, a chunk at a time (into the caller's buffer), with look-ahead within the chunk; what is
/// consumed may be copied out. Every method is `mutating`, even those that only look: the tokenizer calls them byte by
/// byte, and a struct is then neither copied at each call nor checked for exclusive access at run time (a class's
/// properties are, a debug build's cost several times over).
struct ChunkStream {
    private let source: (UnsafeMutableRawBufferPointer) -> Int
    private let buffer: UnsafeMutablePointer<UInt8>
    private let capacity: Int
    private var position = 0
    private var end = 0
    private var finished = false
    /// Bytes consumed so far, for errors (the offset in the file).
    private(set) var offset = 0
    /// While `copying`, consumed bytes are appended to `copy`, at most `copyLimit` of them: past that the copy stops
    /// growing and `copyOverflowed` says so.
    private(set) var copy: [UInt8] = []
    private var copying = false
    var copyLimit = Int.max
    private(set) var copyOverflowed = false

    init(source: @escaping (UnsafeMutableRawBufferPointer) -> Int, buffer: UnsafeMutablePointer<UInt8>, capacity: Int) {
        self.source = source
        self.buffer = buffer
        self.capacity = capacity
    }

    /// Starts copying what is consumed (a value being kept).
    mutating func startCopy() {
        copy.removeAll(keepingCapacity: true)
        copying = true
        copyOverflowed = false
    }

    /// Stops copying; what was copied.
    mutating func endCopy() -> [UInt8] {
        copying = false
        return copy
    }

    /// Makes at least `wanted` bytes available (at most a chunk) unless the source ends first; the bytes available,
    /// nil at the end.
    mutating func fill(_ wanted: Int) throws -> Int? {
        let wanted = min(wanted, capacity)
        while end - position < wanted && !finished {
            if position > 0 {
                memmove(buffer, buffer + position, end - position)
                end -= position
                position = 0
            }
            let count = source(UnsafeMutableRawBufferPointer(start: buffer + end, count: capacity - end))
            guard count >= 0 else { throw PlistError("at byte \(offset + end - position): the file could not be read") }
            if count == 0 { finished = true }
            end += count
        }
        return end > position ? end - position : nil
    }

    /// The byte `ahead` past the current one (filling as needed), nil past the end.
    mutating func peek(_ ahead: Int = 0) throws -> UInt8? {
        if position + ahead < end { return buffer[position + ahead] }
        guard let available = try fill(ahead + 1), available > ahead else { return nil }
        return buffer[position + ahead]
    }

    /// Whether the bytes available start with `prefix` (fill first to be sure to see it whole).
    mutating func startsWith(_ prefix: StaticString) -> Bool {
        let count = prefix.utf8CodeUnitCount
        return end - position >= count && memcmp(buffer + position, prefix.utf8Start, count) == 0
    }

    /// Consumes `count` available bytes.
    mutating func advance(_ count: Int) {
        offset += count
        if copying {
            if copy.count + count > copyLimit {
                copyOverflowed = true
            } else {
                copy.append(contentsOf: UnsafeBufferPointer(start: buffer + position, count: count))
            }
        }
        position += count
    }

    /// Consumes and returns `count` available bytes.
    mutating func take(_ count: Int) -> [UInt8] {
        let bytes = Array(UnsafeBufferPointer(start: buffer + position, count: count))
        advance(count)
        return bytes
    }

    /// Consumes white space (a scan of the bytes available, not a call per byte).
    mutating func skipSpace() throws {
        while try fill(1) != nil {
            let (from, limit) = (position, end)
            var i = from
            while i < limit, isSpace(buffer[i]) { i += 1 }
            if i > from { advance(i - from) }
            if i < limit { return }
        }
    }

    /// Consumes bytes up to the first `byte` (not included); false if the stream ends first.
    mutating func advance(upTo byte: UInt8) throws -> Bool {
        while let available = try fill(1) {
            if let found = memchr(buffer + position, Int32(byte), available) {
                advance(UnsafeRawPointer(found) - UnsafeRawPointer(buffer + position))
                return true
            }
            advance(available)
        }
        return false
    }

    /// Consumes bytes through the first occurrence of `terminator`; false if the stream ends first.
    mutating func advance(past terminator: StaticString) throws -> Bool {
        while try advance(upTo: terminator.utf8Start.pointee) {
            _ = try fill(terminator.utf8CodeUnitCount)
            if startsWith(terminator) {
                advance(terminator.utf8CodeUnitCount)
                return true
            }
            advance(1)
        }
        return false
    }

    /// At `<`: the start tag whole in the bytes available, without quotes in it (a plist's tags have no attributes
    /// but `version`), consumed: its name and whether it is empty (`<true/>`); nil to read it byte by byte.
    mutating func quickTag() -> (name: String, empty: Bool)? {
        let available = end - position
        guard available > 2, let close = memchr(buffer + position, Int32(UInt8(ascii: ">")), available) else { return nil }
        let length = UnsafeRawPointer(close) - UnsafeRawPointer(buffer + position)
        guard memchr(buffer + position, Int32(UInt8(ascii: "\"")), length) == nil,
              memchr(buffer + position, Int32(UInt8(ascii: "'")), length) == nil else { return nil }
        var nameEnd = 1
        while nameEnd < length, !isSpace(buffer[position + nameEnd]), buffer[position + nameEnd] != UInt8(ascii: "/") { nameEnd += 1 }
        guard nameEnd > 1 else { return nil }
        let name = String(decoding: UnsafeBufferPointer(start: buffer + position + 1, count: nameEnd - 1), as: UTF8.self)
        let empty = buffer[position + length - 1] == UInt8(ascii: "/")
        advance(length + 1)
        return (name, empty)
    }
}

/// The top-level dictionary's structure, walked over a `ChunkStream` (see the file's header).
struct TopLevelXMLReader {
    var stream: ChunkStream
    let keys: Set<String>
    let maxValueBytes: Int
    /// The document's XML declaration when it names an encoding other than UTF-8: put before each value read on its own.
    private var declaration: [UInt8] = []

    init(stream: ChunkStream, keys: Set<String>, maxValueBytes: Int) {
        self.stream = stream
        self.keys = keys
        self.maxValueBytes = maxValueBytes
        self.stream.copyLimit = maxValueBytes
    }

    mutating func read() throws -> PlistDictionary {
        _ = try stream.fill(5)
        if stream.startsWith("\u{FEFF}") { stream.advance(3) }
        _ = try stream.fill(5)
        if stream.startsWith("<?xml") {
            stream.startCopy()
            guard try stream.advance(past: "?>") else { throw fail("unterminated XML declaration") }
            // Any encoding but UTF-8 is left to the XML reader (which reads ISO-8859-1 and US-ASCII, refuses others).
            let text = stream.endCopy().map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }
            if Self.contains(text, "encoding"), !Self.contains(text, "utf-8"), !Self.contains(text, "utf8") { declaration = stream.copy }
        }
        try skipMisc()
        var tag = try startTag()
        if tag.name == "plist" && !tag.empty {
            try skipMisc()
            tag = try startTag()
        }
        guard tag.name == "dict" else { throw fail("the top level is not a dictionary") }
        var entries: [PlistDictionary.Entry] = []
        if tag.empty { return PlistDictionary() }
        var seen = Set<String>()
        while seen.count < keys.count {
            try skipMisc()
            if try atEndTag() { break }
            let key = try readKey()
            try skipMisc()
            if try atEndTag() { throw fail("the key '\(key.prefix(64))' has no value") }
            guard keys.contains(key) else {
                try skipElement()
                continue
            }
            let at = stream.offset
            stream.startCopy()
            try skipElement()
            let fragment = stream.endCopy()
            do {
                let plain = declaration.isEmpty ? Self.scalar(fragment) : nil
                entries.append(PlistDictionary.Entry(key: key, value: try plain ?? PropertyList.parse(declaration + fragment)))
            } catch {
                throw PlistError("at byte \(at): the value of '\(key.prefix(64))': \(error)")
            }
            seen.insert(key)
        }
        return PlistDictionary(entries)
    }

    /// Whether `bytes` hold `part`.
    static func contains(_ bytes: [UInt8], _ part: StaticString) -> Bool {
        let count = part.utf8CodeUnitCount
        return bytes.withUnsafeBufferPointer { b in
            guard let base = b.baseAddress else { return false }
            var at = 0
            while at + count <= b.count {
                if memcmp(base + at, part.utf8Start, count) == 0 { return true }
                at += 1
            }
            return false
        }
    }

    /// `<string>`, `<real>` or `<integer>` around plain text (no entity, no markup), in UTF-8: its value, as the XML
    /// reader would give it, without a reader; nil for anything else.
    static func scalar(_ fragment: [UInt8]) -> PlistValue? {
        let kinds: [(open: StaticString, close: StaticString)] = [
            ("<string>", "</string>"), ("<real>", "</real>"), ("<integer>", "</integer>"),
        ]
        return fragment.withUnsafeBufferPointer { bytes -> PlistValue? in
            guard let base = bytes.baseAddress else { return nil }
            for (kind, tags) in kinds.enumerated() {
                let open = tags.open.utf8CodeUnitCount, close = tags.close.utf8CodeUnitCount
                guard bytes.count >= open + close, memcmp(base, tags.open.utf8Start, open) == 0,
                      memcmp(base + bytes.count - close, tags.close.utf8Start, close) == 0 else { continue }
                let inner = UnsafeBufferPointer(start: base + open, count: bytes.count - open - close)
                guard memchr(base + open, Int32(UInt8(ascii: "<")), inner.count) == nil,
                      memchr(base + open, Int32(UInt8(ascii: "&")), inner.count) == nil else { return nil }
                if kind == 0 { return String(validating: inner, as: UTF8.self).map { .string($0) } }
                // Digits, sign, and for a real point and exponent (what the XML reader takes, less its spellings of
                // infinity and NaN, which it is left to read).
                let numeric = inner.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2B || $0 == 0x2D
                                                 || (kind == 1 && ($0 == 0x2E || $0 == 0x45 || $0 == 0x65)) }
                guard numeric, !inner.isEmpty else { return nil }
                let text = String(decoding: inner, as: UTF8.self)
                return kind == 1 ? Double(text).map { .real($0) } : Int(text).map { .integer($0) }
            }
            return nil
        }
    }

    /// `<key>…</key>`: its text (entities and CDATA resolved by the ordinary reader when it has any).
    private mutating func readKey() throws -> String {
        let tag = try startTag()
        guard tag.name == "key" else { throw fail("expected <key> in <dict>, found <\(tag.name.prefix(64))>") }
        if tag.empty { return "" }
        stream.startCopy()
        guard try stream.advance(upTo: UInt8(ascii: "<")) else { throw fail("<key> is not closed") }
        if stream.copyOverflowed { throw fail("a key longer than \(maxValueBytes) bytes") }
        var raw = stream.endCopy()
        _ = try stream.fill(6)
        if stream.startsWith("</key>"), !raw.contains(UInt8(ascii: "&")) {
            stream.advance(6)
            guard let key = String(validating: raw, as: UTF8.self), declaration.isEmpty || raw.allSatisfy({ $0 < 0x80 }) else {
                return try decodedKey(raw)
            }
            return key
        }
        // Entities, CDATA or comments inside the key: copied to its end tag and read as a string.
        stream.startCopy()
        guard try stream.advance(past: "</key>") else { throw fail("<key> is not closed") }
        raw += stream.endCopy().dropLast(6)
        return try decodedKey(raw)
    }

    private func decodedKey(_ raw: [UInt8]) throws -> String {
        let document = declaration + Array("<string>".utf8) + raw + Array("</string>".utf8)
        guard case .string(let key) = try PropertyList.parse(document) else { throw fail("a key that is not text") }
        return key
    }

    /// Consumes one element, its start tag to its end tag, keeping no stack: tags are counted. Comments, CDATA and
    /// processing instructions inside are passed over whole (a '<' in them is not a tag).
    private mutating func skipElement() throws {
        var depth = 0
        repeat {
            guard try stream.peek() == UInt8(ascii: "<") else {
                guard try stream.advance(upTo: UInt8(ascii: "<")) else { throw fail("an element is not closed") }
                continue
            }
            _ = try stream.fill(9)
            if stream.startsWith("<!--") {
                guard try stream.advance(past: "-->") else { throw fail("unterminated comment") }
            } else if stream.startsWith("<![CDATA[") {
                guard try stream.advance(past: "]]>") else { throw fail("unterminated CDATA section") }
            } else if stream.startsWith("<?") {
                guard try stream.advance(past: "?>") else { throw fail("unterminated processing instruction") }
            } else if stream.startsWith("</") {
                guard try stream.advance(upTo: UInt8(ascii: ">")) else { throw fail("an end tag is not closed") }
                stream.advance(1)
                depth -= 1
            } else {
                if try !startTag().empty { depth += 1 }
            }
            if stream.copyOverflowed { throw fail("a value larger than \(maxValueBytes) bytes") }
        } while depth > 0
    }

    private struct Tag {
        var name: String
        var empty: Bool
    }

    /// At `<name attributes…>` or `<name …/>`: consumes it (quotes in attributes respected).
    private mutating func startTag() throws -> Tag {
        guard try stream.peek() == UInt8(ascii: "<") else { throw fail("expected an element") }
        _ = try stream.fill(256)
        if let quick = stream.quickTag() { return Tag(name: quick.name, empty: quick.empty) }
        stream.advance(1)
        var name: [UInt8] = []
        while let c = try stream.peek(), !isSpace(c), c != UInt8(ascii: ">"), c != UInt8(ascii: "/"), name.count < 256 {
            name.append(c)
            stream.advance(1)
        }
        guard !name.isEmpty else { throw fail("expected an element name after '<'") }
        var quote: UInt8 = 0
        while let c = try stream.peek() {
            stream.advance(1)
            if quote != 0 {
                if c == quote { quote = 0 }
            } else if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") {
                quote = c
            } else if c == UInt8(ascii: ">") {
                return Tag(name: String(decoding: name, as: UTF8.self), empty: false)
            } else if c == UInt8(ascii: "/"), try stream.peek() == UInt8(ascii: ">") {
                stream.advance(1)
                return Tag(name: String(decoding: name, as: UTF8.self), empty: true)
            }
        }
        throw fail("the element <\(String(decoding: name.prefix(64), as: UTF8.self))> is not closed")
    }

    private mutating func atEndTag() throws -> Bool {
        try stream.peek() == UInt8(ascii: "<") && stream.peek(1) == UInt8(ascii: "/")
    }

    /// White space, comments, processing instructions and a DOCTYPE (its internal subset's brackets counted).
    private mutating func skipMisc() throws {
        while true {
            try stream.skipSpace()
            guard try stream.peek() == UInt8(ascii: "<") else { return }
            _ = try stream.fill(9)
            if stream.startsWith("<?") {
                guard try stream.advance(past: "?>") else { throw fail("unterminated processing instruction") }
            } else if stream.startsWith("<!--") {
                guard try stream.advance(past: "-->") else { throw fail("unterminated comment") }
            } else if stream.startsWith("<!DOCTYPE") {
                var bracket = 0
                while let d = try stream.peek() {
                    stream.advance(1)
                    if d == UInt8(ascii: "[") { bracket += 1 }
                    if d == UInt8(ascii: "]") { bracket -= 1 }
                    if d == UInt8(ascii: ">") && bracket <= 0 { break }
                }
            } else {
                return
            }
        }
    }

    private func fail(_ message: String) -> PlistError { PlistError("at byte \(stream.offset): \(message)") }
}
