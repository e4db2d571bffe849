// The store conformance suite against PostgresClusterStore on a throwaway PostgreSQL (Tests/Support/
// PostgresServer.swift), logged in as a role with only the documented GRANTs, plus what only PostgreSQL has:
// migrations under the advisory lock, a newer schema refused, the password kept out of errors, commits per job,
// and the embedded SQL kept in step with the .sql files.

@testable import ClusterStore
import Foundation
import Logging
import PostgresNIO
import Synchronization
import Testing
import TestSupport
import TestTraits

/// The store's `run()` in a task of its own, started on the store's executor (an unstructured task on the shared
/// pool may wait there for seconds under a full run before `run()` moves it).
func running(_ store: PostgresClusterStore) -> Task<Void, Never> {
    Task(executorPreference: store.executor) { await store.run() }
}

func makePostgresStore(database: String? = nil, password: String? = nil) async throws -> (PostgresClusterStore, StoreUnderTest) {
    let server = try PostgresServer.shared.get()
    let name = try database ?? server.createDatabase()
    let url = try DatabaseURL(server.url(name), passwordFile: try server.passwordFile(password))
    let store = try PostgresClusterStore(url: url)
    let runner = running(store)
    return (store, StoreUnderTest(store: store, close: { runner.cancel(); await runner.value }))
}

/// A store on `database` (a fresh one when nil), migrated to the newest schema.
func makeMigratedStore(database: String? = nil) async throws -> StoreUnderTest {
    let (store, under) = try await makePostgresStore(database: database)
    do {
        #expect(try await store.migrate() == Migrations.newest)
    } catch {
        await under.close()
        throw error
    }
    return under
}

let postgresFactory: StoreFactory = { try await makeMigratedStore() }

@Suite("PostgresClusterStore conformance", .serialized, .onItsOwnExecutor)
struct PostgresConformanceTests {
    @Test func insertRenames() async throws { try await StoreConformance.insertRenames(postgresFactory) }
    @Test func idempotentSubmission() async throws { try await StoreConformance.idempotentSubmission(postgresFactory) }
    @Test func commandSignatures() async throws { try await StoreConformance.commandSignatures(postgresFactory) }
    @Test func releaseJobs() async throws { try await StoreConformance.releaseJobs(postgresFactory) }
    @Test func claimOrder() async throws { try await StoreConformance.claimOrder(postgresFactory) }
    @Test func claimBudget() async throws { try await StoreConformance.claimBudget(postgresFactory) }
    @Test func pinning() async throws { try await StoreConformance.pinning(postgresFactory) }
    @Test func concurrentClaims() async throws { try await StoreConformance.concurrentClaims(postgresFactory) }
    @Test func heartbeatAndTakeover() async throws { try await StoreConformance.heartbeatAndTakeover(postgresFactory) }
    @Test func nodeNameHeldByOneProcess() async throws { try await StoreConformance.nodeNameHeldByOneProcess(postgresFactory) }
    @Test func eachNodeIsLostAfterItsOwnLease() async throws { try await StoreConformance.eachNodeIsLostAfterItsOwnLease(postgresFactory) }
    @Test func staleFence() async throws { try await StoreConformance.staleFence(postgresFactory) }
    @Test func clusterSlots() async throws { try await StoreConformance.clusterSlots(postgresFactory) }
    @Test func slotPriority() async throws { try await StoreConformance.slotPriority(postgresFactory) }
    @Test func suspension() async throws { try await StoreConformance.suspension(postgresFactory) }
    @Test func cancels() async throws { try await StoreConformance.cancels(postgresFactory) }
    @Test func prune() async throws { try await StoreConformance.prune(postgresFactory) }
    @Test func wakeups() async throws { try await StoreConformance.wakeups(postgresFactory) }
    @Test func delayedJobs() async throws { try await StoreConformance.delayedJobs(postgresFactory) }
    @Test func skipIfExists() async throws { try await StoreConformance.skipIfExists(postgresFactory) }
    @Test func rateGrants() async throws { try await StoreConformance.rateGrants(postgresFactory) }
    @Test func racingRateGrants() async throws { try await StoreConformance.racingRateGrants(postgresFactory) }
}

@Suite("PostgresClusterStore", .serialized, .onItsOwnExecutor)
struct PostgresClusterStoreTests {
    @Test func migrationFromEmptyAndBackDown() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        defer { Task { await under.close() } }
        let database = store.url.database
        let versions: [String] = Migrations.all.map { String($0.version) }
        #expect(try server.psql(database, "SELECT to_regclass('opq_jobs') IS NULL").trimmingCharacters(in: .whitespacesAndNewlines) == "t")
        #expect(try await store.migrate() == Migrations.newest)
        #expect(try await store.migrate() == Migrations.newest, "a second migrate finds nothing to do")
        let applied = try server.psql(database, "SELECT string_agg(version::text, ',') FROM opq_schema_version")
        #expect(applied.trimmingCharacters(in: .whitespacesAndNewlines) == versions.joined(separator: ","))
        // Every migration from 6 on says which code may still run against it (what lets nodes be upgraded one by one).
        let readers = try server.psql(database, "SELECT string_agg(version::text, ',' ORDER BY version) FROM opq_schema_readers"
                                          + " WHERE oldest_reader <= version")
        let withReaders: [String] = Migrations.all.filter { $0.version >= 6 }.map { String($0.version) }
        #expect(readers.trimmingCharacters(in: .whitespacesAndNewlines) == withReaders.joined(separator: ","))
        #expect(try server.psql(database, "SELECT tableowner FROM pg_tables WHERE tablename = 'opq_jobs'").contains(PostgresServer.role))
        try await store.migrateDown(to: 0)
        #expect(try server.psql(database, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'opq\\_%'")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        #expect(try server.psql(database, "SELECT count(*) FROM pg_proc WHERE proname LIKE 'opq\\_%'")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        #expect(try await store.migrate() == Migrations.newest, "up again after down")
        await under.close()
    }

    @Test func concurrentMigratorsMakeOneSchema() async throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        var stores: [(PostgresClusterStore, StoreUnderTest)] = []
        for _ in 0..<3 { stores.append(try await makePostgresStore(database: database)) }
        let versions = try await withThrowingTaskGroup(of: Int.self) { group in
            for (store, _) in stores { group.addTask { try await store.migrate() } }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(versions == Array(repeating: Migrations.newest, count: 3))
        #expect(try server.psql(database, "SELECT count(*) FROM opq_schema_version").trimmingCharacters(in: .whitespacesAndNewlines)
                == "\(Migrations.all.count)")
        for (_, under) in stores { await under.close() }
    }

    @Test func newerSchemaRefused() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        #expect(try await store.migrate() == Migrations.newest)
        try server.psql(store.url.database, "INSERT INTO opq_schema_version (version) VALUES (\(Migrations.newest + 98))")
        do {
            _ = try await store.migrate()
            Issue.record("a schema newer than the code was accepted")
        } catch let error as ClusterStoreError {
            #expect(error.kind == .schemaTooNew)
            #expect(error.description.contains("version \(Migrations.newest + 98)"), "\(error)")
        }
        // Newer versions that say code of this version may still run against them (added only what it never
        // touches) are accepted, and changed nothing; one that needs newer code is refused, naming what it needs.
        let newer = Migrations.newest + 1
        try server.psql(store.url.database, "DELETE FROM opq_schema_version WHERE version > \(Migrations.newest); "
                        + "INSERT INTO opq_schema_version (version) VALUES (\(newer)), (\(newer + 1)); "
                        + "INSERT INTO opq_schema_readers VALUES (\(newer), \(Migrations.newest)), (\(newer + 1), \(Migrations.newest))")
        #expect(try await store.migrate() == newer + 1)
        #expect(try server.psql(store.url.database, "SELECT max(version) FROM opq_schema_version")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == "\(newer + 1)")
        try await store.registerNode(node("compatible"))
        #expect(try await store.heartbeat(node: "compatible").registered)
        try server.psql(store.url.database, "UPDATE opq_schema_readers SET oldest_reader = \(newer + 1) WHERE version = \(newer + 1)")
        await #expect { _ = try await store.migrate() } throws: {
            "\($0)".contains("needs an opqueued that knows schema \(newer + 1)") && ($0 as? ClusterStoreError)?.kind == .schemaTooNew
        }
        // A newer version that does not say (a row missing) is refused as before.
        try server.psql(store.url.database, "DELETE FROM opq_schema_readers WHERE version = \(newer + 1)")
        await #expect(throws: ClusterStoreError.self) { _ = try await store.migrate() }
        await under.close()
    }

    @Test func suspensionPersistsAcrossStores() async throws {
        let (first, under) = try await makePostgresStore()
        _ = try await first.migrate()
        try await first.setSuspended("downloads", true)
        await under.close()
        let (second, under2) = try await makePostgresStore(database: first.url.database)
        #expect(try await second.suspendedQueues() == ["downloads"])
        await under2.close()
    }

    /// Nodes silent longer than asked and holding nothing are forgotten, with their declarations; a node that still
    /// runs a job, holds a cluster slot or waits for one is kept however long silent, and so is one that beat since.
    /// One that comes back registers again.
    @Test func forgetNodesTakesOnlyTheLongSilentThatHoldNothing() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        _ = try await store.migrate()
        let database = store.url.database
        for name in ["idle", "busy", "slot", "waiter", "recent"] {
            try await store.registerNode(node(name, queues: ["default", "q-\(name)"], limits: ["api": 2]))
        }
        _ = try await store.insertJobs([job("held")])
        #expect(try await store.claimJobs(node: "busy", limit: 1, queues: ["default"], commands: [], budget: .max, maxManifestBytes: .max)
                    .count == 1)
        #expect(try await store.acquireSlots(queue: "api", limit: 2, node: "slot", count: 1, priority: 2, leaseSeconds: 60).count == 1)
        try await store.waitForSlot(queue: "api", node: "waiter", priority: 2)
        try server.psql(database, "UPDATE opq_nodes SET last_heartbeat = now() - interval '3 days' WHERE node <> 'recent'")
        try server.psql(database, "UPDATE opq_nodes SET last_heartbeat = now() - interval '1 day' WHERE node = 'recent'")

        #expect(try await store.forgetNodes(silentForSeconds: 2 * 86_400) == ["idle"])
        #expect(try await store.forgetNodes(silentForSeconds: 2 * 86_400) == [], "nothing more")
        let declared = try await store.declared()
        #expect(!declared.queues.contains("q-idle"))
        #expect(declared.queues.isSuperset(of: ["q-busy", "q-slot", "q-waiter", "q-recent"]))
        #expect(try await store.nodes(leaseSeconds: 15).map(\.node).sorted() == ["busy", "recent", "slot", "waiter"])
        // Back after all: its beat finds no row, and it registers again.
        #expect(try await store.heartbeat(node: "idle").registered == false)
        try await store.registerNode(node("idle"))
        #expect(try await store.heartbeat(node: "idle").registered)
        await under.close()
    }

    /// Commits per job for batches of inserts, claims and completions, from pg_stat_database.xact_commit.
    @Test func commitsPerJob() async throws {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        _ = try await store.migrate()
        try await store.registerNode(node("n1"))
        let database = store.url.database
        await under.close()
        try await Task.sleep(for: .milliseconds(300))
        let before = try server.commits(database)

        let (measured, under2) = try await makePostgresStore(database: database)
        let jobs = 1000
        for batch in stride(from: 0, to: jobs, by: 100) {
            _ = try await measured.insertJobs((batch..<batch + 100).map { job("m\($0)") })
        }
        var done = 0
        while done < jobs {
            let claimed = try await measured.claimJobs(node: "n1", limit: 50, queues: ["default"], commands: [], budget: .max,
                                                       maxManifestBytes: .max)
            if claimed.isEmpty { break }
            done += try await measured.completeJobs(claimed.map {
                JobCompletion(job: $0.id, fence: $0.fence, status: "succeeded", result: [])
            }).count
        }
        #expect(done == jobs)
        await under2.close()
        // Backends report their counts at exit (a loaded machine may take seconds to end one): wait up to 15 s.
        var after = try server.commits(database)
        for _ in 0..<150 where after - before < 40 {
            try await Task.sleep(for: .milliseconds(100))
            after = try server.commits(database)
        }
        let perJob = Double(after - before) / Double(jobs)
        print("commits per job (1000 jobs, inserts by 100, claims and completions by 50): \(perJob) (\(after - before) commits)")
        #expect(after - before >= 40, "the counter moved: 10 insert + 20 claim + 20 complete transactions at least")
        #expect(perJob <= 0.2)
    }

    /// Queries.generated.swift is what `make sql` makes from the .sql files.
    /// The schema owned by one role, the nodes running as another with only the grants docs/cluster.md gives for
    /// that set-up (CONNECT, USAGE on the schema, the table and sequence grants; functions are PUBLIC's to
    /// execute): the runtime role migrates (finds nothing to do), registers, inserts, claims, completes, beats,
    /// takes over, holds and frees a cluster slot, suspends, cancels and prunes.
    @Test func splitRolesWorkWithTheDocumentedGrants() async throws {
        let server = try PostgresServer.shared.get()
        let (owner, ownerUnder) = try await makePostgresStore()
        #expect(try await owner.migrate() == Migrations.newest)
        await ownerUnder.close()
        let database = owner.url.database
        let password = "run-\(UInt64.random(in: 1...UInt64.max))"
        let runtime = try server.createRole("opqrun_", password: password, connectingTo: database)
        try server.psql(database, "GRANT USAGE ON SCHEMA public TO \(runtime)")
        try server.psql(database, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO \(runtime)")
        try server.psql(database, "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO \(runtime)")
        let url = try DatabaseURL(server.url(database, user: runtime), passwordFile: try server.passwordFile(password))
        let store = try PostgresClusterStore(url: url)
        let runner = running(store)
        defer { runner.cancel() }
        #expect(try await store.migrate() == Migrations.newest, "nothing to migrate, and allowed to look")
        try await store.registerNode(node("run", limits: ["api": 1]))
        let inserted = try await store.insertJobs([job("split-a"), job("split-b")])
        #expect(inserted.map(\.id) == ["split-a", "split-b"])
        let claimed = try await store.claimJobs(node: "run", limit: 10, queues: ["default"], commands: [], budget: .max,
                                                maxManifestBytes: .max)
        #expect(claimed.map(\.id) == ["split-a", "split-b"])
        _ = try await store.heartbeat(node: "run")
        // A takeover at a beat no node is at moves nothing, but runs with every privilege it needs.
        _ = try await store.takeOverSilent(try await store.nodeBeats()
                                               .map { NodeBeat(node: $0.node, beat: $0.beat - 1, leaseSeconds: nil) })
        try await store.waitForSlot(queue: "api", node: "run", priority: 2)
        let lease = try #require(try await store.acquireSlots(queue: "api", limit: 1, node: "run", count: 1, priority: 2, leaseSeconds: 60)
                                     .first)
        #expect(try await store.keepSlots([lease], priority: 2, leaseSeconds: 60).isEmpty)
        #expect(try await store.releaseSlot(lease))
        try await store.stopWaitingForSlot(queue: "api", node: "run")
        try await store.setSuspended("default", true)
        #expect(try await store.suspendedQueues() == ["default"])
        #expect(try await store.requestCancel(job: "split-b", operation: nil, notAfter: .infinity) == .requested)
        let done = try await store.completeJobs(
            claimed.map { JobCompletion(job: $0.id, fence: $0.fence, status: "succeeded", result: [0]) })
        #expect(done == ["split-a", "split-b"])
        #expect(try await store.recordFinished(job("split-c"), id: "split-c", node: "run", status: "succeeded", result: [0]))
        #expect(try await store.job("split-c")?.state == .finished)
        #expect(try await !store.recordFinished(job("split-c"), id: "split-a", node: "run", status: "failed", result: [0]), "an id taken")
        _ = try await store.prune(olderThanSeconds: 0, batchSize: 10)
        #expect(try await store.forgetNodes(silentForSeconds: 0) == ["run"], "a node row may be deleted")
        #expect(try server.psql(database, "SELECT tableowner FROM pg_tables WHERE tablename = 'opq_jobs'").contains(PostgresServer.role),
                "the tables stay the owner's")
        runner.cancel()
        await runner.value
    }

    /// sslmode=verify-full against a server with a CA-signed certificate: with that CA the store connects, over TLS
    /// (the server says so for each of the role's connections); with another CA it refuses to talk at all, and says
    /// why. require takes TLS without checking the certificate. (The shared test server has no TLS: there,
    /// `require` refusing plain text is ClusterTests.sslModeRequireIsHonoured.)
    @Test func verifyFullChecksTheServersCertificate() async throws {
        let server = try PostgresServer(tls: true)
        let database = try server.createDatabase()
        let ca = try #require(server.tlsCA)
        let other = try PostgresServer.makeCA(in: server.folder, name: "stranger")
        func store(_ query: String) throws -> PostgresClusterStore {
            try PostgresClusterStore(url: DatabaseURL(server.url(database).replacingOccurrences(of: "sslmode=disable", with: query),
                                                      passwordFile: server.passwordFile()))
        }
        func connectedOverTLS() throws -> [String] {
            try server.psql(database, "SELECT s.ssl FROM pg_stat_ssl AS s JOIN pg_stat_activity AS a USING (pid)"
                                + " WHERE a.usename = '\(PostgresServer.role)'")
                .split(separator: "\n").map(String.init)
        }

        let verified = try store("sslmode=verify-full&sslrootcert=" + ca)
        let runner = running(verified)
        #expect(try await verified.migrate() == Migrations.newest)
        try await verified.registerNode(node("tls"))
        let overTLS = try connectedOverTLS()
        #expect(!overTLS.isEmpty && overTLS.allSatisfy { $0 == "t" }, "every connection of the role is TLS: \(overTLS)")
        runner.cancel()
        await runner.value

        let wrong = try store("sslmode=verify-full&sslrootcert=" + other)
        do {
            try await wrong.checkConnection()
            Issue.record("connected with a CA that did not sign the server's certificate")
        } catch {
            let text = "\(error)"
            #expect(text.contains("the TLS handshake failed") && text.contains("certificate"), "\(error)")
            #expect(!text.contains(".cc:"), "no source file of the TLS library in the message: \(error)")
        }
        #expect(try connectedOverTLS().isEmpty, "nothing of the role stays connected")

        let required = try store("sslmode=require")
        try await required.checkConnection()
    }

    /// A migrated store whose job tables hold what `rows` inserts, and which autovacuum leaves alone (nothing
    /// analyses them during the test but the test itself).
    private func storeHoldingRows(_ rows: String) async throws -> (PostgresServer, PostgresClusterStore, StoreUnderTest) {
        let server = try PostgresServer.shared.get()
        let (store, under) = try await makePostgresStore()
        #expect(try await store.migrate() == Migrations.newest)
        try server.psql(store.url.database, "ALTER TABLE opq_jobs SET (autovacuum_enabled = false); "
                        + "ALTER TABLE opq_live SET (autovacuum_enabled = false); ALTER TABLE opq_ended SET (autovacuum_enabled = false); "
                        + "ALTER TABLE opq_claimable SET (autovacuum_enabled = false)")
        try server.psql(store.url.database, rows)
        return (server, store, under)
    }

    /// A backlog of 30,000 waiting rows: a claim of 10 reads the claim-order index in order and stops, whatever the
    /// planner knows of the table. Never analysed (inserted at once), the bare statement's plan read every waiting
    /// row through a bitmap and sorted them (schema 3 turned bitmaps off); analysed, the planner guesses from the
    /// statistics of the array columns that one row in the table matches the node's queues, and read and sorted the
    /// whole table instead of the index (schema 7 turns that off too): a claim's cost grew with the backlog, 22 ms
    /// for 20 jobs at 20,000 waiting. Counted by the server for this transaction alone.
    @Test(arguments: [false, true])
    func aClaimReadsOnlyWhatItTakesWhateverTheStatistics(analysed: Bool) async throws {
        let (server, store, under) = try await storeHoldingRows("""
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
            SELECT 'b' || g, 'b' || g, '\\x00'::bytea, 'b.plist', 'elsewhere', 2, 2, '{default}', '{}' FROM generate_series(1, 30000) AS g;
            \(PostgresServer.waitingFromHand)
            """)
        defer { Task { await under.close() } }
        let database = store.url.database
        if analysed { try server.psql(database, "ANALYZE opq_jobs; ANALYZE opq_live; ANALYZE opq_claimable") }
        #expect(try server.psql(database, "SELECT count(*) > 0 FROM pg_stats WHERE tablename = 'opq_live'")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == (analysed ? "t" : "f"),
                "the table is \(analysed ? "" : "not ")analysed (else this test shows nothing)")
        typealias Read = (claimed: Int, indexEntries: Int64, tableScans: Int64)
        let read: Read = try await store.transaction(doing: "claiming and counting") { connection in
            var binds = PostgresBindings()
            binds.append("counter")
            binds.append(10)
            binds.append(["default"])
            binds.append([String]())
            binds.append(Int64.max)
            binds.append(Int64.max)
            let claimed = try await store.execute(connection, Queries.claimJobs, binds)
            func count(_ sql: String) async throws -> Int64 {
                try await store.execute(connection, sql).first.map { try $0.decode(Int64.self) } ?? -1
            }
            return (claimed.count, try await count("SELECT pg_stat_get_xact_tuples_returned('opq_claimable_order'::regclass)"),
                    try await count("SELECT pg_stat_get_xact_numscans('opq_live'::regclass)"
                                    + " + pg_stat_get_xact_numscans('opq_jobs'::regclass)"
                                    + " + pg_stat_get_xact_numscans('opq_claimable'::regclass)"))
        }
        #expect(read.claimed == 10)
        #expect(read.indexEntries >= 10 && read.indexEntries <= 20,
                "index entries read for a claim of 10 out of 30,000: \(read.indexEntries)")
        #expect(read.tableScans == 0, "sequential scans of the whole table for one claim: \(read.tableScans)")
        await under.close()
    }

    /// `status` on every node counts the waiting and running jobs per queue each round: over a finished history of
    /// 30,000 rows (what `keepFinishedDays` keeps), analysed, the count reads none of it (until schema 11 the history
    /// shared the jobs' table: with `state IN ('waiting', 'running')` it read the whole table each time).
    @Test func queueCountsReadNoFinishedHistory() async throws {
        let (_, store, under) = try await storeHoldingRows("""
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
            SELECT 'f' || g, 'f' || g, '\\x00'::bytea, 'f.plist', 'elsewhere', 2, 2, '{a}', '{}' FROM generate_series(1, 30000) AS g;
            INSERT INTO opq_ended (id, node, fence, finished_at) SELECT 'f' || g, 'gone', g, now() FROM generate_series(1, 30000) AS g;
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
            SELECT 'w' || g, 'w' || g, '\\x00'::bytea, 'w.plist', 'elsewhere', 2, 2, '{a,b}', '{}' FROM generate_series(1, 3) AS g;
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
            VALUES ('r1', 'r1', '\\x00'::bytea, 'r.plist', 'elsewhere', 2, 2, '{b}', '{}');
            \(PostgresServer.waitingFromHand);
            UPDATE opq_live SET state = 'running', node = 'there', fence = 1 WHERE id = 'r1';
            ANALYZE opq_jobs; ANALYZE opq_live; ANALYZE opq_ended;
            """)
        defer { Task { await under.close() } }
        let read: (counts: [String], tableScans: Int64) = try await store.transaction(doing: "counting") { connection in
            let counts = try await store.execute(connection, Queries.queueCounts).map { row in
                let c = row.makeRandomAccess()
                return "\(try c[0].decode(String.self)) \(try c[1].decode(Int.self)) \(try c[2].decode(Int.self))"
            }
            let scans = try await store.execute(connection, "SELECT pg_stat_get_xact_numscans('opq_jobs'::regclass)"
                                                + " + pg_stat_get_xact_numscans('opq_ended'::regclass)")
            return (counts, try scans.first.map { try $0.decode(Int64.self) } ?? -1)
        }
        #expect(read.counts == ["a 3 0", "b 3 1"])
        #expect(read.tableScans == 0, "sequential scans of the jobs or their history for one count: \(read.tableScans)")
        await under.close()
    }

    @Test func generatedSQLIsFresh() throws {
        let sqlFolder = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../Sources/ClusterStore/SQL").standardized.path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", sqlFolder + "/generate.py", "--stdout"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let generated = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        let committed = try Data(contentsOf: URL(fileURLWithPath: sqlFolder + "/../Queries.generated.swift"))
        #expect(generated == committed, "Queries.generated.swift is stale: run `make sql`")
    }

    @Test func databaseURLs() throws {
        let url = try DatabaseURL("postgresql://op%40q@db.example:6543/jobs?sslmode=verify-full&sslrootcert=/etc/ca.pem")
        #expect(url.user == "op@q" && url.host == "db.example" && url.port == 6543 && url.database == "jobs")
        #expect(url.sslMode == .verifyFull && url.sslRootCert == "/etc/ca.pem" && !url.hasPassword)
        #expect(try DatabaseURL("postgresql://u@[::1]/d").host == "::1")
        #expect(try DatabaseURL("postgresql://u@h/d").sslMode == .prefer)
        #expect(try DatabaseURL("postgresql://u@h/d").socketPath == nil)
        // libpq's: no user is the user this process runs as.
        let me = try #require(getpwuid(geteuid())).pointee.pw_name.map { String(cString: $0) }
        #expect(try DatabaseURL("postgresql://h/d").user == me)
        // The folder of the server's Unix-domain socket, percent-encoded as the host or as `host=` (which wins), and
        // the port in the socket's name; the description says which socket, never a password.
        let encoded = try DatabaseURL("postgresql://op:pw@%2Frun%2Fpostgresql:5433/jobs")
        #expect(encoded.host == "/run/postgresql" && encoded.socketPath == "/run/postgresql/.s.PGSQL.5433" && encoded.user == "op")
        #expect(encoded.description.contains("/run/postgresql/.s.PGSQL.5433") && !encoded.description.contains("pw"))
        let parameter = try DatabaseURL("postgresql:///jobs?host=/var/run/postgresql/&port=6000&sslmode=verify-full")
        #expect(parameter.socketPath == "/var/run/postgresql/.s.PGSQL.6000" && parameter.user == me && parameter.database == "jobs")
        #expect(try DatabaseURL("postgresql://u@db.example/d?host=/tmp/pg").socketPath == "/tmp/pg/.s.PGSQL.5432")
        #expect(try DatabaseURL("postgresql://u@/d?host=db.example&port=7").host == "db.example")
        for bad in ["mysql://u@h/d", "postgresql://u@h:99999/d", "postgresql://u@h/", "postgresql://u@h/d?sslmode=allow",
                    "postgresql://u@h/d?x=1", "postgresql:///d", "postgresql://u@/d", "postgresql://u@h/d?host=run/pg",
                    "postgresql://u@h/d?port=0", "postgresql://u@%2/d", "postgresql://u@/d?host=/tmp%00/x",
                    "postgresql://u@db%0Aexample/d", "postgresql://u%00database%00x@h/d", "postgresql://u@h/d%00x"] {
            #expect(throws: ClusterStoreError.self, "\(bad)") { try DatabaseURL(bad) }
        }
        let deep = "/" + String(repeating: "d", count: 100)
        #expect { try DatabaseURL("postgresql://u@/d?host=\(deep)") } throws: { "\($0)".contains("longer than the 107 bytes") }
        // libpq's several hosts: refused by name, not tried as one odd host name or a bad port.
        for several in ["postgresql://u@db1:5432,db2:5432/d", "postgresql://u@db1,db2/d", "postgresql://u@/d?host=db1,db2"] {
            #expect { try DatabaseURL(several) } throws: { "\($0)".contains("several hosts") }
        }
        let file = NSTemporaryDirectory() + "opq-pw-\(getpid())"
        try "s3cret\n\n".write(toFile: file, atomically: true, encoding: .utf8)
        defer { unlink(file) }
        // One trailing newline is ignored, not two.
        #expect(try DatabaseURL("postgresql://u:other@h/d", passwordFile: file).password == "s3cret\n")
        // Kept where others may read it: said (never refused: libpq refuses such a .pgpass, a node warns).
        chmod(file, 0o644)
        let exposed = try DatabaseURL("postgresql://u@h/d", passwordFile: file).passwordFileExposure()
        #expect(exposed?.contains("readable by every user of this machine (mode 644)") == true, "\(exposed ?? "nil")")
        chmod(file, 0o640)
        #expect(try DatabaseURL("postgresql://u@h/d", passwordFile: file)
                    .passwordFileExposure()?.contains("readable by its group (mode 640)") == true)
        chmod(file, 0o600)
        #expect(try DatabaseURL("postgresql://u@h/d", passwordFile: file).passwordFileExposure() == nil)
        #expect(try DatabaseURL("postgresql://u:pw@h/d").passwordFileExposure() == nil)
        // A line ending written on Windows is one too (else the login fails for a \r nobody can see).
        try "s3cret\r\n".write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try DatabaseURL("postgresql://u@h/d", passwordFile: file).password == "s3cret")
        try "s3cret\r".write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try DatabaseURL("postgresql://u@h/d", passwordFile: file).password == "s3cret\r", "a lone \r is the password's")
        #expect(throws: ClusterStoreError.self) { try DatabaseURL("postgresql://u@h/d", passwordFile: "/nonexistent/pw") }
        // A FIFO (no writer: opening it for reading would wait for one), a device without end, a folder: refused at
        // once, each saying so; the same for sslrootcert.
        let fifo = NSTemporaryDirectory() + "opq-pw-fifo-\(getpid())"
        #expect(mkfifo(fifo, 0o600) == 0)
        defer { unlink(fifo) }
        for path in [fifo, "/dev/zero", NSTemporaryDirectory()] {
            let started = Date()
            #expect { try DatabaseURL("postgresql://u@h/d", passwordFile: path) } throws: { "\($0)".contains("not a regular file") }
            #expect { try DatabaseURL("postgresql://u@h/d?sslmode=verify-full&sslrootcert=\(path)").tlsConfiguration() } throws: {
                "\($0)".contains("sslrootcert \(path): not a regular file")
            }
            #expect(Date().timeIntervalSince(started) < 2)
        }
    }
}
