// The cluster tests' fixtures: a ClusterJobStore node on its own spool with a fake shell (the delegate) that
// records what the store asks of it, node pairs on one throwaway database, and small waiting and process helpers.

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
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

/// The shell's side, recorded.
final class FakeShell: JobStoreDelegate, @unchecked Sendable {
    private let lock = NSLock()
    private var _ran: [(job: ClaimedJob, at: Double)] = []
    private var _lost: [(job: String, reason: String)] = []
    private var _forgotten: [String] = []
    private var _cancels: [(job: String, operation: String?)] = []
    private var _suspended: [Set<String>] = []
    private var _spoolFailures: [String] = []
    private var _held: Set<String> = []
    private var _stalled = 0.0

    func run(_ jobs: [ClaimedJob]) { lock.withLock { _ran += jobs.map { ($0, monotonicSeconds()) } } }
    func lost(_ jobs: [String], reason: String) { lock.withLock { _lost += jobs.map { ($0, reason) } } }
    func forgotten(_ jobs: [String], reason: String) { lock.withLock { _forgotten += jobs } }
    func cancel(job: String, operation: String?) { lock.withLock { _cancels.append((job, operation)) } }
    func suspendedQueuesChanged(_ queues: Set<String>) { lock.withLock { _suspended.append(queues) } }
    func spoolFailed(_ what: String, _ error: any Error) { lock.withLock { _spoolFailures.append("\(what): \(error)") } }
    func holds(job: String) -> Bool { lock.withLock { _held.contains(job) } }
    func spoolStalledSeconds() -> Double { lock.withLock { _stalled } }
    /// What `spoolStalledSeconds` answers (a spool that hangs).
    var stalled: Double {
        get { lock.withLock { _stalled } }
        set { lock.withLock { _stalled = newValue } }
    }
    /// Ids the shell says it still holds (a job rejected here, ending).
    var held: Set<String> {
        get { lock.withLock { _held } }
        set { lock.withLock { _held = newValue } }
    }

    var ran: [(job: ClaimedJob, at: Double)] { lock.withLock { _ran } }
    var lostJobs: [(job: String, reason: String)] { lock.withLock { _lost } }
    var forgottenJobs: [String] { lock.withLock { _forgotten } }
    var cancels: [(job: String, operation: String?)] { lock.withLock { _cancels } }
    var suspensions: [Set<String>] { lock.withLock { _suspended } }
    var spoolFailures: [String] { lock.withLock { _spoolFailures } }
}

/// Log lines, kept for the connection checks (on TestSupport's CapturedLog).
final class LogLines: Sendable {
    let captured = CapturedLog()
    var all: [(message: String, metadata: [String: String])] { captured.all.map { ($0.message, $0.fields) } }
    func states(_ event: String) -> [String] { all.filter { $0.metadata["OPQ_EVENT"] == event }.compactMap { $0.metadata["OPQ_STATE"] } }
}

final class ClusterNode: @unchecked Sendable {
    let name: String
    let folder: String
    let spool: Spool
    let store: ClusterJobStore
    let shell = FakeShell()
    let logs = LogLines()
    let deadlines = Locked<[Double?]>([])

    init(_ name: String, server: PostgresServer, database: String, user: String = PostgresServer.role, password: String? = nil,
         leaseSeconds: Double = 15, jobSlots: Int = 4, queues: [String: Any] = [:], spoolFolder: String? = nil,
         spool existing: Spool? = nil,
         maxManifestBytes: Int = ManifestLimits.maxBytes, url: String? = nil) throws {
        self.name = name
        folder = spoolFolder ?? NSTemporaryDirectory() + "opq-cluster-\(name)-\(UInt64.random(in: 1...UInt64.max))"
        spool = try existing ?? Spool(root: folder)
        var top: [String: Any] = ["cluster": ["database": url ?? server.url(database, user: user),
                                              "passwordFile": try server.passwordFile(password),
                                              "node": name, "leaseSeconds": leaseSeconds, "jobSlots": jobSlots]]
        if !queues.isEmpty { top["queues"] = queues }
        let configuration = try Configuration.parse(plist(top))
        let logger = logs.captured.logger(label: "test.\(name)", level: .debug)
        let deadlines = self.deadlines
        store = try ClusterJobStore(configuration: configuration, spool: spool, logger: logger,
                                    onLeaseDeadline: { d in deadlines.withLock { $0.append(d) } }, maxManifestBytes: maxManifestBytes)
        store.delegate = shell
    }

    /// A manifest dropped into this node's inbox and claimed from it as the shell does.
    func drop(_ name: String, _ manifest: [String: Any]) throws -> ClaimedJob {
        let path = spool.inbox + "/" + name + ".plist"
        try plist(manifest).write(to: URL(fileURLWithPath: path))
        // A read lease can be refused for a moment after the write (the kernel's view of the last writer): tried
        // again, as the daemon does on its next scan.
        var outcome = try spool.claim(name + ".plist", now: Date().timeIntervalSince1970)
        for _ in 0..<50 {
            if case .busy = outcome { usleep(100_000) } else { break }
            outcome = try spool.claim(name + ".plist", now: Date().timeIntervalSince1970)
        }
        guard case .claimed(let job) = outcome else {
            throw SupportFailure("inbox/\(name).plist was not claimed: \(outcome)")
        }
        try spool.commit()
        return job
    }

    func close() {
        store.shutdown()
        try? FileManager.default.removeItem(atPath: folder)
    }
}

/// inbox/<name> claimed for the cluster as the shell does it (a read lease can be refused for a moment after the
/// write, the kernel's view of the last writer: tried again, as the daemon does on its next scan).
func claimForSubmission(_ spool: Spool, _ name: String) throws -> ClaimedJob {
    var outcome = try spool.claimForSubmission(name, now: Date().timeIntervalSince1970, settled: true)
    for _ in 0..<50 {
        if case .busy = outcome { usleep(100_000) } else { break }
        outcome = try spool.claimForSubmission(name, now: Date().timeIntervalSince1970, settled: true)
    }
    guard case .claimed(let job) = outcome else { throw SupportFailure("inbox/\(name) was not claimed: \(outcome)") }
    return job
}

/// Nodes `a` and `b` on a database of their own, each told it recovered nothing (the caller closes them).
func startedPair(queues: [String: Any] = [:]) throws -> (server: PostgresServer, database: String, a: ClusterNode, b: ClusterNode) {
    let server = try PostgresServer.shared.get()
    let database = try server.createDatabase()
    let a = try ClusterNode("a", server: server, database: database, queues: queues)
    let b: ClusterNode
    do {
        b = try ClusterNode("b", server: server, database: database, queues: queues)
    } catch {
        a.close()
        throw error
    }
    _ = a.store.recovered([])
    _ = b.store.recovered([])
    return (server, database, a, b)
}

/// Node `b` (the suite's role: the schema is its, so it starts first), connected and told it recovered nothing, and
/// node `a` connecting as a role of its own, not yet started, which `cut` keeps from the database (no new logins, its
/// connections ended) until `restore`. The caller closes both.
struct CuttablePair {
    let server: PostgresServer
    let database: String
    let role: String
    let a: ClusterNode
    let b: ClusterNode

    init(_ rolePrefix: String, leaseSeconds: Double) throws {
        server = try PostgresServer.shared.get()
        database = try server.createDatabase()
        let password = "\(rolePrefix)-\(UInt64.random(in: 1...UInt64.max))"
        role = try server.createRole(rolePrefix, password: password, connectingTo: database, memberOf: PostgresServer.role)
        let b = try ClusterNode("b", server: server, database: database, leaseSeconds: leaseSeconds)
        self.b = b
        _ = b.store.recovered([])
        #expect(eventually { b.store.snapshot()?.connected == true })
        do {
            a = try ClusterNode("a", server: server, database: database, user: role, password: password, leaseSeconds: leaseSeconds)
        } catch {
            b.close()
            throw error
        }
    }

    func cut() throws {
        try server.psql("postgres", "ALTER ROLE \(role) NOLOGIN")
        try server.psql("postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '\(role)'")
    }

    func restore() throws { try server.psql("postgres", "ALTER ROLE \(role) LOGIN") }
}

/// Node `a` on `spool`, started with nothing to recover, that has submitted `jobs` (a `sleep 0` each) and been given
/// them to run.
func nodeThatRan(_ jobs: [String], server: PostgresServer, database: String, spool: Spool,
                 leaseSeconds: Double = 15) throws -> ClusterNode {
    let node = try ClusterNode("a", server: server, database: database, leaseSeconds: leaseSeconds, spoolFolder: spool.root, spool: spool)
    _ = node.store.recovered([])
    node.store.want(room: jobs.count, manifestBytes: .max)
    _ = node.store.submit(try jobs.map { try node.drop($0, sleepManifest($0)) })
    #expect(eventually { node.shell.ran.count == jobs.count })
    return node
}

/// A node (in a spool of its own, removed by `close`) that claimed `forgotten` and `givenAway`, after which its
/// database changed under it: `forgotten`'s row deleted (restored from an older backup), `givenAway`'s given to
/// another node under a new fence.
func nodeWhoseDatabaseChanged(forgetting forgotten: String, givingAway givenAway: String,
                              leaseSeconds: Double = 15) throws -> (ClusterNode, PostgresServer, String) {
    let server = try PostgresServer.shared.get()
    let database = try server.createDatabase()
    let spool = try Spool(root: NSTemporaryDirectory() + "opq-cluster-changed-\(UInt64.random(in: 1...UInt64.max))")
    let node = try nodeThatRan([forgotten, givenAway], server: server, database: database, spool: spool, leaseSeconds: leaseSeconds)
    try server.psql(database, "DELETE FROM opq_jobs WHERE id = '\(forgotten)'")
    try server.psql(database, "UPDATE opq_live SET node = 'other', fence = nextval('opq_fence') WHERE id = '\(givenAway)'")
    return (node, server, database)
}

/// A TCP socket listening on 127.0.0.1 at a port the kernel chose (a backlog of 64), and that port.
func loopbackListener() throws -> (Int32, UInt16) {
    let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard listener >= 0 else { throw SupportFailure("socket: errno \(errno)") }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) == 0 && getsockname(listener, $0, &length) == 0 }
    }
    guard bound, listen(listener, 64) == 0 else {
        close(listener)
        throw SupportFailure("listening on 127.0.0.1: errno \(errno)")
    }
    return (listener, UInt16(bigEndian: address.sin_port))
}

/// Polls `condition` every 10 ms for at most `seconds`.
func eventually(_ seconds: Double = 10, _ condition: () throws -> Bool) rethrows -> Bool {
    let end = monotonicSeconds() + seconds
    while monotonicSeconds() < end {
        if try condition() { return true }
        usleep(10_000)
    }
    return try condition()
}

func sleepManifest(_ job: String, seconds: Double = 0, queue: String? = nil) -> [String: Any] {
    var operation: [String: Any] = ["id": "s", "kind": "sleep", "seconds": seconds]
    if let queue { operation["queue"] = queue }
    return ["job": job, "operations": [operation]]
}

/// A value under a lock, capturable by escaping closures (Mutex is not copyable).
final class Locked<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: T
    init(_ value: T) { self.value = value }
    func withLock<R>(_ body: (inout T) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

func runTool(_ arguments: [String]) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: arguments[0])
    process.arguments = Array(arguments.dropFirst())
    try process.run()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
        throw SupportFailure("\(arguments.joined(separator: " ")) exited \(process.terminationStatus)")
    }
}

func trimmed(_ s: String) -> String { s.trimmingCharacters(in: .whitespacesAndNewlines) }
