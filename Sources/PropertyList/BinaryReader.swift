// The binary property-list format (`bplist00`): a trailer naming the offset table, the top object and
// the sizes of offsets and references; objects found through the table by number.
//
// Hostile input is the normal case here: every offset, count and reference is checked against the
// data before use, arithmetic cannot overflow, nesting (and so any reference cycle) stops at
// PlistLimits.maxDepth, and objects referenced many times cannot multiply past a budget proportional
// to the file's size (a "billion laughs" of shared arrays is refused, not expanded).

struct BinaryPlistReader {
    private let b: UnsafeRawBufferPointer
    private let offsetSize: Int
    private let referenceSize: Int
    private let objectCount: Int
    private let topObject: Int
    private let tableOffset: Int
    /// Values still allowed to be produced (each container element and each scalar costs one).
    private var budget: Int

    init(_ bytes: UnsafeRawBufferPointer) throws {
        b = bytes
        guard b.count >= 8 + 32 else { throw PlistError("binary property list: \(b.count) bytes is too short for a header and a trailer") }
        guard b.starts(with: Array("bplist0".utf8)) else { throw PlistError("binary property list: unknown version (bplist0x expected)") }
        let t = b.count - 32
        offsetSize = Int(b[t + 6])
        referenceSize = Int(b[t + 7])
        guard (1...8).contains(offsetSize), (1...8).contains(referenceSize) else {
            throw PlistError("binary property list: offset size \(offsetSize) and reference size \(referenceSize) must be 1 to 8 bytes")
        }
        guard let count = BinaryPlistReader.uint(b, at: t + 8, size: 8), let top = BinaryPlistReader.uint(b, at: t + 16, size: 8),
              let table = BinaryPlistReader.uint(b, at: t + 24, size: 8) else {
            throw PlistError("binary property list: the trailer's numbers are out of range")
        }
        objectCount = count
        topObject = top
        tableOffset = table
        guard objectCount >= 1, topObject < objectCount else {
            throw PlistError("binary property list: top object \(topObject) of \(objectCount) objects")
        }
        let (tableBytes, overflow) = objectCount.multipliedReportingOverflow(by: offsetSize)
        guard !overflow, tableOffset >= 8, tableOffset <= t, tableBytes <= t - tableOffset else {
            throw PlistError("binary property list: the offset table (\(objectCount) offsets at \(tableOffset)) does not fit in the file")
        }
        // Every object takes at least one byte: a table claiming more objects than bytes lies.
        guard objectCount <= tableOffset else { throw PlistError("binary property list: \(objectCount) objects in \(tableOffset) bytes") }
        // Four values per byte of objects, whatever the object count: writers that share equal objects (Python's
        // plistlib, CFBinaryPList) make honest files of few objects that expand to many values.
        budget = tableOffset.multipliedReportingOverflow(by: 4).partialValue &+ 65_536
    }

    mutating func read() throws -> PlistValue {
        try value(topObject, depth: 0)
    }

    /// A big-endian unsigned integer of `size` bytes at `at`, if it is inside the data and fits an Int.
    private static func uint(_ b: UnsafeRawBufferPointer, at: Int, size: Int) -> Int? {
        guard at >= 0, size >= 0, size <= 8, at <= b.count - size else { return nil }
        var v: UInt64 = 0
        for k in 0..<size { v = v << 8 | UInt64(b[at + k]) }
        return v <= UInt64(Int.max) ? Int(v) : nil
    }

    private func offset(of object: Int) throws -> Int {
        guard object >= 0, object < objectCount,
              let o = BinaryPlistReader.uint(b, at: tableOffset + object * offsetSize, size: offsetSize),
              o >= 8, o < tableOffset else {
            throw PlistError("binary property list: object \(object) has no valid offset")
        }
        return o
    }

    private func reference(at position: Int, object: Int) throws -> Int {
        guard let r = BinaryPlistReader.uint(b, at: position, size: referenceSize), r < objectCount else {
            throw PlistError("binary property list: object \(object) refers to an object that does not exist")
        }
        return r
    }

    /// The element count of an object whose marker's low nibble is `low`, and where its content starts.
    private func count(_ low: Int, at offset: Int, object: Int) throws -> (count: Int, start: Int) {
        if low != 0xF { return (low, offset + 1) }
        guard offset + 1 < tableOffset else { throw PlistError("binary property list: object \(object) is cut short") }
        let marker = b[offset + 1]
        let size = 1 << Int(marker & 0xF)
        guard marker >> 4 == 0x1, size <= 8, let n = BinaryPlistReader.uint(b, at: offset + 2, size: size) else {
            throw PlistError("binary property list: object \(object) has an invalid length")
        }
        return (n, offset + 2 + size)
    }

    /// Checks that `count` items of `size` bytes from `start` lie before the offset table.
    private func fits(_ start: Int, _ count: Int, _ size: Int, object: Int) throws -> Int {
        let (bytes, overflow) = count.multipliedReportingOverflow(by: size)
        guard !overflow, start <= tableOffset, bytes <= tableOffset - start else {
            throw PlistError("binary property list: object \(object) (\(count) items) runs past the end of the objects")
        }
        return bytes
    }

    private mutating func spend(_ n: Int, object: Int) throws {
        budget -= n
        guard budget >= 0 else {
            throw PlistError("binary property list: object \(object): shared objects expand to more values than the file can describe")
        }
    }

    private mutating func value(_ object: Int, depth: Int) throws -> PlistValue {
        guard depth < PlistLimits.maxDepth else {
            throw PlistError("binary property list: containers nested deeper than \(PlistLimits.maxDepth) levels (or a reference cycle)")
        }
        try spend(1, object: object)
        let o = try offset(of: object)
        let marker = b[o]
        let high = Int(marker >> 4), low = Int(marker & 0xF)
        switch high {
        case 0x0:
            switch low {
            case 0x8: return .boolean(false)
            case 0x9: return .boolean(true)
            default: throw PlistError("binary property list: object \(object) is a null or fill marker, not a value")
            }
        case 0x1:
            return .integer(try integer(low, at: o, object: object))
        case 0x2, 0x3:
            return try realOrDate(high, low, at: o, object: object)
        case 0x4:
            let (n, start) = try count(low, at: o, object: object)
            let bytes = try fits(start, n, 1, object: object)
            return .data(Array(UnsafeRawBufferPointer(rebasing: b[start..<(start + bytes)])))
        case 0x5:
            return .string(try asciiString(low, at: o, object: object))
        case 0x6:
            return .string(try utf16String(low, at: o, object: object))
        case 0xA:
            return .array(try array(low, at: o, object: object, depth: depth))
        case 0xD:
            return .dictionary(try dictionary(low, at: o, object: object, depth: depth))
        case 0x8: throw PlistError("binary property list: object \(object) is a UID (keyed archives are not property lists)")
        case 0xC: throw PlistError("binary property list: object \(object) is a set (not a property-list type)")
        default: throw PlistError("binary property list: object \(object) has an unknown type (marker 0x\(String(marker, radix: 16)))")
        }
    }

    /// An integer object (marker 0x1L) of 2^L bytes at `o`, big-endian; 8 and 16 bytes are signed.
    private func integer(_ low: Int, at o: Int, object: Int) throws -> Int {
        guard low <= 4 else { throw PlistError("binary property list: object \(object) is an integer of unsupported size") }
        let size = 1 << low
        _ = try fits(o + 1, 1, size, object: object)
        if size == 16 {
            // 128-bit: only values an Int holds (the high half a sign extension of the low).
            guard let low64 = BinaryPlistReader.rawUInt64(b, at: o + 9), let high64 = BinaryPlistReader.rawUInt64(b, at: o + 1),
                  high64 == 0 || high64 == UInt64.max, (high64 == 0) == (Int64(bitPattern: low64) >= 0) else {
                throw PlistError("binary property list: object \(object) is an integer out of range")
            }
            return Int(Int64(bitPattern: low64))
        }
        if size == 8 {
            guard let raw = BinaryPlistReader.rawUInt64(b, at: o + 1) else {
                throw PlistError("binary property list: object \(object) is cut short")
            }
            return Int(Int64(bitPattern: raw))
        }
        guard let n = BinaryPlistReader.uint(b, at: o + 1, size: size) else {
            throw PlistError("binary property list: object \(object) is cut short")
        }
        return n
    }

    /// A real (marker 0x2L: 4 or 8 bytes) or a date (0x33: 8 bytes) at `o`.
    private func realOrDate(_ high: Int, _ low: Int, at o: Int, object: Int) throws -> PlistValue {
        guard low == 2 || low == 3, high == 0x2 || low == 3 else {
            throw PlistError("binary property list: object \(object) is a real or date of unsupported size")
        }
        _ = try fits(o + 1, 1, 1 << low, object: object)
        guard let raw = BinaryPlistReader.rawUInt64(b, at: o + 1, size: 1 << low) else {
            throw PlistError("binary property list: object \(object) is cut short")
        }
        let d = low == 2 ? Double(Float(bitPattern: UInt32(truncatingIfNeeded: raw))) : Double(bitPattern: raw)
        return high == 0x2 ? .real(d) : .date(d)
    }

    /// An ASCII string object (marker 0x5L): every byte below 0x80.
    private func asciiString(_ low: Int, at o: Int, object: Int) throws -> String {
        let (n, start) = try count(low, at: o, object: object)
        let bytes = try fits(start, n, 1, object: object)
        let slice = UnsafeRawBufferPointer(rebasing: b[start..<(start + bytes)])
        guard slice.allSatisfy({ $0 < 0x80 }) else {
            throw PlistError("binary property list: object \(object) is an ASCII string with non-ASCII bytes")
        }
        return String(decoding: slice, as: UTF8.self)
    }

    /// A UTF-16 string object (marker 0x6L): big-endian units, valid UTF-16.
    private func utf16String(_ low: Int, at o: Int, object: Int) throws -> String {
        let (n, start) = try count(low, at: o, object: object)
        let bytes = try fits(start, n, 2, object: object)
        var units: [UInt16] = []
        units.reserveCapacity(n)
        var k = start
        while k < start + bytes { units.append(UInt16(b[k]) << 8 | UInt16(b[k + 1])); k += 2 }
        guard let s = String(validating: units, as: UTF16.self) else {
            throw PlistError("binary property list: object \(object) is not valid UTF-16")
        }
        return s
    }

    /// An array object (marker 0xAL): its elements' references, each element read one level deeper.
    private mutating func array(_ low: Int, at o: Int, object: Int, depth: Int) throws -> [PlistValue] {
        let (n, start) = try count(low, at: o, object: object)
        _ = try fits(start, n, referenceSize, object: object)
        try spend(n, object: object)
        var elements: [PlistValue] = []
        elements.reserveCapacity(n)
        for k in 0..<n {
            elements.append(try value(try reference(at: start + k * referenceSize, object: object), depth: depth + 1))
        }
        return elements
    }

    /// A dictionary object (marker 0xDL): its keys' references, then its values'; every key a string, none given twice
    /// (which value was meant is not known).
    private mutating func dictionary(_ low: Int, at o: Int, object: Int, depth: Int) throws -> PlistDictionary {
        let (n, start) = try count(low, at: o, object: object)
        let (twice, overflow) = n.multipliedReportingOverflow(by: 2)
        guard !overflow else { throw PlistError("binary property list: object \(object) has an invalid length") }
        _ = try fits(start, twice, referenceSize, object: object)
        try spend(twice, object: object)
        var entries: [PlistDictionary.Entry] = []
        entries.reserveCapacity(n)
        var keys = KeyIndex()
        for k in 0..<n {
            guard case .string(let key) = try value(try reference(at: start + k * referenceSize, object: object),
                                                    depth: depth + 1) else {
                throw PlistError("binary property list: object \(object) is a dictionary with a key that is not a string")
            }
            if let first = keys.position(of: key, among: entries) {
                throw PlistError("binary property list: object \(object) is a dictionary with the key '\(key.prefix(64))' twice "
                    + "(entries \(first) and \(k))")
            }
            let v = try value(try reference(at: start + (n + k) * referenceSize, object: object), depth: depth + 1)
            entries.append(PlistDictionary.Entry(key: key, value: v))
        }
        return PlistDictionary(uniqueEntries: entries)
    }

    private static func rawUInt64(_ b: UnsafeRawBufferPointer, at: Int, size: Int = 8) -> UInt64? {
        guard at >= 0, at <= b.count - size else { return nil }
        var v: UInt64 = 0
        for k in 0..<size { v = v << 8 | UInt64(b[at + k]) }
        return v
    }
}
