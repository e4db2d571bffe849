// What both stores do to the jobs this node holds, in one place: each keeps them in this node's spool (the file
// spool as its truth, a cluster as its local copy), so the JobStore's "jobs on disk" methods are the spool's.
// A store states only where it differs (the cluster: claims set aside for submission, publication under
// sharedOutbox).

import Foundation
import JobModel
import SystemCalls

public protocol SpoolBacked: JobStore {
    /// This node's spool: the store's private detail, never the shell's.
    var spool: Spool { get }
}

extension SpoolBacked {
    public var folders: SpoolFolders { spool.folders }
    public var outbox: OutboxPlace { OutboxPlace(folder: spool.outbox, tmp: spool.tmp) }
    public func recoverHeld() throws -> (held: Spool.Held, problems: [String]) { try spool.recoverHeld() }
    public func heldJob(_ id: String) -> Result<ClaimedJob, SpoolError> { spool.heldJob(id) }
    public func scanInbox(limit: Int) throws -> Spool.InboxScan { try spool.scanInbox(limit: limit) }
    public func inboxAge(of name: String, now: Double) -> Double? { spool.age(of: name, now: now) }
    public func inboxChangeTime(of name: String) -> Double? { spool.changeTime(of: name) }
    public var leaseRefused: String? { spool.leaseRefused }

    public func claim(_ name: String, now: Double, settled: Bool, inUse: (String) -> Bool) throws -> Spool.ClaimOutcome {
        try spool.claim(name, now: now, settled: settled, inUse: inUse)
    }

    public func keepHere(_ job: ClaimedJob, inUse: (String) -> Bool) throws -> Spool.ClaimOutcome { .claimed(job) }

    public func recordSuccesses(_ successes: [OperationSuccess]) throws { try spool.recordSuccesses(successes) }

    public func recordCancel(job: String, operation: String?, at: Double) throws {
        try spool.recordCancel(job: job, record: Spool.CancelRecord(operation: operation, at: at))
    }

    public func compactProgressIfLarge(active: Set<String>) throws { try spool.compactProgressIfLarge(active: active) }
    public func commit() throws { try spool.commit() }
    public func commitWithNext(file path: String) { spool.sync.file(path) }

    public func stage(job: String, produce: ((UnsafeRawBufferPointer) throws -> Void) throws -> Void) throws {
        try spool.stage(job: job, produce: produce)
    }

    public func stagedResult(job: String) -> String { spool.stagedResult(job: job) }
    public func hasFolder(job: String) -> Bool { spool.hasFolder(job: job) }
    public func restoreFolder(job: String, manifest: Data) throws { try spool.restoreFolder(job: job, manifest: manifest) }
    public func place(job: String, inUse: (String) -> Bool) throws -> (folder: String, name: String) {
        (spool.outbox, try spool.place(job: job, inUse: inUse))
    }
    public func discard(job: String) { spool.discard(job: job) }
    public func discardDownloads(job: String) { spool.discardDownloads(job: job) }
    public func probe() throws -> [String] { try spool.probe() }
}
