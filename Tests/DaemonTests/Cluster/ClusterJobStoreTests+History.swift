// ClusterJobStore's history and status (SPEC §8): finished jobs pruned after keepFinishedDays, long-gone nodes
// forgotten without holding back a heartbeat, the node declared again at reload, and what status reads.

import Foundation
import Logging
import Synchronization
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel
import CShims
import OperationEngine
import PropertyList

#if canImport(Glibc)
import Glibc
#endif

extension ClusterJobStoreTests {
    /// A database with the schema (made by a node of name `a`, closed again) and these finished jobs of node `a`,
    /// each ended the given number of days ago.
    private func databaseWithFinishedJobs(_ daysAgo: [String: Int]) throws -> (PostgresServer, String) {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let first = try ClusterNode("a", server: server, database: database)
        _ = first.store.recovered([])
        #expect(eventually { first.store.snapshot()?.connected == true })
        first.close()
        let rows = daysAgo.sorted { $0.key < $1.key }.enumerated().map { i, job in
            "('\(job.key)', '\(job.key)', '\\x00', '\(job.key).plist', 'a', 2, 2, '{}', '{}', 'a', \(i + 1), 'succeeded', "
                + "now() - interval '\(job.value) days')"
        }
        if rows.isEmpty { return (server, database) }
        try server.psql(database, """
            WITH rows (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands, node, fence,
                       status, finished_at) AS (VALUES \(rows.joined(separator: ", "))),
            jobs AS (INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues,
                                           commands)
                     SELECT id, requested_id, manifest::bytea, manifest_name, submitted_on, qos_rank, priority_rank, queues::text[],
                            commands::text[] FROM rows)
            INSERT INTO opq_ended (id, node, fence, status, finished_at) SELECT id, node, fence, status, finished_at FROM rows
            """)
        return (server, database)
    }

    /// Finished rows older than keepFinishedDays (7 by default) are pruned at the first connection; younger ones stay.
    @Test func finishedHistoryIsPrunedAfterKeepFinishedDays() throws {
        let (server, database) = try databaseWithFinishedJobs(["old": 8, "young": 6])
        let again = try ClusterNode("a", server: server, database: database)
        defer { again.close() }
        _ = again.store.recovered([])
        #expect(eventually { trimmed((try? server.psql(database, "SELECT string_agg(id, ',') FROM opq_jobs")) ?? "") == "young" })
        // The line follows the commit that removed the row: wait for it too.
        #expect(eventually { again.logs.all.contains { $0.message.contains("pruned 1 finished job(s)") } })
    }

    /// With the history: a node silent for longer than keepFinishedDays (7 by default), holding nothing, is forgotten
    /// (`status` no longer lists it, its queues are no longer accepted); one silent for 3 days is down, not gone.
    @Test func nodesGoneLongerThanTheHistoryAreForgotten() throws {
        let (server, database) = try databaseWithFinishedJobs([:])
        try server.psql(database, """
            INSERT INTO opq_nodes (node, queues, commands, job_slots, last_heartbeat)
            VALUES ('gone', '{default,gpu}', '{}', 4, now() - interval '8 days'),
                   ('away', '{default,tape}', '{}', 4, now() - interval '3 days')
            """)
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually {
            trimmed((try? server.psql(database, "SELECT string_agg(node, ',' ORDER BY node) FROM opq_nodes")) ?? "") == "a,away"
        })
        #expect(eventually { a.logs.all.contains { $0.message.contains("node gone forgotten: silent for more than 7 days") } })
        #expect(eventually { a.store.snapshot()?.nodes.map(\.node).sorted() == ["a", "away"] })
    }

    /// A prune that waits — here on a lock another session holds on an old row for 5 s — holds back neither the
    /// heartbeat nor the lease: beats go on every leaseSeconds/3 meanwhile, and the row goes once the lock is let go.
    @Test func aPruneThatWaitsHoldsBackNoHeartbeat() throws {
        let (server, database) = try databaseWithFinishedJobs(["old": 8])
        let released = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            _ = try? server.psql(database, "BEGIN; SELECT id FROM opq_jobs WHERE id = 'old' FOR UPDATE; SELECT pg_sleep(5); COMMIT;")
            released.signal()
        }
        func count(_ sql: String) -> String { trimmed((try? server.psql(database, sql)) ?? "") }
        #expect(eventually {
            count("SELECT count(*) FROM pg_stat_activity"
                  + " WHERE state = 'active' AND query LIKE '%pg_sleep(5)%' AND pid <> pg_backend_pid()") == "1"
        })
        usleep(200_000)

        let a = try ClusterNode("a", server: server, database: database, leaseSeconds: 2)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually {
            count("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%DELETE FROM opq_jobs%'") == "1"
        },
                "the prune waits on the lock")
        var oldest = 0.0
        for _ in 0..<12 {
            oldest = max(oldest, Double(count("SELECT extract(epoch FROM now() - last_heartbeat) FROM opq_nodes WHERE node = 'a'")) ?? 99)
            usleep(250_000)
        }
        #expect(oldest < 1.5, "beats every 0.67 s while the prune waits; the oldest seen was \(oldest) s")
        #expect(a.store.snapshot()?.connected == true)
        #expect(!a.logs.all.contains { $0.message.contains("ran out") }, "the lease held")
        released.wait()
        #expect(eventually { count("SELECT count(*) FROM opq_jobs WHERE id = 'old'") == "0" }, "pruned once the lock is let go")
    }

    /// A reload declares the node again: a queue added to the configuration is in the database, and submission
    /// validation on another node accepts it.
    @Test func reloadDeclaresTheNodeAgain() throws {
        let (server, database, a, b) = try startedPair()
        defer { a.close(); b.close() }
        #expect(eventually { a.store.snapshot()?.connected == true })
        var reloaded = try Configuration.parse(plist(["queues": ["gpu": ["maxConcurrentOperationCount": 1]]]))
        reloaded.cluster = try Configuration.parse(plist(["cluster": ["database": server.url(database), "node": "a"]])).cluster
        a.store.reload(reloaded)
        #expect(
            eventually { ((try? server.psql(database, "SELECT 'gpu' = ANY(queues) FROM opq_nodes WHERE node = 'a'")) ?? "").contains("t") })
        let manifest = plist(sleepManifest("g", queue: "gpu"))
        #expect(eventually(10) { (try? Manifest.parse(manifest, configuration: b.store.submissionConfiguration(.builtIn)).get()) != nil },
                "b accepts a queue only a declares (after its next refresh)")
        #expect((try? Manifest.parse(manifest, configuration: .builtIn).get()) == nil)
    }

    /// Status: nodes, the waiting jobs no live node can run and why, per-queue counts.
    @Test func snapshotForStatus() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database, jobSlots: 3)
        defer { a.close() }
        _ = a.store.recovered([])
        _ = a.store.submit([try a.drop("pinned", sleepManifest("pinned", queue: "io")), try a.drop("other", sleepManifest("other"))])
        #expect(eventually { (try? a.store.job("other")) != nil })
        try server.psql(database, "UPDATE opq_live SET queues = '{gpu}' WHERE id = 'pinned'; "
                        + "UPDATE opq_claimable SET queues = '{gpu}' WHERE id = 'pinned'")
        #expect(eventually(10) { a.store.snapshot()?.unrunnable.first?.job == "pinned" })
        let snapshot = try #require(a.store.snapshot())
        #expect(snapshot.node == "a" && snapshot.connected)
        #expect(snapshot.nodes.map(\.node) == ["a"] && snapshot.nodes.first?.connected == true && snapshot.nodes.first?.freeSlots == 3)
        #expect(snapshot.unrunnable.first?.reason == "no live node declares queue gpu")
        #expect(snapshot.queues["gpu"]?.waiting == 1 && snapshot.queues["default"]?.waiting == 1)
    }

    /// The status round reads the nodes and what they declare before the waiting jobs, whose reads go through every
    /// waiting row: when those fail (a statement timeout on a huge backlog; here a column they read renamed away),
    /// `status` still lists the nodes as they are, and submissions still accept what only another node declares.
    @Test func statusListsTheNodesWhenTheBacklogCannotBeRead() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database, leaseSeconds: 3)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { a.store.snapshot()?.nodes.map(\.node) == ["a"] })
        try server.psql(database, "ALTER TABLE opq_live RENAME COLUMN queues TO queues_gone")
        let b = try ClusterNode("b", server: server, database: database, leaseSeconds: 3,
                                queues: ["gpu": ["maxConcurrentOperationCount": 1]])
        defer { b.close() }
        _ = b.store.recovered([])
        #expect(eventually { a.logs.all.contains { $0.message.contains("reading the cluster's jobs waiting and running") } },
                "the backlog's read fails")
        #expect(eventually { a.store.snapshot()?.nodes.map(\.node) == ["a", "b"] }, "b listed all the same")
        let manifest = plist(sleepManifest("g", queue: "gpu"))
        #expect(eventually { (try? Manifest.parse(manifest, configuration: a.store.submissionConfiguration(.builtIn)).get()) != nil },
                "a accepts a queue only b declares")
    }

    /// How often a node reads the status snapshot: every leaseSeconds/3, and twenty times as long as its reads of
    /// the waiting jobs last took, times the live nodes that read them too, when that is longer (0.6–0.7 s at a
    /// million waiting jobs): the nodes' reads together keep to a twentieth of a server core.
    @Test func statusReadsThinOutAsTheBacklogAndTheNodesGrow() {
        #expect(ClusterJobStore.statusPeriod(5, backlogReadsTook: 0.01, liveNodes: 1) == 5)
        #expect(ClusterJobStore.statusPeriod(5, backlogReadsTook: 0.65, liveNodes: 1) == 13)
        #expect(ClusterJobStore.statusPeriod(5, backlogReadsTook: 0.65, liveNodes: 4) == 52)
        #expect(ClusterJobStore.statusPeriod(5, backlogReadsTook: 0.05, liveNodes: 4) == 5, "a short backlog: every period")
        #expect(ClusterJobStore.statusPeriod(5, backlogReadsTook: 0.65, liveNodes: 0) == 13, "this node at least")
        #expect(ClusterJobStore.statusPeriod(1, backlogReadsTook: 0, liveNodes: 3) == 1)
    }
}
