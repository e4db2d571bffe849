// A finished job's spans (SPEC §6 `tracing.otlp`): the job's root span from received to finished; each operation
// a child of it from ready to its end, linked to its dependencies' spans (the manifest's graph). An operation's
// attempts are events on its span, so that a job costs one span per operation and one more: each attempt an
// `attempt` event at its start (its wait for a slot is the time from the span's start to the first), each retried
// attempt an `attempt failed` event at its end with its error. Times are result.plist's, to the microsecond.

extension JobTrace {
    /// The spans, parents before children: the root first, then each operation in manifest order.
    public func spans() -> [SpanDescription] {
        var spans = [SpanDescription(name: "job", parent: nil, links: [], start: nanos(receivedAt), end: nanos(finishedAt),
                                     attributes: ["opqueued.job": .string(job), "opqueued.status": .string(status)],
                                     error: status == "succeeded" ? nil : error ?? status)]
        spans[0].end = max(spans[0].end, spans[0].start)
        spans.reserveCapacity(1 + operations.count)
        var index: [String: Int] = [:]
        for operation in operations {
            index[operation.id] = spans.count
            spans.append(operation.span(job: job, jobEnd: finishedAt))
        }
        for (k, operation) in operations.enumerated() where !operation.dependencies.isEmpty {
            spans[1 + k].links = operation.dependencies.compactMap { index[$0] }
        }
        return spans
    }
}

extension OperationTrace {
    /// This operation's span, a child of the root, with its attempts as events.
    func span(job: String, jobEnd: Double) -> SpanDescription {
        let end = finishedAt ?? jobEnd
        let start = min(readyAt ?? startedAt ?? end, end)
        return SpanDescription(
            name: "operation", parent: 0, links: [], start: nanos(start), end: nanos(end),
            attributes: ["opqueued.job": .string(job), "opqueued.operation": .string(id), "opqueued.kind": .string(kind),
                         "opqueued.queue": .string(queue), "opqueued.qualityOfService": .string(qualityOfService),
                         "opqueued.status": .string(state), "opqueued.attempt": .int(attempts)],
            error: state == "succeeded" ? nil : error ?? state, events: events())
    }

    /// Each attempt's start, and each retried attempt's end.
    func events() -> [EventDescription] {
        if attemptTimes.isEmpty {
            // Attempts not seen one by one (the operation ended before a restart): one event for them all.
            guard let startedAt, attempts > 0 else { return [] }
            return [EventDescription(name: "attempts", time: nanos(startedAt), attributes: ["opqueued.attempt": .int(attempts)])]
        }
        // Attempts seen after a restart are the last ones: numbered so that the last is `attempts`.
        let first = max(1, attempts - attemptTimes.count + 1)
        var events: [EventDescription] = []
        events.reserveCapacity(2 * attemptTimes.count - 1)
        for (k, attempt) in attemptTimes.enumerated() {
            // The first attempt starts at result.plist's startedAt (when it is the first the operation ran).
            let from = k == 0 && first == 1 ? startedAt ?? attempt.start : attempt.start
            events.append(EventDescription(name: "attempt", time: nanos(from), attributes: ["opqueued.attempt": .int(first + k)]))
            guard k < attemptTimes.count - 1 else { break }
            let to = attempt.end ?? attemptTimes[k + 1].start
            events.append(EventDescription(name: "attempt failed", time: nanos(max(to, from)),
                                           attributes: ["opqueued.attempt": .int(first + k),
                                                        "opqueued.error": .string(attempt.error ?? "retried")]))
        }
        return events
    }
}

/// Seconds since the epoch, rounded to the microsecond as result.plist writes them, in nanoseconds.
func nanos(_ seconds: Double) -> UInt64 {
    let micros = (seconds * 1e6).rounded()
    return micros > 0 ? UInt64(micros) * 1_000 : 0
}
