// Whether the database's wake-ups (LISTEN/NOTIFY) reach this node, as pure state. Behind a connection pooler in
// transaction or statement mode (PgBouncer's usual setting) LISTEN succeeds and nothing ever arrives: no error
// anywhere, only jobs, cancels and suspensions that wait for the 1 s poll instead of reaching the node within
// 100 ms (SPEC §8). So now and then the node notifies a token of its own through its pool and expects its own
// listening connection to hear it. Two probes in a row unheard (a probe can be lost to a listener that reconnected)
// and wake-ups are taken for not arriving, which is said once, as is their return. No I/O, no clock: the node's
// status thread drives it with the monotonic time.

struct WakeupProbe: Sendable {
    enum Verdict: Sendable, Equatable {
        case arriving
        case notArriving
    }

    /// A probe every this many seconds while wake-ups are known to arrive (or not to).
    static let every = 60.0
    /// A probe not heard within this long is missed.
    static let wait = 3.0
    /// Misses in a row before wake-ups are taken for not arriving (the second probe goes at once).
    static let misses = 2

    /// Assumed to arrive until shown otherwise: said only when that changes.
    private(set) var verdict: Verdict = .arriving
    /// Probes of this node's heard back (for diagnosis and the tests).
    private(set) var heardCount = 0
    private var outstanding: (token: String, sentAt: Double)?
    private var missed = 0
    private var nextAt = 0.0
    private var listening = false

    /// The listening connection is up (again): the first probe goes at once; one in flight may have been lost.
    mutating func listenerConnected(now: Double) {
        listening = true
        outstanding = nil
        nextAt = now
    }

    /// The listening connection is down: nothing is judged until it is back (its reconnection is reported anyway).
    mutating func listenerDisconnected() {
        listening = false
        outstanding = nil
    }

    /// Whether a probe is due now (the caller records it with `sent` before it sends it).
    func due(now: Double) -> Bool { listening && outstanding == nil && now >= nextAt }

    /// The probe `token` was sent at `now`.
    mutating func sent(_ token: String, now: Double) {
        outstanding = (token, now)
    }

    /// The probe could not be sent (the database away): nothing is judged; another goes `wait` seconds later.
    mutating func notSent(now: Double) {
        outstanding = nil
        nextAt = now + Self.wait
    }

    /// A probe token was heard (any node's: only this node's outstanding one counts). Returns the new verdict when
    /// it changed.
    mutating func heard(_ token: String, now: Double) -> Verdict? {
        guard let outstanding, outstanding.token == token else { return nil }
        self.outstanding = nil
        missed = 0
        heardCount += 1
        nextAt = now + Self.every
        return settle(.arriving)
    }

    /// Judges a probe that waited long enough. Returns the new verdict when it changed.
    mutating func check(now: Double) -> Verdict? {
        guard listening, let outstanding, now - outstanding.sentAt >= Self.wait else { return nil }
        self.outstanding = nil
        missed += 1
        if missed < Self.misses {
            nextAt = now
            return nil
        }
        nextAt = now + Self.every
        return settle(.notArriving)
    }

    /// When the next thing is due (a probe to send or one to judge), for the caller's wait.
    func nextEvent() -> Double? {
        guard listening else { return nil }
        if let outstanding { return outstanding.sentAt + Self.wait }
        return nextAt
    }

    private mutating func settle(_ new: Verdict) -> Verdict? {
        guard new != verdict else { return nil }
        verdict = new
        return new
    }
}
