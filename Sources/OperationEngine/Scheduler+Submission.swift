// Submitting to the scheduler (SPEC §3.2): checking and indexing a graph (`prepare`), adopting it as a new
// group or an extension of one, and propagating QoS raises to dependencies.

extension Scheduler {
    // MARK: Submission

    /// A graph checked and indexed by `prepare`, ready to be adopted.
    struct PreparedGraph {
        var builder: GraphBuilder
        /// nil when there are problems.
        var batch: Batch?
        var problems: [String]
    }

    /// Checks a batch and computes its dependents rows, with every problem. It needs nothing of the
    /// scheduler but how many queues exist (queues are never removed), so the engine calls it before
    /// taking its lock: a million-operation graph is indexed without holding up anyone.
    static func prepare(_ builder: consuming GraphBuilder, queueCount: Int) -> PreparedGraph {
        let n = builder.count
        let base = builder.base
        var problems = builder.problems
        let total = base + n
        // The builder's arrays as locals: reading them through `builder` in the loops below copies it each time.
        let nodes = builder.nodes
        let starts = builder.dependencyStart
        let edges = builder.dependencies
        let inputs = builder.inputs.stored
        // Each row's dependents counted at the row, summed into where each row ends, then filled from the back:
        // one array becomes the rows' starts, with no second copy to fill through.
        var dependentStart = [Int32](hugePagesRepeating: 0, count: n + 1)
        // Whether some operation depends on one added after it: only then can the batch hold a cycle.
        var forward = false
        // The nodes are read for their queues only when one names a queue that does not exist: a million-operation graph
        // is larger than the cache, and each pass over its nodes reads them from memory.
        let checksQueues = n > 0 && Int(builder.highestQueue) >= queueCount
        // Read through buffers: an array's every read checks its bounds, a cost per edge that a million operations notice.
        withBuffers(nodes, starts, edges) { nodes, starts, edges in
            dependentStart.withUnsafeMutableBufferPointer { count in
                for i in 0..<n {
                    let input = i < inputs.count ? inputs[i] : -1
                    if checksQueues && Int(nodes[i].queue) >= queueCount {
                        problems.append("operation '\(builder.names[i])': unknown queue queue#\(nodes[i].queue)")
                    }
                    let (from, to) = (Int(starts[i]), Int(starts[i + 1]))
                    for k in from ..< to {
                        let dep = Int(edges[k])
                        if dep < 0 || dep >= total {
                            problems.append("operation '\(builder.names[i])' depends on unknown operation #\(dep)")
                        } else if dep == base + i {
                            problems.append("cycle: \(builder.names[i]) → \(builder.names[i])")
                        } else if dep >= base {
                            count[dep - base] &+= 1
                            if dep > base + i { forward = true }
                        }
                    }
                    if input >= 0, !edges[from ..< to].contains(input) {
                        problems.append("operation '\(builder.names[i])': its input #\(input) is not one of its dependencies")
                    }
                }
                for i in stride(from: 1, through: n, by: 1) { count[i] += count[i - 1] }
            }
        }
        var dependents = [Int32](hugePagesRepeating: 0, count: Int(dependentStart[n]))
        withBuffers(nodes, starts, edges) { _, starts, edges in
            dependents.withUnsafeMutableBufferPointer { dependents in
                dependentStart.withUnsafeMutableBufferPointer { cursor in
                    // Backwards, each row filled from its end: a row keeps dependent order (FIFO when they become ready).
                    for i in stride(from: n - 1, through: 0, by: -1) {
                        for k in Int(starts[i]) ..< Int(starts[i + 1]) {
                            let d = Int(edges[k])
                            guard d >= base && d < total && d != base + i else { continue }
                            cursor[d - base] &-= 1
                            dependents[Int(cursor[d - base])] = Int32(base + i)
                        }
                    }
                }
            }
        }
        if forward { problems += Self.cycles(builder, dependentStart: dependentStart, dependents: dependents) }
        guard problems.isEmpty else { return PreparedGraph(builder: builder, batch: nil, problems: problems) }
        let batch = Batch(
            base: Int32(base), dependencyStart: starts, dependencies: edges,
            dependentStart: dependentStart, dependents: dependents)
        return PreparedGraph(builder: builder, batch: batch, problems: [])
    }

    /// The cycles of a batch, by Kahn's algorithm: whatever it leaves unvisited lies on or behind a cycle.
    private static func cycles(_ builder: GraphBuilder, dependentStart: [Int32], dependents: [Int32]) -> [String] {
        let n = builder.count
        let base = builder.base
        let total = base + n
        let starts = builder.dependencyStart
        let edges = builder.dependencies
        var indegree = [Int32](repeating: 0, count: n)
        for i in 0..<n {
            for k in Int(starts[i]) ..< Int(starts[i + 1]) {
                let d = Int(edges[k])
                if d >= base && d < total && d != base + i { indegree[i] += 1 }
            }
        }
        var stack: [Int32] = []
        for i in 0..<n where indegree[i] == 0 { stack.append(Int32(i)) }
        var visited = 0
        while let i = stack.popLast() {
            visited += 1
            for k in Int(dependentStart[Int(i)]) ..< Int(dependentStart[Int(i) + 1]) {
                let j = Int(dependents[k]) - base
                indegree[j] -= 1
                if indegree[j] == 0 { stack.append(Int32(j)) }
            }
        }
        return visited < n ? Self.describeCycles(builder, indegree: indegree) : []
    }

    /// Names the operations along each cycle left after Kahn's algorithm (every node with a positive
    /// in-degree has a dependency that also has one, so following them must come round).
    private static func describeCycles(_ builder: GraphBuilder, indegree: [Int32]) -> [String] {
        let n = builder.count
        let base = builder.base
        var onCycleReported = [Bool](repeating: false, count: n)
        var problems: [String] = []
        for start in 0..<n where indegree[start] > 0 && !onCycleReported[start] {
            var position = [Int: Int]()
            var path: [Int] = []
            var current = start
            while position[current] == nil {
                if onCycleReported[current] { path = []; break }
                position[current] = path.count
                path.append(current)
                let deps = builder.dependencies[Int(builder.dependencyStart[current]) ..< Int(builder.dependencyStart[current + 1])]
                guard let next = deps.first(where: {
                    Int($0) >= base && Int($0) < base + n && Int($0) != base + current && indegree[Int($0) - base] > 0
                }) else { path = []; break }
                current = Int(next) - base
            }
            guard !path.isEmpty, let first = position[current] else { continue }
            let cycle = Array(path[first...])
            for i in cycle { onCycleReported[i] = true }
            // Dependencies were followed; print the cycle in execution order: a → b means b waits for a.
            let names = cycle.reversed().map { builder.names[$0] }
            problems.append("cycle: " + (names + [names[0]]).joined(separator: " → "))
            if problems.count >= 16 { break }
        }
        return problems.isEmpty ? ["cycle among the operations"] : problems
    }

    /// The batch of a prepared graph numbered from `existing`, or every problem it has.
    private func checked(_ prepared: PreparedGraph, existing: Int, more: [String] = []) throws(SubmissionError) -> Batch {
        var problems = prepared.problems
        let base = prepared.builder.base
        if base != existing { problems.append("the graph was numbered from \(base) but the group has \(existing) operations") }
        problems += more
        guard problems.isEmpty, let batch = prepared.batch else { throw SubmissionError(problems: problems) }
        return batch
    }

    mutating func submit(_ builder: consuming GraphBuilder, qualityOfService: QualityOfService? = nil, deadline: Double? = nil,
                         keepOutputs: Bool = true, now: Double) throws(SubmissionError) -> GroupID {
        try submit(Self.prepare(builder, queueCount: queues.count), qualityOfService: qualityOfService, deadline: deadline,
                   keepOutputs: keepOutputs, now: now)
    }

    mutating func submit(_ prepared: consuming PreparedGraph, qualityOfService: QualityOfService? = nil, deadline: Double? = nil,
                         keepOutputs: Bool = true, now: Double) throws(SubmissionError) -> GroupID {
        var problems: [String] = []
        if let deadline, !(deadline > 0) || !deadline.isFinite { problems.append("deadline must be a positive number of seconds") }
        let batch = try checked(prepared, existing: 0, more: problems)
        let slot: Int32
        if let free = freeSlots.popLast() {
            slot = free
        } else {
            groups.append(Group())
            slot = Int32(groups.count - 1)
        }
        groups[Int(slot)].live = true
        groups[Int(slot)].keepOutputs = keepOutputs
        groups[Int(slot)].qos = qualityOfService?.rawValue ?? Self.noQoS
        let id = GroupID(slot: slot, generation: groups[Int(slot)].generation)
        adopt(&prepared.builder, batch: batch, group: slot, now: now)
        if let deadline { timerRequests.append(TimerRequest(delay: deadline, kind: .deadline(id))) }
        checkGroupFinished(slot)
        return id
    }

    /// Adds operations to a running group (graph expansion at run time). They may depend on the
    /// group's earlier operations, finished or not.
    mutating func extend(_ id: GroupID, with builder: consuming GraphBuilder, now: Double) throws(SubmissionError) {
        try extend(id, with: Self.prepare(builder, queueCount: queues.count), now: now)
    }

    mutating func extend(_ id: GroupID, with prepared: consuming PreparedGraph, now: Double) throws(SubmissionError) {
        guard isLive(id), !groups[Int(id.slot)].finished else {
            throw SubmissionError(problems: ["the group has finished or does not exist"])
        }
        let batch = try checked(prepared, existing: groups[Int(id.slot)].nodes.count)
        adopt(&prepared.builder, batch: batch, group: id.slot, now: now)
        checkGroupFinished(id.slot)
    }

    func isLive(_ id: GroupID) -> Bool {
        id.slot > 0 && Int(id.slot) < groups.count && groups[Int(id.slot)].live && groups[Int(id.slot)].generation == id.generation
    }

    private mutating func adopt(_ builder: inout GraphBuilder, batch: Batch, group g: Int32, now: Double) {
        let gi = Int(g)
        let base = Int(batch.base)
        let n = builder.count
        // Numbered in submission order, from where the last batch or barrier left off.
        var batch = batch
        batch.seqBase = nextSeq
        nextSeq &+= UInt64(n)
        if base == 0 { (groups[gi].firstBatchCount, groups[gi].firstSeq) = (n, batch.seqBase) }
        takeOperations(of: &builder, group: gi)
        let starts = batch.dependencyStart
        let edges = batch.dependencies
        var readyNow = [Int](repeating: 0, count: queues.count * Self.priorities)
        var readyFirst: [Int32]? = []
        var uniformQoS: UInt8?
        let crossBatch = number(batch: batch, group: g, count: n, readyNow: &readyNow, readyFirst: &readyFirst, uniformQoS: &uniformQoS)
        groups[gi].unfinished += n
        groups[gi].batches.append(batch)
        for (dependency, dependent) in crossBatch {
            groups[gi].lateDependents[dependency, default: []].append(dependent)
            groups[gi].readers[dependency]? += 1
        }
        raiseDependencies(of: batch, group: g, count: n, uniformQoS: uniformQoS)
        if recordsEvents {
            for i in 0..<n { emit(NodeRef(group: g, index: Int32(base + i)), .pending, now: now) }
        }
        // A group cancelled before this batch arrived cancels it too.
        if let reason = groups[gi].cancelReason {
            for i in 0..<n { cancel(NodeRef(group: g, index: Int32(base + i)), reason: reason, now: now) }
            return
        }
        // Room made at once for what becomes ready now (all of it, for independent operations): a ready list
        // grown by doubling copies itself twenty times over a million operations, into fresh memory each time.
        for k in readyNow.indices where readyNow[k] > 0 {
            queues[k / Self.priorities].ready[k % Self.priorities].reserve(readyNow[k])
        }
        // A new group's first batch can hold no dependency that already failed: its ready operations join in one pass.
        if base == 0 {
            makeReady(firstBatch: n, only: readyFirst, of: g, seqBase: batch.seqBase, now: now)
            return
        }
        for i in 0..<n {
            let ref = NodeRef(group: g, index: Int32(base + i))
            let node = groups[gi].nodes[base + i]
            guard node.state == .pending else { continue }
            // A dependency from an earlier batch that already failed or was cancelled.
            if base > 0, node.flags & Node.runsAfterFailure == 0,
               let failed = edges[Int(starts[i]) ..< Int(starts[i + 1])]
                .first(where: { Int($0) < base && isFailedOrCancelled(NodeRef(group: g, index: $0)) }) {
                cancel(ref, reason: dependencyError(NodeRef(group: g, index: failed)), now: now)
            } else if node.pending == 0 {
                makeReady(ref, now: now)
            }
        }
    }

    /// Counts what each of a batch's operations waits for; its queues count them.
    /// Returns its edges to earlier batches; counts in `readyNow` (by queue, then priority) those that wait for nothing,
    /// and lists them in `readyFirst` while they are at most a sixty-fourth of the batch (nil once they are more);
    /// `uniformQoS`: the effective QoS of them all when they ask for one on one queue (0 for an empty batch), else nil.
    private mutating func number(batch: Batch, group g: Int32, count n: Int, readyNow: inout [Int], readyFirst: inout [Int32]?,
                                 uniformQoS: inout UInt8?) -> [(dependency: Int32, dependent: Int32)] {
        let gi = Int(g)
        let base = Int(batch.base)
        let starts = batch.dependencyStart
        let edges = batch.dependencies
        let groupQoS = groups[gi].qos
        var crossBatch: [(dependency: Int32, dependent: Int32)] = []
        var added = [Int](repeating: 0, count: queues.count)
        // Whether all ask for one QoS on one queue (then they have one effective QoS: none is raised yet).
        var (first, mixed): ((UInt8, UInt16), Bool) = ((0, 0), false)
        // The group's nodes held apart while they are written: a uniqueness check for the batch, not two per node.
        var nodes: [Node] = []
        swap(&nodes, &groups[gi].nodes)
        starts.withUnsafeBufferPointer { starts in edges.withUnsafeBufferPointer { edges in
            added.withUnsafeMutableBufferPointer { added in
                nodes.withUnsafeMutableBufferPointer { nodes in
                    for i in 0..<n {
                        var pending: Int32 = 0
                        for k in Int(starts[i]) ..< Int(starts[i + 1]) {
                            let d = edges[k]
                            if Int(d) >= base {
                                pending += 1
                            } else {
                                crossBatch.append((d, Int32(base + i)))
                                if !nodes[Int(d)].state.isFinished { pending += 1 }
                            }
                        }
                        var node = nodes[base + i]
                        let q = Int(node.queue)
                        added[q] += 1
                        if let barrier = queues[q].openBarrier {
                            pending += 1
                            groups[Int(Self.barrierGroup)].barrierDependents[barrier.index, default: []]
                                .append(NodeRef(group: g, index: Int32(base + i)))
                        }
                        node.pending = pending
                        if pending == 0 {
                            readyNow[q * Self.priorities + Int(node.priority.rawValue)] += 1
                            if readyFirst != nil { Self.list(Int32(i), in: &readyFirst, atMost: n / 64) }
                        }
                        node.epoch = queues[q].epoch
                        if node.requestedQoS == Self.noQoS { node.requestedQoS = groupQoS }
                        nodes[base + i] = node
                        if i == 0 {
                            first = (node.requestedQoS, node.queue)
                        } else if (node.requestedQoS, node.queue) != first {
                            mixed = true
                        }
                    }
                }
            }
        } }
        swap(&nodes, &groups[gi].nodes)
        uniformQoS = mixed ? nil : n > 0 ? effectiveQoS(groups[gi].nodes[base]).rawValue : 0
        for q in added.indices where added[q] > 0 {
            queues[q].unfinished += added[q]
            queues[q].epochUnfinished[Int(queues[q].epoch)] += added[q]
        }
        return crossBatch
    }

    /// Adds `i` to `listed`, or lets the list go (nil) when it would pass `limit`: a scan reads no more than it then.
    @inline(never)
    private static func list(_ i: Int32, in listed: inout [Int32]?, atMost limit: Int) {
        if let count = listed?.count, count < limit { listed?.append(i) } else { listed = nil }
    }

    /// Moves the builder's operations into the group: a new group takes the builder's arrays as they are.
    private mutating func takeOperations(of builder: inout GraphBuilder, group gi: Int) {
        if builder.base == 0 && groups[gi].nodes.isEmpty {
            swap(&groups[gi].nodes, &builder.nodes)
            swap(&groups[gi].bodies, &builder.bodies)
            swap(&groups[gi].names, &builder.names)
            swap(&groups[gi].options, &builder.options)
            swap(&groups[gi].optionIndex, &builder.optionIndex)
            swap(&groups[gi].inputs, &builder.inputs)
        } else {
            let first = groups[gi].nodes.count
            groups[gi].optionIndex.set(builder.optionIndex, from: first, adding: Int32(groups[gi].options.count))
            groups[gi].inputs.set(builder.inputs, from: first)
            groups[gi].nodes.append(contentsOf: builder.nodes)
            groups[gi].bodies.append(contentsOf: builder.bodies)
            groups[gi].names.set(builder.names, from: groups[gi].nodes.count - builder.nodes.count)
            groups[gi].options.append(contentsOf: builder.options)
        }
    }

    /// QoS raises: an operation is raised to the effective QoS of whatever waits for it.
    /// `uniformQoS`: the batch's operations' one effective QoS (`number`), nil when they may differ.
    private mutating func raiseDependencies(of batch: Batch, group g: Int32, count n: Int, uniformQoS: UInt8?) {
        let base = Int(batch.base)
        let starts = batch.dependencyStart
        let edges = batch.dependencies
        // The common case: every operation of the batch at one QoS. Nothing in it can raise another, so only
        // dependencies on earlier batches need looking at.
        var uniformQoS = uniformQoS
        if uniformQoS == nil {
            let first = effectiveQoS(NodeRef(group: g, index: Int32(base))).rawValue
            uniformQoS = first
            for i in 0..<n where effectiveQoS(NodeRef(group: g, index: Int32(base + i))).rawValue != first {
                uniformQoS = nil
                break
            }
        }
        if let first = uniformQoS {
            guard base > 0 else { return }
            for k in 0..<edges.count where Int(edges[k]) < base { raise(NodeRef(group: g, index: edges[k]), to: first) }
            return
        }
        for i in 0..<n where starts[i] < starts[i + 1] {
            let qos = effectiveQoS(NodeRef(group: g, index: Int32(base + i))).rawValue
            for k in Int(starts[i]) ..< Int(starts[i + 1]) { raise(NodeRef(group: g, index: edges[k]), to: qos) }
        }
    }

    private func isFailedOrCancelled(_ ref: NodeRef) -> Bool {
        let state = groups[Int(ref.group)].nodes[Int(ref.index)].state
        return state == .failed || state == .cancelled
    }

    func dependencyError(_ ref: NodeRef) -> String {
        let node = groups[Int(ref.group)].nodes[Int(ref.index)]
        return "dependency '\(groups[Int(ref.group)].names[Int(ref.index)])' \(node.state == .failed ? "failed" : "was cancelled")"
    }

    @inline(__always)
    func effectiveQoS(_ ref: NodeRef) -> QualityOfService {
        effectiveQoS(groups[Int(ref.group)].nodes[Int(ref.index)])
    }

    @inline(__always)
    func effectiveQoS(_ node: Node) -> QualityOfService {
        let asked = node.requestedQoS == Self.noQoS ? queues[Int(node.queue)].qos.rawValue : node.requestedQoS
        return QualityOfService(rawValue: max(asked, node.raisedQoS)) ?? .default
    }

    func requestedQoS(_ ref: NodeRef) -> QualityOfService {
        let node = groups[Int(ref.group)].nodes[Int(ref.index)]
        if node.requestedQoS == Self.noQoS { return queues[Int(node.queue)].qos }
        return QualityOfService(rawValue: node.requestedQoS) ?? .default
    }

    private mutating func raise(_ start: NodeRef, to qos: UInt8) {
        guard effectiveQoS(start).rawValue < qos else { return }
        var work = [start]
        while let ref = work.popLast() {
            let node = groups[Int(ref.group)].nodes[Int(ref.index)]
            guard node.state == .pending || node.state == .ready || node.state == .retrying,
                  effectiveQoS(ref).rawValue < qos else { continue }
            groups[Int(ref.group)].nodes[Int(ref.index)].raisedQoS = qos
            for d in dependencies(of: ref) { work.append(NodeRef(group: ref.group, index: d)) }
        }
    }

    /// An operation's sequence number (submission order over all groups): its batch's first plus its place in it.
    @inline(__always)
    func seq(_ g: Int, _ i: Int) -> UInt64 {
        i < groups[g].firstBatchCount ? groups[g].firstSeq &+ UInt64(truncatingIfNeeded: i) : laterSeq(g, i)
    }

    /// `seq` of a barrier, or of an operation added by a later batch; out of line, as the rare case.
    @inline(never)
    private func laterSeq(_ g: Int, _ i: Int) -> UInt64 {
        if g == Int(Self.barrierGroup) { return groups[g].seqs[i] }
        let b = searchBatch(g, Int32(truncatingIfNeeded: i))
        return groups[g].batches[b].seqBase &+ UInt64(i - Int(groups[g].batches[b].base))
    }

    /// Inlined for the common case, a group submitted in one batch.
    @inline(__always)
    func batchIndex(_ group: Int, _ index: Int32) -> Int {
        groups[group].batches.count == 1 ? 0 : searchBatch(group, index)
    }

    private func searchBatch(_ group: Int, _ index: Int32) -> Int {
        let count = groups[group].batches.count
        var low = 0, high = count - 1
        while low < high {
            let mid = (low + high + 1) / 2
            if groups[group].batches[mid].base <= index { low = mid } else { high = mid - 1 }
        }
        return low
    }
}

/// Runs `body` over the three arrays' buffers, read only.
@inline(__always)
func withBuffers<A, B, C, R>(_ a: [A], _ b: [B], _ c: [C],
                             _ body: (UnsafeBufferPointer<A>, UnsafeBufferPointer<B>, UnsafeBufferPointer<C>) throws -> R) rethrows -> R {
    try a.withUnsafeBufferPointer { a in try b.withUnsafeBufferPointer { b in try c.withUnsafeBufferPointer { c in try body(a, b, c) } } }
}
