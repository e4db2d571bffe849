// Daemon: the shell that wires the spool, the job store, the engine and the journal around the job lifecycle.
//
// Strategy: what happens to a job is decided by `JobLifecycle` (Lifecycle/JobLifecycle.swift, a pure state
// machine kept under `lock`); this file performs its actions: spool changes (claims, publications) on one serial
// dispatch queue, `work`, in order; operations on the engine's threads; the engine's event batches (one delivery
// thread) turned into journal entries and progress records. Which jobs this node runs, and whether an end may be
// published, is the `JobStore`'s to say (Stores/JobStore.swift: the file spool alone, or a cluster).
// At most `maxActiveJobs` jobs are claimed at once, and none while they hold `maxActiveOperations`
// operations; the rest waits in the inbox (bounded memory: at most that budget plus one manifest's
// operations, ManifestLimits.maxOperations, are ever in memory).
// Durability is by group commit (see Spool): claims made together, progress lines of one event batch,
// and publications waiting together each cost one commit, made before anything is announced. The commits run
// off `work`, on the committer's thread (Stores/GroupCommit.swift): a publication is staged on `work`, synced,
// recorded by the store (`recorder`), placed on `work`, synced, and announced on `work`.

import DequeModule
import Foundation
import Logging
import OperationEngine
import PropertyList
import CShims
import Synchronization

/// What the shell keeps of a job beside the lifecycle's record: its plan and the engine's view of it.
final class RunningJob: @unchecked Sendable {
    let claimed: ClaimedJob
    /// Set on `work` before the lifecycle hears `planned`; grown (photo lists) under the daemon's lock.
    var plan: JobPlan?
    /// Operation id → index in the group; complete once the lifecycle has heard `planned`.
    var operationIndex: [String: Int] = [:]
    /// Operations that had succeeded before a restart: not run (or, in `recomputed`, run again for
    /// their output), not logged again.
    var recovered: Set<Int> = []
    /// Filters that had succeeded before a restart and are computed again (their output was in memory):
    /// only a failure is logged.
    var recomputed: Set<Int> = []
    /// The job came from the store (claimed for this node, or resumed as held): its end goes through the store's
    /// publication gate. A manifest rejected at submission never reached the store and is published as is.
    var fromStore = false

    init(claimed: ClaimedJob) { self.claimed = claimed }
    var id: String { claimed.id }

    /// Whether an operation of the job is of `kind` (or its plan is unknown, so that it may be): only then can the
    /// job have left what that kind leaves behind (a download's folder, a command's scratch) for publication to
    /// remove — three failed unlinks per job otherwise, a few percent of a node's CPU on trivial jobs.
    func mayHave(_ kind: Kind) -> Bool { plan.map { $0.operations.contains { $0.kind == kind } } ?? true }
}

public final class Daemon: @unchecked Sendable {
    public let spool: Spool
    /// Which jobs this node runs and whether their ends may be published (SpoolJobStore: all of them).
    public let store: any JobStore
    let logger: Logger
    let configPath: String?
    private(set) var configuration: Configuration
    let engine: Engine
    private let sink: EventSink
    private let storeEvents: StoreEvents
    private let once: Bool
    /// Counters and histograms (SPEC §6); the gauges are read from `status()` when scraped.
    public let metrics = DaemonMetrics()
    /// Ready and executing times per operation, for the wait and run histograms (delivery thread only).
    private let operationClock = OperationClock()
    /// `jobFinished` runs and their markers in the spool.
    private let hooks: JobHooks

    private let lock = NSLock()
    /// Held while a group is submitted and registered with the lifecycle; `deliver` passes through it first,
    /// so a batch holding the group's first events waits for its registration. (`lock` itself is not
    /// held across a submission: `status` would wait for a million-operation graph to be adopted.)
    private let registering = NSLock()
    /// The jobs' lifecycle (under `lock`): phases, cancels, operation counts, admission.
    private var lifecycle: JobLifecycle<GroupID>
    /// The shell's side of each job in the lifecycle's table (under `lock`).
    private var runs: [String: RunningJob] = [:]
    /// Operations released since memory was last given back (`releaseMemoryIfIdle`, on `work`).
    private var releasedSinceTrim = 0
    private var lastTrim = 0.0
    private var trimScheduled = false
    private var queueIDs: [String: QueueID] = [:]
    private let defaultQueue: QueueID
    private var closedHints: Set<String> = []
    private var strangersLogged: Set<String> = []
    private var finishedWaiters: [@Sendable () -> Void] = []
    /// Inbox names to try, oldest first: the last scan's, and names inotify reported since (on `work`).
    private var inboxQueue = Deque<String>()
    /// The names in `inboxQueue`, so that a name both scanned and reported is tried once.
    private var queuedNames = Set<String>()
    private var lastRefill = 0.0
    /// The inbox is to be read whole at once: at start, after an inotify overflow, on the watcher's timer, on
    /// reload — whenever names may have arrived unreported.
    private var rescanNow = true
    /// Names were reported since the last scan: the inbox is read whole again within `rescanInterval` (inotify
    /// is a hint; the reported names themselves are tried at once, without reading the folder).
    private var rescanRequested = false
    /// The last scan kept only the oldest `scanBatch` names: the rest are read when those are gone.
    private var scanLeftSome = false
    /// Manifests waiting in the inbox at the last scan, less those claimed since (for status).
    private var waiting = 0
    /// Jobs whose outbox entries are to be published together (on `work`).
    private var publications: [Publication] = []
    /// A spool fault (file system full, no descriptors left, read-only folder, I/O error) or the job store
    /// unavailable: while it lasts nothing is claimed and publications wait in `stalled`; both are retried
    /// until the spool (and store) work again. On `work`; the lifecycle holds its reason for admission and status.
    private var fault: (what: String, since: Double)?
    private var stalled: [Publication] = []
    private var faultRetryScheduled = false
    /// Retries while the spool is faulty back off from the first to the last of these delays.
    static let faultRetryDelays = [0.25, 0.5, 1, 2]
    private var faultRetries = 0
    /// Whether the 1 s `store.want(room:)` timer is scheduled (on `work`).
    private var wantScheduled = false

    struct Publication {
        let job: RunningJob
        let status: String
        let error: String?
        let records: [OperationRecord]
    }

    /// Progress lines written / known committed, and whether a commit is scheduled.
    private let progress = ProgressMarks()
    /// Every commit of the spool, made off `work` (see GroupCommit): claims, progress, publications.
    private let commits: GroupCommit
    /// Publication batches handed to the committer and not yet announced (or stalled) (under `lock`): a stop
    /// waits for them.
    private var publishing = 0
    /// Progress lines are committed with the next claim or publication commit, or after this delay at
    /// the latest: until then a crash only makes those operations run again (at least once, never lost).
    static let progressCommitDelay = 0.05

    /// The fewest bytes an operation takes in a manifest (binary, one-letter id and kind): claims in one
    /// batch stop once the manifests may hold the rest of the operation budget.
    static let minimumBytesPerOperation = 16

    /// At most this many names are kept from one inbox scan; the rest is read at the next.
    static let scanBatch = 4096
    /// While jobs keep the daemon busy, the inbox is read again at most this often.
    static let rescanInterval = 2.0
    /// When the inbox's manifests go to the store rather than run here (a cluster), at most this many per round.
    static let handOverBatch = 256

    /// Claims and publications, in order.
    let work = DispatchQueue(label: "opqueued.spool")
    /// Where a store that records ends elsewhere (a cluster's database) is asked to: one round trip at a time for
    /// every batch that waits (so that `work` stages the next batches meanwhile, and the store's round trips are
    /// as few as the batches are many); the placing of each batch comes back to `work`.
    private let recorder: BatchingStage<Recording>

    /// A publication batch whose result.plist files are durable, for the store to record.
    struct Recording: Sendable {
        let batch: [Publication]
        let staged: [(publication: Publication, firstStart: Double?)]
        let ends: [JobEnd]
        let ungated: Set<String>
        let now: Double
        let hook: CommandSpec?
    }

    /// Where no read lease can be taken (see Spool.claim), a manifest file must be this old before a
    /// scan (rather than an inotify close/move event) claims it, so a file still being written in place
    /// is not claimed half-written.
    static let settleSeconds = 1.0
    /// Names a lease found open for writing (on `work`): tried again at once when inotify says closed.
    private var busy: Set<String> = []
    private var leaseFallbackLogged = false
    /// True until a store that keeps suspensions has said which queues are suspended (under `lock`).
    private var awaitingStoreSuspensions = false
    /// Whether a claim round waits for the store to accept submissions (on `work`).
    private var submissionRetryScheduled = false
    /// Whether the next submission round is queued on `work` (on `work`).
    private var submissionRoundPosted = false
    /// Names inotify reported since the last `scan` round began, whether they are all that arrived, and whether
    /// that round is queued (under `lock`).
    private var hintsWaiting: [String] = []
    private var hintsAreAll = true
    private var scanPosted = false
    /// Cluster slots of queues with clusterMaxConcurrentOperationCount (nil without a cluster).
    private let permits: ClusterPermits?
    private var permitsTask: Task<Void, Never>?

    /// `store`: where jobs come from and where their ends are recorded; the file spool alone by default.
    public init(spool: Spool, configuration: Configuration, configPath: String?, logger: Logger, once: Bool = false,
                store: (any JobStore)? = nil) {
        self.spool = spool
        self.store = store ?? SpoolJobStore(spool: spool)
        self.configuration = configuration
        self.configPath = configPath
        self.logger = logger
        self.once = once
        let events = StoreEvents()
        storeEvents = events
        recorder = BatchingStage(label: "opqueued.recording") { [events] waiting in events.daemon?.recordEnds(waiting) }
        commits = GroupCommit(label: "opqueued.commit") { [spool, progress] in
            let written = progress.written
            try spool.commit()
            progress.committed(upTo: written)
        }
        lifecycle = JobLifecycle(maxActiveJobs: configuration.maxActiveJobs, maxActiveOperations: configuration.maxActiveOperations)
        hooks = JobHooks(spool: spool) { [logger] job, message in
            logger.error("job \(job): \(message)", metadata: ["OPQ_JOB": .string(job), "OPQ_ERROR": .string(message)])
        }
        let sink = EventSink()
        self.sink = sink
        engine = Engine(observer: { sink.deliver($0) })
        // A store that keeps suspensions (a cluster) has not said yet which queues are suspended: nothing starts
        // until it has (a job resumed at start must not run on a queue suspended cluster-wide).
        let holdQueues = !self.store.inboxRunsHere
        awaitingStoreSuspensions = holdQueues
        defaultQueue = engine.addQueue(named: "default", isSuspended: holdQueues)
        var ids: [String: QueueID] = [:]
        for name in configuration.queueNames {
            guard let q = configuration.queues[name] else { continue }
            ids[name] = engine.addQueue(named: name, maxConcurrentOperationCount: q.maxConcurrentOperationCount,
                                        qualityOfService: q.qualityOfService, isSuspended: q.suspended || holdQueues)
        }
        queueIDs = ids
        // clusterMaxConcurrentOperationCount (SPEC §8): the engine runs a limited queue's operations only on
        // cluster slots this node holds.
        if let cluster = self.store as? ClusterJobStore, let node = cluster.node {
            let permits = ClusterPermits(store: cluster.store, node: node, leaseSeconds: cluster.settings.leaseSeconds,
                                         engine: engine, logger: logger)
            cluster.attach(permits: permits)
            permits.configure(Self.limitedQueues(configuration, ids))
            self.permits = permits
        } else {
            permits = nil
        }
        sink.daemon = self
        storeEvents.daemon = self
        self.store.delegate = storeEvents
        // On the cluster store's own executor: a blocked cooperative pool must not stall the slots either.
        if let permits, let cluster = self.store as? ClusterJobStore {
            permitsTask = Task(executorPreference: cluster.executor) { await permits.run() }
        }
    }

    /// The queues with a cluster-wide limit, for ClusterPermits.
    private static func limitedQueues(_ config: Configuration, _ ids: [String: QueueID]) -> [String: ClusterPermits.Limited] {
        var limited: [String: ClusterPermits.Limited] = [:]
        for (name, q) in config.queues {
            if let limit = q.clusterMaxConcurrentOperationCount, let id = ids[name] { limited[name] = .init(queue: id, limit: limit) }
        }
        return limited
    }

    /// Feeds the lifecycle one event (under `lock`).
    private func handle(_ event: JobLifecycle<GroupID>.Event) -> [JobLifecycle<GroupID>.Action] {
        lock.withLock { lifecycle.handle(event) }
    }

    // MARK: Start, scan, claim

    /// Resumes what a previous run left in active/ (those the store says this node still holds), then claims.
    public func start() {
        work.sync {
            let recovered: [ClaimedJob], problems: [String]
            do {
                (recovered, problems) = try spool.recover()
            } catch {
                // Without a progress log, successes could not be recorded: say so; jobs still run.
                logger.error("the progress log cannot be written: \(error); operations that succeed may run again after a restart")
                (recovered, problems) = ([], [])
            }
            for problem in problems { logger.error("\(problem)") }
            let leftovers = CommandLedger.shared.open(spool.active + "/.commands")
            if !leftovers.isEmpty { logger.notice("killed \(leftovers.count) command process groups left running by the previous run: \(leftovers.map(String.init).joined(separator: ", "))") }
            let (hook, outbox) = lock.withLock {
                (configuration.jobFinished.flatMap { configuration.commands[$0] }, configuration.cluster?.sharedOutbox ?? spool.outbox)
            }
            hooks.recover(hook, outbox: outbox)
            for claimed in store.recovered(recovered) {
                // Commands that were running at the crash start again in an empty scratch folder.
                removeTree(CommandOperation.workFolder(spool.outputFolder(job: claimed.id)))
                accept(claimed, .resumed, configuration: lock.withLock { configuration })
            }
            if once {
                // Only what is there now; a file that cannot be claimed is not waited for.
                let names = (try? spool.scanInbox(limit: Int.max).manifests) ?? []
                _ = handle(.once(names: Set(names.filter { spool.age(of: $0, now: 0) != nil })))
            }
            offerRoom()
        }
    }

    /// Looks at the inbox. `hints` are names inotify reported closed or moved in: each is tried at once
    /// (claimable at once, without reading the folder). `complete` says they are all that arrived (an event
    /// batch without overflow); otherwise (start, overflow, the watcher's timer) the folder is read whole now.
    public func scan(hints: [String] = [], complete: Bool = false) {
        // Reports that come while one waits its turn on `work` join it: a flood's inotify reads queue one round,
        // not one each (each would claim a batch ahead of the jobs the store hands over meanwhile).
        let post = lock.withLock { () -> Bool in
            if complete && hintsWaiting.count + hints.count <= Self.scanBatch {
                hintsWaiting.append(contentsOf: hints)
            } else {
                // Too many to hold, or not all that arrived: the inbox is read whole instead.
                hintsWaiting.removeAll()
                hintsAreAll = false
            }
            defer { scanPosted = true }
            return !scanPosted
        }
        guard post else { return }
        work.async { [self] in
            let (hints, complete) = lock.withLock { () -> ([String], Bool) in
                defer { hintsWaiting = []; hintsAreAll = true; scanPosted = false }
                return (hintsWaiting, hintsAreAll)
            }
            // Only names a scan would offer are kept (a hidden file written and renamed in is not).
            let names = hints.filter(Spool.isManifestName)
            lock.withLock { closedHints.formUnion(names) }
            for name in names {
                // A file found open for writing is tried again as soon as it is closed, before the others.
                if busy.remove(name) != nil { queueName(name, first: true) } else { queueName(name) }
            }
            if complete { rescanRequested = true } else { rescanNow = true }
            claimMore()
        }
    }

    /// On `work`: adds an inbox name to try, unless it is already waiting its turn. Past `scanBatch` names a
    /// reported name is left to the scan that reads the rest (a flood's names are not all held in memory).
    private func queueName(_ name: String, first: Bool = false) {
        guard queuedNames.count < Self.scanBatch || first else {
            scanLeftSome = true
            return
        }
        guard queuedNames.insert(name).inserted else { return }
        if first { inboxQueue.prepend(name) } else { inboxQueue.append(name) }
    }

    /// On `work`: tells the store how many more jobs could run here (a cluster store claims that many); while
    /// there is room, again within a second.
    private func offerRoom() {
        guard !store.inboxRunsHere else { return }
        let room: Int, budget: Int
        switch lock.withLock({ lifecycle.admission }) {
        case .room(let jobs, let operations): (room, budget) = (jobs, operations)
        case .full, .stopping, .paused: return
        }
        // The inbox's rule: a manifest of B bytes may hold B / minimumBytesPerOperation + 1 operations.
        store.want(room: room, manifestBytes: budget.multipliedReportingOverflow(by: Self.minimumBytesPerOperation).overflow
                   ? Int.max : budget * Self.minimumBytesPerOperation)
        guard !wantScheduled else { return }
        wantScheduled = true
        work.asyncAfter(deadline: .now() + 1) { [self] in
            wantScheduled = false
            offerRoom()
        }
    }

    /// On `work`: reads the inbox again, keeping the oldest names.
    private func refill() throws {
        let scan = try spool.scanInbox(limit: Self.scanBatch)
        inboxQueue = Deque(scan.manifests)
        queuedNames = Set(scan.manifests)
        lastRefill = Date().timeIntervalSince1970
        rescanNow = false
        rescanRequested = false
        scanLeftSome = scan.waiting > scan.manifests.count
        lock.lock()
        waiting = scan.waiting
        if scan.manifests.count == scan.waiting {
            // The whole inbox was read: what is remembered of names no longer there is let go, so
            // names that come and go cannot grow these sets.
            let present = Set(scan.manifests).union(scan.strangers)
            closedHints.formIntersection(present)
            strangersLogged.formIntersection(present)
        }
        let fresh = scan.strangers.filter { strangersLogged.insert($0).inserted }
        lock.unlock()
        for stranger in fresh { logger.notice("inbox/\(stranger) is not a manifest (*.plist) and is left alone") }
        for (from, to) in scan.renamed { logger.notice("inbox/\(from) was renamed inbox/\(to): its name is not UTF-8") }
    }

    /// On `work`: claims while the lifecycle admits more, then commits the claims together and accepts them
    /// (or, when the store places jobs itself, hands them to it).
    private func claimMore() {
        let runsHere = store.inboxRunsHere
        var room: Int, budget: Int
        switch lock.withLock({ lifecycle.admission }) {
        case .room(let jobs, let operations): (room, budget) = (jobs, operations)
        case .full: (room, budget) = (0, 0)
        case .stopping, .paused: return
        }
        // Manifests that go to the store do not wait for room here; they wait in the inbox until the store can
        // validate them (a cluster node that has not yet learnt what the cluster declares), tried again shortly.
        if !runsHere {
            guard store.acceptsSubmissions else {
                if !submissionRetryScheduled {
                    submissionRetryScheduled = true
                    work.asyncAfter(deadline: .now() + 0.5) { [self] in
                        submissionRetryScheduled = false
                        claimMore()
                    }
                }
                return
            }
            (room, budget) = (Self.handOverBatch, Int.max)
        }
        guard room > 0, budget > 0 else { return }
        // Operations the claimed manifests may hold, before they are parsed: no operation takes fewer
        // than this many bytes in either format.
        var mayHold = 0
        let now = Date().timeIntervalSince1970
        // An empty queue alone is no reason to read the inbox: every job's end asks for more, and reading a
        // folder that once held a flood costs all its blocks (a directory never shrinks) even when it is empty.
        if rescanNow || (inboxQueue.isEmpty && scanLeftSome) || (rescanRequested && now - lastRefill >= Self.rescanInterval) {
            do {
                try refill()
            } catch {
                spoolFailed("reading the inbox", error)
                return
            }
        }
        let onlyThese = once
        var claimed: [ClaimedJob] = []
        var settling: [String] = []
        while claimed.count < room, mayHold < budget, let name = inboxQueue.popFirst() {
            queuedNames.remove(name)
            if onlyThese {
                let allowed = lock.withLock {
                    guard lifecycle.onceAllows(name) else { return false }
                    _ = lifecycle.handle(.onceTried(name: name))
                    return true
                }
                guard allowed else { continue }
            }
            lock.lock()
            let hinted = closedHints.remove(name) != nil
            lock.unlock()
            // Used only where no lease can be had: not announced by inotify and still fresh, it may be
            // being written in place. (Not a regular file: `claim` says why it is left alone.)
            let settled = hinted || onlyThese || (spool.age(of: name, now: now) ?? Self.settleSeconds) >= Self.settleSeconds
            do {
                let changedAt = spool.changeTime(of: name)
                let outcome = runsHere ? try spool.claim(name, now: Date().timeIntervalSince1970, settled: settled, inUse: idInUse)
                    : try spool.claimForSubmission(name, now: Date().timeIntervalSince1970, settled: settled)
                switch outcome {
                case .claimed(let job):
                    busy.remove(name)
                    if let changedAt { metrics.pickedUp(after: job.receivedAt - changedAt) }
                    claimed.append(job)
                    mayHold += job.manifest.count / Self.minimumBytesPerOperation + 1
                case .busy:
                    busy.insert(name)
                case .unsettled:
                    settling.append(name)
                case .vanished:
                    busy.remove(name)
                    continue
                case .skipped(let reason):
                    lock.lock()
                    let fresh = strangersLogged.insert(name).inserted
                    lock.unlock()
                    if fresh { logger.warning("inbox/\(name) cannot be claimed: \(reason)") }
                }
            } catch {
                queueName(name, first: true)
                spoolFailed("claiming inbox/\(name)", error)
                break
            }
            if !leaseFallbackLogged, let reason = spool.leaseRefused {
                leaseFallbackLogged = true
                logger.notice("no read lease could be taken on \(reason); a manifest still open for writing is told apart by inotify's close events and \(Self.settleSeconds) s without change instead (logged once)")
            }
        }
        if !settling.isEmpty {
            work.asyncAfter(deadline: .now() + Self.settleSeconds) { [self, settling] in
                for name in settling { queueName(name) }
                claimMore()
            }
        }
        if !claimed.isEmpty {
            // Claims for the cluster need no commit: the insert is made durable by the database, and a claim the
            // disk lost leaves the same inbox file to be claimed under the same submission key.
            if runsHere {
                do {
                    try commit()
                } catch {
                    spoolFailed("committing \(claimed.count) claims (they run, and are recovered from active/ after a restart if the disk kept them)", error)
                }
            }
            lock.withLock { waiting = max(0, waiting - claimed.count) }
            receiveFromInbox(claimed)
        }
        // Manifests for the store are claimed a round at a time, each queued behind what came meanwhile (the jobs
        // the store hands over to run here, publications): a flood into this node's inbox does not hold up the
        // jobs this node runs.
        if !runsHere, !claimed.isEmpty, !inboxQueue.isEmpty || scanLeftSome, !submissionRoundPosted {
            submissionRoundPosted = true
            work.async { [self] in
                submissionRoundPosted = false
                claimMore()
            }
        }
        checkOnceDone()
    }

    /// Whether a job id is still this node's though its folder may have left active/: publication renames a job into
    /// outbox/ before its end is announced, and the user may take it from there at once. A claim never reuses such
    /// an id (the new job would be taken for the one ending, and never answered).
    func idInUse(_ id: String) -> Bool {
        lock.withLock { runs[id] != nil || lifecycle.phase(of: id) != nil }
    }

    /// On `work`: manifests just claimed from the inbox. Each is read against the store's submission
    /// configuration; one with problems is rejected here (published locally); the others go to the store,
    /// and those it returns run here with the plans just made.
    private func receiveFromInbox(_ claimed: [ClaimedJob]) {
        let config = store.submissionConfiguration(lock.withLock { configuration })
        if !store.inboxRunsHere {
            submitFromInbox(claimed, configuration: config)
            return
        }
        var accepted: [ClaimedJob] = []
        var plans: [String: (RunningJob, JobPlan)] = [:]
        for var job in claimed {
            // Each tree read at claim is let go as its job is read.
            let tree = job.tree ?? ManifestTree(job.manifest)
            job.tree = nil
            guard let (run, plan) = receive(job, .inbox(manifest: job.manifestName), tree: tree, configuration: config) else { continue }
            plans[job.id] = (run, plan)
            accepted.append(job)
        }
        guard !accepted.isEmpty else { return }
        let runHere = store.submit(accepted)
        var handedOver = Set(plans.keys)
        for job in runHere {
            guard let (run, plan) = plans[job.id] else { continue }
            handedOver.remove(job.id)
            start(run, plan, configuration: config)
        }
        for id in handedOver {
            lock.withLock {
                runs[id] = nil
                _ = lifecycle.handle(.handedOver(job: id))
            }
        }
    }

    /// On `work`: a job resumed from active/ or claimed for this node by the store: read against the local
    /// configuration and run, or rejected.
    private func accept(_ claimed: ClaimedJob, _ arrival: JobLifecycle<GroupID>.Arrival, configuration config: Configuration) {
        var claimed = claimed
        let tree = claimed.tree ?? ManifestTree(claimed.manifest)
        claimed.tree = nil
        guard let (run, plan) = receive(claimed, arrival, tree: tree, configuration: config) else { return }
        start(run, plan, configuration: config)
    }

    /// On `work`, for a store that places jobs itself: manifests claimed for submission (SPEC §8) are read against
    /// the store's submission configuration; the good ones go to the store (never registered here: they run
    /// wherever the store places them), one with problems is moved into active/ and rejected here like any other.
    private func submitFromInbox(_ claimed: [ClaimedJob], configuration: Configuration) {
        var submissions: [ClaimedJob] = []
        var config = configuration, refreshed = false
        for var job in claimed {
            let tree = job.tree ?? ManifestTree(job.manifest)
            job.tree = nil
            var (problems, plan) = Self.problems(tree, configuration: config)
            // What the cluster declares may have grown since the store last read it (a node that just joined):
            // read once more, at most once per batch, before a manifest is rejected.
            if !problems.isEmpty && !refreshed, let fresh = store.freshSubmissionConfiguration(lock.withLock({ self.configuration })) {
                refreshed = true
                config = fresh
                (problems, plan) = Self.problems(tree, configuration: config)
            }
            if problems.isEmpty {
                // The store reads the job's placement from this plan (it lets it go once the row is made).
                job.plan = plan
                let wanted = job.requestedJob ?? ""
                event(.info, "job \(wanted) received from inbox/\(job.manifestName); submitted to the cluster",
                      ["OPQ_EVENT": "job", "OPQ_STATE": "received", "OPQ_JOB": .string(wanted)])
                submissions.append(job)
                continue
            }
            do {
                guard case .claimed(var local) = try spool.promoteSubmission(job, inUse: idInUse) else { continue }
                local.tree = nil
                _ = receive(local, .inbox(manifest: local.manifestName), tree: tree, configuration: config)
            } catch {
                // Left in active/.submissions: the cluster gets it, and the node that claims it rejects it there.
                logger.error("inbox/\(job.manifestName) is rejected but cannot be moved into active/ to be published here: \(error); it goes to the cluster, where the node that claims it rejects it",
                             metadata: ["OPQ_ERROR": .string("\(error)")])
                submissions.append(job)
            }
        }
        if !submissions.isEmpty { _ = store.submit(submissions) }
    }

    /// What is wrong with a manifest under `config` (empty: nothing), and its plan when nothing is.
    private static func problems(_ tree: ManifestTree, configuration config: Configuration) -> (problems: [String], plan: JobPlan?) {
        var problems: [String] = []
        var parsed: JobPlan?
        switch Manifest.parse(tree, configuration: config) {
        case .failure(let p): problems = p.problems
        case .success(let plan): parsed = plan
        }
        if !problems.isEmpty, let asked = tree.requestedJob, !isValidIdentifier(asked), !problems.contains(where: { $0.hasPrefix("job:") }) {
            problems.append("job: '\(clipped(asked))' is not a valid job id")
        }
        return (problems, parsed)
    }

    /// On `work`: enters a job into the lifecycle and reads its manifest; returns its plan, or nil when it was
    /// rejected (its result is then queued for publication).
    private func receive(_ claimed: ClaimedJob, _ arrival: JobLifecycle<GroupID>.Arrival, tree: ManifestTree,
                         configuration config: Configuration) -> (RunningJob, JobPlan)? {
        let run = RunningJob(claimed: claimed)
        if case .inbox = arrival {} else { run.fromStore = true }
        let actions = lock.withLock {
            runs[claimed.id] = run
            return lifecycle.handle(.received(job: claimed.id, arrival))
        }
        perform(actions)
        let (problems, parsed) = Self.problems(tree, configuration: config)
        guard problems.isEmpty, let plan = parsed else {
            perform(handle(.rejected(job: claimed.id, problems: problems, error: problems.joined(separator: "\n"))), for: run)
            return nil
        }
        return (run, plan)
    }

    /// On `work`: builds a read job's graph and submits it to the engine.
    private func start(_ run: RunningJob, _ plan: JobPlan, configuration config: Configuration) {
        let claimed = run.claimed
        run.plan = plan
        let graph = buildGraph(run, plan.operations, base: 0, configuration: config)
        let actions = handle(.planned(job: claimed.id, operations: plan.operations.count, recovered: run.recovered.count))
        perform(actions)
        guard actions.contains(.submit(job: claimed.id)) else { return }
        // Registered before events can be delivered for the group (see `registering`).
        registering.lock()
        do {
            let deadline = plan.timeoutSeconds.map { max(0.001, $0 - (Date().timeIntervalSince1970 - claimed.receivedAt)) }
            let group = try engine.submit(graph, qualityOfService: plan.qualityOfService, deadline: deadline, keepOutputs: false)
            let early = handle(.submitted(job: claimed.id, group: group))
            registering.unlock()
            perform(early)
        } catch {
            registering.unlock()
            perform(handle(.rejected(job: claimed.id, problems: error.problems, error: error.description)), for: run)
        }
    }


    /// The engine's operations for `operations`, numbered from `base` in the job's group.
    /// Called with the job registered (`operationIndex` is updated here).
    private func buildGraph(_ job: RunningJob, _ operations: [OperationPlan], base: Int, configuration config: Configuration) -> GraphBuilder {
        let claimed = job.claimed
        var graph = GraphBuilder(base: base)
        graph.reserveCapacity(operations: operations.count, dependencies: operations.count)
        for (i, op) in operations.enumerated() { job.operationIndex[op.id] = base + i }
        let environment = KindEnvironment(
            jobFolder: spool.outputFolder(job: claimed.id), downloads: spool.downloadsFolder(job: claimed.id),
            limits: DownloadLimits(maxBytes: config.downloadMaxBytes, connectTimeoutSeconds: config.downloadConnectTimeoutSeconds,
                                   timeoutSeconds: config.downloadTimeoutSeconds, fileRoots: config.fileRoots, allowNetworks: config.allowNetworks),
            maxPixels: config.maxPixels, metrics: metrics, commands: config.commands)
        func hasDownload(_ operation: String) -> Bool { access(environment.downloads + "/" + operation, F_OK) == 0 }
        // Chains of image operations ending in a write run as one strip pipeline in their last operation
        // (issue 15); each operation keeps its own record and journal transitions.
        let fused = ImageFusion.fusedOperations(operations)
        let queueOf = Dictionary(operations.map { ($0.id, $0.queue) }, uniquingKeysWith: { a, _ in a })
        for (offset, op) in operations.enumerated() {
            let i = base + offset
            // What succeeded before a restart is not run again when its output was kept: a download (its
            // file), a written file (mapped for dependents) or no output at all. Filters kept theirs in
            // memory only: they are computed again, silently (`recomputed`: not logged, not recorded; the
            // result keeps the first run's record).
            let succeeded = claimed.done[op.id] != nil
            var recovered: OperationBody?
            var recompute = false
            if succeeded {
                switch op.parameters {
                case .sleep, .spin, .fail: recovered = .sync { _ in nil }
                // (A download recorded by a version that kept it in memory has no file: it runs again.)
                case .download where hasDownload(op.id):
                    recovered = Kinds.restoredDownload(name: op.id, environment: environment) { $0 }
                case .download: break
                case .write(let path, _, _):
                    let file = environment.jobFolder + "/" + path
                    recovered = .sync { _ in try DownloadedFile(path: file) }
                case .sepia, .grayscale, .blur, .resize, .vignette, .thumbnail: recompute = true
                case .command(let name, _):
                    recovered = config.commands[name].map { CommandOperation.recovered($0, operation: op.id, folder: environment.jobFolder) }
                }
            }
            // §3.5: once the list has arrived, its graph joins the running job (before `photos` ends,
            // so the job cannot finish in between). After a restart, the list is read from its file.
            let photosURL = base == 0 && op.id == "photos" ? job.plan?.photosURL : nil
            let expandList: @Sendable (DownloadedFile) throws -> OperationOutput? = { [weak self, weak job] file in
                let photos = try Manifest.photoList(from: file.bytes, url: photosURL ?? "")
                guard let self, let job else { return nil }
                try self.expand(job, with: Manifest.photoListOperations(photos, configuration: config), configuration: config)
                return nil
            }
            if photosURL != nil && succeeded && hasDownload(op.id) { recovered = Kinds.restoredDownload(name: op.id, environment: environment, then: expandList) }
            if recovered != nil || recompute { job.recovered.insert(i) }
            if recompute { job.recomputed.insert(i) }
            var queueName = op.queue
            // A write that ends a fused chain does the chain's pixel work: on the default write queue it runs on
            // the queue (and so at the QoS) of the image operation it ends, as that work ran before.
            if case .write = op.parameters, op.dependencies.count == 1, let producer = op.dependencies.first, fused.contains(producer),
               op.queue == (config.defaultQueues[Kind.write.family] ?? "default"), let chainQueue = queueOf[producer] {
                queueName = chainQueue
            }
            let queue = queueIDs[queueName] ?? defaultQueue
            let body: OperationBody
            if let recovered {
                body = recovered
            } else if let photosURL {
                body = Kinds.download(photosURL, maxBytes: nil, name: op.id, environment: environment, then: expandList)
            } else {
                body = Kinds.body(for: op.parameters, operation: op.id, environment: environment, fused: fused.contains(op.id))
            }
            let deps = op.dependencies.compactMap { job.operationIndex[$0] }
            var timeout = op.timeoutSeconds
            // A command's own limit holds unless the operation asks for less.
            if case .command(let name, _) = op.parameters, let limit = config.commands[name]?.timeoutSeconds { timeout = min(timeout ?? limit, limit) }
            graph.add(OperationSpec(
                name: op.id, queue: queue, qualityOfService: op.qualityOfService, queuePriority: op.queuePriority ?? job.plan?.queuePriority ?? .normal,
                timeout: recovered != nil ? nil : timeout, retries: recovered != nil ? 0 : op.retries, retryDelay: op.retryDelaySeconds,
                runsAfterFailure: op.runsAfterFailure, input: op.input.flatMap { job.operationIndex[$0] }, body: body), dependencies: deps)
        }
        return graph
    }


    /// Adds operations to a running job (the photo list of `photosURL`); they are logged like the others.
    private func expand(_ job: RunningJob, with operations: [OperationPlan], configuration: Configuration) throws {
        lock.lock()
        defer { lock.unlock() }
        guard lifecycle.phase(of: job.id) == .running, runs[job.id] === job, let group = lifecycle.group(of: job.id), var plan = job.plan else {
            throw KindFailure(description: "the job has ended")
        }
        let base = plan.operations.count
        let recoveredBefore = job.recovered.count
        let graph = buildGraph(job, operations, base: base, configuration: configuration)
        plan.operations += operations
        job.plan = plan
        _ = lifecycle.handle(.extended(job: job.id, operations: operations.count, recovered: job.recovered.count - recoveredBefore))
        try engine.extend(group, with: graph)
    }

    // MARK: Performing the lifecycle's actions

    /// Performs `actions` in order (outside `lock`). `run` and `records` are the job a publication is for and its
    /// engine records, when the caller has them; `submit` and `answer` are the caller's to act on.
    private func perform(_ actions: [JobLifecycle<GroupID>.Action], for run: RunningJob? = nil, records: [OperationRecord] = []) {
        for action in actions {
            switch action {
            case .journal(let entry):
                log(entry)
            case .submit, .answer:
                break
            case .cancelGroup(let group):
                engine.cancel(group, reason: "cancelled by request")
            case .cancelOperation(let job, let group, let operation):
                // Only a cancel asked before the group existed comes here: its answer was given then.
                if cancel(job: job, group: group, operation: operation) == .unknownOperation {
                    logger.warning("job \(job): cancel of operation '\(clipped(operation))' ignored: the job has no such operation")
                }
            case .publish(let job, let status, let error):
                guard let run = run ?? lock.withLock({ runs[job] }) else { continue }
                enqueuePublication(Publication(job: run, status: status, error: error, records: records))
            case .releaseGroup(let group):
                engine.release(group)
            case .discard(let job):
                spool.discard(job: job)
            }
        }
    }

    private func log(_ entry: JobLifecycle<GroupID>.JournalEntry) {
        switch entry {
        case .received(let job, let manifest):
            event(.info, "job \(job) received from inbox/\(manifest)", ["OPQ_EVENT": "job", "OPQ_STATE": "received", "OPQ_JOB": .string(job)])
        case .claimed(let job, let fromNode):
            var fields: Logger.Metadata = ["OPQ_EVENT": "job", "OPQ_STATE": "claimed", "OPQ_JOB": .string(job)]
            if let fromNode { fields["OPQ_FROM_NODE"] = .string(fromNode) }
            event(.info, "job \(job) claimed\(fromNode.map { " (taken over from node \($0))" } ?? "")", fields)
        case .accepted(let job, let operations):
            event(.info, "job \(job) accepted: \(operations) operations", ["OPQ_EVENT": "job", "OPQ_STATE": "accepted", "OPQ_JOB": .string(job)])
        case .rejected(let job, let problems, let error):
            event(.error, "job \(job) rejected: \(problems.joined(separator: "; "))",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "rejected", "OPQ_JOB": .string(job), "OPQ_STATUS": "rejected", "OPQ_ERROR": .string(error)])
        case .lost(let job, let reason):
            event(.warning, "job \(job) lost: \(reason); it is stopped here and nothing is published for it",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "lost", "OPQ_JOB": .string(job), "OPQ_ERROR": .string(reason)])
        }
    }

    // MARK: Engine events

    /// On the engine's delivery thread: journal entries, durable progress, job ends.
    fileprivate func deliver(_ events: [EngineEvent]) {
        // A submission under way may have put its group's first events in this batch.
        registering.withLock {}
        var progressRecorded = 0
        defer { if progressRecorded > 0 { progressWasRecorded(progressRecorded) } }
        for engineEvent in events {
            switch engineEvent {
            case .transition(let t):
                lock.lock()
                let job = lifecycle.job(of: t.group).flatMap { runs[$0] }
                let plan = job?.plan
                let recovered = job?.recovered.contains(t.operation) ?? true
                let recomputedFailure = t.state == .failed && job?.recomputed.contains(t.operation) == true
                if job != nil, !recovered, t.state == .succeeded || t.state == .failed || t.state == .cancelled {
                    _ = lifecycle.handle(.operationEnded(group: t.group))
                }
                lock.unlock()
                if let permits, let plan, t.operation < plan.operations.count { permits.transition(queue: plan.operations[t.operation].queue, state: t.state) }
                guard let job, let plan, t.operation < plan.operations.count, !recovered || recomputedFailure else { continue }
                if !recovered { measure(t, plan.operations[t.operation]) }
                if logTransition(t, job: job, operation: plan.operations[t.operation]) { progressRecorded += 1 }
            case .groupFinished(let group):
                work.async { [self] in finish(group) }
            }
        }
    }


    /// On the delivery thread: the metrics an operation's transition moves.
    private func measure(_ t: Transition, _ operation: OperationPlan) {
        switch t.state {
        case .ready:
            _ = operationClock.mark(t.group, t.operation, at: t.time, executing: false)
        case .executing:
            if let ready = operationClock.mark(t.group, t.operation, at: t.time, executing: true), !ready.executing {
                metrics.waited(queue: operation.queue, seconds: t.time - ready.time)
            }
        case .retrying, .succeeded, .failed, .cancelled:
            // Only an attempt that was executing ran (a cancel of a ready operation ends it from `ready`).
            if let last = operationClock.end(t.group, t.operation), last.executing { metrics.ran(kind: operation.kind.rawValue, seconds: t.time - last.time) }
            guard t.state != .retrying else { break }
            metrics.operationEnded(kind: operation.kind.rawValue, queue: operation.queue, state: t.state.name)
        default:
            break
        }
    }

    /// Progress lines were written: make sure a commit covers them soon.
    private func progressWasRecorded(_ lines: Int) {
        guard progress.wrote(lines) else { return }
        work.asyncAfter(deadline: .now() + Self.progressCommitDelay) { [self] in
            guard progress.takeSchedule() else { return }
            commits.after { [logger] outcome in
                if case .failure(let error) = outcome {
                    logger.error("committing progress failed: \(error); operations that succeeded may run again after a restart")
                }
            }
        }
    }

    /// Waits for one group commit of the spool (it also covers every progress line written before it).
    private func commit() throws {
        try commits.now()
    }

    private func logTransition(_ t: Transition, job: RunningJob, operation: OperationPlan) -> Bool {
        var recorded = false
        var fields: Logger.Metadata = [
            "OPQ_EVENT": "operation", "OPQ_STATE": .string(t.state.name), "OPQ_JOB": .string(job.id), "OPQ_OPERATION": .string(operation.id),
            "OPQ_KIND": .string(operation.kind.rawValue), "OPQ_QUEUE": .string(operation.queue), "OPQ_QOS": .string(t.qualityOfService.name),
            "OPQ_QUEUE_PRIORITY": .string((operation.queuePriority ?? job.plan?.queuePriority ?? .normal).name),
        ]
        if t.attempt > 0 { fields["OPQ_ATTEMPT"] = .string(String(t.attempt)) }
        if let error = t.error { fields["OPQ_ERROR"] = .string(error) }
        var level = Logger.Level.info
        var message = "operation \(job.id)/\(operation.id) \(t.state.name)"
        switch t.state {
        case .succeeded, .failed, .cancelled:
            if let record = engine.record(t.group, operation: t.operation) {
                if let started = record.startedAt { fields["OPQ_DURATION_USEC"] = .string(String(Int64(((t.time - started) * 1e6).rounded()))) }
                if t.state == .succeeded, let started = record.startedAt {
                    do {
                        try spool.recordSuccess(job: job.id, operation: operation.id, record: DoneRecord(startedAt: started, finishedAt: t.time, attempts: record.attempts))
                        recorded = true
                    } catch {
                        // Until the fault is over, operations that succeed may run again after a restart.
                        work.async { [self] in spoolFailed("recording the success of \(job.id)/\(operation.id)", error) }
                    }
                }
            }
            if t.state == .failed { level = .error }
            if t.state == .cancelled { level = .warning }
        case .retrying:
            level = .warning
        default:
            break
        }
        if let error = t.error { message += ": \(error)" }
        event(level, message, fields)
        return recorded
    }


    // MARK: Ends

    /// On `work`: a group has finished; its job's outbox entry is published with the next batch (a lost job's
    /// group is released and its folder discarded instead).
    private func finish(_ group: GroupID) {
        let run = lock.withLock { lifecycle.job(of: group).flatMap { runs[$0] } }
        guard let run else {
            perform(handle(.groupFinished(group: group, status: "cancelled", error: nil)))
            return
        }
        guard let records = engine.records(group) else { return }
        var status = "succeeded"
        var errors: [String] = []
        for (i, r) in records.enumerated() where !run.recovered.contains(i) || r.state != .succeeded {
            if r.state == .failed { status = "failed" }
            if r.state != .succeeded { errors.append("\(r.name): \(r.error ?? r.state.name)") }
        }
        if status != "failed" && records.contains(where: { $0.state == .cancelled }) { status = "cancelled" }
        perform(handle(.groupFinished(group: group, status: status, error: errors.isEmpty ? nil : errors.joined(separator: "\n"))),
                for: run, records: records)
    }

    /// On `work`: the first publication of a batch schedules the batch; later ones join it.
    private func enqueuePublication(_ publication: Publication) {
        publications.append(publication)
        if publications.count == 1 { work.async { [self] in publishPending() } }
    }

    /// On `work`: write every pending result.plist, commit, have the store record the ends, move the entries
    /// it recorded to the outbox, commit, then announce them.
    private func publishPending() {
        // A job lost while its publication waited is no longer in the table: nothing is published for it.
        let batch = lock.withLock {
            publications.filter { publication in
                let phase = lifecycle.phase(of: publication.job.id)
                return runs[publication.job.id] === publication.job && (phase == .finishing || phase == .rejected)
            }
        }
        publications = []
        guard !batch.isEmpty else {
            // What waited was lost meanwhile: nothing is left to retry.
            if stalled.isEmpty, fault != nil, let made = try? spool.probe() {
                logRemade(made)
                spoolWorked()
                claimMore()
            }
            return
        }
        let now = Date().timeIntervalSince1970
        var staged: [(publication: Publication, firstStart: Double?)] = []
        var results: [String: [UInt8]] = [:]
        let keepsResults = !store.inboxRunsHere
        let hook = lock.withLock { configuration.jobFinished.flatMap { configuration.commands[$0] } }
        let node = store.node
        for publication in batch {
            if hook != nil {
                do {
                    try hooks.markDue(job: publication.job.id, status: publication.status)
                } catch {
                    // The hook still runs after publication; only a crash before it would lose it.
                    logger.error("job \(publication.job.id): the jobFinished marker could not be written: \(error)")
                }
            }
            // Commands' scratch and kept outputs are the daemon's, not part of the entry.
            if publication.job.mayHave(.command) { CommandOperation.removeScratch(spool.outputFolder(job: publication.job.id)) }
            var publication = publication
            do {
                var firstStart: Double?
                let origin = store.origin(of: publication.job.id)
                // A store that keeps the result gets the bytes as written (not read back from the file).
                var kept: [UInt8]? = keepsResults && publication.job.fromStore ? [] : nil
                func stage(_ publication: Publication) throws {
                    kept = kept.map { _ in [] }
                    try spool.stage(job: publication.job.id) { sink in
                        firstStart = try ResultWriter.write(job: publication.job, status: publication.status, error: publication.error,
                                                            records: publication.records, now: now, origin: origin, node: node) { bytes in
                            kept?.append(contentsOf: bytes)
                            try sink(bytes)
                        }
                    }
                }
                do {
                    try stage(publication)
                } catch let error as SpoolError where error.errno == ENOENT && !spool.hasFolder(job: publication.job.id) {
                    // Someone removed active/<job> while the job ran: the manifest comes back from memory and the
                    // job ends failed, saying so (what its operations wrote there is gone), instead of waiting for a
                    // folder that will never come back.
                    try spool.restoreFolder(job: publication.job.id, manifest: publication.job.claimed.manifest)
                    let why = "active/\(publication.job.id) was removed while the job ran (not by the daemon): its manifest is restored, what its operations wrote there is lost"
                    publication = Publication(job: publication.job, status: publication.status == "succeeded" ? "failed" : publication.status,
                                              error: [publication.error, why].compactMap { $0 }.joined(separator: "\n"), records: publication.records)
                    logger.error("job \(publication.job.id): \(why)", metadata: ["OPQ_JOB": .string(publication.job.id)])
                    try stage(publication)
                }
                if let kept { results[publication.job.id] = kept }
                staged.append((publication, firstStart))
            } catch {
                stall(publication, error)
            }
        }
        // result.plist made durable off `work` (which stages the next batch meanwhile), then the ends recorded.
        lock.withLock { publishing += 1 }
        commits.after { [self, staged, results] outcome in
            switch outcome {
            case .success:
                record(batch, staged, results: results, now: now, hook: hook)
            case .failure(let error):
                // result.plist is not known to be durable: nothing moves yet.
                work.async { [self] in
                    for entry in staged { stall(entry.publication, error) }
                    publicationEnded()
                }
            }
        }
    }

    /// On the committer's thread, a batch's result.plist files durable: the store records the ends, then `place`
    /// on `work`. The publication gate: only the ends the store recorded are placed; the others were lost. A
    /// manifest rejected at submission (it never reached a cluster store) is this node's to publish.
    private func record(_ batch: [Publication], _ staged: [(publication: Publication, firstStart: Double?)], results: [String: [UInt8]],
                        now: Double, hook: CommandSpec?) {
        let allGated = store.inboxRunsHere
        let gated = staged.filter { allGated || $0.publication.job.fromStore }
        let ungated = Set(staged.lazy.filter { !(allGated || $0.publication.job.fromStore) }.map { $0.publication.job.id })
        let ends = gated.map { entry in
            let job = entry.publication.job.id
            return JobEnd(job: job, status: entry.publication.status, resultFile: spool.stagedResult(job: job), result: results[job])
        }
        if ends.isEmpty || allGated {
            // The spool's own store records nothing elsewhere: at once.
            let recorded = ends.isEmpty ? .success(ungated) : Result { try store.complete(ends) }
            work.async { [self] in place(batch, staged, recorded: recorded, now: now, hook: hook) }
        } else {
            // A remote store: off the committer (which syncs the next batches meanwhile); each job stays
            // `finishing` until its batch is placed.
            recorder.add(Recording(batch: batch, staged: staged, ends: ends, ungated: ungated, now: now, hook: hook))
        }
    }

    /// On the recorder's queue: every batch that waited, recorded by the store in one round trip.
    fileprivate func recordEnds(_ waiting: [Recording]) {
        let result = Result { try store.complete(waiting.flatMap(\.ends)) }
        for r in waiting {
            let recorded = result.map { $0.union(r.ungated) }
            work.async { [self] in place(r.batch, r.staged, recorded: recorded, now: r.now, hook: r.hook) }
        }
    }

    /// On `work`: a publication batch handed to the committer was announced or stalled.
    private func publicationEnded() {
        lock.withLock { publishing -= 1 }
    }

    /// On `work`: the second half of a publication batch, once the store answered: the recorded ends are placed
    /// in the outbox and committed, the others were lost; a store that could not answer stalls the batch.
    private func place(_ batch: [Publication], _ staged: [(publication: Publication, firstStart: Double?)],
                       recorded answer: Result<Set<String>, any Error>, now: Double, hook: CommandSpec?) {
        let recorded: Set<String>
        switch answer {
        case .success(let ids): recorded = ids
        case .failure(let error):
            // Not known whether the store recorded them: they wait, as in a spool fault, and are offered again.
            for entry in staged { stalled.append(entry.publication) }
            spoolFailed("recording \(staged.count) job ends in the job store", error)
            publicationEnded()
            return
        }
        var placed: [(publication: Publication, firstStart: Double?, entry: String)] = []
        for entry in staged {
            guard recorded.contains(entry.publication.job.id) else {
                perform(handle(.lost(job: entry.publication.job.id, reason: "the job store did not record its end (another node holds it)")))
                lock.withLock { runs[entry.publication.job.id] = nil }
                continue
            }
            do {
                // SPEC §8 sharedOutbox: assembled under sharedOutbox/.tmp/ and renamed into place there.
                let id = entry.publication.job.id
                let shared = lock.withLock { configuration.cluster?.sharedOutbox }
                let name = try shared.map { try spool.placeShared(job: id, in: $0) } ?? spool.place(job: id, inUse: idInUse)
                let folder = shared ?? spool.outbox
                if name != id {
                    logger.warning("job \(id): \(folder)/\(id) was taken by something else after the job was claimed (left as it is); the job's entry is \(folder)/\(name)",
                                   metadata: ["OPQ_JOB": .string(id)])
                }
                placed.append((entry.publication, entry.firstStart, folder + "/" + name))
            } catch {
                stall(entry.publication, error)
            }
        }
        // The renames made durable off `work`, then announced.
        commits.after { [self, placed] outcome in
            work.async { [self] in announce(batch, placed, committed: outcome, now: now, hook: hook) }
        }
    }

    /// On `work`: the last step of a publication batch, its outbox renames committed (or not: then they stand,
    /// whole, and only their durability is in doubt): each job finished is announced and leaves the lifecycle.
    private func announce(_ batch: [Publication], _ placed: [(publication: Publication, firstStart: Double?, entry: String)],
                          committed: Result<Void, any Error>, now: Double, hook: CommandSpec?) {
        defer { publicationEnded() }
        switch committed {
        case .success:
            // Every step of the batch worked (and nothing waits from an earlier one): a fault is over.
            if stalled.isEmpty { spoolWorked() }
        case .failure(let error):
            // The entries are in the outbox already (whole, by rename); only the renames' durability is in doubt,
            // and a rename the disk lost leaves the job in active/, published again at the next start.
            spoolFailed("committing \(placed.count) outbox entries (a crash before the disk recovers republishes them at the next start)", error)
        }
        for (publication, firstStart, entry) in placed {
            let job = publication.job
            // Its downloads are no longer needed once the entry is out of active/ (a crash before this
            // leaves them to recovery, which removes the folders of jobs no longer active).
            if job.mayHave(.download) { spool.discardDownloads(job: job.id) }
            var fields: Logger.Metadata = ["OPQ_EVENT": "job", "OPQ_STATE": "finished", "OPQ_JOB": .string(job.id), "OPQ_STATUS": .string(publication.status)]
            if let firstStart { fields["OPQ_DURATION_USEC"] = .string(String(Int64(((now - firstStart) * 1e6).rounded()))) }
            if let error = publication.error { fields["OPQ_ERROR"] = .string(error) }
            metrics.jobEnded(status: publication.status)
            if publication.status != "rejected" {
                event(publication.status == "succeeded" ? .info : publication.status == "failed" ? .error : .warning,
                      "job \(job.id) finished: \(publication.status)", fields)
            }
            let actions = lock.withLock {
                runs[job.id] = nil
                return lifecycle.handle(.published(job: job.id))
            }
            perform(actions)
            if let hook { hooks.run(hook, job: job.id, status: publication.status, entry: entry) }
        }
        do {
            try spool.compactProgressIfLarge(active: lock.withLock { Set(runs.keys) })
        } catch {
            logger.error("rewriting the progress log failed: \(error); it keeps growing until the next start")
        }
        checkOnceDone()
        claimMore()
        offerRoom()
        releaseMemoryIfIdle(released: batch.reduce(0) { $0 + ($1.job.plan?.operations.count ?? 0) })
    }

    /// On `work`: once nothing is active, memory freed by the jobs that ended (a big manifest's tree, plan
    /// and records) goes back to the system — glibc keeps freed pages otherwise, and RSS would stay at
    /// the high-water mark. At most every 5 s, or sooner after 10,000 operations; an idle moment that
    /// comes sooner is followed by a trim once the 5 s are up, if still idle then.
    private func releaseMemoryIfIdle(released: Int) {
        releasedSinceTrim += released
        guard lock.withLock({ lifecycle.isEmpty }) else { return }
        let now = Date().timeIntervalSince1970
        if releasedSinceTrim >= 10_000 || now - lastTrim >= 5 {
            releasedSinceTrim = 0
            lastTrim = now
            opq_release_free_memory()
        } else if !trimScheduled {
            trimScheduled = true
            work.asyncAfter(deadline: .now() + max(0.1, 5 - (now - lastTrim))) { [self] in
                trimScheduled = false
                releaseMemoryIfIdle(released: 0)
            }
        }
    }

    // MARK: Spool faults

    /// On `work`: a publication could not be completed; it waits in active/ and is retried.
    private func stall(_ publication: Publication, _ error: any Error) {
        stalled.append(publication)
        spoolFailed("publishing outbox/\(publication.job.id)", error)
    }

    /// On `work`: a spool operation failed. The first failure of a fault is logged, claiming pauses,
    /// and a retry is scheduled; nothing is lost (claimed jobs stay in active/, the rest in the inbox).
    private func spoolFailed(_ what: String, _ error: any Error) {
        if fault == nil {
            fault = (what, Date().timeIntervalSince1970)
            _ = handle(.fault("\(what) failed: \(error)"))
            logger.error("\(what) failed: \(error); claiming is paused and publication waits until the spool works again (retried every few seconds)")
        }
        scheduleFaultRetry()
    }

    /// On `work`: the spool worked; if a fault was on, it is over.
    private func spoolWorked() {
        guard let fault else { return }
        self.fault = nil
        faultRetries = 0
        _ = handle(.fault(nil))
        let seconds = String(format: "%.1f", Date().timeIntervalSince1970 - fault.since)
        logger.notice("the spool works again after \(seconds) s (\(fault.what) had failed); claiming resumes")
    }

    private func scheduleFaultRetry() {
        guard !faultRetryScheduled else { return }
        faultRetryScheduled = true
        let delay = Self.faultRetryDelays[min(faultRetries, Self.faultRetryDelays.count - 1)]
        faultRetries += 1
        work.asyncAfter(deadline: .now() + delay) { [self] in
            faultRetryScheduled = false
            guard fault != nil else { return }
            do {
                logRemade(try spool.probe())
            } catch {
                scheduleFaultRetry()
                return
            }
            if stalled.isEmpty {
                spoolWorked()
                claimMore()
                offerRoom()
            } else {
                // Publication retried first; success there ends the fault (and claims more).
                publications = stalled + publications
                stalled = []
                publishPending()
            }
        }
    }

    /// The spool's folders a fault's probe made again: someone removed them while the daemon ran.
    private func logRemade(_ folders: [String]) {
        for folder in folders {
            logger.warning("\(folder) was missing from the spool (removed while the daemon ran): made again")
        }
    }

    private func checkOnceDone() {
        guard once else { return }
        lock.lock()
        let idle = lifecycle.onceDone
        let waiters = idle ? finishedWaiters : []
        if idle { finishedWaiters = [] }
        lock.unlock()
        for waiter in waiters { waiter() }
    }

    /// For `--once`: returns when every job claimed at start (and recovered) has ended.
    public func runOnce() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            lock.withLock { finishedWaiters.append { continuation.resume() } }
            scan()
        }
    }

    // MARK: Reload and stop

    /// SIGHUP: re-reads the configuration and applies queue settings to running work.
    public func reload() {
        event(.info, "reloading the configuration", ["OPQ_EVENT": "daemon", "OPQ_STATE": "reloading"])
        do {
            let loaded = try configPath.map { try Configuration.load(path: $0, regularOnly: true) } ?? .builtIn
            // Only a reload replaces the configuration, and reloads come one at a time.
            let previous = lock.withLock { configuration }
            let (config, kept) = try Configuration.reloaded(loaded, running: previous)
            lock.lock()
            configuration = config
            _ = lifecycle.handle(.configured(maxActiveJobs: config.maxActiveJobs, maxActiveOperations: config.maxActiveOperations))
            let shared = storeSuspended
            let held = awaitingStoreSuspensions
            lock.unlock()
            for name in config.queueNames {
                guard let q = config.queues[name] else { continue }
                let suspended = q.suspended || shared.contains(name) || held
                if let id = queueIDs[name] {
                    engine.updateQueue(id, maxConcurrentOperationCount: q.maxConcurrentOperationCount, qualityOfService: q.qualityOfService, isSuspended: suspended)
                } else {
                    queueIDs[name] = engine.addQueue(named: name, maxConcurrentOperationCount: q.maxConcurrentOperationCount, qualityOfService: q.qualityOfService, isSuspended: suspended)
                }
                if previous.queues[name]?.suspended != q.suspended { logQueue(name, suspended: q.suspended) }
            }
            store.reload(config)
            permits?.configure(Self.limitedQueues(config, queueIDs))
            if !kept.isEmpty {
                logger.warning("\(kept.joined(separator: ", ")) changed: kept as this node started until it is restarted (the rest of the configuration is reloaded)")
            }
        } catch {
            logger.error("the configuration was not reloaded: \(error)")
        }
        event(.info, "ready", ["OPQ_EVENT": "daemon", "OPQ_STATE": "ready"])
        scan()
    }

    /// SIGTERM: claims nothing more and starts nothing new; executing operations get `grace` seconds;
    /// unfinished jobs stay in active/ and resume at the next start.
    public func stop(grace: Double) async {
        _ = handle(.stopping)
        event(.info, "stopping", ["OPQ_EVENT": "daemon", "OPQ_STATE": "stopping"])
        for id in queueIDs.values { engine.updateQueue(id, isSuspended: true) }
        let deadline = Date().addingTimeInterval(grace)
        while engine.executingCount > 0 && Date() < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
        // Commands still running after the grace would outlive the daemon and run beside their own re-run.
        ChildProcess.killAll()
        // Let publications of jobs that finished during the grace complete.
        try? await Task.sleep(for: .milliseconds(50))
        work.sync { publishPending() }
        // …and what is with the committer or the store: announced before the store goes (bounded by the store's
        // own statement timeout, and a stalled batch counts as ended).
        let published = Date().addingTimeInterval(2 * ClusterJobStore.statementTimeout)
        while lock.withLock({ publishing > 0 }) && Date() < published {
            try? await Task.sleep(for: .milliseconds(5))
        }
        permitsTask?.cancel()
        await permitsTask?.value
        store.shutdown()
    }

    /// `suspend`/`resume` from a client: the store's when it keeps them (a cluster: every node follows), else here.
    public func suspend(queue name: String, _ suspended: Bool) -> Bool {
        guard let id = queueIDs[name] else { return false }
        if store.setSuspended(name, suspended) {
            lock.withLock { localSuspensions[name] = nil }
            return true
        }
        // Here only (the file spool), or until the store can record it (a cluster whose database is away): it holds
        // on this node whatever the store says meanwhile.
        lock.withLock { localSuspensions[name] = suspended }
        engine.updateQueue(id, isSuspended: suspended)
        logQueue(name, suspended: suspended)
        return true
    }

    /// `suspend`/`resume` acted on here while the store could not record them (under `lock`); each goes once the
    /// store's set agrees with it.
    private var localSuspensions: [String: Bool] = [:]

    /// The queues the store says are suspended cluster-wide (under `lock`).
    private var storeSuspended: Set<String> = []

    private func logQueue(_ name: String, suspended: Bool) {
        event(.info, "queue \(name) \(suspended ? "suspended" : "resumed")", ["OPQ_EVENT": "queue", "OPQ_STATE": suspended ? "suspended" : "resumed", "OPQ_QUEUE": .string(name)])
    }

    // MARK: Control

    public enum CancelOutcome: Equatable {
        case cancelled, unknownJob, unknownOperation, alreadyEnded
        /// Not running here, and the job store that would know cannot answer now (the cluster's database is
        /// down): the client may try again; it is not told the job is unknown.
        case unavailable(String)
    }

    /// `cancel` from a client: a job running here is cancelled here; any other is the store's to answer.
    public func cancel(job id: String, operation: String?) -> CancelOutcome {
        switch cancelHere(job: id, operation: operation) {
        case .some(let outcome):
            return outcome
        case .none:
            switch store.requestCancel(job: id, operation: operation) {
            case .requested: return .cancelled
            case .unknownJob: return .unknownJob
            case .alreadyEnded: return .alreadyEnded
            case .unavailable(let reason):
                logger.warning("cancel of job \(id): the job store cannot answer now: \(reason)")
                return .unavailable(reason)
            }
        }
    }

    /// Cancels a job in the lifecycle's table; nil when it is not there.
    private func cancelHere(job id: String, operation: String?) -> CancelOutcome? {
        let actions = lock.withLock {
            // The operation index is complete once the plan is read (phase accepted or later); before, unknown.
            let phase = lifecycle.phase(of: id)
            let known = phase != nil && phase != .received && operation.map { runs[id]?.operationIndex[$0] != nil } ?? true
            return lifecycle.handle(.cancel(job: id, operation: operation, knownOperation: known))
        }
        var outcome: CancelOutcome?
        for action in actions {
            switch action {
            case .cancelGroup(let group):
                engine.cancel(group, reason: "cancelled by request")
            case .cancelOperation(let job, let group, let operation):
                outcome = cancel(job: job, group: group, operation: operation)
            case .answer(.notHere):
                return nil
            case .answer(.cancelled):
                outcome = outcome ?? .cancelled
            case .answer(.unknownOperation):
                outcome = .unknownOperation
            case .answer(.alreadyEnded):
                outcome = .alreadyEnded
            default:
                perform([action])
            }
        }
        return outcome ?? .cancelled
    }

    /// Cancels one operation of a submitted group (the engine knows whether it has already ended).
    private func cancel(job: String, group: GroupID, operation: String) -> CancelOutcome {
        guard let index = lock.withLock({ runs[job]?.operationIndex[operation] }) else { return .unknownOperation }
        if engine.record(group, operation: index)?.state.isFinished == true { return .alreadyEnded }
        engine.cancel(group, operation: index, reason: "cancelled by request")
        return .cancelled
    }

    public struct Status: Sendable {
        public var activeJobs: [String]
        public var waiting: Int
        public var executing: Int
        /// Operations of the active jobs, and the budget above which claiming pauses.
        public var operations: Int
        public var maxActiveOperations: Int
        public var queues: [QueueSnapshot]
        /// The spool fault claiming waits on, if any.
        public var fault: String?
        /// Each active job's progress, by id.
        public var jobs: [JobProgress] = []
    }

    public struct JobProgress: Sendable {
        public var job: String
        /// Operations in its plan (0 while it is being read, and for a rejected job).
        public var operations: Int
        /// Operations that have ended, however (succeeded before a restart included).
        public var ended: Int
    }

    public func status() -> Status {
        lock.lock()
        let active = lifecycle.jobs.keys.sorted()
        let waitingNow = waiting
        let fault = lifecycle.fault
        let operations = lifecycle.activeOperations, budget = configuration.maxActiveOperations
        let progress = lifecycle.jobs.map { id, job in JobProgress(job: id, operations: job.operations, ended: job.ended + job.recovered) }
        lock.unlock()
        let overview = engine.overview()
        return Status(activeJobs: active, waiting: waitingNow, executing: overview.executing, operations: operations,
                      maxActiveOperations: budget, queues: overview.queues, fault: fault, jobs: progress.sorted { $0.job < $1.job })
    }


    /// The metrics in the Prometheus text format, the gauges read now (`opqueuectl metrics`, GET /metrics).
    public func metricsText() -> String {
        // The engine resolves -1 to the online CPUs, as here.
        metrics.text(status(), processorCount: max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))))
    }

    /// Sets the allocator's thresholds for a long-running process (see `opq_tune_allocator`); call once,
    /// first thing.
    public static func tuneAllocator() { opq_tune_allocator() }

    /// Raises the soft limit of open files to the hard one (at most 65,536) when it is lower: each control
    /// connection costs a descriptor, and a burst of idle clients must not leave none for the spool's own
    /// files. Call once, first thing.
    public static func raiseFileLimit() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
        let wanted = min(limit.rlim_max, 65_536)
        guard limit.rlim_cur < wanted else { return }
        limit.rlim_cur = wanted
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }

    /// The SIGTERM or SIGINT noted while starting (opqueued notes them from before main: COpqueuedStart), or 0.
    public static var notedTerminationSignal: Int32 { opq_noted_termination_signal() }

    /// `--once`: SIGTERM, SIGINT and SIGHUP get their default actions back (what came meanwhile is raised again).
    public static func defaultTerminationSignals() { opq_default_termination_signals() }

    /// Whether a SIGHUP came while starting (noted, not the end of the process; the reload service reloads once).
    public static var notedHangup: Bool { opq_noted_hangup() != 0 }

    /// Bytes the allocator has handed out and not had back (a diagnostic: when this stays flat while RSS
    /// grows, the allocator is keeping freed memory; when it grows, something is held). It walks the
    /// allocator's free lists, so status computes it only when asked.
    public var heapBytesInUse: Int { Int(clamping: opq_heap_bytes_in_use()) }

    /// An active job's operations, for `show`.
    public func show(job id: String) -> [[String: Any]]? {
        lock.lock()
        let job = runs[id]
        let group = lifecycle.group(of: id)
        lock.unlock()
        guard let job, let plan = job.plan, let group, let records = engine.records(group) else { return nil }
        return zip(plan.operations, records).map { op, r in
            var entry: [String: Any] = ["id": op.id, "kind": op.kind.rawValue, "queue": op.queue, "state": r.state.name, "attempts": r.attempts,
                                        "dependencies": op.dependencies]
            if let s = r.startedAt { entry["startedAt"] = s }
            if let f = r.finishedAt { entry["finishedAt"] = f }
            if let e = r.error { entry["error"] = e }
            return entry
        }
    }

    // MARK: Journal

    func event(_ level: Logger.Level, _ message: String, _ fields: Logger.Metadata, file: String = #fileID, function: String = #function, line: UInt = #line) {
        logger.log(level: level, Logger.Message(stringLiteral: message), metadata: fields, file: file, function: function, line: line)
    }
}

// MARK: The store's calls (any thread; each hops onto `work`)

/// The shell as the store's delegate (its own object: the delegate's `cancel(job:operation:)` would collide with
/// the control plane's). Weak, like `EventSink`: the daemon owns the store.
final class StoreEvents: JobStoreDelegate, @unchecked Sendable {
    weak var daemon: Daemon?
    func run(_ jobs: [ClaimedJob]) { daemon?.storeRun(jobs) }
    func lost(_ jobs: [String], reason: String) { daemon?.storeLost(jobs, reason: reason) }
    func cancel(job: String, operation: String?) { daemon?.storeCancel(job: job, operation: operation) }
    func suspendedQueuesChanged(_ queues: Set<String>) { daemon?.storeSuspendedQueuesChanged(queues) }
    func spoolFailed(_ what: String, _ error: any Error) { daemon?.storeSpoolFailed(what, error) }
    func holds(job: String) -> Bool { daemon?.idInUse(job) ?? false }
}

extension Daemon {
    fileprivate func storeRun(_ jobs: [ClaimedJob]) {
        work.async { [self] in
            // Rows are input: each is read against this node's configuration, a bad one ends `rejected` here.
            let config = lock.withLock { configuration }
            for job in jobs {
                accept(job, .claimed(fromNode: store.origin(of: job.id)?.fromNode), configuration: config)
            }
        }
    }

    fileprivate func storeLost(_ jobs: [String], reason: String) {
        work.async { [self] in
            for job in jobs {
                let actions = lock.withLock {
                    runs[job] = nil
                    return lifecycle.handle(.lost(job: job, reason: reason))
                }
                perform(actions)
            }
            checkOnceDone()
            claimMore()
            offerRoom()
        }
    }

    fileprivate func storeSpoolFailed(_ what: String, _ error: any Error) {
        work.async { [self] in spoolFailed(what, error) }
    }

    fileprivate func storeCancel(job: String, operation: String?) {
        work.async { [self] in _ = cancelHere(job: job, operation: operation) }
    }

    fileprivate func storeSuspendedQueuesChanged(_ queues: Set<String>) {
        work.async { [self] in
            let (config, previous, first, stopping, local) = lock.withLock {
                defer { storeSuspended = queues; awaitingStoreSuspensions = false }
                let stopping: Bool
                if case .stopping = lifecycle.admission { stopping = true } else { stopping = false }
                // A local suspension or resumption the store now agrees with is the store's again.
                for (name, asked) in localSuspensions where queues.contains(name) == asked { localSuspensions[name] = nil }
                return (configuration, storeSuspended, awaitingStoreSuspensions, stopping, localSuspensions)
            }
            // Draining (SIGTERM): every queue stays suspended.
            if stopping { return }
            if first {
                // The queues held at start are let go, but for those suspended here or cluster-wide.
                if config.queues["default"] == nil { engine.updateQueue(defaultQueue, isSuspended: queues.contains("default")) }
                for name in config.queueNames {
                    guard let id = queueIDs[name], let q = config.queues[name] else { continue }
                    let suspended = q.suspended || (local[name] ?? queues.contains(name))
                    engine.updateQueue(id, isSuspended: suspended)
                    if suspended && !q.suspended { logQueue(name, suspended: true) }
                }
                return
            }
            // A queue suspended in this node's configuration stays suspended; one acted on here while the store was
            // away keeps that until the store agrees.
            for name in config.queueNames where previous.contains(name) != queues.contains(name) && local[name] == nil {
                guard let id = queueIDs[name], let q = config.queues[name] else { continue }
                engine.updateQueue(id, isSuspended: q.suspended || queues.contains(name))
                logQueue(name, suspended: queues.contains(name))
            }
        }
    }
}

/// Breaks the reference cycle engine → observer → daemon → engine.
final class EventSink: @unchecked Sendable {
    weak var daemon: Daemon?
    func deliver(_ events: [EngineEvent]) { daemon?.deliver(events) }
}

/// Progress lines written and known committed, and whether a commit of them is scheduled (Daemon.progressWasRecorded).
private final class ProgressMarks: Sendable {
    private struct Marks {
        var written = 0
        var committed = 0
        var scheduled = false
    }
    private let marks = Mutex(Marks())

    var written: Int { marks.withLock { $0.written } }

    /// Counts `lines` written; true when no commit of them is scheduled yet (the caller schedules one).
    func wrote(_ lines: Int) -> Bool {
        marks.withLock { m in
            m.written += lines
            defer { m.scheduled = true }
            return !m.scheduled
        }
    }

    /// The scheduled commit is due: true when lines are written that no commit has covered yet.
    func takeSchedule() -> Bool {
        marks.withLock { m in
            m.scheduled = false
            return m.written > m.committed
        }
    }

    func committed(upTo written: Int) {
        marks.withLock { $0.committed = max($0.committed, written) }
    }
}
