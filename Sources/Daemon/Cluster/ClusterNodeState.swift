// The node's side of the cluster as pure state (SPEC §8): which jobs and slots it holds under which fences, its
// own lease deadline, whether it is connected, which cancels and suspensions it already passed on. Events go in
// with the monotonic time they happened at; what to do comes out (jobs lost, lines to log). No I/O, no clock:
// ClusterJobStore drives it and the tests drive it without either.
//
// The lease rule: the database renews a node's lease when the heartbeat statement runs, which is after it was
// sent; so a lease renewed by a beat sent at `t` lasts at least until `t + leaseSeconds` by any clock that does not
// run faster than the database's. The node stops what its leases cover at `t + leaseSeconds − margin` counted on
// its own monotonic clock from the last beat that succeeded: it never works under a lease that may have run out.

struct ClusterNodeState: Sendable {
    struct Held: Sendable, Equatable {
        var fence: Int64
        /// Its end is being recorded (complete in flight): the answer decides, not beats nor the deadline.
        var completing = false
        /// Its end was recorded under this fence before a restart: publish without recording again.
        var recorded = false
        /// It ran to its end here and its end waits to be recorded: it holds no job slot (the lease still covers it).
        var ended = false
    }

    let leaseSeconds: Double
    /// Stop this long before the lease itself runs out: 1 s, or a fifth of a short lease.
    var margin: Double { min(1, leaseSeconds / 5) }

    private(set) var held: [String: Held] = [:]
    /// Cluster slots held (their fences die with the lease like jobs do).
    private(set) var slots: Set<SlotKey> = []
    /// Monotonic time at which the last successful beat was sent; nil before the first.
    private(set) var lastBeatSent: Double?
    /// nil: never known; the connection lines are logged on changes only (and the first time).
    private(set) var connected: Bool?
    private var delivered: Set<String> = []
    /// Beats ask about the jobs held here only (by id) while nothing happened that may have given this node a job
    /// it does not know of (a claim whose answer never came, a lease run out): a full beat reads every live job,
    /// since no index finds a node's. `uncertainty` counts such events, `certainUpTo` the last a full beat covered.
    private var uncertainty = 1
    private var certainUpTo = 0
    private var lastFullBeat = -Double.infinity
    /// A full beat at least this often all the same (seconds).
    static let fullBeatSeconds = 60.0
    private(set) var suspended: Set<String>?

    struct SlotKey: Hashable, Sendable {
        var queue: String
        var slot: Int
        var fence: Int64
    }

    init(leaseSeconds: Double) {
        self.leaseSeconds = leaseSeconds
    }

    /// When the node must have stopped the work its leases cover; nil before any beat.
    var deadline: Double? { lastBeatSent.map { $0 + leaseSeconds - margin } }
    var holdsAnything: Bool { !held.isEmpty || !slots.isEmpty }
    /// What the watchdog is told: the deadline while something is held.
    var watchdogDeadline: Double? { holdsAnything ? deadline : nil }

    /// Whether new leases may be taken now (claims, slots): a beat succeeded and its lease has time left.
    func mayTakeLeases(now: Double) -> Bool {
        guard connected == true, let deadline else { return false }
        return now < deadline
    }

    // MARK: connection

    /// The connection failed: true when that is news (log `disconnected`, once per outage).
    mutating func connectionFailed() -> Bool {
        defer { connected = false }
        uncertainty += 1
        return connected != false
    }

    /// Connected (migrated, registered and beaten once): true when that is news (log `connected`, also the first time).
    mutating func connectionSucceeded() -> Bool {
        defer { connected = true }
        return connected != true
    }

    // MARK: leases

    /// A job recovered from a previous run, or just claimed.
    mutating func hold(_ job: String, fence: Int64, recorded: Bool = false) {
        held[job] = Held(fence: fence, recorded: recorded)
    }

    /// Without any beat yet (database down at start), recovered jobs count as renewed at `now`.
    mutating func assumeRenewed(at now: Double) {
        if lastBeatSent == nil { lastBeatSent = now }
    }

    /// Something happened that may have given this node a job it does not know of: the next beat is a full one.
    mutating func mayHaveBeenGivenJobs() { uncertainty += 1 }

    /// What the next beat asks about: the ids held here (nil: every job the database gives this node), and the
    /// uncertainty it covers (handed back to `beatSucceeded`).
    func nextBeat(now: Double) -> (held: [String]?, covers: Int) {
        let full = certainUpTo < uncertainty || now - lastFullBeat >= Self.fullBeatSeconds
        return (full ? nil : held.keys.sorted(), uncertainty)
    }

    /// A beat sent at `sentAt` succeeded and says what the database holds for this node. Returns the jobs lost:
    /// held here but missing there or under another fence (ends being recorded are left to their answer), and the
    /// jobs the database gives this node that it does not run (`orphans`, to hand back).
    /// `asked`: the ids the beat asked about (nil: a full beat, covering `covers` of `nextBeat`).
    mutating func beatSucceeded(sentAt: Double, held database: [String: Int64], asked: [String]? = nil,
                                covers: Int = 0) -> (lost: [String], orphans: [String: Int64]) {
        lastBeatSent = max(lastBeatSent ?? sentAt, sentAt)
        if asked == nil {
            certainUpTo = max(certainUpTo, covers)
            lastFullBeat = max(lastFullBeat, sentAt)
        }
        let answered = asked.map(Set.init)
        var lost: [String] = []
        for (job, mine) in held where !mine.completing && !mine.recorded && database[job] != mine.fence
            && answered?.contains(job) != false {
            lost.append(job)
        }
        for job in lost { forget(job) }
        let orphans = database.filter { held[$0.key]?.fence != $0.value }
        return (lost.sorted(), orphans)
    }

    /// The deadline check (run often, and first thing after a freeze): past it, every held job is lost except
    /// those whose end is being recorded, and every slot is dropped (returned: to release once back).
    mutating func checkDeadline(now: Double) -> (lost: [String], slots: [SlotKey]) {
        guard let deadline, now >= deadline else { return ([], []) }
        let lost = held.filter { !$0.value.completing && !$0.value.recorded }.keys.sorted()
        for job in lost { forget(job) }
        // Forgotten here, they may still be this node's there: the next beat finds them to hand back.
        if !lost.isEmpty { uncertainty += 1 }
        let dropped = slots.sorted { ($0.queue, $0.slot) < ($1.queue, $1.slot) }
        slots = []
        return (lost, dropped)
    }

    /// Held jobs that take a job slot: all but those that ran to their ends here.
    var running: Int { held.values.reduce(0) { $0 + ($1.ended ? 0 : 1) } }

    /// These jobs ran to their ends here; their ends will be recorded later.
    mutating func ending(_ jobs: [String]) {
        for job in jobs where held[job] != nil { held[job]?.ended = true }
    }

    /// The shell is recording these ends: returns job → fence for those held (others are unknown here).
    mutating func beginCompleting(_ jobs: [String]) -> [String: Int64] {
        var fences: [String: Int64] = [:]
        for job in jobs {
            guard var h = held[job] else { continue }
            h.completing = true
            held[job] = h
            fences[job] = h.fence
        }
        return fences
    }

    /// The answer came (`recorded`) or none did (nil: the batch waits; the jobs go back to ordinary).
    /// Returns the jobs lost: asked, held, and not recorded.
    mutating func endCompleting(_ asked: [String], recorded: Set<String>?) -> [String] {
        guard let recorded else {
            for job in asked where held[job] != nil { held[job]?.completing = false }
            return []
        }
        var lost: [String] = []
        for job in asked where held[job] != nil {
            if !recorded.contains(job) { lost.append(job) }
            forget(job)
        }
        return lost
    }

    /// Ends recorded before a restart, to be answered without the database.
    func alreadyRecorded(_ jobs: [String]) -> Set<String> {
        Set(jobs.filter { held[$0]?.recorded == true })
    }

    mutating func forget(_ job: String) {
        held[job] = nil
        delivered = delivered.filter { !$0.hasPrefix(job + "\u{0}") }
    }

    mutating func addSlot(_ key: SlotKey) { slots.insert(key) }
    /// False when the slot was no longer held here (dropped at the deadline).
    mutating func removeSlot(_ key: SlotKey) -> Bool { slots.remove(key) != nil }

    // MARK: control

    /// A cancel passed on to the shell: its job (the prefix `forget` drops) and the operation, or `*` for the whole job.
    private static func cancelKey(_ job: String, _ operation: String?) -> String {
        job + "\u{0}" + (operation.map { "op:" + $0 } ?? "*")
    }

    /// Cancels that came with a claimed job (made as it starts): not passed on again when the control round reads them.
    mutating func claimedWithCancels(_ job: String, _ operations: [String?]) {
        for operation in operations { delivered.insert(Self.cancelKey(job, operation)) }
    }

    /// Cancels from the database for jobs this node runs under the same fence, each passed on once.
    mutating func newCancels(_ requests: [(job: String, operation: String?, fence: Int64)]) -> [(job: String, operation: String?)] {
        var out: [(job: String, operation: String?)] = []
        for request in requests where held[request.job]?.fence == request.fence {
            let key = Self.cancelKey(request.job, request.operation)
            if delivered.insert(key).inserted { out.append((request.job, request.operation)) }
        }
        return out
    }

    /// The suspended set read from the database: returns it when it differs from the last one passed on.
    mutating func suspendedRead(_ queues: Set<String>) -> Set<String>? {
        guard queues != suspended else { return nil }
        suspended = queues
        return queues
    }
}
