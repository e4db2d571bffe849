// The control socket's one handler (SPEC §1): a request, typed (ControlRequest), answered from the daemon's state
// as the JSON object opqueuectl prints or reads. Runs on the control server's handler threads, never on its loop;
// nothing here waits on the database (a cluster's state is the node's last snapshot of it).

import ControlPlane
import ClusterStore
import OperationEngine
import Foundation
import SystemCalls

extension Daemon {
    /// The answer to one request as it came off the socket.
    public func answer(wire request: [String: Any]) -> [String: Any] {
        do { return answer(try ControlRequest(wire: request)) } catch { return ["exit": 64, "error": error.message] }
    }

    public func answer(_ request: ControlRequest) -> [String: Any] {
        switch request {
        case .status(let memory): return statusAnswer(memory: memory)
        case .declared:
            let names = submissionNames()
            return ["exit": 0, "queues": names.queues, "commands": names.commands, "cluster": store.node != nil]
        case .submitted(let manifest, let inode):
            // Not yet: still in the inbox, being read, or (a cluster) not yet inserted.
            guard let job = submittedJob(manifest: manifest, inode: inode) else { return ["exit": 0] }
            return ["exit": 0, "job": job]
        case .show(let job): return showAnswer(job)
        case .cancel(let job, let operation): return cancelAnswer(job, operation)
        case .metrics: return ["exit": 0, "text": metricsText()]
        case .suspend(let queue): return suspend(queue: queue, true) ? ["exit": 0] : ["exit": 1, "error": "unknown queue '\(queue)'"]
        case .resume(let queue): return suspend(queue: queue, false) ? ["exit": 0] : ["exit": 1, "error": "unknown queue '\(queue)'"]
        }
    }

    func statusAnswer(memory: Bool) -> [String: Any] {
        let status = status()
        var response: [String: Any] = [
            "exit": 0, "state": "running", "activeJobs": status.activeJobs, "waiting": status.waiting, "executing": status.executing,
            "operations": status.operations, "maxActiveOperations": status.maxActiveOperations,
            "queues": status.queues.map { Self.queueEntry($0, status) },
        ]
        if !status.schedules.isEmpty {
            response["schedules"] = status.schedules.map { s in
                var entry: [String: Any] = ["name": s.name, "cron": s.cron, "timeZone": s.zone]
                if let next = s.next { entry["next"] = next }
                return entry
            }
        }
        if let fault = status.fault { response["fault"] = fault }
        // Every delayed job: `activeJobs` and `jobs` list only the earliest (the rest are parked out of memory).
        if status.delayed > 0 { response["delayed"] = status.delayed }
        if status.submissions > 0 {
            response["submissions"] = status.submissions
            if let since = status.submissionsSince { response["submissionsSince"] = since }
        }
        // SPEC §8: a node speaks for the whole cluster (as of its last heartbeat; never waiting on the database).
        if let cluster = store.snapshot() {
            response["nodes"] = cluster.nodes.map { n in
                var node: [String: Any] = ["node": n.node, "connected": n.connected, "lastHeartbeat": n.lastHeartbeat, "jobs": n.jobs,
                                           "freeSlots": n.freeSlots]
                if let schema = n.schema { node["schema"] = schema }
                return node
            }
            response["cluster"] = Self.clusterSummary(cluster)
        }
        response["jobs"] = status.jobs.map { job in
            var entry: [String: Any] = ["job": job.job, "operations": job.operations, "ended": job.ended]
            if let notBefore = job.notBefore { entry["notBefore"] = notBefore }
            return entry
        }
        if memory { response["heapBytes"] = heapBytesInUse }
        return response
    }

    static func queueEntry(_ q: QueueSnapshot, _ status: Status) -> [String: Any] {
        var queue: [String: Any] = ["name": q.name, "maxConcurrentOperationCount": q.maxConcurrentOperationCount,
                                    "qualityOfService": q.qualityOfService.name, "suspended": q.isSuspended,
                                    "pending": q.pending, "executing": q.executing]
        // SPEC §3.7: a rated queue's rate and its next free start.
        if let rate = q.rateLimit { queue["rateLimit"] = ["operations": rate.operations, "seconds": rate.seconds] }
        if let next = q.nextStartAt { queue["nextStartAt"] = next }
        // Suspended only until this node has read the cluster's suspensions.
        if q.isSuspended && status.held.contains(q.name) { queue["held"] = true }
        // A cluster-wide limit: the slots this node holds, and its wait for more, if it waits.
        if let slots = status.clusterSlots[q.name] {
            queue["clusterMaxConcurrentOperationCount"] = slots.limit
            queue["clusterSlotsHeld"] = slots.held
            if let priority = slots.waitingAt { queue["clusterSlotWait"] = priority.name }
        }
        return queue
    }

    static func clusterSummary(_ cluster: ClusterSnapshot) -> [String: Any] {
        var summary: [String: Any] = ["node": cluster.node, "state": cluster.connected ? "connected" : "disconnected"]
        if let error = cluster.lastError, !cluster.connected { summary["reason"] = error }
        summary["wakeupsArrive"] = cluster.wakeupsArrive
        summary["unrunnable"] = cluster.unrunnable.map { ["job": $0.job, "reason": $0.reason] }
        summary["queues"] = Dictionary(uniqueKeysWithValues: cluster.queues.map {
            ($0.key, ["waiting": $0.value.waiting, "running": $0.value.running])
        })
        // When those counts were read (seconds since the epoch): a node reads them less often under a huge backlog.
        if let read = cluster.refreshedAt { summary["queuesReadAt"] = Date().timeIntervalSince1970 - (monotonicSeconds() - read) }
        return summary
    }

    func showAnswer(_ job: String) -> [String: Any] {
        switch show(job: job) {
        case .operations(let operations)?: return ["exit": 0, "job": job, "status": "running", "operations": operations]
        // Claimed a moment ago, its manifest being read: not an unknown job.
        case .starting?: return ["exit": 0, "job": job, "status": "running", "starting": true, "operations": [[String: Any]]()]
        case .delayed(let until, let operations)?:
            return ["exit": 0, "job": job, "status": "delayed", "notBefore": until, "operations": operations]
        case nil: break
        }
        // A job the store knows that this node does not run (a cluster's): waiting, running elsewhere or ended.
        do {
            if let record = try store.job(job) { return Self.clusterShow(record) }
        } catch {
            return ["exit": 3, "error": "job '\(job)' is not on this node and the cluster cannot be asked now: \(error); try again"]
        }
        return ["exit": 1, "error": "unknown job '\(job)'"]
    }

    func cancelAnswer(_ job: String, _ operation: String?) -> [String: Any] {
        switch cancel(job: job, operation: operation) {
        case .cancelled: return ["exit": 0]
        case .unknownJob: return ["exit": 1, "error": "unknown job '\(job)'"]
        case .unknownOperation: return ["exit": 1, "error": "job '\(job)' has no operation '\(operation ?? "")'"]
        case .alreadyEnded:
            return ["exit": 1,
                    "error": operation.map { "operation '\($0)' of job '\(job)' has already ended" } ?? "job '\(job)' has already ended"]
        case .unavailable(let reason):
            return ["exit": 3, "error": "job '\(job)' is not on this node and the cluster cannot be asked now: \(reason); try again"]
        }
    }
}
