// Daemon: the shell that wires the job store, the engine and the journal around the job lifecycle.
//
// What happens to a job is decided by `JobLifecycle` (Sources/JobModel/JobLifecycle.swift, a pure state machine);
// the shell performs its actions. The node's state is grouped by what guards it (SharedState.swift): the machine and
// what changes with it under one mutex, `shared`; the spool's side on one serial queue, `work`, which makes claims and
// publications in order; the fixed parts (NodeParts.swift) are made here and never replaced. Operations run on the
// engine's threads; its event batches come on one delivery thread and become journal entries and progress records.
// This file holds the state, a job's start on the engine and its graph; Daemon+Intake.swift the inbox and claims,
// Daemon+Ends.swift publication and spool faults, Daemon+Control.swift the operator's commands,
// Daemon+StoreEvents.swift the job store's calls. Which jobs this node runs, their files, and whether an end may be
// published are the `JobStore`'s (Stores/JobStore.swift: the file spool alone, or a cluster).
// At most `maxActiveJobs` jobs are claimed at once, and none while they hold `maxActiveOperations` operations; the
// rest waits in the inbox (at most that budget plus one manifest's operations are ever in memory).
// Durability is by group commit (Durability in NodeParts.swift): a publication is staged on `work`, synced, recorded
// by the store, placed on `work` (the job's place is free from then on), synced, and announced on `work`.

import DequeModule
import JobModel
import JobTracing
import Foundation
import Logging
import OperationEngine
import OperationKinds
import Synchronization

/// What the shell keeps of a job beside the lifecycle's record: its plan and the engine's view of it.
final class RunningJob: @unchecked Sendable {
    let claimed: ClaimedJob
    /// Set on `work` before the lifecycle hears `planned`; grown (photo lists) under `shared`.
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
    /// Its fused image chains, as the user sees them.
    let fusion = FusedChains()

    init(claimed: ClaimedJob) { self.claimed = claimed }
    var id: String { claimed.id }

    /// Whether an operation of the job is of `kind` (or its plan is unknown, so that it may be): only then can the
    /// job have left what that kind leaves behind (a download's folder, a command's scratch) for publication to
    /// remove — three failed unlinks per job otherwise, a few percent of a node's CPU on trivial jobs.
    func mayHave(_ kind: Kind) -> Bool { plan.map { $0.operations.contains { $0.kind == kind } } ?? true }
}

public final class Daemon: Sendable {
    /// Which jobs this node runs, their files in this node's spool, and whether their ends may be published
    /// (SpoolJobStore: all of them). The shell does nothing to a job's durable state but through it.
    public let store: any JobStore
    let logger: Logger
    let options: DaemonOptions
    let engine: Engine
    /// The engine's queue for operations that name none.
    let defaultQueue: QueueID
    /// Forwards the engine's events and the store's calls to the daemon while it lives (no reference cycle).
    let relay: Relay
    /// Metrics, traces, the operations' clock, heartbeats' progress (NodeParts.swift).
    let telemetry: Telemetry
    /// `jobFinished` runs and their markers in the spool.
    let hooks: JobHooks
    /// The group commit, progress marks, the spool's watch and the store's recording stage (NodeParts.swift).
    let durability: Durability
    /// A cluster's queue-wide slots and rates (NodeParts.swift).
    let limits: ClusterLimits

    /// What the node's threads share (control requests, the engine's delivery thread, `work`, the store's
    /// callbacks), under one mutex: the job machine and what must change with it. See SharedState.swift.
    let shared: Mutex<SharedState>
    /// Held while a group is submitted and registered with the lifecycle; `deliver` passes through it first,
    /// so a batch holding the group's first events waits for its registration. (`shared` itself is not
    /// held across a submission: `status` would wait for a million-operation graph to be adopted.)
    let registering = Mutex(())
    /// Claims and publications, in order: the spool's serial executor.
    let work: DispatchQueue
    /// What only `work` touches: the inbox's intake, publications waiting, a spool fault, delayed jobs.
    let spoolSide: WorkBound<SpoolSide>
    var onWork: SpoolSide {
        get { spoolSide.value }
        _modify { yield &spoolSide.value }
    }

    public var metrics: DaemonMetrics { telemetry.metrics }
    public var tracing: TraceExport? { telemetry.tracing }
    var once: Bool { options.once }

    struct Publication {
        let job: RunningJob
        let status: JobStatus
        let error: String?
        let records: [OperationRecord]
        /// What was removed from the job's folder before publication (EntryCheck): kept for a publication offered
        /// again after a spool fault, when the folder no longer holds it.
        var dropped: [DroppedPath] = []
    }

    /// A publication batch whose result.plist files are durable, for the store to record.
    struct Recording: Sendable {
        let batch: [Publication]
        let staged: [(publication: Publication, firstStart: Double?)]
        let ends: [JobEnd]
        let ungated: Set<String>
        let now: Double
        let hook: CommandSpec?
    }

    /// Progress lines are committed with the next claim or publication commit, or after this delay at
    /// the latest: until then a crash only makes those operations run again (at least once, never lost).
    static let progressCommitDelay = 0.05
    /// A busy node records its jobs' ends in the database at most this often, unless maxActiveJobs of them wait: one
    /// statement and commit for many (as River's completer). Those jobs hold no place meanwhile (`recording`).
    static let recordSpacing = 0.1
    /// The fewest bytes an operation takes in a manifest (binary, one-letter id and kind): claims in one
    /// batch stop once the manifests may hold the rest of the operation budget.
    static let minimumBytesPerOperation = 16
    /// When the inbox's manifests go to the store rather than run here (a cluster), at most this many per round.
    static let handOverBatch = 256
    /// Where no read lease can be taken (see Spool.claim), a manifest file must be this old before a
    /// scan (rather than an inotify close/move event) claims it, so a file still being written in place
    /// is not claimed half-written.
    static let settleSeconds = 1.0
    /// `--once`: how long a manifest present at start but still open for writing is waited for.
    package static let onceWriterWaitSeconds = 10.0

    /// `store`: where jobs come from, where their files are kept and where their ends are recorded.
    /// `beforeCommit` (tests): called on the committer's thread before each commit, which it may hold.
    public init(configuration: Configuration, configPath: String?, logger: Logger, once: Bool = false,
                store: any JobStore, beforeCommit: (@Sendable () -> Void)? = nil) {
        self.store = store
        work = DispatchQueue(label: "opqueued.spool")
        spoolSide = WorkBound(SpoolSide(), queue: work)
        options = DaemonOptions(configPath: configPath, once: once)
        self.logger = logger
        let relay = Relay()
        self.relay = relay
        let watch = SpoolWatch(folders: store.folders), progress = ProgressMarks()
        durability = Durability(
            commits: GroupCommit(label: "opqueued.commit") { [store] in
                watch.commitBegan()
                defer { watch.commitEnded() }
                beforeCommit?()
                let written = progress.written
                try store.commit()
                progress.committed(upTo: written)
            },
            progress: progress, watch: watch,
            recorder: BatchingStage(label: "opqueued.recording",
                                    pacing: .init(spacing: Self.recordSpacing, cap: configuration.maxActiveJobs,
                                                  weight: { $0.ends.count })) { [relay] waiting in
                relay.daemon?.recordEnds(waiting)
            })
        hooks = JobHooks(folders: store.folders) { [logger] job, message in
            logger.error("job \(job): \(message)", metadata: ["OPQ_JOB": .string(job), "OPQ_ERROR": .string(message)])
        }
        engine = Engine(observer: { relay.deliver($0) })
        // A store that keeps suspensions (a cluster) has not said yet which queues are suspended: nothing starts
        // until it has (a job resumed at start must not run on a queue suspended cluster-wide).
        let holdQueues = store.capabilities.contains(.keepsSuspensions)
        defaultQueue = engine.addQueue(named: "default", isSuspended: holdQueues)
        var ids: [String: QueueID] = [:]
        for name in configuration.queueNames {
            guard let q = configuration.queues[name] else { continue }
            ids[name] = engine.addQueue(named: name, maxConcurrentOperationCount: q.maxConcurrentOperationCount,
                                        qualityOfService: q.qualityOfService, isSuspended: q.suspended || holdQueues,
                                        rateLimit: q.rateLimit)
        }
        shared = Mutex(SharedState(
            configuration: configuration,
            lifecycle: JobLifecycle(maxActiveJobs: configuration.maxActiveJobs, maxActiveOperations: configuration.maxActiveOperations),
            queueIDs: ids, awaitingStoreSuspensions: holdQueues))
        // clusterMaxConcurrentOperationCount (SPEC §8): the engine runs a limited queue's operations only on
        // cluster slots this node holds. clusterRateLimit (SPEC §3.7): only on grants from the database.
        let slots = store.startSlots(engine: engine, logger: logger)
        slots?.permits.configure(Self.limitedQueues(configuration, ids))
        let grants = store.startRates(engine: engine, logger: logger)
        grants?.rates.configure(Self.ratedQueues(configuration, ids))
        limits = ClusterLimits(permits: slots?.permits, rates: grants?.rates, tasks: [slots?.task, grants?.task].compactMap { $0 })
        let metrics = DaemonMetrics()
        let tracing = Self.makeTracing(configuration, node: store.node, logger: logger, metrics: metrics)
        telemetry = Telemetry(metrics: metrics, tracing: tracing)
        relay.daemon = self
        store.delegate = relay
        // A store that leases jobs must know when the spool hangs (the file spool alone just waits for it).
        if store.capabilities.contains(.leasesJobs) {
            watch.startProbing { [weak self] in self.map { daemon in daemon.shared.withLock { !$0.lifecycle.isEmpty } } ?? false }
        }
    }

    /// The queues with a cluster-wide limit, for ClusterPermits.
    static func limitedQueues(_ config: Configuration, _ ids: [String: QueueID]) -> [String: ClusterPermits.Limited] {
        var limited: [String: ClusterPermits.Limited] = [:]
        for (name, q) in config.queues {
            if let limit = q.clusterMaxConcurrentOperationCount, let id = ids[name] { limited[name] = .init(queue: id, limit: limit) }
        }
        return limited
    }

    /// The queues with a cluster-wide rate, for ClusterRates.
    static func ratedQueues(_ config: Configuration, _ ids: [String: QueueID]) -> [String: ClusterRates.Limited] {
        var rated: [String: ClusterRates.Limited] = [:]
        for (name, q) in config.queues {
            if let rate = q.clusterRateLimit, let id = ids[name] { rated[name] = .init(queue: id, rate: rate) }
        }
        return rated
    }

    /// On `work`: enters a job into the lifecycle and reads its manifest; returns its plan, or nil when it was
    /// rejected (its result is then queued for publication).
    func receive(_ claimed: ClaimedJob, _ arrival: JobLifecycle<GroupID>.Arrival, tree: ManifestTree,
                         configuration config: Configuration) -> (RunningJob, JobPlan)? {
        let run = RunningJob(claimed: claimed)
        if case .inbox = arrival {} else { run.fromStore = true }
        let received = shared.withLock { s in
            s.runs[claimed.id] = run
            // Cancels the store kept for it are held until the group exists, and made with it (`start`).
            return s.lifecycle.received(job: claimed.id, arrival, cancels: claimed.cancels)
        }
        if case .entered(let announce?) = received { log(announce) }
        // One resumed at a restart was accepted here: a queue or command removed since does not reject it.
        let (problems, parsed) = Self.problems(tree, configuration: config, accepted: arrival == .resumed)
        guard problems.isEmpty, let plan = parsed else {
            reject(run, problems: problems, error: problems.joined(separator: "\n"))
            return nil
        }
        return (run, plan)
    }

    /// On `work`: builds a read job's graph and submits it to the engine.
    func start(_ run: RunningJob, _ plan: JobPlan, configuration config: Configuration, now: Bool = false) {
        let claimed = run.claimed
        // Only a manifest that asks to wait waits (a reception time ahead of this clock is no reason to), and not one
        // cancelled as a whole (before a restart, or while its manifest was read): a cancel ends it at once (§3.7).
        let notBefore = plan.startsAt(receivedAt: claimed.receivedAt)
        if !now, let notBefore, notBefore > Date().timeIntervalSince1970,
           shared.withLock({ $0.lifecycle.jobs[claimed.id]?.cancelsBeforeGroup.contains { $0 == nil } }) != true {
            delay(run, until: notBefore, operations: plan.operations.count)
            return
        }
        let startsAt = max(claimed.receivedAt, notBefore ?? claimed.receivedAt)
        run.plan = plan
        let graph = buildGraph(run, plan.operations, base: 0, queues: shared.withLock { $0.queueIDs }, configuration: config)
        let planned = shared.withLock { s in
            s.lifecycle.planned(job: claimed.id, operations: plan.operations.count, recovered: run.recovered.count)
        }
        guard case .submit(let announce) = planned else { return }
        if let announce { log(announce) }
        // Registered before events can be delivered for the group (see `registering`).
        let submitted = registering.withLock { _ -> Result<Lifecycle.SubmittedResult, SubmissionError> in
            do throws(SubmissionError) {
                // A delayed job's timeout counts from its notBefore (§3.7).
                let deadline = plan.timeoutSeconds.map { max(0.001, $0 - (Date().timeIntervalSince1970 - startsAt)) }
                // Cancels asked before now (while the job was read, or in the cluster before it was claimed) go in with
                // the group: none of its operations starts first. An operation the plan does not have is ignored.
                var asked: [Int?] = []
                for name in shared.withLock({ $0.lifecycle.takeEarlyCancels(job: claimed.id) }) {
                    if let name {
                        if let index = run.operationIndex[name] { asked.append(index) }
                    } else {
                        asked.append(nil)
                    }
                }
                let group = try engine.submit(consume graph, qualityOfService: plan.qualityOfService, deadline: deadline,
                                              keepOutputs: false, cancelled: asked, cancelReason: "cancelled by request")
                return .success(shared.withLock { $0.lifecycle.submitted(job: claimed.id, group: group) })
            } catch {
                return .failure(error)
            }
        }
        switch submitted {
        case .success(.running(let group, let cancels)):
            // Cancels asked since the group's were taken: their answers were given then.
            for operation in cancels {
                guard let operation else {
                    engine.cancel(group, reason: "cancelled by request")
                    continue
                }
                if cancel(job: claimed.id, group: group, operation: operation) == .unknownOperation {
                    logger.warning("job \(claimed.id): cancel of operation '\(clipped(operation))' ignored: the job has no such operation")
                }
            }
        case .success(.stray(let group)):
            engine.cancel(group, reason: "cancelled by request")
        case .failure(let error):
            reject(run, problems: error.problems, error: error.description)
        }
    }

    /// The engine's operations for `operations`, numbered from `base` in the job's group.
    /// Called with the job registered (`operationIndex` is updated here).
    func buildGraph(_ job: RunningJob, _ operations: [OperationPlan], base: Int, queues: [String: QueueID],
                    configuration config: Configuration) -> GraphBuilder {
        let claimed = job.claimed
        var graph = GraphBuilder(base: base)
        graph.reserveCapacity(operations: operations.count, dependencies: operations.count)
        for (i, op) in operations.enumerated() { job.operationIndex[op.id] = base + i }
        let environment = KindEnvironment(
            jobFolder: store.folders.job(claimed.id), downloads: store.folders.downloads(claimed.id),
            limits: DownloadLimits(maxBytes: config.downloadMaxBytes, connectTimeoutSeconds: config.downloadConnectTimeoutSeconds,
                                   timeoutSeconds: config.downloadTimeoutSeconds, fileRoots: config.fileRoots,
                                   allowNetworks: config.allowNetworks),
            maxPixels: config.maxPixels, metrics: metrics, commands: config.commands)
        func hasDownload(_ operation: String) -> Bool { access(environment.downloads + "/" + operation, F_OK) == 0 }
        // Chains of image operations ending in a write run as one strip pipeline in their last operation
        // (issue 15); each operation keeps its own record and journal transitions.
        let fused = ImageFusion.fusedOperations(operations)
        let chains = ImageFusion.chains(operations, fused: fused, index: job.operationIndex)
        let queueOf = fused.isEmpty ? [:] : Dictionary(operations.map { ($0.id, $0.queue) }, uniquingKeysWith: { a, _ in a })
        for (offset, op) in operations.enumerated() {
            let i = base + offset
            let succeeded = claimed.done[op.id] != nil
            let recovery = succeeded ? Self.recovery(of: op, environment: environment, configuration: config)
                                     : (body: nil, recompute: false)
            var recovered = recovery.body
            let recompute = recovery.recompute
            // §3.5: once the list has arrived, its graph joins the running job (before `photos` ends,
            // so the job cannot finish in between). After a restart, the list is read from its file.
            let photosURL = base == 0 && op.id == "photos" ? job.plan?.photosURL : nil
            var expandList: (@Sendable (DownloadedFile) throws -> OperationOutput?)?
            if let url = photosURL {
                expandList = { [weak self, weak job] file in
                    let photos = try Manifest.photoList(from: file.bytes, url: url)
                    guard let self, let job else { return nil }
                    try self.expand(job, with: Manifest.photoListOperations(photos, configuration: config), configuration: config)
                    return nil
                }
            }
            if let expandList, succeeded && hasDownload(op.id) {
                recovered = Kinds.restoredDownload(name: op.id, environment: environment, then: expandList)
            }
            if recovered != nil || recompute { job.recovered.insert(i) }
            if recompute { job.recomputed.insert(i) }
            var queueName = op.queue
            // A write that ends a fused chain does the chain's pixel work: on the default write queue it runs on
            // the queue (and so at the QoS) of the image operation it ends, as that work ran before.
            if case .write = op.parameters, op.dependencies.count == 1, let producer = op.dependencies.first, fused.contains(producer),
               op.queue == (config.defaultQueues[Kind.write.family] ?? "default"), let chainQueue = queueOf[producer] {
                queueName = chainQueue
            }
            let queue = queues[queueName] ?? defaultQueue
            var body: OperationBody
            if let recovered {
                body = recovered
            } else if let photosURL, let expandList {
                body = Kinds.download(photosURL, maxBytes: nil, name: op.id, environment: environment, then: expandList)
            } else {
                body = Kinds.body(for: op.parameters, operation: op.id, environment: environment, fused: fused.contains(op.id))
            }
            if let chain = chains[op.id], !chain.contains(where: { job.recovered.contains($0.index) }) {
                job.fusion.add(chain)
                body = job.fusion.watching(end: i, body)
            }
            let deps = op.dependencies.compactMap { job.operationIndex[$0] }
            var timeout = op.timeoutSeconds
            // A command's own limit holds unless the operation asks for less.
            if case .command(let name, _) = op.parameters, let limit = config.commands[name]?.timeoutSeconds {
                timeout = min(timeout ?? limit, limit)
            }
            graph.add(OperationSpec(
                name: op.id, queue: queue, qualityOfService: op.qualityOfService,
                queuePriority: op.queuePriority ?? job.plan?.queuePriority ?? .normal,
                timeout: recovered != nil ? nil : timeout, retries: recovered != nil ? 0 : op.retries, retryDelay: op.retryDelaySeconds,
                runsAfterFailure: op.runsAfterFailure, input: op.input.flatMap { job.operationIndex[$0] }, body: body), dependencies: deps)
        }
        return graph
    }


    /// What runs in place of an operation that succeeded before a restart: not run again when its output was kept — a
    /// download (its file), a written file (mapped for dependents) or no output at all. Filters kept theirs in memory
    /// only: they are computed again (`recompute`), silently (not logged, not recorded; the result keeps the first
    /// run's record).
    static func recovery(of op: OperationPlan, environment: KindEnvironment,
                         configuration config: Configuration) -> (body: OperationBody?, recompute: Bool) {
        switch op.parameters {
        case .sleep, .spin, .fail: return (.sync { _ in nil }, false)
        // (A download recorded by a version that kept it in memory has no file: it runs again.)
        case .download where access(environment.downloads + "/" + op.id, F_OK) == 0:
            return (Kinds.restoredDownload(name: op.id, environment: environment) { $0 }, false)
        case .download: return (nil, false)
        case .write(let path, _, _):
            let file = environment.jobFolder + "/" + path
            return (.sync { _ in try DownloadedFile(path: file) }, false)
        case .sepia, .grayscale, .blur, .resize, .vignette, .thumbnail: return (nil, true)
        case .command(let name, _):
            // Succeeded once accepted: a command removed from the configuration since does not make it run again.
            guard let spec = config.commands[name] else {
                return (CommandOperation.recoveredWithoutSpec(operation: op.id, folder: environment.jobFolder), false)
            }
            return (CommandOperation.recovered(spec, operation: op.id, folder: environment.jobFolder), false)
        }
    }

    /// Adds operations to a running job (the photo list of `photosURL`); they are logged like the others.
    func expand(_ job: RunningJob, with operations: [OperationPlan], configuration: Configuration) throws {
        try shared.withLock { s throws in
            guard s.lifecycle.phase(of: job.id) == .running, s.runs[job.id] === job, let group = s.lifecycle.group(of: job.id),
                  var plan = job.plan else {
                throw KindFailure(description: "the job has ended")
            }
            let base = plan.operations.count
            let recoveredBefore = job.recovered.count
            let graph = buildGraph(job, operations, base: base, queues: s.queueIDs, configuration: configuration)
            plan.operations += operations
            job.plan = plan
            s.lifecycle.extend(job: job.id, operations: operations.count, recovered: job.recovered.count - recoveredBefore)
            try engine.extend(group, with: graph)
        }
    }

    // MARK: Journal

    func event(_ level: Logger.Level, _ message: String, _ fields: Logger.Metadata, file: String = #fileID, function: String = #function,
               line: UInt = #line) {
        logger.log(level: level, Logger.Message(stringLiteral: message), metadata: fields, file: file, function: function, line: line)
    }
}

/// Progress lines written and known committed, and whether a commit of them is scheduled (Daemon.progressWasRecorded).
final class ProgressMarks: Sendable {
    struct Marks {
        var written = 0
        var committed = 0
        var scheduled = false
    }
    let marks = Mutex(Marks())

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
