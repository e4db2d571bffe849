// The TZif format of /usr/share/zoneinfo (RFC 8536), versions 1 to 4. A version 1 file has 32-bit transition times
// only; later versions repeat the data with 64-bit times after it and end with a POSIX TZ string for the times
// after the last transition. Only the transitions and their offsets are kept (leap seconds, abbreviations and the
// standard/UT indicators are not needed to find offsets). Every count and index is checked against the data: a
// damaged file is an error, never a crash.

extension TimeZoneRules {
    /// The rules in a TZif file's bytes; the error is the reason they are not a valid file.
    init(name: String, tzif bytes: [UInt8]) throws(TZifError) {
        var reader = TZifReader(bytes: bytes)
        let first = try reader.header()
        var header = first
        if first.version >= 2 {
            try reader.skip(first.dataSize(timeSize: 4))
            header = try reader.header()
            guard header.version == first.version else { throw TZifError("the two headers disagree on the version") }
        }
        let timeSize = header.version >= 2 ? 8 : 4
        var transitions: [Int64] = []
        for _ in 0..<header.timeCount { transitions.append(try reader.integer(size: timeSize)) }
        for (a, b) in zip(transitions, transitions.dropFirst()) where a >= b {
            throw TZifError("transition times are not in ascending order")
        }
        var typeIndices: [Int] = []
        for _ in 0..<header.timeCount {
            let index = Int(try reader.integer(size: 1))
            guard index < header.typeCount else { throw TZifError("a transition's type \(index) is not one of \(header.typeCount)") }
            typeIndices.append(index)
        }
        var typeOffsets: [Int64] = []
        for _ in 0..<header.typeCount {
            let offset = try reader.integer(size: 4)
            guard (-89_999...93_599).contains(offset) else { throw TZifError("UTC offset \(offset) is out of range") }
            typeOffsets.append(offset)
            try reader.skip(2)   // isdst, abbreviation index
        }
        try reader.skip(header.dataSize(timeSize: timeSize) - header.timeCount * (timeSize + 1) - header.typeCount * 6)
        var footer: PosixTimeZone?
        if header.version >= 2 {
            let text = try reader.footer()
            if !text.isEmpty {
                do { footer = try PosixTimeZone(text) } catch { throw TZifError("footer '\(text)': \(error.reason)") }
            }
        }
        // Keep only the transitions that change the offset, so that a period's neighbours always differ from it.
        var offsets: [Int64] = []
        var kept: [Int64] = []
        for (at, index) in zip(transitions, typeIndices) where typeOffsets[index] != (offsets.last ?? typeOffsets[0]) {
            kept.append(at)
            offsets.append(typeOffsets[index])
        }
        self.init(name: name, transitions: kept, offsets: offsets, initialOffset: typeOffsets[0], footer: footer)
    }
}

struct TZifError: Error {
    let reason: String
    init(_ reason: String) { self.reason = reason }
}

/// A TZif header's version and counts.
private struct TZifHeader {
    var version: Int
    var utIndicatorCount: Int
    var standardIndicatorCount: Int
    var leapCount: Int
    var timeCount: Int
    var typeCount: Int
    var characterCount: Int

    /// The bytes of the data block that follows the header.
    func dataSize(timeSize: Int) -> Int {
        timeCount * (timeSize + 1) + typeCount * 6 + characterCount + leapCount * (timeSize + 4)
            + standardIndicatorCount + utIndicatorCount
    }
}

/// A bounds-checked, big-endian cursor over a TZif file.
private struct TZifReader {
    let bytes: [UInt8]
    var index = 0

    mutating func header() throws(TZifError) -> TZifHeader {
        guard index + 44 <= bytes.count else { throw TZifError("truncated header") }
        guard bytes[index..<index + 4].elementsEqual("TZif".utf8) else { throw TZifError("no TZif magic") }
        let versionByte = bytes[index + 4]
        guard versionByte == 0 || (UInt8(ascii: "2")...UInt8(ascii: "4")).contains(versionByte) else {
            throw TZifError("unknown version byte \(versionByte)")
        }
        index += 20
        var counts: [Int] = []
        for _ in 0..<6 {
            let count = Int(try integer(size: 4))
            guard (0...1_000_000).contains(count) else { throw TZifError("count \(count) is out of range") }
            counts.append(count)
        }
        let header = TZifHeader(version: versionByte == 0 ? 1 : Int(versionByte - 48), utIndicatorCount: counts[0],
                                standardIndicatorCount: counts[1], leapCount: counts[2], timeCount: counts[3],
                                typeCount: counts[4], characterCount: counts[5])
        guard header.typeCount >= 1 else { throw TZifError("no local time types") }
        guard [0, header.typeCount].contains(header.utIndicatorCount),
              [0, header.typeCount].contains(header.standardIndicatorCount) else {
            throw TZifError("indicator counts differ from the type count")
        }
        guard index + header.dataSize(timeSize: header.version >= 2 ? 8 : 4) <= bytes.count else {
            throw TZifError("truncated data")
        }
        return header
    }

    /// A big-endian two's-complement integer of 1, 4 or 8 bytes (a 1-byte one is unsigned).
    mutating func integer(size: Int) throws(TZifError) -> Int64 {
        guard index + size <= bytes.count else { throw TZifError("truncated data") }
        var value: UInt64 = 0
        for k in index..<index + size { value = value << 8 | UInt64(bytes[k]) }
        index += size
        switch size {
        case 4: return Int64(Int32(bitPattern: UInt32(value)))
        case 8: return Int64(bitPattern: value)
        default: return Int64(value)
        }
    }

    mutating func skip(_ count: Int) throws(TZifError) {
        guard count >= 0, index + count <= bytes.count else { throw TZifError("truncated data") }
        index += count
    }

    /// The text between the newlines that end a version 2+ file.
    mutating func footer() throws(TZifError) -> String {
        guard index < bytes.count, bytes[index] == UInt8(ascii: "\n") else { throw TZifError("no footer after the data") }
        guard let end = bytes[(index + 1)...].firstIndex(of: UInt8(ascii: "\n")) else { throw TZifError("unterminated footer") }
        defer { index = end + 1 }
        return String(decoding: bytes[(index + 1)..<end], as: UTF8.self)
    }
}
