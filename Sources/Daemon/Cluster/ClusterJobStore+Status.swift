// ClusterJobStore's two slow readers, each on a thread of its own so that neither holds back beats or claims: the
// status thread (what `status` shows, what the cluster declares, the wake-up probes) and the prune thread (the
// finished history past keepFinishedDays, and nodes gone for good).

import JobModel
import ClusterStore
import Foundation
import Logging
import SystemCalls

extension ClusterJobStore {
    // MARK: the status thread

    func wantStatus() { statusWake.signal() }

    /// Reads the snapshot every leaseSeconds/3 — less often while its reads of the waiting jobs take long
    /// (`statusPeriod`) — and at once when asked (a node registered, this one connected); a failed read is tried
    /// again at the next period (the loop reports the connection's state). Between reads it sends and judges the
    /// wake-up probes (`WakeupProbe`).
    func statusLoop() {
        let period = max(0.2, settings.leaseSeconds / 3)
        var nextRefresh = 0.0
        while !lock.withLock({ stopped }) {
            guard lock.withLock({ hasConnected }) else {
                statusWake.wait(upTo: period)
                continue
            }
            if monotonicSeconds() >= nextRefresh {
                var read = (took: 0.0, liveNodes: 1)
                do {
                    read = try refreshSnapshot()
                } catch {
                    logger.debug("cluster: the status snapshot was not refreshed: \(error)")
                }
                nextRefresh = monotonicSeconds() + Self.statusPeriod(period, backlogReadsTook: read.took, liveNodes: read.liveNodes)
            }
            probeWakeups()
            let next = min(nextRefresh, lock.withLock { probe.nextEvent() } ?? .infinity)
            // Asked (wantStatus) or not, a refresh at least every period.
            if statusWake.wait(upTo: max(0.02, next - monotonicSeconds())) { nextRefresh = 0 }
        }
    }

    /// On the status thread: judges the last probe, and sends the next one when it is due (WakeupProbe).
    private func probeWakeups() {
        report(lock.withLock { probe.check(now: monotonicSeconds()) })
        let token = "\(nodeName)/\(UInt64.random(in: 1...UInt64.max))"
        // Recorded before it goes: the listener may hear it before the statement returns.
        let due = lock.withLock { () -> Bool in
            let now = monotonicSeconds()
            guard probe.due(now: now) else { return false }
            probe.sent(token, now: now)
            return true
        }
        guard due else { return }
        do {
            try waitBounded(Self.statementTimeout, on: executor, doing: "probing wake-ups", { [store] in
                try await store.probeWakeups(token)
            })
        } catch {
            lock.withLock { probe.notSent(now: monotonicSeconds()) }
        }
    }

    func report(_ verdict: WakeupProbe.Verdict?) {
        switch verdict {
        case .notArriving?:
            logger.warning("""
                cluster: wake-ups do not reach node \(nodeName): its listening connection did not hear the notifications it sent itself \
                (\(WakeupProbe.misses) in a row, \(formatSeconds(WakeupProbe.wait)) s each). \
                Is a connection pooler in transaction or statement mode (PgBouncer's usual setting) \
                between the node and PostgreSQL? Jobs, cancels and suspensions now reach this node by its poll, \
                about a second late, instead of within 100 ms: \
                point cluster.database at PostgreSQL itself or at a pool in session mode
                """)
        case .arriving?:
            logger.notice("cluster: wake-ups reach node \(nodeName) again")
        case nil:
            break
        }
    }

    /// Whether wake-ups (LISTEN/NOTIFY) are known to reach this node: false once two probes in a row went unheard.
    var wakeupsArrive: Bool { lock.withLock { probe.verdict == .arriving } }

    /// How many of this node's probes came back to it.
    var wakeupProbesHeard: Int { lock.withLock { probe.heardCount } }

    /// How long until the next status read, `period` (leaseSeconds/3) at least: the reads of what waits in the
    /// database (the jobs no live node can run, the counts per queue) go through every waiting row, so a backlog of
    /// a million jobs makes them take 0.6–0.7 s (2 cores). Every live node reads them, so each reads at most a
    /// twentieth of the time divided among them (`status` shows the cluster's queues as of a read up to that much
    /// older): all the nodes' reads together keep to a twentieth of a server core however long the backlog and
    /// however many the nodes.
    static func statusPeriod(_ period: Double, backlogReadsTook took: Double, liveNodes: Int) -> Double {
        max(period, took * 20 * Double(max(1, liveNodes)))
    }

    /// Reads what `status` shows and what submissions check against. The nodes and what they declare first, kept
    /// even when the reads of the waiting jobs after them fail (a statement timeout on a huge backlog); returns
    /// how long those took, failed or not (a read given up on may still run on the server), and how many nodes live.
    private func refreshSnapshot() throws -> (took: Double, liveNodes: Int) {
        let lease = settings.leaseSeconds
        let nodes = try waitBounded(Self.statementTimeout, on: executor, doing: "listing the cluster's nodes", { [store] in
            try await store.nodes(leaseSeconds: lease, countingJobs: false)
        })
        let declared = try waitBounded(Self.statementTimeout, on: executor, doing: "reading what nodes declare", { [store] in
            try await store.declared()
        })
        lock.withLock {
            self.declared = declared
            declaredKnown = true
            // The jobs each node runs come with the read of the backlog below; until it answers, the last read's.
            let known = Dictionary(snapshotValue.nodes.map { ($0.node, $0.jobs) }, uniquingKeysWith: { first, _ in first })
            snapshotValue.nodes = nodes.map { Self.snapshotNode($0, jobs: known[$0.node] ?? 0) }
        }
        let started = monotonicSeconds()
        do {
            // One read of every job waiting and running; the jobs no live node can run are read only when there are some.
            let groups = try waitBounded(Self.statementTimeout, on: executor, doing: "reading the cluster's jobs waiting and running", {
                [store] in try await store.liveGroups()
            })
            let summary = LiveSummary(groups, nodes: nodes)
            let unrunnable = summary.someWaitNoLiveNodeCanRun ? try waitBounded(Self.statementTimeout, on: executor,
                                                                                doing: "finding jobs no live node can run", { [store] in
                try await store.jobsNoLiveNodeCanRun(leaseSeconds: lease, limit: 100)
            }) : []
            lock.withLock {
                snapshotValue.nodes = nodes.map { Self.snapshotNode($0, jobs: summary.runningByNode[$0.node] ?? 0) }
                snapshotValue.unrunnable = unrunnable.map(ClusterSnapshot.Waiting.init)
                snapshotValue.queues = Dictionary(summary.queues.map {
                    ($0.queue, ClusterSnapshot.QueueCounts(waiting: $0.waiting, running: $0.running))
                }, uniquingKeysWith: { first, _ in first })
                snapshotValue.refreshedAt = monotonicSeconds()
            }
        } catch {
            logger.debug("cluster: the waiting jobs were not read for status: \(error)")
        }
        return (monotonicSeconds() - started, nodes.filter(\.connected).count)
    }

    private static func snapshotNode(_ status: NodeStatus, jobs: Int) -> ClusterSnapshot.Node {
        var status = status
        status.jobs = jobs
        return .init(node: status.node, connected: status.connected, lastHeartbeat: status.lastHeartbeat, jobs: jobs,
                     freeSlots: status.freeSlots, schema: status.schema)
    }

    // MARK: the prune thread

    /// Every pruneEverySeconds, the first soon after the first connection: the finished history older than
    /// keepFinishedDays goes, in batches (SPEC §8). On a thread of its own: pruning a long history, or waiting on a
    /// lock someone holds on an old row, holds back neither the heartbeat nor claims. A failed round (the database
    /// away) is tried again a minute later.
    func pruneLoop() {
        var next = 0.0
        while !lock.withLock({ stopped }) {
            let connected = lock.withLock { hasConnected }
            if connected && monotonicSeconds() >= next {
                do {
                    try prune()
                    next = monotonicSeconds() + Self.pruneEverySeconds
                } catch {
                    logger.debug("cluster: finished jobs were not pruned now: \(error)")
                    next = monotonicSeconds() + 60
                }
            }
            pruneWake.wait(upTo: connected ? max(0.05, next - monotonicSeconds()) : 1)
        }
    }

    private func prune() throws {
        let seconds = settings.keepFinishedDays * 86_400
        let report = try waitBounded(Self.statementTimeout * 12, on: executor, doing: "pruning finished jobs", { [store] in
            try await store.prune(olderThanSeconds: seconds, batchSize: Self.pruneBatch)
        })
        if report.deleted > 0 {
            logger.info("""
                cluster: pruned \(report.deleted) finished job(s) older than \(formatSeconds(settings.keepFinishedDays)) days \
                in \(report.batches) batch(es)
                """)
        }
        // Nodes gone for good (renamed, replaced, scaled away): their rows would be listed by `status` forever and
        // their queues and commands accepted at submission though no node will come to run them.
        let days = max(settings.keepFinishedDays, Self.forgetNodesAfterDaysAtLeast)
        let forgotten = try waitBounded(Self.statementTimeout, on: executor, doing: "forgetting nodes long silent", { [store] in
            try await store.forgetNodes(silentForSeconds: days * 86_400)
        })
        for node in forgotten {
            logger.notice("""
                cluster: node \(node) forgotten: silent for more than \(formatSeconds(days)) days and holding nothing; \
                the queues and commands only it declared are no longer accepted (it registers again if it comes back)
                """)
        }
        if !forgotten.isEmpty { wantStatus() }
    }
}
