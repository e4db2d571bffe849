// Schema 13 keeps the claimable jobs in opq_claimable, which a claim deletes from: its opq_live row is rewritten in
// place (a HOT update), and a claim reads only the rows it takes, however many jobs run (issue 45). Every way a job
// becomes claimable again, or stops being so, keeps the two tables in step.

@testable import ClusterStore
import Foundation
import Testing
import TestSupport
import TestTraits

extension PostgresClusterStoreTests {
    /// Jobs waiting, delayed and running at schema 12 are as they were at 13 (only the waiting one claimable, the
    /// running one still its node's); claims, a takeover and a hand-back rewrite opq_live rows in place, where 12 wrote
    /// each claimed row anew; a node's beat, status and takeover still find its rows without the index by node; and down
    /// to 12 the jobs left are claimed by 12's claim.
    @Test func migrationToThirteenClaimsInPlace() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        defer { Task { await under.close() } }
        let database = store.url.database
        #expect(try await store.migrate() == Migrations.newest)
        try await store.migrateDown(to: 12)
        // What 13's down must restore exactly: the indexes, opq_live's options and the functions' bodies of 12 as
        // migrations 1 to 12 make them in a database of their own.
        let catalog = """
            SELECT md5(string_agg(indexdef, ';' ORDER BY indexname)) FROM pg_indexes WHERE tablename LIKE 'opq\\_%'
            UNION ALL SELECT coalesce(array_to_string(reloptions, ','), '-') FROM pg_class WHERE relname = 'opq_live'
            UNION ALL SELECT md5(string_agg(proname || prosrc, ';' ORDER BY proname)) FROM pg_proc WHERE proname LIKE 'opq\\_%'
            """
        let fresh = try server.createDatabase()
        for migration in Migrations.all where migration.version <= 12 { try server.psql(fresh, migration.up.joined(separator: ";\n")) }
        let twelve = try server.psql(fresh, catalog)
        #expect(try await store.registerNode(node("a")))
        #expect(try await store.registerNode(node("b")))
        // A claim and its table's counts in one transaction: rows claimed, of the rows updated how many in place.
        func claim(_ count: Int, by claimer: String) throws -> String {
            try server.psql(database, """
                CREATE TEMP TABLE c AS SELECT * FROM opq_claim('\(claimer)', \(count), '{default}', '{}', 1048576, 1048576);
                SELECT (SELECT count(*) FROM c) || ' ' || pg_stat_get_xact_tuples_hot_updated('opq_live'::regclass)
                       || '/' || pg_stat_get_xact_tuples_updated('opq_live'::regclass)
                """).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        var delayed = job("d", qos: 4)
        delayed.notBefore = Date().timeIntervalSince1970 + 3600
        try insertAsTwelve(server, database, (1...6).map { job("j\($0)") } + [delayed])
        #expect(try claim(2, by: "a") == "2 0/2", "12 writes each claimed row anew")
        #expect(try await store.migrate() == Migrations.newest)
        #expect(try server.psql(database, "SELECT string_agg(id, ',' ORDER BY seq) FROM opq_claimable")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == "j3,j4,j5,j6", "the waiting jobs, not the delayed one")
        #expect(try await store.heartbeat(node: "a").held.keys.sorted() == ["j1", "j2"])
        #expect(try claim(2, by: "a") == "2 2/2", "13 in place, rows inserted before it too")

        #expect(try await store.heartbeat(node: "a").held.keys.sorted() == ["j1", "j2", "j3", "j4"])
        #expect(try await store.nodes(leaseSeconds: 60).map { "\($0.node) \($0.jobs)" } == ["a 4", "b 0"])
        #expect(try await store.queueCounts() == [QueueCount(queue: "default", waiting: 3, running: 4)])
        let held = try await store.heartbeat(node: "a").held
        #expect(try await store.releaseJobs(node: "a", ["j4": held["j4"] ?? 0]) == ["j4"])
        let silent = try await store.nodeBeats().filter { $0.node == "a" }
        let takeover = try await store.takeOverSilent(silent)
        #expect(takeover.jobs.map(\.id).sorted() == ["j1", "j2", "j3"] && takeover.nodes == ["a"])
        #expect(try await store.heartbeat(node: "a").held.isEmpty)
        #expect(try claim(4, by: "b") == "4 4/4", "handed back and taken over in place, claimed again in place")
        #expect(try await store.heartbeat(node: "b").held.keys.sorted() == ["j1", "j2", "j3", "j4"])

        // The delayed job becomes claimable when due; down to 12 the rest are claimed as 12 claims.
        try server.psql(database, "UPDATE opq_live SET not_before = now() - interval '1 second' WHERE id = 'd'")
        #expect(try claim(1, by: "b") == "1 1/2", "the due job (first in claim order) made claimable, then claimed")
        #expect(try await store.heartbeat(node: "b").held["d"] != nil)
        try await store.migrateDown(to: 12)
        #expect(try server.psql(database, catalog) == twelve, "12's indexes, options and functions")
        #expect(try claim(5, by: "b") == "2 0/2", "12's claim takes the jobs left, j5 and j6")
        #expect(try await store.migrate() == Migrations.newest, "up again")
        #expect(try claim(5, by: "b") == "0 0/0")
        await under.close()
    }

    /// A claim reads the index entries and rows it takes, not those of the jobs running (ahead of it in claim order,
    /// none of them in opq_claimable): 5 claimed among 200 waiting behind 300 running, 5 entries read of each index
    /// and 5 rows updated. The connection's plan is made at its first claim, on empty tables (the plan a node keeps).
    @Test func claimReadsOnlyWhatItTakesWithJobsRunning() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        defer { Task { await under.close() } }
        #expect(try await store.migrate() == Migrations.newest)
        let read = try server.psql(store.url.database, """
            SELECT count(*) FROM opq_claim('a', 5, '{default}', '{}', 1048576, 1048576);
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
            SELECT 'j' || g, 'j' || g, '\\x00'::bytea, 'j' || g || '.plist', 'n1', 2, 2, '{default}', '{}'
            FROM generate_series(1, 500) g;
            INSERT INTO opq_live (id, state, qos_rank, priority_rank, seq, queues, commands, node, fence)
            SELECT id, 'running', qos_rank, priority_rank, seq, queues, commands, 'ghost', seq FROM opq_jobs ORDER BY seq LIMIT 300;
            INSERT INTO opq_live (id, qos_rank, priority_rank, seq, queues, commands)
            SELECT id, qos_rank, priority_rank, seq, queues, commands FROM opq_jobs ORDER BY seq OFFSET 300;
            INSERT INTO opq_claimable (qos_rank, priority_rank, seq, id, queues, commands)
            SELECT qos_rank, priority_rank, seq, id, queues, commands FROM opq_live WHERE state = 'waiting';
            SELECT count(*) FROM opq_claim('a', 5, '{default}', '{}', 1048576, 1048576);
            SELECT pg_stat_get_xact_tuples_returned('opq_claimable_order'::regclass) || ' '
                   || pg_stat_get_xact_tuples_returned('opq_live_pkey'::regclass) || ' '
                   || pg_stat_get_xact_tuples_hot_updated('opq_live'::regclass);
            SELECT string_agg(id, ',' ORDER BY seq) FROM opq_live WHERE node = 'a'
            """).split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        #expect(read.suffix(3) == ["5", "5 5 5", "j301,j302,j303,j304,j305"], "5 claimed, 5 entries of each index read")
        await under.close()
    }

    /// A whole-job cancel claimed by its node takes the job out of opq_claimable (a claim never finds it after), a
    /// delayed one too; a job deleted by hand leaves it with its opq_live row.
    @Test func cancelledAndDeletedJobsLeaveTheClaimable() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        defer { Task { await under.close() } }
        let database = store.url.database
        #expect(try await store.migrate() == Migrations.newest)
        var delayed = job("d")
        delayed.notBefore = Date().timeIntervalSince1970 + 3600
        _ = try await store.insertJobs([job("w"), job("x"), job("gone"), delayed])
        for id in ["w", "d"] {
            _ = try await store.requestCancel(job: id, operation: nil, notAfter: Date().timeIntervalSince1970 + 60)
            #expect(try await store.claimCancelled(job: id, node: "a", maxManifestBytes: 1 << 20)?.id == id)
        }
        try server.psql(database, "DELETE FROM opq_jobs WHERE id = 'gone'")
        #expect(try server.psql(database, "SELECT string_agg(id, ',' ORDER BY seq) FROM opq_claimable")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == "x")
        let claimed = try await store.claimJobs(node: "b", limit: 10, queues: ["default"], commands: [], budget: 1 << 20,
                                                maxManifestBytes: 1 << 20)
        #expect(claimed.map(\.id) == ["x"])
        #expect(try server.psql(database, "SELECT count(*) FROM opq_live").trimmingCharacters(in: .whitespacesAndNewlines) == "3")
        await under.close()
    }
}
