// ClusterPermits: clusterMaxConcurrentOperationCount (SPEC §8) on one node. For each queue with a cluster-wide
// limit the node holds as many of the queue's cluster slots (rows of opq_queue_slots, leased under the node's
// heartbeat, each under a fencing token) as its engine can use now, and the engine starts at most that many of
// the queue's operations (`Engine.setPermits`). So an operation executes only while its node holds a slot: the
// limit holds at every instant, across nodes, whatever the timing — a slot is acquired before the engine may use
// it and the engine is capped before a slot is given back.
//
// Demand is the engine's executing plus ready operations of the queue, within its own limit; slots beyond it are
// given back at once (a release notifies, so a waiting node acquires within a round trip). Rebalancing runs on one
// task, on every nudge (an operation of a limited queue started or ended, a slot freed elsewhere) and on a 1 s
// poll; nudges coalesce.
//
// Slots go by priority like operations do (SPEC §8): while the node waits for slots it records in the store the
// priority of the operation it would start next, and a node takes a free slot only while no live node waits ahead
// of it (a higher priority, or the same one since longer — taking a slot sends a node to the back of its
// priority, so nodes at one priority are served in turn). An ended attempt uses its permit up in the engine; the
// node then keeps the slot for its next operation unless a node waits ahead of that one (at the same priority:
// for 50 ms or more), asking the store at most every `keepWithoutAsking` while the answer is "no one".
//
// Trusts: the store's acquire never hands out more than the limit (one row per slot, FOR UPDATE SKIP LOCKED);
// takeover frees a lost node's slots only after its lease, and the node stops its work before that by its own
// clock (`dropAll`).

import ClusterStore
import Logging
import OperationEngine
import Synchronization
import SystemCalls

public final class ClusterPermits: Sendable {
    struct Limited: Sendable {
        var queue: QueueID
        var limit: Int
    }

    private struct State {
        var limited: [String: Limited] = [:]
        var held: [String: [SlotLease]] = [:]
        var nudged = false
        /// Whether the node's lease is good now (slots may be taken), and where held slots are recorded so that
        /// the node's lease covers them (ClusterJobStore). Without a gate (tests) slots are always taken.
        var gate: Gate?
        /// The waits for slots recorded in the store (queue → the priority recorded), withdrawn once the node
        /// waits no more.
        var waiting: [String: QueuePriority] = [:]
        /// When the store last said that no one waits ahead of this node for a queue's slots (monotonic
        /// seconds): within `keepWithoutAsking` of it, slots whose operations ended are kept without asking again.
        var keptAt: [String: Double] = [:]
    }

    /// How long a "no one waits ahead" answer is trusted: short operations on a limited queue then cost the
    /// database one statement per this interval instead of one per operation, and a better waiter elsewhere
    /// waits at most this long beyond the end of the running operation.
    static let keepWithoutAsking = 0.02

    struct Gate: Sendable {
        var mayAcquire: @Sendable () -> Bool
        var holding: @Sendable (SlotLease, Bool) -> Void
    }

    private let store: any ClusterStore
    private let node: String
    private let leaseSeconds: Double
    private let engine: Engine
    private let logger: Logger
    private let state = Mutex(State())
    private let nudges: AsyncStream<Void>.Continuation
    private let stream: AsyncStream<Void>

    init(store: any ClusterStore, node: String, leaseSeconds: Double, engine: Engine, logger: Logger) {
        self.store = store
        self.node = node
        self.leaseSeconds = leaseSeconds
        self.engine = engine
        self.logger = logger
        (stream, nudges) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// The queues with a cluster-wide limit (at start and at each reload). A queue no longer limited gets its
    /// permits removed (its slots are given back at the next round).
    func configure(_ limited: [String: Limited]) {
        let (removed, capped): ([QueueID], [QueueID]) = state.withLock { s in
            let gone = s.limited.filter { limited[$0.key] == nil }.map(\.value.queue)
            s.limited = limited
            return (gone, limited.filter { (s.held[$0.key] ?? []).isEmpty }.map(\.value.queue))
        }
        for q in removed { engine.setPermits(q, nil) }
        for q in capped { engine.setPermits(q, 0) }
        nudge()
    }

    /// Slots are taken only while `gate.mayAcquire()` (the node's lease is good) and recorded through
    /// `gate.holding` (so the lease deadline covers them).
    func attach(_ gate: Gate) {
        state.withLock { $0.gate = gate }
        nudge()
    }

    /// The node's lease ran out: every limited queue stops starting work at once and the held slots are forgotten
    /// (takeover frees them once the lease has expired; the work they covered is stopped by the caller). Slots are
    /// taken again once the gate says the lease is good. Safe to call from any thread.
    func dropAll() {
        let queues: [QueueID] = state.withLock { s in
            s.held = [:]
            // Recorded again once the lease is good (a takeover deletes them meanwhile).
            s.waiting = [:]
            s.keptAt = [:]
            return s.limited.values.map(\.queue)
        }
        for q in queues { engine.setPermits(q, 0) }
    }

    /// Something changed: rebalance soon (coalesced).
    func nudge() {
        let first = state.withLock { s -> Bool in
            defer { s.nudged = true }
            return !s.nudged
        }
        if first { nudges.yield() }
    }

    /// An operation's transition (the shell's delivery thread): a ready one may need a slot, an ended one gives
    /// its slot back.
    func transition(queue: String, state: OperationState) {
        switch state {
        case .ready:
            if self.state.withLock({ $0.limited[queue] != nil }) { nudge() }
        case .succeeded, .failed, .cancelled, .retrying:
            operationEnded(queue: queue)
        default:
            break
        }
    }

    /// An operation of `queue` ended (the shell calls this on its transition): its permit is used up in the
    /// engine, and the next round keeps its slot or hands it to a better waiter.
    func operationEnded(queue: String) {
        if state.withLock({ $0.limited[queue] != nil }) { nudge() }
    }

    /// Slots held now, by queue (status).
    var held: [String: Int] { state.withLock { s in s.held.mapValues(\.count) } }

    /// The waits for slots recorded in the store now (committed), by queue, with the priority recorded.
    var recordedWaits: [String: QueuePriority] { state.withLock { $0.waiting } }

    /// Each queue with a cluster-wide limit: the limit, the slots this node holds, and the priority of its wait
    /// recorded in the store, if it waits (status, metrics).
    var slots: [String: Daemon.ClusterSlots] {
        state.withLock { s in
            var slots: [String: Daemon.ClusterSlots] = [:]
            for (name, limited) in s.limited {
                slots[name] = Daemon.ClusterSlots(limit: limited.limit, held: s.held[name]?.count ?? 0, waitingAt: s.waiting[name])
            }
            return slots
        }
    }

    /// The rebalancing loop; returns when the task is cancelled (it then gives back every slot it holds).
    func run() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [self] in
                while !Task.isCancelled {
                    try? await Task.sleep(for: .seconds(1))
                    nudge()
                }
            }
            group.addTask { [self] in
                for await _ in stream {
                    state.withLock { $0.nudged = false }
                    await rebalance()
                }
            }
            await withTaskCancellationHandler {
                await group.next()
            } onCancel: {
                nudges.finish()
            }
            group.cancelAll()
        }
        await releaseEverything()
    }

    private func rebalance() async {
        let (limited, gate, published) = state.withLock { s in (s.limited, s.gate, s.waiting) }
        let mayAcquire = gate?.mayAcquire() ?? true
        // Waits recorded for queues no longer limited are withdrawn.
        for name in published.keys where limited[name] == nil {
            guard await withdraw(name) else { return }
        }
        for (name, l) in limited.sorted(by: { $0.key < $1.key }) {
            guard await rebalance(name, l, mayAcquire: mayAcquire, gate: gate, published: published[name]) else { return }
        }
    }

    /// One queue's round; false when the store could not be asked (the round ends; the next nudge or poll
    /// tries again).
    private func rebalance(_ name: String, _ l: Limited, mayAcquire: Bool, gate: Gate?, published: QueuePriority?) async -> Bool {
        let demand = engine.permitDemand(l.queue)
        let wanted = mayAcquire ? min(demand.wanted, l.limit) : 0
        let priority = Int((demand.best ?? .normal).rawValue)
        var held = state.withLock { $0.held[name] ?? [] }

        // Fewer: cap the engine first, then give back what no executing operation uses.
        if held.count > max(wanted, demand.executing) {
            let keep = max(wanted, demand.executing)
            engine.setPermits(l.queue, min(demand.permits, keep))
            let executing = engine.permitDemand(l.queue).executing
            await release(name, from: &held, keeping: max(keep, executing))
        }
        guard let handedOver = await keepIdle(name, l, held: &held, wanted: wanted, priority: priority, gate: gate) else {
            return false
        }
        // More: acquire first, then let the engine use it (not in a round that just handed slots to a better
        // waiter: it would be refused).
        if held.count < wanted && !handedOver {
            guard await acquire(name, l, held: &held, wanted: wanted, priority: priority, gate: gate) else { return false }
        }
        // Still short of slots with operations ready: the wait is recorded with the priority of the operation
        // that starts next, so that the cluster's free slots go to the best waiting operation wherever it is
        // (SPEC §8). Otherwise a recorded wait is withdrawn (the nodes it held back may take what is free).
        if held.count < wanted, let best = demand.best {
            if published != best {
                do {
                    try await store.waitForSlot(queue: name, node: node, priority: Int(best.rawValue))
                } catch {
                    logger.debug("cluster slot wait of queue \(name) not recorded: \(error)")
                    return false
                }
                state.withLock { $0.waiting[name] = best }
            }
        } else if published != nil {
            return await withdraw(name)
        }
        return true
    }

    /// Slots whose operations ended (their permits are used up in the engine) and that the node could use
    /// again: kept unless a better waiter elsewhere gets them. Whether some were handed over; nil when the store
    /// could not be asked or the node's lease ran out (the round ends).
    private func keepIdle(_ name: String, _ l: Limited, held: inout [SlotLease], wanted: Int, priority: Int,
                          gate: Gate?) async -> Bool? {
        let granted = engine.permitDemand(l.queue).permits
        let idle = Array(held.dropFirst(granted).prefix(max(0, wanted - granted)))
        if idle.isEmpty { return false }
        var freed: [SlotLease] = []
        let askedAt = monotonicSeconds()
        if let kept = state.withLock({ $0.keptAt[name] }), askedAt - kept < Self.keepWithoutAsking {
            // Asked a moment ago: kept.
        } else {
            do {
                freed = try await store.keepSlots(idle, priority: priority, leaseSeconds: leaseSeconds)
            } catch {
                logger.debug("cluster slots of queue \(name) not kept: \(error)")
                return nil
            }
            state.withLock { $0.keptAt[name] = freed.isEmpty ? askedAt : nil }
        }
        if !freed.isEmpty {
            held.removeAll { freed.contains($0) }
            for lease in freed { gate?.holding(lease, false) }
            state.withLock { $0.held[name]?.removeAll { freed.contains($0) } }
        }
        guard gate?.mayAcquire() ?? true else { return nil }
        engine.setPermits(l.queue, min(held.count, wanted))
        return !freed.isEmpty
    }

    /// Acquires the slots `held` lacks for `wanted`, then lets the engine use them; false when the store could not
    /// be asked or the node's lease ran out meanwhile (the round ends).
    private func acquire(_ name: String, _ l: Limited, held: inout [SlotLease], wanted: Int, priority: Int,
                         gate: Gate?) async -> Bool {
        let leases: [SlotLease]
        do {
            leases = try await store.acquireSlots(queue: name, limit: l.limit, node: node, count: wanted - held.count,
                                                  priority: priority, leaseSeconds: leaseSeconds)
        } catch {
            logger.debug("cluster slots of queue \(name) not acquired: \(error)")
            return false
        }
        for lease in leases { gate?.holding(lease, true) }
        guard gate?.mayAcquire() ?? true else {
            // The lease ran out meanwhile: these slots are not used.
            await giveBack(leases, gate: gate)
            return false
        }
        if !leases.isEmpty {
            held += leases
            state.withLock { $0.held[name, default: []].append(contentsOf: leases) }
            engine.setPermits(l.queue, held.count)
        }
        return true
    }

    /// Gives back the leases of `name` beyond the first `keeping` (the engine is capped already).
    private func release(_ name: String, from held: inout [SlotLease], keeping: Int) async {
        guard held.count > keeping else { return }
        let surplus = Array(held.suffix(held.count - keeping))
        held.removeLast(held.count - keeping)
        let gate = state.withLock { s in
            s.held[name]?.removeAll { surplus.contains($0) }
            return s.gate
        }
        await giveBack(surplus, gate: gate)
    }

    /// Frees leases the node no longer counts as held (no longer covered by its lease deadline either).
    private func giveBack(_ leases: [SlotLease], gate: Gate?) async {
        for lease in leases {
            gate?.holding(lease, false)
            _ = try? await store.releaseSlot(lease)
        }
    }

    /// Withdraws the node's recorded wait for a slot of `name`; false when the store could not be asked.
    private func withdraw(_ name: String) async -> Bool {
        do {
            try await store.stopWaitingForSlot(queue: name, node: node)
        } catch {
            logger.debug("cluster slot wait of queue \(name) not withdrawn: \(error)")
            return false
        }
        state.withLock { _ = $0.waiting.removeValue(forKey: name) }
        return true
    }

    private func releaseEverything() async {
        let (all, gate, waiting): ([(QueueID?, [SlotLease])], Gate?, [String]) = state.withLock { s in
            defer { s.held = [:] }
            return (s.held.map { (s.limited[$0.key]?.queue, $0.value) }, s.gate, Array(s.waiting.keys))
        }
        for name in waiting { _ = await withdraw(name) }
        for (queue, leases) in all {
            if let queue { engine.setPermits(queue, 0) }
            await giveBack(leases, gate: gate)
        }
    }
}
