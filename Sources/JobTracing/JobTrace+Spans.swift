// A finished job's spans (SPEC §6 `tracing.otlp`): the job's root span from received to finished; each operation
// a child of it from ready to its end, linked to its dependencies' spans (the manifest's graph); under each
// operation its wait for a slot and each attempt as child spans. Times are result.plist's, to the microsecond.

extension JobTrace {
    /// The spans, parents before children: the root first, then each operation (manifest order) with its own.
    public func spans() -> [SpanDescription] {
        var spans = [SpanDescription(name: "job", parent: nil, links: [], start: nanos(receivedAt), end: nanos(finishedAt),
                                     attributes: ["opqueued.job": .string(job), "opqueued.status": .string(status)],
                                     error: status == "succeeded" ? nil : error ?? status)]
        spans[0].end = max(spans[0].end, spans[0].start)
        var index: [String: Int] = [:]
        var dependencies: [(span: Int, on: [String])] = []
        for operation in operations {
            index[operation.id] = spans.count
            dependencies.append((spans.count, operation.dependencies))
            operation.appendSpans(job: job, jobEnd: finishedAt, to: &spans)
        }
        for (span, on) in dependencies { spans[span].links = on.compactMap { index[$0] } }
        return spans
    }
}

extension OperationTrace {
    /// This operation's span, then its wait and its attempts.
    func appendSpans(job: String, jobEnd: Double, to spans: inout [SpanDescription]) {
        let end = finishedAt ?? jobEnd
        let start = min(readyAt ?? startedAt ?? end, end)
        let me = spans.count
        spans.append(SpanDescription(
            name: "operation", parent: 0, links: [], start: nanos(start), end: nanos(end),
            attributes: ["opqueued.job": .string(job), "opqueued.operation": .string(id), "opqueued.kind": .string(kind),
                         "opqueued.queue": .string(queue), "opqueued.qualityOfService": .string(qualityOfService),
                         "opqueued.status": .string(state), "opqueued.attempt": .int(attempts)],
            error: state == "succeeded" ? nil : error ?? state))
        if let readyAt {
            let waited = min(startedAt ?? end, end)
            spans.append(SpanDescription(name: "queue wait", parent: me, links: [], start: nanos(readyAt), end: nanos(max(waited, readyAt)),
                                         attributes: ["opqueued.queue": .string(queue)], error: nil))
        }
        if attemptTimes.isEmpty {
            // Attempts not seen one by one (the operation ended before a restart): one span covers them all.
            if let startedAt, attempts > 0 {
                spans.append(SpanDescription(name: "attempts", parent: me, links: [], start: nanos(startedAt),
                                             end: nanos(max(end, startedAt)),
                                             attributes: ["opqueued.attempt": .int(attempts)],
                                             error: state == "succeeded" ? nil : error ?? state))
            }
            return
        }
        // Attempts seen after a restart are the last ones: numbered so that the last is `attempts`.
        let first = max(1, attempts - attemptTimes.count + 1)
        for (k, attempt) in attemptTimes.enumerated() {
            let last = k == attemptTimes.count - 1
            let from = k == 0 ? startedAt ?? attempt.start : attempt.start
            let to = last ? end : attempt.end ?? attemptTimes[k + 1].start
            let failed = last ? (state == "succeeded" ? nil : error ?? attempt.error ?? state) : attempt.error ?? "retried"
            spans.append(SpanDescription(name: "attempt", parent: me, links: [], start: nanos(from), end: nanos(max(to, from)),
                                         attributes: ["opqueued.attempt": .int(first + k)], error: failed))
        }
    }
}

/// Seconds since the epoch, rounded to the microsecond as result.plist writes them, in nanoseconds.
func nanos(_ seconds: Double) -> UInt64 {
    let micros = (seconds * 1e6).rounded()
    return micros > 0 ? UInt64(micros) * 1_000 : 0
}
