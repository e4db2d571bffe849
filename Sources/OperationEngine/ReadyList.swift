import DequeModule
import HeapModule

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
///
/// Storage grows with the longest wait seen; once the list is empty after more than `keptCapacity`
/// entries it starts afresh, so a burst (100,000 operations ready at once) is not kept as capacity.
struct ReadyList {
    static let keptCapacity = 4_096
    private var inOrder = Deque<ReadyEntry>()
    private var late = Heap<ReadyEntry>()
    private(set) var highWater = 0

    var isEmpty: Bool { inOrder.isEmpty && late.isEmpty }

    mutating func push(_ entry: ReadyEntry) {
        if let last = inOrder.last, entry.seq < last.seq {
            late.insert(entry)
        } else {
            inOrder.append(entry)
        }
        highWater = max(highWater, inOrder.count + late.count)
    }

    /// Room for `count` more arrivals in order (a batch made ready at once), without growing step by step.
    mutating func reserve(_ count: Int) {
        inOrder.reserveCapacity(inOrder.count + count)
        highWater = max(highWater, inOrder.count + late.count + count)
    }

    func peek() -> ReadyEntry? {
        // The common case first: nothing arrived out of order.
        if late.isEmpty { return inOrder.first }
        switch (inOrder.first, late.min) {
        case (nil, nil): return nil
        case (let a?, nil): return a
        case (nil, let b?): return b
        case (let a?, let b?): return a.seq < b.seq ? a : b
        }
    }

    @discardableResult
    mutating func pop() -> ReadyEntry? {
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
