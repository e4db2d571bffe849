// JobStore: everything the node does to durable job state — the one boundary between the shell (Shell/, which runs
// jobs on the engine) and the store that decides which jobs this node runs and keeps their files.
//
// Two stores: the file spool alone (`SpoolJobStore`: a manifest claimed from this node's inbox runs here at once, its
// end is this node's to publish) and the cluster (`ClusterJobStore`, SPEC §8: a manifest claimed from the inbox is
// set aside, validated and inserted into PostgreSQL, then its local copy dropped; the jobs this node runs are claimed
// from the database, under a lease and a fencing token, and an end is published only if the fenced completion was
// recorded). What differs is stated once as `capabilities`; the shell never asks which store it has.
//
// In both, a job this node runs lives in this node's spool, active/<job>/ (manifest, progress, outputs), exactly as
// without a cluster (SpoolBacked.swift), so recovery, downloads, commands and publication stay one code path. The
// spool is each store's private part: the shell reaches a job's files only through the methods below.
//
// Threads: the shell calls a store from its serial `work` queue only (the group commit and `ending` from its
// committer, the gate from its recorder); `complete` may block for one round trip. A store calls its delegate from any thread;
// the shell hops onto `work` itself.

import ClusterStore
import Foundation
import SystemCalls
import JobModel
import Logging
import OperationEngine

/// What the shell tells the store about a job that ended (the publication gate).
public struct JobEnd: Sendable, Equatable {
    public var job: String
    /// succeeded, failed, cancelled or rejected (SPEC §5).
    public var status: String
    /// The staged result.plist (SPEC §5), for a store that keeps it (the cluster, for keepFinishedDays).
    public var resultFile: String
    /// Its bytes, when the shell kept them as it wrote the file (then the store does not read it back).
    public var result: [UInt8]?

    public init(job: String, status: String, resultFile: String, result: [UInt8]? = nil) {
        self.job = job
        self.status = status
        self.resultFile = resultFile
        self.result = result
    }
}

/// Where a job came from, for the journal (`claimed`, OPQ_FROM_NODE) and result.plist (`node`, `submittedOn`).
public struct JobOrigin: Sendable, Equatable {
    /// The node that accepted the manifest from its inbox.
    public var submittedOn: String
    /// Set when the job was taken over from a lost node.
    public var fromNode: String?

    public init(submittedOn: String, fromNode: String? = nil) {
        self.submittedOn = submittedOn
        self.fromNode = fromNode
    }
}

/// The store's calls into the shell. Each may come from any thread.
public protocol JobStoreDelegate: AnyObject, Sendable {
    /// Jobs claimed for this node, already written to active/<id>/ (manifest and origin): run them.
    func run(_ jobs: [ClaimedJob])
    /// Jobs this node no longer holds (taken over, or its lease ran out): stop them now, publish and record
    /// nothing for them, log `lost`, remove them from active/.
    func lost(_ jobs: [String], reason: String)
    /// Jobs this node holds that the store has no record of at all (its database restored from a backup older than
    /// them): stop them now, publish nothing, log `lost`, and give their folders back to the store (`submit`) once
    /// nothing runs in them, to run again — dropped, they would run nowhere.
    func forgotten(_ jobs: [String], reason: String)
    /// A cancel asked on any node for a job this node runs (nil operation: the whole job). May repeat.
    func cancel(job: String, operation: String?)
    /// The cluster-wide suspended set changed (SPEC §8: kept in the database, acting on every node).
    func suspendedQueuesChanged(_ queues: Set<String>)
    /// A claimed job could not be written to the spool (disk full, no descriptor left, read-only): the store has
    /// handed it back and claims nothing more until `want(room:)` is called again. Claiming pauses as for any spool
    /// fault, and room is offered again once the spool works.
    func spoolFailed(_ what: String, _ error: any Error)
    /// Whether the shell still holds a job of this id (one rejected here at submission may be ending under it, its
    /// folder already out of active/): a row claimed under that id is handed back, to be claimed once it is free.
    func holds(job: String) -> Bool
    /// How long the spool has kept a step waiting, in seconds (0: none waits): a file system that hangs answers
    /// no error. A store that leases jobs stops renewing past a bound, so that they run elsewhere (SpoolWatch).
    func spoolStalledSeconds() -> Double
    /// What this node's heartbeat says of the jobs it runs, for `show` on other nodes (ClusterProgress); nil: nothing.
    func progress() -> [UInt8]?
    /// Manifests from this node's inbox that now have their job ids (a cluster's: once inserted), by inbox name, for
    /// `opqueuectl submit` to print the id a job got.
    func submitted(_ ids: [(manifest: String, inode: UInt64?, job: String)])
}

extension JobStoreDelegate {
    public func progress() -> [UInt8]? { nil }
    public func submitted(_ ids: [(manifest: String, inode: UInt64?, job: String)]) {}
    public func forgotten(_ jobs: [String], reason: String) { lost(jobs, reason: reason) }
}

public protocol JobStore: AnyObject, Sendable {
    /// This node's name (SPEC §8 `cluster.node`); nil without a cluster (no OPQ_NODE, no `node` in results).
    var node: String? { get }
    /// What this store does beyond the file spool's minimum: the shell asks these, never which store it is.
    var capabilities: StoreCapabilities { get }
    /// False while manifests from the inbox cannot be validated yet (a cluster node that has not yet read what the
    /// cluster declares), or while the store already holds as many submissions as it takes at once: they wait in
    /// the inbox.
    var acceptsSubmissions: Bool { get }
    /// Manifests taken from this node's inbox that the store has not yet made jobs of (the cluster: set aside in
    /// active/.submissions until their insert commits — all of them while the database is down). To the user they
    /// still wait in the inbox: `status`'s waiting and `opqueued_inbox_files` count them.
    var awaitingSubmission: Int { get }
    /// When the oldest of those was taken from the inbox (seconds since the epoch); nil when none waits.
    var awaitingSubmissionSince: Double? { get }
    /// The cluster as this node last read it (status, metrics); nil for a store with no cluster.
    func snapshot() -> ClusterSnapshot?
    /// A job the store knows that this node does not run (`show` of another node's job); nil when it knows none of
    /// that id. Throws when it cannot be asked now.
    func job(_ id: String) throws -> JobRecord?
    /// The slots of `clusterMaxConcurrentOperationCount` for `engine`, running on the store's own executor; nil for a
    /// store with no cluster-wide limits.
    func startSlots(engine: Engine, logger: Logger) -> (permits: ClusterPermits, task: Task<Void, Never>)?
    /// The start grants of `clusterRateLimit` for `engine`, likewise; nil for a store with no cluster.
    func startRates(engine: Engine, logger: Logger) -> (rates: ClusterRates, task: Task<Void, Never>)?
    /// At a graceful stop, first: claims nothing more.
    func stopClaiming()
    /// Then: gives back those of `jobs` (none of whose operations started) that another node may run now; returns
    /// them. The file spool gives back nothing: they resume at the next start.
    func handBack(_ jobs: [String]) -> Set<String>
    /// The configuration a manifest from this node's inbox is validated against: the local one, or (cluster) the
    /// local one widened to every queue and command some node of the cluster declares.
    func submissionConfiguration(_ local: Configuration) -> Configuration
    /// The same, read afresh (a cluster asks the database what is declared now, bounded); nil when the store keeps
    /// nothing to read again, or cannot now. Asked once before a manifest is rejected for what it names.
    func freshSubmissionConfiguration(_ local: Configuration) -> Configuration?
    var delegate: (any JobStoreDelegate)? { get set }

    /// At start, before anything runs: the jobs found in active/ by `Spool.recover`. Returns those this node
    /// still holds (to resume); the others were submissions not yet known committed (a cluster store submits them
    /// again, idempotently) or jobs lost meanwhile (removed, logged `lost`).
    func recovered(_ jobs: [ClaimedJob]) -> [ClaimedJob]

    /// Manifests just claimed from this node's inbox into active/<id>/ and parsed without a problem. The file
    /// spool returns them all: they run here, now. The cluster inserts them (one transaction), drops their local
    /// copies once that committed, and returns none: they come back through `delegate.run` wherever claimed.
    /// Jobs it could not insert yet (database down) stay in active/ and are retried; nothing is lost.
    func submit(_ jobs: [ClaimedJob]) -> [ClaimedJob]

    /// The shell can run `room` more jobs now, whose manifests may hold `manifestBytes` in all (its operation
    /// budget at the fewest bytes an operation takes): a cluster store claims up to that many (answering by
    /// `delegate.run`), past the budget only the first; the file spool does nothing (the shell claims from the
    /// inbox itself).
    func want(room: Int, manifestBytes: Int)

    /// These jobs ran to their ends here; `complete` will record them later (the shell gathers ends for a while): a
    /// cluster store lets each one's job slot go to a new job now, its lease still covering it. Any thread.
    func ending(_ jobs: [String])

    /// The publication gate, for one batch: returns the jobs this node may publish (the file spool: all). A
    /// store that records ends does so under their fences in one statement; a job missing from the answer is not
    /// this node's to publish, and one taken from it (a newer fence) is also handed to `delegate.lost`. Throws
    /// when the answer is unknown (database down): the batch waits and is offered again.
    func complete(_ ends: [JobEnd]) throws -> Set<String>

    /// Where the job came from (nil without a cluster).
    func origin(of job: String) -> JobOrigin?

    /// `cancel` for a job that is not running here: the cluster records it for the node that runs it.
    func requestCancel(job: String, operation: String?) -> StoreCancelOutcome

    /// A cancel made here, of a job this node runs: a store whose jobs another node may take over records it where
    /// that node reads it (with its claim), so that a takeover makes it again. Nil when recorded, or nothing is to be
    /// (the file spool); else why not (a cluster tries again at its next control rounds).
    func shareCancel(job: String, operation: String?) -> String?

    /// `suspend`/`resume` asked by a client: the cluster keeps it in the database (every node follows through
    /// `delegate.suspendedQueuesChanged`); the file spool only acts locally (returns false).
    func setSuspended(_ queue: String, _ suspended: Bool) -> Bool

    /// The configuration was reloaded (SIGHUP): a cluster store declares the node's queues and commands again.
    func reload(_ configuration: Configuration)

    /// Stops the store's loops (SIGTERM); held jobs stay held until the lease runs out or they are re-claimed
    /// by this node at its next start.
    func shutdown()

    // MARK: This node's jobs on disk
    // What the node does to the durable state of the jobs it holds. Both stores keep them in this node's spool
    // (SPEC §2): the file spool as its truth, a cluster as its local copy of what the database holds.

    /// The spool's folders: where a running job's files live, and the node's own records beside them.
    var folders: SpoolFolders { get }
    /// Where ended jobs are published now: the spool's outbox, or (a cluster) `cluster.sharedOutbox` as last loaded.
    var outbox: OutboxPlace { get }
    /// At start, before anything runs: what was half done is cleaned up; the jobs found (each read with `heldJob`)
    /// and the problems met.
    func recoverHeld() throws -> (held: Spool.Held, problems: [String])
    /// A job this node holds, its manifest read from its folder.
    func heldJob(_ id: String) -> Result<ClaimedJob, SpoolError>
    /// One pass over this node's inbox.
    func scanInbox(limit: Int) throws -> Spool.InboxScan
    /// How long ago an inbox file last changed, and when (nil: gone).
    func inboxAge(of name: String, now: Double) -> Double?
    func inboxChangeTime(of name: String) -> Double?
    /// Why no read lease could be taken on the inbox's files, once it has been met (then `settled` decides).
    var leaseRefused: String? { get }
    /// Claims one inbox file. The file spool makes a job of it to run here; a store that places jobs sets it aside
    /// for `submit`. Durable at the next `commit`.
    func claim(_ name: String, now: Double, settled: Bool, inUse: (String) -> Bool) throws -> Spool.ClaimOutcome
    /// A manifest claimed for submission that is rejected: made a job of this node, to be published here.
    func keepHere(_ job: ClaimedJob, inUse: (String) -> Bool) throws -> Spool.ClaimOutcome
    /// Records that operations succeeded, in order (durable at the next `commit`).
    func recordSuccesses(_ successes: [OperationSuccess]) throws
    /// Records that a job this node runs (`operation` nil), or one of its operations, was cancelled by request, to be
    /// cancelled again if the job resumes after a restart (durable at the next `commit`).
    func recordCancel(job: String, operation: String?, at: Double) throws
    /// Rewrites the progress record with only `active`'s lines, once it has grown large.
    func compactProgressIfLarge(active: Set<String>) throws
    /// Makes everything written so far durable (the group commit).
    func commit() throws
    /// A file the shell wrote in the spool (not through the store) that the next `commit` must make durable.
    func commitWithNext(file path: String)
    /// Writes a job's result.plist in its folder (`produce` hands its bytes to the sink).
    func stage(job: String, produce: ((UnsafeRawBufferPointer) throws -> Void) throws -> Void) throws
    /// Where `stage` wrote it.
    func stagedResult(job: String) -> String
    /// Whether the job's folder is there (someone may remove it under a running job).
    func hasFolder(job: String) -> Bool
    /// Makes a removed job folder again, with its manifest.
    func restoreFolder(job: String, manifest: Data) throws
    /// Publishes a staged job in `outbox`: the folder it went to and the entry's name there (the id, or <id>.N when
    /// that name was taken meanwhile).
    func place(job: String, inUse: (String) -> Bool) throws -> (folder: String, name: String)
    /// Removes a job's folder (a job lost, or cancelled before it ran).
    func discard(job: String)
    /// Removes what a job's downloads left.
    func discardDownloads(job: String)
    /// After a fault: makes the spool's folders again where they went; the ones made.
    func probe() throws -> [String]
}

/// The spool's folders (SPEC §2), as paths.
public struct SpoolFolders: Sendable {
    public let root: String, inbox: String, active: String, outbox: String, tmp: String
    /// A job's folder while it runs: its manifest, outputs and result.plist.
    public func job(_ id: String) -> String { active + "/" + id }
    /// Where a job's downloads are written (Downloads.swift).
    public func downloads(_ id: String) -> String { active + "/.downloads/" + id }
}

/// Where ended jobs are published: the folder, and the one on the same file system their removal goes through.
public struct OutboxPlace: Sendable, Equatable {
    public let folder: String, tmp: String
}

/// What a store does beyond the file spool alone (which has none of these), stated once by each store.
public struct StoreCapabilities: OptionSet, Sendable {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }

    /// Manifests from this node's inbox are handed to the store (`submit`), whatever the room here, and jobs reach
    /// this node only through `delegate.run` when it offers room (`want`). Without it, a manifest claimed from the
    /// inbox runs here at once, so the inbox is read only while there is room, and a cancel of a job claimed but not
    /// yet read is kept here until it is.
    public static let placesJobs = StoreCapabilities(rawValue: 1 << 0)
    /// Jobs are held under a lease that runs out: the store must hear when the spool hangs (SpoolWatch), and says
    /// at start which of the jobs found in active/ this node still holds (`recovered`; without leases, all).
    public static let leasesJobs = StoreCapabilities(rawValue: 1 << 1)
    /// Queue suspensions are kept in the store: nothing starts until it has said which queues are suspended.
    public static let keepsSuspensions = StoreCapabilities(rawValue: 1 << 2)
    /// Delayed jobs wait in the store: the node keeps its few in memory and parks none in active/.delayed.
    public static let keepsDelayedJobs = StoreCapabilities(rawValue: 1 << 3)
    /// Ends are recorded in the store under fences, so the publication gate may refuse one; the store keeps the
    /// results (the shell hands it their bytes). Without it every end is this node's to publish at once.
    public static let recordsEnds = StoreCapabilities(rawValue: 1 << 4)
}

public enum StoreCancelOutcome: Sendable, Equatable {
    case requested
    case unknownJob
    /// The job has no operation of that id (a cluster job not on this node: read from its manifest).
    case unknownOperation
    case alreadyEnded
    /// The store cannot answer now (database down).
    case unavailable(String)
}

extension JobStore {
    /// Records that one operation succeeded (durable at the next `commit`).
    func recordSuccess(job: String, operation: String, record: DoneRecord) throws {
        try recordSuccesses([OperationSuccess(job: job, operation: operation, record: record)])
    }

    public func shareCancel(job: String, operation: String?) -> String? { nil }
    public func snapshot() -> ClusterSnapshot? { nil }
    public func job(_ id: String) throws -> JobRecord? { nil }
    public func startSlots(engine: Engine, logger: Logger) -> (permits: ClusterPermits, task: Task<Void, Never>)? { nil }
    public func startRates(engine: Engine, logger: Logger) -> (rates: ClusterRates, task: Task<Void, Never>)? { nil }
    public func stopClaiming() {}
    public func handBack(_ jobs: [String]) -> Set<String> { [] }
    public func freshSubmissionConfiguration(_ local: Configuration) -> Configuration? { nil }
    public var awaitingSubmission: Int { 0 }
    public var awaitingSubmissionSince: Double? { nil }
}
