// The XML property-list format (Apple's DTD, PropertyList-1.0): what Foundation reads, no more.
// A hand-written scanner over the bytes: comments, processing instructions, a DOCTYPE with an internal
// subset, CDATA, the five named entities and character references; UTF-8, or ISO-8859-1/US-ASCII when
// the declaration says so. Errors name the line.

struct XMLPlistReader {
    private var b: UnsafeRawBufferPointer
    private var i = 0

    init(_ bytes: UnsafeRawBufferPointer) { b = bytes }

    mutating func read() throws -> PlistValue {
        if b.starts(with: [0xEF, 0xBB, 0xBF]) { i = 3 }
        if b.starts(with: [0xFE, 0xFF]) || b.starts(with: [0xFF, 0xFE]) { throw PlistError("UTF-16 is not supported; use UTF-8") }
        if try declaredSingleByteEncoding() == true {
            let utf8 = transcodeLatin1(UnsafeRawBufferPointer(rebasing: b[i...]))
            return try utf8.withUnsafeBytes { buffer in
                var inner = XMLPlistReader(buffer)
                return try inner.readDocument()
            }
        }
        return try readDocument()
    }

    /// nil for UTF-8; true for ISO-8859-1 (transcode), false for US-ASCII (UTF-8 covers it).
    private func declaredSingleByteEncoding() throws -> Bool? {
        guard b[i...].starts(with: Array("<?xml".utf8)) else { return nil }
        var end = i
        while end + 1 < b.count, !(b[end] == UInt8(ascii: "?") && b[end + 1] == UInt8(ascii: ">")) { end += 1 }
        let declaration = Array(UnsafeRawBufferPointer(rebasing: b[i..<end]))
        let marker = Array("encoding=".utf8)
        guard let at = (0..<max(0, declaration.count - marker.count)).first(where: { declaration[$0...].starts(with: marker) }) else {
            return nil
        }
        let rest = declaration[(at + marker.count)...].dropFirst()
        let name = String(decoding: rest.prefix { $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "'") }, as: UTF8.self).lowercased()
        switch name {
        case "utf-8", "utf8": return nil
        case "iso-8859-1", "latin1", "iso_8859-1", "latin-1": return true
        case "us-ascii", "ascii": return false
        default: throw PlistError("line 1: the encoding '\(name)' is not supported (UTF-8, ISO-8859-1 or US-ASCII)")
        }
    }

    private func transcodeLatin1(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count + bytes.count / 8)
        for c in bytes {
            if c < 0x80 { out.append(c) } else { out.append(0xC0 | (c >> 6)); out.append(0x80 | (c & 0x3F)) }
        }
        return out
    }

    private mutating func readDocument() throws -> PlistValue {
        try skipMisc()
        guard i < b.count else { throw fail("the document has no property list element") }
        var tag = try startTag()
        var inPlist = false
        if tag.name == "plist" {
            if tag.empty { throw fail("the plist element is empty") }
            inPlist = true
            try skipMisc()
            if atEndTag() { throw fail("the plist element is empty") }
            tag = try startTag()
        }
        let value = try value(tag, depth: 0)
        try skipMisc()
        if inPlist {
            try endTag("plist")
            try skipMisc()
        }
        guard i >= b.count else { throw fail("unexpected content after the property list") }
        return value
    }

    // MARK: Values

    private mutating func value(_ tag: Tag, depth: Int) throws -> PlistValue {
        guard depth < PlistLimits.maxDepth else { throw fail("containers nested deeper than \(PlistLimits.maxDepth) levels") }
        switch tag.name {
        case "dict":
            if tag.empty { return .dictionary(PlistDictionary()) }
            return .dictionary(try dictionary(depth: depth))
        case "array":
            var elements: [PlistValue] = []
            if tag.empty { return .array([]) }
            while true {
                try skipMisc()
                if atEndTag() { try endTag("array"); break }
                let elementTag = try startTag()
                elements.append(try value(elementTag, depth: depth + 1))
            }
            return .array(elements)
        case "string":
            return .string(try content(of: tag))
        case "integer":
            let t = try content(of: tag)
            guard let n = parseInteger(t) else { throw fail("'\(t.prefix(64))' is not an integer (or is out of range)") }
            return .integer(n)
        case "real":
            let t = try content(of: tag)
            guard let d = parseReal(t) else { throw fail("'\(t.prefix(64))' is not a real number") }
            return .real(d)
        case "true", "false":
            if !tag.empty {
                skipSpace()
                try endTag(tag.name)
            }
            return .boolean(tag.name == "true")
        case "date":
            let t = try content(of: tag)
            guard let d = parseDate(t) else { throw fail("'\(t.prefix(64))' is not a date (YYYY-MM-DDTHH:MM:SSZ)") }
            return .date(d)
        case "data":
            let t = try content(of: tag)
            guard let d = Base64.decode(t) else { throw fail("the data is not valid base64") }
            return .data(d)
        case "key":
            throw fail("<key> outside a <dict>")
        default:
            throw fail("unknown element <\(tag.name.prefix(64))>")
        }
    }

    /// A `<dict>`'s entries, after its start tag. A key given twice is refused: which value was meant is not known.
    private mutating func dictionary(depth: Int) throws -> PlistDictionary {
        var entries: [PlistDictionary.Entry] = []
        var keyOffsets: [Int] = []
        var keys = KeyIndex()
        while true {
            try skipMisc()
            if atEndTag() { try endTag("dict"); break }
            let keyOffset = i
            let keyTag = try startTag()
            guard keyTag.name == "key" else { throw fail("expected <key> in <dict>, found <\(keyTag.name)>") }
            let key = keyTag.empty ? "" : try text(closing: "key")
            if let first = keys.position(of: key, among: entries) {
                throw fail("the key '\(key.prefix(64))' is given twice in one <dict> (first on line \(line(at: keyOffsets[first])))")
            }
            try skipMisc()
            if atEndTag() { throw fail("the key '\(key)' has no value") }
            let valueTag = try startTag()
            entries.append(PlistDictionary.Entry(key: key, value: try value(valueTag, depth: depth + 1)))
            keyOffsets.append(keyOffset)
        }
        return PlistDictionary(uniqueEntries: entries)
    }

    /// The text of a scalar element (`<string/>` has none).
    private mutating func content(of tag: Tag) throws -> String {
        tag.empty ? "" : try text(closing: tag.name)
    }

    // MARK: Tags

    private struct Tag {
        var name: String
        var empty: Bool
    }

    /// At `<name attributes…>` or `<name …/>`: reads it.
    private mutating func startTag() throws -> Tag {
        guard i < b.count, b[i] == UInt8(ascii: "<") else { throw fail("expected an element") }
        i += 1
        let start = i
        while i < b.count, !isSpace(b[i]), b[i] != UInt8(ascii: ">"), b[i] != UInt8(ascii: "/") { i += 1 }
        guard i > start else { throw fail("expected an element name after '<'") }
        let name = String(decoding: UnsafeRawBufferPointer(rebasing: b[start..<i]), as: UTF8.self)
        // Attributes (plist version="1.0") are skipped, quotes respected.
        var quote: UInt8 = 0
        while i < b.count {
            let c = b[i]
            if quote != 0 {
                if c == quote { quote = 0 }
            } else if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") {
                quote = c
            } else if c == UInt8(ascii: ">") {
                i += 1
                return Tag(name: name, empty: false)
            } else if c == UInt8(ascii: "/"), i + 1 < b.count, b[i + 1] == UInt8(ascii: ">") {
                i += 2
                return Tag(name: name, empty: true)
            }
            i += 1
        }
        throw fail("the element <\(name.prefix(64))> is not closed")
    }

    private func atEndTag() -> Bool { i + 1 < b.count && b[i] == UInt8(ascii: "<") && b[i + 1] == UInt8(ascii: "/") }

    private mutating func endTag(_ name: String) throws {
        guard atEndTag() else { throw fail("expected </\(name)>") }
        i += 2
        let start = i
        while i < b.count, b[i] != UInt8(ascii: ">"), !isSpace(b[i]) { i += 1 }
        let found = String(decoding: UnsafeRawBufferPointer(rebasing: b[start..<i]), as: UTF8.self)
        while i < b.count, isSpace(b[i]) { i += 1 }
        guard found == name, i < b.count, b[i] == UInt8(ascii: ">") else { throw fail("expected </\(name)>, found </\(found.prefix(64))>") }
        i += 1
    }

    /// White space, comments, processing instructions and a DOCTYPE.
    private mutating func skipMisc() throws {
        while i < b.count {
            if isSpace(b[i]) { i += 1; continue }
            guard b[i] == UInt8(ascii: "<"), i + 1 < b.count else { return }
            if b[i + 1] == UInt8(ascii: "?") {
                try skip(past: "?>", what: "processing instruction")
            } else if b[i...].starts(with: Array("<!--".utf8)) {
                try skip(past: "-->", what: "comment")
            } else if b[i...].starts(with: Array("<!DOCTYPE".utf8)) {
                var bracket = 0
                while i < b.count {
                    let c = b[i]
                    i += 1
                    if c == UInt8(ascii: "[") { bracket += 1 }
                    if c == UInt8(ascii: "]") { bracket -= 1 }
                    if c == UInt8(ascii: ">") && bracket <= 0 { break }
                }
            } else {
                return
            }
        }
    }

    private mutating func skipSpace() {
        while i < b.count, isSpace(b[i]) { i += 1 }
    }

    private mutating func skip(past end: String, what: String) throws {
        let e = Array(end.utf8)
        var j = i + 2
        while j + e.count <= b.count {
            if b[j] == e[0], b[j...].starts(with: e) { i = j + e.count; return }
            j += 1
        }
        throw fail("unterminated \(what)")
    }

    // MARK: Text

    /// Character data up to `</name>`: entities and character references resolved, CDATA copied,
    /// comments dropped; it must be valid UTF-8.
    private mutating func text(closing name: String) throws -> String {
        let start = i
        // Fast path: plain text up to the end tag.
        while i < b.count, b[i] != UInt8(ascii: "<"), b[i] != UInt8(ascii: "&") { i += 1 }
        if i < b.count, b[i] == UInt8(ascii: "<"), i + 1 < b.count, b[i + 1] == UInt8(ascii: "/") {
            let s = try utf8(UnsafeRawBufferPointer(rebasing: b[start..<i]))
            try endTag(name)
            return s
        }
        var out = Array(UnsafeRawBufferPointer(rebasing: b[start..<i]))
        while true {
            guard i < b.count else { throw fail("<\(name)> is not closed") }
            let c = b[i]
            if c == UInt8(ascii: "&") {
                try entity(into: &out)
            } else if c == UInt8(ascii: "<") {
                if atEndTag() { break }
                if b[i...].starts(with: Array("<![CDATA[".utf8)) {
                    let from = i + 9
                    try skip(past: "]]>", what: "CDATA section")
                    out.append(contentsOf: UnsafeRawBufferPointer(rebasing: b[from..<(i - 3)]))
                } else if b[i...].starts(with: Array("<!--".utf8)) {
                    try skip(past: "-->", what: "comment")
                } else {
                    throw fail("unexpected element inside <\(name)>")
                }
            } else {
                out.append(c)
                i += 1
            }
        }
        let s = try out.withUnsafeBytes { (buffer: UnsafeRawBufferPointer) throws -> String in try utf8(buffer) }
        try endTag(name)
        return s
    }

    private mutating func entity(into out: inout [UInt8]) throws {
        let start = i + 1
        var end = start
        while end < b.count, end - start < 12, b[end] != UInt8(ascii: ";") { end += 1 }
        guard end < b.count, b[end] == UInt8(ascii: ";") else { throw fail("an '&' that starts no entity (write &amp;)") }
        let name = String(decoding: UnsafeRawBufferPointer(rebasing: b[start..<end]), as: UTF8.self)
        i = end + 1
        switch name {
        case "lt": out.append(UInt8(ascii: "<"))
        case "gt": out.append(UInt8(ascii: ">"))
        case "amp": out.append(UInt8(ascii: "&"))
        case "quot": out.append(UInt8(ascii: "\""))
        case "apos": out.append(UInt8(ascii: "'"))
        default:
            var scalar: UInt32?
            if name.hasPrefix("#x") || name.hasPrefix("#X") { scalar = UInt32(name.dropFirst(2), radix: 16) }
            else if name.hasPrefix("#") { scalar = UInt32(name.dropFirst(), radix: 10) }
            guard let value = scalar, value != 0, let u = Unicode.Scalar(value) else { throw fail("unknown entity &\(name.prefix(12));") }
            out.append(contentsOf: Array(String(Character(u)).utf8))
        }
    }

    private func utf8(_ bytes: UnsafeRawBufferPointer) throws -> String {
        guard let s = String(validating: bytes, as: UTF8.self) else { throw fail("text that is not valid UTF-8") }
        return s
    }

    // MARK: Scalars

    private func parseInteger(_ text: String) -> Int? {
        var t = Substring(text.trimmingSpace())
        var negative = false
        if t.hasPrefix("-") { negative = true; t = t.dropFirst() } else if t.hasPrefix("+") { t = t.dropFirst() }
        var radix = 10
        if t.hasPrefix("0x") || t.hasPrefix("0X") { radix = 16; t = t.dropFirst(2) }
        guard !t.isEmpty, let magnitude = UInt64(t, radix: radix) else { return nil }
        if negative {
            guard magnitude <= UInt64(Int64.max) + 1 else { return nil }
            return magnitude == UInt64(Int64.max) + 1 ? Int.min : -Int(magnitude)
        }
        guard magnitude <= UInt64(Int64.max) else { return nil }
        return Int(magnitude)
    }

    private func parseReal(_ text: String) -> Double? {
        let t = text.trimmingSpace()
        guard !t.isEmpty, t.utf8.count <= 64 else { return nil }
        switch t.lowercased() {
        case "nan": return .nan
        case "inf", "infinity", "+inf", "+infinity": return .infinity
        case "-inf", "-infinity": return -.infinity
        default: break
        }
        // Digits, sign, point and exponent only (Double(_:) would also take hexadecimal floats).
        guard t.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2B || $0 == 0x2D || $0 == 0x2E || $0 == 0x45 || $0 == 0x65 }) else {
            return nil
        }
        return Double(t)
    }

    /// `YYYY-MM-DDTHH:MM:SSZ` → seconds since 2001-01-01T00:00:00Z.
    private func parseDate(_ text: String) -> Double? {
        let u = Array(text.trimmingSpace().utf8)
        guard u.count == 20, u[4] == 0x2D, u[7] == 0x2D, u[10] == 0x54, u[13] == 0x3A, u[16] == 0x3A, u[19] == 0x5A else { return nil }
        func number(_ r: Range<Int>) -> Int? {
            var n = 0
            for k in r { guard u[k] >= 0x30 && u[k] <= 0x39 else { return nil }; n = n * 10 + Int(u[k] - 0x30) }
            return n
        }
        guard let y = number(0..<4), let mo = number(5..<7), let d = number(8..<10), let h = number(11..<13),
              let mi = number(14..<16), let s = number(17..<19),
              (1...12).contains(mo), (1...31).contains(d), h < 24, mi < 60, s < 61 else { return nil }
        return Double(daysFromCivil(y, mo, d) - daysFromCivil(2001, 1, 1)) * 86400 + Double(h * 3600 + mi * 60 + s)
    }

    // MARK: Errors

    private func fail(_ message: String) -> PlistError {
        PlistError("line \(line(at: i)): \(message)")
    }

    /// The line of the byte at `offset`, from 1.
    private func line(at offset: Int) -> Int {
        var line = 1
        for k in 0..<min(offset, b.count) where b[k] == 0x0A { line += 1 }
        return line
    }
}

extension String {
    func trimmingSpace() -> String {
        let u = utf8
        guard let first = u.firstIndex(where: { !isSpace($0) }), let last = u.lastIndex(where: { !isSpace($0) }) else { return "" }
        return String(self[first...last])
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
func daysFromCivil(_ year: Int, _ month: Int, _ day: Int) -> Int {
    let y = month <= 2 ? year - 1 : year
    let era = (y >= 0 ? y : y - 399) / 400
    let yoe = y - era * 400
    let doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
    return era * 146097 + doe - 719468
}

/// The date of a day number since 1970-01-01.
func civilFromDays(_ days: Int) -> (year: Int, month: Int, day: Int) {
    let z = days + 719468
    let era = (z >= 0 ? z : z - 146096) / 146097
    let doe = z - era * 146097
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
    let mp = (5 * doy + 2) / 153
    let day = doy - (153 * mp + 2) / 5 + 1
    let month = mp < 10 ? mp + 3 : mp - 9
    return (yoe + era * 400 + (month <= 2 ? 1 : 0), month, day)
}

enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode(_ bytes: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var k = 0
        while k + 3 <= bytes.count {
            let n = UInt32(bytes[k]) << 16 | UInt32(bytes[k + 1]) << 8 | UInt32(bytes[k + 2])
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
            k += 3
        }
        let rest = bytes.count - k
        if rest == 1 {
            let n = UInt32(bytes[k]) << 16
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], UInt8(ascii: "="), UInt8(ascii: "=")]
        } else if rest == 2 {
            let n = UInt32(bytes[k]) << 16 | UInt32(bytes[k + 1]) << 8
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], UInt8(ascii: "=")]
        }
        return out
    }

    /// White space is ignored; padding is optional.
    static func decode(_ text: String) -> [UInt8]? {
        var out: [UInt8] = []
        var accumulator: UInt32 = 0
        var bits = 0
        var padding = false
        for c in text.utf8 {
            if isSpace(c) { continue }
            if c == UInt8(ascii: "=") { padding = true; continue }
            guard !padding else { return nil }
            let v: UInt32
            switch c {
            case 0x41...0x5A: v = UInt32(c - 0x41)
            case 0x61...0x7A: v = UInt32(c - 0x61 + 26)
            case 0x30...0x39: v = UInt32(c - 0x30 + 52)
            case UInt8(ascii: "+"): v = 62
            case UInt8(ascii: "/"): v = 63
            default: return nil
            }
            accumulator = (accumulator << 6) | v
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
                accumulator &= (1 << UInt32(bits)) - 1
            }
        }
        return out
    }
}
