// SpoolFault: the policy of a spool fault (a file system full, no descriptor left, a read-only folder, an I/O error,
// or the job store unable to answer), as a pure value: no I/O, no clock of its own, no timer. The shell keeps one
// on `work`, tells it what failed and what worked, and does what it answers: log a fault's start and end, pause
// claiming, schedule a retry after the delay it gives, offer the publications that waited again.
//
// While a fault lasts nothing is claimed and publications wait (`stalled`); retries back off from the first to the
// last of `retryDelays`. A fault ends when a step of the spool works with nothing left waiting.

struct SpoolFault<Stalled> {
    /// Retries back off from the first to the last of these delays (seconds).
    static var retryDelays: [Double] { [0.25, 0.5, 1, 2] }

    /// The fault on now: what failed first, and when (seconds since the epoch); nil when the spool works.
    private(set) var current: (what: String, since: Double)?
    /// Publications that could not be completed, in order: offered again at the next retry.
    private(set) var stalled: [Stalled] = []
    private var retries = 0
    private var retryScheduled = false

    var isOn: Bool { current != nil }

    /// A step failed. True when this begins a fault (the shell logs it and pauses claiming); a failure during a
    /// fault only adds to it.
    mutating func failed(_ what: String, now: Double) -> Bool {
        guard current == nil else { return false }
        current = (what, now)
        return true
    }

    /// A step worked with nothing waiting: the fault that this ends, and how long it lasted; nil when none was on.
    mutating func worked(now: Double) -> (what: String, seconds: Double)? {
        guard let fault = current else { return nil }
        current = nil
        retries = 0
        return (fault.what, now - fault.since)
    }

    /// Publications that wait for the spool (kept in order).
    mutating func stall(_ publications: some Sequence<Stalled>) {
        stalled.append(contentsOf: publications)
    }

    /// The delay of the next retry, or nil when one is already scheduled.
    mutating func scheduleRetry() -> Double? {
        guard !retryScheduled else { return nil }
        retryScheduled = true
        let delay = Self.retryDelays[min(retries, Self.retryDelays.count - 1)]
        retries += 1
        return delay
    }

    /// What a scheduled retry does now that its delay is over.
    enum Retry: Equatable {
        /// The fault ended meanwhile: nothing.
        case none
        /// Probe the spool; if it works, the fault is over (nothing waited).
        case probe
        /// Probe the spool; if it works, publish these again first (success there ends the fault).
        case republish
    }

    mutating func retryDue() -> Retry {
        retryScheduled = false
        guard current != nil else { return .none }
        return stalled.isEmpty ? .probe : .republish
    }

    /// The stalled publications, taken to be offered again.
    mutating func takeStalled() -> [Stalled] {
        defer { stalled = [] }
        return stalled
    }
}
