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
// Trusts: the store's acquire never hands out more than the limit (one row per slot, FOR UPDATE SKIP LOCKED);
// takeover frees a lost node's slots only after its lease, and the node stops its work before that by its own
// clock (`dropAll`).

import ClusterStore
import Logging
import OperationEngine
import Synchronization

final class ClusterPermits: Sendable {
    struct Limited: Sendable {
        var queue: QueueID
        var limit: Int
    }

    private struct State {
        var limited: [String: Limited] = [:]
        var held: [String: [SlotLease]] = [:]
        var nudged = false
        /// Operations of each queue that ended since the last round: as many slots are given back even when
        /// the node could use them, so that no node keeps a queue's slots while others wait (re-acquired a
        /// moment later, competing with the others).
        var turnover: [String: Int] = [:]
        /// False while the node's lease is not known good: nothing is acquired, nothing held.
        var enabled = false
    }

    private let store: any ClusterStore
    private let node: String
    private let engine: Engine
    private let logger: Logger
    private let state = Mutex(State())
    private let nudges: AsyncStream<Void>.Continuation
    private let stream: AsyncStream<Void>

    init(store: any ClusterStore, node: String, engine: Engine, logger: Logger) {
        self.store = store
        self.node = node
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

    /// The node's lease is good (connected, registered): slots may be acquired.
    func enable() {
        state.withLock { $0.enabled = true }
        nudge()
    }

    /// The node's lease ran out or is in doubt: every limited queue stops starting work at once and the held
    /// slots are forgotten (takeover frees them once the lease has expired; the work they covered is stopped by the
    /// caller). Safe to call from any thread.
    func dropAll() {
        let queues: [QueueID] = state.withLock { s in
            s.enabled = false
            s.held = [:]
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

    /// An operation of `queue` ended (the shell calls this on its transition).
    func operationEnded(queue: String) {
        let limited = state.withLock { s -> Bool in
            guard s.limited[queue] != nil else { return false }
            s.turnover[queue, default: 0] += 1
            return true
        }
        if limited { nudge() }
    }

    /// Slots held now, by queue (status).
    var held: [String: Int] { state.withLock { s in s.held.mapValues(\.count) } }

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
        let (limited, enabled, turnover) = state.withLock { s in
            defer { s.turnover = [:] }
            return (s.limited, s.enabled, s.turnover)
        }
        guard enabled else { return }
        var again = false
        for (name, l) in limited.sorted(by: { $0.key < $1.key }) {
            var demand = engine.permitDemand(l.queue)
            var held = state.withLock { $0.held[name]?.count ?? 0 }
            if let ended = turnover[name], ended > 0, held > demand.executing {
                // Give back what the ended operations held; acquire again in the next round.
                demand.wanted = max(demand.executing, min(demand.wanted, held - ended))
                again = true
            }
            // More: acquire first, then let the engine use it.
            while held < min(demand.wanted, l.limit) {
                let lease: SlotLease?
                do {
                    lease = try await store.acquireSlot(queue: name, limit: l.limit, node: node, job: "", operation: "")
                } catch {
                    logger.debug("cluster slot of queue \(name) not acquired: \(error)")
                    return
                }
                guard let lease else { break }
                let kept = state.withLock { s -> Bool in
                    guard s.enabled else { return false }
                    s.held[name, default: []].append(lease)
                    return true
                }
                guard kept else {
                    _ = try? await store.releaseSlot(lease)
                    return
                }
                held += 1
                engine.setPermits(l.queue, held)
            }
            // Fewer: cap the engine first, then give back what no executing operation uses.
            if held > demand.wanted {
                var keep = max(demand.wanted, demand.executing)
                engine.setPermits(l.queue, keep)
                let executing = engine.permitDemand(l.queue).executing
                if executing > keep {
                    keep = executing
                    engine.setPermits(l.queue, keep)
                }
                let surplus: [SlotLease] = state.withLock { s in
                    var leases = s.held[name] ?? []
                    guard leases.count > keep else { return [] }
                    let extra = Array(leases.suffix(leases.count - keep))
                    leases.removeLast(leases.count - keep)
                    s.held[name] = leases
                    return extra
                }
                for lease in surplus { _ = try? await store.releaseSlot(lease) }
            }
        }
        if again {
            try? await Task.sleep(for: .milliseconds(10))
            nudge()
        }
    }

    private func releaseEverything() async {
        let all: [(QueueID?, [SlotLease])] = state.withLock { s in
            defer { s.held = [:] }
            return s.held.map { (s.limited[$0.key]?.queue, $0.value) }
        }
        for (queue, leases) in all {
            if let queue { engine.setPermits(queue, 0) }
            for lease in leases { _ = try? await store.releaseSlot(lease) }
        }
    }
}
