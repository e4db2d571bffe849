// The engine's results and waits: records and outputs of a group, and waiting for a group or a queue to finish.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

extension Engine {
    // MARK: Results and waiting

    public func isFinished(_ group: GroupID) -> Bool { locked { $0.isFinished(group) } }

    public func records(_ group: GroupID) -> [OperationRecord]? { locked { $0.records(group) } }

    public func record(_ group: GroupID, operation: Int) -> OperationRecord? {
        locked { s in
            operation >= 0 && operation < s.operationCount(group) ? s.record(NodeRef(group: group.slot, index: Int32(operation))) : nil
        }
    }

    public func output(_ group: GroupID, operation: Int) -> OperationOutput? {
        locked { s in
            operation >= 0 && operation < s.operationCount(group) ? s.output(NodeRef(group: group.slot, index: Int32(operation))) : nil
        }
    }

    /// Frees a finished group. Its id must not be used afterwards.
    public func release(_ group: GroupID) { locked { $0.release(group) } }

    /// Timers in the heap, stale ones included (for tests).
    var timersArmed: Int { lock.withLock { timers.count } }

    /// Timers that came due so far (for tests).
    var firedTimers: Int { lock.withLock { timersFired } }

    /// CPU seconds used so far by the engine's threads alive now (for tests: held work must leave them idle,
    /// measured apart from whatever else the process runs).
    var threadsCPUTime: Double {
        lock.withLock {
            threads.reduce(0) { sum, thread in
                var clock = clockid_t()
                var ts = timespec()
                guard pthread_getcpuclockid(thread, &clock) == 0, clock_gettime(clock, &ts) == 0 else { return sum }
                return sum + Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
            }
        }
    }

    /// Blocks the calling thread until the group has finished.
    public func wait(_ group: GroupID) {
        lock.lock()
        while !scheduler.isFinished(group) { finishedCondition.wait(lock) }
        lock.unlock()
    }

    /// Suspends until the group has finished.
    public func finished(_ group: GroupID) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            whenFinished(group) { continuation.resume() }
        }
    }

    /// Calls `callback` (on an engine thread, outside the lock) once the group has finished.
    public func whenFinished(_ group: GroupID, _ callback: @escaping @Sendable () -> Void) {
        lock.lock()
        if scheduler.isFinished(group) {
            lock.unlock()
            callback()
            return
        }
        finishCallbacks[group, default: []].append(callback)
        lock.unlock()
    }

    /// Blocks until the queue has no unfinished operation (Foundation's `waitUntilAllOperationsAreFinished`).
    public func waitUntilAllOperationsAreFinished(on queue: QueueID) {
        lock.lock()
        drainWaiters += 1
        while queue.rawValue < scheduler.queues.count && scheduler.queues[queue.rawValue].unfinished > 0 {
            finishedCondition.wait(lock)
        }
        drainWaiters -= 1
        lock.unlock()
    }

    /// Cancels nothing: waits for the work in hand to finish, then stops every thread. The engine must
    /// not be used afterwards.
    public func shutdown() {
        lock.lock()
        drainWaiters += 1
        while scheduler.executingCount > 0 || !runLists.allSatisfy(\.isEmpty) || delivering || !scheduler.events.isEmpty {
            finishedCondition.wait(lock)
        }
        drainWaiters -= 1
        shuttingDown = true
        for condition in workerConditions { condition.broadcast() }
        timerCondition.broadcast()
        deliveryCondition.broadcast()
        while liveThreads > 0 { finishedCondition.wait(lock) }
        lock.unlock()
    }
}
