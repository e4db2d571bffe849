// ClusterJobStore's connection to the database (SPEC §8): the connection lines over a stop and start and a long
// outage, a refused login, a transaction pooler, a role without its grants, and a URL aimed at something else.

import Foundation
import Logging
import Synchronization
import Testing
import TestSupport
@testable import Daemon
import CShims
import OperationEngine
import PropertyList
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

extension ClusterJobStoreTests {
    /// A node started while the database is down is ready at once, logs `disconnected` once per outage (with the
    /// reason, never the password), `connected` when it is back, and again over a stop and start.
    @Test func disconnectedAndConnectedOverADatabaseStopAndStart() throws {
        let server = try PostgresServer()
        defer { server.stop(); try? FileManager.default.removeItem(atPath: server.folder) }
        let database = try server.createDatabase()
        server.stop()
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        let started = monotonicSeconds()
        #expect(a.store.recovered([]).isEmpty)
        #expect(monotonicSeconds() - started < 1, "ready without the database")
        _ = a.store.submit([try a.drop("waits", sleepManifest("waits"))])
        #expect(eventually { a.logs.states("cluster") == ["disconnected"] })
        #expect(FileManager.default.fileExists(atPath: a.spool.active + "/.submissions/waits/manifest.plist"), "waits in the spool")
        // Taken before the node knew: counted, with when; nothing more is taken from the inbox now.
        #expect(a.store.awaitingSubmission == 1 && a.store.awaitingSubmissionSince != nil)
        #expect(!a.store.acceptsSubmissions, "a node that knows the database is away leaves new manifests in its inbox")
        usleep(3_000_000)
        #expect(a.logs.states("cluster") == ["disconnected"], "once per outage, though retried")
        #expect(a.store.snapshot()?.connected == false && a.store.snapshot()?.lastError != nil)

        try server.start()
        #expect(eventually(8) { a.logs.states("cluster") == ["disconnected", "connected"] }, "retried at most 5 s apart")
        #expect(eventually { (try? a.store.job("waits")) != nil }, "the waiting submission went in")
        #expect(eventually { a.store.acceptsSubmissions && a.store.awaitingSubmission == 0 && a.store.awaitingSubmissionSince == nil })
        server.stop()
        let clusterLines = {
            a.logs.all.filter { $0.metadata["OPQ_EVENT"] == "cluster" }.map { "\($0.metadata["OPQ_STATE"] ?? "-"): \($0.message)" }
        }
        #expect(eventually(20) { a.logs.states("cluster") == ["disconnected", "connected", "disconnected"] }, "\(clusterLines())")
        #expect(throws: (any Error).self) { try a.store.job("waits", timeout: 1) }
        try server.start()
        #expect(eventually(8) { a.logs.states("cluster").last == "connected" })
        let text = a.logs.all.map { "\($0.message) \($0.metadata)" }.joined(separator: "\n")
        #expect(!text.contains(server.rolePassword), "the password is never logged")
    }

    /// After a long outage (150 s: postgres-nio's pool by then tries the server only every half minute or so, on a
    /// backoff of its own) the node is connected again within 5 s of the database's return, give or take the
    /// connection (SPEC §8: retried at most 5 s apart), and statements go through at once. Without renewing the pool
    /// the node came back 10.8 s after the database here, and would up to a minute after longer outages.
    @Test func aLongOutageEndsWithin5sOfTheDatabasesReturn() throws {
        let server = try PostgresServer()
        defer { server.stop(); try? FileManager.default.removeItem(atPath: server.folder) }
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { a.logs.states("cluster") == ["connected"] })
        server.stop()
        #expect(eventually(12) { a.logs.states("cluster") == ["connected", "disconnected"] })
        usleep(150_000_000)
        try server.start()
        let back = monotonicSeconds()
        #expect(eventually(70) { a.logs.states("cluster") == ["connected", "disconnected", "connected"] })
        let took = monotonicSeconds() - back
        print("after a 150 s outage: connected again \(String(format: "%.1f", took)) s after the database's return")
        #expect(took < 8, "connected again \(took) s after the database's return")
        #expect(throws: Never.self, "a statement through the pool works") { _ = try a.store.job("nosuch", timeout: 2) }
    }

    /// A refused login logs the server's own message.
    @Test func refusedLoginLogsTheServersMessage() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database, password: "wrong-password-xyz")
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { !a.logs.states("cluster").isEmpty })
        let line = try #require(a.logs.all.first { $0.metadata["OPQ_STATE"] == "disconnected" })
        #expect(line.message.contains("password authentication failed"), "\(line.message)")
        #expect(!line.message.contains("wrong-password-xyz"))
    }

    /// Behind PgBouncer in transaction mode a node works (by its poll) and says, once, that wake-ups do not reach it:
    /// LISTEN succeeds there and nothing ever arrives, silently everywhere else. A node beside it that talks to
    /// PostgreSQL itself, and one behind PgBouncer in session mode, hear their probes and say nothing. A job pinned to
    /// the pooled node, submitted on another, still runs there.
    @Test func behindATransactionPoolerANodeSaysWakeupsDoNotReachIt() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let bouncer = try PgBouncer(server: server, database: database)
        defer { bouncer.stop() }
        let sessions = try PgBouncer(server: server, database: database, poolMode: "session")
        defer { sessions.stop() }
        let direct = try ClusterNode("direct", server: server, database: database, leaseSeconds: 3)
        let pooled = try ClusterNode("pooled", server: server, database: database, leaseSeconds: 3,
                                     queues: ["pooled-only": ["maxConcurrentOperationCount": 1]], url: bouncer.url(database))
        let session = try ClusterNode("session", server: server, database: database, leaseSeconds: 3, url: sessions.url(database))
        defer { direct.close(); pooled.close(); session.close() }
        for node in [direct, pooled, session] { _ = node.store.recovered([]) }
        let warning = "wake-ups do not reach node pooled"
        #expect(eventually(30) { pooled.logs.all.contains { $0.message.contains(warning) } })
        #expect(!pooled.store.wakeupsArrive)
        for node in [direct, session] {
            #expect(node.store.wakeupProbesHeard >= 1, "node \(node.name) heard its own probe")
            #expect(node.store.wakeupsArrive && !node.logs.all.contains { $0.message.contains("wake-ups do not reach") })
        }
        #expect(pooled.logs.all.filter { $0.message.contains(warning) }.count == 1, "said once")
        // PgBouncer refuses the startup parameter statement_timeout, in either mode: the nodes behind it connect
        // without it and say, once, how to bound abandoned statements instead; the node talking to PostgreSQL does not.
        let refused = "refuses the startup parameter statement_timeout"
        for node in [pooled, session] {
            #expect(node.logs.all.filter { $0.message.contains(refused) && $0.message.contains("ALTER ROLE") }.count == 1,
                    "node \(node.name)")
        }
        #expect(!direct.logs.all.contains { $0.message.contains(refused) })

        // Jobs still reach it, by its poll.
        pooled.store.want(room: 4, manifestBytes: .max)
        #expect(direct.store.submit([try direct.drop("pinned", sleepManifest("pinned", queue: "pooled-only"))]).isEmpty)
        #expect(eventually(10) { pooled.shell.ran.contains { $0.job.id == "pinned" } })
    }

    /// A role without the README's GRANTs is told which privileges it lacks, not only the server's words: first a
    /// role that may connect but not create in the schema, then one that may use the schema but is not the tables'
    /// owner (nor a member of the role that is). Each waits `disconnected`, retrying, and crashes nothing.
    @Test func aRoleWithoutItsGrantsIsToldWhatItLacks() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let suffix = UInt32.random(in: 1...UInt32.max)
        let (bare, stranger) = ("opqbare\(suffix)", "opqstranger\(suffix)")
        try server.psql("postgres", "CREATE ROLE \(bare) LOGIN PASSWORD 'bare-pw'; CREATE ROLE \(stranger) LOGIN PASSWORD 'stranger-pw'")
        try server.psql("postgres", "GRANT CONNECT ON DATABASE \(database) TO \(bare), \(stranger)")
        try server.psql(database, "REVOKE ALL ON SCHEMA public FROM PUBLIC; GRANT USAGE ON SCHEMA public TO \(stranger)")

        func disconnectedLine(user: String, password: String) throws -> String {
            let node = try ClusterNode("g\(user.suffix(4))", server: server, database: database, user: user, password: password)
            defer { node.close() }
            _ = node.store.recovered([])
            #expect(eventually { node.logs.all.contains { $0.metadata["OPQ_STATE"] == "disconnected" } })
            return node.logs.all.first { $0.metadata["OPQ_STATE"] == "disconnected" }?.message ?? "(none)"
        }

        // No CREATE on the schema: the tables cannot be made.
        let first = try disconnectedLine(user: bare, password: "bare-pw")
        #expect(first.contains("migrating the cluster schema"), "\(first)")
        #expect(first.contains("USAGE, CREATE on its schema"), "\(first)")

        // The tables made by the node role; another role that is no member of it may not touch them.
        let owner = try ClusterNode("owner", server: server, database: database)
        _ = owner.store.recovered([])
        #expect(eventually { owner.logs.states("cluster").contains("connected") })
        owner.close()
        let second = try disconnectedLine(user: stranger, password: "stranger-pw")
        #expect(second.contains("permission denied"), "\(second)")
        #expect(second.contains("a member of it"), "\(second)")
    }

    /// A careless user's port typo: `cluster.database` aimed at a loopback server that is not PostgreSQL — a web
    /// server answering 400 and hanging up, one answering random bytes, one announcing a 1 GiB message and then
    /// nothing, one that says yes to TLS (`sslmode=require`) and then sends bytes that are not TLS. The node says
    /// `disconnected` with the address and what went wrong (never the TLS library's source files), keeps retrying,
    /// keeps the manifest submitted meanwhile set aside in active/.submissions, and crashes nothing.
    @Test(arguments: ["http", "random", "huge", "tls"])
    func aDatabaseURLAimedAtSomethingElseLosesNothing(_ speaks: String) throws {
        let server = try PostgresServer.shared.get()
        let (listener, port) = try loopbackListener()
        let accepted = Locked(0)
        let impostor = Thread {
            var open: [Int32] = []
            while true {
                let connection = accept(listener, nil, nil)
                if connection < 0 { break }
                accepted.withLock { $0 += 1 }
                var buffer = [UInt8](repeating: 0, count: 4096)
                _ = read(connection, &buffer, buffer.count)
                let answer: [UInt8]
                switch speaks {
                case "http": answer = Array("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8)
                case "random": answer = (0..<65_536).map { _ in UInt8.random(in: 0...255) }
                case "tls":
                    // "S" to the SSLRequest, then noise for the ClientHello.
                    _ = send(connection, "S", 1, Int32(MSG_NOSIGNAL))
                    _ = read(connection, &buffer, buffer.count)
                    answer = (0..<4096).map { _ in UInt8.random(in: 0...255) }
                default: answer = [UInt8(ascii: "R"), 0x40, 0, 0, 0] + [UInt8](repeating: 0, count: 64)
                }
                _ = answer.withUnsafeBytes { send(connection, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if speaks == "http" { close(connection) } else { open.append(connection) }
            }
            for connection in open { close(connection) }
        }
        impostor.start()
        defer { shutdown(listener, Int32(SHUT_RDWR)); close(listener) }
        let node = try ClusterNode("typo", server: server, database: "typo",
                                   url: "postgresql://\(PostgresServer.role)@127.0.0.1:\(port)/typo"
                                       + "?sslmode=\(speaks == "tls" ? "require" : "disable")")
        defer { node.close() }
        _ = node.store.recovered([])
        try plist(sleepManifest("kept")).write(to: URL(fileURLWithPath: node.spool.inbox + "/kept.plist"))
        _ = node.store.submit([try claimForSubmission(node.spool, "kept.plist")])
        #expect(eventually(15) { node.logs.all.contains { $0.metadata["OPQ_STATE"] == "disconnected" } })
        let line = node.logs.all.first { $0.metadata["OPQ_STATE"] == "disconnected" }?.metadata["OPQ_ERROR"] ?? "(none)"
        #expect(line.contains("127.0.0.1:\(port)") && line.contains("is PostgreSQL listening where cluster.database points?"), "\(line)")
        #expect(!line.contains(".cc:") && !line.contains("/Sources/"), "no source file of a library: \(line)")
        if speaks == "tls" {
            #expect(line.contains("the TLS handshake failed: WRONG_VERSION_NUMBER (what answered does not speak TLS)"), "\(line)")
        }
        #expect(eventually(15) { accepted.withLock { $0 } >= 2 }, "it tries again")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: node.spool.active + "/.submissions")) ?? []).count == 1,
                "the manifest waits, set aside for the database")
    }
}
