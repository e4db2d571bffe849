// LiveSummary: what status shows of the jobs waiting and running, from their groups. No I/O.

@testable import ClusterStore
import Testing

@Suite struct LiveSummaryTests {
    private func status(_ node: String, queues: [String], commands: [String] = [], live: Bool = true) -> NodeStatus {
        NodeStatus(node: node, queues: queues, commands: commands, jobSlots: 8, lastHeartbeat: 0, connected: live, jobs: 0)
    }

    @Test func countsEachNodesJobsAndEachQueuesAJobInEachOfItsQueues() {
        let summary = LiveSummary([
            LiveGroup(state: .running, node: "a", queues: ["default"], commands: [], jobs: 3),
            LiveGroup(state: .running, node: "a", queues: ["default", "io"], commands: [], jobs: 2),
            LiveGroup(state: .running, node: "b", queues: ["io"], commands: ["ffmpeg"], jobs: 1),
            LiveGroup(state: .waiting, node: nil, queues: ["default", "io"], commands: [], jobs: 7),
        ], nodes: [status("a", queues: ["default", "io"]), status("b", queues: ["io"], commands: ["ffmpeg"])])
        #expect(summary.runningByNode == ["a": 5, "b": 1])
        #expect(summary.queues == [QueueCount(queue: "default", waiting: 7, running: 5), QueueCount(queue: "io", waiting: 7, running: 3)])
        #expect(!summary.someWaitNoLiveNodeCanRun)
    }

    /// A waiting group is runnable only when one live node declares all its queues and all its commands: not when
    /// they are split across nodes, nor when only a node that is down declares them. Running jobs never count.
    @Test func aWaitingJobNoLiveNodeCanRun() {
        let nodes = [status("gpu", queues: ["default", "gpu"]), status("media", queues: ["default"], commands: ["ffmpeg"]),
                     status("down", queues: ["default", "gpu"], commands: ["ffmpeg"], live: false)]
        func unrunnable(_ queues: [String], _ commands: [String], state: JobState = .waiting) -> Bool {
            LiveSummary([LiveGroup(state: state, node: state == .running ? "x" : nil, queues: queues, commands: commands, jobs: 1)],
                        nodes: nodes).someWaitNoLiveNodeCanRun
        }
        #expect(!unrunnable(["default", "gpu"], []))
        #expect(!unrunnable(["default"], ["ffmpeg"]))
        #expect(!unrunnable([], []), "needing nothing: any live node")
        #expect(unrunnable(["gpu"], ["ffmpeg"]), "split across nodes; only the node that is down has both")
        #expect(unrunnable(["io"], []))
        #expect(!unrunnable(["io"], [], state: .running))
        #expect(LiveSummary([LiveGroup(state: .waiting, node: nil, queues: ["default"], commands: [], jobs: 1)], nodes: [])
                    .someWaitNoLiveNodeCanRun, "no node at all")
        #expect(LiveSummary([], nodes: []) == LiveSummary([], nodes: nodes), "nothing waits or runs")
    }

    /// "é" composed and "e" with a combining accent are one string to Swift and two names to the database: a node
    /// declaring one does not run a job needing the other, and each is counted apart.
    @Test func namesAreComparedByTheirBytes() {
        let composed = "caf\u{E9}", decomposed = "cafe\u{301}"
        #expect(composed == decomposed, "Swift's equality, which the summary must not use")
        let summary = LiveSummary([LiveGroup(state: .waiting, node: nil, queues: [decomposed], commands: [], jobs: 2),
                                   LiveGroup(state: .running, node: "a", queues: [composed], commands: [], jobs: 1)],
                                  nodes: [status("a", queues: [composed])])
        #expect(summary.someWaitNoLiveNodeCanRun)
        #expect(summary.queues.map { Array($0.queue.utf8) } == [Array(decomposed.utf8), Array(composed.utf8)])
        #expect(summary.queues.map(\.waiting) == [2, 0] && summary.queues.map(\.running) == [0, 1])
    }
}
