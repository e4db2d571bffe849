// Scheduler: the operation engine's whole state and every rule of SPEC §3.2 and §3.4, and §3.7's queue
// rates (`Scheduler+Rate.swift`), with no threads, no clock and no I/O.
// This file holds its state and queues; its rules are in `Scheduler+*.swift` by topic, the types it
// shares with the engine in `EngineTypes.swift`.
//
// Each method takes the current time and returns what the caller must do (dispatch an operation,
// arm a timer, run a cancellation handler, deliver events), so the rules are tested one step at a
// time and the threaded `Engine` only adds locking and workers around them.
//
// Strategy, for linear time at a million operations:
// - Operations live in flat per-group arrays, numbered; edges are compressed rows built once per
//   submitted batch, so finishing an operation touches only its own dependents (constant work per edge).
// - An operation waits on a counter of unfinished dependencies; it is never rescanned.
// - Each queue keeps five `ReadyList`s (one per priority), each O(1) for in-order arrivals.
// - Choosing the next operation looks at each queue's head only: O(queues), not O(operations).
// - QoS raises (no priority inversion) propagate to dependencies only when they raise something,
//   and a class can only rise four times, so the total work is bounded by 4·edges.

struct Scheduler {
    /// An operation's scheduling state: plain data, so reading one copies no references.
    /// Its body and name live in arrays of their own beside it, its sequence number comes from its batch (`seq`), and
    /// what few operations have (an input named, options) in columns of the group (`SparseColumn`).
    /// 32 bytes (the raised QoS shares a byte with the flags), two to a cache line: a million-operation graph is so
    /// much memory the kernel must hand over page by page, and its nodes are read from memory, not the cache.
    struct Node {
        var startedAt: Double = .nan
        var finishedAt: Double = .nan
        var pending: Int32
        var epoch: Int32
        var queue: UInt16
        var attempts: UInt16 = 0
        var state: OperationState = .pending
        /// Operation's QoS, else the group's; `noQoS` defers to the queue's.
        var requestedQoS: UInt8
        var priority: QueuePriority
        /// The flags below in the low four bits, `raisedQoS` in the high four.
        var flags: UInt8 = 0

        /// The QoS the operation was raised to by what waits for it (0: none).
        var raisedQoS: UInt8 {
            get { flags >> 4 }
            set { flags = flags & 0x0F | newValue << 4 }
        }

        static let runsAfterFailure: UInt8 = 1
        static let cancelRequested: UInt8 = 2
        static let timedOut: UInt8 = 4
        static let isBarrier: UInt8 = 8
    }

    struct Options {
        var timeout: Double?
        var retries: Int
        var retryDelay: Double
    }

    /// One submitted batch's edges, as compressed rows over the group's numbering.
    struct Batch {
        var base: Int32
        /// The sequence number of its first operation; the others follow in order (`Scheduler.seq`).
        var seqBase: UInt64 = 0
        var dependencyStart: [Int32]
        var dependencies: [Int32]
        var dependentStart: [Int32]
        var dependents: [Int32]
    }

    struct Group {
        var generation: UInt32 = 0
        var live = false
        var nodes: [Node] = []
        var bodies = Bodies()
        var names = Names()
        var batches: [Batch] = []
        /// The sequence numbers of the barrier group's operations, which come one at a time with no batch.
        var seqs: [UInt64] = []
        /// The first batch's size and first sequence number, read without going through `batches` (`Scheduler.seq`).
        var firstBatchCount = 0
        var firstSeq: UInt64 = 0
        /// Dependents added by later batches to operations of earlier ones.
        var lateDependents: [Int32: [Int32]] = [:]
        var options: [Options] = []
        /// Each operation's index in `options` and the dependency whose output is its input (-1: none).
        var optionIndex = SparseColumn()
        var inputs = SparseColumn()
        var outputs: [Int32: OutputBox] = [:]
        /// false: an output is dropped once every dependent has ended (it is only kept for them).
        var keepOutputs = true
        /// With `keepOutputs` false: how many dependents of an operation with an output have not ended.
        var readers: [Int32: Int32] = [:]
        var errors: [Int32: String] = [:]
        var barrierDependents: [Int32: [NodeRef]] = [:]
        var unfinished = 0
        var qos: UInt8 = noQoS
        var cancelReason: String?
        var finished = false
    }

    struct Queue {
        var name: String
        var limit: Int
        var qos: QualityOfService
        var suspended: Bool
        /// Permits held from outside (a cluster-wide limit's leases, SPEC §8): at most this many execute at once,
        /// whatever `limit` allows. nil: no outside limit.
        var permits: Int?
        var executing = 0
        var readyCount = 0
        var unfinished = 0
        var ready = [ReadyList](repeating: ReadyList(), count: QueuePriority.allCases.count)
        /// Bit p set when `ready[p]` holds entries (some perhaps stale), perhaps also when it has since emptied (a start
        /// leaves it, `head(of:)` clears it): the head is looked for at the highest first.
        var filled: UInt8 = 0
        var epoch: Int32 = 0
        var epochUnfinished: [Int] = [0]
        var barrierAfterEpoch: [Int32: NodeRef] = [:]
        var openBarrier: NodeRef?
        /// nil: no rate (`Scheduler+Rate.swift`).
        var rate: RateWindow?
        /// When the timer armed for the rate fires, nil when none is.
        var rateTimer: Double?
        /// Starts granted from outside (a cluster-wide rate, `Scheduler+Rate.swift`); nil: none needed.
        var budget: StartBudget?
    }

    static let noQoS: UInt8 = 255
    static let priorities = QueuePriority.allCases.count
    static let barrierGroup: Int32 = 0

    let processorCount: Int
    var groups: [Group] = [Group()]
    var freeSlots: [Int32] = []
    var queues: [Queue] = []
    var queueIndex: [String: Int] = [:]
    var nextSeq: UInt64 = 0
    var executingCount = 0
    /// Ready operations in all queues: with none, choosing the next start need not look at any queue.
    var readyTotal = 0
    /// Queues with a rate or a start budget: without any, the engine need not read the rates' clock.
    var ratedQueues = 0

    /// Outputs of the step just taken; the caller drains them.
    var recordsEvents = false
    var events = EventBuffer()
    var timerRequests: [TimerRequest] = []
    var cancelHandlersToRun: [@Sendable () -> Void] = []
    var cancelHandlers: [NodeRef: (attempt: Int, handler: @Sendable () -> Void)] = [:]
    var finishedGroups: [GroupID] = []

    init(processorCount: Int) {
        self.processorCount = max(1, processorCount)
        groups[0].live = true
    }

    // MARK: Queues

    mutating func addQueue(name: String, maxConcurrentOperationCount: Int, qualityOfService: QualityOfService, suspended: Bool,
                           rateLimit: RateLimit? = nil) -> QueueID {
        if let existing = queueIndex[name] {
            updateQueue(QueueID(existing), maxConcurrentOperationCount: maxConcurrentOperationCount, qualityOfService: qualityOfService,
                        suspended: suspended, rateLimit: .some(rateLimit))
            return QueueID(existing)
        }
        queues.append(Queue(name: name, limit: maxConcurrentOperationCount, qos: qualityOfService, suspended: suspended))
        queueIndex[name] = queues.count - 1
        setRate(queues.count - 1, rateLimit)
        return QueueID(queues.count - 1)
    }

    func queueID(named name: String) -> QueueID? { queueIndex[name].map(QueueID.init) }

    /// nil leaves a setting as it is; `rateLimit: .some(nil)` removes the rate.
    mutating func updateQueue(_ id: QueueID, maxConcurrentOperationCount: Int? = nil, qualityOfService: QualityOfService? = nil,
                              suspended: Bool? = nil, rateLimit: RateLimit?? = nil) {
        guard queues.indices.contains(id.rawValue) else { return }
        if let limit = maxConcurrentOperationCount { queues[id.rawValue].limit = limit }
        if let qos = qualityOfService { queues[id.rawValue].qos = qos }
        if let suspended { queues[id.rawValue].suspended = suspended }
        if let rateLimit { setRate(id.rawValue, rateLimit) }
    }

    /// Sets (nil: removes) the outside limit of a queue; executing operations above it go on, nothing new starts.
    mutating func setPermits(_ id: QueueID, _ permits: Int?) {
        guard queues.indices.contains(id.rawValue) else { return }
        queues[id.rawValue].permits = permits.map { max($0, 0) }
    }

    @inline(__always)
    func effectiveLimit(_ q: Int) -> Int {
        let limit = queues[q].limit
        let own = limit < 0 ? processorCount : max(limit, 0)
        return queues[q].permits.map { min(own, $0) } ?? own
    }

    /// What a queue could execute now if permits were no object: its executing operations plus the ready ones,
    /// up to its own limit (a holder of cluster permits asks for this many and gives back the rest).
    func permitsWanted(_ q: Int) -> Int {
        let limit = queues[q].limit
        let own = limit < 0 ? processorCount : max(limit, 0)
        return queues[q].suspended ? queues[q].executing : min(own, queues[q].executing + queues[q].readyCount)
    }

    /// The priority of the operation the queue starts next, nil when none is ready.
    mutating func bestReadyPriority(_ q: Int) -> QueuePriority? {
        guard queues[q].readyCount > 0, let head = head(of: q) else { return nil }
        return QueuePriority(rawValue: UInt8(head.priority))
    }

    /// `now` is the wall clock and `monotonic` the rates' clock, read together (for `nextStartAt`).
    func snapshot(_ q: Int, now: Double = 0, monotonic: Double = 0) -> QueueSnapshot {
        let queue = queues[q]
        return QueueSnapshot(
            id: QueueID(q), name: queue.name, maxConcurrentOperationCount: queue.limit,
            qualityOfService: queue.qos, isSuspended: queue.suspended,
            pending: queue.unfinished - queue.executing, executing: queue.executing, rateLimit: queue.rate?.limit,
            nextStartAt: nextStartAt(q, now: now, monotonic: monotonic))
    }
}
