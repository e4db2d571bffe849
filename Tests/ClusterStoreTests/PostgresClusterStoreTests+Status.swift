// Status reads the jobs waiting and running once (LiveGroups) where it read them three times (the nodes' jobs, the
// queues' counts, the jobs no live node can run): what it derives must be what those reads give.

@testable import ClusterStore
import Testing
import TestSupport

extension PostgresClusterStoreTests {
    @Test func oneReadOfTheLiveJobsGivesWhatThreeGave() async throws {
        let (store, under) = try await makePostgresStore()
        defer { Task { await under.close() } }
        #expect(try await store.migrate() == Migrations.newest)
        try await store.registerNode(node("a", queues: ["default", "io"]))
        try await store.registerNode(node("b", queues: ["io"], commands: ["ffmpeg"]))
        _ = try await store.insertJobs((1...5).map { job("d\($0)") } + (1...3).map { job("i\($0)", queues: ["default", "io"]) }
                                       + [job("f", queues: ["io"], commands: ["ffmpeg"])])
        _ = try await store.claimJobs(node: "a", limit: 3, queues: ["default", "io"], commands: [], budget: .max, maxManifestBytes: .max)
        _ = try await store.claimJobs(node: "b", limit: 5, queues: ["io"], commands: ["ffmpeg"], budget: .max, maxManifestBytes: .max)
        func agree() async throws -> LiveSummary {
            let nodes = try await store.nodes(leaseSeconds: 60, countingJobs: false)
            #expect(nodes.allSatisfy { $0.jobs == 0 }, "not counted when not asked")
            let summary = LiveSummary(try await store.liveGroups(), nodes: nodes)
            let counted = try await store.nodes(leaseSeconds: 60)
            #expect(summary.runningByNode == Dictionary(counted.filter { $0.jobs > 0 }.map { ($0.node, $0.jobs) }) { a, _ in a })
            #expect(summary.queues == (try await store.queueCounts()))
            #expect(summary.someWaitNoLiveNodeCanRun == !(try await store.jobsNoLiveNodeCanRun(leaseSeconds: 60, limit: 10)).isEmpty)
            return summary
        }
        let first = try await agree()
        #expect(first.runningByNode == ["a": 3, "b": 1] && !first.someWaitNoLiveNodeCanRun)
        #expect(first.queues == [QueueCount(queue: "default", waiting: 5, running: 3), QueueCount(queue: "io", waiting: 3, running: 1)])
        _ = try await store.insertJobs([job("g", queues: ["gpu"]), job("split", queues: ["default"], commands: ["ffmpeg"])])
        let second = try await agree()
        #expect(second.someWaitNoLiveNodeCanRun)
        await under.close()
    }
}
