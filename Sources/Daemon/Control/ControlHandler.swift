// The control socket's one handler (SPEC §1): a request, typed (ControlRequest), answered from the daemon's state
// as the typed answer (ControlPlane's ControlAnswer) opqueuectl prints or reads. Runs on the control server's handler
// threads, never on its loop; nothing here waits on the database (a cluster's state is the node's last snapshot of it).

import ControlPlane
import ClusterStore
import OperationEngine
import Foundation
import SystemCalls

extension Daemon {
    public func answer(_ request: ControlRequest) -> ControlAnswer {
        switch request {
        case .status(let memory): return .status(statusAnswer(memory: memory))
        case .declared:
            let names = submissionNames()
            return .declared(DeclaredAnswer(queues: names.queues, commands: names.commands, fileRoots: names.fileRoots,
                                            cluster: store.node != nil))
        case .submitted(let manifest, let inode):
            // Not yet (nil): still in the inbox, being read, or (a cluster) not yet inserted.
            return .submitted(SubmittedAnswer(job: submittedJob(manifest: manifest, inode: inode)))
        case .show(let job): return showAnswer(job)
        case .cancel(let job, let operation): return cancelAnswer(job, operation)
        case .metrics: return .metrics(MetricsAnswer(text: metricsText()))
        case .suspend(let queue): return suspend(queue: queue, true) ? .done : .refused(1, "unknown queue '\(queue)'")
        case .resume(let queue): return suspend(queue: queue, false) ? .done : .refused(1, "unknown queue '\(queue)'")
        }
    }

    func statusAnswer(memory: Bool) -> StatusAnswer {
        let status = status()
        var answer = StatusAnswer(activeJobs: status.activeJobs, waiting: status.waiting, executing: status.executing,
                                  operations: status.operations, maxActiveOperations: status.maxActiveOperations,
                                  queues: status.queues.map { Self.queueEntry($0, status) },
                                  jobs: status.jobs.map { StatusAnswer.Job(job: $0.job, operations: $0.operations, ended: $0.ended,
                                                                           notBefore: $0.notBefore) })
        if !status.schedules.isEmpty {
            answer.schedules = status.schedules.map {
                StatusAnswer.Schedule(name: $0.name, cron: $0.cron, timeZone: $0.zone, next: $0.next)
            }
        }
        answer.fault = status.fault
        // Every delayed job: `activeJobs` and `jobs` list only the earliest (the rest are parked out of memory).
        if status.delayed > 0 { answer.delayed = status.delayed }
        if status.submissions > 0 {
            answer.submissions = status.submissions
            answer.submissionsSince = status.submissionsSince
        }
        // SPEC §8: a node speaks for the whole cluster (as of its last heartbeat; never waiting on the database).
        if let cluster = store.snapshot() {
            answer.nodes = cluster.nodes
            answer.cluster = Self.clusterSummary(cluster)
        }
        if memory { answer.heapBytes = heapBytesInUse }
        return answer
    }

    static func queueEntry(_ q: QueueSnapshot, _ status: Status) -> StatusAnswer.Queue {
        var queue = StatusAnswer.Queue(name: q.name, maxConcurrentOperationCount: q.maxConcurrentOperationCount,
                                       qualityOfService: q.qualityOfService.name, suspended: q.isSuspended,
                                       pending: q.pending, executing: q.executing)
        // SPEC §3.7: a rated queue's rate and its next free start.
        queue.rateLimit = q.rateLimit.map { StatusAnswer.RateLimit(operations: $0.operations, seconds: $0.seconds) }
        queue.nextStartAt = q.nextStartAt
        // Suspended only until this node has read the cluster's suspensions.
        if q.isSuspended && status.held.contains(q.name) { queue.held = true }
        // A cluster-wide limit: the slots this node holds, and its wait for more, if it waits.
        if let slots = status.clusterSlots[q.name] {
            queue.clusterMaxConcurrentOperationCount = slots.limit
            queue.clusterSlotsHeld = slots.held
            queue.clusterSlotWait = slots.waitingAt?.name
        }
        return queue
    }

    static func clusterSummary(_ cluster: ClusterSnapshot) -> StatusAnswer.Cluster {
        // When the queues' counts were read (seconds since the epoch): a node reads them less often under a huge backlog.
        let readAt = cluster.refreshedAt.map { Date().timeIntervalSince1970 - (monotonicSeconds() - $0) }
        return StatusAnswer.Cluster(node: cluster.node, state: cluster.connected ? "connected" : "disconnected",
                                    reason: cluster.connected ? nil : cluster.lastError, wakeupsArrive: cluster.wakeupsArrive,
                                    unrunnable: cluster.unrunnable.map { StatusAnswer.Unrunnable(job: $0.job, reason: $0.reason) },
                                    queues: cluster.queues.mapValues { StatusAnswer.QueueCounts(waiting: $0.waiting, running: $0.running) },
                                    queuesReadAt: readAt)
    }

    func showAnswer(_ job: String) -> ControlAnswer {
        switch show(job: job) {
        case .operations(let operations)?: return .show(ShowAnswer(job: job, status: "running", operations: operations))
        // Claimed a moment ago, its manifest being read: not an unknown job.
        case .starting?:
            var answer = ShowAnswer(job: job, status: "running", operations: [])
            answer.starting = true
            return .show(answer)
        case .delayed(let until, let operations)?:
            var answer = ShowAnswer(job: job, status: "delayed", operations: operations)
            answer.notBefore = until
            return .show(answer)
        case nil: break
        }
        // A job the store knows that this node does not run (a cluster's): waiting, running elsewhere or ended.
        do {
            if let record = try store.job(job) { return .show(Self.clusterShow(record)) }
        } catch {
            return .refused(3, "job '\(job)' is not on this node and the cluster cannot be asked now: \(error); try again")
        }
        return .refused(1, "unknown job '\(job)'")
    }

    func cancelAnswer(_ job: String, _ operation: String?) -> ControlAnswer {
        switch cancel(job: job, operation: operation) {
        case .cancelled: return .done
        case .unknownJob: return .refused(1, "unknown job '\(job)'")
        case .unknownOperation: return .refused(1, "job '\(job)' has no operation '\(operation ?? "")'")
        case .alreadyEnded:
            return .refused(1, operation.map { "operation '\($0)' of job '\(job)' has already ended" } ?? "job '\(job)' has already ended")
        case .unavailable(let reason):
            return .refused(3, "job '\(job)' is not on this node and the cluster cannot be asked now: \(reason); try again")
        }
    }
}
