// Quality of service, queue priority and operation state: the vocabulary of Foundation's
// Operation, with the names the manifest and the journal use.

/// How urgent work is. Higher classes are dispatched first and run on threads of higher OS priority.
public enum QualityOfService: UInt8, Sendable, Comparable, CaseIterable, CustomStringConvertible {
    case background = 0
    case utility = 1
    case `default` = 2
    case userInitiated = 3
    case userInteractive = 4

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }

    /// The spelling used by manifests, the configuration and the journal.
    public var name: String {
        switch self {
        case .background: "background"
        case .utility: "utility"
        case .default: "default"
        case .userInitiated: "userInitiated"
        case .userInteractive: "userInteractive"
        }
    }

    public init?(name: String) {
        guard let value = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = value
    }

    public var description: String { name }

    /// The Linux scheduling a worker thread of this class runs with: `nice` value and SCHED_IDLE.
    /// Negative values apply only when the process may raise its priority (CAP_SYS_NICE); otherwise 0.
    var threadPriority: (nice: Int32, idle: Bool) {
        switch self {
        case .userInteractive: (-4, false)
        case .userInitiated: (-2, false)
        case .default: (0, false)
        case .utility: (10, false)
        case .background: (19, true)
        }
    }
}

/// Order among the ready operations of one queue (before submission order).
public enum QueuePriority: UInt8, Sendable, Comparable, CaseIterable, CustomStringConvertible {
    case veryLow = 0
    case low = 1
    case normal = 2
    case high = 3
    case veryHigh = 4

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }

    public var name: String {
        switch self {
        case .veryLow: "veryLow"
        case .low: "low"
        case .normal: "normal"
        case .high: "high"
        case .veryHigh: "veryHigh"
        }
    }

    public init?(name: String) {
        guard let value = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = value
    }

    public var description: String { name }
}

/// The life of an operation: pending → ready → executing (→ retrying → ready …) → one of the three ends.
public enum OperationState: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    case pending = 0
    case ready = 1
    case executing = 2
    case retrying = 3
    case succeeded = 4
    case failed = 5
    case cancelled = 6

    public var isFinished: Bool { rawValue >= OperationState.succeeded.rawValue }

    public var name: String {
        switch self {
        case .pending: "pending"
        case .ready: "ready"
        case .executing: "executing"
        case .retrying: "retrying"
        case .succeeded: "succeeded"
        case .failed: "failed"
        case .cancelled: "cancelled"
        }
    }

    public var description: String { name }
}
