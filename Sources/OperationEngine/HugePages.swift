// The arrays of a large graph on transparent huge pages. The kernel hands over fresh memory page by page on
// first touch, each a fault; a million-operation graph is ~100 MB, 25,000 such faults, a fifth of the CPU its run
// takes on a virtual machine (where a fault costs microseconds). Asking for 2 MB pages (madvise, in the system's
// "madvise" mode) makes that ~50 faults. Only arrays of several megabytes ask, and only for whole huge pages inside
// them: nothing is rounded up. Their pages are faulted in ahead by a thread of their own (`prefault`), so the room a
// caller reserves is resident whether it is used or not.

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

    /// Faults in the pages within `bytes` from `start` on a thread of its own, from the end backwards, while the caller
    /// fills them from the front: the kernel's clearing of a large graph's fresh pages (~2 ms a megabyte on a virtual
    /// machine) is shared with a core that has nothing else to do then, not all done on the submitting thread. Faulting
    /// a page in changes nothing in it (a page already there is left as it is), so the two may meet anywhere.
    static func prefault(_ start: UnsafeMutableRawPointer?, bytes: Int) {
        #if os(Linux)
        let small = 4_096
        guard bytes >= threshold, let start else { return }
        let first = (Int(bitPattern: start) + small - 1) & ~(small - 1)
        let end = (Int(bitPattern: start) + bytes) & ~(small - 1)
        guard end > first else { return }
        let range = UnsafeMutablePointer<(first: Int, end: Int)>.allocate(capacity: 1)
        range.initialize(to: (first, end))
        var thread = pthread_t()
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        pthread_attr_setstacksize(&attributes, 64 << 10)
        let rc = pthread_create(&thread, &attributes, { raw in
            guard let range = raw?.assumingMemoryBound(to: (first: Int, end: Int).self) else { return nil }
            let (first, end) = range.pointee
            range.deallocate()
            var upTo = end
            while upTo > first {
                let from = max(first, (upTo - 1) & ~(HugePages.pageSize - 1))
                // MADV_POPULATE_WRITE (Linux 5.14): faults the range in as a write would; an older kernel refuses it.
                guard madvise(UnsafeMutableRawPointer(bitPattern: from), upTo - from, 23) == 0 else { break }
                upTo = from
            }
            return nil
        }, range)
        pthread_attr_destroy(&attributes)
        if rc != 0 { range.deallocate() }
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
            let start = UnsafeMutableRawPointer(buffer.baseAddress).map { $0 + held }
            HugePages.advise(start, bytes: room)
            HugePages.prefault(start, bytes: room)
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
            HugePages.prefault(UnsafeMutableRawPointer(buffer.baseAddress), bytes: count * MemoryLayout<Element>.stride)
            buffer.initialize(repeating: value)
            initialized = count
        }
    }
}
