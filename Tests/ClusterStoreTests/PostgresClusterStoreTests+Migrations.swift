// Migrations of a database with jobs in flight: schema 11 takes the jobs' states out of opq_jobs (into opq_live and
// opq_ended), so a cluster upgraded from 10 must find every waiting, delayed, running and finished job as it was;
// schema 12's claim answers as 11's did (jobs inserted by hand below 13, as code of 11 and 12 submits them).

@testable import ClusterStore
import Foundation
import Testing
import TestSupport
import TestTraits

extension PostgresClusterStoreTests {
    /// Rows written by schema 10 (a waiting job, a delayed one, one running on node a under its fence with a cancel
    /// asked, one finished): migrated to 11 each keeps its state, holder, fence and result; the running one is still
    /// a's (its beat returns it, its fence completes it), only the waiting one is claimed; and down to 10 again the
    /// state columns come back as 11 left them.
    @Test func migrationToElevenKeepsJobsInFlight() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        defer { Task { await under.close() } }
        let database = store.url.database
        #expect(try await store.migrate() == Migrations.newest)
        try await store.migrateDown(to: 10)
        @discardableResult func sql(_ statement: String) throws -> String {
            try server.psql(database, statement).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        try sql("""
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
            SELECT j, j, convert_to('<plist>' || j || '</plist>', 'UTF8'), j || '.plist', 'n1', 2, 2, '{default}', '{}'
            FROM unnest(ARRAY['w', 'd', 'r', 'f']) AS j;
            UPDATE opq_jobs SET not_before = now() + interval '1 hour' WHERE id = 'd';
            UPDATE opq_jobs SET state = 'running', node = 'a', fence = 77, claimed_at = now() WHERE id = 'r';
            UPDATE opq_jobs SET state = 'finished', node = 'b', fence = 5, from_node = 'c', status = 'succeeded',
                                result = '\\x01', finished_at = now() WHERE id = 'f';
            INSERT INTO opq_cancel_requests (job, operation) VALUES ('r', 'x');
            """)
        #expect(try await store.migrate() == Migrations.newest)

        #expect(try await store.job("w")?.state == .waiting)
        let delayed = try #require(try await store.job("d"))
        #expect(delayed.state == .waiting && delayed.notBefore != nil)
        let running = try #require(try await store.job("r"))
        #expect(running.state == .running && running.node == "a" && running.fence == 77)
        let finished = try #require(try await store.job("f"))
        #expect(finished.state == .finished && finished.node == "b" && finished.fence == 5 && finished.fromNode == "c")
        #expect(finished.status == "succeeded" && finished.result == [1] && finished.finishedAt != nil)

        #expect(try await store.registerNode(node("a")))
        #expect(try await store.heartbeat(node: "a").held == ["r": 77])
        #expect(try await store.pendingCancels(node: "a").map(\.job) == ["r"])
        let claimed = try await store.claimJobs(node: "a", limit: 10, queues: ["default"], commands: [], budget: 1 << 20,
                                                maxManifestBytes: 1 << 20)
        #expect(claimed.map(\.id) == ["w"], "the waiting job, not the delayed one")
        #expect(claimed.first?.manifest == Array("<plist>w</plist>".utf8))
        #expect(try await store.completeJobs([JobCompletion(job: "r", fence: 77, status: "succeeded", result: [2])]) == ["r"])
        #expect(try await store.finishedJobs(before: nil, since: nil, limit: 10).jobs.map(\.id).sorted() == ["f", "r"])

        try await store.migrateDown(to: 10)
        #expect(try sql("SELECT string_agg(id || ' ' || state || ' ' || coalesce(node, '-') || ' ' || coalesce(status, '-'), ','"
                        + " ORDER BY id) FROM opq_jobs") == "d waiting - -,f finished b succeeded,r finished a succeeded,w running a -")
        #expect(try sql("SELECT count(*) FROM opq_jobs WHERE state = 'waiting' AND not_before IS NOT NULL") == "1")
        #expect(try await store.migrate() == Migrations.newest, "up again")
        #expect(try await store.job("w")?.node == "a")
        await under.close()
    }

    /// Schema 12 returns a claim's rows as one query (no PL/pgSQL loop): the same rows as 11's, manifests within the
    /// budget, cancels, order; and down to 11 the loop claims again.
    @Test func claimOfTwelveAnswersAsElevensDid() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        defer { Task { await under.close() } }
        #expect(try await store.migrate() == Migrations.newest)
        func round(_ tag: String, byHand: Bool = false) async throws -> [String] {
            func sized(_ id: String, _ bytes: Int, qos: Int = 2) -> NewJob {
                var j = job(tag + id, qos: qos)
                j.manifest = Array(repeating: UInt8(ascii: "x"), count: bytes)
                return j
            }
            let jobs = [sized("a", 400), sized("b", 6000), sized("c", 400, qos: 4), sized("d", 400), sized("e", 10)]
            if byHand { try insertAsTwelve(server, store.url.database, jobs) } else { _ = try await store.insertJobs(jobs) }
            _ = try await store.requestCancel(job: tag + "d", operation: "op", notAfter: Date().timeIntervalSince1970 + 60)
            return try await store.claimJobs(node: "n1", limit: 10, queues: ["default"], commands: [], budget: 800, maxManifestBytes: 5000)
                .map { "\($0.id.dropFirst()) \($0.manifestBytes) \($0.manifest.count) \($0.cancels.map { $0 ?? "-" })" }
        }
        let expected = ["c 400 400 []", "a 400 400 []", "b 6000 0 []", "d 400 0 [\"op\"]", "e 10 0 []"]
        #expect(try await round("t") == expected)
        try await store.migrateDown(to: 11)
        #expect(try await round("e", byHand: true) == expected)
        #expect(try await store.migrate() == Migrations.newest)
        await under.close()
    }
}

/// Jobs inserted by hand as code of 11 and 12 submits them: their opq_jobs and opq_live rows (waiting), none in
/// opq_claimable (schema 13), which that code never writes.
func insertAsTwelve(_ server: PostgresServer, _ database: String, _ jobs: [NewJob]) throws {
    let rows = jobs.map { j in
        let manifest = j.manifest.map { String(format: "%02x", $0) }.joined()
        let notBefore = j.notBefore.map { "to_timestamp(\($0))" } ?? "NULL"
        let arrays = "'{\(j.queues.joined(separator: ","))}', '{\(j.commands.joined(separator: ","))}'"
        return "('\(j.requestedID)', '\(j.requestedID)', '\\x\(manifest)'::bytea, '\(j.manifestName)', '\(j.submittedOn)', "
            + "\(j.qosRank), \(j.priorityRank), \(arrays), \(notBefore))"
    }
    try server.psql(database, """
        WITH inserted AS (
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands,
                                  not_before)
            VALUES \(rows.joined(separator: ", "))
            RETURNING id, qos_rank, priority_rank, seq, queues, commands, not_before
        )
        INSERT INTO opq_live (id, qos_rank, priority_rank, seq, queues, commands, not_before) SELECT * FROM inserted
        """)
}
