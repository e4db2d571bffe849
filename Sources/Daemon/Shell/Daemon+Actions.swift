// The shell performs the lifecycle's actions (Sources/JobModel/JobLifecycle.swift) and logs its journal entries.

import Foundation
import JobModel
import Logging
import OperationEngine

extension Daemon {
    /// Performs `actions` in order (outside `shared`). `run` and `records` are the job a publication is for and its
    /// engine records, when the caller has them.
    func perform(_ actions: [JobLifecycle<GroupID>.Action], for run: RunningJob? = nil, records: [OperationRecord] = []) {
        for action in actions {
            switch action {
            case .journal(let entry):
                log(entry)
            case .cancelGroup(let group):
                engine.cancel(group, reason: "cancelled by request")
            case .cancelOperation(let job, let group, let operation):
                // Only a cancel asked before the group existed comes here: its answer was given then.
                if cancel(job: job, group: group, operation: operation) == .unknownOperation {
                    logger.warning("job \(job): cancel of operation '\(clipped(operation))' ignored: the job has no such operation")
                }
            case .publish(let job, let status, let error):
                guard let run = run ?? shared.withLock({ s in s.runs[job] }) else { continue }
                enqueuePublication(Publication(job: run, status: status, error: error, records: records))
            case .releaseGroup(let group):
                engine.release(group)
            case .discard(let job):
                store.discard(job: job)
            case .resubmit(let job):
                // The store makes it a submission again (moved to its waiting folder; only a store that places jobs
                // itself forgets one, so nothing comes back to run here); a folder that cannot be read back as a job
                // is discarded.
                store.discardDownloads(job: job)
                switch store.heldJob(job) {
                case .success(let claimed): _ = store.submit([claimed])
                case .failure(let error):
                    logger.error("job \(job): cannot be submitted again (\(error)); discarded", metadata: ["OPQ_JOB": .string(job)])
                    store.discard(job: job)
                }
            }
        }
    }

    func log(_ entry: JobLifecycle<GroupID>.JournalEntry) {
        switch entry {
        case .received(let job, let manifest):
            event(.info, "job \(job) received from inbox/\(manifest)",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "received", "OPQ_JOB": .string(job)])
        case .claimed(let job, let fromNode):
            var fields: Logger.Metadata = ["OPQ_EVENT": "job", "OPQ_STATE": "claimed", "OPQ_JOB": .string(job)]
            if let fromNode { fields["OPQ_FROM_NODE"] = .string(fromNode) }
            event(.info, "job \(job) claimed\(fromNode.map { " from node \($0)" } ?? "")", fields)
        case .accepted(let job, let operations):
            event(.info, "job \(job) accepted: \(operations) operations",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "accepted", "OPQ_JOB": .string(job)])
        case .delayed(let job, let until):
            event(.info, "job \(job) delayed until \(TimeText.local(until))",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "delayed", "OPQ_JOB": .string(job), "OPQ_NOT_BEFORE": .string(TimeText.epoch(until))])
        case .rejected(let job, let problems, let error):
            event(.error, "job \(job) rejected: \(problems.joined(separator: "; "))",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "rejected", "OPQ_JOB": .string(job), "OPQ_STATUS": "rejected",
                   "OPQ_ERROR": .string(error)])
        case .lost(let job, let reason):
            event(.warning, "job \(job) lost: \(reason); it is stopped here and nothing is published for it",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "lost", "OPQ_JOB": .string(job), "OPQ_ERROR": .string(reason)])
        }
    }
}
