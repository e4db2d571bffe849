// The shell's side of the engine's events (see Daemon.swift): journal entries, durable progress and job ends, on the
// engine's delivery thread.

import Foundation
import JobModel
import Logging
import OperationEngine

extension Daemon {
    // MARK: Engine events

    /// On the engine's delivery thread: journal entries, durable progress, job ends.
    func deliver(_ events: [EngineEvent]) {
        // A submission under way may have put its group's first events in this batch.
        registering.withLock { _ in }
        var successes: [OperationSuccess] = []
        defer { record(successes) }
        for engineEvent in events {
            switch engineEvent {
            case .transition(let t):
                let (job, plan, recovered, recomputedFailure) = shared.withLock { s in
                    let job = s.lifecycle.job(of: t.group).flatMap { s.runs[$0] }
                    let recovered = job?.recovered.contains(t.operation) ?? true
                    if job != nil, !recovered, t.state == .succeeded || t.state == .failed || t.state == .cancelled {
                        s.lifecycle.operationEnded(group: t.group)
                    }
                    return (job, job?.plan, recovered, t.state == .failed && job?.recomputed.contains(t.operation) == true)
                }
                if let permits = limits.permits, let plan, t.operation < plan.operations.count {
                    permits.transition(queue: plan.operations[t.operation].queue, state: t.state)
                }
                if let rates = limits.rates, let plan, t.operation < plan.operations.count {
                    rates.transition(queue: plan.operations[t.operation].queue, state: t.state)
                }
                guard let job, let plan, t.operation < plan.operations.count, !recovered || recomputedFailure else { continue }
                let seen = recovered || job.fusion.isEmpty ? [t] : job.fusion.deliver(t) { engine.record(t.group, operation: $0) }
                for t in seen {
                    if !recovered {
                        measure(t, plan.operations[t.operation])
                        if tracing != nil { telemetry.timelines.note(job: job.id, t) }
                    }
                    logTransition(t, job: job, operation: plan.operations[t.operation], successes: &successes)
                }
            case .groupFinished(let group):
                // Its successes are in the log before its end is handled (the publication's commit covers them).
                record(successes)
                successes.removeAll()
                work.async { [self] in finish(group) }
            }
        }
    }


    /// The engine's records of a job's group as the user sees them (its fused chains' operations as unfused).
    func records(_ group: GroupID, of job: RunningJob?) -> [OperationRecord]? {
        guard let records = engine.records(group) else { return nil }
        guard let job, !job.fusion.isEmpty else { return records }
        return records.enumerated().map { job.fusion.overlay($0.offset, $0.element) }
    }

    /// On the delivery thread: the metrics an operation's transition moves.
    func measure(_ t: Transition, _ operation: OperationPlan) {
        switch t.state {
        case .ready:
            _ = telemetry.clock.mark(t.group, t.operation, at: t.time, executing: false)
        case .executing:
            if let ready = telemetry.clock.mark(t.group, t.operation, at: t.time, executing: true), !ready.executing {
                metrics.waited(queue: operation.queue, seconds: t.time - ready.time)
            }
        case .retrying, .succeeded, .failed, .cancelled:
            // Only an attempt that was executing ran (a cancel of a ready operation ends it from `ready`).
            if let last = telemetry.clock.end(t.group, t.operation), last.executing {
                metrics.ran(kind: operation.kind.rawValue, seconds: t.time - last.time)
            }
            guard t.state != .retrying else { break }
            metrics.operationEnded(kind: operation.kind.rawValue, queue: operation.queue, state: t.state.name)
        default:
            break
        }
    }

    /// Progress lines were written: make sure a commit covers them soon.
    func progressWasRecorded(_ lines: Int) {
        guard durability.progress.wrote(lines) else { return }
        work.asyncAfter(deadline: .now() + Self.progressCommitDelay) { [self] in
            guard durability.progress.takeSchedule() else { return }
            durability.commits.after { [logger] outcome in
                if case .failure(let error) = outcome {
                    logger.error("committing progress failed: \(error); operations that succeeded may run again after a restart")
                }
            }
        }
    }

    /// Waits for one group commit of the spool (it also covers every progress line written before it).
    func commit() throws {
        try durability.commits.now()
    }

    /// The batch's successes go into the progress log in one append (durable at the next commit).
    private func record(_ successes: [OperationSuccess]) {
        guard !successes.isEmpty else { return }
        do {
            try store.recordSuccesses(successes)
            progressWasRecorded(successes.count)
        } catch {
            // Until the fault is over, operations that succeed may run again after a restart.
            let first = successes[0]
            let what = successes.count == 1 ? "\(first.job)/\(first.operation)"
                : "\(successes.count) operations (\(first.job)/\(first.operation) first)"
            work.async { [self] in spoolFailed("recording the success of \(what)", error) }
        }
    }

    /// Logs an operation's transition; a success is added to `successes` for the progress log.
    func logTransition(_ t: Transition, job: RunningJob, operation: OperationPlan, successes: inout [OperationSuccess]) {
        var fields: Logger.Metadata = [
            "OPQ_EVENT": "operation", "OPQ_STATE": .string(t.state.name), "OPQ_JOB": .string(job.id),
            "OPQ_OPERATION": .string(operation.id), "OPQ_KIND": .string(operation.kind.rawValue), "OPQ_QUEUE": .string(operation.queue),
            "OPQ_QOS": .string(t.qualityOfService.name),
            "OPQ_QUEUE_PRIORITY": .string((operation.queuePriority ?? job.plan?.queuePriority ?? .normal).name),
        ]
        if t.attempt > 0 { fields["OPQ_ATTEMPT"] = .string(String(t.attempt)) }
        if let error = t.error { fields["OPQ_ERROR"] = .string(error) }
        var level = Logger.Level.info
        var message = "operation \(job.id)/\(operation.id) \(t.state.name)"
        switch t.state {
        case .succeeded, .failed, .cancelled:
            if let record = engine.record(t.group, operation: t.operation).map({ job.fusion.overlay(t.operation, $0) }) {
                if let started = record.startedAt {
                    fields["OPQ_DURATION_USEC"] = .string(String(Int64(((t.time - started) * 1e6).rounded())))
                }
                if t.state == .succeeded, let started = record.startedAt {
                    let done = DoneRecord(startedAt: started, finishedAt: t.time, attempts: record.attempts)
                    successes.append(OperationSuccess(job: job.id, operation: operation.id, record: done))
                }
            }
            if t.state == .failed { level = .error }
            if t.state == .cancelled { level = .warning }
        case .retrying:
            level = .warning
        default:
            break
        }
        if let error = t.error { message += ": \(error)" }
        event(level, message, fields)
    }
}
