// A database whose every table is published for logical replication (CREATE PUBLICATION … FOR ALL TABLES: a move to
// a new server or major version, change data capture). PostgreSQL refuses updates and deletes on a published table
// with no replica identity; from schema 14 opq_claimable, the one table without a primary key, has one (FULL), so
// every path that takes a job out of it — a claim, a cancel claimed, a job deleted by hand — still works.

@testable import ClusterStore
import Foundation
import Testing
import TestSupport
import TestTraits

/// A fresh database with a publication of every table (tables created later included), then migrated.
let publishedFactory: StoreFactory = {
    let server = try PostgresServer.shared.get()
    let database = try server.createDatabase()
    try server.psql(database, "CREATE PUBLICATION opq_everything FOR ALL TABLES")
    return try await makeMigratedStore(database: database)
}

@Suite("PostgresClusterStore under a publication of every table", .serialized, .onItsOwnExecutor)
struct PublishedDatabaseTests {
    @Test func releaseJobs() async throws { try await StoreConformance.releaseJobs(publishedFactory) }
    @Test func claimOrder() async throws { try await StoreConformance.claimOrder(publishedFactory) }
    @Test func heartbeatAndTakeover() async throws { try await StoreConformance.heartbeatAndTakeover(publishedFactory) }
    @Test func staleFence() async throws { try await StoreConformance.staleFence(publishedFactory) }
    @Test func cancels() async throws { try await StoreConformance.cancels(publishedFactory) }
    @Test func delayedJobs() async throws { try await StoreConformance.delayedJobs(publishedFactory) }

    /// Before schema 14 the first claim failed ("cannot delete from table opq_claimable because it does not have a
    /// replica identity"); a job cancelled as a whole and one deleted by hand leave opq_claimable too.
    @Test func everyWayOutOfTheClaimableWorks() async throws {
        let server = try PostgresServer.shared.get()
        let under = try await publishedFactory()
        defer { Task { await under.close() } }
        let store = try #require(under.store as? PostgresClusterStore)
        let database = store.url.database
        #expect(try server.psql(database, "SELECT count(*) FROM pg_publication_tables WHERE tablename = 'opq_claimable'")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == "1")
        _ = try await store.insertJobs([job("w"), job("x"), job("gone")])
        _ = try await store.requestCancel(job: "w", operation: nil, notAfter: Date().timeIntervalSince1970 + 60)
        #expect(try await store.claimCancelled(job: "w", node: "a", maxManifestBytes: 1 << 20)?.id == "w")
        try server.psql(database, "DELETE FROM opq_jobs WHERE id = 'gone'")
        let claimed = try await store.claimJobs(node: "b", limit: 10, queues: ["default"], commands: [], budget: 1 << 20,
                                                maxManifestBytes: 1 << 20)
        #expect(claimed.map(\.id) == ["x"])
        #expect(try server.psql(database, "SELECT count(*) FROM opq_claimable").trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        await under.close()
    }
}
