// `status`'s answer (SPEC §1, §3.7, §8): the daemon's counts, its queues, its schedules, its jobs' progress and, on a
// cluster node, the cluster as this node last read it. What `opqueuectl status` prints, and `--json` as it is.

/// The daemon's state. Optional fields are absent from the JSON when nil.
public struct StatusAnswer: Codable, Sendable, Equatable {
    public var exit = 0
    /// Always "running": a daemon that answers runs.
    public var state = "running"
    /// The jobs in its table (the earliest delayed ones among them), by id.
    public var activeJobs: [String]
    /// Manifests waiting in the inbox (and those a cluster node holds for the database).
    public var waiting: Int
    public var executing: Int
    /// Operations of the active jobs, and the budget above which claiming pauses (nil from daemons before them).
    public var operations: Int?
    public var maxActiveOperations: Int?
    public var queues: [Queue]
    /// Absent when there is none.
    public var schedules: [Schedule]?
    /// The spool fault claiming waits on.
    public var fault: String?
    /// Every delayed job (absent when 0): `activeJobs` and `jobs` list only the earliest.
    public var delayed: Int?
    /// A cluster node's submissions taken from the inbox and not yet in the database (absent when 0), and when the
    /// oldest was taken.
    public var submissions: Int?
    public var submissionsSince: Double?
    /// A cluster node's: the nodes and the cluster as it last read them.
    public var nodes: [Node]?
    public var cluster: Cluster?
    /// Each active job's progress (nil from daemons that sent `activeJobs` alone).
    public var jobs: [Job]?
    /// `status --memory`: the bytes the daemon's allocator has handed out.
    public var heapBytes: Int?

    public init(activeJobs: [String], waiting: Int, executing: Int, operations: Int?, maxActiveOperations: Int?,
                queues: [Queue], jobs: [Job]?) {
        self.activeJobs = activeJobs
        self.waiting = waiting
        self.executing = executing
        self.operations = operations
        self.maxActiveOperations = maxActiveOperations
        self.queues = queues
        self.jobs = jobs
    }

    public struct Queue: Codable, Sendable, Equatable {
        public var name: String
        /// -1: one per core.
        public var maxConcurrentOperationCount: Int
        public var qualityOfService: String
        public var suspended: Bool
        public var pending: Int
        public var executing: Int
        /// SPEC §3.7: a rated queue's rate, and its next free start (seconds since the epoch).
        public var rateLimit: RateLimit?
        public var nextStartAt: Double?
        /// true (else absent) while suspended only until this node has read the cluster's suspensions.
        public var held: Bool?
        /// A cluster-wide limit: the queue's `clusterMaxConcurrentOperationCount`, the slots this node holds, and the
        /// priority its wait for more is recorded at while it waits.
        public var clusterMaxConcurrentOperationCount: Int?
        public var clusterSlotsHeld: Int?
        public var clusterSlotWait: String?

        public init(name: String, maxConcurrentOperationCount: Int, qualityOfService: String, suspended: Bool, pending: Int,
                    executing: Int) {
            self.name = name
            self.maxConcurrentOperationCount = maxConcurrentOperationCount
            self.qualityOfService = qualityOfService
            self.suspended = suspended
            self.pending = pending
            self.executing = executing
        }
    }

    public struct RateLimit: Codable, Sendable, Equatable {
        public var operations: Int
        public var seconds: Double

        public init(operations: Int, seconds: Double) {
            self.operations = operations
            self.seconds = seconds
        }
    }

    /// A schedule (SPEC §3.7) and its next occurrence (nil: none within years).
    public struct Schedule: Codable, Sendable, Equatable {
        public var name: String
        public var cron: String
        public var timeZone: String
        public var next: Double?

        public init(name: String, cron: String, timeZone: String, next: Double?) {
            self.name = name
            self.cron = cron
            self.timeZone = timeZone
            self.next = next
        }
    }

    /// A cluster node as this node last read it (SPEC §8).
    public struct Node: Codable, Sendable, Equatable {
        public var node: String
        public var connected: Bool
        /// Seconds since the epoch (the database's clock).
        public var lastHeartbeat: Double
        public var jobs: Int
        public var freeSlots: Int
        /// The newest schema its opqueued knows (nil: one from before schema 6).
        public var schema: Int?

        public init(node: String, connected: Bool, lastHeartbeat: Double, jobs: Int, freeSlots: Int, schema: Int?) {
            self.node = node
            self.connected = connected
            self.lastHeartbeat = lastHeartbeat
            self.jobs = jobs
            self.freeSlots = freeSlots
            self.schema = schema
        }
    }

    /// The cluster as this node sees it (SPEC §8).
    public struct Cluster: Codable, Sendable, Equatable {
        /// This node's name, and "connected" or "disconnected" (with why, when not connected).
        public var node: String
        public var state: String
        public var reason: String?
        /// Whether the database's wake-ups reach this node.
        public var wakeupsArrive: Bool
        /// Waiting jobs that no live node can run, with why.
        public var unrunnable: [Unrunnable]
        /// Per queue, the cluster's jobs waiting and running, and when they were read (seconds since the epoch; nil:
        /// never read).
        public var queues: [String: QueueCounts]
        public var queuesReadAt: Double?

        public init(node: String, state: String, reason: String?, wakeupsArrive: Bool, unrunnable: [Unrunnable],
                    queues: [String: QueueCounts], queuesReadAt: Double?) {
            self.node = node
            self.state = state
            self.reason = reason
            self.wakeupsArrive = wakeupsArrive
            self.unrunnable = unrunnable
            self.queues = queues
            self.queuesReadAt = queuesReadAt
        }
    }

    public struct Unrunnable: Codable, Sendable, Equatable {
        public var job: String
        /// e.g. "no live node declares queue gpu".
        public var reason: String

        public init(job: String, reason: String) {
            self.job = job
            self.reason = reason
        }
    }

    public struct QueueCounts: Codable, Sendable, Equatable {
        public var waiting: Int
        public var running: Int

        public init(waiting: Int, running: Int) {
            self.waiting = waiting
            self.running = running
        }
    }

    /// An active job's progress: operations in its plan (0 while it is read) and those ended; a delayed one's time.
    public struct Job: Codable, Sendable, Equatable {
        public var job: String
        public var operations: Int
        public var ended: Int
        public var notBefore: Double?

        public init(job: String, operations: Int, ended: Int, notBefore: Double?) {
            self.job = job
            self.operations = operations
            self.ended = ended
            self.notBefore = notBefore
        }
    }
}
