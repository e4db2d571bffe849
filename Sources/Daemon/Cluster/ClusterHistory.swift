// The cluster's history for `opqueuectl list` (SPEC §1: "in a cluster, the database's history"): the finished jobs
// the database keeps (for keepFinishedDays), whichever node ran them, as outbox entries. Read a page at a time with
// a deadline, from a program that has no event loop of its own: opqueuectl waits on a semaphore.

import ClusterStore
import Dispatch
import JobModel
import PropertyList
import Synchronization

public enum ClusterHistory {
    /// Jobs per statement.
    static let page = 1000

    /// The finished jobs of the cluster `configuration` names that ended `statuses` (nil: any) at `since` or later,
    /// newest first. Throws ClusterUnavailable when the database cannot be used or does not answer by `deadline`
    /// seconds; a job whose result cannot be read keeps its status and time, without a duration.
    public static func entries(configuration: Configuration, statuses: Set<String>?, since: Double?,
                               deadline: Double = 10) throws(ClusterUnavailable) -> [OutboxEntry] {
        guard let settings = configuration.cluster else { throw ClusterUnavailable("no cluster dictionary in the configuration") }
        let store: PostgresClusterStore
        do {
            let url = try DatabaseURL(settings.database, passwordFile: settings.passwordFile)
            store = try PostgresClusterStore(url: url, abandonAfter: deadline)
        } catch {
            throw ClusterUnavailable("cluster.database: \(error)")
        }
        let outcome = Outcome()
        let done = DispatchSemaphore(value: 0)
        let runner = Task { await store.run() }
        let reader = Task {
            do { outcome.set(.success(try await read(store, statuses: statuses, since: since))) }
            catch { outcome.set(.failure(ClusterUnavailable("the cluster's database: \(error)"))) }
            done.signal()
        }
        defer { reader.cancel(); runner.cancel() }
        guard done.wait(timeout: .now() + deadline) == .success, let result = outcome.value else {
            throw ClusterUnavailable("the cluster's database did not answer within \(Int(deadline)) s")
        }
        return try result.get()
    }

    static func read(_ store: PostgresClusterStore, statuses: Set<String>?, since: Double?) async throws -> [OutboxEntry] {
        var entries: [OutboxEntry] = []
        var cursor: HistoryCursor?
        repeat {
            let (jobs, next) = try await store.finishedJobs(before: cursor, since: since, limit: page)
            for job in jobs where statuses?.contains(job.status) != false {
                entries.append(OutboxEntry(name: job.id, job: job.id, status: job.status, node: job.node,
                                           finishedAt: job.finishedAt, durationSeconds: job.result.flatMap(duration)))
            }
            cursor = next
        } while cursor != nil
        return entries
    }

    /// result.plist's durationSeconds, read without decoding the rest of it.
    static func duration(_ result: [UInt8]) -> Double? {
        var offset = 0
        let top = try? PlistTopLevel.read(keys: ["durationSeconds"]) { buffer in
            let n = min(buffer.count, result.count - offset)
            result.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress! + offset, byteCount: n) }
            offset += n
            return n
        }
        return top?["durationSeconds"]?.real
    }

    /// The reader's answer, handed from its task to the waiting thread.
    final class Outcome: Sendable {
        private let stored = Mutex<Result<[OutboxEntry], ClusterUnavailable>?>(nil)
        var value: Result<[OutboxEntry], ClusterUnavailable>? { stored.withLock { $0 } }
        func set(_ value: Result<[OutboxEntry], ClusterUnavailable>) { stored.withLock { $0 = value } }
    }
}
