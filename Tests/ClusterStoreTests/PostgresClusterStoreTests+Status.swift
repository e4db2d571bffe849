// The reads every node repeats: status reads the jobs waiting and running once (LiveGroups) where it read them three
// times (the nodes' jobs, the queues' counts, the jobs no live node can run), and what it derives must be what those
// reads gave; the poll for cancels, every second on every node, reads only the jobs that have one.

@testable import ClusterStore
import Foundation
import Testing
import TestSupport

extension PostgresClusterStoreTests {
    @Test func oneReadOfTheLiveJobsGivesWhatThreeGave() async throws {
        let (store, under) = try await makePostgresStore()
        defer { Task { await under.close() } }
        #expect(try await store.migrate() == Migrations.newest)
        try await store.registerNode(node("a", queues: ["default", "io"]))
        try await store.registerNode(node("b", queues: ["io"], commands: ["ffmpeg"]))
        _ = try await store.insertJobs((1...5).map { job("d\($0)") } + (1...3).map { job("i\($0)", queues: ["default", "io"]) }
                                       + [job("f", queues: ["io"], commands: ["ffmpeg"])])
        _ = try await store.claimJobs(node: "a", limit: 3, queues: ["default", "io"], commands: [], budget: .max, maxManifestBytes: .max)
        _ = try await store.claimJobs(node: "b", limit: 5, queues: ["io"], commands: ["ffmpeg"], budget: .max, maxManifestBytes: .max)
        func agree() async throws -> LiveSummary {
            let nodes = try await store.nodes(leaseSeconds: 60, countingJobs: false)
            #expect(nodes.allSatisfy { $0.jobs == 0 }, "not counted when not asked")
            let summary = LiveSummary(try await store.liveGroups(), nodes: nodes)
            let counted = try await store.nodes(leaseSeconds: 60)
            #expect(summary.runningByNode == Dictionary(counted.filter { $0.jobs > 0 }.map { ($0.node, $0.jobs) }) { a, _ in a })
            #expect(summary.queues == (try await store.queueCounts()))
            #expect(summary.someWaitNoLiveNodeCanRun == !(try await store.jobsNoLiveNodeCanRun(leaseSeconds: 60, limit: 10)).isEmpty)
            return summary
        }
        let first = try await agree()
        #expect(first.runningByNode == ["a": 3, "b": 1] && !first.someWaitNoLiveNodeCanRun)
        #expect(first.queues == [QueueCount(queue: "default", waiting: 5, running: 3), QueueCount(queue: "io", waiting: 3, running: 1)])
        _ = try await store.insertJobs([job("g", queues: ["gpu"]), job("split", queues: ["default"], commands: ["ffmpeg"])])
        let second = try await agree()
        #expect(second.someWaitNoLiveNodeCanRun)
        await under.close()
    }

    /// With a cancel pending and opq_cancel_requests never analysed (a table that is mostly empty), a join read every
    /// row of opq_live at each poll (a hash join: 2,000 rows here, a whole backlog in production): each request's job
    /// is now looked up by its id, with no sequential scan of opq_live, whatever the statistics say.
    @Test func thePollForCancelsReadsOnlyTheJobsThatHaveOne() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        defer { Task { await under.close() } }
        let database = store.url.database
        #expect(try await store.migrate() == Migrations.newest)
        try server.psql(database, """
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
            SELECT 'j' || g, 'j' || g, '\\x00'::bytea, 'j' || g || '.plist', 'n1', 2, 2, '{default}', '{}' FROM generate_series(1, 2000) g;
            \(PostgresServer.waitingFromHand);
            ANALYZE opq_jobs; ANALYZE opq_live; ANALYZE opq_claimable
            """)
        let claimed = try await store.claimJobs(node: "a", limit: 3, queues: ["default"], commands: [], budget: .max,
                                                maxManifestBytes: .max)
        let running = try #require(claimed.first)
        _ = try await store.requestCancel(job: running.id, operation: "x", notAfter: Date().timeIntervalSince1970 + 60)
        _ = try await store.requestCancel(job: "j2000", operation: nil, notAfter: Date().timeIntervalSince1970 + 60)
        #expect(try server.psql(database, "SELECT reltuples FROM pg_class WHERE relname = 'opq_cancel_requests'")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == "-1", "never analysed")
        let lines = try server.psql(database, """
            PREPARE pending(text) AS \(Queries.pendingCancels);
            EXECUTE pending('a');
            SELECT 'scans ' || pg_stat_get_xact_numscans('opq_live'::regclass)
            """).split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        #expect(lines.last == "scans 0", "\(lines)")
        let requests = try await store.pendingCancels(node: "a")
        #expect(requests.map(\.job) == [running.id, "j2000"] && requests.first?.fence == running.fence && requests.last?.fence == nil)
        await under.close()
    }
}
