// The store conformance suite (River's riverdrivertest): each check takes a factory that makes a fresh, empty,
// migrated store, so that every ClusterStore (PostgreSQL now, the file spool when the daemon is redrawn) is held
// to the same behaviour. Checks use only the protocol.

import ClusterStore
import Foundation
import Synchronization
import Testing

struct StoreUnderTest: Sendable {
    let store: any ClusterStore
    let close: @Sendable () async -> Void
}

typealias StoreFactory = @Sendable () async throws -> StoreUnderTest

func job(_ id: String, qos: Int = 2, priority: Int = 2, queues: [String] = ["default"], commands: [String] = [],
         on node: String = "n1") -> NewJob {
    NewJob(requestedID: id, manifest: Array("<plist>\(id)</plist>".utf8), manifestName: "\(id).plist",
           submittedOn: node, qosRank: qos, priorityRank: priority, queues: queues, commands: commands)
}

func node(_ name: String, queues: [String] = ["default"], commands: [String] = [], limits: [String: Int] = [:]) -> NodeDeclaration {
    NodeDeclaration(node: name, queues: queues, commands: commands, jobSlots: 8, clusterLimits: limits, info: "test")
}

enum StoreConformance {
    static func withStore(_ factory: StoreFactory, _ body: (any ClusterStore) async throws -> Void) async throws {
        let under = try await factory()
        do {
            try await body(under.store)
        } catch {
            await under.close()
            throw error
        }
        await under.close()
    }

    /// Schema 2: a submission repeated under the same key (a crash between the insert's commit and the removal
    /// of the local copy) inserts nothing and answers the first row's id, even when that id was renamed.
    static func idempotentSubmission(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            func keyed(_ id: String, _ key: String?) -> NewJob {
                var j = job(id)
                j.submissionKey = key
                return j
            }
            #expect(try await store.insertJobs([keyed("s", "n1/s/1.5")]).map(\.id) == ["s"])
            #expect(try await store.insertJobs([keyed("s", "n1/s.1/2.5")]).map(\.id) == ["s.1"])
            // Again, in a batch with a new one: the two known keys answer their rows, the new one is inserted.
            let again = try await store.insertJobs([keyed("s", "n1/s.1/2.5"), keyed("s", "n1/s/1.5"), keyed("s", "n1/s.2/3.5")])
            #expect(again.map(\.id) == ["s.1", "s", "s.2"])
            // Keyless inserts never collide with each other on the key.
            #expect(try await store.insertJobs([keyed("t", nil), keyed("t", nil)]).map(\.id) == ["t", "t.1"])
            let claimed = try await store.claimJobs(node: "n1", limit: 100, queues: ["default"], commands: [], budget: .max,
                                                    maxManifestBytes: .max)
            #expect(claimed.map(\.id).sorted() == ["s", "s.1", "s.2", "t", "t.1"], "each submission exactly once")
        }
    }

    /// A node hands back jobs it gave up: only under its own fence, back to waiting with from_node set.
    static func releaseJobs(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            try await store.registerNode(node("a"))
            _ = try await store.insertJobs([job("r1"), job("r2")])
            let claimed = try await store.claimJobs(node: "a", limit: 2, queues: ["default"], commands: [], budget: .max,
                                                    maxManifestBytes: .max)
            let fences = Dictionary(uniqueKeysWithValues: claimed.map { ($0.id, $0.fence) })
            #expect(try await store.releaseJobs(node: "b", fences).isEmpty, "another node's release moves nothing")
            #expect(try await store.releaseJobs(node: "a", ["r1": (fences["r1"] ?? 0) + 1000]).isEmpty, "a stale fence moves nothing")
            #expect(try await store.releaseJobs(node: "a", ["r1": fences["r1"] ?? 0]) == ["r1"])
            let again = try await store.claimJobs(node: "b", limit: 2, queues: ["default"], commands: [], budget: .max,
                                                  maxManifestBytes: .max)
            #expect(again.map(\.id) == ["r1"] && again.first?.fromNode == "a")
            #expect(try await store.heartbeat(node: "a").held.keys.sorted() == ["r2"])
        }
    }

    /// Command signatures travel with the declaration; every node's are readable by all.
    static func commandSignatures(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            var a = node("a", commands: ["gzip"])
            a.commandSignatures = ["gzip": "queue=io;level:integer"]
            try await store.registerNode(a)
            var b = node("b", commands: ["ffmpeg"])
            b.commandSignatures = ["ffmpeg": "codec:oneOf(h264|vp9)"]
            try await store.registerNode(b)
            let declared = try await store.declared()
            #expect(declared.commands == ["ffmpeg", "gzip"])
            #expect(declared.commandSignatures == ["gzip": "queue=io;level:integer", "ffmpeg": "codec:oneOf(h264|vp9)"])
            // Status's per-queue counts: waiting and running, a job counting in each of its queues.
            _ = try await store.insertJobs([job("q1", queues: ["default", "io"]), job("q2", queues: ["io"])])
            #expect(try await store.claimJobs(node: "a", limit: 1, queues: ["io"], commands: [], budget: .max, maxManifestBytes: .max)
                        .map(\.id) == ["q2"])
            #expect(try await store.queueCounts() == [QueueCount(queue: "default", waiting: 1, running: 0),
                                                      QueueCount(queue: "io", waiting: 1, running: 1)])
        }
    }

    /// Ids unique across the cluster: `.1`, `.2`, … within a batch, across batches and across concurrent inserters.
    static func insertRenames(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            let first = try await store.insertJobs([job("a"), job("a"), job("b")])
            #expect(first.map(\.id) == ["a", "a.1", "b"])
            #expect(first.map(\.renamed) == [false, true, false])
            #expect(try await store.insertJobs([job("a")]).map(\.id) == ["a.2"])

            let inserters = 4, perInserter = 10
            let ids = try await withThrowingTaskGroup(of: [String].self) { group in
                for _ in 0..<inserters {
                    group.addTask {
                        var mine: [String] = []
                        for _ in 0..<perInserter / 2 {
                            mine += try await store.insertJobs([job("race"), job("race")]).map(\.id)
                        }
                        return mine
                    }
                }
                return try await group.reduce(into: [String]()) { $0 += $1 }
            }
            let expected = Set(["race"] + (1..<inserters * perInserter).map { "race.\($0)" })
            #expect(ids.count == inserters * perInserter)
            #expect(Set(ids) == expected, "every inserter got its own id, none skipped")
            let record = try #require(try await store.job("a.1"))
            #expect(record.requestedID == "a" && record.state == .waiting && record.manifest == Array("<plist>a</plist>".utf8))
        }
    }

    /// Highest QoS first, then queue priority, then submission order; fences grow.
    static func claimOrder(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            try await store.registerNode(node("n1"))
            _ = try await store.insertJobs([job("j1", qos: 2, priority: 2), job("j2", qos: 4, priority: 0)])
            _ = try await store.insertJobs([job("j3", qos: 2, priority: 4), job("j4", qos: 2, priority: 2),
                                            job("j5", qos: 0, priority: 4)])
            let first = try await store.claimJobs(node: "n1", limit: 2, queues: ["default"], commands: [], budget: .max,
                                                  maxManifestBytes: .max)
            #expect(first.map(\.id) == ["j2", "j3"])
            let rest = try await store.claimJobs(node: "n1", limit: 10, queues: ["default"], commands: [], budget: .max,
                                                 maxManifestBytes: .max)
            #expect(rest.map(\.id) == ["j1", "j4", "j5"])
            let fences = (first + rest).map(\.fence)
            #expect(Set(fences).count == 5)
            #expect(rest.allSatisfy { r in first.allSatisfy { $0.fence < r.fence } })
            #expect(try await store.claimJobs(node: "n1", limit: 10, queues: ["default"], commands: [], budget: .max,
                                              maxManifestBytes: .max).isEmpty)
            #expect(try await store.job("j1")?.node == "n1")
        }
    }

    /// A claim brings manifests back only within its budget (the first always) and each at most the largest a
    /// manifest may be; the others come back empty, sized, claimed all the same (the node hands them back).
    static func claimBudget(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            try await store.registerNode(node("n1"))
            func sized(_ id: String, _ bytes: Int) -> NewJob {
                var j = job(id)
                j.manifest = Array(repeating: UInt8(ascii: "x"), count: bytes)
                return j
            }
            _ = try await store.insertJobs([sized("b1", 400), sized("b2", 400), sized("b3", 400), sized("b4", 6000), sized("b5", 10)])
            let claimed = try await store.claimJobs(node: "n1", limit: 10, queues: ["default"], commands: [], budget: 1000,
                                                    maxManifestBytes: 5000)
            #expect(claimed.map(\.id) == ["b1", "b2", "b3", "b4", "b5"])
            #expect(claimed.map(\.manifestBytes) == [400, 400, 400, 6000, 10])
            // b3 starts before the budget is spent (800 < 1000); b4 is too big whatever the budget (and is not
            // counted); b5 comes after 1,200 bytes.
            #expect(claimed.map(\.manifest.count) == [400, 400, 400, 0, 0])
            _ = try await store.insertJobs([sized("c1", 3000), sized("c2", 10)])
            let first = try await store.claimJobs(node: "n1", limit: 10, queues: ["default"], commands: [], budget: 1,
                                                  maxManifestBytes: 5000)
            #expect(first.map(\.manifest.count) == [3000, 0], "the first always comes, whatever the budget")
        }
    }

    /// A job goes only to a node declaring all its queues and commands; until one is live, it is reported.
    static func pinning(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            try await store.registerNode(node("plain"))
            _ = try await store.insertJobs([job("gpu-job", queues: ["default", "gpu"]),
                                            job("ffmpeg-job", commands: ["ffmpeg"]),
                                            job("split", queues: ["gpu"], commands: ["ffmpeg"])])
            #expect(try await store.claimJobs(node: "plain", limit: 10, queues: ["default"], commands: [], budget: .max,
                                              maxManifestBytes: .max).isEmpty)
            let unrunnable = try await store.jobsNoLiveNodeCanRun(leaseSeconds: 60, limit: 10)
            #expect(unrunnable.map(\.id) == ["gpu-job", "ffmpeg-job", "split"])
            #expect(unrunnable.first?.missingQueues == ["gpu"] && unrunnable.first?.missingCommands == [])
            #expect(unrunnable.dropFirst().first?.missingCommands == ["ffmpeg"])

            try await store.registerNode(node("gpu", queues: ["default", "gpu"]))
            try await store.registerNode(node("media", queues: ["default"], commands: ["ffmpeg"]))
            let declared = try await store.declared()
            #expect(declared.queues == ["default", "gpu"] && declared.commands == ["ffmpeg"])
            // Every queue and command is declared somewhere, but no single node has gpu and ffmpeg.
            let split = try await store.jobsNoLiveNodeCanRun(leaseSeconds: 60, limit: 10)
            #expect(split.map(\.id) == ["split"] && split.first?.missingQueues == [] && split.first?.missingCommands == [])

            #expect(try await store.claimJobs(node: "gpu", limit: 10, queues: ["default", "gpu"], commands: [], budget: .max,
                                              maxManifestBytes: .max).map(\.id) == ["gpu-job"])
            #expect(try await store.claimJobs(node: "media", limit: 10, queues: ["default"], commands: ["ffmpeg"], budget: .max,
                                              maxManifestBytes: .max).map(\.id) == ["ffmpeg-job"])

            // Names the store does not validate travel intact (a batch carries them as JSON): quotes,
            // backslashes, commas, braces, non-ASCII, a control character.
            let odd = ["q\"uote", "back\\slash", "com,ma", "{brace}", "ünï", "tab\there"]
            _ = try await store.insertJobs([job("odd", queues: odd, commands: odd)])
            #expect(try await store.claimJobs(node: "gpu", limit: 10, queues: Array(odd.dropLast()), commands: odd, budget: .max,
                                              maxManifestBytes: .max).isEmpty)
            #expect(try await store.claimJobs(node: "gpu", limit: 10, queues: odd, commands: odd, budget: .max, maxManifestBytes: .max)
                        .map(\.id) == ["odd"])
        }
    }

    /// Two (here three) nodes claiming at once, many rounds: every job claimed exactly once.
    static func concurrentClaims(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            let total = 300
            for batch in stride(from: 0, to: total, by: 100) {
                _ = try await store.insertJobs((batch..<batch + 100).map { job("c\($0)", qos: $0 % 5, priority: $0 % 3) })
            }
            let claims = try await withThrowingTaskGroup(of: [String].self) { group in
                for n in 0..<3 {
                    group.addTask {
                        try await store.registerNode(node("claimer\(n)"))
                        var mine: [String] = []
                        while true {
                            let got = try await store.claimJobs(node: "claimer\(n)", limit: 7, queues: ["default"], commands: [],
                                                                budget: .max, maxManifestBytes: .max)
                            if got.isEmpty { return mine }
                            mine += got.map(\.id)
                        }
                    }
                }
                return try await group.reduce(into: [String]()) { $0 += $1 }
            }
            #expect(claims.count == total, "no job claimed twice")
            #expect(Set(claims) == Set((0..<total).map { "c\($0)" }), "every job claimed")
        }
    }

    /// A node's name belongs to the process that registered it (its `info`): another process's registration is
    /// refused — however long ago the holder beat by the database's clock — unless it names the holder's beat it
    /// has watched go unchanged for the holder's lease (by its own clock: SilenceWatch), and that is still the
    /// holder's last beat, or names the holder as the one it replaces (an earlier run of the node that is gone); a
    /// beat with `info` renews only the holder's own row.
    static func nodeNameHeldByOneProcess(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            var first = node("twin")
            first.info = "process one"
            var second = node("twin")
            second.info = "process two"
            #expect(try await store.registerNode(first, leaseSeconds: 3, replacing: nil, silentAt: nil))
            let seen = try #require(try await store.nodeOwner("twin"))
            #expect(seen.info == "process one" && seen.beat.node == "twin" && seen.beat.leaseSeconds == 3)
            #expect(try await store.nodeOwner("nobody") == nil)
            #expect(try await store.registerNode(second, leaseSeconds: 60, replacing: nil, silentAt: nil) == false,
                    "the holder may still run")
            #expect(try await store.registerNode(second, leaseSeconds: 60, replacing: "process three", silentAt: nil) == false)
            #expect(try await store.nodeOwner("twin")?.info == "process one", "a refused registration changes nothing")
            #expect(try await store.registerNode(first, leaseSeconds: 3, replacing: nil, silentAt: nil), "the holder registers again")
            #expect(try await store.heartbeat(node: "twin", info: "process two").registered == false, "not its row")
            #expect(try await store.heartbeat(node: "twin", info: "process one").registered)
            let now = try #require(try await store.nodeOwner("twin")).beat
            #expect(now.beat != seen.beat.beat, "each beat a new token")
            #expect(try await store.registerNode(second, leaseSeconds: 60, replacing: nil, silentAt: seen.beat.beat) == false,
                    "judged silent at a beat the holder has moved past")
            #expect(try await store.nodeOwner("twin")?.info == "process one")

            #expect(try await store.registerNode(second, leaseSeconds: 60, replacing: nil, silentAt: now.beat),
                    "silent since the beat watched: free")
            #expect(try await store.nodeOwner("twin")?.info == "process two")
            #expect(try await store.heartbeat(node: "twin", info: "process one").registered == false)
            #expect(try await store.registerNode(first, leaseSeconds: 3, replacing: "process two", silentAt: nil),
                    "replacing a process that is gone")
            #expect(try await store.nodeOwner("twin")?.info == "process one")
        }
    }

    /// Schema 5: a node is lost after its own leaseSeconds, whoever looks. The store hands each node's own lease out
    /// with its beat (the watcher judges by it: SilenceWatchTests); status and liveness judge the same way.
    static func eachNodeIsLostAfterItsOwnLease(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            try await store.registerNode(node("patient"), leaseSeconds: 60, replacing: nil, silentAt: nil)
            try await store.registerNode(node("hasty"), leaseSeconds: 0.5, replacing: nil, silentAt: nil)
            let beats = try await store.nodeBeats()
            #expect(beats.map(\.node) == ["hasty", "patient"])
            #expect(beats.map(\.leaseSeconds) == [0.5, 60])
            try await Task.sleep(for: .milliseconds(800))
            let nodes = try await store.nodes(leaseSeconds: 0.5)
            #expect(nodes.first { $0.node == "patient" }?.connected == true && nodes.first { $0.node == "hasty" }?.connected == false)
        }
    }

    /// A silent node's jobs go back after the lease, with from_node; the node beating is left alone; the lost
    /// node's completion records nothing; its next heartbeat shows what it lost.
    static func heartbeatAndTakeover(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            try await store.registerNode(node("A"))
            try await store.registerNode(node("B"))
            _ = try await store.insertJobs([job("t1"), job("t2"), job("t3")])
            let claimedByA = try await store.claimJobs(node: "A", limit: 2, queues: ["default"], commands: [], budget: .max,
                                                       maxManifestBytes: .max)
            let beat = try await store.heartbeat(node: "A")
            #expect(beat.registered && beat.held == Dictionary(uniqueKeysWithValues: claimedByA.map { ($0.id, $0.fence) }))
            #expect(try await store.heartbeat(node: "nobody").registered == false)
            // Asked about given ids, a beat answers for those the node holds among them: not a waiting job, not an
            // unknown one, nor one it holds and did not ask about.
            let asked = [claimedByA[0].id, "t3", "nope"].filter { $0 != claimedByA[1].id }
            let byIds = try await store.heartbeat(node: "A", info: nil, progress: nil, held: asked)
            #expect(byIds.registered && byIds.held == [claimedByA[0].id: claimedByA[0].fence], "\(byIds)")
            #expect(try await store.heartbeat(node: "A", info: nil, progress: nil, held: []).held.isEmpty)
            #expect(try await store.heartbeat(node: "B", info: nil, progress: nil, held: claimedByA.map(\.id)).held.isEmpty)

            // The progress a beat sends comes with each job the node runs, with the beat's time; never with a job
            // that waits; the next beat replaces it.
            let sent: [UInt8] = [1, 2, 3, 0, 255]
            let progressBeat = try await store.heartbeat(node: "A", info: nil, progress: sent, held: nil)
            let running = try #require(try await store.job(claimedByA[0].id))
            #expect(running.nodeProgress == sent && running.nodeProgressAt.map { abs($0 - progressBeat.at) < 0.001 } == true)
            #expect(try await store.job("t3").map { $0.nodeProgress == nil && $0.nodeProgressAt == nil } == true)
            _ = try await store.heartbeat(node: "A", info: nil, progress: [9], held: nil)
            #expect(try await store.job(claimedByA[1].id)?.nodeProgress == [9])
            // More than any node sends is not handed out (rows are input).
            _ = try await store.heartbeat(node: "A", info: nil, progress: [UInt8](repeating: 1, count: 65_537), held: nil)
            #expect(try await store.job(claimedByA[1].id).map { $0.state == .running && $0.nodeProgress == nil } == true)

            // Each beat changes the node's token; a node judged silent at a beat it has moved past keeps its jobs.
            let early = try await store.nodeBeats()
            let seen = try await store.nodeBeats()
            #expect(early == seen, "nothing beat between two reads")
            _ = try await store.heartbeat(node: "A")
            #expect(try await store.takeOverSilent(early.filter { $0.node == "A" }).jobs.isEmpty, "A beat since")
            // Judged silent at the beat it is still at: its jobs go back; B, which beat since, is left alone.
            let judged = try await store.nodeBeats()
            #expect(judged.first { $0.node == "A" }?.beat != early.first { $0.node == "A" }?.beat)
            _ = try await store.heartbeat(node: "B")
            let moved = try await store.takeOverSilent(judged)
            #expect(moved.nodes == ["A"])
            #expect(Set(moved.jobs.map(\.id)) == Set(claimedByA.map(\.id)))
            #expect(moved.jobs.allSatisfy { $0.fromNode == "A" })
            #expect(try await store.job(claimedByA[0].id).map { $0.state == .waiting && $0.nodeProgress == nil } == true)

            let claimedByB = try await store.claimJobs(node: "B", limit: 10, queues: ["default"], commands: [], budget: .max,
                                                       maxManifestBytes: .max)
            #expect(Set(claimedByB.map(\.id)) == Set(claimedByA.map(\.id) + ["t3"]))
            #expect(claimedByB.filter { $0.id != "t3" }.allSatisfy { $0.fromNode == "A" })
            #expect(claimedByB.first { $0.id == "t3" }?.fromNode == nil)

            // A comes back: it holds nothing and can record nothing.
            #expect(try await store.heartbeat(node: "A").held.isEmpty)
            #expect(try await store.heartbeat(node: "A", info: nil, progress: nil, held: claimedByA.map(\.id)).held.isEmpty)
            for lost in claimedByA {
                #expect(try await store.complete(job: lost.id, fence: lost.fence, status: "succeeded", result: []) == false)
            }
            let recorded = try await store.completeJobs(claimedByB.map {
                JobCompletion(job: $0.id, fence: $0.fence, status: "succeeded", result: Array("r".utf8))
            })
            #expect(recorded == Set(claimedByB.map(\.id)))
            let record = try #require(try await store.job(claimedByA[0].id))
            #expect(record.state == .finished && record.node == "B" && record.fromNode == "A" && record.status == "succeeded")
            #expect(record.result == Array("r".utf8) && record.finishedAt != nil)
        }
    }

    /// Only the current fence completes; a second completion records nothing.
    static func staleFence(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            try await store.registerNode(node("n1"))
            _ = try await store.insertJobs([job("f")])
            let claimed = try #require(
                try await store.claimJobs(node: "n1", limit: 1, queues: ["default"], commands: [], budget: .max, maxManifestBytes: .max)
                    .first)
            #expect(try await store.complete(job: "f", fence: claimed.fence + 1, status: "succeeded", result: []) == false)
            #expect(try await store.complete(job: "f", fence: claimed.fence - 1, status: "succeeded", result: []) == false)
            #expect(try await store.job("f")?.state == .running)
            #expect(try await store.complete(job: "f", fence: claimed.fence, status: "failed", result: [1, 2]) == true)
            #expect(try await store.complete(job: "f", fence: claimed.fence, status: "succeeded", result: []) == false)
            #expect(try await store.job("f")?.status == "failed")
        }
    }

    static func suspension(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            #expect(try await store.suspendedQueues().isEmpty)
            try await store.setSuspended("io", true)
            try await store.setSuspended("io", true)
            try await store.setSuspended("filters", true)
            #expect(try await store.suspendedQueues() == ["io", "filters"])
            try await store.setSuspended("io", false)
            try await store.setSuspended("never", false)
            #expect(try await store.suspendedQueues() == ["filters"])
        }
    }

    static func cancels(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            try await store.registerNode(node("n1"))
            #expect(try await store.requestCancel(job: "nope", operation: nil, notAfter: .infinity) == .unknownJob)
            _ = try await store.insertJobs([job("k"), job("other")])
            // Read after the asker's deadline (a server that was frozen meanwhile): refused, nothing recorded.
            let past = Date().timeIntervalSince1970 - 1
            #expect(try await store.requestCancel(job: "other", operation: nil, notAfter: past) == .late)
            #expect(try await store.requestCancel(job: "nope", operation: nil, notAfter: past) == .late)
            #expect(try await store.requestCancel(job: "k", operation: nil, notAfter: .infinity) == .requested)
            #expect(try await store.requestCancel(job: "k", operation: "op2", notAfter: .infinity) == .requested)
            // Not running on n1 yet: only the whole-job cancel of a job that waits, without a fence (any node takes it).
            #expect(try await store.pendingCancels(node: "n1") == [CancelRequest(job: "k", operation: nil, fence: nil)])
            let claimed = try await store.claimJobs(node: "n1", limit: 10, queues: ["default"], commands: [], budget: .max,
                                                    maxManifestBytes: .max)
            let k = try #require(claimed.first { $0.id == "k" })
            // The claim brings the cancels asked while the job waited, in order (nil: the whole job).
            #expect(k.cancels == [nil, "op2"])
            #expect(claimed.first { $0.id == "other" }?.cancels == [])
            let pending = try await store.pendingCancels(node: "n1")
            #expect(pending == [CancelRequest(job: "k", operation: nil, fence: k.fence),
                                CancelRequest(job: "k", operation: "op2", fence: k.fence)])
            #expect(try await store.complete(job: "k", fence: k.fence, status: "cancelled", result: []))
            #expect(try await store.pendingCancels(node: "n1").isEmpty)
            #expect(try await store.requestCancel(job: "k", operation: nil, notAfter: .infinity) == .alreadyEnded)
            // A waiting job cancelled as a whole is claimed for the node that asks, whatever that node declares (n2
            // declares nothing `gpu` needs); once, and never a job with no whole-job cancel or one already claimed.
            try await store.registerNode(node("n2", queues: ["default"]))
            _ = try await store.insertJobs([job("g", queues: ["gpu"]), job("h", queues: ["gpu"])])
            #expect(try await store.claimCancelled(job: "g", node: "n2", maxManifestBytes: .max) == nil, "no cancel asked")
            #expect(try await store.requestCancel(job: "g", operation: "op1", notAfter: .infinity) == .requested)
            #expect(try await store.claimCancelled(job: "g", node: "n2", maxManifestBytes: .max) == nil, "one operation's cancel")
            #expect(try await store.requestCancel(job: "g", operation: nil, notAfter: .infinity) == .requested)
            let g = try #require(try await store.claimCancelled(job: "g", node: "n2", maxManifestBytes: .max))
            #expect(g.id == "g" && g.cancels == ["op1", nil] && !g.manifest.isEmpty)
            #expect(try await store.claimCancelled(job: "g", node: "n1", maxManifestBytes: .max) == nil, "claimed already")
            #expect(try await store.pendingCancels(node: "n1").isEmpty, "g is n2's now, and h has no cancel")
            #expect(try await store.complete(job: "g", fence: g.fence, status: "cancelled", result: []))
            #expect(try await store.claimCancelled(job: "nope", node: "n2", maxManifestBytes: .max) == nil)
        }
    }

    /// Finished rows older than the horizon go in bounded batches; live ones stay.
    static func prune(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            try await store.registerNode(node("n1"))
            _ = try await store.insertJobs((0..<10).map { job("p\($0)") })
            let claimed = try await store.claimJobs(node: "n1", limit: 10, queues: ["default"], commands: [], budget: .max,
                                                    maxManifestBytes: .max)
            _ = try await store.completeJobs(claimed.map { JobCompletion(job: $0.id, fence: $0.fence, status: "succeeded", result: []) })
            _ = try await store.insertJobs([job("live")])
            #expect(try await store.prune(olderThanSeconds: 3600, batchSize: 3) == PruneReport(deleted: 0, batches: 1))
            try await Task.sleep(for: .milliseconds(20))
            #expect(try await store.prune(olderThanSeconds: 0, batchSize: 3) == PruneReport(deleted: 10, batches: 4))
            #expect(try await store.job("p0") == nil)
            #expect(try await store.job("live")?.state == .waiting)
        }
    }

    /// Wake-ups: the listener connects, then an insert, a suspend and a probe each wake it (the probe with its token).
    static func wakeups(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            let seen = Locked<[Wakeup]>([])
            // Off the shared cooperative pool, as everything of the store's (OnItsOwnExecutor).
            let reader = Task(executorPreference: ClusterExecutor(label: "test-wakeups")) {
                for await wakeup in store.wakeups { seen.withLock { $0.append(wakeup) } }
            }
            defer { reader.cancel() }
            #expect(try await eventually(within: 10) { seen.withLock { $0.contains(.connected) } })
            _ = try await store.insertJobs([job("w")])
            #expect(try await eventually(within: 5) { seen.withLock { $0.contains(.jobs) } })
            try await store.setSuspended("io", true)
            #expect(try await eventually(within: 5) { seen.withLock { $0.contains(.control) } })
            try await store.probeWakeups("n1/42")
            #expect(try await eventually(within: 5) { seen.withLock { $0.contains(.probe("n1/42")) } })
        }
    }
}

/// A value shared between test tasks.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<T: Sendable>(_ body: (inout Value) -> T) -> T { mutex.withLock { body(&$0) } }
}

/// Polls `condition` every 10 ms until it holds or `seconds` pass.
func eventually(within seconds: Double, _ condition: () -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try await Task.sleep(for: .milliseconds(10))
    }
    return condition()
}

extension Sequence where Element: Sendable {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for element in self { out.append(try await transform(element)) }
        return out
    }
}
