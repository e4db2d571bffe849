// The JobStore contract, one suite run against both stores (River's driver test is the model): the file spool
// alone (SpoolJobStore) and the cluster (ClusterJobStore on a throwaway PostgreSQL, one node). Each case drives
// the store as the shell does — a manifest claimed from the inbox is submitted, the jobs the store gives this node
// run, their ends pass the publication gate, a later process of the node gets back what it held — and checks what
// both promise. Where the two differ by design, a check says what it expects from the store's stated
// `capabilities`, never from its kind (which only the harness uses, to build the store); how a job reaches `run`
// is the harness's business. The checks are split by concern: +Queries, +Control, +Gate, +Restart, +Flow.

import Foundation
import Logging
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

enum StoreKind: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case spool, cluster
    var testDescription: String { rawValue }
}

/// One node's store on its spool, as the shell would hold it.
final class JobStoreNode: @unchecked Sendable {
    let kind: StoreKind
    let spool: Spool
    let store: any JobStore
    let shell: FakeShell
    /// The store's delegate: `shell`, and what it does not record (`submitted`). Held here: the store's is weak.
    let recorder: RecordingShell
    private let closeStore: () -> Void
    private let reopen: () throws -> JobStoreNode
    private let takeOverHook: ((String) throws -> Void)?

    private init(kind: StoreKind, spool: Spool, store: any JobStore, shell: FakeShell, close: @escaping () -> Void,
                 reopen: @escaping () throws -> JobStoreNode, takeOver: ((String) throws -> Void)? = nil) {
        self.kind = kind
        self.spool = spool
        self.store = store
        self.shell = shell
        self.recorder = RecordingShell(shell)
        self.closeStore = close
        self.reopen = reopen
        self.takeOverHook = takeOver
        store.delegate = recorder
    }

    /// A fresh node (its own spool; for the cluster, its own database), already past recovery.
    static func make(_ kind: StoreKind) throws -> JobStoreNode {
        let folder = NSTemporaryDirectory() + "opq-conformance-\(kind)-\(UInt64.random(in: 1...UInt64.max))"
        switch kind {
        case .spool:
            let under = try spool(folder: folder, existing: nil)
            _ = under.store.recovered([])
            return under
        case .cluster:
            let server = try PostgresServer.shared.get()
            let database = try server.createDatabase()
            let under = try cluster(server: server, database: database, folder: folder, existing: nil)
            _ = under.store.recovered([])
            return under
        }
    }

    private static func spool(folder: String, existing: Spool?) throws -> JobStoreNode {
        let spool = try existing ?? Spool(root: folder)
        let store = SpoolJobStore(spool: spool)
        let shell = FakeShell()
        return JobStoreNode(kind: .spool, spool: spool, store: store, shell: shell,
                              close: { try? FileManager.default.removeItem(atPath: folder) },
                              reopen: { try Self.spool(folder: folder, existing: spool) })
    }

    private static func cluster(server: PostgresServer, database: String, folder: String, existing: Spool?) throws -> JobStoreNode {
        let node = try ClusterNode("n1", server: server, database: database, spoolFolder: folder, spool: existing)
        return JobStoreNode(kind: .cluster, spool: node.spool, store: node.store, shell: node.shell,
                              close: { node.close() },
                              reopen: {
                                  node.store.shutdown()
                                  return try Self.cluster(server: server, database: database, folder: folder, existing: node.spool)
                              },
                              takeOver: { job in
                                  _ = try server.psql(database, "UPDATE opq_live SET node = 'other', fence = nextval('opq_fence') "
                                                      + "WHERE id = '\(job)'")
                              })
    }

    /// The same node's next process on the same spool (this store stopped first; its files stay).
    func restarted() throws -> JobStoreNode { try reopen() }

    func close() { closeStore() }

    /// A manifest dropped into the inbox and claimed from it as the shell does, then submitted; returns the jobs
    /// the store gives this node to run within `seconds` (the spool: at once; the cluster: through `run`).
    func submitAndCollect(_ manifests: [(name: String, manifest: [String: Any])], expect count: Int,
                          within seconds: Double = 10) throws -> [ClaimedJob] {
        let claimed = try claim(manifests)
        let before = shell.ran.count
        var run = store.submit(claimed)
        store.want(room: 64, manifestBytes: .max)
        _ = eventually(seconds) { run.count + shell.ran.count - before >= count }
        run += shell.ran.dropFirst(before).map(\.job)
        return run
    }

    /// Manifests dropped into the inbox and claimed through the store as the shell claims them (the store sets them
    /// aside for submission where it places jobs, else makes them jobs here); the claims made durable.
    func claim(_ manifests: [(name: String, manifest: [String: Any])]) throws -> [ClaimedJob] {
        var claimed: [ClaimedJob] = []
        for (name, manifest) in manifests {
            try plist(manifest).write(to: URL(fileURLWithPath: store.folders.inbox + "/" + name + ".plist"))
            var outcome = try store.claim(name + ".plist", now: Date().timeIntervalSince1970, settled: true) { _ in false }
            for _ in 0..<50 {
                if case .busy = outcome { usleep(100_000) } else { break }
                outcome = try store.claim(name + ".plist", now: Date().timeIntervalSince1970, settled: true) { _ in false }
            }
            guard case .claimed(let job) = outcome else { throw SupportFailure("inbox/\(name).plist was not claimed: \(outcome)") }
            claimed.append(job)
        }
        try store.commit()
        return claimed
    }

    /// What the shell does at start: the store cleans up its spool and says what it holds; each job is read back.
    func recover() throws -> (jobs: [ClaimedJob], problems: [String]) {
        let (held, problems) = try store.recoverHeld()
        let jobs = try held.jobs.map { id, done in
            var job = try store.heldJob(id).get()
            job.done = done
            job.cancels = held.cancels(of: job)
            return job
        }
        return (jobs, problems)
    }

    /// Another node takes `job` over under a new fence (the cluster's database changed under this node); only for a
    /// store that leases jobs.
    func takeOver(_ job: String) throws {
        guard let takeOverHook else { throw SupportFailure("\(kind): no store to take \(job) over in") }
        try takeOverHook(job)
    }

    /// What the shell's publication does once the gate let a job through: the store places it in its outbox.
    func publish(_ job: String) throws {
        if !store.hasFolder(job: job) {
            try FileManager.default.createDirectory(atPath: store.folders.job(job), withIntermediateDirectories: true)
        }
        let (folder, name) = try store.place(job: job) { _ in false }
        guard folder == store.outbox.folder, name == job else { throw SupportFailure("\(job) was placed as \(folder)/\(name)") }
    }

    /// A job's end as the shell makes it: its result.plist staged through the store.
    func end(_ job: String, _ status: String = "succeeded") throws -> JobEnd {
        if !store.hasFolder(job: job) {
            try FileManager.default.createDirectory(atPath: store.folders.job(job), withIntermediateDirectories: true)
        }
        let bytes = plist(["job": job, "status": status])
        try store.stage(job: job) { sink in try bytes.withUnsafeBytes { try sink($0) } }
        return JobEnd(job: job, status: status, resultFile: store.stagedResult(job: job))
    }
}

@Suite("JobStore conformance", .serialized, .onItsOwnExecutor)
struct JobStoreConformanceTests {
    /// Every manifest submitted reaches `run` on this (only) node exactly once, under the id it asked for, with
    /// its manifest's bytes in active/<id>/ and the inbox file gone. (Three: within the test node's job slots.)
    @Test(arguments: StoreKind.allCases) func eachSubmissionRunsOnce(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let manifests = (0..<3).map { (name: "m\($0)", manifest: sleepManifest("job-\($0)")) }
        let run = try node.submitAndCollect(manifests, expect: 3)
        usleep(300_000)
        // Where the store places jobs, the three came through `run`: anything past them ran twice.
        let again = node.shell.ran.count - (node.store.capabilities.contains(.placesJobs) ? 3 : 0)
        #expect(Set(run.map(\.id)) == Set((0..<3).map { "job-\($0)" }))
        #expect(run.count == 3 && again == 0, "\(kind): \(run.map(\.id)) then \(again) more")
        for i in 0..<3 {
            #expect(
                try Data(contentsOf: URL(fileURLWithPath: node.spool.active + "/job-\(i)/manifest.plist")) == plist(manifests[i].manifest))
            #expect(!FileManager.default.fileExists(atPath: node.spool.inbox + "/m\(i).plist"))
        }
    }

    /// Two manifests asking for one id: both run, under distinct ids (the second `id.1`, SPEC §2).
    @Test(arguments: StoreKind.allCases) func aTakenIDIsRenamed(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let run = try node.submitAndCollect([("first", sleepManifest("same")), ("second", sleepManifest("same"))], expect: 2)
        #expect(Set(run.map(\.id)) == ["same", "same.1"], "\(kind): \(run.map(\.id))")
        #expect(run.allSatisfy { $0.id == "same" || $0.requestedJob == "same" })
    }

    /// The publication gate: every end of a job this node runs is let through, and only once it is let through
    /// does a cancel for it answer `alreadyEnded`; an id nobody submitted is `unknownJob`.
    @Test(arguments: StoreKind.allCases) func theGateLetsThroughWhatRunsHere(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let run = try node.submitAndCollect([("g", sleepManifest("gated"))], expect: 1)
        #expect(run.map(\.id) == ["gated"])
        #expect(node.store.requestCancel(job: "nobody-submitted-this", operation: nil) == .unknownJob)
        #expect(try node.store.complete([node.end("gated")]) == ["gated"])
        try node.publish("gated")
        #expect(node.store.requestCancel(job: "gated", operation: nil) == .alreadyEnded)
        #expect(node.shell.lostJobs.isEmpty)
    }

    /// A later process of the node, on the same spool, gets back (to resume) every job it ran that had not
    /// ended, and nothing else is taken from it.
    @Test(arguments: StoreKind.allCases) func aRestartResumesWhatItHeld(_ kind: StoreKind) throws {
        let first = try JobStoreNode.make(kind)
        let run = try first.submitAndCollect([("r1", sleepManifest("held-1")), ("r2", sleepManifest("held-2"))], expect: 2)
        #expect(run.count == 2)
        let next = try first.restarted()
        defer { next.close() }
        let (found, problems) = try next.recover()
        #expect(problems.isEmpty)
        let resumed = next.store.recovered(found)
        #expect(Set(resumed.map(\.id)) == ["held-1", "held-2"], "\(kind): \(resumed.map(\.id))")
        #expect(next.shell.lostJobs.isEmpty)
        #expect(try next.store.complete([next.end("held-1"), next.end("held-2")]) == ["held-1", "held-2"])
    }

    /// What a manifest is validated against contains this node's own configuration.
    @Test(arguments: StoreKind.allCases) func submissionsValidateAgainstTheLocalConfiguration(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        _ = eventually { node.store.acceptsSubmissions }
        #expect(node.store.acceptsSubmissions)
        let local = try Configuration.parse(plist(["queues": ["photos": ["maxConcurrentOperationCount": 2]]]))
        let widened = node.store.submissionConfiguration(local)
        #expect(widened.queues["photos"] != nil && widened.queues["default"] != nil)
    }
}
