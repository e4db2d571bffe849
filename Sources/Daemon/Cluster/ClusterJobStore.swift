// ClusterJobStore: the JobStore of a node in a cluster (SPEC §8), over a ClusterStore (PostgreSQL).
//
// Threads: one loop thread ("opqueued-cluster") does every routine round trip in turn — connect (migrate,
// register), heartbeat and takeover, submissions, claims, cancels and suspensions, pruning — so that a beat's
// answer never crosses a claim; a second thread checks the lease deadline every 50 ms whatever the loop is waiting
// for (a hung statement, a freeze); a third ("opqueued-cluster-status") reads what `status` shows and what the
// cluster declares, every leaseSeconds/3 and at once when a node registers, off the path of claims and
// submissions; a task turns LISTEN wake-ups into flags for the loop. The
// shell's calls (`complete`, `job`, `requestCancel`, `setSuspended`, `acquireSlot`) wait for one round trip of
// their own, each bounded. All state is under one lock, as ClusterNodeState (pure, tested on its own).
//
// What it trusts: nothing a row holds. An id that is not a valid job id is recorded `rejected` and never touches
// the spool; a manifest is validated again by the shell against the local configuration; a signature that does
// not decode widens nothing. The password never reaches a log line: errors come from ClusterStoreError.

import ClusterStore
import DequeModule
import Foundation
import Logging
import OperationEngine

#if canImport(Glibc)
import Glibc
#endif

public final class ClusterJobStore: JobStore, @unchecked Sendable {
    public let node: String?
    public var inboxRunsHere: Bool { false }
    public var delegate: (any JobStoreDelegate)? {
        get { lock.withLock { _delegate } }
        set { lock.withLock { _delegate = newValue } }
    }

    let settings: ClusterSettings
    let nodeName: String
    let spool: Spool
    let store: any ClusterStore
    let logger: Logger
    let onLeaseDeadline: @Sendable (Double?) -> Void
    /// A row whose manifest is bigger is rejected without being read (ManifestLimits.maxBytes; less in tests).
    let maxManifestBytes: Int

    /// Everything below is guarded by `lock`. Each thread of the store has its wake-up: the loop, the status
    /// reader, the submitter.
    private let lock = NSLock()
    private let loopWake = ThreadSignal()
    private let statusWake = ThreadSignal()
    private let submitWake = ThreadSignal()
    private let pruneWake = ThreadSignal()
    private weak var _delegate: (any JobStoreDelegate)?
    private var configuration: Configuration
    private var state: ClusterNodeState
    private var origins: [String: ClusterOrigin] = [:]
    private var room = 0
    /// The bytes the manifests of the next claim may hold (the shell's operation budget): past it, rows come back
    /// without their manifest and are handed back.
    private var manifestBudget = Int.max
    private var started = false
    private var stopped = false
    private var claimWanted = true
    /// Set at a graceful stop (`stopClaiming`): no claim round starts any more.
    private var claimsStopped = false
    /// A claim round is under way: from its decision to claim until its jobs are with the shell; `claimEnded` is
    /// signalled when it is over.
    private var claimInFlight = false
    private let claimEnded = ThreadSignal()
    /// Cancelled jobs claimed for this node by `requestCancel`, taken in by the loop's next claim round.
    private var cancelledClaims: [ClusterClaimedJob] = []
    private var controlWanted = true
    /// Suspensions and resumptions asked while the database could not record them: written at the next control
    /// round that reaches it (then every node follows), newest per queue.
    private var pendingSuspensions: [String: Bool] = [:]
    private var registerWanted = false
    /// Submissions set aside, not yet inserted (their folder under active/.submissions, key and row), oldest first:
    /// appended by the shell's calls, taken by the submission thread from the front.
    private var pending = Deque<(folder: String, isFile: Bool, key: String, job: NewJob)>()
    /// Manifest files of this node's submissions, inserted and not yet removed, by job id: a row of them this
    /// node claims before the reaper gets to it (`reapDelay` after the insert, or at shutdown) has its file renamed
    /// into active/<job>/ rather than written again. Whoever takes the entry out owns the file.
    private var adoptable: [String: String] = [:]
    /// Folders in active/ without any claim record that recovery could not look up (the database did not answer at
    /// start): left where they are until the submission thread can (`verifyUnrecorded`).
    private var unverified: [ClaimedJob] = []
    private var slotReleases: [SlotLease] = []
    /// Slots dropped at the lease deadline, released (fence-checked) once the database's lease on them would have
    /// run out too: a node that renews before the takeover sees them keeps its name on them otherwise.
    private var droppedSlots: [(lease: SlotLease, due: Double)] = []
    private var jobReleases: [String: Int64] = [:]
    private var lastError: String?
    private var declared: (queues: Set<String>, commands: Set<String>, commandSignatures: [String: String]) = ([], [], [:])
    /// What the cluster declares has been read once: manifests from the inbox can be validated (until then they wait).
    private var declaredKnown = false
    private var snapshotValue: ClusterSnapshot
    private var reportedDeadline: Double??
    /// clusterMaxConcurrentOperationCount's slots, held for the engine (see `attach(permits:)`).
    private var permits: ClusterPermits?
    private var runner: Task<Void, Never>?
    /// The loop has connected (migrated, registered, freed what an earlier process of the node held) once: before,
    /// the status thread has nothing to read.
    private var hasConnected = false
    /// Whether wake-ups reach this node (driven by the status thread and the listener).
    private var probe = WakeupProbe()
    private var listener: Task<Void, Never>?
    private let finished = DispatchGroup()
    let executor = ClusterExecutor(label: "opqueued-cluster-executor")
    /// Removes the local copies of submissions the database holds.
    private let reaper = DispatchQueue(label: "opqueued-cluster-reaper", qos: .utility)

    /// Statements of the loop and of the shell's calls wait at most this long.
    public static let statementTimeout = 5.0
    static let pollSeconds = 1.0
    static let pruneEverySeconds = 3600.0
    static let pruneBatch = 500
    /// A node silent this many days (or keepFinishedDays, if more) and holding nothing is forgotten: never a node
    /// that is merely down for a while, whatever keepFinishedDays says.
    static let forgetNodesAfterDaysAtLeast = 1.0
    /// Submissions held in memory at most: past it, manifests wait in the inbox (a flood of a million is not
    /// read into memory ahead of the inserts; with the database down, the inbox is where they wait).
    static let pendingLimit = 4096
    /// How long an inserted submission's file stays for this node to claim it without writing it again.
    static let reapDelay = 1.0
    /// Claimed jobs go to the shell by this many as they are written into active/, not all at the end of a claim.
    static let handOverChunk = 16

    /// Builds the node's store; nothing is connected until `start`. Throws when the URL or the password file is
    /// unusable (a configuration error: the node does not start).
    public convenience init(configuration: Configuration, spool: Spool, logger: Logger,
                            onLeaseDeadline: @escaping @Sendable (Double?) -> Void = { _ in },
                            maxManifestBytes: Int = ManifestLimits.maxBytes) throws {
        guard let settings = configuration.cluster else { throw ClusterUnavailable("no cluster dictionary in the configuration") }
        let url = try DatabaseURL(settings.database, passwordFile: settings.passwordFile)
        if let exposure = url.passwordFileExposure() { logger.warning("\(exposure)", metadata: ["OPQ_EVENT": "cluster"]) }
        let store = try PostgresClusterStore(url: url)
        self.init(configuration: configuration, spool: spool, logger: logger, store: store,
                  run: { await store.run() }, onLeaseDeadline: onLeaseDeadline, maxManifestBytes: maxManifestBytes)
    }

    /// `run` keeps the store's connections (for PostgresClusterStore, its `run()`); cancelled at shutdown.
    public init(configuration: Configuration, spool: Spool, logger: Logger, store: any ClusterStore,
                run: @escaping @Sendable () async -> Void, onLeaseDeadline: @escaping @Sendable (Double?) -> Void = { _ in },
                maxManifestBytes: Int = ManifestLimits.maxBytes) {
        self.maxManifestBytes = maxManifestBytes
        let settings = configuration.cluster ?? ClusterSettings(database: "", passwordFile: nil, node: "node", jobSlots: configuration.maxActiveJobs,
                                                                 leaseSeconds: ClusterSettings.defaultLeaseSeconds, sharedOutbox: nil,
                                                                 keepFinishedDays: ClusterSettings.defaultKeepFinishedDays)
        self.settings = settings
        self.nodeName = settings.node
        self.node = settings.node
        self.spool = spool
        self.store = store
        self.logger = logger
        self.onLeaseDeadline = onLeaseDeadline
        self.configuration = configuration
        self.state = ClusterNodeState(leaseSeconds: settings.leaseSeconds)
        self.snapshotValue = ClusterSnapshot(node: settings.node, connected: false, lastError: nil, nodes: [], unrunnable: [], queues: [:], refreshedAt: nil)
        runner = Task(executorPreference: executor) { await run() }
        let wakeups = store.wakeups
        listener = Task(executorPreference: executor) { [weak self] in
            for await wakeup in wakeups {
                guard let self else { return }
                self.heard(wakeup)
            }
        }
        spawn("opqueued-cluster") { $0.loop() }
        spawn("opqueued-lease") { $0.watchDeadline() }
        spawn("opqueued-cluster-status") { $0.statusLoop() }
        spawn("opqueued-cluster-submit") { $0.submitLoop() }
        spawn("opqueued-cluster-prune") { $0.pruneLoop() }
    }

    /// A thread of the store's own, waited for at shutdown (`finished`).
    private func spawn(_ name: String, _ body: @escaping @Sendable (ClusterJobStore) -> Void) {
        finished.enter()
        let thread = Thread { [self] in
            body(self)
            finished.leave()
        }
        thread.name = name
        thread.start()
    }

    // MARK: JobStore

    public var acceptsSubmissions: Bool { lock.withLock { declaredKnown && pending.count < Self.pendingLimit } }

    public var awaitingSubmission: Int { lock.withLock { pending.count } }

    public func submissionConfiguration(_ local: Configuration) -> Configuration {
        let d = lock.withLock { declared }
        return local.widened(queues: d.queues, commands: d.commands, signatures: d.commandSignatures)
    }

    /// What the cluster declares, read now (at most a second): a node that registered since the status thread's
    /// last look is known before a manifest naming its queue is rejected here.
    public func freshSubmissionConfiguration(_ local: Configuration) -> Configuration? {
        guard let declared = try? waitBounded(1.0, on: executor, doing: "reading what nodes declare", { [store] in try await store.declared() }) else {
            return nil
        }
        lock.withLock {
            self.declared = declared
            declaredKnown = true
        }
        return local.widened(queues: declared.queues, commands: declared.commands, signatures: declared.commandSignatures)
    }

    public func recovered(_ jobs: [ClaimedJob]) -> [ClaimedJob] {
        var resume: [ClaimedJob] = []
        var candidates: [(ClaimedJob, ClusterOrigin)] = []
        var resubmit: [ClaimedJob] = []
        var orphaned: [String] = []
        var unverified: [ClaimedJob] = []
        // Whether the database answers the lookups of folders without a record (`recognised`): after one that it
        // did not, none is tried again (each would wait out its timeout, and the node is to start without it).
        var answering = true
        for job in jobs {
            let record = spool.readClaimRecord(spool.active + "/" + job.id)
            if let origin = record?.origin {
                candidates.append((job, origin))
            } else if record?.claimedFromCluster == true {
                // Claimed from the cluster, its origin (fence) unreadable: it cannot be resumed under any lease;
                // the database gives it to a node again. Never submitted again as if from the inbox.
                orphaned.append(job.id)
            } else if record == nil {
                if let recognised = recognised(job, answering: &answering) {
                    candidates.append(recognised)
                } else if answering {
                    resubmit.append(job)
                } else {
                    unverified.append(job)
                }
            } else {
                resubmit.append(job)
            }
        }
        if !unverified.isEmpty {
            let unverified = unverified
            lock.withLock { self.unverified = unverified }
        }
        // Which the database still gives this node, under the same fence (one beat); a job whose end was recorded
        // under its fence before the restart is published without recording again.
        var kept = candidates
        var lost: [String] = orphaned
        var recorded: Set<String> = []
        let sentAt = monotonicSeconds()
        if !candidates.isEmpty, let beat = try? waitBounded(Self.statementTimeout, on: executor, doing: "renewing the lease of node \(nodeName)", { [store, nodeName] in
            try await store.heartbeat(node: nodeName)
        }), beat.registered {
            kept = []
            for (job, origin) in candidates {
                if beat.held[job.id] == origin.fence { kept.append((job, origin)); continue }
                let record = try? waitBounded(Self.statementTimeout, on: executor, doing: "looking up job \(job.id)", { [store] in try await store.job(job.id) })
                if let record, record.state == .finished, record.node == nodeName, record.fence == origin.fence {
                    kept.append((job, origin))
                    recorded.insert(job.id)
                } else {
                    lost.append(job.id)
                }
            }
            lock.withLock { _ = state.beatSucceeded(sentAt: sentAt, held: [:]) }
        }
        for id in lost {
            removeTree(spool.active + "/" + id)
            spool.discardDownloads(job: id)
            event(.warning, "job \(id): lost while this node was down; another node runs it (nothing published here)",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "lost", "OPQ_JOB": .string(id), "OPQ_ERROR": "taken over while this node was down"])
        }
        lock.withLock {
            // Without an answer (database down at start) the jobs are kept, their lease counted from now.
            if !kept.isEmpty { state.assumeRenewed(at: sentAt) }
            for (job, origin) in kept {
                state.hold(job.id, fence: origin.fence, recorded: recorded.contains(job.id))
                origins[job.id] = origin
                resume.append(job)
            }
        }
        // Those set aside before the restart first: a resubmitted one is set aside now, and must be queued once.
        for (folder, job) in spool.pendingSubmissions() { enqueue(job, folder: folder) }
        for job in resubmit { enqueueSubmission(job) }
        lock.withLock {
            started = true
            claimWanted = true
            controlWanted = true
        }
        reportDeadline()
        kick()
        wantSubmit()
        return resume
    }

    /// A folder in active/ with no claim record at all: an inbox claim, or a claim from the cluster whose record is
    /// gone (the spool copied without its extended attributes: `cp -r`, `rsync -a` without `-X`, `tar` without
    /// `--xattrs`). Submitting the latter again would run it twice. It is taken for a claim from the cluster when
    /// the database has a job of that id with the very same manifest that this node claimed (it holds it, or it was
    /// taken from it): its record is written again from the row, and it goes on as any such claim (resumed if still
    /// this node's under that fence, published if its end was recorded, else lost). Nil — an inbox claim — when no
    /// such row is found; nil and `answering` false when the database does not answer (it is not asked again: the
    /// folder waits for `verifyUnrecorded`).
    private func recognised(_ job: ClaimedJob, answering: inout Bool) -> (ClaimedJob, ClusterOrigin)? {
        guard answering else { return nil }
        let found: JobRecord?
        do {
            found = try waitBounded(Self.statementTimeout, on: executor, doing: "looking up job \(job.id)", { [store] in try await store.job(job.id) })
        } catch {
            answering = false
            return nil
        }
        guard let row = found, isThisNodesClaim(row, of: job) else { return nil }
        event(.warning, "job \(job.id): active/\(job.id) had lost its claim record (a copy without extended attributes?); the database says this node claimed it",
              ["OPQ_JOB": .string(job.id)])
        return recordAgain(job, from: row)
    }

    /// Whether `row` is the database's side of `job`, a folder without a record: the same manifest, claimed by this
    /// node (it holds it, or it was taken from it).
    private func isThisNodesClaim(_ row: JobRecord, of job: ClaimedJob) -> Bool {
        (row.node == nodeName || row.fromNode == nodeName) && row.manifest.elementsEqual(job.manifest)
    }

    /// `job`'s claim record written again from its row, and the job as the row says it (name, requested id,
    /// reception time) with its origin. A row handed back has no fence: -1, which no lease has, makes it lost here.
    private func recordAgain(_ job: ClaimedJob, from row: JobRecord) -> (ClaimedJob, ClusterOrigin) {
        let kept = Self.kept(id: row.id, manifestName: row.manifestName, requestedID: row.requestedID, submittedOn: row.submittedOn,
                             submittedAt: row.submittedAt, fromNode: row.fromNode, fence: row.fence ?? -1)
        var claimed = job
        claimed.manifestName = kept.name
        claimed.requestedJob = kept.requested
        claimed.receivedAt = kept.receivedAt
        try? spool.writeClaimRecord(ClaimRecord(manifest: kept.name, receivedAt: kept.receivedAt, requestedJob: kept.requested, origin: kept.origin),
                                    on: spool.active + "/" + job.id)
        return (claimed, kept.origin)
    }

    /// What a row says of a job, as this node keeps it: its inbox name if a spool can hold it (else the id's), the
    /// id it asked for if valid, node names checked, a reception time that is a time.
    private static func kept(id: String, manifestName: String, requestedID: String, submittedOn: String, submittedAt: Double,
                             fromNode: String?, fence: Int64) -> (name: String, requested: String?, receivedAt: Double, origin: ClusterOrigin) {
        let name = manifestName.contains("/") || manifestName.utf8.count > 255 || manifestName.isEmpty ? id + ".plist" : manifestName
        let origin = ClusterOrigin(fence: fence, submittedOn: isValidNodeName(submittedOn) ? submittedOn : "unknown",
                                   fromNode: fromNode.flatMap { isValidNodeName($0) ? $0 : nil })
        return (name, requestedID != id && isValidIdentifier(requestedID) ? requestedID : nil,
                submittedAt.isFinite ? submittedAt : Date().timeIntervalSince1970, origin)
    }

    public func submit(_ jobs: [ClaimedJob]) -> [ClaimedJob] {
        for job in jobs { enqueueSubmission(job) }
        wantSubmit()
        return []
    }

    public func want(room: Int, manifestBytes: Int) {
        lock.withLock {
            self.room = max(0, room)
            self.manifestBudget = max(1, manifestBytes)
            if room > 0 { claimWanted = true }
        }
        kick()
    }

    public func complete(_ ends: [JobEnd]) throws -> Set<String> {
        checkDeadline()
        let ids = ends.map(\.job)
        let (fences, already) = lock.withLock { (state.beginCompleting(ids), state.alreadyRecorded(ids)) }
        var completions: [JobCompletion] = []
        for end in ends where fences[end.job] != nil && !already.contains(end.job) {
            let result: [UInt8]
            if let kept = end.result {
                result = kept
            } else {
                switch readRegularFile(end.resultFile, limit: 64 << 20) {
                case .success(let data): result = Array(data)
                case .failure(let error):
                    logger.error("job \(end.job): its result.plist cannot be read for the cluster's record: \(error)",
                                 metadata: ["OPQ_JOB": .string(end.job), "OPQ_ERROR": .string(error.description)])
                    result = []
                }
            }
            completions.append(JobCompletion(job: end.job, fence: fences[end.job] ?? 0, status: end.status, result: result))
        }
        let asked = completions.map(\.job)
        let batch = completions
        let recorded: Set<String>
        do {
            recorded = try waitBounded(Self.statementTimeout, on: executor, doing: "recording the end of \(completions.count) job(s)", { [store] in
                try await store.completeJobs(batch)
            })
        } catch {
            lock.withLock { _ = state.endCompleting(ids, recorded: nil) }
            throw error
        }
        let lost = lock.withLock {
            let lost = state.endCompleting(asked, recorded: recorded)
            _ = state.endCompleting(Array(already), recorded: already)
            for id in ids where fences[id] != nil { origins[id] = nil }
            return lost
        }
        // The origin (in the job record) goes with the folder: a crash before the shell has moved the job out of
        // active/ finds it still ours (recorded under its fence) and publishes it, never submits it again.
        if !lost.isEmpty { delegate?.lost(lost, reason: "taken over by another node before its end was recorded") }
        reportDeadline()
        return recorded.union(already)
    }

    public func origin(of job: String) -> JobOrigin? {
        guard let origin = lock.withLock({ origins[job] }) ?? spool.readOrigin(job: job) else { return nil }
        return JobOrigin(submittedOn: origin.submittedOn, fromNode: origin.fromNode)
    }

    public func requestCancel(job: String, operation: String?) -> StoreCancelOutcome {
        do {
            // An operation its job does not have is refused (exit 1), as on the node running the job, rather than
            // recorded and ignored when the job is claimed. Read from the manifest (as its submitter read it); a
            // photo list's operations come with the list, so any id may yet be one of them.
            if let operation, let record = try self.job(job), record.state != .finished,
               case .success(let plan) = Manifest.parse(ManifestTree(Data(record.manifest)),
                                                       configuration: submissionConfiguration(lock.withLock { configuration })),
               plan.photosURL == nil, !plan.operations.contains(where: { $0.id == operation }) {
                return .unknownOperation
            }
            switch try waitBounded(Self.statementTimeout, on: executor, doing: "cancelling job \(job)", { [store] in
                try await store.requestCancel(job: job, operation: operation)
            }) {
            case .requested:
                // A whole job that still waits is taken here and ends at once, cancelled, without a node that could
                // run it (there may be none). Failing that, it ends wherever it is claimed or runs.
                if operation == nil { try? takeCancelled(job) }
                return .requested
            case .unknownJob: return .unknownJob
            case .alreadyEnded: return .alreadyEnded
            }
        } catch {
            return .unavailable("\(error)")
        }
    }

    public func setSuspended(_ queue: String, _ suspended: Bool) -> Bool {
        do {
            try waitBounded(Self.statementTimeout, on: executor, doing: "\(suspended ? "suspending" : "resuming") queue \(queue)", { [store] in
                try await store.setSuspended(queue, suspended)
            })
            lock.withLock {
                pendingSuspensions[queue] = nil
                controlWanted = true
            }
            kick()
            return true
        } catch {
            lock.withLock { pendingSuspensions[queue] = suspended }
            logger.error("queue \(queue): the cluster could not record the \(suspended ? "suspension" : "resumption") now (\(error)); it acts on this node at once and is recorded for every node once the database can be reached",
                         metadata: ["OPQ_QUEUE": .string(queue), "OPQ_ERROR": .string("\(error)")])
            return false
        }
    }

    public func shutdown() {
        let already = lock.withLock {
            defer { stopped = true }
            return stopped
        }
        if already { return }
        kick()
        wantStatus()
        wantSubmit()
        pruneWake.signal()
        _ = finished.wait(timeout: .now() + Self.statementTimeout + 2)
        reaper.sync { [self] in reap(lock.withLock { Array(adoptable.keys) }) }
        runner?.cancel()
        listener?.cancel()
    }

    // MARK: beyond JobStore (the integrator's)

    /// At a graceful stop, before `handBack`: no claim round starts from now on, and when this returns the one under
    /// way (if any) has given its jobs to the shell (`run`), so that the shell's list of unstarted jobs taken after it
    /// is whole. Otherwise the jobs handed back would be claimed again at once by this very node — it has room for
    /// them again, and it hears the NOTIFY of their release — and held, unstarted, until its lease ran out.
    public func stopClaiming() {
        lock.withLock { claimsStopped = true }
        let deadline = monotonicSeconds() + Self.statementTimeout + 1
        while lock.withLock({ claimInFlight }) && monotonicSeconds() < deadline {
            claimEnded.wait(upTo: deadline - monotonicSeconds())
        }
    }

    /// At a graceful stop: hands `jobs` (none of whose operations started here) back to waiting at once, so that
    /// other nodes run them now rather than once this node's lease has run out; returns those handed back. None
    /// while the database cannot be asked (the lease frees them then, as before); never a job whose end is being
    /// or was recorded.
    public func handBack(_ jobs: [String]) -> Set<String> {
        // Not while disconnected: the stop would wait a statement's timeout for nothing.
        let fences = lock.withLock { () -> [String: Int64] in
            guard state.connected == true else { return [:] }
            var fences: [String: Int64] = [:]
            for id in jobs { if let held = state.held[id], !held.completing, !held.recorded { fences[id] = held.fence } }
            return fences
        }
        if fences.isEmpty { return [] }
        guard let released = try? waitBounded(Self.statementTimeout, on: executor, doing: "handing \(fences.count) job(s) back", { [store, nodeName] in
            try await store.releaseJobs(node: nodeName, fences)
        }) else { return [] }
        lock.withLock { for id in released { state.forget(id); origins[id] = nil } }
        return released
    }

    /// Reloaded configuration (SIGHUP): declared again to the cluster (migrate + registerNode) by the loop.
    public func reload(_ configuration: Configuration) {
        lock.withLock {
            self.configuration = configuration
            registerWanted = true
        }
        kick()
    }

    /// What `status` shows of the cluster, as of the last beat; never waits for the database.
    public func snapshot() -> ClusterSnapshot? {
        lock.withLock {
            var s = snapshotValue
            s.connected = state.connected == true
            s.lastError = lastError
            s.wakeupsArrive = probe.verdict == .arriving
            return s
        }
    }

    /// A job the cluster knows (show, wait, graph), waiting for the database at most `timeout` seconds.
    public func job(_ id: String, timeout: Double = ClusterJobStore.statementTimeout) throws -> JobRecord? {
        try waitBounded(timeout, on: executor, doing: "looking up job \(id)", { [store] in try await store.job(id) })
    }

    /// The current lease deadline (monotonic seconds) while the node holds something; nil otherwise.
    public var leaseDeadline: Double? { lock.withLock { state.watchdogDeadline } }

    /// Whether the node may take leases now (connected, and its last beat's lease has time left).
    public var leaseIsGood: Bool { lock.withLock { state.mayTakeLeases(now: monotonicSeconds()) } }

    /// Called with true when the node's lease becomes good (a beat succeeded after none or after it ran out), and
    /// with false when it runs out — for holders of other leases under the node's heartbeat (cluster permits:
    /// `enable()` / `dropAll()`). From the store's threads; set it before `recovered`.
    public var onLeaseChange: (@Sendable (Bool) -> Void)? {
        get { lock.withLock { _onLeaseChange } }
        set { lock.withLock { _onLeaseChange = newValue } }
    }
    private var _onLeaseChange: (@Sendable (Bool) -> Void)?
    private var leaseGood = false

    private func leaseChanged(_ good: Bool) {
        let hook: (@Sendable (Bool) -> Void)? = lock.withLock {
            guard leaseGood != good else { return nil }
            leaseGood = good
            return _onLeaseChange
        }
        hook?(good)
    }

    // MARK: submissions

    private func enqueueSubmission(_ job: ClaimedJob) {
        if job.id.hasPrefix(".") {
            // Claimed for the cluster: already in active/.submissions.
            enqueue(job, folder: spool.submissionsFolder + "/" + job.id.dropFirst())
            return
        }
        do {
            let folder = try spool.moveToSubmissions(job: job.id)
            enqueue(job, folder: folder)
        } catch {
            // It stays in active/ (recovery submits it again); nothing is lost.
            logger.error("job \(job.id): cannot be set aside for submission: \(error); it is submitted at the next start",
                         metadata: ["OPQ_JOB": .string(job.id), "OPQ_ERROR": .string("\(error)")])
        }
    }

    private func enqueue(_ job: ClaimedJob, folder: String) {
        let config = submissionConfiguration(lock.withLock { configuration })
        var placement = (qos: 2, priority: 2, queues: [String](), commands: [String]())
        // The plan the shell made of a manifest from the inbox (not parsed again); a folder handed over from
        // active/, or one a previous run left to submit, is read here.
        if let plan = job.plan {
            placement = plan.clusterPlacement(config)
        } else if case .success(let plan) = Manifest.parse(job.tree ?? ManifestTree(job.manifest), configuration: config) {
            placement = plan.clusterPlacement(config)
        }
        // The key survives a restart: the node and which inbox file it was (a file claimed for the cluster), or the
        // inbox name and the reception time recorded at claim (a folder handed over from active/).
        let key = job.id.hasPrefix(".") ? "\(nodeName)/\(job.id.dropFirst())" : "\(nodeName)/\(job.manifestName)/\(job.receivedAt)"
        let new = NewJob(requestedID: job.requestedJob ?? job.id, manifest: Array(job.manifest), manifestName: job.manifestName,
                         submittedOn: nodeName, qosRank: placement.qos, priorityRank: placement.priority,
                         queues: placement.queues, commands: placement.commands, submissionKey: key)
        lock.withLock { pending.append((folder, job.id.hasPrefix("."), key, new)) }
    }

    // MARK: the loop

    private func kick() { loopWake.signal() }

    /// clusterMaxConcurrentOperationCount (SPEC §8): the shell's ClusterPermits take slots only while this node's
    /// lease is good, record them here so that the lease deadline covers them, lose them at the deadline, and
    /// hear when another node frees one.
    func attach(permits: ClusterPermits) {
        lock.withLock { self.permits = permits }
        permits.attach(.init(
            mayAcquire: { [weak self] in
                guard let self else { return false }
                return self.lock.withLock { self.state.mayTakeLeases(now: monotonicSeconds()) }
            },
            holding: { [weak self] lease, held in
                guard let self else { return }
                let key = ClusterNodeState.SlotKey(queue: lease.queue, slot: lease.slot, fence: lease.fence)
                self.lock.withLock {
                    if held { self.state.addSlot(key) } else { _ = self.state.removeSlot(key) }
                }
                self.reportDeadline()
            }))
    }

    private func heard(_ wakeup: Wakeup) {
        switch wakeup {
        case .jobs: lock.withLock { claimWanted = true }
        case .control: lock.withLock { controlWanted = true }
        case .slots:
            lock.withLock { permits }?.nudge()
            return
        case .nodes:
            wantStatus()
            return
        case .connected:
            lock.withLock {
                claimWanted = true
                controlWanted = true
                probe.listenerConnected(now: monotonicSeconds())
            }
            wantStatus()
        case .disconnected:
            lock.withLock { probe.listenerDisconnected() }
            return
        case .probe(let token):
            report(lock.withLock { probe.heard(token, now: monotonicSeconds()) })
            return
        }
        kick()
    }

    private func loop() {
        var backoff = 0.1
        var connected = false
        var nextBeat = 0.0, nextPoll = 0.0, nextTakeover = 0.0
        var spoolHung = false
        while !lock.withLock({ stopped }) {
            // After a freeze (SIGSTOP), what the lease no longer covers stops before anything else is done.
            checkDeadline()
            // A spool that has hung for a whole lease (SpoolWatch): the node leaves the cluster as in an outage —
            // nothing is renewed, claimed or registered until it answers, so that the jobs it can neither finish nor
            // publish run elsewhere after the lease — and joins again (connects) once it answers.
            let stalled = delegate?.spoolStalledSeconds() ?? 0
            if (stalled >= spoolStallBound) != spoolHung {
                spoolHung.toggle()
                if spoolHung { connected = false }
                spoolHungChanged(spoolHung, stalledSeconds: stalled)
            }
            if spoolHung {
                sleep(upTo: 0.25)
                continue
            }
            do {
                if !connected || lock.withLock({ registerWanted }) {
                    try connect(afterOutage: !connected)
                    connected = true
                    nextBeat = 0
                }
                let now = monotonicSeconds()
                if now >= nextBeat {
                    try beat()
                    // Only a whole round (connected and beaten) ends an outage's backoff: a server that accepts
                    // logins and fails statements is retried as slowly as one that refuses them.
                    backoff = 0.1
                    nextBeat = monotonicSeconds() + settings.leaseSeconds / 3
                }
                if now >= nextTakeover {
                    try takeOver()
                    nextTakeover = monotonicSeconds() + takeoverSeconds
                }
                try releaseWhatWasGivenUp()
                let (wantsClaim, wantsControl, isStarted) = lock.withLock { () -> (Bool, Bool, Bool) in
                    let polled = now >= nextPoll
                    defer { claimWanted = false; controlWanted = false }
                    return (claimWanted || polled, controlWanted || polled, started)
                }
                if now >= nextPoll { nextPoll = now + Self.pollSeconds }
                if isStarted && wantsClaim { try claim() }
                if isStarted && wantsControl { try control() }
                let next = min(nextBeat, nextPoll, nextTakeover)
                sleep(upTo: max(0, next - monotonicSeconds()))
            } catch {
                connected = false
                disconnected(error)
                sleep(upTo: backoff)
                backoff = min(backoff * 2, 5)
            }
        }
    }

    /// Waits until kicked or `seconds` passed.
    private func sleep(upTo seconds: Double) { loopWake.wait(upTo: seconds) }

    /// How long the spool may keep a step waiting before the node lets its lease go: a whole lease, at least 5 s
    /// (a sync of much written data on a slow disk is not a hang).
    var spoolStallBound: Double { max(5, settings.leaseSeconds) }

    /// A hang is logged as the node's `disconnected` (once, as an outage is; a node already disconnected only warns);
    /// its end as a notice, before the `connected` of the node joining again.
    private func spoolHungChanged(_ hung: Bool, stalledSeconds: Double) {
        let seconds = String(format: "%.1f", stalledSeconds)
        if hung {
            let reason = "the spool has not answered for \(seconds) s"
            let held = lock.withLock { state.held.count }
            let message = "cluster: node \(nodeName) leaves the cluster until its spool answers: the spool has kept it waiting for \(seconds) s (its file system hung or frozen?); it renews nothing, so that the \(held) job(s) it holds run elsewhere once its lease (\(settings.leaseSeconds.formatted()) s) has run out"
            if !disconnected(reason: reason, saying: message) {
                logger.warning("\(message)", metadata: ["OPQ_EVENT": "cluster", "OPQ_ERROR": .string(reason)])
            }
        } else {
            logger.notice("cluster: the spool of node \(nodeName) answers again; the node renews its lease (jobs taken over meanwhile are logged lost)",
                          metadata: ["OPQ_EVENT": "cluster"])
        }
    }

    /// Migrates, registers and says `connected`: at start, after an outage, and when asked to register again.
    private func connect(afterOutage: Bool) throws {
        let declaration = lock.withLock { configuration.declaration(node: nodeName, jobSlots: settings.jobSlots) }
        let schema = try waitBounded(Self.statementTimeout * 2, on: executor, doing: "migrating the cluster schema", { [store] in try await store.migrate() })
        if schema > ClusterSchema.newest {
            logger.warning("cluster: the schema is version \(schema), newer than the \(ClusterSchema.newest) this opqueued knows; it says this opqueued may still run against it: upgrade node \(nodeName) when you can")
        }
        // The server answered on a connection of migrate's own. After an outage the pool may still be waiting out a
        // backoff of postgres-nio's (up to a minute; see RenewablePool): a second for it, else a fresh pool. (Not
        // when only registering again: statements of other threads in flight on a working pool would fail.)
        let readOwner: @Sendable () async throws -> NodeOwner? = { [store, nodeName] in try await store.nodeOwner(nodeName) }
        let owner: NodeOwner?
        do {
            owner = try waitBounded(afterOutage ? 1 : Self.statementTimeout, on: executor, doing: "reading who holds node \(nodeName)", readOwner)
        } catch where afterOutage {
            store.reconnect()
            owner = try waitBounded(Self.statementTimeout, on: executor, doing: "reading who holds node \(nodeName)", readOwner)
        }
        // The name is this process's unless another running process holds it (NodeProcess): then it waits, retried
        // as an outage is, and joins once that one has been silent for leaseSeconds.
        let replacing = owner.flatMap { NodeProcess.isGoneFromThisMachine($0.info) ? $0.info : nil }
        let registered = try waitBounded(Self.statementTimeout, on: executor, doing: "registering node \(nodeName)", { [store, settings] in
            try await store.registerNode(declaration, leaseSeconds: settings.leaseSeconds, replacing: replacing)
        })
        guard registered else {
            let holder = owner.map { "\($0.info), last heartbeat \(String(format: "%.1f", $0.secondsSinceBeat)) s ago" } ?? "another process"
            throw ClusterUnavailable("node name \(nodeName) is held by another running opqueued (\(holder)); each node needs its own cluster.node. This one joins once that one has been silent for \(settings.leaseSeconds.formatted()) s")
        }
        if !lock.withLock({ hasConnected }) {
            // Slots the node's name holds now were held by a process of it that is gone (no slot is taken before
            // the first beat): a restart within the lease keeps the lease alive, so no takeover would free them.
            let freed = try waitBounded(Self.statementTimeout, on: executor, doing: "freeing the cluster slots node \(nodeName) held before", { [store, nodeName] in
                try await store.freeNodeSlots(node: nodeName)
            })
            if !freed.isEmpty { logger.notice("cluster: freed \(freed.count) cluster slot(s) an earlier process of node \(nodeName) held") }
        }
        let news = lock.withLock {
            hasConnected = true
            registerWanted = false
            claimWanted = true
            controlWanted = true
            lastError = nil
            return state.connectionSucceeded()
        }
        if news {
            event(.info, "cluster: node \(nodeName) connected to the database", ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"])
        }
        wantStatus()
        wantSubmit()
    }

    // MARK: the submission thread

    private func wantSubmit() { submitWake.signal() }

    /// Inserts what waits in `pending`, a batch (one statement) at a time, beside the loop's beats and claims: a
    /// flood into this node's inbox neither holds back its heartbeat nor its claims. Waits for the loop's first
    /// connection (the schema). After a failure, again `backoff` later (0.1 s doubling to 5 s), however many
    /// manifests arrive meanwhile; the loop is asked to check the connection, and it logs `disconnected` and
    /// `connected`.
    private func submitLoop() {
        var backoff = 0.1
        while !lock.withLock({ stopped }) {
            if lock.withLock({ hasConnected }) {
                do {
                    let more = try submitPending()
                    backoff = 0.1
                    if more { continue }
                } catch {
                    disconnected(error)
                    lock.withLock { registerWanted = true }
                    kick()
                    let until = monotonicSeconds() + backoff
                    backoff = min(backoff * 2, 5)
                    while !lock.withLock({ stopped }), monotonicSeconds() < until { submitWake.wait(upTo: until - monotonicSeconds()) }
                    continue
                }
            }
            submitWake.wait(upTo: 1)
        }
    }

    // MARK: the status thread

    private func wantStatus() { statusWake.signal() }

    /// Reads the snapshot every leaseSeconds/3, and at once when asked (a node registered, this one connected);
    /// a failed read is tried again at the next period (the loop reports the connection's state). Between reads it
    /// sends and judges the wake-up probes (`WakeupProbe`).
    private func statusLoop() {
        let period = max(0.2, settings.leaseSeconds / 3)
        var nextRefresh = 0.0
        while !lock.withLock({ stopped }) {
            guard lock.withLock({ hasConnected }) else {
                statusWake.wait(upTo: period)
                continue
            }
            if monotonicSeconds() >= nextRefresh {
                do {
                    try refreshSnapshot()
                } catch {
                    logger.debug("cluster: the status snapshot was not refreshed: \(error)")
                }
                nextRefresh = monotonicSeconds() + period
            }
            probeWakeups()
            let next = min(nextRefresh, lock.withLock { probe.nextEvent() } ?? .infinity)
            // Asked (wantStatus) or not, a refresh at least every period.
            if statusWake.wait(upTo: max(0.02, next - monotonicSeconds())) { nextRefresh = 0 }
        }
    }

    /// On the status thread: judges the last probe, and sends the next one when it is due (WakeupProbe).
    private func probeWakeups() {
        report(lock.withLock { probe.check(now: monotonicSeconds()) })
        let token = "\(nodeName)/\(UInt64.random(in: 1...UInt64.max))"
        // Recorded before it goes: the listener may hear it before the statement returns.
        let due = lock.withLock { () -> Bool in
            let now = monotonicSeconds()
            guard probe.due(now: now) else { return false }
            probe.sent(token, now: now)
            return true
        }
        guard due else { return }
        do {
            try waitBounded(Self.statementTimeout, on: executor, doing: "probing wake-ups", { [store] in try await store.probeWakeups(token) })
        } catch {
            lock.withLock { probe.notSent(now: monotonicSeconds()) }
        }
    }

    private func report(_ verdict: WakeupProbe.Verdict?) {
        switch verdict {
        case .notArriving?:
            logger.warning("cluster: wake-ups do not reach node \(nodeName): its listening connection did not hear the notifications it sent itself (\(WakeupProbe.misses) in a row, \(formatSeconds(WakeupProbe.wait)) s each). Is a connection pooler in transaction or statement mode (PgBouncer's usual setting) between the node and PostgreSQL? Jobs, cancels and suspensions now reach this node by its poll, about a second late, instead of within 100 ms: point cluster.database at PostgreSQL itself or at a pool in session mode")
        case .arriving?:
            logger.notice("cluster: wake-ups reach node \(nodeName) again")
        case nil:
            break
        }
    }

    /// Whether wake-ups (LISTEN/NOTIFY) are known to reach this node: false once two probes in a row went unheard.
    var wakeupsArrive: Bool { lock.withLock { probe.verdict == .arriving } }
    /// How many of this node's probes came back to it.
    var wakeupProbesHeard: Int { lock.withLock { probe.heardCount } }

    private func disconnected(_ error: any Error) {
        let reason = "\(error)"
        disconnected(reason: reason, saying: "cluster: node \(nodeName) cannot reach the database: \(reason); retrying at most 5 s apart")
    }

    /// The node is out of the cluster for `reason` (status' reason from now on): `disconnected` is logged once per
    /// outage, with `message`. Returns whether it was news.
    @discardableResult
    private func disconnected(reason: String, saying message: String) -> Bool {
        let news = lock.withLock {
            lastError = reason
            return state.connectionFailed()
        }
        if news { event(.warning, message, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected", "OPQ_ERROR": .string(reason)]) }
        return news
    }

    /// How often a node looks for lost nodes (`takeOver`): at most half a second after a lease ends.
    var takeoverSeconds: Double { min(settings.leaseSeconds / 3, 0.5) }

    /// One heartbeat (one statement): renews this process's lease and learns which of its jobs it lost.
    private func beat() throws {
        let progress = delegate?.progress()
        let sentAt = monotonicSeconds()
        let beat = try waitBounded(Self.statementTimeout, on: executor, doing: "renewing the lease of node \(nodeName)", { [store, nodeName] in
            try await store.heartbeat(node: nodeName, info: NodeProcess.info, progress: progress)
        })
        if !beat.registered {
            lock.withLock { registerWanted = true }
            throw ClusterUnavailable("node \(nodeName) has no row of this process in the database (registered again)")
        }
        let lost = lock.withLock { () -> [String] in
            let result = state.beatSucceeded(sentAt: sentAt, held: beat.held)
            for id in result.lost { origins[id] = nil }
            // Jobs the database gives this node that it does not run go back to waiting; but before recovery said
            // which jobs resume, every one of them may be one of those.
            if started { jobReleases.merge(result.orphans) { $1 } }
            return result.lost
        }
        reportDeadline()
        leaseChanged(true)
        if !lost.isEmpty { delegate?.lost(lost, reason: "taken over by another node") }
    }

    /// A takeover round: the jobs and slots of nodes silent past their leases go back (any node does it; one
    /// statement). Run every `takeoverSeconds`, not only at this node's beats (every leaseSeconds/3), so that a lost
    /// node's jobs run elsewhere within a fraction of a second of its lease's end, not up to a third of a lease later.
    private func takeOver() throws {
        let takeover = try waitBounded(Self.statementTimeout, on: executor, doing: "taking over the jobs of lost nodes", { [store, settings] in
            try await store.takeOverLost(leaseSeconds: settings.leaseSeconds)
        })
        if !takeover.jobs.isEmpty {
            lock.withLock { claimWanted = true }
            logger.notice("cluster: took \(takeover.jobs.count) job(s) back from lost node(s) \(Set(takeover.jobs.map { $0.fromNode }).sorted().joined(separator: ", "))")
        }
        if !takeover.freedSlotQueues.isEmpty {
            // Its NOTIFY reaches every node, this one too; the permits here need not wait for it.
            lock.withLock { permits }?.nudge()
        }
    }

    private func releaseWhatWasGivenUp() throws {
        let (jobs, slots) = lock.withLock { () -> ([String: Int64], [SlotLease]) in
            let now = monotonicSeconds()
            slotReleases += droppedSlots.filter { $0.due <= now }.map(\.lease)
            droppedSlots.removeAll { $0.due <= now }
            return (jobReleases, slotReleases)
        }
        if !jobs.isEmpty {
            _ = try waitBounded(Self.statementTimeout, on: executor, doing: "handing jobs back", { [store, nodeName] in
                try await store.releaseJobs(node: nodeName, jobs)
            })
            lock.withLock { for (id, fence) in jobs where jobReleases[id] == fence { jobReleases[id] = nil } }
        }
        for lease in slots {
            _ = try waitBounded(Self.statementTimeout, on: executor, doing: "releasing a cluster slot of queue \(lease.queue)", { [store] in
                try await store.releaseSlot(lease)
            })
            lock.withLock { slotReleases.removeAll { $0 == lease } }
        }
    }

    /// Inserts one batch of what waits (up to 256, one transaction); the local copies go only after the commit.
    /// Returns whether more wait.
    /// The folders without a record that recovery could not look up (`recognised`), now that the database answers,
    /// before anything is submitted. One whose end this node recorded is published (resumed as recovery would have);
    /// one the database knows otherwise as this node's claim, or one taken from it, is not run from this copy: the
    /// copy goes (`lost` here), and a row still this node's is handed back at the next beat (it runs here nowhere),
    /// to run again from the database. Any other is an inbox claim, submitted. A lookup that fails throws: retried
    /// after the thread's backoff.
    private func verifyUnrecorded() throws {
        while let job = lock.withLock({ unverified.first }) {
            let row = try waitBounded(Self.statementTimeout, on: executor, doing: "looking up job \(job.id)", { [store] in try await store.job(job.id) })
            lock.withLock { _ = unverified.removeFirst() }
            guard let row, isThisNodesClaim(row, of: job) else {
                enqueueSubmission(job)
                continue
            }
            if row.state == .finished, row.node == nodeName, let fence = row.fence {
                let (claimed, origin) = recordAgain(job, from: row)
                lock.withLock {
                    state.hold(job.id, fence: fence, recorded: true)
                    origins[job.id] = origin
                }
                event(.warning, "job \(job.id): active/\(job.id) had lost its claim record (a copy without extended attributes?); its end is recorded: published here",
                      ["OPQ_JOB": .string(job.id)])
                delegate?.run([claimed])
                continue
            }
            removeTree(spool.active + "/" + job.id)
            spool.discardDownloads(job: job.id)
            event(.warning, "job \(job.id): active/\(job.id) had lost its claim record (a copy without extended attributes?); the database holds the job: it runs again from there",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "lost", "OPQ_JOB": .string(job.id), "OPQ_ERROR": "its copy here had lost its claim record"])
        }
    }

    private func submitPending() throws -> Bool {
        try verifyUnrecorded()
        do {
            let batch = lock.withLock { Array(pending.prefix(256)) }
            if batch.isEmpty { return false }
            let jobs = batch.map(\.job)
            let inserted = try waitBounded(Self.statementTimeout * 2, on: executor, doing: "inserting \(jobs.count) job(s)", { [store] in
                try await store.insertJobs(jobs)
            })
            for row in inserted {
                logger.debug("job \(row.id): submitted to the cluster", metadata: ["OPQ_JOB": .string(row.id)])
            }
            // The local copies go a little later, off this thread: a row this node claims meanwhile takes its file
            // (see `adoptable`), and an unlink frees the file's blocks at once (0.5 ms each here, with online
            // discard), which the next batch need not wait for. One left by a crash meanwhile is submitted again at
            // the next start under the same key, which inserts nothing.
            var files: [String] = [], folders: [String] = []
            lock.withLock {
                for (i, entry) in batch.enumerated() {
                    // A file (a manifest claimed from the inbox; answers come in batch order) waits to be adopted;
                    // a folder handed over from active/ goes at once.
                    if inserted.count == batch.count && entry.isFile {
                        adoptable[inserted[i].id] = entry.folder
                        files.append(inserted[i].id)
                    } else {
                        folders.append(entry.folder)
                    }
                }
            }
            if !folders.isEmpty { reaper.async { [folders] in for folder in folders { removeTree(folder) } } }
            if !files.isEmpty { reaper.asyncAfter(deadline: .now() + Self.reapDelay) { [self, files] in reap(files) } }
            return lock.withLock {
                // Only this thread takes from the front: the batch is still the first `batch.count`.
                pending.removeFirst(batch.count)
                return !pending.isEmpty
            }
        }
    }

    /// On `reaper`: removes the local copies of these submissions that no claim here has taken.
    private func reap(_ jobs: [String]) {
        for job in jobs {
            if let file = lock.withLock({ adoptable.removeValue(forKey: job) }) { removeTree(file) }
        }
    }

    /// Claims a waiting job cancelled as a whole for this node (whatever it declares: it runs nothing), for the loop's
    /// next claim round to take in; nothing when it no longer waits or another node is taking it.
    private func takeCancelled(_ job: String) throws {
        let row = try waitBounded(Self.statementTimeout, on: executor, doing: "claiming the cancelled job \(job)", { [store, nodeName, maxManifestBytes] in
            try await store.claimCancelled(job: job, node: nodeName, maxManifestBytes: maxManifestBytes)
        })
        guard let row else { return }
        lock.withLock {
            cancelledClaims.append(row)
            claimWanted = true
        }
        kick()
    }

    /// One claim round for the room the shell has, and the jobs' files written before they run.
    private func claim() throws {
        // Cancelled jobs `requestCancel` claimed here: taken in whatever the room (they run nothing).
        let cancelled = lock.withLock { () -> [ClusterClaimedJob] in
            defer { cancelledClaims = [] }
            return cancelledClaims
        }
        if !cancelled.isEmpty { take(cancelled, limit: nil) }
        let (limit, budget, declaration) = lock.withLock { () -> (Int, Int, NodeDeclaration) in
            let free = settings.jobSlots - state.held.count
            let may = state.mayTakeLeases(now: monotonicSeconds()) && !claimsStopped
            let limit = may && manifestBudget > 0 ? min(room, free) : 0
            claimInFlight = limit > 0
            return (limit, manifestBudget, configuration.declaration(node: nodeName, jobSlots: settings.jobSlots))
        }
        if limit <= 0 { return }
        defer {
            lock.withLock { claimInFlight = false }
            claimEnded.signal()
        }
        let rows = try waitBounded(Self.statementTimeout, on: executor, doing: "claiming jobs for node \(nodeName)", { [store, nodeName, maxManifestBytes] in
            try await store.claimJobs(node: nodeName, limit: limit, queues: declaration.queues, commands: declaration.commands,
                                      budget: budget, maxManifestBytes: maxManifestBytes)
        })
        take(rows, limit: limit)
    }

    /// Makes claimed rows jobs of this node (its spool's copy, then the shell's), or hands them back. `limit`: the claim
    /// round's, when they are its rows (a full round looks again at once).
    private func take(_ rows: [ClusterClaimedJob], limit: Int?) {
        if rows.isEmpty { return }
        var run: [ClaimedJob] = []
        var handedOver = 0
        var overBudget = false
        var refused: [JobCompletion] = []
        var failed: [String: Int64] = [:]
        var spoolError: (job: String, error: any Error)?
        for row in rows {
            // The spool cannot take jobs now (disk full, …): the rest goes back untried.
            if spoolError != nil {
                failed[row.id] = row.fence
                continue
            }
            guard isValidIdentifier(row.id) else {
                refused.append(rejection(row, "its id is not a valid job id ([A-Za-z0-9._-]{1,128}, not starting with '.')"))
                continue
            }
            guard row.manifestBytes <= maxManifestBytes else {
                refused.append(rejection(row, "its manifest is \(row.manifestBytes) bytes, more than the \(maxManifestBytes) a manifest may hold"))
                continue
            }
            guard row.manifest.count == row.manifestBytes else {
                // Past this claim's budget (the manifests before it may hold the rest of the shell's operations):
                // handed back, to be claimed when there is room, here or on another node.
                failed[row.id] = row.fence
                overBudget = true
                continue
            }
            let (name, requested, receivedAt, origin) = Self.kept(id: row.id, manifestName: row.manifestName, requestedID: row.requestedID,
                                                                  submittedOn: row.submittedOn, submittedAt: row.submittedAt,
                                                                  fromNode: row.fromNode, fence: row.fence)
            if delegate?.holds(job: row.id) == true {
                // A job of this node's that was rejected here at submission under the same id is ending: the row
                // waits until the id is free here (the shell would take one job for the other).
                failed[row.id] = row.fence
                continue
            }
            // One of this node's own submissions whose file is still here: renamed in, not written again.
            let file = lock.withLock { adoptable.removeValue(forKey: row.id) }
            do {
                try spool.materialise(job: row.id, manifest: row.manifest, manifestName: name, receivedAt: receivedAt,
                                      requestedJob: requested, origin: origin, manifestFile: file)
                let data = Data(row.manifest)
                run.append(ClaimedJob(id: row.id, requestedJob: requested, manifestName: name, receivedAt: receivedAt, manifest: data, tree: ManifestTree(data), done: [:],
                                      cancels: row.cancels))
                lock.withLock {
                    state.hold(row.id, fence: row.fence)
                    state.claimedWithCancels(row.id, row.cancels)
                    origins[row.id] = origin
                    room = max(0, room - 1)
                    manifestBudget -= row.manifestBytes
                }
                // The shell starts the first jobs of a big claim while the rest are written.
                if run.count == Self.handOverChunk {
                    reportDeadline()
                    delegate?.run(run)
                    handedOver += run.count
                    run = []
                }
            } catch let error as SpoolError where error.errno == EEXIST {
                // This node's own inbox claim of a manifest asking for the same id, on its way to
                // active/.submissions: left alone; the row is claimed again once the name is free.
                logger.debug("job \(row.id): active/\(row.id) is in use here for a moment; handed back to the cluster",
                             metadata: ["OPQ_JOB": .string(row.id)])
                failed[row.id] = row.fence
            } catch {
                // `materialise` removed what it wrote. Claiming stops here (no room until the shell offers it again,
                // once the spool works): claimed again at once, the row would fail again, in a loop of claims and
                // hand-backs.
                logger.error("job \(row.id): claimed but cannot be written to the spool: \(error); handed back to the cluster",
                             metadata: ["OPQ_JOB": .string(row.id), "OPQ_ERROR": .string("\(error)")])
                failed[row.id] = row.fence
                spoolError = (row.id, error)
                lock.withLock {
                    room = 0
                    claimWanted = false
                }
            }
        }
        if !failed.isEmpty { lock.withLock { jobReleases.merge(failed) { $1 } } }
        if let spoolError { delegate?.spoolFailed("writing the claimed job active/\(spoolError.job)", spoolError.error) }
        if !refused.isEmpty {
            let refused = refused
            _ = try? waitBounded(Self.statementTimeout, on: executor, doing: "recording rejected rows", { [store] in try await store.completeJobs(refused) })
        }
        guard handedOver > 0 || !run.isEmpty else { return }
        // No spool commit before they run: the database holds the job, not this copy. A crash that loses the copy
        // (or half of it: a folder whose record is gone is recognised from the database at recovery, `recognised`)
        // leaves the row running under this node's fence; the restarted node hands it back at its first beat, or
        // another takes it over after the lease. The publication commits result.plist before the fenced completion.
        if !run.isEmpty {
            reportDeadline()
            delegate?.run(run)
        }
        // More may wait: look again at once while there is room (not when the budget sent rows back: the shell
        // offers more once its jobs have taken their operations).
        guard !overBudget, let limit else { return }
        lock.withLock { if room > 0 && rows.count == limit { claimWanted = true } }
        if rows.count == limit { kick() }
    }

    /// A row that cannot become a job here: recorded `rejected` with a result saying why (it never runs).
    private func rejection(_ row: ClusterClaimedJob, _ why: String) -> JobCompletion {
        let message = "the cluster's row for this job is unusable: \(why)"
        logger.error("cluster: a claimed row is unusable (\(why)); recorded rejected",
                     metadata: ["OPQ_EVENT": "job", "OPQ_STATE": "rejected", "OPQ_ERROR": .string(message)])
        let result: [String: Any] = ["job": row.id, "status": "rejected", "error": message, "node": nodeName,
                                     "submittedOn": row.submittedOn, "operations": [Any]()]
        let bytes = (try? PropertyListSerialization.data(fromPropertyList: result, format: .xml, options: 0)) ?? Data()
        return JobCompletion(job: row.id, fence: row.fence, status: "rejected", result: Array(bytes))
    }

    private func control() throws {
        for (queue, suspended) in lock.withLock({ pendingSuspensions }) {
            try waitBounded(Self.statementTimeout, on: executor, doing: "\(suspended ? "suspending" : "resuming") queue \(queue)", { [store] in
                try await store.setSuspended(queue, suspended)
            })
            lock.withLock { if pendingSuspensions[queue] == suspended { pendingSuspensions[queue] = nil } }
        }
        let requests = try waitBounded(Self.statementTimeout, on: executor, doing: "reading the cancels for node \(nodeName)", { [store, nodeName] in
            try await store.pendingCancels(node: nodeName)
        })
        let cancels = lock.withLock {
            state.newCancels(requests.compactMap { r in r.fence.map { (job: r.job, operation: r.operation, fence: $0) } })
        }
        // Waiting jobs cancelled as a whole that nobody took: taken here (they run nothing), whatever this node declares.
        for orphan in requests where orphan.fence == nil { try takeCancelled(orphan.job) }
        let suspended = try waitBounded(Self.statementTimeout, on: executor, doing: "reading the suspended queues", { [store] in
            try await store.suspendedQueues()
        })
        let changed = lock.withLock { state.suspendedRead(suspended) }
        let delegate = self.delegate
        for cancel in cancels { delegate?.cancel(job: cancel.job, operation: cancel.operation) }
        if let changed { delegate?.suspendedQueuesChanged(changed) }
    }

    private func refreshSnapshot() throws {
        let lease = settings.leaseSeconds
        let nodes = try waitBounded(Self.statementTimeout, on: executor, doing: "listing the cluster's nodes", { [store] in try await store.nodes(leaseSeconds: lease) })
        let unrunnable = try waitBounded(Self.statementTimeout, on: executor, doing: "finding jobs no live node can run", { [store] in
            try await store.jobsNoLiveNodeCanRun(leaseSeconds: lease, limit: 100)
        })
        let counts = try waitBounded(Self.statementTimeout, on: executor, doing: "counting the cluster's jobs", { [store] in try await store.queueCounts() })
        let declared = try waitBounded(Self.statementTimeout, on: executor, doing: "reading what nodes declare", { [store] in try await store.declared() })
        lock.withLock {
            self.declared = declared
            declaredKnown = true
            snapshotValue.nodes = nodes.map { .init(node: $0.node, connected: $0.connected, lastHeartbeat: $0.lastHeartbeat, jobs: $0.jobs, freeSlots: $0.freeSlots, schema: $0.schema) }
            snapshotValue.unrunnable = unrunnable.map(ClusterSnapshot.Waiting.init)
            snapshotValue.queues = Dictionary(counts.map { ($0.queue, ClusterSnapshot.QueueCounts(waiting: $0.waiting, running: $0.running)) },
                                              uniquingKeysWith: { first, _ in first })
            snapshotValue.refreshedAt = monotonicSeconds()
        }
    }

    // MARK: the prune thread

    /// Every pruneEverySeconds, the first soon after the first connection: the finished history older than
    /// keepFinishedDays goes, in batches (SPEC §8). On a thread of its own: pruning a long history, or waiting on a
    /// lock someone holds on an old row, holds back neither the heartbeat nor claims. A failed round (the database
    /// away) is tried again a minute later.
    private func pruneLoop() {
        var next = 0.0
        while !lock.withLock({ stopped }) {
            let connected = lock.withLock { hasConnected }
            if connected && monotonicSeconds() >= next {
                do {
                    try prune()
                    next = monotonicSeconds() + Self.pruneEverySeconds
                } catch {
                    logger.debug("cluster: finished jobs were not pruned now: \(error)")
                    next = monotonicSeconds() + 60
                }
            }
            pruneWake.wait(upTo: connected ? max(0.05, next - monotonicSeconds()) : 1)
        }
    }

    private func prune() throws {
        let seconds = settings.keepFinishedDays * 86_400
        let report = try waitBounded(Self.statementTimeout * 12, on: executor, doing: "pruning finished jobs", { [store] in
            try await store.prune(olderThanSeconds: seconds, batchSize: Self.pruneBatch)
        })
        if report.deleted > 0 {
            logger.info("cluster: pruned \(report.deleted) finished job(s) older than \(formatSeconds(settings.keepFinishedDays)) days in \(report.batches) batch(es)")
        }
        // Nodes gone for good (renamed, replaced, scaled away): their rows would be listed by `status` forever and
        // their queues and commands accepted at submission though no node will come to run them.
        let days = max(settings.keepFinishedDays, Self.forgetNodesAfterDaysAtLeast)
        let forgotten = try waitBounded(Self.statementTimeout, on: executor, doing: "forgetting nodes long silent", { [store] in
            try await store.forgetNodes(silentForSeconds: days * 86_400)
        })
        for node in forgotten {
            logger.notice("cluster: node \(node) forgotten: silent for more than \(formatSeconds(days)) days and holding nothing; the queues and commands only it declared are no longer accepted (it registers again if it comes back)")
        }
        if !forgotten.isEmpty { wantStatus() }
    }

    // MARK: the lease deadline

    private func watchDeadline() {
        while !lock.withLock({ stopped }) {
            checkDeadline()
            usleep(50_000)
        }
    }

    /// Past the deadline, what the leases covered is stopped: jobs handed to `lost`, slots given up.
    func checkDeadline() {
        let (lost, slots, ranOut) = lock.withLock { () -> ([String], [ClusterNodeState.SlotKey], Bool) in
            let now = monotonicSeconds()
            let r = state.checkDeadline(now: now)
            for id in r.lost { origins[id] = nil; jobReleases[id] = nil }
            let due = now + settings.leaseSeconds
            droppedSlots += r.slots.map { (SlotLease(queue: $0.queue, slot: $0.slot, fence: $0.fence, holder: nodeName, job: "", operation: ""), due) }
            return (r.lost, r.slots, state.deadline.map { now >= $0 } ?? false)
        }
        if ranOut { leaseChanged(false) }
        if lost.isEmpty && slots.isEmpty { return }
        reportDeadline()
        if !lost.isEmpty {
            logger.warning("cluster: the lease of node \(nodeName) ran out; \(lost.count) job(s) stopped: \(lost.joined(separator: ", "))",
                           metadata: ["OPQ_EVENT": "cluster", "OPQ_ERROR": "lease ran out"])
            delegate?.lost(lost, reason: "lease ran out")
        }
        if !slots.isEmpty {
            lock.withLock { permits }?.dropAll()
            logger.warning("cluster: the lease of node \(nodeName) ran out; \(slots.count) cluster slot(s) given up")
        }
    }

    /// Tells the watchdog hook when the deadline changed.
    private func reportDeadline() {
        let deadline: Double?? = lock.withLock {
            let now = state.watchdogDeadline
            if reportedDeadline == .some(now) { return nil }
            reportedDeadline = .some(now)
            return .some(now)
        }
        if let deadline { onLeaseDeadline(deadline) }
    }

    private func event(_ level: Logger.Level, _ message: String, _ fields: Logger.Metadata) {
        logger.log(level: level, Logger.Message(stringLiteral: message), metadata: fields)
    }
}
