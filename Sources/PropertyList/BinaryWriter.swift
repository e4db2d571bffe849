// The binary property-list format (`bplist00`), written: for the small records the spool keeps beside every job
// (an extended attribute each), where Foundation's PropertyListSerialization on Linux cost ~60 µs a record (the
// dictionary bridged to NSDictionary, then CF's writer) and a claim from the cluster spent a tenth of its CPU there.
//
// Layout: the header, every object once in depth-first order (a container's references name its elements' object
// numbers), the offset table (each object's position), and the 32-byte trailer. Nothing is shared or uniqued, which
// the format allows and every reader accepts (BinaryReader.swift here, Foundation, Apple's CF).

public enum PlistBinaryWriter {
    /// `value` as a whole binary property list.
    public static func document(_ value: PlistValue) -> [UInt8] {
        var objects = 0
        count(value, &objects)
        let referenceSize = byteCount(UInt64(objects - 1))
        var out: [UInt8] = Array("bplist00".utf8)
        out.reserveCapacity(64 + objects * 16)
        var offsets: [Int] = []
        offsets.reserveCapacity(objects)
        write(value, &out, &offsets, referenceSize)
        let tableOffset = out.count
        let offsetSize = byteCount(UInt64(tableOffset))
        for offset in offsets { append(UInt64(offset), size: offsetSize, to: &out) }
        out.append(contentsOf: [0, 0, 0, 0, 0, 0, UInt8(offsetSize), UInt8(referenceSize)])
        append(UInt64(objects), size: 8, to: &out)
        append(0, size: 8, to: &out)
        append(UInt64(tableOffset), size: 8, to: &out)
        return out
    }

    private static func count(_ value: PlistValue, _ n: inout Int) {
        n += 1
        switch value {
        case .array(let elements): for element in elements { count(element, &n) }
        case .dictionary(let d):
            n += d.count
            for entry in d.entries { count(entry.value, &n) }
        default: break
        }
    }

    /// Writes `value` as the next object (its number: the objects written so far). A container's references are
    /// written as placeholders and filled in as its elements' subtrees follow it, each numbered as it is written.
    private static func write(_ value: PlistValue, _ out: inout [UInt8], _ offsets: inout [Int], _ referenceSize: Int) {
        offsets.append(out.count)
        switch value {
        case .boolean(let b): out.append(b ? 0x09 : 0x08)
        case .integer(let i):
            if i < 0 {
                out.append(0x13)
                append(UInt64(bitPattern: Int64(i)), size: 8, to: &out)
            } else {
                integer(UInt64(i), &out)
            }
        case .real(let d):
            out.append(0x23)
            append(d.bitPattern, size: 8, to: &out)
        case .date(let d):
            out.append(0x33)
            append(d.bitPattern, size: 8, to: &out)
        case .data(let bytes):
            marker(0x4, bytes.count, &out)
            out.append(contentsOf: bytes)
        case .string(let s): string(s, &out)
        case .array(let elements):
            marker(0xA, elements.count, &out)
            var slot = reserve(elements.count, referenceSize, &out)
            for element in elements {
                fill(&slot, offsets.count, referenceSize, &out)
                write(element, &out, &offsets, referenceSize)
            }
        case .dictionary(let d):
            marker(0xD, d.count, &out)
            // The keys' references, then the values'; the keys are the next objects, the values' subtrees follow.
            var slot = reserve(2 * d.count, referenceSize, &out)
            for entry in d.entries {
                fill(&slot, offsets.count, referenceSize, &out)
                offsets.append(out.count)
                string(entry.key, &out)
            }
            for entry in d.entries {
                fill(&slot, offsets.count, referenceSize, &out)
                write(entry.value, &out, &offsets, referenceSize)
            }
        }
    }

    /// Room for `count` references; the position of the first.
    private static func reserve(_ count: Int, _ referenceSize: Int, _ out: inout [UInt8]) -> Int {
        defer { out.append(contentsOf: repeatElement(0, count: count * referenceSize)) }
        return out.count
    }

    /// Writes object number `number` into the reference at `slot`, and moves `slot` to the next.
    private static func fill(_ slot: inout Int, _ number: Int, _ referenceSize: Int, _ out: inout [UInt8]) {
        for k in 0..<referenceSize {
            out[slot + k] = UInt8(truncatingIfNeeded: UInt64(number) >> (8 * UInt64(referenceSize - 1 - k)))
        }
        slot += referenceSize
    }

    /// An unsigned integer object, in the smallest of 1, 2, 4, 8 bytes that holds it.
    private static func integer(_ v: UInt64, _ out: inout [UInt8]) {
        let bytes = byteCount(v)
        let size = bytes <= 1 ? 1 : bytes <= 2 ? 2 : bytes <= 4 ? 4 : 8
        out.append(0x10 | UInt8(size.trailingZeroBitCount))
        append(v, size: size, to: &out)
    }

    /// ASCII as one byte a character, anything else as UTF-16 big-endian (the format's two string types).
    private static func string(_ s: String, _ out: inout [UInt8]) {
        if s.utf8.allSatisfy({ $0 < 0x80 }) {
            marker(0x5, s.utf8.count, &out)
            out.append(contentsOf: s.utf8)
        } else {
            let units = Array(s.utf16)
            marker(0x6, units.count, &out)
            for unit in units { out.append(UInt8(unit >> 8)); out.append(UInt8(unit & 0xFF)) }
        }
    }

    /// A type marker with its count: in the low nibble below 15, else 0xF and an integer object.
    private static func marker(_ type: UInt8, _ count: Int, _ out: inout [UInt8]) {
        if count < 15 {
            out.append(type << 4 | UInt8(count))
        } else {
            out.append(type << 4 | 0xF)
            integer(UInt64(count), &out)
        }
    }

    /// The bytes an unsigned number needs (at least one).
    private static func byteCount(_ v: UInt64) -> Int { max(1, (64 - v.leadingZeroBitCount + 7) / 8) }

    private static func append(_ v: UInt64, size: Int, to out: inout [UInt8]) {
        for k in stride(from: size - 1, through: 0, by: -1) { out.append(UInt8(truncatingIfNeeded: v >> (8 * UInt64(k)))) }
    }
}
