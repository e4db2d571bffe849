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
/// that becomes ready after a later-submitted one (its dependencies took longer) goes to a heap.
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
    private var late = SequenceHeap()
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
        let entry: ReadyEntry
        if late.isEmpty, let first = inOrder.popFirst() {
            if highWater > Self.keptCapacity && inOrder.isEmpty { self = ReadyList() }
            return first
        }
        switch (inOrder.first, late.min) {
        case (nil, nil): return nil
        case (_?, nil): entry = inOrder.removeFirst()
        case (nil, _?): entry = late.removeMin()
        case (let a?, let b?): entry = a.seq < b.seq ? inOrder.removeFirst() : late.removeMin()
        }
        if highWater > Self.keptCapacity && isEmpty { self = ReadyList() }
        return entry
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
        items.withUnsafeMutableBufferPointer { heap in
            var hole = heap.count - 1
            while hole > 0 {
                let parent = (hole - 1) / 2
                guard entry.seq < heap[parent].seq else { break }
                heap[hole] = heap[parent]
                hole = parent
            }
            heap[hole] = entry
        }
    }

    /// The smallest entry, removed; the heap must not be empty.
    mutating func removeMin() -> ReadyEntry {
        let last = items.removeLast()
        guard !items.isEmpty else { return last }
        return items.withUnsafeMutableBufferPointer { heap in
            let first = heap[0]
            let n = heap.count
            var hole = 0
            while true {
                var child = 2 * hole + 1
                guard child < n else { break }
                if child + 1 < n && heap[child + 1].seq < heap[child].seq { child += 1 }
                guard heap[child].seq < last.seq else { break }
                heap[hole] = heap[child]
                hole = child
            }
            heap[hole] = last
            return first
        }
    }
}
