// The shell's traces (SPEC §6 `tracing.otlp`, see JobTracing): what the delivery thread saw of each operation
// (ready, each attempt) is kept per job while tracing is on; when the job is announced, its trace is built from the
// same data as result.plist and handed to the exporter, which never blocks the caller.

import Foundation
import JobModel
import JobTracing
import Logging
import OperationEngine
import Synchronization

/// Ready times and attempts by job and operation index; written on the delivery thread, taken on `work`.
final class TraceTimelines: Sendable {
    struct Timeline {
        var readyAt: Double?
        var attempts: [AttemptTime] = []
    }

    private let timelines = Mutex<[String: [Int: Timeline]]>([:])

    func note(job: String, _ t: Transition) {
        guard t.state != .pending else { return }
        timelines.withLock { all in
            var line = all[job]?[t.operation] ?? Timeline()
            switch t.state {
            case .ready:
                if line.readyAt == nil { line.readyAt = t.time }
            case .executing:
                line.attempts.append(AttemptTime(start: t.time, end: nil, error: nil))
            default:
                if let last = line.attempts.indices.last, line.attempts[last].end == nil {
                    line.attempts[last].end = t.time
                    line.attempts[last].error = t.error
                }
            }
            all[job, default: [:]][t.operation] = line
        }
    }

    func take(job: String) -> [Int: Timeline] {
        timelines.withLock { $0.removeValue(forKey: job) ?? [:] }
    }
}

extension Daemon {
    /// The exporter for `tracing.otlp`, if set; a failure to make it is logged and leaves traces off.
    static func makeTracing(_ configuration: Configuration, node: String?, logger: Logger, metrics: DaemonMetrics) -> TraceExport? {
        guard let otlp = configuration.tracingOTLP else { return nil }
        do {
            let export = try TraceExport(otlp: otlp, node: node ?? defaultNodeName(), log: logger) { dropped in
                metrics.traceSpansDropped(dropped)
            }
            logger.info("tracing: each job's trace goes to \(export.endpoint) (OTLP/HTTP)")
            return export
        } catch {
            logger.error("tracing.otlp: the exporter to \(otlp) could not be made: \(error); jobs are not traced")
            return nil
        }
    }

    /// On `work`, once the job is announced: its trace, with result.plist's times (ResultWriter.times), described on
    /// the exporter's thread from what the job has now (its plan as of its end; `claimed` never changes).
    func emitTrace(_ publication: Publication, finishedAt now: Double) {
        guard let tracing else { return }
        let job = publication.job, plan = job.plan, status = publication.status, error = publication.error
        let records = publication.records, timelines = telemetry.timelines.take(job: job.id)
        tracing.emit {
            let operations = plan?.operations ?? []
            var traced: [OperationTrace] = []
            traced.reserveCapacity(min(operations.count, records.count))
            for (i, record) in records.prefix(operations.count).enumerated() {
                let operation = operations[i]
                let (started, finished, attempts) = ResultWriter.times(record, of: operation, in: job)
                let line = timelines[i]
                traced.append(OperationTrace(
                    id: operation.id, kind: operation.kind.rawValue, queue: operation.queue,
                    qualityOfService: record.qualityOfService.name, dependencies: operation.dependencies, state: record.state.name,
                    attempts: attempts, error: record.state == .succeeded ? nil : record.error, startedAt: started, finishedAt: finished,
                    readyAt: line?.readyAt, attemptTimes: line?.attempts ?? []))
            }
            return JobTrace(job: job.id, status: status.rawValue, error: error, receivedAt: job.claimed.receivedAt, finishedAt: now,
                            traceparent: plan?.traceparent, operations: traced)
        }
    }
}
