// PlistTopLevel, the partial reader of a result.plist's top-level keys: the same values as a whole parse, whatever
// the chunks the bytes come in, with everything else skipped; errors, never a crash, on broken input.

import Foundation
import Testing
@testable import PropertyList

/// The keys asked for, read from `bytes` handed over `chunk` bytes at a time.
func topLevel(_ bytes: [UInt8], keys: Set<String>, chunk: Int = 1 << 20, maxValueBytes: Int = 1 << 20) throws -> PlistDictionary {
    var offset = 0
    return try PlistTopLevel.read(keys: keys, maxValueBytes: maxValueBytes) { buffer in
        let count = min(chunk, buffer.count, bytes.count - offset)
        for i in 0..<count { buffer[i] = bytes[offset + i] }
        offset += count
        return count
    }
}

/// What a whole parse gives for those keys, in document order.
func wholeParse(_ bytes: [UInt8], keys: Set<String>) throws -> PlistDictionary {
    guard case .dictionary(let top) = try PropertyList.parse(bytes) else { throw PlistError("not a dictionary") }
    return PlistDictionary(top.entries.filter { keys.contains($0.key) })
}

@Suite struct TopLevelReaderTests {
    /// A result.plist as the daemon writes it (keys sorted, the operations between finishedAt and status).
    static func result(operations: Int) -> [UInt8] {
        var w = PlistXMLWriter()
        w.beginDictionary()
        w.key("durationSeconds"); w.real(1.25)
        w.key("finishedAt"); w.real(1_764_295_200.123456)
        w.key("job"); w.string("holiday & <friends>")
        w.key("metadata"); w.value(.dictionary(PlistDictionary(["owner": .string("ana"), "tags": .array([.string("a"), .integer(3)])])))
        w.key("node"); w.string("worker-1")
        w.key("operations")
        w.beginArray()
        for i in 0..<operations {
            w.value(.dictionary(PlistDictionary(["id": .string("op\(i)"), "outputs": .array([]), "state": .string("succeeded"),
                                                 "error": .string("</dict> <key>status</key> in text")])))
        }
        w.endArray()
        w.key("status"); w.string("succeeded")
        w.endDictionary()
        return w.finish()
    }

    static let keys: Set<String> = ["job", "status", "node", "finishedAt", "durationSeconds"]

    @Test(arguments: [1, 2, 3, 7, 64, 1 << 20])
    func sameValuesAsAWholeParseInAnyChunks(chunk: Int) throws {
        let bytes = Self.result(operations: 50)
        let read = try topLevel(bytes, keys: Self.keys, chunk: chunk)
        #expect(read == (try wholeParse(bytes, keys: Self.keys)))
        #expect(read["job"]?.string == "holiday & <friends>")
        #expect(read["status"]?.string == "succeeded")
        #expect(read.count == 5)
    }

    @Test func bigContainersAreSkippedNotKept() throws {
        // 20,000 operations (~2 MB of XML) between finishedAt and status; one value may be at most 1 KB.
        let bytes = Self.result(operations: 20_000)
        let read = try topLevel(bytes, keys: ["finishedAt", "status"], chunk: 1 << 16, maxValueBytes: 1 << 10)
        #expect(read["status"]?.string == "succeeded" && read["finishedAt"]?.real == 1_764_295_200.123456)
        #expect(throws: PlistError.self) { try topLevel(bytes, keys: ["operations"], maxValueBytes: 1 << 10) }
    }

    @Test func commentsCDATAEntitiesADoctypeAndLatin1() throws {
        let xml = """
            <?xml version="1.0" encoding="ISO-8859-1"?>
            <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd" [ <!-- <dict> --> ]>
            <!-- a comment with <dict> in it -->
            <plist version="1.0"><dict>
              <key>skip</key><array><string><![CDATA[</array></dict>]]></string><!-- </array> --><dict/><true/></array>
              <key>st&#97;tus</key><string>fail<!-- x -->ed</string>
              <key>node</key><string>caf\u{E9}</string>
              <key>job</key><string><![CDATA[a<b]]></string>
              <key>empty</key><string/>
            </dict></plist>
            """
        let bytes = Array(xml.unicodeScalars.map { UInt8($0.value) })  // ISO-8859-1: é is one byte
        let keys: Set<String> = ["status", "node", "job", "empty"]
        for chunk in [1, 5, 4096] {
            let read = try topLevel(bytes, keys: keys, chunk: chunk)
            #expect(read == (try wholeParse(bytes, keys: keys)), "chunk \(chunk)")
            #expect(read["status"]?.string == "failed" && read["node"]?.string == "café" && read["job"]?.string == "a<b")
            #expect(read["empty"]?.string == "")
        }
    }

    @Test func binaryListsAreReadWhole() throws {
        let value = PlistValue.dictionary(PlistDictionary(["job": .string("b"), "status": .string("rejected"),
                                                           "operations": .array([.integer(1)])]))
        let read = try topLevel(PlistBinaryWriter.document(value), keys: ["job", "status"], chunk: 3)
        #expect(read == PlistDictionary(["job": .string("b"), "status": .string("rejected")]))
    }

    @Test func stopsReadingOnceEveryKeyIsSeen() throws {
        // What follows the keys asked for is never read: here, garbage.
        let bytes = Array("<plist><dict><key>job</key><string>x</string><key>rest</key> \u{1}\u{2} not xml".utf8)
        #expect(try topLevel(bytes, keys: ["job"])["job"]?.string == "x")
    }

    @Test(arguments: [
        "", "not xml", "<plist><array/></plist>", "<plist><dict><key>job</key>", "<plist><dict><key>job</key><string>x",
        "<plist><dict><string>x</string></dict></plist>", "<plist><dict><key>job</key><integer>x</integer></dict></plist>",
        "<plist><dict><key>job</key><string>a &bogus; b</string></dict></plist>", "<plist><dict><key>a</key><!-- x",
        "<plist><dict><key>job</key><array><![CDATA[ x </array></dict>", "bplist00 too short",
    ])
    func brokenInputIsAnErrorNeverACrash(text: String) {
        #expect(throws: PlistError.self) { try topLevel(Array(text.utf8), keys: ["job", "status"], chunk: 2) }
    }

    @Test func aSourceThatFailsIsAnError() {
        #expect(throws: PlistError.self) { try PlistTopLevel.read(keys: ["job"]) { _ in -1 } }
    }
}
