// The engine's threads: workers per QoS class, the timer thread and the event-delivery thread, and how they
// are started. Each takes the engine's one lock for every step; see Engine.swift for the strategy.

import CShims

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

extension Engine {
    // MARK: Threads

    func spawn(_ main: @escaping @Sendable (Engine) -> Void) {
        liveThreads += 1
        let box = Unmanaged.passRetained(ThreadStart(engine: self, main: main))
        var thread = pthread_t()
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        pthread_attr_setstacksize(&attributes, 1 << 20)
        let rc = pthread_create(&thread, &attributes, { raw in
            guard let raw else { return nil }
            let start = Unmanaged<ThreadStart>.fromOpaque(raw).takeRetainedValue()
            start.main(start.engine)
            return nil
        }, box.toOpaque())
        pthread_attr_destroy(&attributes)
        if rc != 0 {
            // Out of threads: the work stays queued and the next step tries again.
            box.release()
            liveThreads -= 1
        } else {
            threads.append(thread)
        }
    }

    func threadExited() {
        liveThreads -= 1
        let me = pthread_self()
        threads.removeAll { pthread_equal($0, me) != 0 }
        finishedCondition.broadcast()
    }

    func workerMain(_ qos: QualityOfService) {
        let priority = qos.threadPriority
        _ = opq_set_thread_priority(priority.nice, priority.idle ? 1 : 0)
        let c = Int(qos.rawValue)
        lock.lock()
        spawning[c] -= 1
        var next: Dispatch?
        // Acquisitions in a row, after an operation, that found the lock taken; and whether this worker just shed.
        var streak = 0
        var shed = false
        while true {
            let dispatch: Dispatch
            if let taken = next.take() {
                dispatch = taken
            } else {
                // Shed (Governor.swift): wait to be woken once, even with work in the run list (the busy worker's).
                if shed && !shuttingDown { waitAsIdle(c) }
                shed = false
                while runLists[c].isEmpty && !shuttingDown { waitAsIdle(c) }
                guard let popped = runLists[c].popFirst() else {
                    workers[c] -= 1
                    threadExited()
                    lock.unlock()
                    return
                }
                if runLists[c].isEmpty { queuedClasses &= ~(1 << UInt8(c)) }
                if case .async = popped.body { asyncQueued[c] -= 1; asyncRunning[c] += 1 }
                dispatch = popped
            }
            lock.unlock()
            let attempt = dispatch.attempt
            var time = Double.nan
            if let outcome = run(consume dispatch) {
                if lock.tryLock() { streak = 0 } else { lock.lock(); streak += 1 }
                time = wallClock()
                scheduler.finish(attempt, outcome: outcome, now: time)
                if governor.workerStep(c, time: time, streak: streak, busy: busyWorkers(c)) {
                    shed = true
                    streak = 0
                    armGovernorCheck()
                }
            } else {
                lock.lock()
                asyncRunning[c] -= 1
            }
            // One reading of the clock for the end and the starts that follow it, in the same hold of the lock.
            let after = afterStep(runningClass: c, now: time, taken: &next)
            if !after.isEmpty {
                lock.unlock()
                after.run()
                lock.lock()
            }
        }
    }

    /// Under the lock: a worker of class `c` waits to be woken, counted idle meanwhile (and no longer owed a signal).
    private func waitAsIdle(_ c: Int) {
        idle[c] += 1
        workerConditions[c].wait(lock)
        idle[c] -= 1
        if signalled[c] > 0 { signalled[c] -= 1 }
    }

    /// Calls a dispatch's body, outside the lock: a synchronous one's outcome, nil for an asynchronous one. The
    /// dispatch and its context are let go here, before the caller takes the lock again: releasing the body, the name
    /// and the input (counts other workers touch too) is no work to do while holding it.
    @inline(__always)
    private func run(_ dispatch: consuming Dispatch) -> Scheduler.Outcome? {
        let context = OperationContext(host: self, current: dispatch.attempt, input: dispatch.input, name: dispatch.name)
        // The bodies are called through the dispatch (`call`), not bound out of it: a binding copies the closure,
        // a retain and a release on a count every worker shares when operations share a body.
        switch dispatch.body {
        case .sync:
            do {
                return .succeeded(try dispatch.body.call(context).map(OutputBox.init))
            } catch {
                return .failure(String(describing: error), final: error is FinalFailure)
            }
        case .async:
            _ = try? dispatch.body.call(context)
            return nil
        }
    }

    func timerMain() {
        lock.lock()
        while !shuttingDown {
            let deadline = min(timers.min?.deadline ?? .infinity, governor.checkAt)
            guard deadline < .infinity else {
                timerCondition.wait(lock)
                continue
            }
            let now = monotonicClock()
            if deadline > now {
                timerCondition.wait(lock, untilMonotonic: deadline)
                continue
            }
            if governor.checkAt <= now { checkGovernor(monotonic: now) }
            let wall = wallClock()
            while let due = timers.min, due.deadline <= now {
                timers.removeMin()
                timersFired += 1
                scheduler.fire(due.kind, now: wall)
            }
            let after = afterStep(runningClass: nil)
            lock.unlock()
            after.run()
            lock.lock()
        }
        threadExited()
        lock.unlock()
    }

    func deliveryMain() {
        lock.lock()
        while true {
            while scheduler.events.isEmpty && !shuttingDown { deliveryCondition.wait(lock) }
            if scheduler.events.isEmpty { break }
            var batches = scheduler.events.take()
            delivering = true
            lock.unlock()
            for batch in batches { observer?(batch) }
            batches.removeAll()
            lock.lock()
            delivering = false
            if scheduler.events.isEmpty { finishedCondition.broadcast() }
        }
        threadExited()
        lock.unlock()
    }
}

private final class ThreadStart: @unchecked Sendable {
    let engine: Engine
    let main: @Sendable (Engine) -> Void
    init(engine: Engine, main: @escaping @Sendable (Engine) -> Void) {
        self.engine = engine
        self.main = main
    }
}
