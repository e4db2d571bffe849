// PostgresClusterStore's connections: the password kept out of errors and read again from its file, sessions
// the server ends, and pools renewed or not yet running, each answering without a warning.

@testable import ClusterStore
import Foundation
import Logging
import PostgresNIO
import Synchronization
import Testing
import TestSupport
import TestTraits

extension PostgresClusterStoreTests {
    /// A refused login reports the server's message; the password appears nowhere.
    @Test func passwordNeverInErrors() async throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let wrong = "Wr0ng-\(UInt64.random(in: 1...UInt64.max))-pass"
        let (store, under) = try await makePostgresStore(database: database, password: wrong)
        for attempt in ["checkConnection", "migrate"] {
            do {
                if attempt == "migrate" { _ = try await store.migrate() } else { try await store.checkConnection() }
                Issue.record("\(attempt): a wrong password was accepted")
            } catch {
                let text = "\(error) \(String(describing: error)) \(String(reflecting: error))"
                #expect(text.contains("password authentication failed for user \"\(PostgresServer.role)\""), "\(attempt): \(error)")
                #expect(!text.contains(wrong), "\(attempt): the password leaked")
                #expect((error as? ClusterStoreError)?.kind == .connection)
            }
        }
        await under.close()

        // In the URL instead of a file: still not in the description.
        let inURL = try DatabaseURL("postgresql://\(PostgresServer.role):\(wrong)@127.0.0.1:\(server.port)/\(database)?sslmode=disable")
        #expect(!inURL.description.contains(wrong) && inURL.hasPassword)
        let urlStore = try PostgresClusterStore(url: inURL)
        do {
            try await urlStore.checkConnection()
            Issue.record("a wrong password in the URL was accepted")
        } catch {
            #expect(!"\(error)".contains(wrong))
            #expect("\(error)".contains("password authentication failed"))
        }
    }

    /// A password rotated by writing it into the password file (as a secrets agent does) is used from the next
    /// connection on, pools renewed included, with no restart; a file gone meanwhile fails that connection naming
    /// the file, and the store works again once it is back.
    @Test func aPasswordRotatedInItsFileIsUsedFromTheNextConnection() async throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let first = "first-\(UInt64.random(in: 1...UInt64.max))"
        let role = try server.createRole("opqrot_", password: first, connectingTo: database)
        try server.psql(database, "GRANT USAGE, CREATE ON SCHEMA public TO \(role)")
        let file = try server.passwordFile(first)
        let store = try PostgresClusterStore(url: DatabaseURL(server.url(database, user: role), passwordFile: file))
        let runner = running(store)
        defer { runner.cancel() }
        #expect(try await store.migrate() == Migrations.newest)
        try await store.registerNode(node("rot"))

        // Rotated on the server first: the file still holds the old one, and a new connection says so.
        let second = "second-\(UInt64.random(in: 1...UInt64.max))"
        try server.psql("postgres", "ALTER ROLE \(role) PASSWORD '\(second)'")
        await #expect(throws: ClusterStoreError.self) { try await store.checkConnection() }
        // Then the file, replaced whole as agents do; the role's sessions cut as a network blip would.
        try (second + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        try await store.checkConnection()
        _ = try server.psql("postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '\(role)'")
        // From a thread of its own, as the node's loop calls it (it blocks until the fresh pool runs, at most 1 s).
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            Thread {
                store.reconnect()
                done.resume()
            }.start()
        }
        // A statement that met the old pool as it was shut down fails; the node's loop retries it, and so does this.
        var beat: Heartbeat?
        let until = Date().addingTimeInterval(10)
        while beat == nil && Date() < until {
            beat = try? await store.heartbeat(node: "rot")
            if beat == nil { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(beat?.registered == true, "the renewed pool logs in with the new password")

        // The file gone: the next connection fails naming it (never the password); back, it works again.
        try FileManager.default.removeItem(atPath: file)
        do {
            try await store.checkConnection()
            Issue.record("connected without a password file")
        } catch {
            #expect("\(error)".contains("cluster.passwordFile \(file)"), "\(error)")
            #expect(!"\(error)".contains(second) && !"\(error)".contains(first))
        }
        try (second + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        try await store.checkConnection()
        runner.cancel()
        await runner.value
    }

    /// A session the server ended under a statement (a failover, a restart, `pg_terminate_backend`) fails that
    /// statement with what the server said, never with postgres-nio's generic "PSQLError – Generic description…",
    /// and with a cause that names no statement (the node logs each cause once per outage).
    @Test func anEndedSessionSaysWhatEndedIt() async throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let (store, under) = try await makePostgresStore(database: database)
        let waiting = Task(executorPreference: store.executor) { try await store.query("SELECT pg_sleep(60)", doing: "waiting on purpose") }
        var activity = ""
        let until = Date().addingTimeInterval(30)
        while !activity.contains("active|SELECT pg_sleep") && Date() < until {
            try await Task.sleep(for: .milliseconds(25))
            activity = try server.psql("postgres", "SELECT state || '|' || query FROM pg_stat_activity WHERE datname = '\(database)'")
        }
        #expect(activity.contains("active|SELECT pg_sleep"), "\(activity)")
        _ = try server.psql("postgres", "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '\(database)'")
        do {
            _ = try await waiting.value
            Issue.record("a statement on an ended session returned")
        } catch let error as ClusterStoreError {
            #expect(error.description.hasPrefix("waiting on purpose: "), "\(error)")
            #expect(error.description.contains("terminating connection due to administrator command"), "\(error)")
            #expect(!error.description.contains("Generic description") && !error.description.contains("PSQLError"), "\(error)")
            #expect(!error.cause.contains("waiting on purpose"), "the cause names no statement: \(error.cause)")
        }
        await under.close()
    }

    /// Every statement returns, though the server ends the sessions under it: postgres-nio 1.33.2 drops a statement
    /// written to a pooled connection that has just closed, and nothing ever completed it (4 statements at once
    /// after each `pg_terminate_backend`: some never returned within 3–5 rounds). Now each fails (or succeeds) at
    /// once, and the store forgets the connections that closed.
    @Test func statementsOnSessionsTheServerEndsAllReturn() async throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let (store, under) = try await makePostgresStore(database: database)
        #expect(try await store.migrate() == Migrations.newest)
        try await store.registerNode(node("ended"))
        var hung = 0, failed = 0
        for _ in 0..<40 {
            _ = try server.psql("postgres", "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '\(database)'")
            // Unstructured, each bounded: a statement that never returns must not hang the test with it.
            // What each came to: nil while it runs.
            let outcomes = (0..<4).map { _ in
                let outcome = Locked<Bool?>(nil)
                Task(executorPreference: store.executor) {
                    let returned = (try? await store.heartbeat(node: "ended")) != nil
                    outcome.withLock { $0 = returned }
                }
                return outcome
            }
            func count(_ value: Bool?) -> Int { outcomes.filter { $0.withLock { $0 } == value }.count }
            let until = Date().addingTimeInterval(3)
            while count(nil) > 0 && Date() < until { try await Task.sleep(for: .milliseconds(5)) }
            hung += count(nil)
            failed += count(false)
        }
        #expect(hung == 0, "\(hung) of 160 statements never returned (\(failed) failed)")
        try await Task.sleep(for: .milliseconds(300))
        #expect(store.inFlight.watchedConnections <= 4, "closed connections are forgotten: \(store.inFlight.watchedConnections) watched")
        await under.close()
    }

    /// A connection that closed is watched by identity until its watcher has run, 100 ms later: a connection made
    /// meanwhile at the freed one's address (a dedicated connection after another) used to share its key, and was
    /// failed with it: "registering node A: the connection closed before the statement could be sent" in a CI run
    /// where nothing closed any connection.
    @Test func aConnectionMadeAsAnotherClosesIsNotTakenForIt() async throws {
        // As every node starts: the migration on a connection of its own, closed, then the pool's first. One database
        // (the first round creates the schema, the others find it): a CREATE DATABASE a round took 200 s under CI.
        let database = try PostgresServer.shared.get().createDatabase()
        for round in 0..<20 {
            let (store, under) = try await makePostgresStore(database: database)
            do {
                _ = try await store.migrate()
                // The pool's first statement, slow as one is on a loaded machine: it outlasts the grace.
                _ = try await store.query("SELECT pg_sleep(0.2)", doing: "round \(round)")
                try await store.registerNode(node("n\(round)"))
            } catch {
                Issue.record("round \(round): \(error)")
            }
            await under.close()
        }
    }

    /// A renewed pool (ClusterStore.reconnect) answers the very next statement, and postgres-nio never warns that a
    /// pool was used before it ran: the statement that follows a renewal at once is common (the node's loop), so the
    /// renewal must have the new pool running before statements reach it. Twenty renewals, each followed at once by
    /// statements from two tasks (on the old code 6 of the 40 warned).
    @Test func aRenewedPoolAnswersAtOnceAndWarnsOfNothing() async throws {
        let server = try PostgresServer.shared.get()
        let name = try server.createDatabase()
        let url = try DatabaseURL(server.url(name), passwordFile: try server.passwordFile())
        let log = CapturedLog()
        let logger = log.logger(label: "opqueued.cluster", level: .warning)
        let store = try PostgresClusterStore(url: url, logger: logger)
        let runner = running(store)
        defer { runner.cancel() }
        _ = try await store.migrate()
        for round in 0..<20 {
            // From a thread of its own, as the node's loop calls it (it blocks until the fresh pool runs).
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                Thread {
                    store.reconnect()
                    done.resume()
                }.start()
            }
            async let first = store.suspendedQueues()
            async let second = store.nodeOwner("n\(round)")
            _ = try await (first, second)
        }
        let said = log.all.map { "\($0.level): \($0.message)" }
        #expect(!said.contains { $0.contains("run()") }, "\(said)")
    }

    /// A statement asked before the task running the pool has started (a node's loop can be that quick at start)
    /// waits for it: answered, and no postgres-nio warning that run() "hasn't been called yet" in the journal.
    @Test func aStatementBeforeThePoolRunsWaitsForItAndWarnsOfNothing() async throws {
        let server = try PostgresServer.shared.get()
        let name = try server.createDatabase()
        let url = try DatabaseURL(server.url(name), passwordFile: try server.passwordFile())
        let log = CapturedLog()
        let store = try PostgresClusterStore(url: url, logger: log.logger(label: "opqueued.cluster", level: .warning))
        _ = try await store.migrate()  // on a connection of its own, as a node's first step is
        async let asked = store.suspendedQueues()
        try await Task.sleep(for: .milliseconds(200))
        let runner = running(store)
        defer { runner.cancel() }
        #expect(try await asked == [], "answered once the pool runs")
        let said = log.all.map { "\($0.level): \($0.message)" }
        #expect(!said.contains { $0.contains("run()") }, "\(said)")
        runner.cancel()
        await runner.value
    }
}
