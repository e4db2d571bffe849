// Cancels this node makes of the jobs it runs, recorded in the database as a cancel asked of another node is: a node
// that takes the job over (its lease run out) gets them with its claim and makes them before anything starts.

import ClusterStore
import Foundation

extension ClusterJobStore {
    public func shareCancel(job: String, operation: String?) -> String? {
        // Made here already: the control round does not pass it back to the shell.
        lock.withLock { if state.held[job] != nil { state.claimedWithCancels(job, [operation]) } }
        do {
            try insertCancel(job: job, operation: operation, wait: controlWait)
            return nil
        } catch {
            lock.withLock { pendingCancelShares.append((job, operation)) }
            return "\(error)"
        }
    }

    /// The control round's part: the cancels `shareCancel` could not record, oldest first (a job ended meanwhile
    /// records nothing).
    func sharePendingCancels() throws {
        while let next = lock.withLock({ pendingCancelShares.first }) {
            try insertCancel(job: next.job, operation: next.operation, wait: Self.statementTimeout)
            lock.withLock { _ = pendingCancelShares.removeFirst() }
        }
    }

    private func insertCancel(job: String, operation: String?, wait: Double) throws {
        _ = try waitBounded(wait, on: executor, doing: "recording the cancel of job \(job)", { [store] in
            try await store.requestCancel(job: job, operation: operation, notAfter: .infinity)
        })
    }
}
