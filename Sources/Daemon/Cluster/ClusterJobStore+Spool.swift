// Where the cluster's local copy of its jobs differs from the file spool's (SpoolBacked): a manifest claimed from the
// inbox is set aside in active/.submissions for `submit`, not made a job here; and ended jobs are published under
// `cluster.sharedOutbox` when it is set (SPEC §8), read afresh after each reload.

import Foundation
import JobModel

extension ClusterJobStore {
    public var outbox: OutboxPlace {
        guard let shared = lock.withLock({ configuration.cluster?.sharedOutbox }) else {
            return OutboxPlace(folder: spool.outbox, tmp: spool.tmp)
        }
        // Removed through its own .tmp/: the spool's tmp/ is another file system.
        return OutboxPlace(folder: shared, tmp: shared + "/.tmp")
    }

    public func claim(_ name: String, now: Double, settled: Bool, inUse: (String) -> Bool) throws -> Spool.ClaimOutcome {
        try spool.claimForSubmission(name, now: now, settled: settled)
    }

    public func keepHere(_ job: ClaimedJob, inUse: (String) -> Bool) throws -> Spool.ClaimOutcome {
        try spool.promoteSubmission(job, inUse: inUse)
    }

    public func place(job: String, inUse: (String) -> Bool) throws -> (folder: String, name: String) {
        guard let shared = lock.withLock({ configuration.cluster?.sharedOutbox }) else {
            return (spool.outbox, try spool.place(job: job, inUse: inUse))
        }
        // Assembled under sharedOutbox/.tmp/ and renamed into place there.
        return (shared, try spool.placeShared(job: job, in: shared))
    }
}
