// The job lifecycle (Lifecycle/JobLifecycle.swift) as a pure state machine: events in, actions out, no I/O.
// Groups are plain integers here (the machine is generic over the engine's group id).

import Testing
@testable import Daemon

private typealias Machine = JobLifecycle<Int>

@Suite struct JobLifecycleTests {
    private func machine(jobs: Int = 4, operations: Int = 100) -> Machine {
        Machine(maxActiveJobs: jobs, maxActiveOperations: operations)
    }

    /// Received from the inbox, planned and submitted as group `group`.
    private func running(_ m: inout Machine, _ job: String, operations: Int = 3, group: Int) {
        _ = m.handle(.received(job: job, .inbox(manifest: job + ".plist")))
        _ = m.handle(.planned(job: job, operations: operations, recovered: 0))
        _ = m.handle(.submitted(job: job, group: group))
    }

    @Test func aJobGoesFromReceivedToPublished() {
        var m = machine()
        #expect(m.handle(.received(job: "a", .inbox(manifest: "a.plist"))) == [.journal(.received(job: "a", manifest: "a.plist"))])
        #expect(m.phase(of: "a") == .received)
        #expect(m.activeOperations == 0, "operations count once the plan is read")
        #expect(
            m.handle(.planned(job: "a", operations: 3, recovered: 1)) == [.journal(.accepted(job: "a", operations: 3)), .submit(job: "a")])
        #expect(m.phase(of: "a") == .accepted)
        #expect(m.activeOperations == 3)
        #expect(m.handle(.submitted(job: "a", group: 7)) == [])
        #expect(m.phase(of: "a") == .running)
        #expect(m.job(of: 7) == "a")
        #expect(m.handle(.operationEnded(group: 7)) == [])
        #expect(m.progress("a")?.operations == 3)
        #expect(m.progress("a")?.ended == 2, "one ended here, one before the restart")
        #expect(m.handle(.groupFinished(group: 7, status: .failed, error: "b: boom"))
                    == [.publish(job: "a", status: .failed, error: "b: boom")])
        #expect(m.phase(of: "a") == .finishing)
        #expect(m.activeOperations == 3, "counted until published")
        #expect(m.handle(.published(job: "a")) == [.releaseGroup(7)])
        #expect(m.phase(of: "a") == nil)
        #expect(m.job(of: 7) == nil)
        #expect(m.activeOperations == 0)
        #expect(m.isEmpty)
    }

    @Test func resumedJobsAreNotLoggedAsReceivedAndClaimedOnesNameTheirNode() {
        var m = machine()
        #expect(m.handle(.received(job: "r", .resumed)) == [])
        #expect(m.handle(.received(job: "c", .claimed(fromNode: "n2"))) == [.journal(.claimed(job: "c", fromNode: "n2"))])
        #expect(m.handle(.received(job: "c", .claimed(fromNode: nil))) == [], "a job already in the table is not received twice")
        #expect(m.count == 2)
    }

    @Test func aRejectedJobIsPublishedWithItsProblems() {
        var m = machine()
        _ = m.handle(.received(job: "bad", .inbox(manifest: "bad.plist")))
        #expect(m.handle(.rejected(job: "bad", problems: ["x", "y"], error: "x\ny")) == [
            .journal(.rejected(job: "bad", problems: ["x", "y"], error: "x\ny")), .publish(job: "bad", status: .rejected, error: "x\ny"),
        ])
        #expect(m.phase(of: "bad") == .rejected)
        #expect(m.handle(.cancel(job: "bad", operation: nil, knownOperation: true)) == [.answer(.alreadyEnded)])
        #expect(m.handle(.groupFinished(group: 1, status: .succeeded, error: nil)) == [], "no group: nothing to finish")
        #expect(m.handle(.published(job: "bad")) == [], "no group to release")
        #expect(m.isEmpty)
    }

    @Test func aRefusedSubmissionRejectsAndKeepsCountingUntilPublished() {
        var m = machine()
        _ = m.handle(.received(job: "a", .resumed))
        _ = m.handle(.planned(job: "a", operations: 5, recovered: 0))
        _ = m.handle(.cancel(job: "a", operation: nil, knownOperation: true))
        #expect(m.handle(.rejected(job: "a", problems: ["cycle"], error: "cycle!"))
                    .last == .publish(job: "a", status: .rejected, error: "cycle!"))
        #expect(m.activeOperations == 5)
        _ = m.handle(.published(job: "a"))
        #expect(m.activeOperations == 0)
    }

    @Test func cancelsBeforeTheGroupExistAreAppliedWhenItIsSubmitted() {
        var m = machine()
        _ = m.handle(.received(job: "a", .inbox(manifest: "a.plist")))
        // Before the plan is read, any operation name is taken (checked once the group exists).
        #expect(m.handle(.cancel(job: "a", operation: "zz", knownOperation: false)) == [.answer(.cancelled)])
        _ = m.handle(.planned(job: "a", operations: 2, recovered: 0))
        // After, an unknown operation is refused at once.
        #expect(m.handle(.cancel(job: "a", operation: "nope", knownOperation: false)) == [.answer(.unknownOperation)])
        #expect(m.handle(.cancel(job: "a", operation: "b", knownOperation: true)) == [.answer(.cancelled)])
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: true)) == [.answer(.cancelled)])
        #expect(m.handle(.submitted(job: "a", group: 3)) == [
            .cancelOperation(job: "a", group: 3, operation: "zz"), .cancelOperation(job: "a", group: 3, operation: "b"), .cancelGroup(3),
        ])
        #expect(m.handle(.groupFinished(group: 3, status: .cancelled, error: nil)) == [.publish(job: "a", status: .cancelled, error: nil)])
    }

    @Test func cancelsAfterTheGroupExistGoToTheEngine() {
        var m = machine()
        running(&m, "a", group: 9)
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: true)) == [.cancelGroup(9), .answer(.cancelled)])
        #expect(m.handle(.cancel(job: "a", operation: "b", knownOperation: true))
                    == [.cancelOperation(job: "a", group: 9, operation: "b"), .answer(.cancelled)])
        #expect(m.handle(.cancel(job: "a", operation: "nope", knownOperation: false)) == [.answer(.unknownOperation)])
        _ = m.handle(.groupFinished(group: 9, status: .cancelled, error: nil))
        // Finishing: the engine answers for the operation; the whole job's cancel is harmless.
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: true)) == [.cancelGroup(9), .answer(.cancelled)])
    }

    @Test func aJobNotInTheTableIsTheStoresToAnswer() {
        var m = machine()
        #expect(m.handle(.cancel(job: "elsewhere", operation: nil, knownOperation: false)) == [.answer(.notHere)])
        running(&m, "a", group: 1)
        _ = m.handle(.groupFinished(group: 1, status: .succeeded, error: nil))
        _ = m.handle(.published(job: "a"))
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: false)) == [.answer(.notHere)], "published: the outbox answers")
    }

    @Test func aJobLostWhileRunningIsStoppedAndDiscardedOnceItsGroupEnds() {
        var m = machine()
        running(&m, "a", operations: 4, group: 5)
        #expect(m.handle(.lost(job: "a", reason: "lease ran out")) == [.journal(.lost(job: "a", reason: "lease ran out")), .cancelGroup(5)])
        #expect(m.phase(of: "a") == nil)
        #expect(m.activeOperations == 0, "its operations no longer count")
        #expect(m.handle(.operationEnded(group: 5)) == [])
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: true)) == [.answer(.notHere)])
        // Its group ends (cancelled): released, folder discarded, nothing published.
        #expect(m.handle(.groupFinished(group: 5, status: .cancelled, error: nil)) == [.releaseGroup(5), .discard(job: "a")])
        #expect(m.handle(.groupFinished(group: 5, status: .cancelled, error: nil)) == [], "once")
        #expect(m.handle(.published(job: "a")) == [], "a publication that was queued does not bring it back")
        #expect(m.handle(.lost(job: "a", reason: "again")) == [], "lost twice: logged once")
    }

    /// A job the store has no record of any more (its database restored from an older backup) is stopped as a lost
    /// one is, and its folder then given back to the store to be submitted again instead of removed.
    @Test func aJobTheStoreForgotIsStoppedThenSubmittedAgain() {
        var m = machine()
        running(&m, "a", operations: 3, group: 7)
        #expect(
            m.handle(.lost(job: "a", reason: "no row", resubmit: true)) == [.journal(.lost(job: "a", reason: "no row")), .cancelGroup(7)])
        #expect(m.activeOperations == 0)
        #expect(m.handle(.groupFinished(group: 7, status: .cancelled, error: nil)) == [.releaseGroup(7), .resubmit(job: "a")])
        #expect(m.isEmpty)
        // Not yet running: at once.
        _ = m.handle(.received(job: "b", .claimed(fromNode: nil)))
        _ = m.handle(.planned(job: "b", operations: 1, recovered: 0))
        #expect(m.handle(.lost(job: "b", reason: "no row", resubmit: true))
                    == [.journal(.lost(job: "b", reason: "no row")), .resubmit(job: "b")])
    }

    @Test func aJobLostWhileFinishingIsDiscardedAtOnce() {
        var m = machine()
        running(&m, "a", group: 2)
        _ = m.handle(.groupFinished(group: 2, status: .succeeded, error: nil))
        #expect(
            m.handle(.lost(job: "a", reason: "taken over")) == [.journal(.lost(job: "a", reason: "taken over")), .releaseGroup(2),
                                                                .discard(job: "a")])
        #expect(m.handle(.published(job: "a")) == [])
        #expect(m.isEmpty)
    }

    @Test func aJobLostBeforeItsGroupExistsIsDiscardedAtOnce() {
        var m = machine()
        _ = m.handle(.received(job: "a", .claimed(fromNode: nil)))
        _ = m.handle(.planned(job: "a", operations: 2, recovered: 0))
        #expect(m.handle(.lost(job: "a", reason: "x")) == [.journal(.lost(job: "a", reason: "x")), .discard(job: "a")])
        #expect(m.activeOperations == 0)
        // A submission that comes anyway is stopped and dropped.
        #expect(m.handle(.submitted(job: "a", group: 4)) == [.cancelGroup(4)])
        #expect(m.handle(.groupFinished(group: 4, status: .cancelled, error: nil)) == [.releaseGroup(4), .discard(job: "a")])
    }

    @Test func admissionCountsJobsAndOperations() {
        var m = machine(jobs: 2, operations: 10)
        #expect(m.admission == .room(jobs: 2, operations: 10))
        _ = m.handle(.received(job: "a", .resumed))
        #expect(m.admission == .room(jobs: 1, operations: 10), "a job being read takes a slot")
        _ = m.handle(.planned(job: "a", operations: 6, recovered: 0))
        #expect(m.admission == .room(jobs: 1, operations: 4))
        _ = m.handle(.submitted(job: "a", group: 1))
        _ = m.handle(.extended(job: "a", operations: 4, recovered: 0))
        #expect(m.admission == .full, "the operation budget is spent")
        _ = m.handle(.configured(maxActiveJobs: 2, maxActiveOperations: 20))
        #expect(m.admission == .room(jobs: 1, operations: 10))
        _ = m.handle(.received(job: "b", .resumed))
        #expect(m.admission == .full, "no room for jobs")
        _ = m.handle(.handedOver(job: "b"))
        #expect(m.admission == .room(jobs: 1, operations: 10), "a job handed to the store leaves the table")
    }

    @Test func faultsAndStoppingPauseClaiming() {
        var m = machine()
        _ = m.handle(.fault("reading the inbox failed: EIO"))
        #expect(m.admission == .paused("reading the inbox failed: EIO"))
        _ = m.handle(.fault(nil))
        #expect(m.admission == .room(jobs: 4, operations: 100))
        _ = m.handle(.stopping)
        #expect(m.admission == .stopping)
        _ = m.handle(.fault("x"))
        #expect(m.admission == .stopping, "stopping wins")
    }

    @Test func onceEndsWhenTheNamesFromTheStartAreTriedAndNothingRuns() {
        var m = machine()
        #expect(!m.onceDone, "without --once never done")
        running(&m, "resumed", group: 1)
        _ = m.handle(.once(names: ["x.plist", "y.plist"]))
        #expect(m.onceAllows("x.plist"))
        #expect(!m.onceAllows("late.plist"))
        _ = m.handle(.onceTried(name: "x.plist"))
        #expect(!m.onceAllows("x.plist"))
        _ = m.handle(.onceTried(name: "y.plist"))
        #expect(!m.onceDone, "a job still runs")
        _ = m.handle(.groupFinished(group: 1, status: .succeeded, error: nil))
        #expect(!m.onceDone)
        _ = m.handle(.published(job: "resumed"))
        #expect(m.onceDone)
    }

    @Test func eventsForUnknownJobsAreIgnored() {
        var m = machine()
        #expect(m.handle(.planned(job: "ghost", operations: 3, recovered: 0)) == [])
        #expect(m.handle(.extended(job: "ghost", operations: 3, recovered: 0)) == [])
        #expect(m.handle(.rejected(job: "ghost", problems: [], error: "")) == [])
        #expect(m.handle(.operationEnded(group: 42)) == [])
        #expect(m.activeOperations == 0)
        #expect(m.isEmpty)
    }
}

// MARK: The shell (Shell/Daemon.swift) against a store that is not the file spool

import Foundation
import Logging
import Synchronization
import TestSupport

/// A JobStore the test steers: ends it refuses are lost, every job has an origin, cancels are noted.
private final class FakeStore: JobStore, @unchecked Sendable {
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

@Suite struct ShellStoreTests {
    @Test func theShellCallsTheStoreAtEachPointAndDropsWhatItLoses() async throws {
        let root = NSTemporaryDirectory() + "opq-shell-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let spool = try Spool(root: root)
        let log = Log()
        let logger = log.captured.logger(label: "test")
        let store = FakeStore()
        let daemon = Daemon(spool: spool, configuration: .builtIn, configPath: nil, logger: logger, store: store)
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

@Suite struct PublicationSlotTests {
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
        let daemon = Daemon(spool: spool, configuration: configuration, configPath: nil, logger: log.captured.logger(label: "test"),
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

@Suite struct InboxHintTests {
    /// Names inotify reports are claimed without reading the inbox again; a job's end is no reason to read it
    /// either. The inbox here also holds 2,000 hidden files (a writer's temporaries): each read costs them all.
    /// Before, every claim and every job's end read the whole folder (one read per manifest or more).
    @Test func reportedNamesAreClaimedWithoutReadingTheInboxAgain() async throws {
        let root = NSTemporaryDirectory() + "opq-hints-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let spool = try Spool(root: root)
        for i in 0..<2000 { _ = FileManager.default.createFile(atPath: root + "/inbox/.partial-\(i)", contents: Data([0])) }
        let daemon = Daemon(spool: spool, configuration: .builtIn, configPath: nil,
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
        #expect(eventually { FileManager.default.fileExists(atPath: root + "/outbox/unreported/result.plist") })
        await daemon.stop(grace: 1)
    }

}

extension JobLifecycleTests {
    @Test func aDelayedJobHoldsNoSlotIsAcceptedOnceAndACancelWakesIt() {
        var m = machine(jobs: 1)
        _ = m.handle(.received(job: "d", .inbox(manifest: "d.plist")))
        #expect(m.admission == .full)
        #expect(m.handle(.delayed(job: "d", operations: 2, until: 100)) == [
            .journal(.accepted(job: "d", operations: 2)), .journal(.delayed(job: "d", until: 100))])
        #expect(m.phase(of: "d") == .delayed)
        #expect(m.jobs["d"]?.notBefore == 100)
        #expect(m.admission == .room(jobs: 1, operations: 100), "a delayed job holds no slot and no operations")
        #expect(m.handle(.cancel(job: "d", operation: "a", knownOperation: false)) == [.answer(.cancelled)], "waits with the job")
        #expect(m.phase(of: "d") == .delayed)
        #expect(m.handle(.due(job: "d")) == [])
        #expect(m.phase(of: "d") == .received)
        #expect(m.admission == .full)
        #expect(m.handle(.planned(job: "d", operations: 2, recovered: 0)) == [.submit(job: "d")], "accepted is not logged twice")
        #expect(m.takeEarlyCancels(job: "d") == ["a"])

        _ = m.handle(.received(job: "e", .resumed))
        _ = m.handle(.delayed(job: "e", operations: 1, until: 200))
        #expect(m.handle(.cancel(job: "e", operation: nil, knownOperation: false)) == [.wake(job: "e"), .answer(.cancelled)])
        #expect(m.phase(of: "e") == .received)
        #expect(m.handle(.due(job: "e")) == [], "a woken job is not due again")
        _ = m.handle(.received(job: "f", .resumed))
        _ = m.handle(.delayed(job: "f", operations: 1, until: 300))
        _ = m.handle(.lost(job: "f", reason: "gone"))
        #expect(m.delayedCount == 0)
    }

    @Test func aParkedJobLeavesTheTableForACountAndComesBackDelayed() {
        var m = machine(jobs: 1)
        _ = m.handle(.received(job: "p", .inbox(manifest: "p.plist")))
        _ = m.handle(.delayed(job: "p", operations: 3, until: 500))
        #expect(m.handle(.parked(job: "p")) == [])
        #expect(m.phase(of: "p") == nil && m.isEmpty, "no entry in the table")
        #expect(m.parkedCount == 1 && m.delayedCount == 0)
        #expect(m.admission == .room(jobs: 1, operations: 100))
        #expect(m.handle(.unparked(job: "p", until: 500)) == [])
        #expect(m.phase(of: "p") == .delayed && m.jobs["p"]?.notBefore == 500)
        #expect(m.parkedCount == 0 && m.delayedCount == 1)
        #expect(m.handle(.cancel(job: "p", operation: nil, knownOperation: false)) == [.wake(job: "p"), .answer(.cancelled)])
        #expect(m.handle(.planned(job: "p", operations: 3, recovered: 0)) == [.submit(job: "p")], "accepted was logged when delayed")

        // One holding a cancel of a single operation is not parked (the cancel would be lost with its entry).
        _ = m.handle(.received(job: "q", .resumed))
        _ = m.handle(.delayed(job: "q", operations: 1, until: 600))
        _ = m.handle(.cancel(job: "q", operation: "a", knownOperation: false))
        _ = m.handle(.parked(job: "q"))
        #expect(m.phase(of: "q") == .delayed && m.parkedCount == 0)
        // Only a delayed job is parked.
        _ = m.handle(.parked(job: "p"))
        #expect(m.phase(of: "p") == .accepted && m.parkedCount == 0)
        _ = m.handle(.parkedCounted(4))
        #expect(m.parkedCount == 4)
    }

    @Test func onceWaitsForParkedJobs() {
        var m = machine(jobs: 1)
        _ = m.handle(.once(names: []))
        _ = m.handle(.received(job: "p", .resumed))
        _ = m.handle(.delayed(job: "p", operations: 1, until: 500))
        _ = m.handle(.parked(job: "p"))
        #expect(m.isEmpty && !m.onceDone, "a parked job is still to run")
        _ = m.handle(.unparked(job: "p", until: 500))
        _ = m.handle(.due(job: "p"))
        _ = m.handle(.lost(job: "p", reason: "gone"))
        #expect(m.onceDone)
    }
}
