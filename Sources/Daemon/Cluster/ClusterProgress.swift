// ClusterProgress: what a node's heartbeat says about the jobs it runs, so that `opqueuectl show` on any other node
// can give each operation's state (SPEC §8: `show` answers for every job the cluster knows; nodes never talk to each
// other, so it goes through the database, in the beat the node sends anyway — no statement more).
//
// A binary property list: job id → operation id → [state, attempts, queue] (state: OperationState's raw value; the
// queue it runs on there, which a manifest may leave to the running node's `defaultQueues`). Bounded
// by `budget` bytes: jobs are taken in id order while they fit, and a job that does not fit is left out whole (its
// operations then show `unknown`, as before). Read back from the database, it is input like any row: anything that
// does not decode as this shape is ignored, never trusted further.

import Dispatch
import OperationEngine
import PropertyList
import Synchronization

public enum ClusterProgress {
    /// One operation as a node sends it.
    typealias Operation = (id: String, state: OperationState, attempts: Int, queue: String)
    /// One operation as read back: its state by name, as `show` gives it.
    public typealias Sent = (state: String, attempts: Int, queue: String)

    /// At most this many bytes per beat (a job of a million operations is left out, not sent each beat).
    static let budget = 64 * 1024

    /// What one operation's entry costs in the document, about: its id, its two small integers, its queue's name, offsets.
    static func estimate(operations: Int, idBytes: Int) -> Int { idBytes + operations * 24 }

    /// `jobs`: each running job's operations, id, state, attempts and queue, in any order.
    static func encode(_ jobs: [(job: String, operations: [Operation])],
                       budget: Int = budget) -> [UInt8] {
        var entries: [PlistDictionary.Entry] = []
        var used = 64
        for job in jobs.sorted(by: { $0.job < $1.job }) {
            let cost = job.job.utf8.count + job.operations.reduce(0) {
                $0 + estimate(operations: 1, idBytes: $1.id.utf8.count + $1.queue.utf8.count)
            }
            if used + cost > budget { continue }
            used += cost
            let operations = job.operations.map {
                PlistDictionary.Entry(key: $0.id,
                                      value: .array([.integer(Int($0.state.rawValue)), .integer($0.attempts), .string($0.queue)]))
            }
            entries.append(PlistDictionary.Entry(key: job.job, value: .dictionary(PlistDictionary(operations))))
        }
        // The estimate is close, not exact (the writer's offsets widen with the object count): the bound is kept by
        // leaving out the largest job until the document fits.
        var document = PlistBinaryWriter.document(.dictionary(PlistDictionary(entries)))
        while document.count > budget, !entries.isEmpty {
            let largest = entries.indices.max {
                (entries[$0].value.dictionary?.entries.count ?? 0) < (entries[$1].value.dictionary?.entries.count ?? 0)
            }
            if let largest { entries.remove(at: largest) }
            document = PlistBinaryWriter.document(.dictionary(PlistDictionary(entries)))
        }
        return document
    }

    /// `job`'s operations from a node's progress: operation id → (state name, attempts, queue); nil when the
    /// document does not hold the job (left out, or sent before the job started) or does not decode.
    public static func decode(_ bytes: [UInt8], job: String) -> [String: Sent]? {
        guard let document = try? PropertyList.parse(bytes), let jobs = document.dictionary,
              let operations = jobs[job]?.dictionary else { return nil }
        var answer: [String: Sent] = [:]
        for entry in operations.entries {
            guard let fields = entry.value.array, fields.count == 3, let code = fields[0].integer, let attempts = fields[1].integer,
                  let queue = fields[2].string, let raw = UInt8(exactly: code), let state = OperationState(rawValue: raw),
                  attempts >= 0 else { continue }
            answer[entry.key] = (state.name, attempts, queue)
        }
        return answer
    }
}

/// The progress a heartbeat sends, sampled without ever holding the beat up long: the beat is the node's lease, and
/// reading the engine waits for its lock, which a huge submission may hold for a while. A sample that takes longer
/// than `patience` goes on in the background and the beat sends the last one made (nil before any).
final class ProgressSampler: Sendable {
    private let queue = DispatchQueue(label: "opqueued.progress")
    private let state = Mutex<(latest: [UInt8]?, sampling: Bool)>((nil, false))
    let patience: Double

    init(patience: Double = 0.05) { self.patience = patience }

    func sample(_ make: @escaping @Sendable () -> [UInt8]) -> [UInt8]? {
        let start = state.withLock { s -> Bool in
            if s.sampling { return false }
            s.sampling = true
            return true
        }
        if start {
            let done = DispatchSemaphore(value: 0)
            queue.async { [self] in
                let bytes = make()
                state.withLock { $0 = (bytes, false) }
                done.signal()
            }
            _ = done.wait(timeout: .now() + patience)
        }
        return state.withLock { $0.latest }
    }
}
