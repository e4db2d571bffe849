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
// This file holds the state and what the shell calls; the threads' work is beside it: +Loop (connection, leases,
// cancels), +Claims (claim rounds), +Submissions, +Status (the status and prune threads), +Recovery (a start's active/).
//
// What it trusts: nothing a row holds. An id that is not a valid job id is recorded `rejected` and never touches
// the spool; a manifest is validated again by the shell against the local configuration; a signature that does
// not decode widens nothing. The password never reaches a log line: errors come from ClusterStoreError.

import ClusterStore
import DequeModule
import Foundation
import JobModel
import Logging
import OperationEngine
import SpoolFiles
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

public final class ClusterJobStore: SpoolBacked, @unchecked Sendable {
    public let node: String?
    public var capabilities: StoreCapabilities { [.placesJobs, .leasesJobs, .keepsSuspensions, .keepsDelayedJobs, .recordsEnds] }
    public var delegate: (any JobStoreDelegate)? {
        get { lock.withLock { _delegate } }
        set { lock.withLock { _delegate = newValue } }
    }

    let settings: ClusterSettings
    let nodeName: String
    public let spool: Spool
    let store: any ClusterStore
    let logger: Logger
    let onLeaseDeadline: @Sendable (Double?) -> Void
    /// A row whose manifest is bigger is rejected without being read (ManifestLimits.maxBytes; less in tests).
    let maxManifestBytes: Int

    /// Everything below is guarded by `lock`. Each thread of the store has its wake-up: the loop, the status
    /// reader, the submitter.
    let lock = NSLock()
    let loopWake = ThreadSignal()
    let statusWake = ThreadSignal()
    let submitWake = ThreadSignal()
    let pruneWake = ThreadSignal()
    private weak var _delegate: (any JobStoreDelegate)?
    var configuration: Configuration
    var state: ClusterNodeState
    var origins: [String: ClusterOrigin] = [:]
    var room = 0
    /// The bytes the manifests of the next claim may hold (the shell's operation budget): past it, rows come back
    /// without their manifest and are handed back.
    var manifestBudget = Int.max
    var started = false
    var stopped = false
    var claimWanted = true
    /// Set at a graceful stop (`stopClaiming`): no claim round starts any more.
    var claimsStopped = false
    /// A claim round is under way: from its decision to claim until its jobs are with the shell; `claimEnded` is
    /// signalled when it is over.
    var claimInFlight = false
    let claimEnded = ThreadSignal()
    /// How big claim rounds are while jobs wait (ClaimPacing); when a round put off is due (monotonic seconds).
    var claimPacing = ClaimPacing()
    var claimDue: Double?
    /// Cancelled jobs claimed for this node by `requestCancel`, taken in by the loop's next claim round.
    var cancelledClaims: [ClusterClaimedJob] = []
    var controlWanted = true
    /// Suspensions and resumptions asked while the database could not record them: written at the next control
    /// round that reaches it (then every node follows), newest per queue.
    var pendingSuspensions: [String: Bool] = [:]
    /// Cancels made here that the database could not record then (`shareCancel`): written at the next control rounds.
    var pendingCancelShares: [(job: String, operation: String?)] = []
    var registerWanted = false
    /// Submissions set aside, not yet inserted (their folder under active/.submissions, key, row and, for a file from
    /// the inbox, its inode), oldest first:
    /// appended by the shell's calls, taken by the submission thread from the front.
    var pending = Deque<(folder: String, isFile: Bool, key: String, job: NewJob, inode: UInt64?, since: Double)>()
    /// Manifest files of this node's submissions, inserted and not yet removed, by job id: a row of them this
    /// node claims before the reaper gets to it (`reapDelay` after the insert, or at shutdown) has its file renamed
    /// into active/<job>/ rather than written again. Whoever takes the entry out owns the file.
    var adoptable: [String: String] = [:]
    /// The inbox names of the files an insert under way carries: a row of this node's claimed meanwhile under one of
    /// them may be its own file's, its entry in `adoptable` made as soon as the insert's answer is read (`adoptableFile`).
    var insertingNames: Set<String> = []
    /// Folders in active/ without any claim record that recovery could not look up (the database did not answer at
    /// start): left where they are until the submission thread can (`verifyUnrecorded`).
    var unverified: [ClaimedJob] = []
    var slotReleases: [SlotLease] = []
    /// Slots dropped at the lease deadline, released (fence-checked) once the database's lease on them would have
    /// run out too: a node that renews before the takeover sees them keeps its name on them otherwise.
    var droppedSlots: [(lease: SlotLease, due: Double)] = []
    var jobReleases: [String: Int64] = [:]
    /// Which other nodes are silent, by this node's clock (the loop's takeover rounds).
    var silenceWatch = SilenceWatch()
    /// Whether another process holding this node's name is silent, by this node's clock (`connect`, while it waits).
    var nameWatch = SilenceWatch()
    /// The store's advice already logged (once per process).
    var adviceGiven: Set<String> = []
    var lastError: String?
    /// The causes of this outage already logged (`disconnected`): each is said once.
    var outageCauses: Set<String> = []
    var declared: (queues: Set<String>, commands: Set<String>, commandSignatures: [String: String]) = ([], [], [:])
    /// What the cluster declares has been read once: manifests from the inbox can be validated (until then they wait).
    var declaredKnown = false
    var snapshotValue: ClusterSnapshot
    private var reportedDeadline: Double??
    /// clusterMaxConcurrentOperationCount's slots, held for the engine (see `attach(permits:)`).
    var permits: ClusterPermits?
    /// clusterRateLimit's start grants (see `startRates`): told when another node reports grants.
    var rates: ClusterRates?
    private var runner: Task<Void, Never>?
    /// The loop has connected (migrated, registered, freed what an earlier process of the node held) once: before,
    /// the status thread has nothing to read.
    var hasConnected = false
    /// Whether wake-ups reach this node (driven by the status thread and the listener).
    var probe = WakeupProbe()
    private var listener: Task<Void, Never>?
    private let finished = DispatchGroup()
    let executor: ClusterExecutor
    /// Removes the local copies of submissions the database holds.
    let reaper = DispatchQueue(label: "opqueued-cluster-reaper", qos: .utility)

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
        // The longest this node waits for one pooled statement (an insert's); the server ends it a second after.
        let store = try PostgresClusterStore(url: url, abandonAfter: Self.statementTimeout * 2,
                                             executor: ClusterExecutor(label: "opqueued-cluster-executor"))
        self.init(configuration: configuration, spool: spool, logger: logger, store: store, executor: store.executor,
                  run: { await store.run() }, onLeaseDeadline: onLeaseDeadline, maxManifestBytes: maxManifestBytes)
    }

    /// `run` keeps the store's connections (for PostgresClusterStore, its `run()`); cancelled at shutdown. `executor`: the
    /// queue the node waits for the store on (give the store the same one).
    public init(configuration: Configuration, spool: Spool, logger: Logger, store: any ClusterStore, executor: ClusterExecutor? = nil,
                run: @escaping @Sendable () async -> Void, onLeaseDeadline: @escaping @Sendable (Double?) -> Void = { _ in },
                maxManifestBytes: Int = ManifestLimits.maxBytes) {
        self.maxManifestBytes = maxManifestBytes
        self.executor = executor ?? ClusterExecutor(label: "opqueued-cluster-executor")
        let settings = configuration.cluster ?? ClusterSettings(database: "", passwordFile: nil, node: "node",
                                                                 jobSlots: configuration.maxActiveJobs,
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
        self.snapshotValue = ClusterSnapshot(node: settings.node, connected: false, lastError: nil, nodes: [], unrunnable: [], queues: [:],
                                             refreshedAt: nil)
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

    /// Not while the node knows the database is away (it logged `disconnected`): new manifests then wait in the inbox,
    /// where the operator sees them and may move them to a node that can reach it (SPEC §8).
    public var acceptsSubmissions: Bool {
        lock.withLock { declaredKnown && pending.count < Self.pendingLimit && state.connected != false }
    }

    public var awaitingSubmission: Int { lock.withLock { pending.count } }

    public var awaitingSubmissionSince: Double? { lock.withLock { pending.lazy.map(\.since).min() } }

    public func submissionConfiguration(_ local: Configuration) -> Configuration {
        let d = lock.withLock { declared }
        return local.widened(queues: d.queues, commands: d.commands, signatures: d.commandSignatures)
    }

    /// What the cluster declares, read now (at most a second): a node that registered since the status thread's
    /// last look is known before a manifest naming its queue is rejected here.
    public func freshSubmissionConfiguration(_ local: Configuration) -> Configuration? {
        guard let declared = try? waitBounded(1.0, on: executor, doing: "reading what nodes declare", { [store] in
            try await store.declared()
        }) else {
            return nil
        }
        lock.withLock {
            self.declared = declared
            declaredKnown = true
        }
        return local.widened(queues: declared.queues, commands: declared.commands, signatures: declared.commandSignatures)
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

    public func ending(_ jobs: [String]) {
        lock.withLock { state.ending(jobs) }
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
            recorded = try waitBounded(Self.statementTimeout, on: executor,
                                       doing: "recording the end of \(completions.count) job(s)", { [store] in
                try await store.completeJobs(batch)
            })
        } catch {
            lock.withLock { _ = state.endCompleting(ids, recorded: nil) }
            throw error
        }
        // A job the database has no row for any more (restored from a backup older than the job) is this node's to
        // publish: no other node holds it, and dropped it would have run for nothing, and run nowhere again.
        let forgotten = Set(asked.filter { !recorded.contains($0) && hasNoRow($0) })
        for completion in completions where forgotten.contains(completion.job) {
            recordForgotten(completion)
        }
        let lost = lock.withLock {
            let lost = state.endCompleting(asked, recorded: recorded.union(forgotten))
            _ = state.endCompleting(Array(already), recorded: already)
            for id in ids where fences[id] != nil { origins[id] = nil }
            return lost
        }
        // The origin (in the job record) goes with the folder: a crash before the shell has moved the job out of
        // active/ finds it still ours (recorded under its fence) and publishes it, never submits it again.
        if !lost.isEmpty { delegate?.lost(lost, reason: "taken over by another node before its end was recorded") }
        reportDeadline()
        return recorded.union(already).union(forgotten)
    }

    /// A job that ran to its end here while the database lost its row (restored from an older backup) is published
    /// here, and recorded in the database again as finished on this node, from its folder: `show` and `wait` on every
    /// node then know it, and no later submission takes its id. Not recorded (it is published all the same) when
    /// its folder cannot be read, the database does not answer, or a submission took the id meanwhile.
    private func recordForgotten(_ completion: JobCompletion) {
        let job = completion.job
        let recorded: String
        switch spool.heldJob(job) {
        case .success(let held):
            let row = row(for: held, submittedOn: origin(of: job)?.submittedOn ?? nodeName, key: nil)
            switch Result(catching: {
                try waitBounded(Self.statementTimeout, on: executor, doing: "recording job \(job) as finished", { [store, nodeName] in
                    try await store.recordFinished(row, id: job, node: nodeName, status: completion.status, result: completion.result)
                })
            }) {
            case .success(true): recorded = "recorded in the database again as finished here"
            case .success(false): recorded = "not recorded in the database: another job took its id meanwhile"
            case .failure(let error): recorded = "without a record in the database (\(error))"
            }
        case .failure(let error):
            recorded = "without a record in the database (its folder cannot be read: \(error))"
        }
        event(.warning, "job \(job): the database has no row for this job any more (restored from a backup older than the job?); "
              + "published here, where it ran, \(recorded)",
              ["OPQ_JOB": .string(job)])
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
            // The server is told when this node stops waiting, a little before it does (its answer has to come
            // back): read later, the cancel is not made, since the client is told the cluster could not be asked.
            let wait = controlWait
            let notAfter = Date().timeIntervalSince1970 + max(wait / 2, wait - 0.5)
            switch try waitBounded(wait, on: executor, doing: "cancelling job \(job)", { [store] in
                try await store.requestCancel(job: job, operation: operation, notAfter: notAfter)
            }) {
            case .requested:
                // A whole job that still waits is taken here and ends at once, cancelled, without a node that could
                // run it (there may be none). Failing that, it ends wherever it is claimed or runs.
                if operation == nil { try? takeCancelled(job) }
                return .requested
            case .unknownJob: return .unknownJob
            case .alreadyEnded: return .alreadyEnded
            case .late:
                return .unavailable("the database read the cancel only after this node's deadline (\(wait) s); nothing was recorded "
                                    + "(if it answers at once, its clock and this node's disagree)")
            }
        } catch {
            return .unavailable("\(error)")
        }
    }

    public func setSuspended(_ queue: String, _ suspended: Bool) -> Bool {
        do {
            try waitBounded(controlWait, on: executor, doing: "\(suspended ? "suspending" : "resuming") queue \(queue)", { [store] in
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
            logger.error("""
                queue \(queue): the cluster could not record the \(suspended ? "suspension" : "resumption") now (\(error)); \
                it acts on this node at once and is recorded for every node once the database can be reached
                """,
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
    public func startSlots(engine: Engine, logger: Logger) -> (permits: ClusterPermits, task: Task<Void, Never>)? {
        let permits = ClusterPermits(store: store, node: nodeName, leaseSeconds: settings.leaseSeconds, engine: engine, logger: logger)
        attach(permits: permits)
        // On this store's own executor: a blocked cooperative pool must not stall the slots either.
        return (permits, Task(executorPreference: executor) { await permits.run() })
    }

    public func startRates(engine: Engine, logger: Logger) -> (rates: ClusterRates, task: Task<Void, Never>)? {
        let rates = ClusterRates(store: store, node: nodeName, engine: engine, logger: logger)
        lock.withLock { self.rates = rates }
        return (rates, Task(executorPreference: executor) { await rates.run() })
    }

    public func job(_ id: String) throws -> JobRecord? { try job(id, timeout: nil) }

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
        guard let released = try? waitBounded(Self.statementTimeout, on: executor,
                                              doing: "handing \(fences.count) job(s) back", { [store, nodeName] in
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
            // Connected while a beat's lease has time left: a database that stopped answering shows here as soon as
            // the lease runs out, before the hung statement's time is up.
            let now = monotonicSeconds()
            s.connected = state.mayTakeLeases(now: now)
            s.lastError = lastError
            if state.connected == true, !s.connected, let sent = state.lastBeatSent {
                s.lastError = "no heartbeat has gone through for \(formatSeconds((now - sent).rounded())) s: "
                    + "its lease (\(formatSeconds(settings.leaseSeconds)) s) has run out"
            }
            s.wakeupsArrive = probe.verdict == .arriving
            return s
        }
    }

    /// A job the cluster knows (show, wait, graph), waiting for the database at most `timeout` seconds (nil: as
    /// long as a control request may, `controlWait`).
    public func job(_ id: String, timeout: Double? = nil) throws -> JobRecord? {
        try waitBounded(timeout ?? controlWait, on: executor, doing: "looking up job \(id)", { [store] in try await store.job(id) })
    }

    /// How long a control request (show, wait, cancel, suspend, resume) waits for the database: a statement's time
    /// while the node is connected; a quarter of a second during an outage it knows of (its loop retries the
    /// database at most 5 s apart) or once its lease has run out without a beat going through (a database that
    /// stopped answering), so that opqueuectl answers at once and says why instead of hanging with the database —
    /// and `wait --timeout 1` hears why within its second (with a whole second here, it gave up first under load).
    var controlWait: Double { lock.withLock { state.mayTakeLeases(now: monotonicSeconds()) } ? Self.statementTimeout : 0.25 }

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

    func leaseChanged(_ good: Bool) {
        let hook: (@Sendable (Bool) -> Void)? = lock.withLock {
            guard leaseGood != good else { return nil }
            leaseGood = good
            return _onLeaseChange
        }
        hook?(good)
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
            droppedSlots += r.slots.map {
                (SlotLease(queue: $0.queue, slot: $0.slot, fence: $0.fence, holder: nodeName, job: "", operation: ""), due)
            }
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
    func reportDeadline() {
        let deadline: Double?? = lock.withLock {
            let now = state.watchdogDeadline
            if reportedDeadline == .some(now) { return nil }
            reportedDeadline = .some(now)
            return .some(now)
        }
        if let deadline { onLeaseDeadline(deadline) }
    }

    func event(_ level: Logger.Level, _ message: String, _ fields: Logger.Metadata) {
        logger.log(level: level, Logger.Message(stringLiteral: message), metadata: fields)
    }
}
