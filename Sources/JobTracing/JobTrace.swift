// JobTracing: a finished job as one OpenTelemetry trace (SPEC §6 `tracing.otlp`).
//
// The daemon hands over what result.plist is written from, once the job has ended; `spans()` turns it into span
// descriptions with explicit instants (pure, tested without a collector), and TraceExport emits them through
// swift-distributed-tracing's Tracer to swift-otel's OTLP/HTTP exporter. Nothing here runs while operations do.
// What it trusts: the daemon's records (the manifest's operations, validated; times in seconds since the epoch).

/// A finished job: the data result.plist is written from, with each operation's timeline when it is known.
public struct JobTrace: Sendable, Equatable {
    public var job: String
    /// `succeeded`, `failed`, `cancelled` or `rejected`.
    public var status: String
    public var error: String?
    public var receivedAt: Double
    public var finishedAt: Double
    /// The manifest's `traceparent`: the job's trace continues the submitter's.
    public var traceparent: String?
    /// In manifest order.
    public var operations: [OperationTrace]

    public init(job: String, status: String, error: String?, receivedAt: Double, finishedAt: Double, traceparent: String?,
                operations: [OperationTrace]) {
        self.job = job
        self.status = status
        self.error = error
        self.receivedAt = receivedAt
        self.finishedAt = finishedAt
        self.traceparent = traceparent
        self.operations = operations
    }
}

/// One operation as result.plist has it, with the times the daemon saw it become ready and each attempt run.
public struct OperationTrace: Sendable, Equatable {
    public var id: String
    public var kind: String
    public var queue: String
    public var qualityOfService: String
    public var dependencies: [String]
    /// `succeeded`, `failed` or `cancelled`.
    public var state: String
    /// How many attempts ran (0 if it never ran).
    public var attempts: Int
    public var error: String?
    public var startedAt: Double?
    public var finishedAt: Double?
    /// When it became ready (its dependencies finished); nil when not seen (it ended before a restart).
    public var readyAt: Double?
    /// Each attempt this run saw, in order; empty when not seen.
    public var attemptTimes: [AttemptTime]

    public init(id: String, kind: String, queue: String, qualityOfService: String, dependencies: [String], state: String,
                attempts: Int, error: String?, startedAt: Double?, finishedAt: Double?, readyAt: Double? = nil,
                attemptTimes: [AttemptTime] = []) {
        self.id = id
        self.kind = kind
        self.queue = queue
        self.qualityOfService = qualityOfService
        self.dependencies = dependencies
        self.state = state
        self.attempts = attempts
        self.error = error
        self.startedAt = startedAt
        self.finishedAt = finishedAt
        self.readyAt = readyAt
        self.attemptTimes = attemptTimes
    }
}

/// One attempt: from executing to its end (nil: it had not ended when the operation did), with its error.
public struct AttemptTime: Sendable, Equatable {
    public var start: Double
    public var end: Double?
    public var error: String?

    public init(start: Double, end: Double?, error: String?) {
        self.start = start
        self.end = end
        self.error = error
    }
}

/// What one span will be: parents before children, instants in nanoseconds since the epoch.
public struct SpanDescription: Sendable, Equatable {
    public enum Attribute: Sendable, Equatable {
        case string(String)
        case int(Int)
    }

    public var name: String
    /// The index of the parent span; nil for the job's root (a child of the submitter's span, if any).
    public var parent: Int?
    /// Indices of the spans this one follows from (an operation's dependencies).
    public var links: [Int]
    public var start: UInt64
    public var end: UInt64
    public var attributes: [String: Attribute]
    /// The span's status: nil is OK (or unset), else an error with this message.
    public var error: String?
    /// In time order.
    public var events: [EventDescription] = []
}

/// An instant within a span: an attempt's start or a retried attempt's end.
public struct EventDescription: Sendable, Equatable {
    public var name: String
    /// Nanoseconds since the epoch.
    public var time: UInt64
    public var attributes: [String: SpanDescription.Attribute]
}
