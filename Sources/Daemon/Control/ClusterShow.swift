// `show` for a job this node does not run but the cluster knows (SPEC §8): from the database's record of it.

import ClusterStore
import Foundation

extension Daemon {
    /// `show` of a job the cluster knows and this node does not run (SPEC §8): waiting, running elsewhere or ended;
    /// an ended one's operations come from the result.plist the database keeps. While it runs on another node, its
    /// operations' states are those that node's last heartbeat sent (ClusterProgress; `progressAt` says when): an
    /// operation it did not send (the job left out of a full beat, or not started at that beat) is `unknown`, never a
    /// `pending` that may be false.
    static func clusterShow(_ record: JobRecord) -> [String: Any] {
        /// An operation as the running node's last heartbeat sent it.
        func sent(_ id: String, _ operation: ClusterProgress.Sent) -> [String: Any] {
            ["id": id, "state": operation.state, "attempts": operation.attempts, "queue": operation.queue]
        }
        var answer: [String: Any] = ["exit": 0, "job": record.id, "submittedOn": record.submittedOn]
        if let node = record.node { answer["node"] = node }
        var progress: [String: ClusterProgress.Sent] = [:]
        if record.state == .running, let bytes = record.nodeProgress, let sent = ClusterProgress.decode(bytes, job: record.id) {
            progress = sent
            if let at = record.nodeProgressAt { answer["progressAt"] = at }
        }
        switch record.state {
        case .waiting:
            if let notBefore = record.notBefore, notBefore > Date().timeIntervalSince1970 {
                answer["status"] = "delayed"
                answer["notBefore"] = notBefore
            } else {
                answer["status"] = "waiting"
            }
        case .running: answer["status"] = "running"
        case .finished: answer["status"] = record.status ?? "finished"
        }
        // States from the kept result.plist (ended), the graph (kind, queue, dependencies) from the manifest.
        var ended: [String: [String: Any]] = [:]
        if let bytes = record.result,
           let plist = try? PropertyListSerialization.propertyList(from: Data(bytes), format: nil) as? [String: Any] {
            for op in plist["operations"] as? [[String: Any]] ?? [] { if let id = op["id"] as? String { ended[id] = op } }
        }
        var operations: [[String: Any]] = []
        let manifest = (try? PropertyListSerialization.propertyList(from: Data(record.manifest), format: nil)) as? [String: Any]
        for op in manifest?["operations"] as? [[String: Any]] ?? [] {
            guard let id = op["id"] as? String else { continue }
            var entry = ended.removeValue(forKey: id)
                ?? progress.removeValue(forKey: id).map { sent(id, $0) }
                ?? (record.state == .running ? ["id": id, "state": "unknown"] : ["id": id, "state": "pending", "attempts": 0])
            entry["dependencies"] = op["dependencies"] as? [String] ?? []
            if entry["kind"] == nil, let kind = op["kind"] as? String { entry["kind"] = kind }
            if entry["queue"] == nil { entry["queue"] = op["queue"] as? String ?? "" }
            operations.append(entry)
        }
        // Operations only the result or the progress knows (a photo list's, SPEC §3.5), in id order.
        operations += ended.values.sorted { ($0["id"] as? String ?? "") < ($1["id"] as? String ?? "") }
        operations += progress.sorted { $0.key < $1.key }.map { sent($0.key, $0.value) }
        answer["operations"] = operations
        return answer
    }
}
