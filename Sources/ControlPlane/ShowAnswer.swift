// `show`'s answer (SPEC §1, §8): a job the daemon knows and its operations. A job this node runs: each operation's
// state as the engine has it. A cluster's job this node does not run: from the database (an ended one's operations as
// its result.plist has them, SPEC §5; one running elsewhere as that node's last heartbeat sent them).

/// A job and its operations, in manifest order. Optional fields are absent from the JSON when nil.
public struct ShowAnswer: Codable, Sendable, Equatable {
    public var exit = 0
    public var job: String
    /// running, delayed, waiting (a cluster's, not yet claimed) or the status it ended with.
    public var status: String
    public var operations: [Operation]
    /// true (else absent): claimed a moment ago, its manifest being read (no operations yet).
    public var starting: Bool?
    /// A delayed job's start time (SPEC §3.7).
    public var notBefore: Double?
    /// A cluster's job: where it runs or ran, where it was submitted, and when the running node's heartbeat sent the
    /// states shown.
    public var node: String?
    public var submittedOn: String?
    public var progressAt: Double?

    public init(job: String, status: String, operations: [Operation]) {
        self.job = job
        self.status = status
        self.operations = operations
    }

    /// One operation. A running job's has id, kind, queue, state, attempts and dependencies, and its times and error
    /// once it has them; an ended job's has result.plist's keys (SPEC §5); an operation of a job running on another
    /// node that its heartbeat did not send is only `unknown`.
    public struct Operation: Codable, Sendable, Equatable {
        public var id: String
        public var kind: String?
        public var queue: String?
        public var state: String
        public var attempts: Int?
        public var dependencies: [String]?
        public var startedAt: Double?
        public var finishedAt: Double?
        public var durationSeconds: Double?
        public var error: String?
        public var outputs: [String]?
        public var qualityOfService: String?
        public var queuePriority: String?

        public init(id: String, kind: String? = nil, queue: String? = nil, state: String, attempts: Int? = nil,
                    dependencies: [String]? = nil) {
            self.id = id
            self.kind = kind
            self.queue = queue
            self.state = state
            self.attempts = attempts
            self.dependencies = dependencies
        }

        /// Whether it has ended (the states `wait`'s progress counts).
        public var hasEnded: Bool { ["succeeded", "failed", "cancelled"].contains(state) }
    }
}

/// What `show`, `wait` and `graph` read of an ended job's result.plist (SPEC §5); its other keys are not read here.
public struct ShownResult: Decodable, Sendable, Equatable {
    public var status: String?
    public var node: String?
    public var operations: [ShowAnswer.Operation]?

    public init(status: String?, node: String?, operations: [ShowAnswer.Operation]?) {
        self.status = status
        self.node = node
        self.operations = operations
    }
}
