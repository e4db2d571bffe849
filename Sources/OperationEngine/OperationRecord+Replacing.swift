// A record with some fields replaced: for a caller that knows better than the engine what an operation did (the
// daemon's fused image chains, whose operations the engine sees end before their work is done).

extension OperationRecord {
    public func replacing(state: OperationState, attempts: Int, startedAt: Double?, finishedAt: Double?,
                          error: String?) -> OperationRecord {
        OperationRecord(name: name, queue: queue, state: state, attempts: attempts, startedAt: startedAt, finishedAt: finishedAt,
                        error: error, qualityOfService: qualityOfService, queuePriority: queuePriority)
    }
}

extension Transition {
    public func replacing(operation: Int, state: OperationState, attempt: Int, time: Double, error: String?) -> Transition {
        Transition(group: group, operation: operation, state: state, attempt: attempt, qualityOfService: qualityOfService,
                   queue: queue, time: time, error: error)
    }
}
