// Readiness and dispatch: an operation whose dependencies have all ended joins its queue's ready lists;
// `nextDispatch` picks the best head over all queues within their limits, rates and permits.

extension Scheduler {
    // MARK: Readiness and dispatch

    mutating func makeReady(_ ref: NodeRef, now: Double) {
        let g = Int(ref.group), i = Int(ref.index)
        var node = groups[g].nodes[i]
        node.state = .ready
        groups[g].nodes[i] = node
        enqueue(ref, node, seq: seq(g, i), now: now)
    }

    /// `makeReady` for each operation of a group's first batch `n` that waits for nothing, in order (numbered from
    /// `seqBase`): the group's nodes held apart, and the ready list of a queue and priority taken out of its queue
    /// while a run of its operations joins it, so that each operation costs no uniqueness checks of the arrays.
    /// `only`: those operations' numbers, ascending, when `number` listed them (few of many), so that a large graph
    /// whose first layer is small is not read through once more to find it; nil: every node is looked at.
    mutating func makeReady(firstBatch n: Int, only: [Int32]?, of g: Int32, seqBase: UInt64, now: Double) {
        let gi = Int(g)
        var nodes = takeNodes(gi)
        // The list held apart (`held`: queue × priorities + priority, -1: none) and how many joined it.
        var list = ReadyList()
        var held = -1
        var joined = 0
        // One loop for both: over the listed numbers, else (none listed, `listed` empty) over every node.
        let listed = only ?? []
        let count = only == nil ? n : listed.count
        listed.withUnsafeBufferPointer { listed in nodes.withUnsafeMutableBufferPointer { nodes in
            for position in 0..<count {
                let i = listed.isEmpty ? position : Int(listed[position])
                guard nodes[i].pending == 0 && nodes[i].state == .pending else { continue }
                var node = nodes[i]
                node.state = .ready
                nodes[i] = node
                let k = Int(node.queue) * Self.priorities + Int(node.priority.rawValue)
                if k != held {
                    if held >= 0 { putBack(&list, held, joined: joined) }
                    swap(&list, &queues[k / Self.priorities].ready[k % Self.priorities])
                    (held, joined) = (k, 0)
                }
                let ref = NodeRef(group: g, index: Int32(i))
                list.push(ReadyEntry(seq: seqBase &+ UInt64(i), ref: ref))
                joined += 1
                if recordsEvents { emit(ref, node, .ready, now: now) }
            }
        } }
        if held >= 0 { putBack(&list, held, joined: joined) }
        swap(&nodes, &groups[gi].nodes)
    }

    /// A ready list taken out by `makeReady(firstBatch:)` back in its queue, with the count of those that joined it.
    private mutating func putBack(_ list: inout ReadyList, _ k: Int, joined: Int) {
        let q = k / Self.priorities
        swap(&list, &queues[q].ready[k % Self.priorities])
        queues[q].readyCount += joined
        if joined > 0 { queues[q].filled |= 1 << UInt8(k % Self.priorities) }
        readyTotal += joined
    }

    /// `makeReady` for a node its caller has already written as ready: it joins its queue's ready list.
    @inline(__always)
    mutating func enqueue(_ ref: NodeRef, _ node: Node, seq: UInt64, now: Double) {
        queues[Int(node.queue)].enqueue(ReadyEntry(seq: seq, ref: ref), priority: Int(node.priority.rawValue))
        readyTotal += 1
        // From the node given: `complete` holds the group's nodes apart while it makes dependents ready.
        if recordsEvents { emit(ref, node, .ready, now: now) }
    }

    /// The queue's next operation by priority, then submission order; drops entries of operations
    /// cancelled while they waited, also when their group has since been released (its slot perhaps
    /// reused: the entry's sequence number must still be the node's).
    mutating func head(of q: Int) -> (priority: Int, entry: ReadyEntry)? {
        if let head = validHead(of: q) { return head }
        var p = Self.priorities - 1
        while p >= 0 {
            while let entry = queues[q].ready[p].peek() {
                if isValid(entry.ref) {
                    let node = groups[Int(entry.ref.group)].nodes[Int(entry.ref.index)]
                    if node.state == .ready && seq(Int(entry.ref.group), Int(entry.ref.index)) == entry.seq { return (p, entry) }
                }
                queues[q].ready[p].pop()
            }
            queues[q].filled &= ~(1 << UInt8(p))
            p -= 1
        }
        return nil
    }

    /// `head(of:)` when the first entry found is still valid, as it almost always is: read without a write
    /// (nil otherwise, and `head` drops what is stale).
    @inline(__always)
    func validHead(of q: Int) -> (priority: Int, entry: ReadyEntry)? {
        let filled = queues[q].filled
        guard filled != 0 else { return nil }
        let p = UInt8.bitWidth - 1 - filled.leadingZeroBitCount
        guard let entry = queues[q].ready[p].peek(), isValid(entry.ref) else { return nil }
        let node = groups[Int(entry.ref.group)].nodes[Int(entry.ref.index)]
        return node.state == .ready && seq(Int(entry.ref.group), Int(entry.ref.index)) == entry.seq ? (p, entry) : nil
    }

    /// The next operation to start, if a queue has one and a free slot: among the queues' heads,
    /// the highest effective QoS; at equal QoS the one submitted first (so a pipeline spread over
    /// queues runs chain by chain, and what one stage produces is consumed before the next is made).
    /// A queue's rate only gates whether it may start one now (a barrier neither waits for it nor uses it);
    /// rates read `monotonic`, else `now`.
    /// Inlined up to the first queue that may start one: most asks after a start find none (a queue at its limit),
    /// and then the large function below is not entered at all.
    @inline(__always)
    mutating func nextDispatch(now: Double, monotonic: Double? = nil) -> Dispatch? {
        guard readyTotal > 0 else { return nil }
        var q = 0
        while q < queues.count {
            if mayStart(q) { return nextDispatch(from: q, now: now, monotonic: monotonic) }
            q += 1
        }
        return nil
    }

    /// Whether queue q has a ready operation and room to start it (its rate aside).
    @inline(__always)
    func mayStart(_ q: Int) -> Bool {
        queues[q].readyCount > 0 && !queues[q].suspended && queues[q].executing < effectiveLimit(q)
    }

    /// `nextDispatch` from queue `first`, the first that `mayStart`.
    @inline(never)
    private mutating func nextDispatch(from first: Int, now: Double, monotonic: Double?) -> Dispatch? {
        var best: (queue: Int, priority: Int, qos: QualityOfService, seq: UInt64)?
        for q in first ..< queues.count where mayStart(q) {
            guard let head = validHead(of: q) ?? head(of: q) else { continue }
            if queues[q].gatesStarts && head.entry.ref.group != Self.barrierGroup && !startAllowed(q, at: monotonic ?? now) { continue }
            let qos = effectiveQoS(head.entry.ref)
            if let current = best, current.qos > qos || (current.qos == qos && current.seq <= head.entry.seq) { continue }
            best = (q, head.priority, qos, head.entry.seq)
        }
        guard let best, let entry = queues[best.queue].start(priority: best.priority) else { return nil }
        let ref = entry.ref
        let g = Int(ref.group), i = Int(ref.index)
        if queues[best.queue].gatesStarts && ref.group != Self.barrierGroup { noteStart(best.queue, at: monotonic ?? now) }
        executingCount += 1
        readyTotal -= 1
        var node = groups[g].nodes[i]
        node.state = .executing
        node.attempts &+= 1
        node.flags &= ~(Node.cancelRequested | Node.timedOut)
        if node.startedAt.isNaN { node.startedAt = now }
        groups[g].nodes[i] = node
        if recordsEvents { emit(ref, .executing, now: now) }
        let attempt = Attempt(ref: ref, generation: groups[g].generation, number: Int(node.attempts))
        if !groups[g].options.isEmpty, case let o = groups[g].optionIndex[i], o >= 0, let timeout = groups[g].options[Int(o)].timeout {
            timerRequests.append(TimerRequest(delay: timeout, kind: .attemptTimeout(attempt)))
        }
        let inputBox = groups[g].outputs.isEmpty ? nil : input(of: ref)
        return Dispatch(attempt: attempt, body: groups[g].bodies[i], qualityOfService: best.qos, inputBox: inputBox,
                        name: groups[g].names[i])
    }

    private func input(of ref: NodeRef) -> OutputBox? {
        let g = Int(ref.group)
        // Asked in place: a copy of the dictionary (a retain and a release) for each start is what most cost.
        if groups[g].outputs.isEmpty { return nil }
        let input = groups[g].inputs[Int(ref.index)]
        if input >= 0 { return groups[g].outputs[input] }
        for d in dependencies(of: ref) {
            if let output = groups[g].outputs[d] { return output }
        }
        return nil
    }
}

extension Scheduler.Queue {
    // Each a single access to the queue in the scheduler's array (one uniqueness check, not one per field).

    /// A ready operation joins its priority's list.
    @inline(__always)
    mutating func enqueue(_ entry: ReadyEntry, priority: Int) {
        ready[priority].push(entry)
        filled |= 1 << UInt8(priority)
        readyCount += 1
    }

    /// The head of a priority's list starts executing.
    @inline(__always)
    mutating func start(priority: Int) -> ReadyEntry? {
        guard let entry = ready[priority].pop() else { return nil }
        readyCount -= 1
        executing += 1
        return entry
    }

    /// An attempt stops executing, using up its permit from outside if the queue has such.
    @inline(__always)
    mutating func attemptLeft() {
        executing -= 1
        if let permits { self.permits = max(0, permits - 1) }
    }

    /// An operation of the queue ended (`epoch`: the one it was added in); true when a barrier may wait for an epoch.
    @inline(__always)
    mutating func ended(epoch: Int32) -> Bool {
        unfinished -= 1
        epochUnfinished[Int(epoch)] -= 1
        return !barrierAfterEpoch.isEmpty
    }
}
