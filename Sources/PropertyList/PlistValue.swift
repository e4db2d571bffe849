// Property-list values, read and written without Foundation.
//
// Why our own: Foundation's PropertyListSerialization on Linux turns a manifest of a million operations
// into a million bridged NSDictionaries (~1.3 KB each) and writes results through a second copy of the
// whole tree. These values are plain Swift enums (an operation's dictionary is one small array), the
// writer streams, and the readers are small enough to be fuzzed on their own (Tests/Fuzz).

/// One property-list value. Dates are seconds since 2001-01-01T00:00:00Z, the format's own epoch.
public enum PlistValue: Sendable, Equatable {
    case string(String)
    case integer(Int)
    case real(Double)
    case boolean(Bool)
    case date(Double)
    case data([UInt8])
    case array([PlistValue])
    case dictionary(PlistDictionary)

    /// "a string", "an array", … for error messages.
    public var typeName: String {
        switch self {
        case .string: "a string"
        case .integer, .real: "a number"
        case .boolean: "a boolean"
        case .date: "a date"
        case .data: "data"
        case .array: "an array"
        case .dictionary: "a dictionary"
        }
    }

    public var string: String? { if case .string(let s) = self { s } else { nil } }
    public var array: [PlistValue]? { if case .array(let a) = self { a } else { nil } }
    public var dictionary: PlistDictionary? { if case .dictionary(let d) = self { d } else { nil } }
    public var boolean: Bool? { if case .boolean(let b) = self { b } else { nil } }

    /// An integer, or a real with an integral value that an Int holds exactly.
    public var integer: Int? {
        switch self {
        case .integer(let i): i
        case .real(let d) where d == d.rounded() && abs(d) < 9e15: Int(d)
        default: nil
        }
    }

    /// A finite number, integer or real.
    public var real: Double? {
        switch self {
        case .real(let d): d.isFinite ? d : nil
        case .integer(let i): Double(i)
        default: nil
        }
    }
}

/// A dictionary in document order. Keys are unique: the readers refuse a key given twice in one dictionary (which
/// value was meant is not known), and one built in code with a repeated key keeps its last value. Lookups are linear,
/// which is fastest for the handful of keys manifests use.
public struct PlistDictionary: Sendable, Equatable {
    public struct Entry: Sendable, Equatable {
        public var key: String
        public var value: PlistValue
        public init(key: String, value: PlistValue) { self.key = key; self.value = value }
    }

    public private(set) var entries: [Entry]

    public init() { entries = [] }

    /// Entries in order; later duplicates replace earlier ones (in the earlier one's place).
    public init(_ entries: [Entry]) {
        self.entries = entries
        guard entries.count > 1 else { return }
        if entries.count <= 16 {
            var unique = true
            outer: for i in 1..<entries.count {
                for j in 0..<i where entries[j].key == entries[i].key { unique = false; break outer }
            }
            if unique { return }
        }
        var position: [String: Int] = [:]
        var kept: [Entry] = []
        kept.reserveCapacity(entries.count)
        for entry in entries {
            if let p = position[entry.key] { kept[p].value = entry.value } else { position[entry.key] = kept.count; kept.append(entry) }
        }
        self.entries = kept
    }

    /// Entries whose keys are known to be unique (a reader's, checked with `KeyIndex` as they came).
    init(uniqueEntries entries: [Entry]) { self.entries = entries }

    public init(_ pairs: KeyValuePairs<String, PlistValue>) {
        self.init(pairs.map { Entry(key: $0.key, value: $0.value) })
    }

    public subscript(key: String) -> PlistValue? {
        get {
            for entry in entries where entry.key == key { return entry.value }
            return nil
        }
        set {
            if let i = entries.firstIndex(where: { $0.key == key }) {
                if let newValue { entries[i].value = newValue } else { entries.remove(at: i) }
            } else if let newValue {
                entries.append(Entry(key: key, value: newValue))
            }
        }
    }

    public var count: Int { entries.count }
    public var isEmpty: Bool { entries.isEmpty }
    public var keys: [String] { entries.map(\.key) }
}

/// Finds a key given twice in a dictionary being read: by a scan of its entries while they are few (a manifest's
/// dictionaries hold a handful of keys), by a table past that.
struct KeyIndex {
    private static let scanned = 16
    private var table: [String: Int] = [:]

    /// Where `key` already is among `entries` (the dictionary's so far), or nil. Called for each key in turn, before its
    /// entry is appended.
    mutating func position(of key: String, among entries: [PlistDictionary.Entry]) -> Int? {
        if entries.count < Self.scanned { return entries.firstIndex { $0.key == key } }
        if table.isEmpty { for (k, entry) in entries.enumerated() { table[entry.key] = k } }
        if let p = table[key] { return p }
        table[key] = entries.count
        return nil
    }
}

/// What was wrong with a property list, and where (line for XML, object and offset for binary).
public struct PlistError: Error, CustomStringConvertible, Sendable, Equatable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Limits that keep hostile input from exhausting the stack or memory.
public enum PlistLimits {
    /// Containers nested deeper than this are refused (manifests need four levels).
    public static let maxDepth = 512
}

public enum PropertyList {
    /// Reads an XML (UTF-8 or ISO-8859-1) or binary (`bplist00`) property list.
    public static func parse(_ bytes: UnsafeRawBufferPointer) throws(PlistError) -> PlistValue {
        do {
            return try read(bytes)
        } catch let error as PlistError {
            throw error
        } catch {
            throw PlistError("\(error)")
        }
    }

    private static func read(_ bytes: UnsafeRawBufferPointer) throws -> PlistValue {
        if bytes.starts(with: Array("bplist".utf8)) {
            var reader = try BinaryPlistReader(bytes)
            return try reader.read()
        }
        var reader = XMLPlistReader(bytes)
        return try reader.read()
    }

    public static func parse(_ bytes: [UInt8]) throws(PlistError) -> PlistValue {
        do {
            return try bytes.withUnsafeBytes { buffer in try parse(buffer) }
        } catch let error as PlistError {
            throw error
        } catch {
            throw PlistError("\(error)")
        }
    }

    /// True for bytes that start as a binary property list or an XML document (after a UTF-8 byte-order
    /// mark and white space): the cheap test before a parse.
    public static func looksLikePropertyList(_ bytes: UnsafeRawBufferPointer) -> Bool {
        if bytes.starts(with: Array("bplist".utf8)) { return true }
        var i = 0
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { i = 3 }
        while i < bytes.count && i < 4096, isSpace(bytes[i]) { i += 1 }
        return i < bytes.count && bytes[i] == UInt8(ascii: "<")
    }
}

@inline(__always) func isSpace(_ c: UInt8) -> Bool { c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09 }
