// The cluster store (SPEC §8): every database action the cluster needs, as one method each, so that the queue's
// logic never writes SQL and can run against PostgreSQL or, later, the file spool (River's driver interface).
//
// Trusts nothing it reads back as valid: rows are input (a node validates each claimed manifest again).
// Guarantees, and what each relies on, are written down in docs/cluster-store.md.

/// What a node declares about itself when it starts and at each reload.
public struct NodeDeclaration: Sendable, Equatable {
    public var node: String
    public var queues: [String]
    public var commands: [String]
    public var jobSlots: Int
    /// clusterMaxConcurrentOperationCount per queue, as this node's configuration says.
    public var clusterLimits: [String: Int]
    /// Free text for status (host, pid, version); never a secret.
    public var info: String
    /// Command → its signature (queue and parameters, in the daemon's own text form), so that nodes that do not
    /// declare a command can still check a manifest's arguments for it. Never holds argv or environment.
    public var commandSignatures: [String: String]

    public init(node: String, queues: [String], commands: [String], jobSlots: Int,
                clusterLimits: [String: Int] = [:], info: String = "", commandSignatures: [String: String] = [:]) {
        self.commandSignatures = commandSignatures
        self.node = node
        self.queues = queues
        self.commands = commands
        self.jobSlots = jobSlots
        self.clusterLimits = clusterLimits
        self.info = info
    }
}

/// An accepted manifest to insert. Ranks are larger for more urgent work (QoS: background 0 … userInteractive 4;
/// queuePriority: veryLow 0 … veryHigh 4); the store orders by them and never interprets them otherwise.
public struct NewJob: Sendable, Equatable {
    public var requestedID: String
    public var manifest: [UInt8]
    public var manifestName: String
    public var submittedOn: String
    public var qosRank: Int
    public var priorityRank: Int
    public var queues: [String]
    public var commands: [String]
    /// Makes the insert idempotent (schema 2): inserting again a job whose key is already there returns the
    /// existing row's id and inserts nothing. The daemon's: node, local folder and reception time.
    public var submissionKey: String?
    /// SPEC §3.7: claimable from then on (epoch seconds; nil: at once).
    public var notBefore: Double?
    /// SPEC §3.7 `ifJobExists = skip`: when the requested id is taken (and the key is not this submission's), nothing
    /// is inserted and the answer says `skipped`.
    public var skipIfExists = false

    public init(requestedID: String, manifest: [UInt8], manifestName: String, submittedOn: String,
                qosRank: Int, priorityRank: Int, queues: [String], commands: [String], submissionKey: String? = nil,
                notBefore: Double? = nil, skipIfExists: Bool = false) {
        self.submissionKey = submissionKey
        self.notBefore = notBefore
        self.skipIfExists = skipIfExists
        self.requestedID = requestedID
        self.manifest = manifest
        self.manifestName = manifestName
        self.submittedOn = submittedOn
        self.qosRank = qosRank
        self.priorityRank = priorityRank
        self.queues = queues
        self.commands = commands
    }
}

/// The id a job got: `requestedID`, or it with `.1`, `.2`, … when taken (SPEC §2).
public struct InsertedJob: Sendable, Equatable {
    public var id: String
    public var requestedID: String
    public var renamed: Bool { id != requestedID }
    /// `skipIfExists` and the id was taken: `id` is the job that holds it; nothing was inserted.
    public var skipped: Bool

    public init(id: String, requestedID: String, skipped: Bool = false) {
        self.id = id
        self.requestedID = requestedID
        self.skipped = skipped
    }
}

/// A job this node now runs, under `fence`: only that fence can record its end.
public struct ClaimedJob: Sendable, Equatable {
    public var id: String
    public var requestedID: String
    public var manifest: [UInt8]
    public var manifestName: String
    public var submittedOn: String
    public var submittedAt: Double
    public var qosRank: Int
    public var priorityRank: Int
    public var fence: Int64
    /// Set when the job was taken over from a lost node (OPQ_FROM_NODE).
    public var fromNode: String?
    /// The manifest's size in the row: more than `manifest.count` when the claim left it out (past the claim's
    /// budget, or past the most a manifest may hold).
    public var manifestBytes: Int
    /// Cancels asked while the job waited, in order: nil for the whole job, else an operation's id.
    public var cancels: [String?]

    public init(id: String, requestedID: String, manifest: [UInt8], manifestName: String, submittedOn: String, submittedAt: Double,
                qosRank: Int, priorityRank: Int, fence: Int64, fromNode: String?,
                manifestBytes: Int? = nil, cancels: [String?] = []) {
        self.cancels = cancels
        self.id = id
        self.requestedID = requestedID
        self.manifest = manifest
        self.manifestName = manifestName
        self.submittedOn = submittedOn
        self.submittedAt = submittedAt
        self.qosRank = qosRank
        self.priorityRank = priorityRank
        self.fence = fence
        self.fromNode = fromNode
        self.manifestBytes = manifestBytes ?? manifest.count
    }
}

/// The process holding a node's name.
public struct NodeOwner: Sendable, Equatable {
    public var info: String
    /// By the database's clock: for messages only.
    public var secondsSinceBeat: Double
    /// The holder's last beat as NodeBeats gives it: what a registering process watches, by its own clock, before it
    /// takes the name from a holder that may still run (RegisterNode's `silentAt`).
    public var beat: NodeBeat

    public init(info: String, secondsSinceBeat: Double, beat: NodeBeat) {
        self.info = info
        self.secondsSinceBeat = secondsSinceBeat
        self.beat = beat
    }
}

/// What one beat renewed: the database's time of the beat and the jobs the node still holds (job → fence).
/// A job the node thinks it runs and that is missing here (or under another fence) is lost.
public struct Heartbeat: Sendable, Equatable {
    public var at: Double
    public var held: [String: Int64]
    /// False when the node has no row (never registered): nothing was renewed.
    public var registered: Bool

    public init(at: Double, held: [String: Int64], registered: Bool) {
        self.at = at
        self.held = held
        self.registered = registered
    }
}

/// A node's last beat as read from the database: `beat` is a token that changes with every beat (the database's
/// clock in microseconds, compared only for a change), `leaseSeconds` the node's own lease (nil: the reader's).
public struct NodeBeat: Sendable, Equatable {
    public var node: String
    public var beat: Int64
    public var leaseSeconds: Double?

    public init(node: String, beat: Int64, leaseSeconds: Double?) {
        self.node = node
        self.beat = beat
        self.leaseSeconds = leaseSeconds
    }
}

/// What a takeover round moved: jobs back to waiting (with the node they came from), the queues of freed slots,
/// and the nodes taken over.
public struct TakeOver: Sendable, Equatable {
    public var jobs: [(id: String, fromNode: String)]
    public var freedSlotQueues: [String]
    public var nodes: [String]

    public static func == (a: TakeOver, b: TakeOver) -> Bool {
        a.jobs.map { "\($0.id)\u{0}\($0.fromNode)" } == b.jobs.map { "\($0.id)\u{0}\($0.fromNode)" }
            && a.freedSlotQueues == b.freedSlotQueues && a.nodes == b.nodes
    }

    public init(jobs: [(id: String, fromNode: String)], freedSlotQueues: [String], nodes: [String] = []) {
        self.jobs = jobs
        self.freedSlotQueues = freedSlotQueues
        self.nodes = nodes
    }
}

public struct JobCompletion: Sendable, Equatable {
    public var job: String
    public var fence: Int64
    public var status: String
    public var result: [UInt8]

    public init(job: String, fence: Int64, status: String, result: [UInt8]) {
        self.job = job
        self.fence = fence
        self.status = status
        self.result = result
    }
}

/// A held cluster-wide slot of a queue.
public struct SlotLease: Sendable, Equatable, Hashable {
    public var queue: String
    public var slot: Int
    public var fence: Int64
    public var holder: String
    public var job: String
    public var operation: String

    public init(queue: String, slot: Int, fence: Int64, holder: String, job: String, operation: String) {
        self.queue = queue
        self.slot = slot
        self.fence = fence
        self.holder = holder
        self.job = job
        self.operation = operation
    }
}

public enum CancelOutcome: Sendable, Equatable {
    case requested
    case unknownJob
    case alreadyEnded
    /// The server read it after the caller's deadline: nothing recorded.
    case late
}

public struct CancelRequest: Sendable, Equatable {
    public var job: String
    /// nil: the whole job.
    public var operation: String?
    /// The fence the node runs the job under; nil for a waiting job cancelled as a whole that no node has taken.
    public var fence: Int64?

    public init(job: String, operation: String?, fence: Int64?) {
        self.job = job
        self.operation = operation
        self.fence = fence
    }
}

public struct UnrunnableJob: Sendable, Equatable {
    public var id: String
    /// Queues and commands that no live node declares. Both empty: each is declared somewhere, but no single
    /// live node declares them all.
    public var missingQueues: [String]
    public var missingCommands: [String]

    public init(id: String, missingQueues: [String], missingCommands: [String]) {
        self.id = id
        self.missingQueues = missingQueues
        self.missingCommands = missingCommands
    }
}

public struct NodeStatus: Sendable, Equatable {
    public var node: String
    public var queues: [String]
    public var commands: [String]
    public var jobSlots: Int
    public var lastHeartbeat: Double
    /// Beat within the lease.
    public var connected: Bool
    public var jobs: Int
    /// The newest schema version the node's code knows (nil: registered by an opqueued from before version 6).
    public var schema: Int?
    public var freeSlots: Int { max(0, jobSlots - jobs) }

    public init(node: String, queues: [String], commands: [String], jobSlots: Int, lastHeartbeat: Double, connected: Bool, jobs: Int,
                schema: Int? = nil) {
        self.node = node
        self.queues = queues
        self.commands = commands
        self.jobSlots = jobSlots
        self.lastHeartbeat = lastHeartbeat
        self.connected = connected
        self.jobs = jobs
        self.schema = schema
    }
}

public struct QueueCount: Sendable, Equatable {
    public var queue: String
    public var waiting: Int
    public var running: Int

    public init(queue: String, waiting: Int, running: Int) {
        self.queue = queue
        self.waiting = waiting
        self.running = running
    }
}

public enum JobState: String, Sendable, Equatable {
    case waiting, running, finished
}

/// A job as `show` and `wait` see it.
public struct JobRecord: Sendable, Equatable {
    public var id: String
    public var requestedID: String
    public var manifest: [UInt8]
    public var manifestName: String
    public var submittedOn: String
    public var submittedAt: Double
    public var state: JobState
    public var node: String?
    public var fence: Int64?
    public var fromNode: String?
    public var status: String?
    public var result: [UInt8]?
    public var finishedAt: Double?
    /// While it runs: what its node's last heartbeat sent as its progress (opaque here; nil if none), and when.
    public var nodeProgress: [UInt8]?
    public var nodeProgressAt: Double?
    /// A delayed job's time (SPEC §3.7), while it waits for it.
    public var notBefore: Double?

    public init(id: String, requestedID: String, manifest: [UInt8], manifestName: String, submittedOn: String, submittedAt: Double,
                state: JobState, node: String?, fence: Int64?, fromNode: String?, status: String?, result: [UInt8]?, finishedAt: Double?,
                nodeProgress: [UInt8]? = nil, nodeProgressAt: Double? = nil, notBefore: Double? = nil) {
        self.notBefore = notBefore
        self.id = id
        self.requestedID = requestedID
        self.manifest = manifest
        self.manifestName = manifestName
        self.submittedOn = submittedOn
        self.submittedAt = submittedAt
        self.state = state
        self.node = node
        self.fence = fence
        self.fromNode = fromNode
        self.status = status
        self.result = result
        self.finishedAt = finishedAt
        self.nodeProgress = nodeProgress
        self.nodeProgressAt = nodeProgressAt
    }
}

public struct PruneReport: Sendable, Equatable {
    public var deleted: Int
    public var batches: Int

    public init(deleted: Int, batches: Int) {
        self.deleted = deleted
        self.batches = batches
    }
}

/// Why a node should look at the store again. Notifications may be lost (a reconnect, a full queue):
/// a poll at least once a second stays the safety net.
public enum Wakeup: Sendable, Equatable {
    /// Jobs became claimable (inserted or taken over).
    case jobs
    /// A cancel or a suspend/resume.
    case control
    /// A cluster slot was freed.
    case slots
    /// Start grants of a clusterRateLimit were reported used or unused: one may be free sooner than said.
    case rates
    /// A node registered (started, reconnected, reloaded): what the cluster declares may have changed.
    case nodes
    /// The listening connection is up (again): anything may have been missed meanwhile.
    case connected
    /// The listening connection is down; it reconnects on its own.
    case disconnected(String)
    /// A node's probe (`probeWakeups`) came back: wake-ups reach this listener.
    case probe(String)
}

/// Every database action the cluster needs. One method is one transaction unless it says otherwise.
public protocol ClusterStore: Sendable {
    /// After an outage, once the server answers again: statements go through fresh connections from now on, not
    /// through a pool that may still be waiting out a backoff of its own (SPEC §8: retried at most 5 s apart).
    /// May block for up to a second, until the fresh connections can be used: call it from a thread, not a task.
    func reconnect()

    /// Creates or upgrades the schema (one migrator at a time); returns the version now applied.
    /// Refuses a schema newer than this code knows.
    func migrate() async throws -> Int

    /// What the operator should know of how the store reaches its server, learnt by connecting (`migrate`): nil
    /// while nothing is to be said. (PostgresClusterStore: a server or pooler refused the statement_timeout asked.)
    var connectionAdvice: String? { get }

    /// Records (or replaces) what the node declares and its `leaseSeconds` (others judge it lost after that much
    /// silence; <= 0: none recorded, theirs applies), renews its lease, creates the slot rows of its cluster limits —
    /// unless another process holds the name: a row whose `info` is neither the declaration's nor `replacing` (a
    /// process the caller knows is gone), and whose beat is not `silentAt` (the holder's beat as `nodeOwner` gave it,
    /// which the caller has seen unchanged for the holder's lease by its own clock: never the database's). Returns
    /// false then, and changes nothing.
    @discardableResult
    func registerNode(_ declaration: NodeDeclaration, leaseSeconds: Double, replacing: String?, silentAt: Int64?) async throws -> Bool

    /// Which process holds a node's name (the `info` it registered), how many seconds ago it last beat by the
    /// database's clock, and that beat as a token; nil when the name has no row.
    func nodeOwner(_ node: String) async throws -> NodeOwner?

    /// Inserts every job in one transaction with one notification; ids made unique across the cluster.
    /// Nothing is inserted when it throws. A job whose `submissionKey` is already there is not inserted again:
    /// its answer is the existing row's id.
    func insertJobs(_ jobs: [NewJob]) async throws -> [InsertedJob]

    /// One claim round, one statement: up to `limit` waiting jobs whose queues and commands are all among the
    /// node's, highest QoS, then priority, then submission order; each under a new fence. A manifest comes back
    /// only while those before it hold fewer than `budget` bytes (the first always does) and it holds at most
    /// `maxManifestBytes`; the others come back empty, `manifestBytes` saying their size.
    func claimJobs(node: String, limit: Int, queues: [String], commands: [String], budget: Int,
                   maxManifestBytes: Int) async throws -> [ClaimedJob]

    /// One statement: renews the lease of the node on all its jobs and slots. With `info`, only while the name is
    /// still that process's (`registered` false otherwise). `progress`, opaque here, replaces what the node's last
    /// beat left for `job(_:)` to hand out with its running jobs (nil: none). `held` nil: `Heartbeat.held` is every
    /// job the database gives the node (a read of every live job); else only those of these ids it still gives it.
    func heartbeat(node: String, info: String?, progress: [UInt8]?, held: [String]?) async throws -> Heartbeat

    /// Hands jobs the node holds under these fences back to waiting (it gave their leases up); returns those moved.
    func releaseJobs(node: String, _ jobs: [String: Int64]) async throws -> Set<String>

    /// Every node's last beat (its row), for the caller to judge silence by its own clock.
    func nodeBeats() async throws -> [NodeBeat]

    /// Moves back the jobs and slots of the nodes of `silent` that have not beaten since (their beat still the one
    /// given): the caller judged them silent past their leases. Returns what moved and which nodes were taken.
    func takeOverSilent(_ silent: [NodeBeat]) async throws -> TakeOver

    /// Records the job's end while `fence` still holds it. False: the node no longer holds the job and
    /// nothing was recorded.
    func complete(job: String, fence: Int64, status: String, result: [UInt8]) async throws -> Bool
    /// The same for many jobs in one statement; returns the jobs whose end was recorded.
    func completeJobs(_ completions: [JobCompletion]) async throws -> Set<String>
    /// Records as finished on `node`, under `id`, a job the database has no row for (it ran to its end there while
    /// the database was restored from an older backup). False when the id is taken: nothing recorded.
    func recordFinished(_ job: NewJob, id: String, node: String, status: String, result: [UInt8]) async throws -> Bool

    /// Up to `count` slots of the queue's cluster-wide limit for `node`, whose best waiting operation has
    /// `priority` (none when `limit` are held), unless another node that beat within `leaseSeconds` waits for one
    /// ahead of it (`waitForSlot`: a higher priority, or the same one since longer). Taking slots sends the node's
    /// turn to the back of its priority.
    func acquireSlots(queue: String, limit: Int, node: String, count: Int, priority: Int, leaseSeconds: Double) async throws -> [SlotLease]
    /// Slots the node holds whose operations ended, to go on with an operation of `priority`: kept unless another
    /// live node waits ahead of it (ranked as `acquireSlots` does), then freed. Returns the leases freed.
    func keepSlots(_ leases: [SlotLease], priority: Int, leaseSeconds: Double) async throws -> [SlotLease]
    /// Records that `node` waits for a slot of `queue` for operations of `priority` at best (its rank among the
    /// waiting nodes); writes nothing when that is already recorded.
    func waitForSlot(queue: String, node: String, priority: Int) async throws
    /// `node` waits for no slot of `queue` any more (the nodes it held back are woken).
    func stopWaitingForSlot(queue: String, node: String) async throws
    /// False when the slot was no longer held under this fence (taken over).
    func releaseSlot(_ lease: SlotLease) async throws -> Bool
    func slotHolders(queue: String) async throws -> [SlotLease]
    /// Frees every slot `node` holds, whatever the fence (a new process of the node, before it takes any: what its
    /// name holds then was held by a process that is gone); returns the queues freed.
    func freeNodeSlots(node: String) async throws -> [String]

    /// clusterRateLimit (SPEC §3.7): up to `wanted` grants to start an operation of `queue` on `node`, each to be
    /// used within `useWithin` seconds of the call (by the caller's monotonic clock) or not at all, such that at
    /// most `limit` start in any window of `seconds` seconds across the cluster; fewer, or none, when that many are
    /// counted already. One transaction, the queue's row locked.
    func grantStarts(queue: String, node: String, wanted: Int, limit: Int, seconds: Double, useWithin: Double) async throws -> StartGrants
    /// `node` started operations on grants `used` (reported after they started) and will start none on `unused`:
    /// their count against the window is shortened accordingly, never lengthened.
    func settleStarts(node: String, used: [Int64], unused: [Int64]) async throws

    func setSuspended(_ queue: String, _ suspended: Bool) async throws
    func suspendedQueues() async throws -> Set<String>

    /// Records a cancel of `job` (or one operation) for whichever node runs or claims it. Nothing is recorded when the
    /// server reads the statement after `notAfter` (epoch seconds, by its clock, which the cluster's clocks agree to):
    /// the caller gave up waiting by then and said so (a frozen server, or a statement queued through an outage);
    /// that is `.late`.
    func requestCancel(job: String, operation: String?, notAfter: Double) async throws -> CancelOutcome
    /// A waiting job whose whole-job cancel is recorded, claimed for `node` whatever it declares (it runs nothing:
    /// its claim brings the cancel). Nil when it no longer waits or another claim holds it now.
    func claimCancelled(job: String, node: String, maxManifestBytes: Int) async throws -> ClaimedJob?
    /// The cancels for jobs the node runs now (repeated until the job ends: the node dedups), then waiting jobs
    /// cancelled as a whole that no node has taken (fence nil), for `claimCancelled`.
    func pendingCancels(node: String) async throws -> [CancelRequest]

    func jobsNoLiveNodeCanRun(leaseSeconds: Double, limit: Int) async throws -> [UnrunnableJob]
    /// Every queue and command some node declares, down nodes included (submission validates against these),
    /// with each command's signature (when several nodes differ: the first in byte order).
    func declared() async throws -> (queues: Set<String>, commands: Set<String>, commandSignatures: [String: String])
    /// Every node; with the jobs each runs when `countingJobs` (a read of every waiting and running job), else 0.
    func nodes(leaseSeconds: Double, countingJobs: Bool) async throws -> [NodeStatus]
    /// Per queue, the cluster's jobs using it that wait and that run (a job counts in each of its queues).
    func queueCounts() async throws -> [QueueCount]
    /// The jobs waiting and running, grouped (LiveSummary): what status needs of them in one read.
    func liveGroups() async throws -> [LiveGroup]
    func job(_ id: String) async throws -> JobRecord?
    /// One page of the finished jobs, newest first: those after `cursor` that finished at `since` or later; the
    /// cursor of the next page, nil after the last.
    func finishedJobs(before cursor: HistoryCursor?, since: Double?, limit: Int) async throws -> (jobs: [FinishedJob], next: HistoryCursor?)

    /// Deletes finished jobs older than `olderThanSeconds` in batches of `batchSize`, each its own short transaction.
    func prune(olderThanSeconds: Double, batchSize: Int) async throws -> PruneReport
    /// Forgets the nodes silent for more than `silentForSeconds` that hold nothing (no running job, no cluster slot,
    /// no wait for one): their rows go, with the queues and commands they declared. Returns their names.
    func forgetNodes(silentForSeconds: Double) async throws -> [String]
    /// Notifies a probe carrying `token` (heard back as `Wakeup.probe(token)` by every listener it reaches).
    func probeWakeups(_ token: String) async throws

    /// Wake-ups for the node's loops (one consumer).
    var wakeups: AsyncStream<Wakeup> { get }
}

/// The daemon names its own spool's ClaimedJob the same way; this spelling reaches the store's from there.
public typealias ClusterClaimedJob = ClaimedJob

extension ClusterStore {
    /// Registers whatever process held the name before (tests, tools).
    public var connectionAdvice: String? { nil }

    @discardableResult
    public func registerNode(_ declaration: NodeDeclaration) async throws -> Bool {
        try await registerNode(declaration, leaseSeconds: -1, replacing: nil, silentAt: nil)
    }

    /// Renews the name's lease whichever process registered it last.
    public func heartbeat(node: String) async throws -> Heartbeat {
        try await heartbeat(node: node, info: nil, progress: nil, held: nil)
    }

    /// Every node, with the jobs each runs.
    public func nodes(leaseSeconds: Double) async throws -> [NodeStatus] {
        try await nodes(leaseSeconds: leaseSeconds, countingJobs: true)
    }

    /// Renews the lease while the name is still `info`'s, sending no progress.
    public func heartbeat(node: String, info: String?) async throws -> Heartbeat {
        try await heartbeat(node: node, info: info, progress: nil, held: nil)
    }
}
