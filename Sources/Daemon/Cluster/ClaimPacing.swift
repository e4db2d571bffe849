// ClaimPacing: how big a busy node's claim rounds are while jobs wait in the database (issue 45).
//
// Each claim round costs the server a statement and a commit whatever its size, and a busy node's slots free one
// publication batch at a time: it claimed in rounds as small as those batches. While the last round came back full
// (more jobs wait) and the node still holds a round's worth of jobs to work on, a smaller round is put off until its
// room reaches a round's worth, or for at most `patience` — never when the node holds fewer (it would run dry), nor
// after a round that found fewer jobs than it asked for: an idle node's pickup is never delayed. Pure: no I/O.

struct ClaimPacing {
    enum Decision: Equatable {
        case claim
        /// Not yet: claim when the room reaches a round's worth, or at `until` (monotonic seconds) at the latest.
        case putOff(until: Double)
    }

    /// How long a round may be put off at most: a slot waits no longer for its next job.
    static let patience = 0.02

    /// The last round came back full: jobs (likely) wait in the database.
    private(set) var backlog = false
    /// When the round now put off was first put off.
    private var since: Double?

    /// A round's worth for a node of `slots` job slots.
    static func round(slots: Int) -> Int { max(1, slots / 2) }

    /// Whether to claim `limit` jobs now, the node holding `held` of its `slots`, at monotonic `now`.
    mutating func decide(limit: Int, held: Int, slots: Int, now: Double) -> Decision {
        let round = Self.round(slots: slots)
        guard backlog, limit < round, held >= round else {
            since = nil
            return .claim
        }
        let first = since ?? now
        if now >= first + Self.patience {
            since = nil
            return .claim
        }
        since = first
        return .putOff(until: first + Self.patience)
    }

    /// A round asked for `limit` jobs and got `rows`.
    mutating func claimed(rows: Int, limit: Int) {
        backlog = rows >= limit
        since = nil
    }

    /// The node cannot claim for now (disconnected, stopping): what was learnt of the database is stale.
    mutating func reset() {
        backlog = false
        since = nil
    }
}
