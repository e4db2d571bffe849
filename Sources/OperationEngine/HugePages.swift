// The arrays of a large graph on transparent huge pages. The kernel hands over fresh memory page by page on
// first touch, each a fault; a million-operation graph is ~100 MB, 25,000 such faults, a fifth of the CPU its run
// takes on a virtual machine (where a fault costs microseconds). Asking for 2 MB pages (madvise, in the system's
// "madvise" mode) makes that ~50 faults. Only arrays of several megabytes ask, and only for whole huge pages inside
// them: nothing is rounded up, so resident memory stays what the arrays use.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

enum HugePages {
    static let pageSize = 2 << 20
    /// Smaller arrays gain little: a few faults at most, and the kernel's search for a free huge page costs too.
    static let threshold = 4 << 20

    /// Asks for huge pages over the whole 2 MB pages within `bytes` from `start`, memory not touched yet.
    static func advise(_ start: UnsafeMutableRawPointer?, bytes: Int) {
        #if os(Linux)
        guard bytes >= threshold, let start else { return }
        let first = (Int(bitPattern: start) + pageSize - 1) & ~(pageSize - 1)
        let end = (Int(bitPattern: start) + bytes) & ~(pageSize - 1)
        guard end > first, let aligned = UnsafeMutableRawPointer(bitPattern: first) else { return }
        _ = madvise(aligned, end - first, Int32(MADV_HUGEPAGE))
        #endif
    }
}

extension Array {
    /// `reserveCapacity`, the room beyond what is held asked for on huge pages when it is large (before anything
    /// writes there).
    mutating func reserveOnHugePages(_ capacity: Int) {
        reserveCapacity(capacity)
        let room = (self.capacity - count) * MemoryLayout<Element>.stride
        guard room >= HugePages.threshold else { return }
        let held = count * MemoryLayout<Element>.stride
        withUnsafeMutableBufferPointer { buffer in
            HugePages.advise(UnsafeMutableRawPointer(buffer.baseAddress).map { $0 + held }, bytes: room)
        }
    }

    /// An array of `count` copies of `value`, on huge pages when it is large. None is `[]`: the standard library's
    /// uninitialized-capacity init writes a count into the one shared empty array, which ThreadSanitizer reports.
    init(hugePagesRepeating value: Element, count: Int) {
        guard count > 0 else {
            self = []
            return
        }
        self.init(unsafeUninitializedCapacity: count) { buffer, initialized in
            HugePages.advise(UnsafeMutableRawPointer(buffer.baseAddress), bytes: count * MemoryLayout<Element>.stride)
            buffer.initialize(repeating: value)
            initialized = count
        }
    }
}
