// SpoolJobStore: the file spool alone as the JobStore (no cluster) — a manifest claimed from this node's inbox
// runs here at once, and every end is this node's to publish. It holds no state of its own: the spool's folders
// are the truth (a job that is not running here has ended if its outbox entry exists, else is unknown).
//
// Trusts: the spool's outbox to hold the entries of ended jobs.

import Foundation
import JobModel

public final class SpoolJobStore: SpoolBacked, @unchecked Sendable {
    public let spool: Spool
    /// Never called: this store neither claims for the shell nor takes jobs away.
    public weak var delegate: (any JobStoreDelegate)?

    public init(spool: Spool) { self.spool = spool }

    public var node: String? { nil }
    public var capabilities: StoreCapabilities { [] }
    public func submissionConfiguration(_ local: Configuration) -> Configuration { local }
    public func recovered(_ jobs: [ClaimedJob]) -> [ClaimedJob] { jobs }
    public func submit(_ jobs: [ClaimedJob]) -> [ClaimedJob] { jobs }
    public func want(room: Int, manifestBytes: Int) {}
    public func ending(_ jobs: [String]) {}
    public func complete(_ ends: [JobEnd]) throws -> Set<String> { Set(ends.map(\.job)) }
    public func origin(of job: String) -> JobOrigin? { nil }

    /// A job this node does not run has ended if the outbox has its entry, under whatever name (`Outbox.find`).
    public func requestCancel(job: String, operation: String?) -> StoreCancelOutcome {
        access(spool.outbox + "/" + job, F_OK) == 0 || Outbox.find(job, in: spool.outbox) != nil ? .alreadyEnded : .unknownJob
    }

    public func setSuspended(_ queue: String, _ suspended: Bool) -> Bool { false }
    public var acceptsSubmissions: Bool { true }
    public func reload(_ configuration: Configuration) {}
    public func shutdown() {}
}
