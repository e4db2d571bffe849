// Scheduler: the operation engine's whole state and every rule of SPEC §3.2 and §3.4, and §3.7's queue
// rates (`Scheduler+Rate.swift`), with no threads, no clock and no I/O.
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

/// An operation's address: its group's slot and its number in the group.
struct NodeRef: Hashable, Sendable {
    var group: Int32
    var index: Int32
}

/// A submitted graph (a job). Stays valid until `release`; then the slot is reused with a new generation.
public struct GroupID: Hashable, Sendable, CustomStringConvertible {
    let slot: Int32
    let generation: UInt32
    public var description: String { "group#\(slot).\(generation)" }
}

/// Why a submission was refused. Every problem found is listed.
public struct SubmissionError: Error, CustomStringConvertible, Equatable {
    public var problems: [String]
    public var description: String { problems.joined(separator: "\n") }
}

/// A transition of one operation, as the observer sees it.
public struct Transition: Sendable {
    public let group: GroupID
    public let operation: Int
    public let state: OperationState
    /// 1 for the first attempt; 0 before the first start.
    public let attempt: Int
    /// The effective QoS at the moment of the transition (including a temporary raise).
    public let qualityOfService: QualityOfService
    public let queue: QueueID
    /// Seconds since the Unix epoch.
    public let time: Double
    public let error: String?
}

public enum EngineEvent: Sendable {
    case transition(Transition)
    /// Every operation of the group has finished; delivered after all of its transitions.
    case groupFinished(GroupID)
}

/// Events waiting for the delivery thread, in chunks of at most `chunkSize`: appending never copies
/// what is already there. (One growing array was copied whole, under the engine's lock, at every
/// doubling: 0.6–0.8 s of a status request's wait with a million events waiting.)
struct EventBuffer: Sequence {
    static let chunkSize = 4_096
    private var chunks: [[EngineEvent]] = []

    var isEmpty: Bool { chunks.isEmpty }

    mutating func append(_ event: EngineEvent) {
        if chunks.isEmpty || chunks[chunks.count - 1].count == Self.chunkSize { chunks.append([]) }
        chunks[chunks.count - 1].append(event)
    }

    /// Everything so far, in order, as the delivery batches; the buffer is left empty.
    mutating func take() -> [[EngineEvent]] {
        defer { chunks = [] }
        return chunks
    }

    func makeIterator() -> FlattenSequence<[[EngineEvent]]>.Iterator { chunks.joined().makeIterator() }
}

/// What became of one operation, for results and `show`.
public struct OperationRecord: Sendable {
    public let name: String
    public let queue: QueueID
    public let state: OperationState
    public let attempts: Int
    public let startedAt: Double?
    public let finishedAt: Double?
    public let error: String?
    /// The QoS asked for (operation's, else group's, else queue's), not a temporary raise.
    public let qualityOfService: QualityOfService
    public let queuePriority: QueuePriority
}

/// A queue's settings and load, for `status`.
public struct QueueSnapshot: Sendable, Equatable {
    public let id: QueueID
    public let name: String
    public let maxConcurrentOperationCount: Int
    public let qualityOfService: QualityOfService
    public let isSuspended: Bool
    public let pending: Int
    public let executing: Int
    /// nil: no rate.
    public let rateLimit: RateLimit?
    /// The next time the rate lets one of its operations start, in seconds since the epoch; nil when one may
    /// start now or the queue has no rate.
    public let nextStartAt: Double?
}

/// One attempt of one operation: what an asynchronous body's completion, a timeout or a retry refers to.
/// The group's generation makes it refer to nothing once the group is released and its slot reused —
/// a late completion or timer of an ended job must not touch the job that took its place.
struct Attempt: Hashable, Sendable {
    var ref: NodeRef
    var generation: UInt32
    /// 1 for the first attempt.
    var number: Int
}

enum TimerKind: Hashable, Sendable {
    case attemptTimeout(Attempt)
    case retry(Attempt)
    case deadline(GroupID)
    /// A queue's rate window frees a start at `at` (on the rate's clock).
    case rateWindow(queue: Int, at: Double)
}

struct TimerRequest: Sendable {
    var delay: Double
    var kind: TimerKind
}

/// An operation handed to a worker.
struct Dispatch: Sendable {
    var ref: NodeRef { attempt.ref }
    var attempt: Attempt
    var body: OperationBody
    var qualityOfService: QualityOfService
    var inputBox: OutputBox?
    var name: String
    var input: OperationOutput? { inputBox?.value }
}

/// An operation's output, boxed: a value of an existential type makes every struct and enum that holds it
/// move through the runtime's generic witnesses, a box is a reference like any other.
final class OutputBox: Sendable {
    let value: OperationOutput
    init(_ value: OperationOutput) { self.value = value }
}

struct Scheduler {
    /// An operation's scheduling state: plain data, so reading one copies no references.
    /// Its body and name live in arrays of their own beside it.
    struct Node {
        var seq: UInt64
        var startedAt: Double = .nan
        var finishedAt: Double = .nan
        var pending: Int32
        var input: Int32
        var options: Int32
        var epoch: Int32
        var queue: UInt16
        var attempts: UInt16 = 0
        var state: OperationState = .pending
        /// Operation's QoS, else the group's; `noQoS` defers to the queue's.
        var requestedQoS: UInt8
        var raisedQoS: UInt8 = 0
        var priority: QueuePriority
        var flags: UInt8 = 0

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
        var dependencyStart: [Int32]
        var dependencies: [Int32]
        var dependentStart: [Int32]
        var dependents: [Int32]
    }

    struct Group {
        var generation: UInt32 = 0
        var live = false
        var nodes: [Node] = []
        var bodies: [OperationBody] = []
        var names: [String] = []
        var batches: [Batch] = []
        /// Dependents added by later batches to operations of earlier ones.
        var lateDependents: [Int32: [Int32]] = [:]
        var options: [Options] = []
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

    // MARK: Submission

    /// A graph checked and indexed by `prepare`, ready to be adopted.
    struct PreparedGraph {
        var builder: GraphBuilder
        /// nil when there are problems.
        var batch: Batch?
        var problems: [String]
    }

    /// Checks a batch and computes its dependents rows, with every problem. It needs nothing of the
    /// scheduler but how many queues exist (queues are never removed), so the engine calls it before
    /// taking its lock: a million-operation graph is indexed without holding up anyone.
    static func prepare(_ builder: consuming GraphBuilder, queueCount: Int) -> PreparedGraph {
        let n = builder.count
        let base = builder.base
        var problems = builder.problems
        let total = base + n
        // The builder's arrays as locals: reading them through `builder` in the loops below copies it each time.
        let nodes = builder.nodes
        let starts = builder.dependencyStart
        let edges = builder.dependencies
        var dependentCount = [Int32](repeating: 0, count: n + 1)
        // Whether some operation depends on one added after it: only then can the batch hold a cycle.
        var forward = false
        for i in 0..<n {
            let node = nodes[i]
            if Int(node.queue) >= queueCount {
                problems.append("operation '\(builder.names[i])': unknown queue queue#\(node.queue)")
            }
            for k in Int(starts[i]) ..< Int(starts[i + 1]) {
                let dep = Int(edges[k])
                if dep < 0 || dep >= total {
                    problems.append("operation '\(builder.names[i])' depends on unknown operation #\(dep)")
                } else if dep == base + i {
                    problems.append("cycle: \(builder.names[i]) → \(builder.names[i])")
                } else if dep >= base {
                    dependentCount[dep - base + 1] += 1
                    if dep > base + i { forward = true }
                }
            }
            if node.input >= 0, !edges[Int(starts[i]) ..< Int(starts[i + 1])].contains(node.input) {
                problems.append("operation '\(builder.names[i])': its input #\(node.input) is not one of its dependencies")
            }
        }

        // Dependents rows (counting sort keeps each row in dependent order: FIFO when they become ready).
        for i in 0..<n { dependentCount[i + 1] += dependentCount[i] }
        let dependentStart = dependentCount
        var cursor = dependentCount
        var dependents = [Int32](repeating: 0, count: Int(dependentStart[n]))
        for i in 0..<n {
            for k in Int(starts[i]) ..< Int(starts[i + 1]) {
                let d = Int(edges[k])
                guard d >= base && d < total && d != base + i else { continue }
                let row = d - base
                dependents[Int(cursor[row])] = Int32(base + i)
                cursor[row] += 1
            }
        }
        if forward { problems += Self.cycles(builder, dependentStart: dependentStart, dependents: dependents) }
        guard problems.isEmpty else { return PreparedGraph(builder: builder, batch: nil, problems: problems) }
        let batch = Batch(
            base: Int32(base), dependencyStart: starts, dependencies: edges,
            dependentStart: dependentStart, dependents: dependents)
        return PreparedGraph(builder: builder, batch: batch, problems: [])
    }

    /// The cycles of a batch, by Kahn's algorithm: whatever it leaves unvisited lies on or behind a cycle.
    private static func cycles(_ builder: GraphBuilder, dependentStart: [Int32], dependents: [Int32]) -> [String] {
        let n = builder.count
        let base = builder.base
        let total = base + n
        let starts = builder.dependencyStart
        let edges = builder.dependencies
        var indegree = [Int32](repeating: 0, count: n)
        for i in 0..<n {
            for k in Int(starts[i]) ..< Int(starts[i + 1]) {
                let d = Int(edges[k])
                if d >= base && d < total && d != base + i { indegree[i] += 1 }
            }
        }
        var stack: [Int32] = []
        for i in 0..<n where indegree[i] == 0 { stack.append(Int32(i)) }
        var visited = 0
        while let i = stack.popLast() {
            visited += 1
            for k in Int(dependentStart[Int(i)]) ..< Int(dependentStart[Int(i) + 1]) {
                let j = Int(dependents[k]) - base
                indegree[j] -= 1
                if indegree[j] == 0 { stack.append(Int32(j)) }
            }
        }
        return visited < n ? Self.describeCycles(builder, indegree: indegree) : []
    }

    /// Names the operations along each cycle left after Kahn's algorithm (every node with a positive
    /// in-degree has a dependency that also has one, so following them must come round).
    private static func describeCycles(_ builder: GraphBuilder, indegree: [Int32]) -> [String] {
        let n = builder.count
        let base = builder.base
        var onCycleReported = [Bool](repeating: false, count: n)
        var problems: [String] = []
        for start in 0..<n where indegree[start] > 0 && !onCycleReported[start] {
            var position = [Int: Int]()
            var path: [Int] = []
            var current = start
            while position[current] == nil {
                if onCycleReported[current] { path = []; break }
                position[current] = path.count
                path.append(current)
                let deps = builder.dependencies[Int(builder.dependencyStart[current]) ..< Int(builder.dependencyStart[current + 1])]
                guard let next = deps.first(where: {
                    Int($0) >= base && Int($0) < base + n && Int($0) != base + current && indegree[Int($0) - base] > 0
                }) else { path = []; break }
                current = Int(next) - base
            }
            guard !path.isEmpty, let first = position[current] else { continue }
            let cycle = Array(path[first...])
            for i in cycle { onCycleReported[i] = true }
            // Dependencies were followed; print the cycle in execution order: a → b means b waits for a.
            let names = cycle.reversed().map { builder.names[$0] }
            problems.append("cycle: " + (names + [names[0]]).joined(separator: " → "))
            if problems.count >= 16 { break }
        }
        return problems.isEmpty ? ["cycle among the operations"] : problems
    }

    /// The batch of a prepared graph numbered from `existing`, or every problem it has.
    private func checked(_ prepared: PreparedGraph, existing: Int, more: [String] = []) throws(SubmissionError) -> Batch {
        var problems = prepared.problems
        let base = prepared.builder.base
        if base != existing { problems.append("the graph was numbered from \(base) but the group has \(existing) operations") }
        problems += more
        guard problems.isEmpty, let batch = prepared.batch else { throw SubmissionError(problems: problems) }
        return batch
    }

    mutating func submit(_ builder: consuming GraphBuilder, qualityOfService: QualityOfService? = nil, deadline: Double? = nil,
                         keepOutputs: Bool = true, now: Double) throws(SubmissionError) -> GroupID {
        try submit(Self.prepare(builder, queueCount: queues.count), qualityOfService: qualityOfService, deadline: deadline,
                   keepOutputs: keepOutputs, now: now)
    }

    mutating func submit(_ prepared: consuming PreparedGraph, qualityOfService: QualityOfService? = nil, deadline: Double? = nil,
                         keepOutputs: Bool = true, now: Double) throws(SubmissionError) -> GroupID {
        var problems: [String] = []
        if let deadline, !(deadline > 0) || !deadline.isFinite { problems.append("deadline must be a positive number of seconds") }
        let batch = try checked(prepared, existing: 0, more: problems)
        let slot: Int32
        if let free = freeSlots.popLast() {
            slot = free
        } else {
            groups.append(Group())
            slot = Int32(groups.count - 1)
        }
        groups[Int(slot)].live = true
        groups[Int(slot)].keepOutputs = keepOutputs
        groups[Int(slot)].qos = qualityOfService?.rawValue ?? Self.noQoS
        let id = GroupID(slot: slot, generation: groups[Int(slot)].generation)
        adopt(&prepared.builder, batch: batch, group: slot, now: now)
        if let deadline { timerRequests.append(TimerRequest(delay: deadline, kind: .deadline(id))) }
        checkGroupFinished(slot)
        return id
    }

    /// Adds operations to a running group (graph expansion at run time). They may depend on the
    /// group's earlier operations, finished or not.
    mutating func extend(_ id: GroupID, with builder: consuming GraphBuilder, now: Double) throws(SubmissionError) {
        try extend(id, with: Self.prepare(builder, queueCount: queues.count), now: now)
    }

    mutating func extend(_ id: GroupID, with prepared: consuming PreparedGraph, now: Double) throws(SubmissionError) {
        guard isLive(id), !groups[Int(id.slot)].finished else {
            throw SubmissionError(problems: ["the group has finished or does not exist"])
        }
        let batch = try checked(prepared, existing: groups[Int(id.slot)].nodes.count)
        adopt(&prepared.builder, batch: batch, group: id.slot, now: now)
        checkGroupFinished(id.slot)
    }

    func isLive(_ id: GroupID) -> Bool {
        id.slot > 0 && Int(id.slot) < groups.count && groups[Int(id.slot)].live && groups[Int(id.slot)].generation == id.generation
    }

    private mutating func adopt(_ builder: inout GraphBuilder, batch: Batch, group g: Int32, now: Double) {
        let gi = Int(g)
        let base = Int(batch.base)
        let n = builder.count
        takeOperations(of: &builder, group: gi)
        let starts = batch.dependencyStart
        let edges = batch.dependencies
        let groupQoS = groups[gi].qos
        var crossBatch: [(dependency: Int32, dependent: Int32)] = []
        for i in 0..<n {
            var pending: Int32 = 0
            for k in Int(starts[i]) ..< Int(starts[i + 1]) {
                let d = edges[k]
                if Int(d) >= base {
                    pending += 1
                } else {
                    crossBatch.append((d, Int32(base + i)))
                    if !groups[gi].nodes[Int(d)].state.isFinished { pending += 1 }
                }
            }
            var node = groups[gi].nodes[base + i]
            let q = Int(node.queue)
            let epoch = queues[q].epoch
            queues[q].unfinished += 1
            queues[q].epochUnfinished[Int(epoch)] += 1
            if let barrier = queues[q].openBarrier {
                pending += 1
                groups[Int(Self.barrierGroup)].barrierDependents[barrier.index, default: []]
                    .append(NodeRef(group: g, index: Int32(base + i)))
            }
            node.seq = nextSeq
            nextSeq &+= 1
            node.pending = pending
            node.epoch = epoch
            if node.requestedQoS == Self.noQoS { node.requestedQoS = groupQoS }
            groups[gi].nodes[base + i] = node
        }
        groups[gi].unfinished += n
        groups[gi].batches.append(batch)
        for (dependency, dependent) in crossBatch {
            groups[gi].lateDependents[dependency, default: []].append(dependent)
            groups[gi].readers[dependency]? += 1
        }
        raiseDependencies(of: batch, group: g, count: n)
        if recordsEvents {
            for i in 0..<n { emit(NodeRef(group: g, index: Int32(base + i)), .pending, now: now) }
        }
        // A group cancelled before this batch arrived cancels it too.
        if let reason = groups[gi].cancelReason {
            for i in 0..<n { cancel(NodeRef(group: g, index: Int32(base + i)), reason: reason, now: now) }
            return
        }
        for i in 0..<n {
            let ref = NodeRef(group: g, index: Int32(base + i))
            let node = groups[gi].nodes[base + i]
            guard node.state == .pending else { continue }
            // A dependency from an earlier batch that already failed or was cancelled.
            if base > 0, node.flags & Node.runsAfterFailure == 0,
               let failed = edges[Int(starts[i]) ..< Int(starts[i + 1])]
                .first(where: { Int($0) < base && isFailedOrCancelled(NodeRef(group: g, index: $0)) }) {
                cancel(ref, reason: dependencyError(NodeRef(group: g, index: failed)), now: now)
            } else if node.pending == 0 {
                makeReady(ref, now: now)
            }
        }
    }

    /// Moves the builder's operations into the group: a new group takes the builder's arrays as they are.
    private mutating func takeOperations(of builder: inout GraphBuilder, group gi: Int) {
        if builder.base == 0 && groups[gi].nodes.isEmpty {
            swap(&groups[gi].nodes, &builder.nodes)
            swap(&groups[gi].bodies, &builder.bodies)
            swap(&groups[gi].names, &builder.names)
            swap(&groups[gi].options, &builder.options)
        } else {
            let optionBase = Int32(groups[gi].options.count)
            if optionBase > 0 {
                for i in builder.nodes.indices where builder.nodes[i].options >= 0 { builder.nodes[i].options += optionBase }
            }
            groups[gi].nodes.append(contentsOf: builder.nodes)
            groups[gi].bodies.append(contentsOf: builder.bodies)
            groups[gi].names.append(contentsOf: builder.names)
            groups[gi].options.append(contentsOf: builder.options)
        }
    }

    /// QoS raises: an operation is raised to the effective QoS of whatever waits for it.
    private mutating func raiseDependencies(of batch: Batch, group g: Int32, count n: Int) {
        let base = Int(batch.base)
        let starts = batch.dependencyStart
        let edges = batch.dependencies
        // The common case: every operation of the batch at one QoS. Nothing in it can raise another, so only
        // dependencies on earlier batches need looking at.
        let first = n > 0 ? effectiveQoS(NodeRef(group: g, index: Int32(base))).rawValue : 0
        var uniform = true
        for i in 0..<n where effectiveQoS(NodeRef(group: g, index: Int32(base + i))).rawValue != first {
            uniform = false
            break
        }
        if uniform {
            guard base > 0 else { return }
            for k in 0..<edges.count where Int(edges[k]) < base { raise(NodeRef(group: g, index: edges[k]), to: first) }
            return
        }
        for i in 0..<n where starts[i] < starts[i + 1] {
            let qos = effectiveQoS(NodeRef(group: g, index: Int32(base + i))).rawValue
            for k in Int(starts[i]) ..< Int(starts[i + 1]) { raise(NodeRef(group: g, index: edges[k]), to: qos) }
        }
    }

    private func isFailedOrCancelled(_ ref: NodeRef) -> Bool {
        let state = groups[Int(ref.group)].nodes[Int(ref.index)].state
        return state == .failed || state == .cancelled
    }

    private func dependencyError(_ ref: NodeRef) -> String {
        let node = groups[Int(ref.group)].nodes[Int(ref.index)]
        return "dependency '\(groups[Int(ref.group)].names[Int(ref.index)])' \(node.state == .failed ? "failed" : "was cancelled")"
    }

    func effectiveQoS(_ ref: NodeRef) -> QualityOfService {
        let node = groups[Int(ref.group)].nodes[Int(ref.index)]
        let asked = node.requestedQoS == Self.noQoS ? queues[Int(node.queue)].qos.rawValue : node.requestedQoS
        return QualityOfService(rawValue: max(asked, node.raisedQoS)) ?? .default
    }

    func requestedQoS(_ ref: NodeRef) -> QualityOfService {
        let node = groups[Int(ref.group)].nodes[Int(ref.index)]
        if node.requestedQoS == Self.noQoS { return queues[Int(node.queue)].qos }
        return QualityOfService(rawValue: node.requestedQoS) ?? .default
    }

    private mutating func raise(_ start: NodeRef, to qos: UInt8) {
        guard effectiveQoS(start).rawValue < qos else { return }
        var work = [start]
        while let ref = work.popLast() {
            let node = groups[Int(ref.group)].nodes[Int(ref.index)]
            guard node.state == .pending || node.state == .ready || node.state == .retrying,
                  effectiveQoS(ref).rawValue < qos else { continue }
            groups[Int(ref.group)].nodes[Int(ref.index)].raisedQoS = qos
            for d in dependencies(of: ref) { work.append(NodeRef(group: ref.group, index: d)) }
        }
    }

    private func batchIndex(_ group: Int, _ index: Int32) -> Int {
        let count = groups[group].batches.count
        if count == 1 { return 0 }
        var low = 0, high = count - 1
        while low < high {
            let mid = (low + high + 1) / 2
            if groups[group].batches[mid].base <= index { low = mid } else { high = mid - 1 }
        }
        return low
    }

    // MARK: Readiness and dispatch

    private mutating func makeReady(_ ref: NodeRef, now: Double) {
        let g = Int(ref.group), i = Int(ref.index)
        var node = groups[g].nodes[i]
        node.state = .ready
        groups[g].nodes[i] = node
        let q = Int(node.queue)
        queues[q].ready[Int(node.priority.rawValue)].push(ReadyEntry(seq: node.seq, ref: ref))
        queues[q].readyCount += 1
        if recordsEvents { emit(ref, .ready, now: now) }
    }

    /// The queue's next operation by priority, then submission order; drops entries of operations
    /// cancelled while they waited, also when their group has since been released (its slot perhaps
    /// reused: the entry's sequence number must still be the node's).
    private mutating func head(of q: Int) -> (priority: Int, entry: ReadyEntry)? {
        var p = Self.priorities - 1
        while p >= 0 {
            if queues[q].ready[p].isEmpty {
                p -= 1
                continue
            }
            while let entry = queues[q].ready[p].peek() {
                if isValid(entry.ref) {
                    let node = groups[Int(entry.ref.group)].nodes[Int(entry.ref.index)]
                    if node.state == .ready && node.seq == entry.seq { return (p, entry) }
                }
                queues[q].ready[p].pop()
            }
            p -= 1
        }
        return nil
    }

    /// The next operation to start, if a queue has one and a free slot: among the queues' heads,
    /// the highest effective QoS; at equal QoS the one submitted first (so a pipeline spread over
    /// queues runs chain by chain, and what one stage produces is consumed before the next is made).
    /// A queue's rate only gates whether it may start one now (a barrier neither waits for it nor uses it);
    /// rates read `monotonic`, else `now`.
    mutating func nextDispatch(now: Double, monotonic: Double? = nil) -> Dispatch? {
        var best: (queue: Int, priority: Int, qos: QualityOfService, seq: UInt64)?
        for q in queues.indices where queues[q].readyCount > 0 && !queues[q].suspended && queues[q].executing < effectiveLimit(q) {
            guard let head = head(of: q) else { continue }
            if queues[q].gatesStarts && head.entry.ref.group != Self.barrierGroup && !startAllowed(q, at: monotonic ?? now) { continue }
            let qos = effectiveQoS(head.entry.ref)
            if let current = best, current.qos > qos || (current.qos == qos && current.seq <= head.entry.seq) { continue }
            best = (q, head.priority, qos, head.entry.seq)
        }
        guard let best, let entry = queues[best.queue].ready[best.priority].pop() else { return nil }
        let ref = entry.ref
        let g = Int(ref.group), i = Int(ref.index)
        if queues[best.queue].gatesStarts && ref.group != Self.barrierGroup { noteStart(best.queue, at: monotonic ?? now) }
        queues[best.queue].readyCount -= 1
        queues[best.queue].executing += 1
        executingCount += 1
        var node = groups[g].nodes[i]
        node.state = .executing
        node.attempts &+= 1
        node.flags &= ~(Node.cancelRequested | Node.timedOut)
        if node.startedAt.isNaN { node.startedAt = now }
        groups[g].nodes[i] = node
        if recordsEvents { emit(ref, .executing, now: now) }
        let attempt = Attempt(ref: ref, generation: groups[g].generation, number: Int(node.attempts))
        if node.options >= 0, let timeout = groups[g].options[Int(node.options)].timeout {
            timerRequests.append(TimerRequest(delay: timeout, kind: .attemptTimeout(attempt)))
        }
        return Dispatch(attempt: attempt, body: groups[g].bodies[i], qualityOfService: best.qos, inputBox: input(of: ref),
                        name: groups[g].names[i])
    }

    private func input(of ref: NodeRef) -> OutputBox? {
        let g = Int(ref.group)
        let outputs = groups[g].outputs
        if outputs.isEmpty { return nil }
        let node = groups[g].nodes[Int(ref.index)]
        if node.input >= 0 { return outputs[node.input] }
        for d in dependencies(of: ref) {
            if let output = outputs[d] { return output }
        }
        return nil
    }

    // MARK: Ends

    enum Outcome {
        case succeeded(OutputBox?)
        /// `final`: retrying cannot help (`FinalFailure`), so `retries` is not used.
        case failure(String, final: Bool = false)

        static func success(_ output: OperationOutput?) -> Self { .succeeded(output.map(OutputBox.init)) }
    }

    /// An attempt stops executing. A permit from outside is used up with it: the holder grants it again (or gives
    /// its slot to a better waiter elsewhere) before the queue starts another operation on it.
    private mutating func attemptLeft(queue q: Int) {
        queues[q].executing -= 1
        executingCount -= 1
        if let permits = queues[q].permits { queues[q].permits = max(0, permits - 1) }
    }

    /// Ends an attempt. Ignored when the attempt already ended (cancelled asynchronous operation,
    /// timeout) — a late completion changes nothing.
    mutating func finish(_ attempt: Attempt, outcome: Outcome, now: Double) {
        guard isCurrent(attempt, in: .executing) else { return }
        let ref = attempt.ref
        let g = Int(ref.group), i = Int(ref.index)
        let node = groups[g].nodes[i]
        attemptLeft(queue: Int(node.queue))
        if !cancelHandlers.isEmpty { cancelHandlers[ref] = nil }
        if node.flags & Node.timedOut != 0 {
            let seconds = node.options >= 0 ? groups[g].options[Int(node.options)].timeout ?? 0 : 0
            failOrRetry(ref, error: OperationTimeout(seconds: seconds).description, now: now)
        } else if node.flags & Node.cancelRequested != 0 {
            complete(ref, .cancelled, error: groups[g].errors[ref.index] ?? "cancelled", now: now)
        } else {
            switch outcome {
            case .succeeded(let output):
                if let output {
                    if groups[g].keepOutputs {
                        groups[g].outputs[ref.index] = output
                    } else {
                        var readers: Int32 = 0
                        for _ in dependents(of: ref) { readers += 1 }
                        if readers > 0 {
                            groups[g].outputs[ref.index] = output
                            groups[g].readers[ref.index] = readers
                        }
                    }
                }
                complete(ref, .succeeded, error: nil, now: now)
            case .failure(let message, let final):
                if final { complete(ref, .failed, error: message, now: now) } else { failOrRetry(ref, error: message, now: now) }
            }
        }
    }

    private mutating func failOrRetry(_ ref: NodeRef, error: String, now: Double) {
        let g = Int(ref.group), i = Int(ref.index)
        let node = groups[g].nodes[i]
        if node.options >= 0 {
            let options = groups[g].options[Int(node.options)]
            if Int(node.attempts) <= options.retries {
                groups[g].nodes[i].state = .retrying
                groups[g].errors[ref.index] = error
                if recordsEvents { emit(ref, .retrying, now: now, error: error) }
                let delay = options.retryDelay * Double(1 << min(Int(node.attempts) - 1, 30))
                let attempt = Attempt(ref: ref, generation: groups[g].generation, number: Int(node.attempts))
                timerRequests.append(TimerRequest(delay: delay, kind: .retry(attempt)))
                return
            }
        }
        complete(ref, .failed, error: error, now: now)
    }

    /// Records an end and lets the dependents go on (or be cancelled), without recursion: a chain of
    /// a million cancellations must not exhaust the stack.
    private mutating func complete(_ start: NodeRef, _ startState: OperationState, error startError: String?, now: Double) {
        // The first end is held apart: the list is only made (allocated) when ends cascade.
        var first: (ref: NodeRef, state: OperationState, error: String?)? = (start, startState, startError)
        var work: [(ref: NodeRef, state: OperationState, error: String?)] = []
        while let (ref, state, error) = first ?? work.popLast() {
            first = nil
            let g = Int(ref.group), i = Int(ref.index)
            let before = groups[g].nodes[i].state
            guard !before.isFinished else { continue }
            if before == .ready {
                queues[Int(groups[g].nodes[i].queue)].readyCount -= 1
            }
            var node = groups[g].nodes[i]
            node.state = state
            node.finishedAt = now
            groups[g].nodes[i] = node
            if !groups[g].keepOutputs && !groups[g].readers.isEmpty {
                for d in dependencies(of: ref) {
                    guard let readers = groups[g].readers[d] else { continue }
                    if readers <= 1 {
                        groups[g].readers[d] = nil
                        groups[g].outputs[d] = nil
                    } else {
                        groups[g].readers[d] = readers - 1
                    }
                }
            }
            if let error {
                groups[g].errors[ref.index] = error
            } else if !groups[g].errors.isEmpty {
                groups[g].errors[ref.index] = nil
            }
            let q = Int(node.queue)
            queues[q].unfinished -= 1
            groups[g].unfinished -= 1
            if recordsEvents { emit(ref, state, now: now, error: error) }
            closeEpoch(queue: q, epoch: node.epoch, now: now)
            let failedOrCancelled = state != .succeeded
            let dependencyFailure = failedOrCancelled ? dependencyError(ref) : nil
            for index in dependents(of: ref) {
                let dependent = NodeRef(group: ref.group, index: index)
                var d = groups[g].nodes[Int(index)]
                guard !d.state.isFinished else { continue }
                if failedOrCancelled && d.flags & Node.runsAfterFailure == 0 {
                    work.append((dependent, .cancelled, dependencyFailure))
                    continue
                }
                d.pending -= 1
                groups[g].nodes[Int(index)].pending = d.pending
                if d.pending == 0 && d.state == .pending { makeReady(dependent, now: now) }
            }
            if node.flags & Node.isBarrier != 0 {
                if let waiting = groups[g].barrierDependents.removeValue(forKey: ref.index) {
                    for dependent in waiting where isValid(dependent) {
                        let d = groups[Int(dependent.group)].nodes[Int(dependent.index)]
                        guard d.state == .pending else { continue }
                        groups[Int(dependent.group)].nodes[Int(dependent.index)].pending -= 1
                        if d.pending == 1 { makeReady(dependent, now: now) }
                    }
                }
                if queues[q].openBarrier == ref { queues[q].openBarrier = nil }
            }
            checkGroupFinished(ref.group)
        }
    }

    /// An operation's dependents: a row of its batch, plus those that later batches added.
    /// Returned by value (the arrays are shared, not copied) so that callers can mutate nodes while
    /// walking them; a closure over `self` would make Swift copy the node array on every write.
    struct Edges: Sequence {
        var row: ArraySlice<Int32>
        var late: [Int32]

        struct Iterator: IteratorProtocol {
            var row: ArraySlice<Int32>.Iterator
            var late: [Int32].Iterator
            mutating func next() -> Int32? { row.next() ?? late.next() }
        }

        func makeIterator() -> Iterator { Iterator(row: row.makeIterator(), late: late.makeIterator()) }
    }

    func dependents(of ref: NodeRef) -> Edges {
        let g = Int(ref.group)
        guard !groups[g].batches.isEmpty else { return Edges(row: [], late: []) }
        let b = batchIndex(g, ref.index)
        let local = Int(ref.index - groups[g].batches[b].base)
        let start = Int(groups[g].batches[b].dependentStart[local]), end = Int(groups[g].batches[b].dependentStart[local + 1])
        let late = groups[g].lateDependents.isEmpty ? [] : groups[g].lateDependents[ref.index] ?? []
        return Edges(row: groups[g].batches[b].dependents[start ..< end], late: late)
    }

    func dependencies(of ref: NodeRef) -> ArraySlice<Int32> {
        let g = Int(ref.group)
        guard !groups[g].batches.isEmpty else { return [] }
        let b = batchIndex(g, ref.index)
        let local = Int(ref.index - groups[g].batches[b].base)
        let start = Int(groups[g].batches[b].dependencyStart[local]), end = Int(groups[g].batches[b].dependencyStart[local + 1])
        return groups[g].batches[b].dependencies[start ..< end]
    }

    private mutating func checkGroupFinished(_ slot: Int32) {
        let g = Int(slot)
        guard slot != Self.barrierGroup, groups[g].unfinished == 0, !groups[g].finished else { return }
        groups[g].finished = true
        let id = GroupID(slot: slot, generation: groups[g].generation)
        finishedGroups.append(id)
        if recordsEvents { events.append(.groupFinished(id)) }
    }

    func isValid(_ ref: NodeRef) -> Bool {
        Int(ref.group) < groups.count && groups[Int(ref.group)].live && Int(ref.index) < groups[Int(ref.group)].nodes.count
    }

    /// Whether `attempt` is its operation's current one, in `state`, in the group it was made in.
    func isCurrent(_ attempt: Attempt, in state: OperationState) -> Bool {
        guard isValid(attempt.ref) else { return false }
        let g = Int(attempt.ref.group)
        let node = groups[g].nodes[Int(attempt.ref.index)]
        return groups[g].generation == attempt.generation && node.state == state && Int(node.attempts) == attempt.number
    }

    // MARK: Barriers

    /// Foundation's `addBarrierBlock`: runs once everything added to the queue before it has finished
    /// (however it ended); what is added after it waits for it.
    mutating func addBarrier(queue id: QueueID, name: String, body: OperationBody, now: Double) -> NodeRef? {
        let q = id.rawValue
        guard queues.indices.contains(q) else { return nil }
        let g = Int(Self.barrierGroup)
        let ref = NodeRef(group: Self.barrierGroup, index: Int32(groups[g].nodes.count))
        // Everything unfinished of the current epoch, including an earlier barrier (counted in it).
        let pending = Int32(queues[q].epochUnfinished[Int(queues[q].epoch)])
        var node = Node(
            seq: nextSeq, pending: pending, input: -1, options: -1,
            epoch: queues[q].epoch + 1, queue: UInt16(q), requestedQoS: Self.noQoS, priority: .normal)
        node.flags = Node.isBarrier | Node.runsAfterFailure
        nextSeq &+= 1
        groups[g].nodes.append(node)
        groups[g].bodies.append(body)
        groups[g].names.append(name)
        queues[q].barrierAfterEpoch[queues[q].epoch] = ref
        queues[q].epoch += 1
        queues[q].epochUnfinished.append(0)
        queues[q].epochUnfinished[Int(queues[q].epoch)] += 1
        queues[q].unfinished += 1
        queues[q].openBarrier = ref
        if recordsEvents { emit(ref, .pending, now: now) }
        if pending == 0 { makeReady(ref, now: now) }
        return ref
    }

    private mutating func closeEpoch(queue q: Int, epoch: Int32, now: Double) {
        queues[q].epochUnfinished[Int(epoch)] -= 1
        guard !queues[q].barrierAfterEpoch.isEmpty, let barrier = queues[q].barrierAfterEpoch[epoch] else { return }
        let g = Int(barrier.group), i = Int(barrier.index)
        guard groups[g].nodes[i].state == .pending else { return }
        groups[g].nodes[i].pending -= 1
        if groups[g].nodes[i].pending == 0 {
            queues[q].barrierAfterEpoch[epoch] = nil
            makeReady(barrier, now: now)
        }
    }

    // MARK: Cancellation

    /// Cancels one operation: one that has not started never starts; an executing synchronous one is
    /// told (`isCancelled`) and ends when its body returns; an asynchronous one ends at once and its
    /// cancellation handler runs.
    mutating func cancel(_ ref: NodeRef, reason: String = "cancelled", now: Double) {
        guard isValid(ref) else { return }
        let g = Int(ref.group), i = Int(ref.index)
        let node = groups[g].nodes[i]
        switch node.state {
        case .pending, .ready, .retrying:
            complete(ref, .cancelled, error: reason, now: now)
        case .executing:
            guard node.flags & Node.cancelRequested == 0 else { return }
            groups[g].nodes[i].flags |= Node.cancelRequested
            groups[g].errors[ref.index] = reason
            if case .async = groups[g].bodies[i] {
                attemptLeft(queue: Int(node.queue))
                runCancelHandler(ref)
                complete(ref, .cancelled, error: reason, now: now)
            }
        case .succeeded, .failed, .cancelled:
            break
        }
    }

    mutating func cancel(group id: GroupID, reason: String = "cancelled", now: Double) {
        guard isLive(id) else { return }
        let g = Int(id.slot)
        if groups[g].cancelReason == nil { groups[g].cancelReason = reason }
        for i in groups[g].nodes.indices where !groups[g].nodes[i].state.isFinished {
            cancel(NodeRef(group: id.slot, index: Int32(i)), reason: reason, now: now)
        }
    }

    mutating func cancelAll(reason: String = "cancelled", now: Double) {
        for slot in groups.indices.dropFirst() where groups[slot].live && !groups[slot].finished {
            cancel(group: GroupID(slot: Int32(slot), generation: groups[slot].generation), reason: reason, now: now)
        }
    }

    private mutating func runCancelHandler(_ ref: NodeRef) {
        if let entry = cancelHandlers.removeValue(forKey: ref) { cancelHandlersToRun.append(entry.handler) }
    }

    func isCancelled(_ attempt: Attempt) -> Bool {
        guard isCurrent(attempt, in: .executing) else { return true }
        return groups[Int(attempt.ref.group)].nodes[Int(attempt.ref.index)].flags & (Node.cancelRequested | Node.timedOut) != 0
    }

    /// Stores an asynchronous attempt's cancellation handler; returns it when it must run at once.
    mutating func setCancelHandler(_ attempt: Attempt, handler: @escaping @Sendable () -> Void) -> (@Sendable () -> Void)? {
        if isCancelled(attempt) { return handler }
        cancelHandlers[attempt.ref] = (attempt.number, handler)
        return nil
    }

    // MARK: Timers

    /// Whether a timer would still do something when it fires; the engine drops the others when its
    /// heap fills with them (a long timeout outlives the attempt it was armed for).
    func isPending(_ kind: TimerKind) -> Bool {
        switch kind {
        case .attemptTimeout(let attempt):
            isCurrent(attempt, in: .executing) &&
                groups[Int(attempt.ref.group)].nodes[Int(attempt.ref.index)].flags & Node.cancelRequested == 0
        case .retry(let attempt):
            isCurrent(attempt, in: .retrying)
        case .deadline(let id):
            isLive(id) && !groups[Int(id.slot)].finished
        case .rateWindow(let q, let at):
            queues[q].rateTimer == at
        }
    }

    mutating func fire(_ kind: TimerKind, now: Double) {
        guard isPending(kind) else { return }
        switch kind {
        case .attemptTimeout(let attempt):
            let g = Int(attempt.ref.group), i = Int(attempt.ref.index)
            groups[g].nodes[i].flags |= Node.timedOut
            if case .async = groups[g].bodies[i] {
                runCancelHandler(attempt.ref)
                finish(attempt, outcome: .failure(""), now: now)
            }
        case .retry(let attempt):
            makeReady(attempt.ref, now: now)
        case .deadline(let id):
            cancel(group: id, reason: "the job's deadline passed", now: now)
        case .rateWindow(let q, _):
            // A start is free: the dispatch that follows every step takes it (and arms the next timer).
            queues[q].rateTimer = nil
        }
    }

    // MARK: Results

    func records(_ id: GroupID) -> [OperationRecord]? {
        guard isLive(id) else { return nil }
        let g = Int(id.slot)
        return groups[g].nodes.indices.map { record(NodeRef(group: id.slot, index: Int32($0))) }
    }

    func record(_ ref: NodeRef) -> OperationRecord {
        let g = Int(ref.group)
        let node = groups[g].nodes[Int(ref.index)]
        return OperationRecord(
            name: groups[g].names[Int(ref.index)], queue: QueueID(Int(node.queue)), state: node.state, attempts: Int(node.attempts),
            startedAt: node.startedAt.isNaN ? nil : node.startedAt,
            finishedAt: node.finishedAt.isNaN ? nil : node.finishedAt,
            error: groups[g].errors[ref.index], qualityOfService: requestedQoS(ref), queuePriority: node.priority)
    }

    func output(_ ref: NodeRef) -> OperationOutput? { isValid(ref) ? groups[Int(ref.group)].outputs[ref.index]?.value : nil }

    func isFinished(_ id: GroupID) -> Bool { !isLive(id) || groups[Int(id.slot)].finished }

    func operationCount(_ id: GroupID) -> Int { isLive(id) ? groups[Int(id.slot)].nodes.count : 0 }

    /// Frees a finished group's memory; its id becomes invalid.
    mutating func release(_ id: GroupID) {
        guard isLive(id), groups[Int(id.slot)].finished else { return }
        let g = Int(id.slot)
        let generation = groups[g].generation &+ 1
        groups[g] = Group()
        groups[g].generation = generation
        freeSlots.append(id.slot)
    }

    // MARK: Events

    private mutating func emit(_ ref: NodeRef, _ state: OperationState, now: Double, error: String? = nil) {
        let g = Int(ref.group)
        let node = groups[g].nodes[Int(ref.index)]
        events.append(.transition(Transition(
            group: GroupID(slot: ref.group, generation: groups[g].generation), operation: Int(ref.index), state: state,
            attempt: Int(node.attempts), qualityOfService: effectiveQoS(ref), queue: QueueID(Int(node.queue)),
            time: now, error: error)))
    }
}
