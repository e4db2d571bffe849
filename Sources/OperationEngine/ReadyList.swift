import DequeModule

/// A ready operation waiting in its queue, ordered by submission.
struct ReadyEntry: Comparable {
    var seq: UInt64
    var ref: NodeRef
    static func < (lhs: Self, rhs: Self) -> Bool { lhs.seq < rhs.seq }
    static func == (lhs: Self, rhs: Self) -> Bool { lhs.seq == rhs.seq }
}

/// The ready operations of one queue at one priority, in submission order.
///
/// Operations almost always become ready in submission order, so they go to a deque in O(1); one
/// that becomes ready after a later-submitted one (its dependencies took longer) goes with the late ones
/// (`LateEntries`: a window of slots by number, else a heap).
/// The next operation is the smaller head of the two: exact FIFO by submission, O(1) in the common case.
/// A list holding one entry at a time (a chain, a serial queue: each operation ready as the last ends) keeps it
/// in a slot of its own, with no storage to touch.
///
/// Storage grows with the longest wait seen; once the list is empty after more than `keptCapacity`
/// entries it starts afresh, so a burst (100,000 operations ready at once) is not kept as capacity.
struct ReadyList {
    static let keptCapacity = 4_096
    /// The list's only entry, when it has exactly one that arrived while it was empty; then the others are empty.
    private var single: ReadyEntry?
    private var inOrder = Deque<ReadyEntry>()
    private var late = LateEntries()
    private(set) var highWater = 0

    var isEmpty: Bool { single == nil && inOrder.isEmpty && late.isEmpty }

    @inline(__always)
    mutating func push(_ entry: ReadyEntry) {
        if single == nil && inOrder.isEmpty && late.isEmpty {
            single = entry
            if highWater == 0 { highWater = 1 }
            return
        }
        if let first = single.take() { inOrder.append(first) }
        if let last = inOrder.last, entry.seq < last.seq {
            late.insert(entry)
        } else {
            inOrder.append(entry)
        }
        highWater = max(highWater, inOrder.count + late.count)
    }

    /// Room for `count` more arrivals in order (a batch made ready at once), without growing step by step.
    mutating func reserve(_ count: Int) {
        if let first = single.take() { inOrder.append(first) }
        inOrder.reserveCapacity(inOrder.count + count)
        highWater = max(highWater, inOrder.count + late.count + count)
    }

    @inline(__always)
    func peek() -> ReadyEntry? {
        if let single { return single }
        // The common case first: nothing arrived out of order.
        if late.isEmpty { return inOrder.first }
        switch (inOrder.first, late.min) {
        case (nil, nil): return nil
        case (let a?, nil): return a
        case (nil, let b?): return b
        case (let a?, let b?): return a.seq < b.seq ? a : b
        }
    }

    @discardableResult @inline(__always)
    mutating func pop() -> ReadyEntry? {
        if let entry = single.take() { return entry }
        if late.isEmpty, let first = inOrder.popFirst() {
            if highWater > Self.keptCapacity && inOrder.isEmpty { self = ReadyList() }
            return first
        }
        // The late entries' smallest, found once: it is what is removed unless the deque's head comes first.
        guard let lateMin = late.min else { return nil }
        let entry: ReadyEntry
        if let first = inOrder.first, first.seq < lateMin.seq {
            entry = inOrder.removeFirst()
        } else {
            late.remove(min: lateMin)
            entry = lateMin
        }
        if highWater > Self.keptCapacity && isEmpty { self = ReadyList() }
        return entry
    }
}

/// The entries that arrived out of order. Such arrivals mostly fall close together (a layer of a graph, made ready in
/// the order its dependencies happen to end): those within a window of 128 sequence numbers take a slot each, by
/// number, and the smallest is the lowest bit set in the window's map, found in one instruction; the window moves on
/// by halves as its lower half empties. What falls outside it goes to a binary heap; the smallest of the two is next.
struct LateEntries {
    static let window = 128
    /// `slots[i]` holds the entry numbered `base + i` when bit i of `low` (i < 64) or of `high` (i ≥ 64) is set.
    private var slots: [ReadyEntry] = []
    private var low: UInt64 = 0
    private var high: UInt64 = 0
    private var base: UInt64 = 0
    private var inWindow = 0
    private var heap = SequenceHeap()

    var isEmpty: Bool { inWindow == 0 && heap.isEmpty }
    var count: Int { inWindow + heap.count }

    @inline(__always)
    var min: ReadyEntry? {
        guard let first = windowMin else { return heap.min }
        guard let other = heap.min else { return first }
        return first.seq < other.seq ? first : other
    }

    /// The window's smallest entry.
    @inline(__always)
    private var windowMin: ReadyEntry? {
        if low != 0 { return slots[low.trailingZeroBitCount] }
        if high != 0 { return slots[64 + high.trailingZeroBitCount] }
        return nil
    }

    mutating func insert(_ entry: ReadyEntry) {
        // An empty window starts half a window below the arrival: later arrivals may be earlier or later than it.
        if inWindow == 0 { base = entry.seq >= 64 ? entry.seq - 64 : 0 }
        guard entry.seq >= base, entry.seq - base < UInt64(Self.window) else {
            heap.insert(entry)
            return
        }
        let offset = Int(entry.seq - base)
        if slots.isEmpty { slots = [ReadyEntry](repeating: entry, count: Self.window) }
        slots[offset] = entry
        if offset < 64 { low |= 1 << UInt64(offset) } else { high |= 1 << UInt64(offset - 64) }
        inWindow += 1
    }

    /// Removes `entry`, the smallest (as `min` gave it): from the window when it is the window's lowest place
    /// (sequence numbers are distinct), else from the heap.
    mutating func remove(min entry: ReadyEntry) {
        let lowest = low != 0 ? low.trailingZeroBitCount : 64 + high.trailingZeroBitCount
        guard inWindow > 0, entry.seq == base + UInt64(lowest) else {
            _ = heap.removeMin()
            return
        }
        if low != 0 { low &= low - 1 } else { high &= high - 1 }
        inWindow -= 1
        if low == 0 && high != 0 {
            // The lower half is empty: the window moves up by it.
            slots.withUnsafeMutableBufferPointer { slots in
                guard let start = slots.baseAddress else { return }
                start.update(from: start + 64, count: 64)
            }
            (low, high, base) = (high, 0, base + 64)
        }
    }
}

/// A binary min-heap of ready entries by sequence number (all distinct), for those that arrive out of order: each
/// insertion and removal one pass over its storage, moving a hole rather than swapping.
struct SequenceHeap {
    private var items: [ReadyEntry] = []

    var isEmpty: Bool { items.isEmpty }
    var count: Int { items.count }
    var min: ReadyEntry? { items.first }

    mutating func insert(_ entry: ReadyEntry) {
        items.append(entry)
        items.withUnsafeMutableBufferPointer { Self.siftUp(entry, from: $0.count - 1, in: $0) }
    }

    /// Puts `entry` in the heap's `hole`, or above it while it is smaller than the parent there.
    @inline(__always)
    private static func siftUp(_ entry: ReadyEntry, from hole: Int, in heap: UnsafeMutableBufferPointer<ReadyEntry>) {
        var hole = hole
        while hole > 0 {
            let parent = (hole - 1) / 2
            guard entry.seq < heap[parent].seq else { break }
            heap[hole] = heap[parent]
            hole = parent
        }
        heap[hole] = entry
    }

    /// The smallest entry, removed; the heap must not be empty. The hole left at the top goes down to a leaf along
    /// the smaller children, one comparison a level and a choice the compiler makes without a branch (which child
    /// is smaller is a coin toss a predictor loses half the time), then the last entry comes back up into it from
    /// there: taken from the bottom, it rarely rises far.
    mutating func removeMin() -> ReadyEntry {
        let last = items.removeLast()
        guard !items.isEmpty else { return last }
        return items.withUnsafeMutableBufferPointer { heap in
            let first = heap[0]
            let n = heap.count
            var hole = 0
            while 2 * hole + 2 < n {
                let left = 2 * hole + 1
                let child = left &+ (heap[left + 1].seq < heap[left].seq ? 1 : 0)
                heap[hole] = heap[child]
                hole = child
            }
            if 2 * hole + 1 < n {
                heap[hole] = heap[2 * hole + 1]
                hole = 2 * hole + 1
            }
            Self.siftUp(last, from: hole, in: heap)
            return first
        }
    }
}
