// `show` for a job this node does not run but the cluster knows (SPEC §8): from the database's record of it.

import ClusterStore
import ControlPlane
import Foundation

extension Daemon {
    /// `show` of a job the cluster knows and this node does not run (SPEC §8): waiting, running elsewhere or ended;
    /// an ended one's operations come from the result.plist the database keeps. While it runs on another node, its
    /// operations' states are those that node's last heartbeat sent (ClusterProgress; `progressAt` says when): an
    /// operation it did not send (the job left out of a full beat, or not started at that beat) is `unknown`, never a
    /// `pending` that may be false.
    static func clusterShow(_ record: JobRecord) -> ShowAnswer {
        /// An operation as the running node's last heartbeat sent it.
        func sent(_ id: String, _ operation: ClusterProgress.Sent) -> ShowAnswer.Operation {
            ShowAnswer.Operation(id: id, queue: operation.queue, state: operation.state, attempts: operation.attempts)
        }
        var answer = ShowAnswer(job: record.id, status: "running", operations: [])
        answer.submittedOn = record.submittedOn
        answer.node = record.node
        var progress: [String: ClusterProgress.Sent] = [:]
        if record.state == .running, let bytes = record.nodeProgress, let sent = ClusterProgress.decode(bytes, job: record.id) {
            progress = sent
            answer.progressAt = record.nodeProgressAt
        }
        switch record.state {
        case .waiting:
            if let notBefore = record.notBefore, notBefore > Date().timeIntervalSince1970 {
                answer.status = "delayed"
                answer.notBefore = notBefore
            } else {
                answer.status = "waiting"
            }
        case .running: answer.status = "running"
        case .finished: answer.status = record.status ?? "finished"
        }
        // States from the kept result.plist (ended), the graph (kind, queue, dependencies) from the manifest.
        var ended: [String: ShowAnswer.Operation] = [:]
        if let bytes = record.result, let result = try? PropertyListDecoder().decode(ShownResult.self, from: Data(bytes)) {
            for op in result.operations ?? [] { ended[op.id] = op }
        }
        var operations: [ShowAnswer.Operation] = []
        for op in (try? PropertyListDecoder().decode(ManifestGraph.self, from: Data(record.manifest)))?.operations ?? [] {
            guard let id = op.id else { continue }
            var entry = ended.removeValue(forKey: id)
                ?? progress.removeValue(forKey: id).map { sent(id, $0) }
                ?? (record.state == .running ? ShowAnswer.Operation(id: id, state: "unknown")
                                             : ShowAnswer.Operation(id: id, state: "pending", attempts: 0))
            entry.dependencies = op.dependencies ?? []
            if entry.kind == nil { entry.kind = op.kind }
            if entry.queue == nil { entry.queue = op.queue ?? "" }
            operations.append(entry)
        }
        // Operations only the result or the progress knows (a photo list's, SPEC §3.5), in id order.
        operations += ended.values.sorted { $0.id < $1.id }
        operations += progress.sorted { $0.key < $1.key }.map { sent($0.key, $0.value) }
        answer.operations = operations
        return answer
    }
}

/// What `show` reads of a manifest: its operations' graph. A field of another type than a manifest's is left out,
/// as is an operation without an id.
struct ManifestGraph: Decodable {
    struct Operation: Decodable {
        var id: String?
        var kind: String?
        var queue: String?
        var dependencies: [String]?

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            id = try? container.decodeIfPresent(String.self, forKey: .id)
            kind = try? container.decodeIfPresent(String.self, forKey: .kind)
            queue = try? container.decodeIfPresent(String.self, forKey: .queue)
            dependencies = try? container.decodeIfPresent([String].self, forKey: .dependencies)
        }

        enum CodingKeys: String, CodingKey { case id, kind, queue, dependencies }
    }

    var operations: [Operation]?
}
