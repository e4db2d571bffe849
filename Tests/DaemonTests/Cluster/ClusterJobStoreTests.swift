// ClusterJobStore (SPEC §8) against a real throwaway PostgreSQL (Tests/Support/PostgresServer.swift): two nodes,
// each its own spool and a fake shell (the delegate), on one database. Submission from one node's inbox and its
// claim on the other with the files written, exactly once across a crash between the insert's commit and the
// removal of the local copy, a lease running out on a node cut off from the database and its job taken over by the
// other, the fenced end, cancels and suspensions crossing nodes, wake-up latency, the connection lines over a
// database stop and start, the cluster-wide slot limit under two hammering nodes, and rows that are garbage.
// And ClusterNodeState, the pure part, without any I/O.

import Foundation
import Logging
import Synchronization
import Testing
import TestSupport
@testable import Daemon
import CShims
import OperationEngine
import PropertyList

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
         leaseSeconds: Double = 15, jobSlots: Int = 4, queues: [String: Any] = [:], spoolFolder: String? = nil, spool existing: Spool? = nil,
         maxManifestBytes: Int = ManifestLimits.maxBytes, url: String? = nil) throws {
        self.name = name
        folder = spoolFolder ?? NSTemporaryDirectory() + "opq-cluster-\(name)-\(UInt64.random(in: 1...UInt64.max))"
        spool = try existing ?? Spool(root: folder)
        var top: [String: Any] = ["cluster": ["database": url ?? server.url(database, user: user), "passwordFile": try server.passwordFile(password),
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
    try server.psql(database, "UPDATE opq_jobs SET node = 'other', fence = nextval('opq_fence') WHERE id = '\(givenAway)'")
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
    guard process.terminationStatus == 0 else { throw SupportFailure("\(arguments.joined(separator: " ")) exited \(process.terminationStatus)") }
}

func trimmed(_ s: String) -> String { s.trimmingCharacters(in: .whitespacesAndNewlines) }

@Suite("ClusterJobStore", .serialized)
struct ClusterJobStoreTests {
    /// Submitted on A, claimed by B within a wake-up (LISTEN/NOTIFY, not the 1 s poll), files written on B before
    /// `run`, A's local copy gone; B's fenced end recorded.
    @Test func submitOnAClaimedByB() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database)
        let b = try ClusterNode("b", server: server, database: database)
        defer { a.close(); b.close() }
        #expect(a.store.recovered([]).isEmpty && b.store.recovered([]).isEmpty)
        a.store.want(room: 0, manifestBytes: .max)
        b.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.store.snapshot()?.connected == true && b.store.snapshot()?.connected == true })
        // Let both settle into idleness, so that the claim below is woken, not polled.
        usleep(1_200_000)

        let manifest = sleepManifest("holiday")
        let claimed = try a.drop("holiday", manifest)
        let submittedAt = monotonicSeconds()
        #expect(a.store.submit([claimed]).isEmpty, "the cluster runs nothing at once")
        #expect(eventually { b.shell.ran.count == 1 })
        let (job, at) = try #require(b.shell.ran.first)
        let latency = at - submittedAt
        print("ClusterJobStoreTests: submit on a → run on b in \(Int(latency * 1000)) ms")
        #expect(latency < 0.9, "woken by NOTIFY (poll is 1 s): \(latency) s")
        #expect(job.id == "holiday" && job.manifestName == "holiday.plist")
        #expect(try Data(contentsOf: URL(fileURLWithPath: b.spool.active + "/holiday/manifest.plist")) == plist(manifest))
        #expect(b.spool.readOrigin(job: "holiday")?.submittedOn == "a")
        #expect(b.store.origin(of: "holiday") == JobOrigin(submittedOn: "a", fromNode: nil))
        #expect(!FileManager.default.fileExists(atPath: a.spool.active + "/holiday"), "A's local copy is gone")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: a.spool.active + "/.submissions")) ?? []).isEmpty)
        #expect(a.shell.ran.isEmpty)

        let resultFile = b.spool.active + "/holiday/result.plist"
        try plist(["job": "holiday", "status": "succeeded"]).write(to: URL(fileURLWithPath: resultFile))
        #expect(try b.store.complete([JobEnd(job: "holiday", status: "succeeded", resultFile: resultFile)]) == ["holiday"])
        let record = try #require(try a.store.job("holiday"))
        #expect(record.state == .finished && record.node == "b" && record.status == "succeeded")
        #expect(record.result.map { Data($0) } == plist(["job": "holiday", "status": "succeeded"]))
        #expect(b.spool.readOrigin(job: "holiday") != nil, "the origin record stays while the job is in active/")
        removeTree(b.spool.active + "/holiday")  // what the shell's publication does
        #expect(eventually(3) { b.spool.readOrigin(job: "holiday") == nil }, "and goes once it left")
        #expect(try a.store.job("nosuch") == nil)
    }

    /// A row claimed while this node's own inbox claim of a manifest asking for the same id sits in active/<id>
    /// (on its way to active/.submissions): the inbox claim's folder is left untouched, the row handed back and
    /// claimed again once the name is free; the inbox claim is submitted under an id of its own.
    @Test func aClaimedRowNeverTakesTheFolderOfAnInboxClaim() throws {
        let (_, _, a, b) = try startedPair()
        defer { a.close(); b.close() }
        b.store.want(room: 0, manifestBytes: .max)
        #expect(eventually { a.store.snapshot()?.connected == true && b.store.snapshot()?.connected == true })
        // The row `twin`, submitted on a; b's inbox claim of another manifest asking for `twin` holds active/twin.
        #expect(a.store.submit([try a.drop("twin", sleepManifest("twin", seconds: 0))]).isEmpty)
        #expect(eventually { (try? a.store.job("twin")) != nil })
        let local = sleepManifest("twin", seconds: 1)
        let claimed = try b.drop("twin-local", local)
        #expect(claimed.id == "twin")
        b.store.want(room: 4, manifestBytes: .max)
        #expect(eventually(3) { b.logs.all.contains { $0.message.contains("active/twin is in use here") } })
        #expect(b.shell.ran.isEmpty)
        #expect(try Data(contentsOf: URL(fileURLWithPath: b.spool.active + "/twin/manifest.plist")) == plist(local),
                "the inbox claim's folder is untouched")
        #expect(b.spool.readOrigin(job: "twin") == nil && !b.spool.isClusterClaim(job: "twin"))
        // The inbox claim moves on: the row is claimed (here) under its own id, the local manifest inserted as twin.1.
        #expect(b.store.submit([claimed]).isEmpty)
        #expect(eventually { b.shell.ran.contains { $0.job.id == "twin" } })
        #expect(b.spool.isClusterClaim(job: "twin"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: b.spool.active + "/twin/manifest.plist")) == plist(sleepManifest("twin", seconds: 0)))
        #expect(eventually { (try? a.store.job("twin.1")) != nil })
    }

    /// A row whose id the shell still holds (a job of the same id rejected on this node at submission, ending, its
    /// folder already gone from active/) is handed back untouched, and claimed once the shell has let the id go.
    @Test func aRowWhoseIdTheShellHoldsWaitsUntilItIsFree() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { a.store.snapshot()?.connected == true })
        a.shell.held = ["twin"]
        #expect(a.store.submit([try a.drop("twin", sleepManifest("twin", seconds: 0))]).isEmpty)
        #expect(eventually { (try? a.store.job("twin")) != nil })
        a.store.want(room: 4, manifestBytes: .max)
        usleep(500_000)
        #expect(a.shell.ran.isEmpty, "not run while the shell holds its id")
        #expect(access(a.spool.active + "/twin", F_OK) != 0, "nothing written into active/")
        a.shell.held = []
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.ran.contains { $0.job.id == "twin" } })
        #expect(a.spool.isClusterClaim(job: "twin"))
    }

    /// A crash after the insert committed and before the local copy was removed: the next start submits it again
    /// and the database keeps one job. Both places a crash can leave it: active/<job> (before it was set aside) and
    /// active/.submissions/<job>.
    @Test func exactlyOnceAcrossACrashBetweenCommitAndRemoval() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-crash-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let saved = folder + "/saved"

        let first = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        _ = first.store.recovered([])
        let one = try first.drop("once", sleepManifest("once"))
        let two = try first.drop("twice", sleepManifest("twice"))
        // What a crash would leave: copies (attributes too) of the claimed folders.
        try runTool(["/bin/mkdir", "-p", saved])
        try runTool(["/bin/cp", "-a", spool.active + "/once", spool.active + "/twice", saved + "/"])
        _ = first.store.submit([one, two])
        #expect(eventually { (try? first.store.job("once")) != nil && (try? first.store.job("twice")) != nil })
        #expect(eventually { !FileManager.default.fileExists(atPath: spool.active + "/.submissions/once") })
        first.store.shutdown()

        // The crash: `once` was never set aside, `twice` was set aside and not removed.
        try runTool(["/bin/mv", saved + "/once", spool.active + "/once"])
        try runTool(["/bin/mv", saved + "/twice", spool.active + "/.submissions/twice"])
        let recovered = try spool.recover().jobs
        #expect(recovered.map(\.id) == ["once"])
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        #expect(second.store.recovered(recovered).isEmpty, "a job without an origin is a submission: not resumed")
        #expect(eventually {
            !FileManager.default.fileExists(atPath: spool.active + "/.submissions/twice")
                && !FileManager.default.fileExists(atPath: spool.active + "/.submissions/once")
                && !FileManager.default.fileExists(atPath: spool.active + "/once")
        })
        #expect(trimmed(try server.psql(database, "SELECT string_agg(id, ',' ORDER BY id) FROM opq_jobs")) == "once,twice",
                "each submission exactly once")
    }

    /// The claim for the cluster (one rename into active/.submissions, no commit): its name is the submission key.
    /// A crash after the insert committed and before the file's removal (or a disk that lost both the rename and
    /// the removal: the same inbox file, the same name again) submits nothing twice; a file the insert never saw is
    /// inserted at the next start. A name too long to fit beside the key is kept in the attribute.
    @Test func claimsForTheClusterAreSubmittedExactlyOnce() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-file-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        func claim(_ name: String, _ manifest: [String: Any]) throws -> ClaimedJob {
            try plist(manifest).write(to: URL(fileURLWithPath: spool.inbox + "/" + name))
            return try claimForSubmission(spool, name)
        }
        let first = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        _ = first.store.recovered([])
        let once = try claim("once.plist", sleepManifest("once"))
        #expect(once.id.hasPrefix(".") && once.requestedJob == "once" && once.manifestName == "once.plist")
        let file = spool.active + "/.submissions/" + once.id.dropFirst()
        #expect(FileManager.default.fileExists(atPath: file) && !FileManager.default.fileExists(atPath: spool.inbox + "/once.plist"))
        let long = String(repeating: "l", count: 240) + ".plist"
        let later = try claim(long, sleepManifest("later"))
        let saved = try Data(contentsOf: URL(fileURLWithPath: file))
        _ = first.store.submit([once])
        #expect(eventually { (try? first.store.job("once")) != nil })
        #expect(eventually { !FileManager.default.fileExists(atPath: file) })
        first.store.shutdown()

        // The crash: `once` back under the same name (as if its removal was lost), `later` never submitted.
        try saved.write(to: URL(fileURLWithPath: file))
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        _ = second.store.recovered([])
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? ["x"]).isEmpty })
        #expect(trimmed(try server.psql(database, "SELECT string_agg(id || ' ' || manifest_name, ',' ORDER BY id) FROM opq_jobs"))
                == "later \(long),once once.plist", "each submission exactly once, the long name kept")
        #expect(later.manifestName == long)
    }

    /// A node that claims a row of its own submission while it still holds the manifest file it inserted takes that
    /// file into active/<job>/ (renamed: the very inode that came into the inbox, not written again); a row another
    /// node claims gets the bytes from the database there, and the submitting node's file goes `reapDelay` later.
    @Test func aNodeClaimingItsOwnSubmissionTakesTheFileItHolds() throws {
        let (_, _, a, b) = try startedPair()
        defer { a.close(); b.close() }
        #expect(eventually { a.store.snapshot()?.connected == true && b.store.snapshot()?.connected == true })
        func submit(_ node: ClusterNode, _ job: String) throws -> (inode: UInt64, manifest: Data) {
            let manifest = plist(sleepManifest(job))
            let path = node.spool.inbox + "/" + job + ".plist"
            try manifest.write(to: URL(fileURLWithPath: path))
            var st = stat()
            guard stat(path, &st) == 0 else { throw SupportFailure("inbox/\(job).plist: \(String(cString: strerror(errno)))") }
            let claimed = try claimForSubmission(node.spool, job + ".plist")
            #expect(node.store.submit([claimed]).isEmpty)
            return (UInt64(st.st_ino), manifest)
        }
        func inode(_ path: String) -> UInt64? {
            var st = stat()
            return stat(path, &st) == 0 ? UInt64(st.st_ino) : nil
        }
        func submissions(_ node: ClusterNode) -> [String] {
            (try? FileManager.default.contentsOfDirectory(atPath: node.spool.active + "/.submissions")) ?? []
        }

        // Only a has room: its own row, its own file.
        b.store.want(room: 0, manifestBytes: .max)
        a.store.want(room: 4, manifestBytes: .max)
        let own = try submit(a, "own")
        #expect(eventually { a.shell.ran.contains { $0.job.id == "own" } })
        let ownManifest = a.spool.active + "/own/manifest.plist"
        #expect(inode(ownManifest) == own.inode, "the inbox file itself, renamed in")
        #expect(try Data(contentsOf: URL(fileURLWithPath: ownManifest)) == own.manifest)
        #expect(a.spool.readOrigin(job: "own")?.submittedOn == "a")
        #expect(submissions(a).isEmpty)

        // Only b has room: b writes the bytes it claimed; a's copy goes after reapDelay.
        a.store.want(room: 0, manifestBytes: .max)
        b.store.want(room: 4, manifestBytes: .max)
        let other = try submit(a, "other")
        #expect(eventually { b.shell.ran.contains { $0.job.id == "other" } })
        let otherManifest = b.spool.active + "/other/manifest.plist"
        #expect(try Data(contentsOf: URL(fileURLWithPath: otherManifest)) == other.manifest)
        #expect(eventually(ClusterJobStore.reapDelay + 3) { submissions(a).isEmpty }, "a's local copy removed")
        #expect(!a.shell.ran.contains { $0.job.id == "other" })

        // The copy gone before a claims its row (someone cleaning active/.submissions by hand): the claim writes the
        // database's bytes instead, and the job runs.
        b.store.want(room: 0, manifestBytes: .max)
        let gone = try submit(a, "gone")
        #expect(eventually { (try? a.store.job("gone")) != nil })
        for name in submissions(a) { try FileManager.default.removeItem(atPath: a.spool.active + "/.submissions/" + name) }
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.ran.contains { $0.job.id == "gone" } })
        let goneManifest = a.spool.active + "/gone/manifest.plist"
        #expect(try Data(contentsOf: URL(fileURLWithPath: goneManifest)) == gone.manifest)
        #expect(a.shell.spoolFailures.isEmpty && b.shell.spoolFailures.isEmpty)
    }

    /// A node whose spool cannot take a claimed job (its file system out of inodes: a real ENOSPC) hands the row
    /// back and stops claiming, telling the shell (a spool fault), instead of claiming it again at once in a loop
    /// of claims and hand-backs; once the shell offers room again, the job is claimed and runs.
    @Test func aFullSpoolStopsClaimingInsteadOfLooping() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-full-\(UInt64.random(in: 1...UInt64.max))"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try runTool(["/bin/mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=256", "tmpfs", folder])
        defer {
            // Lazily: the nodes' spools (their lock files) are still open when this runs, and a plain umount of a busy
            // file system fails, leaving one mount behind per run.
            try? runTool(["/bin/umount", "-l", folder])
            try? FileManager.default.removeItem(atPath: folder)
        }
        let a = try ClusterNode("a", server: server, database: database, spoolFolder: folder + "/spool")
        let b = try ClusterNode("b", server: server, database: database)
        defer { a.close(); b.close() }
        _ = a.store.recovered([])
        _ = b.store.recovered([])
        a.store.want(room: 0, manifestBytes: .max)
        b.store.want(room: 0, manifestBytes: .max)
        var fillers: [String] = []
        while true {
            let path = folder + "/filler\(fillers.count)"
            let fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
            if fd < 0 { break }
            close(fd)
            fillers.append(path)
        }
        #expect(errno == ENOSPC && !fillers.isEmpty)
        _ = b.store.submit([try b.drop("full", sleepManifest("full"))])
        #expect(eventually { (try? b.store.job("full")) != nil })
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.spoolFailures.count == 1 })
        #expect(a.shell.spoolFailures.first?.contains("No space left") == true, "\(a.shell.spoolFailures)")
        #expect(eventually { (try? b.store.job("full"))?.state == .waiting }, "handed back")
        let fence = trimmed(try server.psql(database, "SELECT last_value FROM opq_fence"))
        usleep(1_500_000)
        #expect(trimmed(try server.psql(database, "SELECT last_value FROM opq_fence")) == fence, "not claimed again meanwhile")
        #expect(a.shell.spoolFailures.count == 1 && a.shell.ran.isEmpty)

        // The spool works again; the shell offers room.
        for path in fillers { unlink(path) }
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.ran.count == 1 })
        #expect(FileManager.default.fileExists(atPath: a.spool.active + "/full/manifest.plist"))
    }

    /// A restart: a job the database still gives this node under the same fence resumes; one given to another
    /// node meanwhile is removed from active/ and logged `lost`; one whose end was recorded before the crash (and
    /// not yet placed in the outbox) resumes and is published without recording again.
    @Test func recoveredResumesOnlyWhatTheNodeStillHolds() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-restart-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let first = try nodeThatRan(["keep", "gone", "done"], server: server, database: database, spool: spool)
        let result = spool.active + "/done/result.plist"
        try plist(["job": "done"]).write(to: URL(fileURLWithPath: result))
        #expect(try first.store.complete([JobEnd(job: "done", status: "succeeded", resultFile: result)]) == ["done"])
        #expect(spool.readOrigin(job: "done") != nil, "the origin stays until the job has left active/")
        first.store.shutdown()
        // The crash: `done` was recorded but not placed; `gone` was taken over and claimed by another node.
        try server.psql(database, "UPDATE opq_jobs SET node = 'other', fence = nextval('opq_fence') WHERE id = 'gone'")

        let recovered = try spool.recover().jobs
        #expect(recovered.map(\.id) == ["done", "gone", "keep"])
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        #expect(second.store.recovered(recovered).map(\.id) == ["done", "keep"])
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/gone"))
        #expect(second.logs.all.contains { $0.metadata["OPQ_STATE"] == "lost" && $0.metadata["OPQ_JOB"] == "gone" })
        #expect(second.store.origin(of: "keep")?.submittedOn == "a")
        #expect(try second.store.complete([JobEnd(job: "done", status: "succeeded", resultFile: result)]) == ["done"],
                "recorded before the crash: published without the database")
        #expect(trimmed(try server.psql(database, "SELECT state FROM opq_jobs WHERE id = 'keep'")) == "running")
    }

    /// A spool copied without its extended attributes (`cp -r`, `rsync -a` without -X) has lost every claim record.
    /// A job claimed from the cluster is then recognised from the database (same id, same manifest, claimed by this
    /// node): resumed if still this node's, its record written again; removed as lost if another node took it over
    /// meanwhile — never submitted again, which would run it twice. A folder the database knows nothing of stays an
    /// inbox claim and is submitted.
    @Test func claimsWhoseRecordsWereLostAreRecognisedFromTheDatabase() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-unrecorded-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let first = try nodeThatRan(["kept", "taken"], server: server, database: database, spool: spool)
        let fence = try #require(spool.readOrigin(job: "kept")?.fence)
        let submittedAt = try #require(first.store.job("kept")?.submittedAt)
        first.store.shutdown()
        // While the node was down: `taken` taken over by another node (after the lease).
        try server.psql(database, "UPDATE opq_jobs SET node = 'other', from_node = 'a', fence = nextval('opq_fence') WHERE id = 'taken'")
        // An inbox claim the database does not know, then the copy that loses every record.
        _ = try first.drop("local", sleepManifest("local"))
        for job in ["kept", "taken", "local"] {
            #expect(removexattr(spool.active + "/" + job, Spool.jobAttribute) == 0)
            #expect(spool.readClaimRecord(spool.active + "/" + job) == nil)
        }

        let recovered = try spool.recover().jobs
        #expect(recovered.map(\.id) == ["kept", "local", "taken"])
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        let resumed = second.store.recovered(recovered)
        #expect(resumed.map(\.id) == ["kept"])
        #expect(resumed.first?.receivedAt == submittedAt, "its reception time from the database, not the restart's")
        #expect(spool.readOrigin(job: "kept")?.fence == fence, "its record written again")
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/taken"))
        #expect(second.logs.all.contains { $0.metadata["OPQ_STATE"] == "lost" && $0.metadata["OPQ_JOB"] == "taken" })
        // `local` is submitted; `kept` and `taken` are not submitted again (no kept.1, taken.1).
        #expect(eventually { (try? second.store.job("local")) != nil })
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? []).isEmpty })
        #expect(trimmed(try server.psql(database, "SELECT string_agg(id, ' ' ORDER BY id) FROM opq_jobs")) == "kept local taken")
        #expect(trimmed(try server.psql(database, "SELECT node || ' ' || fence FROM opq_jobs WHERE id = 'kept'")) == "a \(fence)")
    }

    /// The database restored from a backup older than a job this node holds has no row for it: the job is submitted
    /// again from the node's copy (dropped, it would run nowhere). A folder last written more than keepFinishedDays
    /// ago may have lost its row to pruning after the job ran elsewhere: lost, as before.
    @Test func aClaimWhoseRowTheDatabaseLostIsSubmittedAgain() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-rowless-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let first = try nodeThatRan(["fresh", "old"], server: server, database: database, spool: spool)
        first.store.shutdown()
        try server.psql(database, "DELETE FROM opq_jobs WHERE id IN ('fresh', 'old')")
        let longAgo = Date().timeIntervalSince1970 - (ClusterSettings.defaultKeepFinishedDays + 1) * 86_400
        var times = [timespec(tv_sec: Int(longAgo), tv_nsec: 0), timespec(tv_sec: Int(longAgo), tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, spool.active + "/old", &times, 0) == 0)

        let recovered = try spool.recover().jobs
        #expect(recovered.map(\.id) == ["fresh", "old"])
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        #expect(second.store.recovered(recovered).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/old"))
        #expect(second.logs.all.contains { $0.metadata["OPQ_STATE"] == "lost" && $0.metadata["OPQ_JOB"] == "old" })
        #expect(second.logs.all.contains { $0.message.contains("the database has no row for this job") && $0.metadata["OPQ_JOB"] == "fresh" })
        #expect(eventually { (try? second.store.job("fresh"))?.state == .waiting })
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? []).isEmpty })
        #expect(trimmed(try server.psql(database, "SELECT string_agg(id || ' ' || state, ',' ORDER BY id) FROM opq_jobs")) == "fresh waiting")
    }

    /// A running node whose database forgets a job it holds (restored from an older backup under it) hears so at its
    /// next beat: that job is given back to the shell to submit again, not dropped; one taken over by another node is
    /// lost as ever.
    @Test func aRunningNodeHearsWhichOfItsJobsTheDatabaseForgot() throws {
        let (node, _, _) = try nodeWhoseDatabaseChanged(forgetting: "forgotten", givingAway: "taken", leaseSeconds: 3)
        defer { node.close() }
        #expect(eventually(10) { node.shell.forgottenJobs == ["forgotten"] && node.shell.lostJobs.map(\.job) == ["taken"] },
                "forgotten \(node.shell.forgottenJobs), lost \(node.shell.lostJobs)")
    }

    /// A job whose row is gone when its end is to be recorded (the database restored under the node between its last
    /// beat and the completion) ran here, and no other node holds it: published here (answered as recorded), not
    /// dropped as lost.
    @Test func aJobTheDatabaseForgotBeforeItsEndIsPublishedWhereItRan() throws {
        let (node, server, database) = try nodeWhoseDatabaseChanged(forgetting: "ended", givingAway: "taken")
        defer { node.close() }
        let spool = node.spool
        let ends = try ["ended", "taken"].map { job in
            let result = spool.active + "/" + job + "/result.plist"
            try plist(["job": job]).write(to: URL(fileURLWithPath: result))
            return JobEnd(job: job, status: "succeeded", resultFile: result)
        }
        #expect(try node.store.complete(ends) == ["ended"])
        #expect(node.shell.lostJobs.map(\.job) == ["taken"])
        #expect(node.logs.all.contains { $0.message.contains("published here, where it ran, recorded in the database again as finished here") && $0.metadata["OPQ_JOB"] == "ended" })
        // Recorded again, as finished here: show and wait on every node know it, and its id stays taken.
        let record = try #require(try node.store.job("ended"))
        #expect(record.state == .finished && record.node == "a" && record.status == "succeeded")
        #expect(try server.psql(database, "SELECT submitted_on || ' ' || manifest_name || ' ' || array_to_string(queues, ',') FROM opq_jobs WHERE id = 'ended'")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == "a ended.plist default")
    }

    /// The same folders when the database does not answer at start (a server that takes the connection and never
    /// speaks): one lookup waits out its timeout, the others are not tried; the folders wait in active/ for the
    /// database to answer (next test); the node starts rather than waiting a timeout per folder.
    @Test func foldersWithoutRecordsDoNotHoldUpAStartWhileTheDatabaseIsSilent() throws {
        let server = try PostgresServer.shared.get()
        // Never accepted: the kernel completes the handshakes, no one answers.
        let (listener, port) = try loopbackListener()
        defer { close(listener) }
        let folder = NSTemporaryDirectory() + "opq-cluster-silent-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let jobs = ["one", "two", "three", "four", "five"]
        for job in jobs {
            #expect(mkdir(spool.active + "/" + job, 0o750) == 0)
            try plist(sleepManifest(job)).write(to: URL(fileURLWithPath: spool.active + "/" + job + "/manifest.plist"))
        }
        let node = try ClusterNode("a", server: server, database: "silent", spoolFolder: folder, spool: spool,
                                   url: "postgresql://\(PostgresServer.role)@127.0.0.1:\(port)/silent?sslmode=disable")
        defer { node.store.shutdown() }
        let recovered = try spool.recover().jobs
        #expect(recovered.count == 5)
        let started = monotonicSeconds()
        #expect(node.store.recovered(recovered).isEmpty)
        let seconds = monotonicSeconds() - started
        #expect(seconds < ClusterJobStore.statementTimeout * 2, "one lookup's timeout, not one per folder: \(seconds) s")
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: spool.active).filter { !$0.hasPrefix(".") }) == Set(jobs),
                "waiting in active/, none submitted")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? []).isEmpty)
    }

    /// Folders without records met while the database is down at start wait in active/ until it answers, then are
    /// looked up: one whose end this node recorded is published here; one the database holds as this node's is not
    /// run from the copy (the copy goes, `lost`; the row is handed back to run again from the database); one it does
    /// not know is submitted. Nothing is submitted twice.
    @Test func foldersWithoutRecordsWaitForTheDatabaseToAnswer() throws {
        let server = try PostgresServer()
        defer { server.stop(); try? FileManager.default.removeItem(atPath: server.folder) }
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-unverified-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let first = try nodeThatRan(["held", "done"], server: server, database: database, spool: spool)
        let result = spool.active + "/done/result.plist"
        try plist(["job": "done"]).write(to: URL(fileURLWithPath: result))
        #expect(try first.store.complete([JobEnd(job: "done", status: "succeeded", resultFile: result)]) == ["done"])
        first.store.shutdown()
        _ = try first.drop("local", sleepManifest("local"))
        for job in ["held", "done", "local"] { #expect(removexattr(spool.active + "/" + job, Spool.jobAttribute) == 0) }
        server.stop()

        let recovered = try spool.recover().jobs
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        #expect(second.store.recovered(recovered).isEmpty)
        usleep(1_500_000)
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: spool.active).filter { !$0.hasPrefix(".") }) == ["held", "done", "local"],
                "left where they are while the database is down")

        try server.start()
        #expect(eventually(15) { second.shell.ran.contains { $0.job.id == "done" } }, "its end recorded: published here")
        #expect(try second.store.complete([JobEnd(job: "done", status: "succeeded", resultFile: result)]) == ["done"],
                "without recording again")
        #expect(eventually { !FileManager.default.fileExists(atPath: spool.active + "/held") })
        // Logged once the copy is gone (on the submission thread): waited for, not read at the instant of removal.
        #expect(eventually { second.logs.all.contains { $0.metadata["OPQ_STATE"] == "lost" && $0.metadata["OPQ_JOB"] == "held" } })
        #expect(eventually(10) { trimmed((try? server.psql(database, "SELECT state || ' ' || coalesce(node, '-') FROM opq_jobs WHERE id = 'held'")) ?? "") == "waiting -" },
                "handed back, to run again from the database")
        #expect(eventually { (try? second.store.job("local")) != nil })
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? []).isEmpty })
        #expect(trimmed(try server.psql(database, "SELECT string_agg(id, ' ' ORDER BY id) FROM opq_jobs")) == "done held local")
        #expect(!second.shell.ran.contains { $0.job.id == "held" })
    }

    /// The store's async work runs on its own executor: with every thread of the shared cooperative pool blocked
    /// for longer than the lease, the node still beats and keeps its job (on the shared pool it would lose it).
    @Test func heartbeatsGoOnWhileTheCooperativePoolIsBlocked() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        // A lease of 3 s (beats every second, the deadline 2.4 s after the last) blocked for 4 s: a machine busy with
        // the rest of the suite may hold a beat back a second or more, never the 4 s the block lasts. Not longer:
        // the block stops every test running beside this one on the shared pool (ClusterPermitsTests' leases).
        let a = try ClusterNode("a", server: server, database: database, leaseSeconds: 3)
        defer { a.close() }
        _ = a.store.recovered([])
        a.store.want(room: 1, manifestBytes: .max)
        _ = a.store.submit([try a.drop("steady", sleepManifest("steady", seconds: 60))])
        #expect(eventually { a.shell.ran.count == 1 })
        let blockers = ProcessInfo.processInfo.activeProcessorCount + 2
        let blockedUntil = monotonicSeconds() + 4
        for _ in 0..<blockers {
            Task.detached { while monotonicSeconds() < blockedUntil { usleep(10_000) } }
        }
        while monotonicSeconds() < blockedUntil + 0.2 { usleep(20_000) }
        #expect(a.shell.lostJobs.isEmpty, "lost: \(a.shell.lostJobs)")
        #expect(trimmed(try server.psql(database, "SELECT node FROM opq_jobs WHERE id = 'steady'")) == "a")
    }

    /// A node cut off from the database stops its job at its own deadline (`lease ran out`) and tells the watchdog
    /// hook; the other node takes the job over after the lease (fromNode set) and runs it; when the first comes back
    /// its end is refused by the fence and nothing of it is recorded.
    @Test func leaseRunsOutOnACutOffNodeAndTheOtherTakesOver() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let password = "cut-\(UInt64.random(in: 1...UInt64.max))"
        let role = try server.createRole("opqcut", password: password, connectingTo: database, memberOf: PostgresServer.role)
        // B first: the schema belongs to the role that created it.
        let b = try ClusterNode("b", server: server, database: database, leaseSeconds: 2)
        _ = b.store.recovered([])
        #expect(eventually { b.store.snapshot()?.connected == true })
        let a = try ClusterNode("a", server: server, database: database, user: role, password: password, leaseSeconds: 2)
        defer { a.close(); b.close() }
        let leaseChanges = Locked<[Bool]>([])
        a.store.onLeaseChange = { good in leaseChanges.withLock { $0.append(good) } }
        _ = a.store.recovered([])
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.store.snapshot()?.connected == true })
        _ = a.store.submit([try a.drop("long", sleepManifest("long", seconds: 60))])
        #expect(eventually { a.shell.ran.count == 1 })
        let firstFence = try #require(a.spool.readOrigin(job: "long")?.fence)
        #expect(a.store.leaseDeadline != nil)
        #expect(a.deadlines.withLock { $0.contains { $0 != nil } }, "the watchdog hook got a deadline")
        b.store.want(room: 4, manifestBytes: .max)

        // Cut A off: no new logins for its role, its connections ended.
        let cutAt = monotonicSeconds()
        try server.psql("postgres", "ALTER ROLE \(role) NOLOGIN")
        try server.psql("postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '\(role)'")
        #expect(eventually(8) { a.shell.lostJobs.contains { $0.job == "long" } })
        let lostAfter = monotonicSeconds() - cutAt
        #expect(a.shell.lostJobs.first?.reason == "lease ran out")
        #expect(lostAfter < 2.5, "stopped by its own clock before the lease (2 s) ran out after the last beat: \(lostAfter) s")
        #expect(a.deadlines.withLock { $0.last } == .some(nil), "nothing held any more")
        #expect(leaseChanges.withLock { $0 } == [true, false], "the lease hook: good, then ran out")
        #expect(!a.store.leaseIsGood)
        #expect(eventually(8) { a.logs.states("cluster").contains("disconnected") }, "statements time out within 5 s")

        #expect(eventually(10) { b.shell.ran.contains { $0.job.id == "long" } })
        let taken = try #require(b.shell.ran.first { $0.job.id == "long" })
        #expect(b.store.origin(of: "long")?.fromNode == "a")
        #expect((b.spool.readOrigin(job: "long")?.fence ?? 0) > firstFence)
        _ = taken

        // A comes back: its end of the job is refused, B's is recorded.
        try server.psql("postgres", "ALTER ROLE \(role) LOGIN")
        #expect(eventually(10) { a.logs.states("cluster").last == "connected" })
        #expect(eventually { leaseChanges.withLock { $0 } == [true, false, true] && a.store.leaseIsGood })
        let aResult = a.folder + "/result-a.plist"
        try plist(["job": "long", "status": "succeeded", "node": "a"]).write(to: URL(fileURLWithPath: aResult))
        #expect(try a.store.complete([JobEnd(job: "long", status: "succeeded", resultFile: aResult)]).isEmpty)
        let bResult = b.spool.active + "/long/result.plist"
        try plist(["job": "long", "status": "cancelled", "node": "b"]).write(to: URL(fileURLWithPath: bResult))
        #expect(try b.store.complete([JobEnd(job: "long", status: "cancelled", resultFile: bResult)]) == ["long"])
        let record = try #require(try b.store.job("long"))
        #expect(record.node == "b" && record.status == "cancelled" && record.fromNode == "a")
    }

    /// A node whose spool hangs (its file system frozen: every write waits, none fails) goes on beating from its own
    /// thread, and its jobs would never run anywhere. Once the spool has kept it waiting for a whole lease (at least
    /// 5 s) it renews nothing more: its job stops there when the lease runs out (`lease ran out`) and the other node
    /// takes it over; when the spool answers again the node renews its lease, and says both.
    @Test func aNodeWhoseSpoolHangsLetsItsLeaseGo() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database, leaseSeconds: 2)
        let b = try ClusterNode("b", server: server, database: database, leaseSeconds: 2)
        defer { a.close(); b.close() }
        _ = a.store.recovered([])
        _ = b.store.recovered([])
        a.store.want(room: 4, manifestBytes: .max)
        _ = a.store.submit([try a.drop("stuck", sleepManifest("stuck", seconds: 60))])
        #expect(eventually { a.shell.ran.count == 1 })
        b.store.want(room: 4, manifestBytes: .max)

        // Kept waiting for less than the bound (a slow sync): the node keeps its lease and its job.
        a.shell.stalled = 3
        usleep(3_000_000)
        #expect(a.shell.lostJobs.isEmpty)
        #expect(b.shell.ran.isEmpty)
        #expect(a.store.leaseIsGood)

        a.shell.stalled = 6
        #expect(eventually(10) { a.shell.lostJobs.contains { $0.job == "stuck" && $0.reason == "lease ran out" } })
        #expect(eventually(10) { b.shell.ran.contains { $0.job.id == "stuck" } })
        #expect(b.store.origin(of: "stuck")?.fromNode == "a")
        // Said as the node leaving the cluster: `disconnected`, with the reason, in the log and in status.
        let left = a.logs.all.first { $0.metadata["OPQ_STATE"] == "disconnected" }
        #expect(left?.message.contains("node a leaves the cluster until its spool answers") == true)
        #expect(left?.metadata["OPQ_ERROR"]?.hasPrefix("the spool has not answered for") == true)
        #expect(a.store.snapshot()?.connected == false)
        #expect(a.store.snapshot()?.lastError?.hasPrefix("the spool has not answered for") == true)

        a.shell.stalled = 0
        #expect(eventually(5) { a.store.leaseIsGood }, "renewed once the spool answers")
        #expect(a.logs.all.contains { $0.message.contains("the spool of node a answers again") })
        #expect(a.logs.states("cluster").suffix(2) == ["disconnected", "connected"], "\(a.logs.states("cluster"))")
        #expect(a.store.snapshot()?.connected == true)
        #expect(trimmed(try server.psql(database, "SELECT node FROM opq_jobs WHERE id = 'stuck'")) == "b")
    }

    /// Fencing at the store's gate: a job the database gave to another node meanwhile is not recorded, and is
    /// handed to `lost`.
    @Test func fencedCompleteRefusesALostJob() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        _ = a.store.recovered([])
        a.store.want(room: 1, manifestBytes: .max)
        _ = a.store.submit([try a.drop("fenced", sleepManifest("fenced"))])
        #expect(eventually { a.shell.ran.count == 1 })
        // Another claim of the same job meanwhile (as after a takeover): a new fence.
        try server.psql(database, "UPDATE opq_jobs SET node = 'other', fence = nextval('opq_fence') WHERE id = 'fenced'")
        let result = a.folder + "/r.plist"
        try plist(["job": "fenced"]).write(to: URL(fileURLWithPath: result))
        #expect(try a.store.complete([JobEnd(job: "fenced", status: "succeeded", resultFile: result)]).isEmpty)
        #expect(a.shell.lostJobs.map(\.job) == ["fenced"])
        #expect(trimmed(try server.psql(database, "SELECT state FROM opq_jobs WHERE id = 'fenced'")) == "running")
    }

    /// `cancel` and `suspend` asked on A reach B (which runs the job) within 1 s, each cancel passed on once.
    @Test func cancelAndSuspendFromAReachB() throws {
        let (_, _, a, b) = try startedPair()
        defer { a.close(); b.close() }
        b.store.want(room: 4, manifestBytes: .max)
        _ = a.store.submit([try a.drop("remote", sleepManifest("remote", seconds: 60))])
        #expect(eventually { b.shell.ran.count == 1 })
        #expect(eventually { b.shell.suspensions.count == 1 }, "the first read passes the (empty) set on")

        var start = monotonicSeconds()
        #expect(a.store.requestCancel(job: "remote", operation: "s") == .requested)
        #expect(eventually(3) { b.shell.cancels.count == 1 })
        #expect(monotonicSeconds() - start < 1.0)
        #expect(b.shell.cancels.first?.job == "remote" && b.shell.cancels.first?.operation == "s")
        #expect(a.store.requestCancel(job: "remote", operation: nil) == .requested)
        #expect(eventually(3) { b.shell.cancels.count == 2 })
        usleep(1_500_000)
        #expect(b.shell.cancels.count == 2, "each cancel passed on once, though the database repeats them")
        #expect(a.store.requestCancel(job: "nosuch", operation: nil) == .unknownJob)

        start = monotonicSeconds()
        #expect(a.store.setSuspended("io", true))
        #expect(eventually(3) { b.shell.suspensions.last == ["io"] })
        #expect(monotonicSeconds() - start < 1.0)
        #expect(a.store.setSuspended("io", false))
        #expect(eventually(3) { b.shell.suspensions.last == [] })
    }

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
        #expect(eventually(20) { a.logs.states("cluster") == ["disconnected", "connected", "disconnected"] },
                "\(a.logs.all.filter { $0.metadata["OPQ_EVENT"] == "cluster" }.map { "\($0.metadata["OPQ_STATE"] ?? "-"): \($0.message)" })")
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
            #expect(node.logs.all.filter { $0.message.contains(refused) && $0.message.contains("ALTER ROLE") }.count == 1, "node \(node.name)")
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
                                   url: "postgresql://\(PostgresServer.role)@127.0.0.1:\(port)/typo?sslmode=\(speaks == "tls" ? "require" : "disable")")
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

    /// Rows are input: a hand-inserted row with an id that would escape the spool, and one whose manifest is not a
    /// property list, crash nothing; the first is recorded rejected without touching the spool, the second is
    /// handed to the shell (which validates it against its own configuration and rejects it).
    @Test func garbageRowsCrashNothing() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { a.store.snapshot()?.refreshedAt != nil })
        let columns = "(id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)"
        try server.psql(database, """
            INSERT INTO opq_jobs \(columns) VALUES
              ('../escape', '../escape', '\\x00ff', '../../x', 'nowhere node!', 9, -4, '{}', '{}'),
              ('garbage', '', '\\xdeadbeef', '', '', 2, 2, '{default}', '{}'),
              ('strange', 'strange', '\\x3c3f786d6c', 'a/b', 'x', 2, 2, '{}', '{}')
            """)
        a.store.want(room: 8, manifestBytes: .max)
        #expect(eventually { a.shell.ran.count == 2 })
        #expect(Set(a.shell.ran.map(\.job.id)) == ["garbage", "strange"])
        #expect(a.shell.ran.first { $0.job.id == "strange" }?.job.manifestName == "strange.plist", "a name with '/' is not used")
        #expect(a.store.origin(of: "garbage")?.submittedOn == "unknown")
        #expect(trimmed(try server.psql(database, "SELECT state || ' ' || status FROM opq_jobs WHERE id = '../escape'")) == "finished rejected")
        #expect(!FileManager.default.fileExists(atPath: a.spool.root + "/escape"))
        #expect(!FileManager.default.fileExists(atPath: a.spool.active + "/../escape"))
        // And the manifests the shell would validate: not property lists.
        for job in a.shell.ran.map(\.job) {
            #expect((try? Manifest.parse(job.manifest, configuration: .builtIn).get()) == nil)
        }
        // The store still works.
        _ = a.store.submit([try a.drop("after", sleepManifest("after"))])
        #expect(eventually { a.shell.ran.contains { $0.job.id == "after" } })
    }

    /// Rows are input, and a node's memory is bounded: a row whose manifest is bigger than a manifest may be is
    /// recorded rejected without being read; rows past the claim's budget (the shell's operations at 16 bytes
    /// each) come back empty and are handed back, then claimed when the shell has room for them.
    @Test func aClaimReadsNoMoreThanItsBudgetNorAnOversizedManifest() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database, jobSlots: 8, maxManifestBytes: 5000)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { a.store.snapshot()?.refreshedAt != nil })
        let columns = "(id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)"
        func row(_ id: String, _ bytes: Int) -> String {
            "('\(id)', '\(id)', convert_to(repeat('x', \(bytes)), 'UTF8'), '\(id).plist', 'elsewhere', 2, 2, '{default}', '{}')"
        }
        try server.psql(database, "INSERT INTO opq_jobs \(columns) VALUES \(row("huge", 6000)), \(row("s1", 400)), \(row("s2", 400)), \(row("s3", 400))")
        a.store.want(room: 8, manifestBytes: 500)
        #expect(eventually { a.shell.ran.count == 2 })
        #expect(a.shell.ran.map(\.job.id) == ["s1", "s2"])
        #expect(eventually { (try? server.psql(database, "SELECT state FROM opq_jobs WHERE id = 's3'")).map(trimmed) == "waiting" },
                "s3 is handed back")
        #expect(trimmed(try server.psql(database, "SELECT state || ' ' || status FROM opq_jobs WHERE id = 'huge'")) == "finished rejected")
        let why = trimmed(try server.psql(database, "SELECT convert_from(result, 'UTF8') FROM opq_jobs WHERE id = 'huge'"))
        #expect(why.contains("6000 bytes, more than the 5000"), "\(why)")
        // Room for more: s3 comes.
        a.store.want(room: 6, manifestBytes: 1000)
        #expect(eventually { a.shell.ran.count == 3 })
        #expect(a.shell.ran.last?.job.id == "s3" && a.shell.ran.last?.job.manifest.count == 400)
    }

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
            "('\(job.key)', '\(job.key)', '\\x00', '\(job.key).plist', 'a', 2, 2, '{}', '{}', 'finished', 'a', \(i + 1), 'succeeded', now() - interval '\(job.value) days')"
        }
        if rows.isEmpty { return (server, database) }
        try server.psql(database, """
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands, state, node, fence, status, finished_at)
            VALUES \(rows.joined(separator: ", "))
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
        #expect(again.logs.all.contains { $0.message.contains("pruned 1 finished job(s)") })
    }

    /// With the history: a node silent for longer than keepFinishedDays (7 by default), holding nothing, is forgotten
    /// (`status` no longer lists it, its queues are no longer accepted); one silent for 3 days is down, not gone.
    @Test func nodesGoneLongerThanTheHistoryAreForgotten() throws {
        let (server, database) = try databaseWithFinishedJobs([:])
        try server.psql(database, """
            INSERT INTO opq_nodes (node, queues, commands, job_slots, last_heartbeat)
            VALUES ('gone', '{default,gpu}', '{}', 4, now() - interval '8 days'), ('away', '{default,tape}', '{}', 4, now() - interval '3 days')
            """)
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { trimmed((try? server.psql(database, "SELECT string_agg(node, ',' ORDER BY node) FROM opq_nodes")) ?? "") == "a,away" })
        #expect(a.logs.all.contains { $0.message.contains("node gone forgotten: silent for more than 7 days") })
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
        #expect(eventually { count("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%pg_sleep(5)%' AND pid <> pg_backend_pid()") == "1" })
        usleep(200_000)

        let a = try ClusterNode("a", server: server, database: database, leaseSeconds: 2)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { count("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM opq_jobs%'") == "1" },
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
        #expect(eventually { ((try? server.psql(database, "SELECT 'gpu' = ANY(queues) FROM opq_nodes WHERE node = 'a'")) ?? "").contains("t") })
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
        try server.psql(database, "UPDATE opq_jobs SET queues = '{gpu}' WHERE id = 'pinned'")
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
        try server.psql(database, "ALTER TABLE opq_jobs RENAME COLUMN queues TO queues_gone")
        let b = try ClusterNode("b", server: server, database: database, leaseSeconds: 3, queues: ["gpu": ["maxConcurrentOperationCount": 1]])
        defer { b.close() }
        _ = b.store.recovered([])
        #expect(eventually { a.logs.all.contains { $0.message.contains("finding jobs no live node can run") } }, "the backlog's reads fail")
        #expect(eventually { a.store.snapshot()?.nodes.map(\.node) == ["a", "b"] }, "b listed all the same")
        let manifest = plist(sleepManifest("g", queue: "gpu"))
        #expect(eventually { (try? Manifest.parse(manifest, configuration: a.store.submissionConfiguration(.builtIn)).get()) != nil },
                "a accepts a queue only b declares")
    }

    /// How often a node reads the status snapshot: every leaseSeconds/3, and twenty times as long as its reads of
    /// the waiting jobs last took when that is longer (0.6–0.7 s at a million waiting jobs).
    @Test func statusReadsThinOutAsTheBacklogGrows() {
        #expect(ClusterJobStore.statusPeriod(5, backlogReadsTook: 0.01) == 5)
        #expect(ClusterJobStore.statusPeriod(5, backlogReadsTook: 0.65) == 13)
        #expect(ClusterJobStore.statusPeriod(1, backlogReadsTook: 0) == 1)
    }
}

@Suite struct SharedOutboxTests {
    /// Publication under sharedOutbox: assembled in .tmp, renamed into place, active/<job> gone; run again (a
    /// crash after the rename) it only removes what is left; a half-made .tmp copy is made again; an entry of that
    /// name holding another manifest (a rejected manifest's on another node, a user's folder) is left alone and the
    /// job takes <job>.1.
    @Test func placeSharedAssemblesThenRenames() throws {
        let root = NSTemporaryDirectory() + "opq-shared-\(UInt64.random(in: 1...UInt64.max))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        let spool = try Spool(root: root + "/spool")
        let shared = root + "/shared"
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        func make(_ job: String, result: String, manifest: String? = nil) throws {
            try FileManager.default.createDirectory(atPath: spool.active + "/\(job)/out", withIntermediateDirectories: true)
            try Data((manifest ?? "m-\(job)").utf8).write(to: URL(fileURLWithPath: spool.active + "/\(job)/manifest.plist"))
            try Data(result.utf8).write(to: URL(fileURLWithPath: spool.active + "/\(job)/result.plist"))
            try Data("x".utf8).write(to: URL(fileURLWithPath: spool.active + "/\(job)/out/a.png"))
        }
        for job in ["one", "two"] { try make(job, result: "r-\(job)") }
        #expect(try spool.placeShared(job: "one", in: shared) == "one")
        #expect(try String(contentsOfFile: shared + "/one/result.plist", encoding: .utf8) == "r-one")
        #expect(FileManager.default.fileExists(atPath: shared + "/one/out/a.png"))
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/one"))
        #expect((try FileManager.default.contentsOfDirectory(atPath: shared + "/.tmp")).isEmpty)

        // A crash left a half copy in .tmp and active/two in place: made again.
        try FileManager.default.createDirectory(atPath: shared + "/.tmp/two", withIntermediateDirectories: true)
        try Data("partial".utf8).write(to: URL(fileURLWithPath: shared + "/.tmp/two/junk"))
        #expect(try spool.placeShared(job: "two", in: shared) == "two")
        #expect(!FileManager.default.fileExists(atPath: shared + "/two/junk"))
        #expect(try String(contentsOfFile: shared + "/two/result.plist", encoding: .utf8) == "r-two")

        // A crash after the rename: active/one is back (as recovery would find it, its result staged again); the
        // placed entry (the same manifest) stays as is.
        try make("one", result: "again")
        #expect(try spool.placeShared(job: "one", in: shared) == "one")
        #expect(try String(contentsOfFile: shared + "/one/result.plist", encoding: .utf8) == "r-one")
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/one"))
        #expect(!FileManager.default.fileExists(atPath: shared + "/one.1"))

        // Another job under the same id (another manifest): shared/one is not its, it becomes shared/one.1.
        try make("one", result: "r-other", manifest: "m-other")
        #expect(try spool.placeShared(job: "one", in: shared) == "one.1")
        #expect(try String(contentsOfFile: shared + "/one/result.plist", encoding: .utf8) == "r-one")
        #expect(try String(contentsOfFile: shared + "/one.1/result.plist", encoding: .utf8) == "r-other")
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/one"))
    }
}

/// The pure part: leases, deadlines, fences, cancels, suspensions, connection lines.
@Suite struct ClusterNodeStateTests {
    @Test func deadlineCountsFromTheLastBeatSent() {
        var s = ClusterNodeState(leaseSeconds: 15)
        #expect(s.deadline == nil && !s.mayTakeLeases(now: 0))
        let news = s.connectionSucceeded()
        #expect(news)
        _ = s.beatSucceeded(sentAt: 100, held: [:])
        #expect(s.deadline == 114 && s.mayTakeLeases(now: 113.9) && !s.mayTakeLeases(now: 114))
        // A beat answered late but sent earlier does not move the deadline back.
        _ = s.beatSucceeded(sentAt: 90, held: [:])
        #expect(s.deadline == 114)
        #expect(ClusterNodeState(leaseSeconds: 2).margin == 0.4)
        s.hold("j", fence: 7)
        #expect(s.watchdogDeadline == 114)
        #expect(s.checkDeadline(now: 113.99).lost.isEmpty)
        #expect(s.checkDeadline(now: 114).lost == ["j"])
        #expect(s.held.isEmpty && s.watchdogDeadline == nil)
    }

    @Test func beatsFindLostJobsAndOrphans() {
        var s = ClusterNodeState(leaseSeconds: 15)
        s.hold("a", fence: 1)
        s.hold("b", fence: 2)
        s.hold("c", fence: 3)
        _ = s.beginCompleting(["c"])
        let result = s.beatSucceeded(sentAt: 1, held: ["a": 1, "b": 20, "z": 9])
        #expect(result.lost == ["b"], "another fence: lost; an end being recorded is left to its answer")
        #expect(result.orphans == ["b": 20, "z": 9])
        #expect(s.held.keys.sorted() == ["a", "c"])
        #expect(s.endCompleting(["c"], recorded: []) == ["c"])
        #expect(s.held.keys.sorted() == ["a"])
        _ = s.beginCompleting(["a"])
        #expect(s.endCompleting(["a"], recorded: nil).isEmpty && s.held["a"]?.completing == false, "no answer: the batch waits")
        #expect(s.checkDeadline(now: 1000).lost == ["a"])
    }

    @Test func recordedBeforeARestartIsPublishedWithoutTheDatabase() {
        var s = ClusterNodeState(leaseSeconds: 15)
        s.hold("r", fence: 5, recorded: true)
        #expect(s.beatSucceeded(sentAt: 1, held: [:]).lost.isEmpty)
        #expect(s.checkDeadline(now: 1000).lost.isEmpty)
        #expect(s.alreadyRecorded(["r", "x"]) == ["r"])
    }

    @Test func cancelsPassedOnOncePerFence() {
        var s = ClusterNodeState(leaseSeconds: 15)
        s.hold("j", fence: 4)
        let requests: [(job: String, operation: String?, fence: Int64)] = [("j", nil, 4), ("j", "op", 4), ("j", nil, 3), ("k", nil, 1)]
        #expect(s.newCancels(requests).map { "\($0.job)/\($0.operation ?? "*")" } == ["j/*", "j/op"])
        #expect(s.newCancels(requests).isEmpty)
        s.forget("j")
        s.hold("j", fence: 8)
        #expect(s.newCancels([("j", nil, 8)]).count == 1, "a new claim of the job hears its cancels again")
    }

    @Test func suspensionsAndConnectionLinesOnChangesOnly() {
        var s = ClusterNodeState(leaseSeconds: 15)
        #expect(s.suspendedRead([]) == [])
        #expect(s.suspendedRead([]) == nil)
        #expect(s.suspendedRead(["io"]) == ["io"])
        let lines = [s.connectionFailed(), s.connectionFailed(), s.connectionSucceeded(), s.connectionSucceeded(), s.connectionFailed()]
        #expect(lines == [true, false, true, false, true])
    }

    /// The wake-up probe as pure state: a probe heard keeps wake-ups `arriving` and sets the next a minute later;
    /// one missed is tried again at once, two missed in a row say `notArriving` once; a probe heard later says
    /// `arriving` again. Another node's token, or a probe lost with a listener that reconnected, judges nothing.
    @Test func wakeupProbeSaysOnceWhenWakeupsStopAndWhenTheyCome() {
        var p = WakeupProbe()
        #expect(!p.due(now: 0), "nothing before the listener is up")
        p.listenerConnected(now: 10)
        #expect(p.due(now: 10))
        p.sent("t1", now: 10)
        #expect(!p.due(now: 10) && p.nextEvent() == 10 + WakeupProbe.wait)
        #expect(p.heard("another node's", now: 10.1) == nil)
        #expect(p.heard("t1", now: 10.2) == nil, "arriving was assumed: nothing to say")
        #expect(p.heardCount == 1 && p.nextEvent() == 10.2 + WakeupProbe.every)
        #expect(!p.due(now: 60) && p.due(now: 70.2))

        p.sent("t2", now: 71)
        #expect(p.check(now: 73) == nil, "not yet waited long enough")
        #expect(p.check(now: 74) == nil, "one miss: tried again at once")
        #expect(p.due(now: 74))
        p.sent("t3", now: 74)
        #expect(p.check(now: 77) == .notArriving)
        #expect(p.verdict == .notArriving && !p.due(now: 100) && p.due(now: 137))
        p.sent("t4", now: 137)
        #expect(p.check(now: 140) == nil, "said once")
        p.sent("t5", now: 140)
        #expect(p.heard("t5", now: 140.5) == .arriving)

        // A probe in flight when the listener dropped is not a miss.
        p.sent("t6", now: 300)
        p.listenerDisconnected()
        #expect(p.check(now: 400) == nil && !p.due(now: 400) && p.nextEvent() == nil)
        p.listenerConnected(now: 401)
        #expect(p.heard("t6", now: 401) == nil && p.due(now: 401))
        // A probe that could not be sent is not a miss either; another goes `wait` later.
        p.sent("t7", now: 401)
        p.notSent(now: 401)
        #expect(p.check(now: 410) == nil && p.verdict == .arriving && p.due(now: 401 + WakeupProbe.wait))
    }

    @Test func slotsDroppedAtTheDeadline() {
        var s = ClusterNodeState(leaseSeconds: 3)
        _ = s.connectionSucceeded()
        _ = s.beatSucceeded(sentAt: 10, held: [:])
        s.addSlot(.init(queue: "api", slot: 1, fence: 9))
        #expect(abs((s.watchdogDeadline ?? 0) - 12.4) < 1e-9)
        #expect(s.checkDeadline(now: 12.5).slots.count == 1)
        let removed = s.removeSlot(.init(queue: "api", slot: 1, fence: 9))
        #expect(!removed)
    }
}

/// What a node's heartbeat says of the jobs it runs (for `show` on other nodes): read back as sent, bounded (a job
/// that does not fit is left out whole, the others still sent), and anything else in its place ignored.
@Suite("Cluster progress")
struct ClusterProgressTests {
    @Test func progressRoundTripsWithinItsBudgetAndGarbageIsIgnored() throws {
        let small = [(id: "a", state: OperationState.succeeded, attempts: 1, queue: "io"), (id: "b", state: .executing, attempts: 2, queue: "default"),
                     (id: "c", state: .pending, attempts: 0, queue: "gpu")]
        let huge = (0..<20_000).map { (id: "op\($0)", state: OperationState.ready, attempts: 0, queue: "default") }
        let bytes = ClusterProgress.encode([("small", small), ("huge", huge), ("other", [(id: "x", state: .cancelled, attempts: 0, queue: "q")])])
        #expect(bytes.count <= ClusterProgress.budget)
        let read = try #require(ClusterProgress.decode(bytes, job: "small"))
        #expect(read.mapValues { "\($0.state)/\($0.attempts)/\($0.queue)" } == ["a": "succeeded/1/io", "b": "executing/2/default", "c": "pending/0/gpu"])
        #expect(ClusterProgress.decode(bytes, job: "huge") == nil, "left out whole: its operations show unknown")
        #expect(ClusterProgress.decode(bytes, job: "other")?["x"]?.state == "cancelled")
        #expect(ClusterProgress.decode(bytes, job: "nosuch") == nil)
        // The bound holds whatever the ids: jobs just under the estimate, with long operation ids.
        let long = (0..<12).map { j in ("job\(j)", (0..<400).map { (id: String(repeating: "x", count: 40) + "\($0)", state: OperationState.pending, attempts: 0, queue: "default") }) }
        let full = ClusterProgress.encode(long, budget: 64 * 1024)
        #expect(full.count <= 64 * 1024 && full.count > 32 * 1024, "\(full.count)")
        for garbage: [UInt8] in [[], [0, 1, 2], Array("bplist00".utf8), Array("<plist><string>x</string></plist>".utf8)] {
            #expect(ClusterProgress.decode(garbage, job: "small") == nil)
        }
        // Entries of the wrong shape are dropped one by one, the rest kept.
        let odd = PlistBinaryWriter.document(.dictionary(PlistDictionary(["j": .dictionary(PlistDictionary([
            "ok": .array([.integer(4), .integer(1), .string("io")]), "state99": .array([.integer(99), .integer(1), .string("io")]),
            "negative": .array([.integer(2), .integer(-1), .string("io")]), "short": .array([.integer(2), .integer(1)]),
            "queueless": .array([.integer(2), .integer(1), .integer(3)]), "text": .string("x")]))])))
        #expect(ClusterProgress.decode(odd, job: "j").map { Array($0.keys) } == ["ok"])
    }

    /// A heartbeat never waits for a slow sample (the engine's lock held by a huge submission): it sends the last one
    /// made, and one sample runs at a time.
    @Test func aSlowSampleNeverHoldsTheBeatUp() throws {
        let sampler = ProgressSampler(patience: 0.05)
        let release = DispatchSemaphore(value: 0)
        let made = Mutex(0)
        let slow: @Sendable () -> [UInt8] = {
            made.withLock { $0 += 1 }
            release.wait()
            return [7]
        }
        #expect(sampler.sample(slow) == nil, "nothing made yet: the beat goes without")
        #expect(sampler.sample(slow) == nil, "still sampling: no second sample started")
        #expect(made.withLock { $0 } == 1)
        release.signal()
        #expect(pollUntil(10) { sampler.sample { [8] } == [8] ? true : nil } == true)
        #expect(sampler.sample { [9] } == [9], "a quick sample is sent at once")
    }
}
