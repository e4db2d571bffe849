// What `status` shows of the jobs waiting and running, from one read of them (LiveGroups): each node's jobs, each
// queue's, and whether some waiting job needs what no live node declares. Pure: no I/O.

/// Jobs in the same state, on the same node (running ones), needing the same queues and commands, counted.
public struct LiveGroup: Sendable, Equatable {
    public var state: JobState
    /// The node running them; nil for waiting jobs.
    public var node: String?
    public var queues: [String]
    public var commands: [String]
    public var jobs: Int

    public init(state: JobState, node: String?, queues: [String], commands: [String], jobs: Int) {
        self.state = state
        self.node = node
        self.queues = queues
        self.commands = commands
        self.jobs = jobs
    }
}

public struct LiveSummary: Sendable, Equatable {
    /// Jobs each node runs (nodes running none are absent).
    public var runningByNode: [String: Int]
    /// Per queue, in byte order: the jobs using it that wait and that run (a job counts in each of its queues), as
    /// `queueCounts` gives them.
    public var queues: [QueueCount]
    /// Whether some waiting job needs a queue or a command that no live node declares all of: only then does
    /// `jobsNoLiveNodeCanRun` find any.
    public var someWaitNoLiveNodeCanRun: Bool

    /// `nodes`: every node, with what it declares and whether it lives (`NodeStatus.connected`). Names are compared
    /// by their bytes, as the database compares them: two spellings of one accented letter are two queues there,
    /// though Swift's strings call them equal.
    public init(_ groups: [LiveGroup], nodes: [NodeStatus]) {
        var running: [String: Int] = [:]
        var counts: [[UInt8]: (waiting: Int, running: Int)] = [:]
        var unrunnable = false
        let live = nodes.filter(\.connected).map { (queues: Self.bytes($0.queues), commands: Self.bytes($0.commands)) }
        for group in groups {
            let isRunning = group.state == .running
            if isRunning, let node = group.node { running[node, default: 0] += group.jobs }
            for queue in group.queues.map({ Array($0.utf8) }) {
                if isRunning {
                    counts[queue, default: (0, 0)].running += group.jobs
                } else {
                    counts[queue, default: (0, 0)].waiting += group.jobs
                }
            }
            if !isRunning && !unrunnable {
                let queues = Self.bytes(group.queues), commands = Self.bytes(group.commands)
                unrunnable = !live.contains { $0.queues.isSuperset(of: queues) && $0.commands.isSuperset(of: commands) }
            }
        }
        runningByNode = running
        queues = counts.keys.sorted { $0.lexicographicallyPrecedes($1) }.map { queue in
            QueueCount(queue: String(decoding: queue, as: UTF8.self), waiting: counts[queue]?.waiting ?? 0,
                       running: counts[queue]?.running ?? 0)
        }
        someWaitNoLiveNodeCanRun = unrunnable
    }

    private static func bytes(_ names: [String]) -> Set<[UInt8]> { Set(names.map { Array($0.utf8) }) }
}
