// The operation engine's shared types: operation and group addresses, submission errors, the observer's
// transitions and events, records and queue snapshots for results and `status`, attempts, timer requests
// and dispatches (`Scheduler.swift` holds the scheduler that produces them).

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
