// Results: records, outputs and release of a group for `results` and `show`; and the transition events the
// observer receives.

extension Scheduler {
    // MARK: Results

    func records(_ id: GroupID) -> [OperationRecord]? {
        guard isLive(id) else { return nil }
        let g = Int(id.slot)
        return groups[g].nodes.indices.map { record(NodeRef(group: id.slot, index: Int32($0))) }
    }

    func record(_ ref: NodeRef) -> OperationRecord {
        let g = Int(ref.group)
        let node = groups[g].nodes[Int(ref.index)]
        return OperationRecord(
            name: groups[g].names[Int(ref.index)], queue: QueueID(Int(node.queue)), state: node.state, attempts: Int(node.attempts),
            startedAt: node.startedAt.isNaN ? nil : node.startedAt,
            finishedAt: node.finishedAt.isNaN ? nil : node.finishedAt,
            error: groups[g].errors[ref.index], qualityOfService: requestedQoS(ref), queuePriority: node.priority)
    }

    func output(_ ref: NodeRef) -> OperationOutput? { isValid(ref) ? groups[Int(ref.group)].outputs[ref.index]?.value : nil }

    func isFinished(_ id: GroupID) -> Bool { !isLive(id) || groups[Int(id.slot)].finished }

    func operationCount(_ id: GroupID) -> Int { isLive(id) ? groups[Int(id.slot)].nodes.count : 0 }

    /// Frees a finished group's memory; its id becomes invalid.
    mutating func release(_ id: GroupID) {
        guard isLive(id), groups[Int(id.slot)].finished else { return }
        let g = Int(id.slot)
        let generation = groups[g].generation &+ 1
        groups[g] = Group()
        groups[g].generation = generation
        freeSlots.append(id.slot)
    }

    // MARK: Events

    mutating func emit(_ ref: NodeRef, _ state: OperationState, now: Double, error: String? = nil) {
        emit(ref, groups[Int(ref.group)].nodes[Int(ref.index)], state, now: now, error: error)
    }

    /// `emit` for the operation's node as given (not read from its group).
    mutating func emit(_ ref: NodeRef, _ node: Node, _ state: OperationState, now: Double, error: String? = nil) {
        events.append(.transition(Transition(
            group: GroupID(slot: ref.group, generation: groups[Int(ref.group)].generation), operation: Int(ref.index), state: state,
            attempt: Int(node.attempts), qualityOfService: effectiveQoS(node), queue: QueueID(Int(node.queue)),
            time: now, error: error)))
    }
}
