// Engine: the `Scheduler` made concurrent — one lock, worker threads per QoS class, one timer
// thread and one event-delivery thread.
//
// Strategy:
// - Every state change happens under one mutex, in the `Scheduler`; nothing else is shared.
// - Workers are pthreads grouped by QoS class, each class at its own Linux priority (nice,
//   SCHED_IDLE, idle I/O class), spawned on demand: a class has as many threads as operations of
//   that class execute at once (queue limits bound it), and no more.
// - A worker that finishes an operation takes the next one of its class under the same lock hold,
//   so chains and serial queues run without a thread hand-off.
// - Operations so brief that the lock is the bottleneck run on one worker of their class, not several that would
//   wait for each other (Governor.swift); a long operation among them releases the class within half a millisecond.
// - Asynchronous operations hold a queue slot but no thread; their completion may come from anywhere.
// - Timeouts, retry delays, group deadlines and queue rates' next free starts sit in one heap served by
//   one timer thread: nothing polls.
// - Observers get events in batches, in order, from one delivery thread, outside the lock.

import CShims
import DequeModule
import HeapModule

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

public final class Engine: @unchecked Sendable, ContextHost {
    public typealias Observer = @Sendable ([EngineEvent]) -> Void

    let lock = Lock()
    // Every variable below is read and written with `lock` held, which already gives each access exclusivity;
    // Swift's run-time check of a class's stored property (two calls into the runtime per access) would only
    // add to each operation's cost, so it is turned off for them.
    @exclusivity(unchecked) var scheduler: Scheduler
    let observer: Observer?

    static let classes = QualityOfService.allCases.count
    @exclusivity(unchecked) var runLists = [Deque<Dispatch>](repeating: [], count: classes)
    /// Bit c set when class c's run list is not empty: a step looks at those classes only (most steps of a worker
    /// leave no list with anything in it).
    @exclusivity(unchecked) var queuedClasses: UInt8 = 0
    /// Dispatches of asynchronous bodies in each run list. Such a body returns at once (its work goes on
    /// elsewhere: a timer, a transfer, a child process), so a few workers drain any number of them; only
    /// synchronous dispatches each call for a thread of their own.
    @exclusivity(unchecked) var asyncQueued = [Int](repeating: 0, count: classes)
    /// Workers inside an asynchronous body, per class: they come back for the next dispatch soon.
    @exclusivity(unchecked) var asyncRunning = [Int](repeating: 0, count: classes)
    /// Workers asked for per class by a burst of asynchronous dispatches.
    static let asyncWorkers = 2
    let workerConditions: [Condition]
    @exclusivity(unchecked) var idle = [Int](repeating: 0, count: classes)
    @exclusivity(unchecked) var signalled = [Int](repeating: 0, count: classes)
    @exclusivity(unchecked) var spawning = [Int](repeating: 0, count: classes)
    @exclusivity(unchecked) var workers = [Int](repeating: 0, count: classes)
    /// Keeps brief operations on one worker of their class (Governor.swift).
    @exclusivity(unchecked) var governor = Governor(classes: classes)
    /// Per class; a runaway queue limit cannot create unbounded threads.
    let maxThreadsPerClass: Int

    struct TimerEntry: Comparable {
        var deadline: Double
        var seq: UInt64
        var kind: TimerKind
        static func < (a: Self, b: Self) -> Bool { (a.deadline, a.seq) < (b.deadline, b.seq) }
        static func == (a: Self, b: Self) -> Bool { a.seq == b.seq }
    }
    @exclusivity(unchecked) var timers = Heap<TimerEntry>()
    /// Timers left after the last compaction (see `afterStep`).
    @exclusivity(unchecked) var timersKept = 0
    @exclusivity(unchecked) var timerSeq: UInt64 = 0
    let timerCondition = Condition()
    @exclusivity(unchecked) var timerThreadStarted = false

    let deliveryCondition = Condition()
    @exclusivity(unchecked) var deliveryThreadStarted = false
    @exclusivity(unchecked) var delivering = false

    let finishedCondition = Condition()
    /// Threads waiting on `finishedCondition` for something other than a group (queue drain, shutdown).
    @exclusivity(unchecked) var drainWaiters = 0
    @exclusivity(unchecked) var finishCallbacks: [GroupID: [@Sendable () -> Void]] = [:]

    @exclusivity(unchecked) var shuttingDown = false
    @exclusivity(unchecked) var liveThreads = 0
    /// The threads alive, for `threadsCPUTime`.
    @exclusivity(unchecked) var threads: [pthread_t] = []
    /// Timers that came due, for tests (work held by a rate waits for one timer, not a poll).
    @exclusivity(unchecked) var timersFired = 0

    /// - Parameters:
    ///   - processorCount: what `maxConcurrentOperationCount = -1` means (default: online CPUs).
    ///   - observer: receives every transition, in order per operation, in batches, on one thread.
    public init(processorCount: Int? = nil, maxThreadsPerClass: Int = 512, observer: Observer? = nil) {
        let cpus = processorCount ?? Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))
        scheduler = Scheduler(processorCount: max(1, cpus))
        scheduler.recordsEvents = observer != nil
        self.observer = observer
        self.maxThreadsPerClass = max(1, maxThreadsPerClass)
        workerConditions = (0..<Self.classes).map { _ in Condition() }
    }

    // MARK: Queues

    /// Adds a named queue, or updates it if the name exists (every setting, the rate included: nil removes it).
    /// - Parameter rateLimit: at most so many of its operations start in any window of so many seconds (SPEC §3.7);
    ///   an operation held back by it stays ready.
    @discardableResult
    public func addQueue(named name: String, maxConcurrentOperationCount: Int = -1, qualityOfService: QualityOfService = .default,
                         isSuspended: Bool = false, rateLimit: RateLimit? = nil) -> QueueID {
        locked {
            $0.addQueue(name: name, maxConcurrentOperationCount: maxConcurrentOperationCount, qualityOfService: qualityOfService,
                        suspended: isSuspended, rateLimit: rateLimit)
        }
    }

    /// Changes a queue while work runs: a higher limit, a resume or a higher rate starts work at once; a lower limit
    /// or a suspension lets executing operations go on and starts nothing new until they fit.
    /// A setting left nil is kept. `rateLimit`: a `RateLimit?` value sets the rate (nil in it removes the rate;
    /// a literal `nil` argument keeps it, write `.some(nil)`); a new rate keeps the starts already made.
    public func updateQueue(_ id: QueueID, maxConcurrentOperationCount: Int? = nil, qualityOfService: QualityOfService? = nil,
                            isSuspended: Bool? = nil, rateLimit: RateLimit?? = nil) {
        locked {
            $0.updateQueue(id, maxConcurrentOperationCount: maxConcurrentOperationCount, qualityOfService: qualityOfService,
                           suspended: isSuspended, rateLimit: rateLimit)
        }
    }

    /// Permits held from outside for a queue (a cluster-wide limit's leases): at most `permits` of its operations
    /// execute at once, on top of its own limit, and each attempt that ends uses its permit up — the holder grants
    /// it again (or gives it to a better waiter elsewhere) before another operation starts on it. nil removes the
    /// outside limit. Raising it starts work at once.
    public func setPermits(_ id: QueueID, _ permits: Int?) {
        locked { $0.setPermits(id, permits) }
    }

    /// Permits a queue could use now (executing plus ready, within its own limit; only the executing ones while
    /// suspended), how many execute, the highest priority among its ready operations (the next to start), and the
    /// permits it has now (0 without): the holder acquires up to the first, ranked by the third, grants what it
    /// holds, and returns what exceeds it.
    public func permitDemand(_ id: QueueID) -> (wanted: Int, executing: Int, best: QueuePriority?, permits: Int) {
        locked { s in
            guard s.queues.indices.contains(id.rawValue) else { return (0, 0, nil, 0) }
            let q = id.rawValue
            return (s.permitsWanted(q), s.queues[q].executing, s.bestReadyPriority(q), s.queues[q].permits ?? 0)
        }
    }

    public func queueID(named name: String) -> QueueID? { locked { $0.queueID(named: name) } }

    public func queues() -> [QueueSnapshot] {
        locked { s in
            let (now, monotonic) = (wallClock(), monotonicClock())
            return s.queues.indices.map { s.snapshot($0, now: now, monotonic: monotonic) }
        }
    }

    public var executingCount: Int { locked { $0.executingCount } }

    /// What `status` shows of the engine.
    public struct Overview: Sendable {
        public var executing: Int
        public var queues: [QueueSnapshot]
        /// The engine was busy with one long step: these are the figures as last read.
        public var isStale: Bool
    }

    private let overviewLock = Lock()
    private var lastOverview = Overview(executing: 0, queues: [], isStale: true)

    /// The executing count and the queues, waiting at most `patience` seconds for the engine: while one
    /// long step holds it (a million-operation graph adopted, its records read or released), the last
    /// reading is returned, marked stale, rather than holding up whoever asked.
    public func overview(patience: Double = 0.02) -> Overview {
        guard lock.lock(within: patience) else {
            var last = overviewLock.withLock { lastOverview }
            last.isStale = true
            return last
        }
        let (now, monotonic) = (wallClock(), monotonicClock())
        let fresh = Overview(executing: scheduler.executingCount,
                             queues: scheduler.queues.indices.map { scheduler.snapshot($0, now: now, monotonic: monotonic) },
                             isStale: false)
        lock.unlock()
        overviewLock.withLock { lastOverview = fresh }
        return fresh
    }

    /// Runs `body` with the engine's lock held, as a long step does (for tests).
    func holdingTheLock(_ body: () -> Void) { lock.withLock(body) }

    // MARK: Work

    /// Submits a graph as a new group. Refused as a whole, with every problem, if it is not valid.
    /// - Parameters:
    ///   - qualityOfService: the group's default QoS, between the operation's and the queue's.
    ///   - deadline: seconds from now after which the group's unfinished operations are cancelled.
    /// `keepOutputs` false: each output is dropped once every dependent has ended (memory stays bounded by
    /// what is in flight, as a daemon running image pipelines needs); `output(_:operation:)` then answers
    /// only for outputs still awaited. Operations added later by `extend` see only outputs still kept.
    /// `cancelled`: cancels asked before the group existed, made before any of its operations can start (an operation
    /// that has not started never starts): nil for the whole group, else an operation's index in `graph`.
    public func submit(_ graph: consuming GraphBuilder, qualityOfService: QualityOfService? = nil, deadline: Double? = nil,
                       keepOutputs: Bool = true, cancelled: [Int?] = [],
                       cancelReason: String = "cancelled") throws(SubmissionError) -> GroupID {
        // Handed on with `consume`: a copy left behind would make the scheduler's first write copy every array.
        let prepared = Scheduler.prepare(consume graph, queueCount: lock.withLock { scheduler.queues.count })
        lock.lock()
        let result: Result<GroupID, SubmissionError>
        do throws(SubmissionError) {
            let now = wallClock()
            let group = try scheduler.submit(consume prepared, qualityOfService: qualityOfService, deadline: deadline,
                                             keepOutputs: keepOutputs, now: now)
            for cancel in cancelled {
                if let operation = cancel {
                    guard operation >= 0, operation < scheduler.operationCount(group) else { continue }
                    scheduler.cancel(NodeRef(group: group.slot, index: Int32(operation)), reason: cancelReason, now: now)
                } else {
                    scheduler.cancel(group: group, reason: cancelReason, now: now)
                }
            }
            result = .success(group)
        } catch {
            result = .failure(error)
        }
        let after = afterStep(runningClass: nil)
        lock.unlock()
        after.run()
        return try result.get()
    }

    /// Adds operations to a group that has not finished (graph expansion: call it from one of the
    /// group's executing operations so the group cannot finish first).
    public func extend(_ group: GroupID, with graph: consuming GraphBuilder) throws(SubmissionError) {
        // Handed on with `consume`: a copy left behind would make the scheduler's first write copy every array.
        let prepared = Scheduler.prepare(consume graph, queueCount: lock.withLock { scheduler.queues.count })
        lock.lock()
        let result: Result<Void, SubmissionError>
        do throws(SubmissionError) {
            result = .success(try scheduler.extend(group, with: consume prepared, now: wallClock()))
        } catch {
            result = .failure(error)
        }
        let after = afterStep(runningClass: nil)
        lock.unlock()
        after.run()
        try result.get()
    }

    /// Foundation's `addBarrierBlock`: `body` runs once all operations added to the queue before it have
    /// finished; operations added after it wait for it.
    public func addBarrier(on queue: QueueID, _ body: @escaping @Sendable () -> Void) {
        locked { s, now in _ = s.addBarrier(queue: queue, name: "barrier", body: .sync { _ in body(); return nil }, now: now) }
    }

    public func cancel(_ group: GroupID, reason: String = "cancelled") {
        locked { s, now in s.cancel(group: group, reason: reason, now: now) }
    }

    public func cancel(_ group: GroupID, operation: Int, reason: String = "cancelled") {
        locked { s, now in
            guard operation >= 0, operation < s.operationCount(group) else { return }
            s.cancel(NodeRef(group: group.slot, index: Int32(operation)), reason: reason, now: now)
        }
    }

    public func cancelAll(reason: String = "cancelled") {
        locked { s, now in s.cancelAll(reason: reason, now: now) }
    }

    // MARK: ContextHost

    func isCancelled(_ attempt: Attempt) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        return scheduler.isCancelled(attempt)
    }

    func complete(_ attempt: Attempt, result: Result<OperationOutput?, any Error>) {
        let outcome: Scheduler.Outcome
        switch result {
        case .success(let output): outcome = .success(output)
        case .failure(let error): outcome = .failure(String(describing: error), final: error is FinalFailure)
        }
        locked { s, now in s.finish(attempt, outcome: outcome, now: now) }
    }

    func setCancelHandler(_ attempt: Attempt, handler: @escaping @Sendable () -> Void) {
        lock.lock()
        let runNow = scheduler.setCancelHandler(attempt, handler: handler)
        lock.unlock()
        runNow?()
    }

    // MARK: The lock and what follows every step

    func locked<T>(_ body: (inout Scheduler) -> T) -> T {
        lock.lock()
        let result = body(&scheduler)
        let after = afterStep(runningClass: nil)
        lock.unlock()
        after.run()
        return result
    }

    func locked<T>(_ body: (inout Scheduler, Double) -> T) -> T {
        lock.lock()
        let result = body(&scheduler, wallClock())
        let after = afterStep(runningClass: nil)
        lock.unlock()
        after.run()
        return result
    }

    /// What must happen outside the lock after a step (optional: most steps have nothing, and no array is made). A
    /// step by a thread not the engine's (a command's end) also leaves its wake-ups until after the unlock: a worker
    /// signalled under the lock would only block on it next.
    struct After {
        var handlers: [@Sendable () -> Void]?
        var callbacks: [@Sendable () -> Void]?
        var wakes: [Condition]?
        var isEmpty: Bool { handlers == nil && callbacks == nil && wakes == nil }
        func run() {
            for condition in wakes ?? [] { condition.signal() }
            for handler in handlers ?? [] { handler() }
            for callback in callbacks ?? [] { callback() }
        }

        /// Signals `condition` now (`deferred` false: a worker's own step, which goes on holding the lock) or at `run`.
        mutating func wake(_ condition: Condition, deferred: Bool) {
            if deferred { wakes = (wakes ?? []) + [condition] } else { condition.signal() }
        }
    }

    /// Under the lock: start what can start, arm timers, wake the threads that have work.
    /// `runningClass` is the class of the calling worker, which goes on to take one item itself.
    /// `now`: the wall clock as the step read it (NaN: read it here when something may start).
    func afterStep(runningClass: Int?, now: Double = .nan) -> After {
        var none: Dispatch?
        return afterStep(runningClass: runningClass, now: now, taken: &none)
    }

    /// `afterStep` for a worker: `taken` receives its next operation (the first of its class, synchronous), handed to
    /// it directly rather than through the list; what the list already holds goes to the workers signalled for it.
    func afterStep(runningClass: Int?, now: Double, taken: inout Dispatch?) -> After {
        var after = After()
        var dispatchTime = now
        var rateTime: Double?
        var clocksRead = false
        while true {
            if !clocksRead {
                clocksRead = true
                // Rate windows run on the monotonic clock: a step of the wall clock must not stall a queue or free it.
                // The starts they allow are stamped with a wall clock read with it, not the one the caller read (at
                // its operation's end): a stamp from before a window opened puts one start too many in a window.
                if scheduler.ratedQueues > 0 {
                    rateTime = monotonicClock()
                    dispatchTime = wallClock()
                } else if dispatchTime.isNaN {
                    dispatchTime = wallClock()
                }
            }
            guard let dispatch = scheduler.nextDispatch(now: dispatchTime, monotonic: rateTime) else { break }
            let c = Int(dispatch.qualityOfService.rawValue)
            // A governed class's worker takes its next from the run list's head, in order, as its other dispatches.
            if c == runningClass, taken == nil, case .sync = dispatch.body, !governor.isGoverned(c) {
                taken = dispatch
                continue
            }
            if case .async = dispatch.body { asyncQueued[c] += 1 }
            runLists[c].append(dispatch)
            queuedClasses |= 1 << UInt8(c)
        }
        // After the dispatches: they ask for timers too (an attempt's timeout, a rate's next free start).
        if !scheduler.timerRequests.isEmpty { armTimers() }
        var classes = queuedClasses
        while classes != 0 {
            let c = classes.trailingZeroBitCount
            classes &= classes - 1
            wakeWorkers(of: c, selfTakes: runningClass == c && taken == nil, deferred: runningClass == nil, into: &after)
        }
        if !scheduler.cancelHandlersToRun.isEmpty {
            after.handlers = scheduler.cancelHandlersToRun
            scheduler.cancelHandlersToRun.removeAll()
        }
        if !scheduler.events.isEmpty {
            if !deliveryThreadStarted {
                deliveryThreadStarted = true
                spawn { $0.deliveryMain() }
            } else if !delivering {
                after.wake(deliveryCondition, deferred: runningClass == nil)
            }
        }
        if !scheduler.finishedGroups.isEmpty {
            for group in scheduler.finishedGroups {
                if let callbacks = finishCallbacks.removeValue(forKey: group) { after.callbacks = (after.callbacks ?? []) + callbacks }
            }
            scheduler.finishedGroups.removeAll(keepingCapacity: true)
            finishedCondition.broadcast()
        } else if drainWaiters > 0 {
            // Waiters re-check their own condition (queue drained, work in hand done).
            finishedCondition.broadcast()
        }
        return after
    }

    /// Under the lock: wakes or starts as many workers of class `c` as its run list needs, beyond those on their way.
    /// `selfTakes`: the calling worker, of this class, takes one itself; `deferred`: wake-ups wait for `After.run`.
    private func wakeWorkers(of c: Int, selfTakes: Bool, deferred: Bool, into after: inout After) {
        let needed = runLists[c].count - asyncQueued[c] + max(0, min(asyncQueued[c], Self.asyncWorkers) - asyncRunning[c])
        var deficit = needed - signalled[c] - spawning[c] - (selfTakes ? 1 : 0)
        if governor.isGoverned(c) {
            // One busy worker (or one on its way) takes the run list in order: nobody else is woken.
            deficit = busyWorkers(c) + signalled[c] + spawning[c] > 0 ? 0 : min(deficit, 1)
        }
        var available = idle[c] - signalled[c]
        while deficit > 0 && available > 0 {
            after.wake(workerConditions[c], deferred: deferred)
            signalled[c] += 1
            available -= 1
            deficit -= 1
        }
        while deficit > 0 && workers[c] < maxThreadsPerClass {
            workers[c] += 1
            spawning[c] += 1
            deficit -= 1
            let qos = QualityOfService(rawValue: UInt8(c)) ?? .default
            spawn { $0.workerMain(qos) }
        }
    }

    /// Under the lock: moves the scheduler's timer requests into the heap, waking the timer thread when the
    /// earliest deadline moved.
    func armTimers() {
        let now = monotonicClock()
        var earliestChanged = false
        for request in scheduler.timerRequests {
            let entry = TimerEntry(deadline: now + request.delay, seq: timerSeq, kind: request.kind)
            timerSeq &+= 1
            if let min = timers.min, min.deadline <= entry.deadline {} else { earliestChanged = true }
            timers.insert(entry)
        }
        scheduler.timerRequests.removeAll(keepingCapacity: true)
        if timers.count > 2 * timersKept + 1024 {
            // Most of what is armed may be stale (a one-hour timeout of an attempt that took a second):
            // keep what can still fire, so the heap stays proportional to live attempts and jobs.
            timers = Heap(timers.unordered.lazy.filter { [scheduler] in scheduler.isPending($0.kind) })
            timersKept = timers.count
            earliestChanged = true
        }
        if earliestChanged || !timerThreadStarted { wakeTimerThread() }
    }

    /// Under the lock: starts the timer thread, or wakes it to look at its deadlines again.
    func wakeTimerThread() {
        if !timerThreadStarted {
            timerThreadStarted = true
            spawn { $0.timerMain() }
        } else {
            timerCondition.signal()
        }
    }
}
