// The shell's operator side (see Daemon.swift): reload, stop, suspend and resume, cancel, status, metrics, show.

import Foundation
import JobModel
import Logging
import OperationEngine
import ControlPlane
import CShims
import OperationKinds
import SpoolFiles
import SystemCalls

extension Daemon {
    // MARK: Reload and stop

    /// SIGHUP: re-reads the configuration and applies queue settings to running work.
    public func reload() {
        event(.info, "reloading the configuration", ["OPQ_EVENT": "daemon", "OPQ_STATE": "reloading"])
        do {
            let loaded = try options.configPath.map { try Configuration.load(path: $0, regularOnly: true) } ?? .builtIn
            // Only a reload replaces the configuration, and reloads come one at a time.
            let previous = shared.withLock { $0.configuration }
            let (config, kept) = try Configuration.reloaded(loaded, running: previous)
            let (changes, suspensions) = shared.withLock { s in
                s.configuration = config
                s.lifecycle.configure(maxActiveJobs: config.maxActiveJobs, maxActiveOperations: config.maxActiveOperations)
                return (Self.suspensionChanges(config, previous: previous, local: &s.localSuspensions),
                        (local: s.localSuspensions, store: s.storeSuspended, held: s.awaitingStoreSuspensions))
            }
            var added: [String: QueueID] = [:]
            let known = shared.withLock { $0.queueIDs }
            for name in config.queueNames {
                guard let q = config.queues[name] else { continue }
                let suspended = (suspensions.local[name] ?? q.suspended) || suspensions.store.contains(name) || suspensions.held
                if let id = known[name] {
                    engine.updateQueue(id, maxConcurrentOperationCount: q.maxConcurrentOperationCount, qualityOfService: q.qualityOfService,
                                       isSuspended: suspended, rateLimit: .some(q.rateLimit))
                } else {
                    added[name] = engine.addQueue(named: name, maxConcurrentOperationCount: q.maxConcurrentOperationCount,
                                                  qualityOfService: q.qualityOfService, isSuspended: suspended, rateLimit: q.rateLimit)
                }
            }
            let queueIDs = shared.withLock { s in
                s.queueIDs.merge(added) { old, _ in old }
                return s.queueIDs
            }
            for (name, suspended) in changes { logQueue(name, suspended: suspended) }
            store.reload(config)
            work.async { [self] in configureSchedules(config) }
            limits.permits?.configure(Self.limitedQueues(config, queueIDs))
            limits.rates?.configure(Self.ratedQueues(config, queueIDs))
            if !kept.isEmpty {
                logger.warning("""
                    \(kept.joined(separator: ", ")) changed: kept as this node started until it is restarted \
                    (the rest of the configuration is reloaded)
                    """)
            }
        } catch {
            logger.error("the configuration was not reloaded: \(error)")
        }
        event(.info, "ready", ["OPQ_EVENT": "daemon", "OPQ_STATE": "ready"])
        scan()
    }

    /// An operator's `suspend` or `resume` here stands until the configuration changes that queue's `suspended` (the
    /// newer word wins) or the daemon restarts: a reload for another reason (a limit, a command) must not resume a
    /// queue suspended for maintenance, nor suspend one resumed by hand. Returns the queues whose state changes.
    static func suspensionChanges(_ config: Configuration, previous: Configuration,
                                  local: inout [String: Bool]) -> [(String, Bool)] {
        var changes: [(String, Bool)] = []
        for name in config.queueNames {
            guard let q = config.queues[name] else { continue }
            let was = local[name] ?? previous.queues[name]?.suspended ?? false
            if previous.queues[name]?.suspended != q.suspended { local[name] = nil }
            let now = local[name] ?? q.suspended
            if now != was { changes.append((name, now)) }
        }
        return changes
    }

    /// SIGTERM: claims nothing more and starts nothing new; executing operations get `grace` seconds;
    /// unfinished jobs stay in active/ and resume at the next start. A cluster node first hands back the jobs none
    /// of whose operations started, so that other nodes run them now (the rest resume here at a restart, or run
    /// elsewhere once the lease has run out).
    public func stop(grace: Double) async {
        shared.withLock { $0.lifecycle.stop() }
        event(.info, "stopping", ["OPQ_EVENT": "daemon", "OPQ_STATE": "stopping"])
        for id in shared.withLock({ $0.queueIDs.values }) { engine.updateQueue(id, isSuspended: true) }
        handBackUnstarted()
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
        while shared.withLock({ $0.publishing > 0 }) && Date() < published {
            try? await Task.sleep(for: .milliseconds(5))
        }
        await limits.stop()
        store.shutdown()
        durability.watch.stop()
    }

    /// The jobs none of whose operations has started (every queue is suspended by now: none will) go back to the
    /// cluster; here they are lost (`lost`, nothing published, their folders removed).
    private func handBackUnstarted() {
        // No claim after this (a claim under way has given its jobs to `work` when it returns): the list below is whole,
        // and what is handed back is not claimed again here.
        store.stopClaiming()
        let candidates = work.sync { () -> [String] in
            let running = shared.withLock { s in s.runs.keys.map { ($0, s.lifecycle.group(of: $0)) } }
            return running.compactMap { id, group in
                guard let group, let records = engine.records(group), !records.isEmpty,
                      records.allSatisfy({ $0.attempts == 0 && !$0.state.isFinished }) else { return nil }
                return id
            }
        }
        let released = store.handBack(candidates)
        if released.isEmpty { return }
        logger.notice("cluster: \(released.count) job(s) none of whose operations had started handed back to the cluster at stop")
        storeLost(released.sorted(), reason: "handed back to the cluster at stop, none of its operations started")
        work.sync {}
    }

    /// What a manifest submitted here may name, as the daemon validates it (`opqueuectl submit` asks): this node's
    /// queues and commands (each with its signature), and in a cluster those any node declares (SPEC §8); and the
    /// file roots its `file://` downloads are checked against (this node's own, also in a cluster).
    public func submissionNames() -> (queues: [String], commands: [String: String], fileRoots: [String]) {
        let config = store.submissionConfiguration(shared.withLock { $0.configuration })
        var commands: [String: String] = [:]
        for (name, spec) in config.commands where !spec.isHookOnly { commands[name] = CommandSignature.encode(spec) }
        return (config.queueNames, commands, config.fileRoots)
    }

    /// `suspend`/`resume` from a client: the store's when it keeps them (a cluster: every node follows), else here.
    public func suspend(queue name: String, _ suspended: Bool) -> Bool {
        guard let id = shared.withLock({ $0.queueIDs[name] }) else { return false }
        if store.setSuspended(name, suspended) {
            shared.withLock { $0.localSuspensions[name] = nil }
            return true
        }
        // Here only (the file spool), or until the store can record it (a cluster whose database is away): it holds
        // on this node whatever the store says meanwhile.
        shared.withLock { $0.localSuspensions[name] = suspended }
        engine.updateQueue(id, isSuspended: suspended)
        logQueue(name, suspended: suspended)
        return true
    }

    func logQueue(_ name: String, suspended: Bool) {
        event(.info, "queue \(name) \(suspended ? "suspended" : "resumed")",
              ["OPQ_EVENT": "queue", "OPQ_STATE": suspended ? "suspended" : "resumed", "OPQ_QUEUE": .string(name)])
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
        // A parked delayed job (out of the table) comes back into it first, on `work`, where no claim is half done.
        // Only the spool parks jobs: a cluster node's count of parked jobs is 0.
        if shared.withLock({ $0.lifecycle.phase(of: id) == nil && $0.lifecycle.parkedCount > 0 }), hasActiveFolder(id) {
            work.sync { unparkForCancel(id) }
        }
        switch cancelHere(job: id, operation: operation, answering: true) {
        case .some(let outcome):
            // Also where a node taking the job over reads it (a cluster's database), before the client is answered.
            if outcome == .cancelled, let reason = store.shareCancel(job: id, operation: operation) {
                logger.warning("""
                    cancel of job \(id): made here, but the job store cannot record it for a takeover now: \(reason); \
                    tried again while this node runs
                    """)
            }
            return outcome
        case .none:
            switch store.requestCancel(job: id, operation: operation) {
            case .requested: return .cancelled
            case .unknownJob: return .unknownJob
            case .unknownOperation: return .unknownOperation
            case .alreadyEnded: return .alreadyEnded
            case .unavailable(let reason):
                logger.warning("cancel of job \(id): the job store cannot answer now: \(reason)")
                return .unavailable(reason)
            }
        }
    }

    /// Cancels a job in the lifecycle's table, or one claimed and not yet received; nil when it is not there. A cancel
    /// is recorded in the job's progress: if the job resumes after a restart, it is made again before any operation
    /// starts (§2), and a job cancelled whole ends cancelled without running anything. One operation's cancel is
    /// recorded once the engine has said it was made (it may answer that the operation had ended); `answering` (a
    /// client waits for the answer), it is committed before it is answered, as a whole job's is (a cancel from the
    /// store is kept by the store: it waits for the next group commit).
    func cancelHere(job id: String, operation: String?, answering: Bool = false) -> CancelOutcome? {
        let outcome = applyCancelHere(job: id, operation: operation)
        if outcome == .cancelled, let operation, recordCancel(job: id, operation: operation), answering {
            commitCancel(job: id, operation: operation)
        }
        return outcome
    }

    /// Records a cancel (durable at the commit it asks for); false when that failed. Should it fail, the cancel holds
    /// while this run lasts, and the spool's fault is handled as a failed success record's is.
    private func recordCancel(job: String, operation: String?) -> Bool {
        do {
            try store.recordCancel(job: job, operation: operation, at: Date().timeIntervalSince1970)
            progressWasRecorded(1)
            return true
        } catch {
            work.async { [self] in spoolFailed("recording the cancel of \(job)/\(operation ?? "*")", error) }
            return false
        }
    }

    /// Waits for the group commit that makes a recorded cancel durable (shared with whatever else is being committed).
    private func commitCancel(job: String, operation: String?) {
        do {
            try commit()
        } catch {
            work.async { [self] in spoolFailed("committing the cancel of \(job)/\(operation ?? "*")", error) }
        }
    }

    /// A whole job's cancel of a job held here (its folder in active/, not rejected) is recorded and committed before
    /// anything acts on it: the job may end at once, and nothing may say it was cancelled (its operations' journal
    /// entries, its outbox entry, the client's answer) before that is durable. One group commit, shared with whatever
    /// else is being committed; a line for a job that ends otherwise meanwhile is dropped with its other lines.
    private func recordJobCancel(_ id: String) {
        guard shared.withLock({ $0.lifecycle.phase(of: id) != .rejected }), hasActiveFolder(id) else { return }
        if recordCancel(job: id, operation: nil) { commitCancel(job: id, operation: nil) }
    }

    private func applyCancelHere(job id: String, operation: String?) -> CancelOutcome? {
        if operation == nil { recordJobCancel(id) }
        if let kept = cancelBeforeReceipt(job: id, operation: operation) { return kept }
        let result = shared.withLock { s in
            // The operation index is complete once the plan is read (phase accepted or later); before, unknown.
            let phase = s.lifecycle.phase(of: id)
            let known = phase != nil && phase != .received && operation.map { s.runs[id]?.operationIndex[$0] != nil } ?? true
            return s.lifecycle.cancel(job: id, operation: operation, knownOperation: known)
        }
        switch result {
        case .notHere: return nil
        case .alreadyEnded: return .alreadyEnded
        case .unknownOperation: return .unknownOperation
        case .kept: return .cancelled
        case .wake(let job):
            // Its early cancel ends every operation before any runs.
            work.async { [self] in wakeDelayed(job) }
            return .cancelled
        case .cancelGroup(let group):
            engine.cancel(group, reason: "cancelled by request")
            return .cancelled
        case .cancelOperation(let job, let group, let operation):
            return cancel(job: job, group: group, operation: operation)
        }
    }

    /// A job claimed from the inbox and not yet received (its manifest being read): the cancel is kept and applied
    /// as it is received, as one that comes before its group is (an operation's id is checked then). Nil when the
    /// job is not such a one: in the lifecycle's table (received meanwhile), not here, or on a cluster node, whose
    /// cancel of a job not in its table goes to the database, which reaches the job wherever it is.
    private func cancelBeforeReceipt(job id: String, operation: String?) -> CancelOutcome? {
        guard !store.capabilities.contains(.placesJobs), shared.withLock({ $0.lifecycle.phase(of: id) == nil }), hasActiveFolder(id) else {
            return nil
        }
        guard shared.withLock({ $0.lifecycle.keepCancelBeforeReceipt(job: id, operation: operation) }) else { return nil }
        // Unless the job came and went between the looks (received, run and published: its folder gone, the cancel
        // not taken).
        if !hasActiveFolder(id), shared.withLock({ $0.lifecycle.dropCancelsBeforeReceipt(job: id) }) { return nil }
        return .cancelled
    }

    /// Cancels one operation of a submitted group (the engine knows whether it has already ended).
    func cancel(job: String, group: GroupID, operation: String) -> CancelOutcome {
        let run = shared.withLock { $0.runs[job] }
        guard let run, let index = shared.withLock({ _ in run.operationIndex[operation] }) else { return .unknownOperation }
        // A fused operation whose stage its chain's end runs still: cancelling it cancels that run (FusedChains).
        if let end = run.fusion.endHolding(index) {
            engine.cancel(group, operation: end, reason: "cancelled by request")
            return .cancelled
        }
        if engine.record(group, operation: index)?.state.isFinished == true { return .alreadyEnded }
        engine.cancel(group, operation: index, reason: "cancelled by request")
        return .cancelled
    }

    public struct Status: Sendable {
        public var activeJobs: [String]
        /// Manifests waiting in the inbox at the last scan, and those the store holds until it takes them (a
        /// cluster node's submissions while the database is away).
        public var waiting: Int
        /// Of those, the ones a cluster node took from its inbox and holds until the database takes them, and when the
        /// oldest was taken (while it knows the database is away it takes no more: they wait in the inbox).
        public var submissions = 0
        public var submissionsSince: Double?
        public var executing: Int
        /// Operations of the active jobs, and the budget above which claiming pauses.
        public var operations: Int
        public var maxActiveOperations: Int
        public var queues: [QueueSnapshot]
        /// The spool fault claiming waits on, if any.
        public var fault: String?
        /// Each active job's progress, by id.
        public var jobs: [JobProgress] = []
        /// Queues suspended only because this node has not yet read the cluster's suspensions (it holds every queue
        /// from its start until it has): none once it has, and none without a cluster.
        public var held: Set<String> = []
        /// Queues with `clusterMaxConcurrentOperationCount`, by name: none without a cluster.
        public var clusterSlots: [String: ClusterSlots] = [:]
        /// Each schedule (§3.7): its cron, zone and next occurrence (epoch seconds; nil: none within years).
        public var schedules: [(name: String, cron: String, zone: String, next: Double?)] = []
        /// Delayed jobs (§3.7), and of those the ones parked out of memory: not in `activeJobs` nor `jobs`, which
        /// list the earliest.
        public var delayed = 0
        public var parked = 0
    }

    /// A queue's cluster-wide slots as this node sees them.
    public struct ClusterSlots: Sendable, Equatable {
        /// `clusterMaxConcurrentOperationCount`.
        public var limit: Int
        /// Slots this node holds now: at most this many of the queue's operations execute here.
        public var held: Int
        /// The priority this node's wait for a slot is recorded at, while it waits (it wants more than it holds).
        public var waitingAt: QueuePriority? = nil
    }

    public struct JobProgress: Sendable {
        public var job: String
        /// Operations in its plan (0 while it is being read, and for a rejected job).
        public var operations: Int
        /// Operations that have ended, however (succeeded before a restart included).
        public var ended: Int
        /// A delayed job's start time (§3.7).
        public var notBefore: Double?
    }

    public func status() -> Status {
        var (status, configured) = shared.withLock { s in
            let parked = s.lifecycle.parkedCount
            let progress = s.lifecycle.jobs.map { id, job in
                JobProgress(job: id, operations: job.operations, ended: job.ended + job.recovered, notBefore: job.notBefore)
            }
            let status = Status(activeJobs: s.lifecycle.jobs.keys.sorted(), waiting: s.waiting, executing: 0,
                                operations: s.lifecycle.activeOperations, maxActiveOperations: s.configuration.maxActiveOperations,
                                queues: [], fault: s.lifecycle.fault, jobs: progress, held: s.heldQueues,
                                schedules: Self.scheduleRows(s.schedules), delayed: s.lifecycle.delayedCount + parked, parked: parked)
            return (status, Set(["default"] + s.configuration.queueNames))
        }
        status.jobs.sort { $0.job < $1.job }
        let overview = engine.overview()
        status.executing = overview.executing
        // A queue a reload removed stays in the engine (a re-added one takes its place again): shown while operations
        // of it remain, then no longer (in status and the metrics' gauges).
        status.queues = overview.queues.filter { configured.contains($0.name) || $0.pending + $0.executing > 0 }
        // Manifests the store holds for submission still wait, as far as the user can tell (read outside `shared`).
        status.submissions = store.awaitingSubmission
        status.waiting += status.submissions
        status.submissionsSince = status.submissions > 0 ? store.awaitingSubmissionSince : nil
        status.clusterSlots = limits.permits?.slots ?? [:]
        return status
    }

    /// Each schedule for `status`: its cron, zone and next occurrence.
    private static func scheduleRows(_ book: ScheduleBook) -> [(name: String, cron: String, zone: String, next: Double?)] {
        book.entries.sorted { $0.key < $1.key }.map { name, entry in
            (name, entry.settings.cron.expression.description, entry.settings.cron.zone.name, entry.next.map(Double.init))
        }
    }

    /// The metrics in the Prometheus text format, the gauges read now (`opqueuectl metrics`, GET /metrics).
    public func metricsText() -> String {
        // The engine resolves -1 to the online CPUs, as here.
        metrics.text(status(), cluster: store.snapshot(),
                     processorCount: max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))))
    }

    /// Sets the allocator's thresholds for a long-running process (see `opq_tune_allocator`); call once,
    /// first thing.
    public static func tuneAllocator() { opq_tune_allocator() }

    /// Makes libdispatch open its timer descriptors now, one for each of its clocks (the uptime clock of
    /// `DispatchTime`, the monotonic one of `ContinuousClock` sleeps, the wall clock of `DispatchWallTime`): it
    /// opens a clock's timerfd the first time a timer on that clock is programmed and keeps it for the life of the
    /// process. Left to chance, that first time can come when no descriptor is free — the open fails, and timers on
    /// that clock are silently never armed (`Task.sleep` would not return: no status line, no watchdog ping) — or
    /// in the instant a listener has given up its reserve descriptor for a waiting client, which the timer then
    /// takes for good, leaving the client unanswered and the listener retrying accept. Call once at start, before
    /// the servers.
    ///
    /// Timers far in the future are armed on the two dispatch clocks and kept until this process's descriptor
    /// table shows a timerfd on every clock (at most 2 s), then cancelled: a timer due at once is not always
    /// programmed at all — on a loaded machine its deadline has passed by the time libdispatch looks, and it fires
    /// without a timerfd (seen in CI: the wall clock's was missing).
    public static func openTimerClocks() async {
        let far = DispatchTimeInterval.seconds(3600)
        let uptime = DispatchSource.makeTimerSource(queue: .global())
        uptime.schedule(deadline: .now() + far)
        uptime.setEventHandler {}
        uptime.activate()
        let wall = DispatchSource.makeTimerSource(queue: .global())
        wall.schedule(wallDeadline: .now() + far)
        wall.setEventHandler {}
        wall.activate()
        // The continuous clock's, through a sleep (a short one is programmed: the sleeping task waits on it).
        let deadline = monotonicSeconds() + 2
        repeat {
            try? await Task.sleep(for: .milliseconds(1))
        } while !timerClocks().isSuperset(of: [CLOCK_REALTIME, CLOCK_MONOTONIC, CLOCK_BOOTTIME].map(Int.init)) &&
            monotonicSeconds() < deadline
        uptime.cancel()
        wall.cancel()
    }

    /// The clocks (`clockid` in /proc/PROCESS/fdinfo: 0 realtime, 1 monotonic, 7 boot time) of a process's open
    /// timerfds; `process` a pid, or "self".
    public static func timerClocks(process: String = "self") -> Set<Int> {
        var clocks: Set<Int> = []
        let proc = "/proc/" + process
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: proc + "/fd") else { return clocks }
        for name in names {
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: proc + "/fd/" + name), target.contains("timerfd"),
                  case .success(let info) = readRegularFile(proc + "/fdinfo/" + name, limit: 4096),
                  let line = String(decoding: info, as: UTF8.self).split(separator: "\n").first(where: { $0.hasPrefix("clockid:") }),
                  let clock = Int(line.dropFirst("clockid:".count).trimmingCharacters(in: .whitespaces)) else { continue }
            clocks.insert(clock)
        }
        return clocks
    }

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

    /// /dev/null on whichever of descriptors 0, 1 and 2 is closed, before anything else opens one (see CShims.h):
    /// opqueuectl's first step (opqueued's constructor does it before main).
    public static func openStandardDescriptors() { opq_open_standard_descriptors() }

    /// `--once`: SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 get their default actions back (what came meanwhile is
    /// raised again).
    public static func defaultTerminationSignals() { opq_default_termination_signals() }

    /// Whether a SIGHUP came while starting (noted, not the end of the process; the signal service reloads once).
    public static var notedHangup: Bool { opq_noted_hangup() != 0 }

    /// The signal numbers of SIGUSR1 and SIGUSR2 if they came while starting (noted, as SIGHUP is).
    public static var notedUserSignals: [Int32] {
        let noted = opq_noted_user_signals()
        return [(1, SIGUSR1), (2, SIGUSR2)].filter { noted & $0.0 != 0 }.map(\.1)
    }

    /// Bytes the allocator has handed out and not had back (a diagnostic: when this stays flat while RSS
    /// grows, the allocator is keeping freed memory; when it grows, something is held). It walks the
    /// allocator's free lists, so status computes it only when asked.
    public var heapBytesInUse: Int { Int(clamping: opq_heap_bytes_in_use()) }

    /// The running jobs' operations for this node's next heartbeat (ClusterProgress): `show` on other nodes.
    func clusterProgress() -> [UInt8] {
        // The plans copied under `shared` (a photo list's grows under it).
        let running = shared.withLock { s in s.runs.map { ($0.key, $0.value, $0.value.plan, s.lifecycle.group(of: $0.key)) } }
        var jobs: [(job: String, operations: [ClusterProgress.Operation])] = []
        var left = ClusterProgress.budget
        for (id, run, plan, group) in running {
            guard let plan, let group else { continue }
            // Too big for what is left: not even read from the engine.
            if ClusterProgress.estimate(operations: plan.operations.count, idBytes: 0) > left { continue }
            guard let records = records(group, of: run) else { continue }
            let operations = zip(plan.operations, records).map { (id: $0.id, state: $1.state, attempts: $1.attempts, queue: $0.queue) }
            left -= ClusterProgress.estimate(operations: operations.count, idBytes: id.utf8.count)
            jobs.append((id, operations))
        }
        return ClusterProgress.encode(jobs)
    }

    /// What `show` says of a job this node has.
    public enum Shown {
        /// Its operations, in manifest order.
        case operations([ShowAnswer.Operation])
        /// Claimed, its operations not known yet (its manifest being read).
        case starting
        /// Waiting for its `notBefore` (§3.7): its operations, all pending.
        case delayed(until: Double, operations: [ShowAnswer.Operation])
    }

    /// A job this node has, for `show`; nil when it has no such job.
    public func show(job id: String) -> Shown? {
        if let operations = operations(of: id) { return .operations(operations) }
        let delayed = shared.withLock { s in
            s.lifecycle.jobs[id].flatMap { job in job.notBefore.map { ($0, Set(job.cancelsBeforeGroup.compactMap { $0 })) } }
        }
        if let (until, cancelled) = delayed { return .delayed(until: until, operations: pending(id, cancelled: cancelled)) }
        // Parked (out of the table): its manifest says until when.
        if shared.withLock({ $0.lifecycle.phase(of: id) == nil && $0.lifecycle.parkedCount > 0 }), hasActiveFolder(id),
           let parked = heldDelayedPlan(id) {
            return .delayed(until: parked.until, operations: Self.pending(parked.plan))
        }
        if isStarting(id) { return .starting }
        // Its group made between the two looks.
        return operations(of: id).map(Shown.operations)
    }

    /// Whether this node has the job but not yet its operations: received and its plan not yet made into a group,
    /// or claimed and not yet received — its folder in active/ is made before its manifest leaves the inbox, and
    /// the claims' commit and the reading of the batch's manifests come before it is received.
    private func isStarting(_ id: String) -> Bool {
        if shared.withLock({ $0.lifecycle.isStarting(id) }) { return true }
        // The file system is looked at outside `shared`: a frozen spool must not stop the daemon's other answers.
        guard hasActiveFolder(id) else { return false }
        return shared.withLock { $0.lifecycle.isStarting(id) || $0.lifecycle.phase(of: id) == nil }
    }

    /// Whether active/<id> is a folder: for a job not (or no longer) in the lifecycle's table, one this node has
    /// claimed and not yet received (the folder is made before its manifest leaves the inbox, or before a cluster
    /// job's copy is written). Never called under `shared`.
    private func hasActiveFolder(_ id: String) -> Bool {
        guard isValidIdentifier(id) else { return false }
        var st = stat()
        return lstat(store.folders.active + "/" + id, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR
    }

    /// An active job's operations, once its plan is a group.
    private func operations(of id: String) -> [ShowAnswer.Operation]? {
        let (job, group) = shared.withLock { ($0.runs[id], $0.lifecycle.group(of: id)) }
        guard let job, let plan = job.plan, let group, let records = records(group, of: job) else { return nil }
        return zip(plan.operations, records).map { op, r in
            var entry = ShowAnswer.Operation(id: op.id, kind: op.kind.rawValue, queue: op.queue, state: r.state.name,
                                             attempts: r.attempts, dependencies: op.dependencies)
            entry.startedAt = r.startedAt
            entry.finishedAt = r.finishedAt
            entry.error = r.error
            return entry
        }
    }

    /// A delayed job's operations as its manifest in active/ has them (empty if it cannot be read).
    private func pending(_ id: String, cancelled: Set<String>) -> [ShowAnswer.Operation] {
        let config = shared.withLock { $0.configuration }
        guard case .success(let claimed) = store.heldJob(id),
              case .success(let plan) = Manifest.parse(claimed.tree ?? ManifestTree(claimed.manifest), configuration: config,
                                                       accepted: true)
        else { return [] }
        return Self.pending(plan, cancelled: cancelled)
    }

    /// A delayed job's operations: each pending, but for those cancelled while it waits and their dependents, shown
    /// cancelled as they end once it starts (§3.4: none of them starts; `runsAfterFailure` ones still run).
    private static func pending(_ plan: JobPlan, cancelled asked: Set<String> = []) -> [ShowAnswer.Operation] {
        var errors: [String: String] = [:]
        var dependents: [String: [OperationPlan]] = [:]
        for op in plan.operations {
            if asked.contains(op.id) { errors[op.id] = "cancelled by request" }
            guard !asked.isEmpty, !op.runsAfterFailure else { continue }
            for dependency in op.dependencies { dependents[dependency, default: []].append(op) }
        }
        var ended = Array(errors.keys)
        while let id = ended.popLast() {
            for op in dependents[id] ?? [] where errors[op.id] == nil {
                errors[op.id] = "dependency '\(id)' was cancelled"
                ended.append(op.id)
            }
        }
        return plan.operations.map { op in
            var entry = ShowAnswer.Operation(id: op.id, kind: op.kind.rawValue, queue: op.queue,
                                             state: errors[op.id] == nil ? "pending" : "cancelled", attempts: 0,
                                             dependencies: op.dependencies)
            entry.error = errors[op.id]
            return entry
        }
    }
}
