// RateWindow: a queue's rate limit (SPEC §3.7 "At a rate") as a sliding window over its last starts.
//
// At most N starts may lie in any window of S seconds. Whether one more may start at time t depends
// only on the N latest starts: it may when fewer than N were made, or when the oldest of the N is at
// least S old. So the window keeps those N times in a ring (bounded memory, O(1) per start) and says
// when the next start is free, for the engine to wake then rather than poll.

/// A queue's rate: at most `operations` of its operations start (a retry is a start) in any window of
/// `seconds` seconds.
public struct RateLimit: Sendable, Hashable, CustomStringConvertible {
    public let operations: Int
    public let seconds: Double

    /// nil unless `operations` is at least 1 and `seconds` positive and finite.
    public init?(operations: Int, seconds: Double) {
        guard operations > 0, seconds > 0, seconds.isFinite else { return nil }
        self.operations = operations
        self.seconds = seconds
    }

    public var description: String { "\(operations) per \(seconds) s" }
}

/// The start times that decide a rate, on one clock that never goes back (the engine's monotonic one).
struct RateWindow {
    private(set) var limit: RateLimit
    /// The latest starts, at most `limit.operations` of them: a ring whose oldest entry is at `oldest`
    /// once it is full. It grows as starts are made, so a large N costs only what is used.
    private var starts: [Double] = []
    private var oldest = 0

    init(_ limit: RateLimit) { self.limit = limit }

    /// nil when a start is free at `time`; else the earliest time one is.
    func nextFreeStart(at time: Double) -> Double? {
        guard starts.count >= limit.operations else { return nil }
        let free = starts[oldest] + limit.seconds
        return free <= time ? nil : free
    }

    /// Notes a start at `time` (not before the last one noted).
    mutating func record(_ time: Double) {
        if starts.count < limit.operations {
            starts.append(time)
        } else {
            starts[oldest] = time
            oldest = oldest + 1 == starts.count ? 0 : oldest + 1
        }
    }

    /// A new limit (a reload) keeps the history: the latest starts, as many as the new limit looks at.
    mutating func change(to limit: RateLimit) {
        let kept = recorded.suffix(limit.operations)
        self.limit = limit
        starts = Array(kept)
        oldest = 0
    }

    /// The starts kept, oldest first.
    var recorded: [Double] { Array(starts[oldest...] + starts[..<oldest]) }
}
