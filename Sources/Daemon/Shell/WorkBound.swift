// State confined to one serial dispatch queue, checked at every access (as swift-nio's NIOLoopBoundBox is to its
// event loop): the compiler cannot see a queue's isolation, so the queue is asserted at run time instead.

import Dispatch

/// A value read and changed only on `queue`; any other thread traps.
final class WorkBound<Value>: @unchecked Sendable {
    let queue: DispatchQueue
    private var stored: Value

    init(_ value: Value, queue: DispatchQueue) {
        stored = value
        self.queue = queue
    }

    var value: Value {
        get {
            dispatchPrecondition(condition: .onQueue(queue))
            return stored
        }
        _modify {
            dispatchPrecondition(condition: .onQueue(queue))
            yield &stored
        }
    }
}
