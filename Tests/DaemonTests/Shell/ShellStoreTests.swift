// The shell (Shell/Daemon.swift) against a store that is not the file spool: what it asks the store at each point,
// the slot a publication frees, the inbox names it is told of. (The lifecycle it drives: JobModelTests.)

import Foundation
import JobModel
import Logging
import Synchronization
import Testing
import TestSupport
@testable import Daemon
import TestTraits

/// A JobStore the test steers: ends it refuses are lost, every job has an origin, cancels are noted.
private final class FakeStore: SpoolBacked, @unchecked Sendable {
    let spool: Spool
    let lock = NSLock()
    weak var delegate: (any JobStoreDelegate)?
    var refused: Set<String> = []
    var completed: [JobEnd] = []
    var cancels: [String] = []
    var node: String? { "n1" }
    var capabilities: StoreCapabilities { [] }
    func submissionConfiguration(_ local: Configuration) -> Configuration { local }
    func recovered(_ jobs: [ClaimedJob]) -> [ClaimedJob] { jobs }
    func submit(_ jobs: [ClaimedJob]) -> [ClaimedJob] { jobs }
    func want(room: Int, manifestBytes: Int) {}
    func ending(_ jobs: [String]) {}
    func complete(_ ends: [JobEnd]) throws -> Set<String> {
        lock.withLock {
            completed += ends
            return Set(ends.map(\.job)).subtracting(refused)
        }
    }
    func origin(of job: String) -> JobOrigin? { JobOrigin(submittedOn: "n0", fromNode: job == "d" ? "n9" : nil) }
    func requestCancel(job: String, operation: String?) -> StoreCancelOutcome {
        lock.withLock { cancels.append(job) }
        return .requested
    }
    func setSuspended(_ queue: String, _ suspended: Bool) -> Bool { false }
    func reload(_ configuration: Configuration) {}
    var acceptsSubmissions: Bool { true }
    func shutdown() {}
    init(spool: Spool) { self.spool = spool }
}

/// Each entry's OPQ_STATE and OPQ_JOB (and OPQ_FROM_NODE), for the test to read.
private final class Log: Sendable {
    let captured = CapturedLog()
    func has(_ state: String, _ job: String) -> [String: String]? {
        captured.all.first { $0.fields["OPQ_STATE"] == state && $0.fields["OPQ_JOB"] == job }?.fields
    }
}

/// A one-operation `sleep` job placed in the inbox the way submitters should (a hidden name, renamed) and reported.
private func dropSleepJob(_ job: String, seconds: Double, root: String, daemon: Daemon) {
    let data = plist(["job": job, "operations": [["id": "a", "kind": "sleep", "seconds": seconds]]])
    _ = FileManager.default.createFile(atPath: root + "/inbox/." + job, contents: data)
    rename(root + "/inbox/." + job, root + "/inbox/" + job + ".plist")
    daemon.scan(hints: [job + ".plist"])
}

private func eventually(_ seconds: Double = 20, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(10_000)
    }
    return condition()
}

@Suite(.onItsOwnExecutor) struct ShellStoreTests {
    @Test func theShellCallsTheStoreAtEachPointAndDropsWhatItLoses() async throws {
        let root = NSTemporaryDirectory() + "opq-shell-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let spool = try Spool(root: root)
        let log = Log()
        let logger = log.captured.logger(label: "test")
        let store = FakeStore(spool: spool)
        let daemon = Daemon(configuration: .builtIn, configPath: nil, logger: logger, store: store)
        #expect(store.delegate != nil, "the shell is the store's delegate")
        daemon.start()
        func drop(_ job: String, seconds: Double) { dropSleepJob(job, seconds: seconds, root: root, daemon: daemon) }
        func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: root + "/" + path) }

        // Recorded by the store: published, with the node and where it was submitted.
        drop("a", seconds: 0)
        #expect(eventually { exists("outbox/a/result.plist") })
        let result = try #require(
            try PropertyListSerialization.propertyList(from: Data(contentsOf: URL(fileURLWithPath: root + "/outbox/a/result.plist")),
                                                       format: nil) as? [String: Any])
        #expect(result["node"] as? String == "n1")
        #expect(result["submittedOn"] as? String == "n0")
        #expect(store.lock.withLock { store.completed.map(\.job) } == ["a"])
        #expect(store.lock.withLock { store.completed.first?.resultFile } == spool.stagedResult(job: "a"))

        // Not recorded (another node holds it): lost, nothing published, its folder gone.
        store.lock.withLock { store.refused = ["b"] }
        drop("b", seconds: 0)
        #expect(eventually { log.has("lost", "b") != nil })
        #expect(eventually { !exists("active/b") })
        #expect(!exists("outbox/b"))
        #expect(log.has("finished", "b") == nil)

        // Lost while running: stopped, dropped from status, nothing published.
        drop("c", seconds: 30)
        #expect(eventually { daemon.status().executing == 1 })
        #expect(daemon.status().activeJobs == ["c"])
        store.delegate?.lost(["c"], reason: "lease ran out")
        #expect(eventually { !exists("active/c") })
        #expect(daemon.status().activeJobs.isEmpty)
        #expect(log.has("lost", "c")?["OPQ_ERROR"] == "lease ran out")
        #expect(eventually { daemon.status().executing == 0 })
        usleep(200_000)
        #expect(!exists("outbox/c"))

        // A cancel for a job not here is the store's.
        #expect(daemon.cancel(job: "elsewhere", operation: nil) == .cancelled)
        #expect(store.lock.withLock { store.cancels } == ["elsewhere"])

        // Claimed for this node by the store: logged `claimed` with the node it was taken from, and run.
        try FileManager.default.createDirectory(atPath: root + "/active/d", withIntermediateDirectories: true)
        let manifest = plist(["job": "d", "operations": [["id": "a", "kind": "sleep", "seconds": 0]]])
        _ = FileManager.default.createFile(atPath: root + "/active/d/manifest.plist", contents: manifest)
        store.delegate?.run([ClaimedJob(id: "d", requestedJob: nil, manifestName: "d.plist", receivedAt: Date().timeIntervalSince1970,
                                        manifest: manifest, tree: nil, done: [:])])
        #expect(eventually { exists("outbox/d/result.plist") })
        #expect(log.has("claimed", "d")?["OPQ_FROM_NODE"] == "n9")
        #expect(log.has("received", "d") == nil)

        // A claimed row that does not validate here ends rejected, published here.
        try FileManager.default.createDirectory(atPath: root + "/active/e", withIntermediateDirectories: true)
        let bad = plist(["job": "e", "operations": [["id": "a", "kind": "nosuchkind"]]])
        _ = FileManager.default.createFile(atPath: root + "/active/e/manifest.plist", contents: bad)
        store.delegate?.run([ClaimedJob(id: "e", requestedJob: nil, manifestName: "e.plist", receivedAt: Date().timeIntervalSince1970,
                                        manifest: bad, tree: nil, done: [:])])
        #expect(eventually { exists("outbox/e/result.plist") })
        #expect(log.has("rejected", "e") != nil)
        await daemon.stop(grace: 1)
    }
}

@Suite(.onItsOwnExecutor) struct PublicationSlotTests {
    /// A job's slot is free once its folder is in the outbox: the next job is claimed while the commit that makes
    /// the rename durable (a syncfs: 7–40 ms on a journalled disk) is under way, and each job is announced
    /// `finished` only after it. Before, every job held its slot through that commit (measured: a third of the
    /// jobs per second of a node at the default maxActiveJobs).
    @Test func theNextJobIsClaimedWhileTheLastOnesOutboxEntryIsMadeDurable() async throws {
        let root = NSTemporaryDirectory() + "opq-slot-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let spool = try Spool(root: root)
        let log = Log()
        var configuration = Configuration.builtIn
        configuration.maxActiveJobs = 1
        func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: root + "/" + path) }
        // 0: not yet; 1: holding the commit that covers a's rename into the outbox; 2: let go.
        let gate = Mutex(0)
        let release = DispatchSemaphore(value: 0)
        let daemon = Daemon(configuration: configuration, configPath: nil, logger: log.captured.logger(label: "test"),
                            store: SpoolJobStore(spool: spool),
                            beforeCommit: {
            let hold = gate.withLock { state in
                guard state == 0, FileManager.default.fileExists(atPath: root + "/outbox/a") else { return false }
                state = 1
                return true
            }
            if hold { release.wait() }
        })
        daemon.start()
        func drop(_ job: String, seconds: Double) { dropSleepJob(job, seconds: seconds, root: root, daemon: daemon) }

        drop("a", seconds: 0)
        #expect(eventually { gate.withLock { $0 } == 1 }, "a reaches the outbox and the commit after it is held")
        drop("b", seconds: 30)
        // a holds no slot while its rename is made durable: b, the one job maxActiveJobs allows, is claimed (it
        // starts once that same commit has made its claim durable too).
        #expect(eventually(10) { exists("active/b/manifest.plist") }, "b is claimed while a's outbox entry is not yet durable")
        #expect(!exists("inbox/b.plist"))
        #expect(log.has("finished", "a") == nil, "a is announced only once its entry is durable")
        gate.withLock { $0 = 2 }
        release.signal()
        #expect(eventually { log.has("finished", "a") != nil })
        #expect(eventually { daemon.status().executing == 1 })
        #expect(daemon.status().activeJobs == ["b"])
        #expect(daemon.cancel(job: "b", operation: nil) == .cancelled)
        #expect(eventually { log.has("finished", "b")?["OPQ_STATUS"] == "cancelled" })
        #expect(exists("outbox/a/result.plist") && exists("outbox/b/result.plist"))
        await daemon.stop(grace: 1)
    }
}

@Suite(.onItsOwnExecutor) struct CancelCommitTests {
    /// A client is told an operation is cancelled only once its progress line is committed (as a whole job's cancel
    /// is): a crash of the machine after the answer cannot forget it. Before, the line waited for the next group
    /// commit (progressCommitDelay, 50 ms) after the answer.
    @Test func anOperationsCancelIsCommittedBeforeItIsAnswered() async throws {
        let root = NSTemporaryDirectory() + "opq-cancelcommit-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let spool = try Spool(root: root)
        // Set by each commit that covers the cancel's line (it was written before the commit began).
        let covered = Mutex(false)
        let daemon = Daemon(configuration: .builtIn, configPath: nil, logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() },
                            store: SpoolJobStore(spool: spool),
                            beforeCommit: {
            let progress = (try? String(contentsOfFile: root + "/active/.progress.log", encoding: .utf8)) ?? ""
            if progress.contains("job\ta\tcancelled\t") { covered.withLock { $0 = true } }
        })
        daemon.start()
        let data = plist(["job": "job", "operations": [["id": "s", "kind": "sleep", "seconds": 30],
                                                      ["id": "a", "kind": "sleep", "seconds": 0, "dependencies": ["s"]]]])
        _ = FileManager.default.createFile(atPath: root + "/inbox/.job", contents: data)
        rename(root + "/inbox/.job", root + "/inbox/job.plist")
        daemon.scan(hints: ["job.plist"])
        #expect(eventually { daemon.status().executing == 1 })
        #expect(daemon.cancel(job: "job", operation: "a") == .cancelled)
        #expect(covered.withLock { $0 }, "committed before the answer")
        #expect(daemon.cancel(job: "job", operation: nil) == .cancelled)
        await daemon.stop(grace: 1)
    }
}

@Suite(.onItsOwnExecutor) struct InboxHintTests {
    /// Names inotify reports are claimed without reading the inbox again; a job's end is no reason to read it
    /// either. The inbox here also holds 2,000 hidden files (a writer's temporaries): each read costs them all.
    /// Before, every claim and every job's end read the whole folder (one read per manifest or more).
    @Test func reportedNamesAreClaimedWithoutReadingTheInboxAgain() async throws {
        let root = NSTemporaryDirectory() + "opq-hints-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let spool = try Spool(root: root)
        for i in 0..<2000 { _ = FileManager.default.createFile(atPath: root + "/inbox/.partial-\(i)", contents: Data([0])) }
        let daemon = Daemon(configuration: .builtIn, configPath: nil,
                            logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() },
                            store: SpoolJobStore(spool: spool))
        daemon.start()
        daemon.scan()
        let started = Date()
        let jobs = 150
        for i in 0..<jobs {
            let job = "h\(i)"
            let data = plist(["job": job, "operations": [["id": "a", "kind": "sleep", "seconds": 0]]])
            _ = FileManager.default.createFile(atPath: root + "/inbox/." + job, contents: data)
            rename(root + "/inbox/." + job, root + "/inbox/" + job + ".plist")
            daemon.scan(hints: [job + ".plist"], complete: true)
        }
        #expect(eventually(60) {
            (try? FileManager.default.contentsOfDirectory(atPath: root + "/outbox"))?.filter { !$0.hasPrefix(".") }.count == jobs
        })
        let elapsed = Date().timeIntervalSince(started)
        // The reads allowed: the one at start, the one asked for above, and one per rescan interval (2 s)
        // while names keep being reported.
        let reads = spool.inboxReads.withLock { $0 }
        #expect(reads <= 3 + Int(elapsed / InboxIntake.rescanInterval),
                "\(reads) whole reads of the inbox for \(jobs) reported manifests in \(elapsed) s")

        // A name nobody reported is found by the read a complete=false scan (start, overflow, timer) asks for.
        let data = plist(["job": "unreported", "operations": [["id": "a", "kind": "sleep", "seconds": 0]]])
        _ = FileManager.default.createFile(atPath: root + "/inbox/.unreported", contents: data)
        rename(root + "/inbox/.unreported", root + "/inbox/unreported.plist")
        daemon.scan()
        // A liveness bound, as above: its claim and publication wait for syncfs of a file system other suites also write.
        #expect(eventually(60) { FileManager.default.fileExists(atPath: root + "/outbox/unreported/result.plist") })
        await daemon.stop(grace: 1)
    }

}
