// ClusterRates: clusterRateLimit (SPEC §3.7 "At a rate", §8) on one node. At most N of a queue's operations start
// in any window of S seconds across the cluster: the engine starts one only on a grant from the database
// (`Engine.grantStarts`, a start budget), and the database grants only what its count allows (schema 9,
// opq_grant_starts). A grant must be used within `useWithin` of asking, by this node's monotonic clock — the
// engine refuses it after that — and counts in the database until its time + useWithin + S, or until its use is
// reported + S, or until it is reported unused: every start of a window [a, a+S) comes from a grant counted at
// a+S−ε, so at most N, whichever nodes die or lose the database (their grants simply run out).
//
// Demand is the queue's ready operations that could start now (within its own limits); one batch of grants per
// queue is outstanding at a time. A round settles the batch once it is spent, past its deadline or larger than the
// demand (the engine's budget is taken back first: what was left is reported unused), then asks for the demand.
// Given fewer than asked, the node asks again when the database said the next grant frees, or sooner when another
// node reports grants used or unused (a NOTIFY: a used grant counts until its use + S, sooner than said). Rounds run
// on one task, on every nudge (an operation of the queue became ready or started, a NOTIFY) and when something
// falls due (at least once a second); nudges coalesce.
//
// Trusts: the store grants atomically (the queue's row locked) and never lengthens a count on a report.

import ClusterStore
import Dispatch
import Logging
import OperationEngine
import Synchronization
import SystemCalls

public final class ClusterRates: Sendable {
    struct Limited: Sendable, Equatable {
        var queue: QueueID
        var rate: RateLimit
    }

    /// Grants given to the engine at once, with the deadline it uses them by (monotonic seconds).
    private struct Batch {
        var ids: [Int64]
        var until: Double
    }

    private struct State {
        var limited: [String: Limited] = [:]
        var batches: [String: Batch] = [:]
        /// Settlements a reload left to report (a queue no longer limited): used and unused grants.
        var unreported: [(used: [Int64], unused: [Int64])] = []
        /// When to ask a queue's grants again (monotonic seconds): when the database said the next one frees.
        var askAt: [String: Double] = [:]
        /// A nudge came while no round waited; the round loop's wait, while it waits.
        var nudged = false
        var waiter: CheckedContinuation<Void, Never>?
    }

    /// How long a grant may wait for its start. Short, since a grant counts for this long beyond its window even
    /// when unused (a node that dies holding grants keeps them from the others until then); long enough for a
    /// round trip to the database and the engine's dispatch under load.
    static let useWithin = 3.0
    /// A batch is settled this long before its deadline, so that a grant not yet used goes back while it counts.
    static let settleAhead = 0.1

    private let store: any ClusterStore
    private let node: String
    private let engine: Engine
    private let logger: Logger
    private let state = Mutex(State())

    init(store: any ClusterStore, node: String, engine: Engine, logger: Logger) {
        self.store = store
        self.node = node
        self.engine = engine
        self.logger = logger
    }

    /// The queues with a cluster-wide rate (at start and at each reload). A queue newly limited starts nothing until
    /// it is granted starts; one no longer limited is freed of its budget (what it used is reported).
    func configure(_ limited: [String: Limited]) {
        let (added, removed): ([QueueID], [(QueueID, Batch?)]) = state.withLock { s in
            let gone = s.limited.filter { limited[$0.key] == nil }
            let new = limited.filter { s.limited[$0.key] == nil }.map(\.value.queue)
            s.limited = limited
            return (new, gone.map { ($0.value.queue, s.batches.removeValue(forKey: $0.key)) })
        }
        for q in added { engine.setStartBudget(q, enabled: true) }
        for (q, batch) in removed {
            let left = engine.takeBackStarts(q)
            engine.setStartBudget(q, enabled: false)
            if let batch { state.withLock { $0.unreported.append(Self.split(batch, left: left)) } }
        }
        nudge()
    }

    /// Something changed: a round soon (coalesced).
    func nudge() {
        let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
            defer { s.waiter = nil }
            if s.waiter == nil { s.nudged = true }
            return s.waiter
        }
        waiter?.resume()
    }

    /// Another node reported grants used or unused: one may be free before the time it said.
    func heardReport() {
        state.withLock { $0.askAt = [:] }
        nudge()
    }

    /// An operation's transition (the shell's delivery thread): a ready one may want a grant, a started one has
    /// used one (reported soon, which shortens its count).
    func transition(queue: String, state: OperationState) {
        guard state == .ready || state == .executing, self.state.withLock({ $0.limited[queue] != nil }) else { return }
        nudge()
    }

    /// The rounds, each after a nudge or when something falls due; returns when the task is cancelled (it then
    /// reports what it holds).
    func run() async {
        await withTaskCancellationHandler {
            while !Task.isCancelled {
                await round()
                await pause(for: due())
            }
        } onCancel: {
            nudge()
        }
        await settleEverything()
    }

    /// Until the next thing due (a batch to settle, a queue to ask for again), at most a second.
    private func due() -> Double {
        let now = monotonicSeconds()
        let due = state.withLock { s in
            (s.batches.values.map { $0.until - Self.settleAhead } + Array(s.askAt.values)).min()
        }
        return min(1, max(0.002, (due ?? .infinity) - now))
    }

    /// Returns after `seconds`, or at once on a nudge (one that came since the last round included).
    private func pause(for seconds: Double) async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                if s.nudged || Task.isCancelled {
                    s.nudged = false
                    return true
                }
                s.waiter = c
                return false
            }
            if now {
                c.resume()
                return
            }
            // A timer left over from an earlier pause only makes a round come early. A dispatch timer, not a task:
            // a task would run on the shared cooperative pool, and the rounds' own executor must not wait for it.
            DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { [self] in nudge() }
        }
        state.withLock { $0.nudged = false }
    }

    private func round() async {
        let (limited, unreported) = state.withLock { s in
            defer { s.unreported = [] }
            return (s.limited, s.unreported)
        }
        for report in unreported { await settle(report) }
        for (name, l) in limited.sorted(by: { $0.key < $1.key }) {
            guard await round(name, l) else { return }
        }
    }

    /// One queue's round; false when the store could not be asked (the next tick tries again).
    private func round(_ name: String, _ l: Limited) async -> Bool {
        let demand = engine.startDemand(l.queue)
        let now = monotonicSeconds()
        if let batch = state.withLock({ $0.batches[name] }) {
            guard demand.left == 0 || demand.wanted < demand.left || now >= batch.until - Self.settleAhead else { return true }
            // The engine starts nothing more on it from here; what it left is reported unused.
            let left = engine.takeBackStarts(l.queue)
            state.withLock { _ = $0.batches.removeValue(forKey: name) }
            await settle(Self.split(batch, left: left))
        }
        let wanted = engine.startDemand(l.queue).wanted
        guard wanted > 0 else {
            // Nothing to ask for: a time to ask again that has passed is no longer due (the tick would spin on it).
            state.withLock { s in if let at = s.askAt[name], at <= monotonicSeconds() { s.askAt[name] = nil } }
            return true
        }
        if let at = state.withLock({ $0.askAt[name] }), monotonicSeconds() < at { return true }
        let asked = monotonicSeconds()
        let grants: StartGrants
        do {
            grants = try await store.grantStarts(queue: name, node: node, wanted: wanted, limit: l.rate.operations,
                                                 seconds: l.rate.seconds, useWithin: Self.useWithin)
        } catch {
            logger.debug("cluster start grants of queue \(name) not asked for: \(error)")
            state.withLock { $0.askAt[name] = monotonicSeconds() + 0.5 }
            return false
        }
        let answered = monotonicSeconds()
        // The database's next free time on this node's monotonic clock (the round trip's midpoint as its now).
        let nextFree = grants.nextFree.map { (asked + answered) / 2 + ($0 - grants.databaseNow) }
        state.withLock { s in
            s.askAt[name] = grants.ids.count < wanted ? max(nextFree ?? answered + 0.05, answered + 0.005) : nil
            if !grants.ids.isEmpty { s.batches[name] = Batch(ids: grants.ids, until: asked + Self.useWithin) }
        }
        if grants.ids.isEmpty {
            engine.setNextFreeStart(l.queue, nextFree)
        } else {
            engine.grantStarts(l.queue, grants.ids.count, until: asked + Self.useWithin, nextFree: nextFree)
        }
        return true
    }

    /// The grants of a batch the engine used (the first ones) and did not (the `left` last ones).
    private static func split(_ batch: Batch, left: Int) -> (used: [Int64], unused: [Int64]) {
        let used = max(0, batch.ids.count - max(0, left))
        return (Array(batch.ids.prefix(used)), Array(batch.ids.dropFirst(used)))
    }

    /// Reports a settlement; when it cannot be, the grants simply count until their first end.
    private func settle(_ report: (used: [Int64], unused: [Int64])) async {
        do {
            try await store.settleStarts(node: node, used: report.used, unused: report.unused)
        } catch {
            logger.debug("cluster start grants not reported (they count until they run out): \(error)")
        }
    }

    private func settleEverything() async {
        let (batches, limited) = state.withLock { s in
            defer { s.batches = [:] }
            return (s.batches, s.limited)
        }
        for (name, batch) in batches {
            let left = limited[name].map { engine.takeBackStarts($0.queue) } ?? batch.ids.count
            await settle(Self.split(batch, left: left))
        }
    }
}
