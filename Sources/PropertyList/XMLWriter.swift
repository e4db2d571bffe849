// Writes XML property lists as a stream: values or begin/end calls append to `bytes`, which the caller
// drains whenever it likes (a result of a million operations never exists whole in memory).
// The layout is Foundation's: declaration, DOCTYPE, tab indentation.

public struct PlistXMLWriter {
    /// Output not yet taken by the caller.
    public var bytes: [UInt8] = []
    private var depth = 0

    public init() {
        bytes.reserveCapacity(1 << 16)
        append("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n")
        append("<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n")
        append("<plist version=\"1.0\">\n")
    }

    /// The whole document of one value.
    public static func document(_ value: PlistValue) -> [UInt8] {
        var writer = PlistXMLWriter()
        writer.value(value)
        return writer.finish()
    }

    /// Closes the document; returns what was not yet taken.
    public mutating func finish() -> [UInt8] {
        append("</plist>\n")
        defer { bytes = [] }
        return bytes
    }

    public mutating func beginDictionary() { open("<dict>\n") }
    public mutating func endDictionary() { close("</dict>\n") }
    public mutating func beginArray() { open("<array>\n") }
    public mutating func endArray() { close("</array>\n") }

    public mutating func key(_ key: String) { element("key", escaped: key) }
    public mutating func string(_ s: String) { element("string", escaped: s) }
    public mutating func integer(_ n: Int) { element("integer", raw: String(n)) }

    public mutating func real(_ d: Double) {
        let text = d.isNaN ? "nan" : d == .infinity ? "+infinity" : d == -.infinity ? "-infinity" : String(d)
        element("real", raw: text)
    }

    public mutating func boolean(_ b: Bool) {
        indent()
        append(b ? "<true/>\n" : "<false/>\n")
    }

    /// Seconds since 2001-01-01T00:00:00Z, written to the second as the format does; the format's years
    /// have four digits, so dates are clamped to 0001-01-01 … 9999-12-31.
    public mutating func date(_ seconds: Double) {
        let epoch = daysFromCivil(2001, 1, 1) * 86400
        let first = daysFromCivil(1, 1, 1) * 86400 - epoch, last = daysFromCivil(10000, 1, 1) * 86400 - 1 - epoch
        let total = seconds.isFinite ? Int(max(Double(first), min(Double(last), seconds)).rounded(.down)) : 0
        let unix = total + epoch
        let days = unix >= 0 ? unix / 86400 : (unix - 86399) / 86400
        let rest = unix - days * 86400
        let (y, m, d) = civilFromDays(days)
        func two(_ n: Int) -> String { n < 10 ? "0\(n)" : String(n) }
        let year = String(y)
        element("date", raw: "\(String(repeating: "0", count: max(0, 4 - year.count)))\(year)-\(two(m))-\(two(d))"
            + "T\(two(rest / 3600)):\(two(rest / 60 % 60)):\(two(rest % 60))Z")
    }

    public mutating func data(_ d: [UInt8]) {
        indent()
        append("<data>")
        bytes += Base64.encode(d)
        append("</data>\n")
    }

    public mutating func value(_ value: PlistValue) {
        switch value {
        case .string(let s): string(s)
        case .integer(let n): integer(n)
        case .real(let d): real(d)
        case .boolean(let b): boolean(b)
        case .date(let d): date(d)
        case .data(let d): data(d)
        case .array(let elements):
            beginArray()
            for element in elements { self.value(element) }
            endArray()
        case .dictionary(let dictionary):
            beginDictionary()
            // Keys that differ only in control characters are written alike (U+FFFD): the first is kept, the others
            // dropped, as a key written twice would make a document the readers refuse.
            var written: Set<String>? = dictionary.entries.contains { Self.hasControlCharacters($0.key) } ? [] : nil
            for entry in dictionary.entries {
                if written != nil, written?.insert(Self.asWritten(entry.key)).inserted == false { continue }
                key(entry.key)
                self.value(entry.value)
            }
            endDictionary()
        }
    }

    // MARK: Pieces

    private mutating func open(_ tag: String) {
        indent()
        append(tag)
        depth += 1
    }

    private mutating func close(_ tag: String) {
        depth -= 1
        indent()
        append(tag)
    }

    private mutating func indent() {
        for _ in 0..<max(0, depth) { bytes.append(0x09) }
    }

    private mutating func append(_ s: String) { bytes += s.utf8 }

    private mutating func element(_ name: String, raw: String) {
        indent()
        append("<\(name)>")
        append(raw)
        append("</\(name)>\n")
    }

    /// `<`, `>` and `&` escaped; control characters XML cannot carry become U+FFFD.
    private mutating func element(_ name: String, escaped text: String) {
        indent()
        append("<\(name)>")
        for c in text.utf8 {
            switch c {
            case UInt8(ascii: "<"): append("&lt;")
            case UInt8(ascii: ">"): append("&gt;")
            case UInt8(ascii: "&"): append("&amp;")
            case 0x09, 0x0A, 0x0D: bytes.append(c)
            case 0..<0x20: bytes += Self.replacement
            default: bytes.append(c)
            }
        }
        append("</\(name)>\n")
    }

    /// U+FFFD in UTF-8.
    private static let replacement: [UInt8] = [0xEF, 0xBF, 0xBD]

    /// Whether `text` holds a control character XML cannot carry.
    private static func hasControlCharacters(_ text: String) -> Bool {
        text.utf8.contains { $0 < 0x20 && $0 != 0x09 && $0 != 0x0A && $0 != 0x0D }
    }

    /// `text` as a reader gets it back: its control characters XML cannot carry replaced by U+FFFD.
    private static func asWritten(_ text: String) -> String {
        guard hasControlCharacters(text) else { return text }
        var out: [UInt8] = []
        for c in text.utf8 { if c < 0x20 && c != 0x09 && c != 0x0A && c != 0x0D { out += replacement } else { out.append(c) } }
        return String(decoding: out, as: UTF8.self)
    }
}
