// Barriers (Foundation's `addBarrierBlock`), cancellation of an operation, a group or everything with
// cancellation handlers, and the timers the scheduler asks for (attempt timeouts, retries, deadlines, rates).

extension Scheduler {
    // MARK: Barriers

    /// Foundation's `addBarrierBlock`: runs once everything added to the queue before it has finished
    /// (however it ended); what is added after it waits for it.
    mutating func addBarrier(queue id: QueueID, name: String, body: OperationBody, now: Double) -> NodeRef? {
        let q = id.rawValue
        guard queues.indices.contains(q) else { return nil }
        let g = Int(Self.barrierGroup)
        let ref = NodeRef(group: Self.barrierGroup, index: Int32(groups[g].nodes.count))
        // Everything unfinished of the current epoch, including an earlier barrier (counted in it).
        let pending = Int32(queues[q].epochUnfinished[Int(queues[q].epoch)])
        var node = Node(
            pending: pending, epoch: queues[q].epoch + 1, queue: UInt16(q), requestedQoS: Self.noQoS, priority: .normal)
        node.flags = Node.isBarrier | Node.runsAfterFailure
        groups[g].seqs.append(nextSeq)
        nextSeq &+= 1
        groups[g].nodes.append(node)
        groups[g].bodies.append(body)
        groups[g].names.set(name, at: Int(ref.index))
        queues[q].barrierAfterEpoch[queues[q].epoch] = ref
        queues[q].epoch += 1
        queues[q].epochUnfinished.append(0)
        queues[q].epochUnfinished[Int(queues[q].epoch)] += 1
        queues[q].unfinished += 1
        queues[q].openBarrier = ref
        if recordsEvents { emit(ref, .pending, now: now) }
        if pending == 0 { makeReady(ref, now: now) }
        return ref
    }

    /// One of the queue's operations ended: it counts one unfinished fewer, in its epoch too, and a barrier waiting
    /// for that epoch may become ready. Inlined: every end passes here, and almost never finds a barrier.
    @inline(__always)
    mutating func closeEpoch(queue q: Int, epoch: Int32, now: Double) {
        if queues[q].ended(epoch: epoch) { releaseBarrier(queue: q, epoch: epoch, now: now) }
    }

    private mutating func releaseBarrier(queue q: Int, epoch: Int32, now: Double) {
        guard let barrier = queues[q].barrierAfterEpoch[epoch] else { return }
        let g = Int(barrier.group), i = Int(barrier.index)
        guard groups[g].nodes[i].state == .pending else { return }
        groups[g].nodes[i].pending -= 1
        if groups[g].nodes[i].pending == 0 {
            queues[q].barrierAfterEpoch[epoch] = nil
            makeReady(barrier, now: now)
        }
    }

    // MARK: Cancellation

    /// Cancels one operation: one that has not started never starts; an executing synchronous one is
    /// told (`isCancelled`) and ends when its body returns; an asynchronous one ends at once and its
    /// cancellation handler runs.
    mutating func cancel(_ ref: NodeRef, reason: String = "cancelled", now: Double) {
        guard isValid(ref) else { return }
        let g = Int(ref.group), i = Int(ref.index)
        let node = groups[g].nodes[i]
        switch node.state {
        case .pending, .ready, .retrying:
            complete(ref, .cancelled, error: reason, now: now)
        case .executing:
            guard node.flags & Node.cancelRequested == 0 else { return }
            groups[g].nodes[i].flags |= Node.cancelRequested
            groups[g].errors[ref.index] = reason
            if case .async = groups[g].bodies[i] {
                attemptLeft(queue: Int(node.queue))
                runCancelHandler(ref)
                complete(ref, .cancelled, error: reason, now: now)
            }
        case .succeeded, .failed, .cancelled:
            break
        }
    }

    mutating func cancel(group id: GroupID, reason: String = "cancelled", now: Double) {
        guard isLive(id) else { return }
        let g = Int(id.slot)
        if groups[g].cancelReason == nil { groups[g].cancelReason = reason }
        for i in groups[g].nodes.indices where !groups[g].nodes[i].state.isFinished {
            cancel(NodeRef(group: id.slot, index: Int32(i)), reason: reason, now: now)
        }
    }

    mutating func cancelAll(reason: String = "cancelled", now: Double) {
        for slot in groups.indices.dropFirst() where groups[slot].live && !groups[slot].finished {
            cancel(group: GroupID(slot: Int32(slot), generation: groups[slot].generation), reason: reason, now: now)
        }
    }

    private mutating func runCancelHandler(_ ref: NodeRef) {
        if let entry = cancelHandlers.removeValue(forKey: ref) { cancelHandlersToRun.append(entry.handler) }
    }

    func isCancelled(_ attempt: Attempt) -> Bool {
        guard isCurrent(attempt, in: .executing) else { return true }
        return groups[Int(attempt.ref.group)].nodes[Int(attempt.ref.index)].flags & (Node.cancelRequested | Node.timedOut) != 0
    }

    /// Stores an asynchronous attempt's cancellation handler; returns it when it must run at once.
    mutating func setCancelHandler(_ attempt: Attempt, handler: @escaping @Sendable () -> Void) -> (@Sendable () -> Void)? {
        if isCancelled(attempt) { return handler }
        cancelHandlers[attempt.ref] = (attempt.number, handler)
        return nil
    }

    // MARK: Timers

    /// Whether a timer would still do something when it fires; the engine drops the others when its
    /// heap fills with them (a long timeout outlives the attempt it was armed for).
    func isPending(_ kind: TimerKind) -> Bool {
        switch kind {
        case .attemptTimeout(let attempt):
            isCurrent(attempt, in: .executing) &&
                groups[Int(attempt.ref.group)].nodes[Int(attempt.ref.index)].flags & Node.cancelRequested == 0
        case .retry(let attempt):
            isCurrent(attempt, in: .retrying)
        case .deadline(let id):
            isLive(id) && !groups[Int(id.slot)].finished
        case .rateWindow(let q, let at):
            queues[q].rateTimer == at
        }
    }

    mutating func fire(_ kind: TimerKind, now: Double) {
        guard isPending(kind) else { return }
        switch kind {
        case .attemptTimeout(let attempt):
            let g = Int(attempt.ref.group), i = Int(attempt.ref.index)
            groups[g].nodes[i].flags |= Node.timedOut
            if case .async = groups[g].bodies[i] {
                runCancelHandler(attempt.ref)
                finish(attempt, outcome: .failure(""), now: now)
            }
        case .retry(let attempt):
            makeReady(attempt.ref, now: now)
        case .deadline(let id):
            cancel(group: id, reason: "the job's deadline passed", now: now)
        case .rateWindow(let q, _):
            // A start is free: the dispatch that follows every step takes it (and arms the next timer).
            queues[q].rateTimer = nil
        }
    }
}
