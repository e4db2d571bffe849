// How operations end (SPEC §3.4): an attempt's outcome, retries, completion and what it frees among the
// dependents, and the end of a group; with the walks over edges and the validity checks the others use.

extension Scheduler {
    // MARK: Ends

    enum Outcome {
        case succeeded(OutputBox?)
        /// `final`: retrying cannot help (`FinalFailure`), so `retries` is not used.
        case failure(String, final: Bool = false)

        static func success(_ output: OperationOutput?) -> Self { .succeeded(output.map(OutputBox.init)) }
    }

    /// An attempt stops executing. A permit from outside is used up with it: the holder grants it again (or gives
    /// its slot to a better waiter elsewhere) before the queue starts another operation on it.
    @inline(__always)
    mutating func attemptLeft(queue q: Int) {
        queues[q].attemptLeft()
        executingCount -= 1
    }

    /// Ends an attempt. Ignored when the attempt already ended (cancelled asynchronous operation,
    /// timeout) — a late completion changes nothing.
    @inline(__always)
    mutating func finish(_ attempt: Attempt, outcome: Outcome, now: Double) {
        guard isCurrent(attempt, in: .executing) else { return }
        let ref = attempt.ref
        let g = Int(ref.group), i = Int(ref.index)
        let node = groups[g].nodes[i]
        attemptLeft(queue: Int(node.queue))
        if !cancelHandlers.isEmpty { cancelHandlers[ref] = nil }
        if node.flags & Node.timedOut != 0 {
            failOrRetry(ref, error: OperationTimeout(seconds: timeout(g, i)).description, now: now)
        } else if node.flags & Node.cancelRequested != 0 {
            complete(ref, .cancelled, error: groups[g].errors[ref.index] ?? "cancelled", now: now)
        } else {
            switch outcome {
            case .succeeded(let output):
                if let output {
                    if groups[g].keepOutputs {
                        groups[g].outputs[ref.index] = output
                    } else {
                        var readers: Int32 = 0
                        for _ in dependents(of: ref) { readers += 1 }
                        if readers > 0 {
                            groups[g].outputs[ref.index] = output
                            groups[g].readers[ref.index] = readers
                        }
                    }
                }
                complete(ref, .succeeded, error: nil, now: now)
            case .failure(let message, let final):
                if final { complete(ref, .failed, error: message, now: now) } else { failOrRetry(ref, error: message, now: now) }
            }
        }
    }

    /// Operation i's timeout, 0 without; out of line, off the path of every end.
    @inline(never)
    private func timeout(_ g: Int, _ i: Int) -> Double {
        let o = groups[g].optionIndex[i]
        return o >= 0 ? groups[g].options[Int(o)].timeout ?? 0 : 0
    }

    private mutating func failOrRetry(_ ref: NodeRef, error: String, now: Double) {
        let g = Int(ref.group), i = Int(ref.index)
        let node = groups[g].nodes[i]
        let o = groups[g].optionIndex[i]
        if o >= 0 {
            let options = groups[g].options[Int(o)]
            if Int(node.attempts) <= options.retries {
                groups[g].nodes[i].state = .retrying
                groups[g].errors[ref.index] = error
                if recordsEvents { emit(ref, .retrying, now: now, error: error) }
                let delay = options.retryDelay * Double(1 << min(Int(node.attempts) - 1, 30))
                let attempt = Attempt(ref: ref, generation: groups[g].generation, number: Int(node.attempts))
                timerRequests.append(TimerRequest(delay: delay, kind: .retry(attempt)))
                return
            }
        }
        complete(ref, .failed, error: error, now: now)
    }

    /// Records an end and lets the dependents go on (or be cancelled), without recursion: a chain of
    /// a million cancellations must not exhaust the stack.
    mutating func complete(_ start: NodeRef, _ startState: OperationState, error startError: String?, now: Double) {
        // The first end is held apart: the list is only made (allocated) when ends cascade.
        var first: EndWork? = (start, startState, startError)
        var work: [EndWork] = []
        // Moved out (`take`), not copied and then cleared: no retain and release of the error per end.
        while let (ref, state, error) = first.take() ?? work.popLast() {
            let g = Int(ref.group), i = Int(ref.index)
            let before = groups[g].nodes[i].state
            guard !before.isFinished else { continue }
            if before == .ready {
                queues[Int(groups[g].nodes[i].queue)].readyCount -= 1
                readyTotal -= 1
            }
            let node = groups[g].end(i, state, now: now)
            if !groups[g].keepOutputs && !groups[g].readers.isEmpty {
                for d in dependencies(of: ref) {
                    guard let readers = groups[g].readers[d] else { continue }
                    if readers <= 1 {
                        groups[g].readers[d] = nil
                        groups[g].outputs[d] = nil
                    } else {
                        groups[g].readers[d] = readers - 1
                    }
                }
            }
            if let error {
                groups[g].errors[ref.index] = error
            } else if !groups[g].errors.isEmpty {
                groups[g].errors[ref.index] = nil
            }
            let q = Int(node.queue)
            if recordsEvents { emit(ref, state, now: now, error: error) }
            closeEpoch(queue: q, epoch: node.epoch, now: now)
            let failedOrCancelled = state != .succeeded
            let dependencyFailure = failedOrCancelled ? dependencyError(ref) : nil
            let row = dependentRow(ref)
            if row.start < row.end {
                endRow(row, of: ref, failed: failedOrCancelled, error: dependencyFailure, now: now, work: &work)
            }
            if !groups[g].lateDependents.isEmpty, let late = groups[g].lateDependents[ref.index] {
                var nodes = takeNodes(g)
                nodes.withUnsafeMutableBufferPointer { nodes in
                    for index in late {
                        dependencyEnded(NodeRef(group: ref.group, index: index), in: nodes, seq: seq(g, Int(index)),
                                        failed: failedOrCancelled, error: dependencyFailure, now: now, work: &work)
                    }
                }
                swap(&nodes, &groups[g].nodes)
            }
            if node.flags & Node.isBarrier != 0 {
                if let waiting = groups[g].barrierDependents.removeValue(forKey: ref.index) {
                    for dependent in waiting where isValid(dependent) {
                        let d = groups[Int(dependent.group)].nodes[Int(dependent.index)]
                        guard d.state == .pending else { continue }
                        groups[Int(dependent.group)].nodes[Int(dependent.index)].pending -= 1
                        if d.pending == 1 { makeReady(dependent, now: now) }
                    }
                }
                if queues[q].openBarrier == ref { queues[q].openBarrier = nil }
            }
            checkGroupFinished(ref.group)
        }
    }

    typealias EndWork = (ref: NodeRef, state: OperationState, error: String?)

    /// The dependents in the row of an operation that ended (`dependentRow`), each one dependency fewer to wait for.
    /// The row is read in place, by index: a slice of it (as `dependents(of:)` gives) costs a retain and a release of
    /// the array per end.
    private mutating func endRow(_ row: (batch: Int, start: Int, end: Int), of ref: NodeRef, failed: Bool, error: String?,
                                 now: Double, work: inout [EndWork]) {
        let g = Int(ref.group)
        // The dependents' sequence numbers (should they become ready), read once for the row.
        let (firstCount, firstSeq) = (groups[g].firstBatchCount, groups[g].firstSeq)
        var nodes = takeNodes(g)
        nodes.withUnsafeMutableBufferPointer { nodes in
            var k = row.start
            while k < row.end {
                let index = groups[g].batches[row.batch].dependents[k]
                k += 1
                let seq = Int(index) < firstCount ? firstSeq &+ UInt64(index) : self.seq(g, Int(index))
                dependencyEnded(NodeRef(group: ref.group, index: index), in: nodes, seq: seq, failed: failed, error: error,
                                now: now, work: &work)
            }
        }
        swap(&nodes, &groups[g].nodes)
    }

    /// A group's nodes, held apart while a row of them is written (the caller swaps them back): one uniqueness check
    /// of the arrays for the row rather than two for each dependent. Nothing called meanwhile reads the group's nodes.
    @inline(__always)
    mutating func takeNodes(_ g: Int) -> [Node] {
        var nodes: [Node] = []
        swap(&nodes, &groups[g].nodes)
        return nodes
    }

    /// A dependency of `dependent` (numbered `seq`) ended: one fewer to wait for (ready at the last), or, when it `failed`,
    /// the dependent is cancelled too (queued in `work`) unless it runs after failures. `nodes` are its group's.
    @inline(__always)
    private mutating func dependencyEnded(_ dependent: NodeRef, in nodes: UnsafeMutableBufferPointer<Node>, seq: UInt64,
                                          failed: Bool, error: String?, now: Double, work: inout [EndWork]) {
        let i = Int(dependent.index)
        let d = nodes[i]
        guard !d.state.isFinished else { return }
        if failed && d.flags & Node.runsAfterFailure == 0 {
            work.append((dependent, .cancelled, error))
            return
        }
        if d.pending == 1 && d.state == .pending {
            // The count and the state in one write of the node.
            var node = d
            node.pending = 0
            node.state = .ready
            nodes[i] = node
            enqueue(dependent, node, seq: seq, now: now)
        } else {
            nodes[i].pending = d.pending - 1
        }
    }

    /// Where an operation's row of dependents lies in its batch's `dependents` (an empty range when the group has no
    /// batch); later batches' dependents are in `lateDependents`.
    @inline(__always)
    func dependentRow(_ ref: NodeRef) -> (batch: Int, start: Int, end: Int) {
        let g = Int(ref.group)
        guard !groups[g].batches.isEmpty else { return (0, 0, 0) }
        let b = batchIndex(g, ref.index)
        let local = Int(ref.index - groups[g].batches[b].base)
        return (b, Int(groups[g].batches[b].dependentStart[local]), Int(groups[g].batches[b].dependentStart[local + 1]))
    }

    /// An operation's dependents: a row of its batch, plus those that later batches added.
    /// Returned by value (the arrays are shared, not copied) so that callers can mutate nodes while
    /// walking them; a closure over `self` would make Swift copy the node array on every write.
    struct Edges: Sequence {
        var row: ArraySlice<Int32>
        var late: [Int32]

        struct Iterator: IteratorProtocol {
            var row: ArraySlice<Int32>.Iterator
            var late: [Int32].Iterator
            mutating func next() -> Int32? { row.next() ?? late.next() }
        }

        func makeIterator() -> Iterator { Iterator(row: row.makeIterator(), late: late.makeIterator()) }
    }

    func dependents(of ref: NodeRef) -> Edges {
        let g = Int(ref.group)
        guard !groups[g].batches.isEmpty else { return Edges(row: [], late: []) }
        let b = batchIndex(g, ref.index)
        let local = Int(ref.index - groups[g].batches[b].base)
        let start = Int(groups[g].batches[b].dependentStart[local]), end = Int(groups[g].batches[b].dependentStart[local + 1])
        let late = groups[g].lateDependents.isEmpty ? [] : groups[g].lateDependents[ref.index] ?? []
        return Edges(row: groups[g].batches[b].dependents[start ..< end], late: late)
    }

    func dependencies(of ref: NodeRef) -> ArraySlice<Int32> {
        let g = Int(ref.group)
        guard !groups[g].batches.isEmpty else { return [] }
        let b = batchIndex(g, ref.index)
        let local = Int(ref.index - groups[g].batches[b].base)
        let start = Int(groups[g].batches[b].dependencyStart[local]), end = Int(groups[g].batches[b].dependencyStart[local + 1])
        return groups[g].batches[b].dependencies[start ..< end]
    }

    /// Inlined: every end asks, and only a group's last finds it finished.
    @inline(__always)
    mutating func checkGroupFinished(_ slot: Int32) {
        if groups[Int(slot)].unfinished == 0 { groupMayHaveFinished(slot) }
    }

    private mutating func groupMayHaveFinished(_ slot: Int32) {
        let g = Int(slot)
        guard slot != Self.barrierGroup, groups[g].unfinished == 0, !groups[g].finished else { return }
        groups[g].finished = true
        let id = GroupID(slot: slot, generation: groups[g].generation)
        finishedGroups.append(id)
        if recordsEvents { events.append(.groupFinished(id)) }
    }

    @inline(__always)
    func isValid(_ ref: NodeRef) -> Bool {
        Int(ref.group) < groups.count && groups[Int(ref.group)].live && Int(ref.index) < groups[Int(ref.group)].nodes.count
    }

    /// Whether `attempt` is its operation's current one, in `state`, in the group it was made in.
    @inline(__always)
    func isCurrent(_ attempt: Attempt, in state: OperationState) -> Bool {
        guard isValid(attempt.ref) else { return false }
        let g = Int(attempt.ref.group)
        let node = groups[g].nodes[Int(attempt.ref.index)]
        return groups[g].generation == attempt.generation && node.state == state && Int(node.attempts) == attempt.number
    }
}

extension Scheduler.Group {
    /// Operation `i` ends in `state`: its node written and the group's count of unfinished ones lowered, in one
    /// access to the group. The node as written.
    @inline(__always)
    mutating func end(_ i: Int, _ state: OperationState, now: Double) -> Scheduler.Node {
        var node = nodes[i]
        node.state = state
        node.finishedAt = now
        nodes[i] = node
        unfinished -= 1
        return node
    }
}
