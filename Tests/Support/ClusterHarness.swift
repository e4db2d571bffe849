// A cluster on one machine for the tests, the cluster campaign and the benchmark (SPEC §8): one throwaway
// PostgreSQL (PostgresServer), a node role holding only the GRANTs the README documents, a password file, and N
// real `.build/debug/opqueued` processes, each with its own spool, configuration and control socket.
//
// Helpers: drop a manifest into node k's inbox, wait for an outbox entry on any node (and say which), read
// result.plist, read the journal filtered by OPQ_NODE / OPQ_JOB / OPQ_STATE, kill -9 / SIGSTOP / SIGCONT / restart a
// node, stop and start the database, run `opqueuectl` against node k.
//
// Trusts: the binaries under .build/debug (or OPQ_BINARIES), Debian's PostgreSQL 15, a journald (`ensureJournald`).
// It trusts nothing the daemons write: outboxes and journal entries are read as data, and every wait is bounded.

import ControlPlane
import Daemon
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The repository's root (Tests/Support/../..).
public let repositoryFolder = URL(fileURLWithPath: supportFolder).deletingLastPathComponent().deletingLastPathComponent().path

/// Where opqueued and opqueuectl are: OPQ_BINARIES, else .build/debug.
public var binariesFolder: String {
    ProcessInfo.processInfo.environment["OPQ_BINARIES"] ?? repositoryFolder + "/.build/debug"
}

/// The end of a program run to completion.
public struct ProgramResult: Sendable {
    public let status: Int32
    public let stdout: String
    public let stderr: String
}

/// Runs a program to its end, at most `timeout` seconds (then SIGKILL). Output goes through files, so a child that
/// leaves a grandchild holding them cannot hang the caller.
@discardableResult
public func runProgram(_ program: String, _ arguments: [String], environment: [String: String] = [:],
                       timeout: Double = 30) throws -> ProgramResult {
    let base = NSTemporaryDirectory() + "opq-run-\(getpid())-\(UInt64.random(in: 1...UInt64.max))"
    defer { unlink(base + ".out"); unlink(base + ".err") }
    _ = FileManager.default.createFile(atPath: base + ".out", contents: nil)
    _ = FileManager.default.createFile(atPath: base + ".err", contents: nil)
    let process = Process()
    process.executableURL = URL(fileURLWithPath: program.hasPrefix("/") ? program : binariesFolder + "/" + program)
    process.arguments = arguments
    if !environment.isEmpty { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
    process.standardInput = FileHandle.nullDevice
    process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: base + ".out"))
    process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: base + ".err"))
    try process.run()
    let deadline = Date().addingTimeInterval(timeout)
    while process.isRunning && Date() < deadline { usleep(5_000) }
    if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    process.waitUntilExit()
    let out = (try? String(contentsOfFile: base + ".out", encoding: .utf8)) ?? ""
    let err = (try? String(contentsOfFile: base + ".err", encoding: .utf8)) ?? ""
    return ProgramResult(status: process.terminationStatus, stdout: out, stderr: err)
}

/// Polls `condition` every 20 ms until it returns a value or `timeout` seconds pass.
public func pollUntil<T>(_ timeout: Double, _ condition: () throws -> T?) rethrows -> T? {
    let deadline = Date().addingTimeInterval(timeout)
    repeat {
        if let value = try condition() { return value }
        usleep(20_000)
    } while Date() < deadline
    return try condition()
}

/// An XML property list of `object` (manifests and configurations).
public func propertyListData(_ object: Any) throws -> Data {
    try PropertyListSerialization.data(fromPropertyList: object, format: .xml, options: 0)
}

/// A `sleep` operation (SPEC §3.3), optionally on a queue.
public func sleepOperation(_ id: String, _ seconds: Double, queue: String? = nil, dependencies: [String] = []) -> [String: Any] {
    var operation: [String: Any] = ["id": id, "kind": "sleep", "seconds": seconds, "dependencies": dependencies]
    if let queue { operation["queue"] = queue }
    return operation
}

/// One opqueued of the cluster: its spool, configuration, output log and (while started) process.
public final class ClusterNode: @unchecked Sendable {
    public let index: Int
    /// `cluster.node`: unique per harness, so journal reads never see another run's nodes.
    public let name: String
    public let spool: String
    public var configPath: String { spool + ".config.plist" }
    /// The daemon's stdout and stderr, appended across restarts.
    public var logPath: String { spool + ".log" }
    public var socketPath: String { spool + "/opqueued.sock" }
    /// The configuration written at each start (the harness adds `cluster`); change it, then `restart`.
    public var settings: [String: Any]
    public var logTarget: String
    /// Variables added to the daemon's environment at each start.
    public var environment: [String: String] = [:]
    public private(set) var process: Process?

    init(index: Int, name: String, spool: String, settings: [String: Any], logTarget: String) {
        self.index = index
        self.name = name
        self.spool = spool
        self.settings = settings
        self.logTarget = logTarget
    }

    public var pid: Int32? { process.map { $0.processIdentifier } }
    public var isRunning: Bool { process?.isRunning ?? false }

    /// Starts the daemon without waiting for it. Refused while the node's last process still runs: its handle would
    /// be lost, and with it the process (nothing would stop it when the harness ends).
    public func launch() throws {
        if let process, process.isRunning {
            throw SupportFailure("node \(name) is launched again while its process \(process.processIdentifier) still runs")
        }
        try FileManager.default.createDirectory(atPath: spool + "/inbox", withIntermediateDirectories: true)
        try propertyListData(settings).write(to: URL(fileURLWithPath: configPath))
        if !FileManager.default.fileExists(atPath: logPath) { _ = FileManager.default.createFile(atPath: logPath, contents: nil) }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binariesFolder + "/opqueued")
        process.arguments = ["--spool", spool, "--config", configPath, "--log-target", logTarget]
        if !environment.isEmpty { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = log
        process.standardError = log
        try process.run()
        self.process = process
    }

    /// True once the control socket answers `status` (SPEC §1: the daemon is ready).
    public var isReady: Bool {
        isRunning && (try? ControlClient.request(socketPath, ["command": "status"], timeout: 2)) != nil
    }

    /// Starts the daemon and waits until it is ready; throws (with the end of its log) if it is not in `timeout`.
    public func start(timeout: Double = 30) throws {
        try launch()
        try waitReady(timeout: timeout)
    }

    /// Waits until the daemon is ready; throws at once (with the end of its log) if it exits first.
    public func waitReady(timeout: Double = 30) throws {
        let ready = try pollUntil(timeout) { () -> Bool? in
            if isReady { return true }
            if let process, !process.isRunning {
                throw SupportFailure(
                    "node \(name) exited with status \(process.terminationStatus) before it was ready; its log ends:\n\(logTail())")
            }
            return nil
        }
        guard ready != nil else {
            throw SupportFailure("node \(name) did not become ready in \(timeout) s (running: \(isRunning)); its log ends:\n\(logTail())")
        }
    }

    /// Waits until the node says (its gauges) that it has joined the cluster and read its nodes once: ready is
    /// earlier (a node serves its socket before it reaches the database), and until it knows what the cluster's
    /// nodes declare, manifests wait in its inbox rather than being set aside for the cluster.
    public func waitConnected(timeout: Double = 30) -> Bool {
        (try? pollUntil(timeout) { () -> Bool? in
            let metrics = try ctl(["metrics"])
            guard metrics.status == 0, let scrape = try? Scrape.parse(metrics.stdout) else { return nil }
            return scrape.value("opqueued_cluster_connected") == 1 && scrape.value("opqueued_cluster_nodes_connected") >= 1 ? true : nil
        }) != nil
    }

    /// kill -9: nothing runs on, nothing is cleaned up (the spool's socket and lock stay, as after a crash).
    public func kill9() {
        guard let process, process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// SIGSTOP: frozen as a paused VM would be. `resume()` sends SIGCONT.
    public func freeze() { if let pid { kill(pid, SIGSTOP) } }
    public func resume() { if let pid { kill(pid, SIGCONT) } }

    /// SIGTERM (graceful, SPEC §1), SIGKILL after `timeout` seconds; returns the exit status when it exited by itself.
    @discardableResult
    public func stop(timeout: Double = 30) -> Int32? {
        guard let process, process.isRunning else { return self.process?.terminationStatus }
        kill(process.processIdentifier, SIGCONT)
        kill(process.processIdentifier, SIGTERM)
        if pollUntil(timeout, { process.isRunning ? nil : true }) == nil {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            return nil
        }
        return process.terminationStatus
    }

    /// Waits up to `timeout` seconds for the daemon to exit by itself; its status, or nil if it still runs.
    public func waitExit(timeout: Double) -> Int32? {
        guard let process else { return nil }
        guard pollUntil(timeout, { process.isRunning ? nil : true }) != nil else { return nil }
        return process.terminationStatus
    }

    /// kill -9 (when `crash`) or SIGTERM, then start again and wait until ready.
    public func restart(crash: Bool = false, timeout: Double = 30) throws {
        if crash { kill9() } else { stop() }
        try start(timeout: timeout)
    }

    /// Writes a manifest the way users should: a hidden name, then a rename into the inbox. Returns its path.
    @discardableResult
    public func drop(_ fileName: String, _ manifest: Any) throws -> String {
        try FileManager.default.createDirectory(atPath: spool + "/inbox", withIntermediateDirectories: true)
        let hidden = spool + "/inbox/." + fileName
        let path = spool + "/inbox/" + fileName
        try writeWhole(hidden, [UInt8](propertyListData(manifest)))
        guard rename(hidden, path) == 0 else { throw SupportFailure("rename \(hidden): \(String(cString: strerror(errno)))") }
        return path
    }

    /// `opqueuectl --spool SPOOL --config CONFIG ARGUMENTS…` against this node.
    @discardableResult
    public func ctl(_ arguments: [String], timeout: Double = 30) throws -> ProgramResult {
        try runProgram("opqueuectl", ["--spool", spool, "--config", configPath] + arguments, timeout: timeout)
    }

    /// `status --json`, parsed.
    public func statusJSON() throws -> [String: Any] {
        let run = try ctl(["status", "--json"])
        guard run.status == 0, let object = try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any] else {
            throw SupportFailure("opqueuectl status --json on \(name) exited \(run.status): \(run.stderr)")
        }
        return object
    }

    /// The entries (not hidden) of one spool folder, sorted.
    public func list(_ folder: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: spool + "/" + folder)) ?? []).filter { !$0.hasPrefix(".") }.sorted()
    }

    /// outbox/<job>/result.plist, parsed; nil while it is not there.
    public func result(_ job: String) -> [String: Any]? {
        guard let data = FileManager.default.contents(atPath: spool + "/outbox/" + job + "/result.plist") else { return nil }
        return (try? PropertyListSerialization.propertyList(from: data, format: nil)) as? [String: Any]
    }

    /// The last `lines` lines of the daemon's output log, and (journal target) of what its last process sent to
    /// the journal.
    public func logTail(_ lines: Int = 30) -> String {
        let text = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
        var tail = text.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).joined(separator: "\n")
        if logTarget == "journal", let pid,
           let journal = try? runProgram("/usr/bin/journalctl",
                                         ["_PID=\(pid)", "-t", "opqueued", "-o", "cat", "-n", "\(lines)", "--no-pager", "-q"]) {
            tail += journal.stdout
        }
        return tail
    }

    deinit {
        if let process, process.isRunning {
            kill(process.processIdentifier, SIGCONT)
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}

/// One PostgreSQL and N nodes. Everything is removed when the harness is released (`shutdown` earlier).
public final class ClusterHarness: @unchecked Sendable {
    public let server: PostgresServer
    /// The database the nodes share.
    public let database: String
    /// The node role: LOGIN, no superuser, with exactly `ClusterHarness.grants` (README, "Cluster").
    public let role: String
    public let rolePassword: String
    /// Holds `rolePassword` and a newline, mode 0600 (`cluster.passwordFile`).
    public let passwordFile: String
    /// Where the nodes' spools are.
    public let folder: String
    public private(set) var nodes: [ClusterNode] = []
    /// The `cluster.node` names the nodes are configured with (a test may give two nodes one name).
    private var clusterNodeNames: [String] = []
    public let cluster: Bool
    public let leaseSeconds: Int
    /// When the harness started (journal reads begin here).
    public let started = Date()
    private let tag: String

    /// The GRANTs a node role needs and the README documents: nothing on the server as a whole, CONNECT on the one
    /// database (PUBLIC's default CONNECT and TEMPORARY are revoked first, so the test proves this is enough), USAGE
    /// and CREATE on the schema the nodes create their tables in (they own those tables, so nothing more).
    public static func grants(database: String, role: String) -> [(database: String, sql: String)] {
        [("postgres", "REVOKE ALL ON DATABASE \(database) FROM PUBLIC"),
         ("postgres", "GRANT CONNECT ON DATABASE \(database) TO \(role)"),
         (database, "REVOKE ALL ON SCHEMA public FROM PUBLIC"),
         (database, "GRANT USAGE, CREATE ON SCHEMA public TO \(role)")]
    }

    /// - Parameters:
    ///   - nodes: how many nodes (named `<tag>-n0`, `<tag>-n1`, …).
    ///   - cluster: false: the same nodes without `cluster` (each alone, no database touched).
    ///   - settings: node k's configuration without `cluster` (queues, commands, maxActiveJobs…).
    ///   - clusterSettings: extra keys of node k's `cluster` dictionary (jobSlots, sharedOutbox…).
    ///   - start: start every node (and wait until each is ready).
    public init(nodes count: Int, cluster: Bool = true, leaseSeconds: Int = 3, logTarget: String = "journal",
                settings: (Int) -> [String: Any] = { _ in [:] },
                clusterSettings: (Int) -> [String: Any] = { _ in [:] }, start: Bool = true) throws {
        if logTarget == "journal" { try ensureJournald() }
        server = try PostgresServer()
        self.cluster = cluster
        self.leaseSeconds = leaseSeconds
        tag = "h" + String(UInt32.random(in: 0x1000_0000...UInt32.max), radix: 16)
        database = "opqueued_" + tag
        role = "opqueued_" + tag
        rolePassword = "pw-\(UInt64.random(in: 1...UInt64.max))-\(tag)-secret"
        try server.psql("postgres", "CREATE ROLE \(role) LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '\(rolePassword)'")
        try server.psql("postgres", "CREATE DATABASE \(database)")
        for grant in Self.grants(database: database, role: role) { try server.psql(grant.database, grant.sql) }
        passwordFile = try server.passwordFile(rolePassword)
        folder = NSTemporaryDirectory() + "opq-cluster-" + tag
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        for k in 0..<count {
            var configuration = settings(k)
            let name = "\(tag)-n\(k)"
            if cluster {
                var section: [String: Any] = ["database": url, "passwordFile": passwordFile, "node": name,
                                              "leaseSeconds": leaseSeconds]
                section.merge(clusterSettings(k)) { $1 }
                configuration["cluster"] = section
                if let node = section["node"] as? String, !clusterNodeNames.contains(node) { clusterNodeNames.append(node) }
            }
            nodes.append(ClusterNode(index: k, name: name, spool: folder + "/" + name, settings: configuration, logTarget: logTarget))
        }
        if start {
            try startAll()
            // Ready does not wait for the database (SPEC §8); tests that write rows first need the schema.
            if cluster { try waitRegistered(count) }
        }
    }

    /// Waits until `count` nodes have registered (the schema exists and each node has its row).
    public func waitRegistered(_ count: Int, timeout: Double = 30) throws {
        let done = pollUntil(timeout) { () -> Bool? in
            (try? sql("SELECT count(*) FROM opq_nodes")) == String(count) ? true : nil
        }
        if done == nil { throw SupportFailure("\(count) node(s) did not register within \(timeout) s") }
    }

    /// `cluster.database` for the node role (no password: it is in `passwordFile`).
    public var url: String { server.url(database, user: role) }

    public subscript(_ k: Int) -> ClusterNode { nodes[k] }

    /// Launches every node, then waits until each is ready.
    public func startAll(timeout: Double = 30) throws {
        for node in nodes where !node.isRunning { try node.launch() }
        for node in nodes { try node.waitReady(timeout: timeout) }
    }

    /// The node index by `cluster.node` name.
    public func index(of name: String) -> Int? { nodes.firstIndex { $0.name == name } }

    // MARK: the database

    public func stopDatabase() { server.stop() }
    public func startDatabase() throws { try server.start() }

    /// SQL as the superuser in the nodes' database (hand-inserted rows, schema checks).
    @discardableResult
    public func sql(_ statement: String) throws -> String {
        try server.psql(database, statement).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// What a failed expectation about `job` should show: its row, the nodes' rows (heartbeat ages by the database's
    /// clock) and the tail of every node's log.
    public func diagnosis(_ job: String) -> String {
        let row = "SELECT state, node, fence, extract(epoch FROM now() - submitted_at) FROM opq_job_states WHERE id = '\(job)'"
        var text = "row: " + ((try? sql(row)) ?? "?")
        text += "\nnodes: " + ((try? sql("SELECT node, extract(epoch FROM now() - last_heartbeat) FROM opq_nodes ORDER BY node")) ?? "?")
        for (k, node) in nodes.enumerated() { text += "\n--- node \(k) (\(node.name)):\n" + node.logTail(40) }
        return text
    }

    /// Commits counted in the nodes' database (pg_stat_database.xact_commit; reported by backends at most once a
    /// second).
    public func commits() throws -> Int { try server.commits(database) }

    // MARK: outboxes

    /// Every node whose outbox (or `sharedOutbox`, when given) holds `job`.
    public func outboxes(holding job: String, sharedOutbox: String? = nil) -> [Int] {
        var found = nodes.filter { FileManager.default.fileExists(atPath: $0.spool + "/outbox/" + job) }.map(\.index)
        if let sharedOutbox, FileManager.default.fileExists(atPath: sharedOutbox + "/" + job) { found.append(-1) }
        return found
    }

    /// Waits until some node's outbox holds `job`'s result.plist; returns that node's index and the result.
    public func waitResult(_ job: String, timeout: Double = 30) -> (node: Int, result: [String: Any])? {
        pollUntil(timeout) {
            for node in nodes { if let result = node.result(job) { return (node.index, result) } }
            return nil
        }
    }

    /// Every job id in any node's outbox, with the nodes holding it (a job held twice is a failure of §8).
    public func outboxJobs() -> [String: [Int]] {
        var jobs: [String: [Int]] = [:]
        for node in nodes { for job in node.list("outbox") { jobs[job, default: []].append(node.index) } }
        return jobs
    }

    /// Waits until every one of `jobs` is in some outbox; returns those still missing after `timeout`.
    public func waitAll(_ jobs: Set<String>, timeout: Double) -> Set<String> {
        var missing = jobs
        _ = pollUntil(timeout) { () -> Bool? in
            missing.subtract(outboxJobs().keys)
            return missing.isEmpty ? true : nil
        }
        return missing
    }

    // MARK: the journal

    /// Journal entries since the harness started, in order, with every given field matched (OPQ_NODE, OPQ_JOB,
    /// OPQ_STATE, OPQ_EVENT…). Values that journald gives as arrays or bytes are left out. In a cluster, only this
    /// harness's nodes' entries (the journal is the machine's: other tests' nodes log into it at the same time).
    public func journal(_ match: [String: String]) throws -> [[String: String]] {
        let since = "@" + String(Int(started.timeIntervalSince1970) - 1)
        var arguments = ["-t", "opqueued", "--since", since, "-o", "json", "--no-pager", "-q"]
            + match.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        // journalctl ORs matches of one field and ANDs different fields.
        if match["OPQ_NODE"] == nil { arguments += clusterNodeNames.map { "OPQ_NODE=\($0)" } }
        let out = try runProgram("/usr/bin/journalctl", arguments).stdout
        return out.split(separator: "\n").compactMap { line in
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return nil }
            return object.compactMapValues { $0 as? String }
        }
    }

    /// The entries of one node (OPQ_NODE = its name), with more fields matched when given.
    public func journal(node k: Int, _ match: [String: String] = [:]) throws -> [[String: String]] {
        try journal(match.merging(["OPQ_NODE": nodes[k].name]) { $1 })
    }

    /// Waits until the journal holds an entry matching `match`; returns the first.
    public func waitJournal(_ match: [String: String], timeout: Double = 20) throws -> [String: String]? {
        try pollUntil(timeout) { try journal(match).first }
    }

    /// The node that logged `claimed` for `job` (the last such entry when it was claimed more than once), waiting
    /// up to `timeout`.
    public func waitClaimed(_ job: String, excluding: Set<Int> = [], timeout: Double = 20) throws -> (node: Int, entry: [String: String])? {
        try pollUntil(timeout) {
            for entry in try journal(["OPQ_JOB": job, "OPQ_STATE": "claimed"]).reversed() {
                if let name = entry["OPQ_NODE"], let k = index(of: name), !excluding.contains(k) { return (k, entry) }
            }
            return nil
        }
    }

    /// Everything a node could show an operator: its output log, every journal entry it logged (all fields) and
    /// its `status` (text and JSON). The password-leak test searches this.
    public func everythingShown(by k: Int) throws -> String {
        var text = (try? String(contentsOfFile: nodes[k].logPath, encoding: .utf8)) ?? ""
        let since = "@" + String(Int(started.timeIntervalSince1970) - 1)
        text += try runProgram("/usr/bin/journalctl", ["-t", "opqueued", "--since", since, "-o", "json", "--no-pager", "-q",
                                                        "OPQ_NODE=" + nodes[k].name]).stdout
        if nodes[k].isReady {
            let status = try nodes[k].ctl(["status"])
            let json = try nodes[k].ctl(["status", "--json"])
            text += status.stdout + status.stderr + json.stdout + json.stderr
        }
        if let pid = nodes[k].pid, let cmdline = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") {
            text += String(decoding: cmdline, as: UTF8.self)
        }
        return text
    }

    /// Stops every node (SIGTERM, then SIGKILL) and the database; the folders go when the harness is released.
    public func shutdown() {
        for node in nodes { node.stop(timeout: 10) }
        server.stop()
    }

    deinit {
        for node in nodes { node.kill9() }
        server.stop()
        if ProcessInfo.processInfo.environment["OPQ_KEEP"] == nil {
            try? FileManager.default.removeItem(atPath: folder)
            try? FileManager.default.removeItem(atPath: server.folder)
        }
    }
}
