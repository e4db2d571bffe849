// The shell does what the job machine answers (Sources/JobModel/JobLifecycle+Results.swift), one event's result at a
// time, and logs its journal entries.

import Foundation
import JobModel
import Logging
import OperationEngine

extension Daemon {
    typealias Lifecycle = JobLifecycle<GroupID>

    /// On `work`: `run`'s manifest or plan was refused: logged, and published `rejected`.
    func reject(_ run: RunningJob, problems: [String], error: String) {
        switch shared.withLock({ $0.lifecycle.rejected(job: run.id, problems: problems, error: error) }) {
        case .publish(let announce, let error):
            log(announce)
            enqueuePublication(Publication(job: run, status: .rejected, error: error, records: []))
        case .ignore:
            break
        }
    }

    /// On `work`: the job is no longer this node's: it leaves the machine and `runs` in one step, is logged, and its
    /// group is cancelled (its folder ends when the group does) or its folder ends now.
    func lose(_ job: String, reason: String, resubmit: Bool = false) {
        let result = shared.withLock { s in
            s.runs[job] = nil
            return s.lifecycle.lost(job: job, reason: reason, resubmit: resubmit)
        }
        switch result {
        case .cancelFirst(let announce, let group):
            log(announce)
            engine.cancel(group, reason: "cancelled by request")
        case .endNow(let announce, let release, let end):
            log(announce)
            if let release { engine.release(release) }
            endLost(job, end)
        case .ignore:
            break
        }
    }

    /// On `work`: a group ended: its job is published with `records` (`run`: the job, when the caller has it), or a
    /// lost job's folder ends now that nothing runs in it.
    func groupFinished(_ group: GroupID, status: JobStatus, error: String?, for run: RunningJob? = nil,
                       records: [OperationRecord] = []) {
        switch shared.withLock({ $0.lifecycle.groupFinished(group: group, status: status, error: error) }) {
        case .publish(let job, let status, let error):
            guard let run = run ?? shared.withLock({ s in s.runs[job] }) else { return }
            enqueuePublication(Publication(job: run, status: status, error: error, records: records))
        case .lostEnded(let job, let release, let end):
            engine.release(release)
            endLost(job, end)
        case .ignore:
            break
        }
    }

    /// What becomes of a lost job's folder: removed, or given back to the store to be submitted again (a store
    /// that places jobs itself makes it a submission; only such a store forgets one, so nothing comes back to run
    /// here); a folder that cannot be read back as a job is discarded.
    private func endLost(_ job: String, _ end: Lifecycle.LostEnd) {
        switch end {
        case .discard:
            store.discard(job: job)
        case .resubmit:
            store.discardDownloads(job: job)
            switch store.heldJob(job) {
            case .success(let claimed): _ = store.submit([claimed])
            case .failure(let error):
                logger.error("job \(job): cannot be submitted again (\(error)); discarded", metadata: ["OPQ_JOB": .string(job)])
                store.discard(job: job)
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
