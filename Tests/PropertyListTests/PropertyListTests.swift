// The property-list reader and writer against Foundation's: the same values from the same bytes, in
// both formats, and errors (never a crash) on hostile input.

import Foundation
import Testing
@testable import PropertyList
import TestSupport

/// Foundation's parsed object as a PlistValue (booleans told apart from numbers).
func plistValue(_ object: Any) -> PlistValue? {
    switch object {
    case let s as String: return .string(s)
    case let d as Date: return .date(d.timeIntervalSinceReferenceDate)
    case let d as Data: return .data([UInt8](d))
    case let a as [Any]:
        var out: [PlistValue] = []
        for e in a { guard let v = plistValue(e) else { return nil }; out.append(v) }
        return .array(out)
    case let d as [String: Any]:
        var entries: [PlistDictionary.Entry] = []
        for key in d.keys.sorted() {
            guard let v = plistValue(d[key] as Any) else { return nil }
            entries.append(.init(key: key, value: v))
        }
        return .dictionary(PlistDictionary(entries))
    default:
        if type(of: object) == Bool.self, let b = object as? Bool { return .boolean(b) }
        if let n = object as? NSNumber {
            if String(cString: n.objCType) == "c" { return .boolean(n.boolValue) }
            if type(of: object) == Double.self || String(cString: n.objCType) == "d" || String(cString: n.objCType) == "f" {
                return .real(n.doubleValue)
            }
            return .integer(n.intValue)
        }
        return nil
    }
}

/// The Foundation object for a value.
func foundationObject(_ value: PlistValue) -> Any {
    switch value {
    case .string(let s): s
    case .integer(let n): n
    case .real(let d): d
    case .boolean(let b): b
    case .date(let d): Date(timeIntervalSinceReferenceDate: d)
    case .data(let d): Data(d)
    case .array(let a): a.map(foundationObject)
    case .dictionary(let d): Dictionary(d.entries.map { ($0.key, foundationObject($0.value)) }, uniquingKeysWith: { $1 })
    }
}

/// Dictionaries compared without regard to order.
func sorted(_ value: PlistValue) -> PlistValue {
    switch value {
    case .array(let a): .array(a.map(sorted))
    case .dictionary(let d): .dictionary(
        PlistDictionary(d.entries.sorted { $0.key < $1.key }.map { .init(key: $0.key, value: sorted($0.value)) }))
    default: value
    }
}

struct Generator {
    var rng: SplitMix
    init(state: UInt64) { rng = SplitMix(state: state) }
    mutating func next() -> UInt64 { rng.next() }
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }

    mutating func string() -> String {
        let pieces = ["a", "Z", "0", " ", "<", ">", "&", "\"", "'", "é", "日本", "🙂", "\t", "\n", "]]>", "&amp;", "key", "-", "."]
        return (0..<below(8)).map { _ in pieces[below(pieces.count)] }.joined()
    }

    mutating func value(depth: Int = 0) -> PlistValue {
        switch below(depth > 4 ? 6 : 8) {
        case 0: return .string(string())
        case 1: return .integer([0, 1, -1, 255, 256, 65_536, Int(Int32.max), -4_000_000_000, Int.max, Int.min][below(10)])
        case 2: return .real([0.5, -1.25, 1e300, 3.0, 0.1, 123456.789, -2.5e-10][below(7)])
        case 3: return .boolean(below(2) == 0)
        case 4: return .date(Double(below(2_000_000_000)) - 500_000_000)
        case 5: return .data((0..<below(40)).map { _ in UInt8(truncatingIfNeeded: next()) })
        case 6: return .array((0..<below(6)).map { _ in value(depth: depth + 1) })
        default:
            var entries: [PlistDictionary.Entry] = []
            for k in 0..<below(6) { entries.append(.init(key: "k\(k)" + string(), value: value(depth: depth + 1))) }
            return .dictionary(PlistDictionary(entries))
        }
    }
}

func parse(_ data: Data) throws -> PlistValue { try PropertyList.parse([UInt8](data)) }

@Suite struct PropertyListTests {
    @Test func readsWhatFoundationWritesInBothFormats() throws {
        var g = Generator(state: 42)
        for _ in 0..<400 {
            let value = PlistValue.dictionary(PlistDictionary([.init(key: "v", value: g.value())]))
            for format in [PropertyListSerialization.PropertyListFormat.xml, .binary] {
                let data = try PropertyListSerialization.data(fromPropertyList: foundationObject(value), format: format, options: 0)
                let ours = try parse(data)
                let theirs = try #require(plistValue(PropertyListSerialization.propertyList(from: data, format: nil)))
                #expect(sorted(ours) == sorted(theirs), "format \(format)")
                #expect(sorted(ours) == sorted(value))
            }
        }
    }

    @Test(arguments: ["xml", "binary"])
    func foundationReadsWhatWeWrite(format: String) throws {
        var g = Generator(state: 7)
        for _ in 0..<400 {
            let value = PlistValue.dictionary(PlistDictionary([.init(key: "v", value: g.value())]))
            let bytes = format == "xml" ? PlistXMLWriter.document(value) : PlistBinaryWriter.document(value)
            let theirs = try #require(plistValue(PropertyListSerialization.propertyList(from: Data(bytes), format: nil)))
            #expect(sorted(theirs) == sorted(value))
            #expect(try PropertyList.parse(bytes) == value)
        }
    }

    /// The binary writer's wider encodings: counts of 15 and more, references past 255 objects, offsets past
    /// 64 KB, integers of every width, a non-ASCII key; Foundation and our reader read the same value back.
    @Test func binaryListsOfEverySize() throws {
        let many = (0..<300).map { PlistValue.string("item \($0) é") }
        let value = PlistValue.dictionary(PlistDictionary([
            .init(key: "many", value: .array(many)),
            .init(key: "fifteen characters long key", value: .string(String(repeating: "x", count: 15))),
            .init(key: "big", value: .data(Array(repeating: 7, count: 70_000))),
            .init(key: "widths",
                  value: .array([0, 255, 256, 65_535, 65_536, Int(UInt32.max), Int(UInt32.max) + 1, Int.max, -1, Int.min]
                                    .map { .integer($0) })),
            .init(key: "clé", value: .dictionary(PlistDictionary())),
            .init(key: "empty", value: .array([])),
        ]))
        let bytes = PlistBinaryWriter.document(value)
        #expect(bytes.starts(with: Array("bplist00".utf8)))
        #expect(try PropertyList.parse(bytes) == value)
        let theirs = try #require(plistValue(PropertyListSerialization.propertyList(from: Data(bytes), format: nil)))
        #expect(sorted(theirs) == sorted(value))
        // The smallest document: one value, one-byte references and offsets.
        #expect(PlistBinaryWriter.document(.boolean(true)) == Array("bplist00".utf8) + [0x09, 0x08]
            + [0, 0, 0, 0, 0, 0, 1, 1] + [0, 0, 0, 0, 0, 0, 0, 1] + [UInt8](repeating: 0, count: 8) + [0, 0, 0, 0, 0, 0, 0, 9])
    }

    @Test func xmlDetails() throws {
        let xml = """
        \u{FEFF}<?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "x.dtd" [ <!ENTITY nothing "x"> ]>
        <!-- a comment -->
        <plist version="1.0"><dict>
          <key>a&amp;b</key><string>&lt;&#65;&#x42;&quot;&apos;<![CDATA[<raw & text>]]><!-- gone -->end</string>
          <key>empty</key><string/>
          <key>n</key><integer> -0x10 </integer>
          <key>r</key><real>1e3</real>
          <key>t</key><true></true>
          <key>d</key><date>2001-01-02T00:00:01Z</date>
          <key>b</key><data>
            AAEC
            /w==
          </data>
          <key>a</key><array/>
        </dict></plist>
        """
        let value = try PropertyList.parse(Array(xml.utf8))
        let d = try #require(value.dictionary)
        #expect(d["a&b"] == .string("<AB\"'<raw & text>end"))
        #expect(d["empty"] == .string(""))
        #expect(d["n"] == .integer(-16))
        #expect(d.keys == ["a&b", "empty", "n", "r", "t", "d", "b", "a"])
        #expect(d["r"] == .real(1000))
        #expect(d["t"] == .boolean(true))
        #expect(d["d"] == .date(86401))
        #expect(d["b"] == .data([0, 1, 2, 255]))
        #expect(d["a"] == .array([]))

        var latin1 = Array("<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><plist><string>caf".utf8)
        latin1 += [0xE9] + Array("</string></plist>".utf8)
        #expect(try PropertyList.parse(latin1) == .string("café"))
        #expect(try PropertyList.parse(Array("<string>bare</string>".utf8)) == .string("bare"))
    }

    @Test(arguments: [
        ("<plist><dict><key>a</key></dict></plist>", "line 1: the key 'a' has no value"),
        ("<plist>\n<dict>\n<string>x</string></dict></plist>", "line 3: expected <key> in <dict>, found <string>"),
        ("<plist><integer>12x</integer></plist>", "'12x' is not an integer"),
        ("<plist><integer>99999999999999999999</integer></plist>", "out of range"),
        ("<plist><real>0x1p3</real></plist>", "is not a real number"),
        ("<plist><date>yesterday</date></plist>", "is not a date"),
        ("<plist><data>!!</data></plist>", "not valid base64"),
        ("<plist><string>a &bogus; b</string></plist>", "unknown entity &bogus;"),
        ("<plist><string>a & b</string></plist>", "an '&' that starts no entity"),
        ("<plist><string>open", "<string> is not closed"),
        ("<plist><set/></plist>", "unknown element <set>"),
        ("<plist><string>a</string></plist><string>b</string>", "unexpected content after the property list"),
        ("<plist></plist>", "the plist element is empty"),
        ("<?xml version=\"1.0\" encoding=\"Shift_JIS\"?><plist/>", "the encoding 'shift_jis' is not supported"),
        ("<plist><string>a</wrong></plist>", "expected </string>, found </wrong>"),
        ("<!-- never closed", "unterminated comment"),
    ])
    func xmlErrorsSayWhatAndWhere(input: String, expected: String) {
        #expect(throws: PlistError.self) { try PropertyList.parse(Array(input.utf8)) }
        do {
            _ = try PropertyList.parse(Array(input.utf8))
        } catch {
            #expect(error.description.contains(expected), "\(error.description)")
        }
    }

    @Test func invalidUTF8AndDeepNestingAreErrors() {
        let bad = Array("<plist><string>".utf8) + [0xC3, 0x28] + Array("</string></plist>".utf8)
        #expect(throws: PlistError("line 1: text that is not valid UTF-8")) { try PropertyList.parse(bad) }
        let deep = String(repeating: "<array>", count: 100_000) + String(repeating: "</array>", count: 100_000)
        #expect(throws: PlistError("line 1: containers nested deeper than 512 levels")) { try PropertyList.parse(Array(deep.utf8)) }
        let ok = String(repeating: "<array>", count: 500) + String(repeating: "</array>", count: 500)
        #expect((try? PropertyList.parse(Array(ok.utf8))) != nil)
    }

    /// A hand-made binary list: objects, offset table and trailer.
    func bplist(_ objects: [[UInt8]], top: Int = 0, referenceSize: UInt8 = 1, offsetSize: UInt8 = 2) -> [UInt8] {
        var bytes = Array("bplist00".utf8)
        var offsets: [Int] = []
        for o in objects { offsets.append(bytes.count); bytes += o }
        let table = bytes.count
        for o in offsets { bytes += (0..<Int(offsetSize)).reversed().map { UInt8(truncatingIfNeeded: o >> ($0 * 8)) } }
        bytes += [0, 0, 0, 0, 0, 0, offsetSize, referenceSize]
        for n in [objects.count, top, table] { bytes += (0..<8).reversed().map { UInt8(truncatingIfNeeded: n >> ($0 * 8)) } }
        return bytes
    }

    /// Writers that share equal objects (Python's plistlib, CFBinaryPList) make honest files of few objects that
    /// expand to many values: twenty thousand entries sharing their keys and values are a list, not a bomb.
    @Test func aBinaryListWhoseEntriesShareTheirKeysAndValuesIsRead() throws {
        let entries = 20_000
        // 0: the top array of `entries` dictionaries; 1...entries: each {k: v, l: w}; then the shared k, l, v, w.
        let shared = entries + 1
        func reference(_ n: Int) -> [UInt8] { [UInt8(n >> 16), UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n)] }
        var objects: [[UInt8]] = [[0xAF, 0x11, 0x4E, 0x20] + (1...entries).flatMap(reference)]
        let entry = [0xD2] + (shared..<shared + 4).flatMap(reference)
        for _ in 0..<entries { objects.append(entry) }
        objects += [[0x51, UInt8(ascii: "k")], [0x51, UInt8(ascii: "l")], [0x10, 7], [0x09]]
        let list = try PropertyList.parse(bplist(objects, referenceSize: 3, offsetSize: 3))
        guard case .array(let items) = list else { Issue.record("not an array: \(list)"); return }
        #expect(items.count == entries)
    }

    @Test func hostileBinaryListsAreErrors() throws {
        // An array that contains itself.
        #expect(throws: PlistError.self) { try PropertyList.parse(bplist([[0xA1, 0]])) }
        // A billion laughs: each array holds the next one eight times.
        var laughs: [[UInt8]] = []
        for k in 0..<40 { laughs.append([0xA8] + [UInt8](repeating: UInt8(k + 1), count: 8)) }
        laughs.append([0x51, UInt8(ascii: "x")])
        #expect(throws: PlistError.self) { try PropertyList.parse(bplist(laughs)) }
        // A reference past the objects, a length past the end, a non-string key, a set, an ASCII string with UTF-8.
        #expect(throws: PlistError.self) { try PropertyList.parse(bplist([[0xA1, 9]])) }
        #expect(throws: PlistError.self) { try PropertyList.parse(bplist([[0x5F, 0x13, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]])) }
        #expect(throws: PlistError.self) { try PropertyList.parse(bplist([[0xD1, 1, 1], [0x10, 5]])) }
        #expect(throws: PlistError.self) { try PropertyList.parse(bplist([[0xC1, 1], [0x10, 5]])) }
        #expect(throws: PlistError.self) { try PropertyList.parse(bplist([[0x52, 0xC3, 0xA9]])) }
        // A trailer that lies about the table.
        var lying = bplist([[0x10, 5]])
        lying[lying.count - 1] = 0xFF
        #expect(throws: PlistError.self) { try PropertyList.parse(lying) }
        // Still fine: shared keys, a dictionary, UTF-16.
        #expect(try PropertyList.parse(bplist([[0xD1, 1, 2], [0x51, UInt8(ascii: "k")], [0x61, 0x00, 0xE9]])) ==
                .dictionary(PlistDictionary(["k": .string("é")])))
    }

    @Test func mutatedBinaryAndXMLNeverCrash() throws {
        var g = Generator(state: 99)
        var parsed = 0
        for round in 0..<3000 {
            let value = PlistValue.dictionary(PlistDictionary([.init(key: "v", value: g.value())]))
            var bytes = round % 2 == 0 ? PlistXMLWriter.document(value)
                : [UInt8](try PropertyListSerialization.data(fromPropertyList: foundationObject(value), format: .binary, options: 0))
            for _ in 0..<(1 + g.below(4)) where !bytes.isEmpty {
                let at = g.below(bytes.count)
                switch g.below(3) {
                case 0: bytes[at] = UInt8(truncatingIfNeeded: g.next())
                case 1: bytes.remove(at: at)
                default: bytes.insert(UInt8(truncatingIfNeeded: g.next()), at: at)
                }
            }
            if (try? PropertyList.parse(bytes)) != nil { parsed += 1 }
        }
        #expect(parsed > 0 && parsed < 3000)
    }

    @Test func writerEscapesAndDates() throws {
        let value = PlistValue.dictionary(PlistDictionary([
            "s": .string("a<b>&c\u{1}"), "d": .date(-86400 * 365.25 * 30), "when": .date(0), "nan": .real(.infinity),
        ]))
        let text = String(decoding: PlistXMLWriter.document(value), as: UTF8.self)
        #expect(text.contains("<string>a&lt;b&gt;&amp;c\u{FFFD}</string>"))
        #expect(text.contains("<date>2001-01-01T00:00:00Z</date>"))
        #expect(text.contains("<date>1971-01-01T12:00:00Z</date>"))
        #expect(text.contains("<real>+infinity</real>"))
        let theirs = try PropertyListSerialization.propertyList(from: Data(text.utf8), format: nil) as? [String: Any]
        #expect((theirs?["when"] as? Date) == Date(timeIntervalSinceReferenceDate: 0))
    }

    /// A key given twice in one dictionary is ambiguous (which value was meant?): refused, naming the key and where.
    @Test func xmlDictionaryWithAKeyTwiceIsRefused() {
        func error(_ xml: String) -> String? {
            do { _ = try PropertyList.parse(Array(xml.utf8)); return nil } catch { return error.description }
        }
        #expect(error("<plist><dict>\n<key>url</key><string>a</string>\n<key>b</key><true/>\n<key>url</key><string>c</string>"
                      + "</dict></plist>") == "line 4: the key 'url' is given twice in one <dict> (first on line 2)")
        #expect(error("<plist><array><dict><key>a</key><true/></dict>\n<dict><key>id</key><string>x</string>\n"
                      + "<key>id</key><string>y</string></dict></array></plist>")
                == "line 3: the key 'id' is given twice in one <dict> (first on line 2)")
        // Past the first sixteen keys, found by a table.
        let many = (0..<40).map { "<key>k\($0)</key><integer>\($0)</integer>\n" }.joined()
        #expect(error("<plist><dict>\(many)<key>k3</key><true/></dict></plist>")
                == "line 41: the key 'k3' is given twice in one <dict> (first on line 4)")
        #expect(error("<plist><dict>\(many)</dict></plist>") == nil)
        // The same key in two dictionaries is no repetition.
        #expect(error("<plist><dict><key>a</key><dict><key>a</key><true/></dict></dict></plist>") == nil)
        // A dictionary built in code with a repeated key keeps its last value, in the first one's place.
        let d = PlistDictionary([.init(key: "n", value: .integer(1)), .init(key: "m", value: .integer(2)),
                                 .init(key: "n", value: .integer(3))])
        #expect(d.keys == ["n", "m"])
        #expect(d["n"] == .integer(3))
    }

    /// Two key references to equal strings, or twice to one string object: refused, naming the key and the object.
    @Test func binaryDictionaryWithAKeyTwiceIsRefused() {
        let url: [UInt8] = [0x53] + Array("url".utf8)
        for objects in [[[0xD2, 1, 1, 2, 3], url, [0x10, 1], [0x10, 2]],
                        [[0xD2, 1, 4, 2, 3], url, [0x10, 1], [0x10, 2], url]] as [[[UInt8]]] {
            #expect(throws: PlistError("binary property list: object 0 is a dictionary with the key 'url' twice (entries 0 and 1)")) {
                try PropertyList.parse(bplist(objects))
            }
        }
        #expect((try? PropertyList.parse(bplist([[0xD2, 1, 4, 2, 3], url, [0x10, 1], [0x10, 2], [0x53] + Array("uri".utf8)]))) != nil)
    }

    /// Keys that differ only in control characters XML cannot carry are written alike: the first is kept, so that the
    /// document reads back (and writes again the same).
    @Test func keysWrittenAlikeAreWrittenOnce() throws {
        let value = PlistValue.dictionary(PlistDictionary(["a\u{1}": .integer(1), "a\u{2}": .integer(2), "b": .integer(3)]))
        let written = PlistXMLWriter.document(value)
        let again = try PropertyList.parse(written)
        #expect(again == .dictionary(PlistDictionary(["a\u{FFFD}": .integer(1), "b": .integer(3)])))
        #expect(PlistXMLWriter.document(again) == written)
    }
}
