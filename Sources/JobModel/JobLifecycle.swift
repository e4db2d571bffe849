// JobLifecycle: the life of the jobs this node runs, as a pure state machine — an event in, its own result out.
//
// A job is received (claimed from the inbox, resumed from active/, or claimed for this node by the store),
// accepted (its plan read: its operations count against `maxActiveOperations` from then on), running (its group
// submitted to the engine), finishing (its group ended, its publication queued) and then published (its folder
// placed in the outbox), which takes it out of the table: its slot takes the next claim while the shell makes the
// placement durable and announces it. A manifest with problems goes received → rejected → published; a job the
// store says this node no longer holds is lost: it leaves the table at once, nothing is published for it (its folder
// is discarded, or — a job the store has no record of at all — given back to the store to be submitted again).
//
// No I/O, no locks, no clock: the shell (Shell/Daemon.swift) keeps one value of this type under its mutex, tells it
// what happened and does what each event's result says (JobLifecycle+Results.swift: journal entries, submissions,
// cancels, publications, group releases, discards). The operations themselves are the engine's; here they are only counted, and a
// cancel of one operation is routed (the engine, which holds the operation's state, may still answer that it
// has already ended).
//
// Trusts: the shell to report each job's events in the order they happened (received before planned before
// submitted …); an event for a job not in the table (lost meanwhile) is ignored rather than trusted.

package struct JobLifecycle<Group: Hashable & Sendable>: Sendable {
    package enum Phase: Sendable, Equatable {
        /// Claimed; its manifest is being read.
        case received
        /// Accepted and waiting for its `notBefore` (§3.7): holds no job slot and no operations. Past the shell's
        /// window it is parked: out of the table, counted in `parkedCount` only.
        case delayed
        /// Its plan is read and its operations counted; its group is being submitted.
        case accepted
        /// Its group runs on the engine.
        case running
        /// Its group has ended; its publication is queued.
        case finishing
        /// Refused (manifest problems or a refused submission); its publication is queued.
        case rejected
    }

    /// How a job came to this node (only a claim from the inbox and a claim by the store are logged).
    package enum Arrival: Sendable, Equatable {
        case inbox(manifest: String)
        case resumed
        case claimed(fromNode: String?)
    }

    /// What the shell does with a job whose plan is read (`planned`).
    package enum PlannedResult: Sendable, Equatable {
        /// Submit its graph now, logging `announce` first when there is one (`accepted` is logged once: a delayed
        /// job was announced when it was delayed).
        case submit(announce: JournalEntry?)
        /// It is not waiting for its plan (lost, or ended, meanwhile): nothing to do.
        case ignore
    }

    /// Where a cancel goes (`cancel`); every case but the first three answers the asker that it is cancelled.
    package enum CancelResult: Sendable, Equatable {
        /// Not in the table: the store knows (the outbox, or another node).
        case notHere
        case alreadyEnded
        case unknownOperation
        /// Remembered until the job's group exists, and made with it.
        case kept
        /// A delayed job is started now with the cancel, which ends every operation before any runs.
        case wake(job: String)
        case cancelGroup(Group)
        /// The engine holds the operation's state and may still answer that it has ended.
        case cancelOperation(job: String, group: Group, operation: String)
    }

    package enum JournalEntry: Sendable, Equatable {
        case received(job: String, manifest: String)
        case claimed(job: String, fromNode: String?)
        case accepted(job: String, operations: Int)
        case delayed(job: String, until: Double)
        case rejected(job: String, problems: [String], error: String)
        case lost(job: String, reason: String)
    }

    package struct Job: Sendable {
        package var phase: Phase
        package var group: Group?
        /// Cancels asked before the group existed (nil: the whole job), applied when it is submitted.
        package var cancelsBeforeGroup: [String?] = []
        /// Operations counted against `maxActiveOperations`.
        package var operations = 0
        /// Operations ended in this run, and those that had ended before a restart (status' progress).
        package var ended = 0
        package var recovered = 0
        /// `accepted` was logged when it was delayed: not again when it is planned.
        package var announced = false
        /// While delayed: when it may start.
        package var notBefore: Double?
    }

    package private(set) var jobs: [String: Job] = [:]
    private var byGroup: [Group: String] = [:]
    /// Groups of lost jobs still running (cancelled): released, and their jobs' folders discarded (or submitted
    /// again), when they end.
    private var lostGroups: [Group: (job: String, end: LostEnd)] = [:]
    /// Operations of the jobs in the table, against `maxActiveOperations`.
    package private(set) var activeOperations = 0
    /// Jobs in the table that are delayed: they hold no slot.
    package private(set) var delayedCount = 0
    /// Delayed jobs out of the table (parked on disk by the shell): counted only.
    package private(set) var parkedCount = 0
    package private(set) var maxActiveJobs: Int
    package private(set) var maxActiveOperations: Int
    package private(set) var stopping = false
    /// Why claiming is paused (a spool fault, the store unavailable), if it is.
    package private(set) var fault: String?
    /// `--once`: inbox names still to try (nil without `--once`).
    package private(set) var onceNames: Set<String>?
    private var once = false
    /// Cancels asked for jobs claimed and not yet received (their manifests being read): applied as each is.
    private var cancelsBeforeReceipt: [String: [String?]] = [:]

    package init(maxActiveJobs: Int, maxActiveOperations: Int) {
        self.maxActiveJobs = maxActiveJobs
        self.maxActiveOperations = maxActiveOperations
    }

    // MARK: Queries

    /// What may be claimed now: how many more jobs, and how many more operations their manifests may hold.
    package enum Admission: Sendable, Equatable {
        case room(jobs: Int, operations: Int)
        case full
        case stopping
        case paused(String)
    }

    package var admission: Admission { admission(leaving: 0) }

    /// What may be claimed now, `leaving` of the jobs in the table not counted (ended, their places about to be free).
    package func admission(leaving: Int) -> Admission {
        if stopping { return .stopping }
        if let fault { return .paused(fault) }
        let room = maxActiveJobs - (jobs.count - delayedCount - leaving), budget = maxActiveOperations - activeOperations
        return room > 0 && budget > 0 ? .room(jobs: room, operations: budget) : .full
    }

    package func phase(of job: String) -> Phase? { jobs[job]?.phase }
    package func job(of group: Group) -> String? { byGroup[group] }
    package func group(of job: String) -> Group? { jobs[job]?.group }
    /// Received, its group not yet made (its manifest being read, or a plan waiting for the engine).
    package func isStarting(_ job: String) -> Bool { jobs[job].map { $0.group == nil } ?? false }
    package var count: Int { jobs.count }
    package var isEmpty: Bool { jobs.isEmpty }

    /// Each job's operations and those ended (recovered included), for status.
    package func progress(_ job: String) -> (operations: Int, ended: Int)? {
        jobs[job].map { ($0.operations, $0.ended + $0.recovered) }
    }

    /// `--once`: everything it was to do has ended (nothing active, no name from the start left to try).
    package var onceDone: Bool { once && jobs.isEmpty && parkedCount == 0 && onceNames?.isEmpty != false }

    /// `--once`: whether claiming may take this inbox name.
    package func onceAllows(_ name: String) -> Bool { onceNames?.contains(name) ?? true }

    /// Keeps a cancel for a job claimed and not yet received, applied when it is (as one before its group: an
    /// operation's id is checked then). False, and nothing kept, when the job is in the table already.
    package mutating func keepCancelBeforeReceipt(job id: String, operation: String?) -> Bool {
        guard jobs[id] == nil else { return false }
        cancelsBeforeReceipt[id, default: []].append(operation)
        return true
    }

    /// Drops what was kept for a job that came and went unseen (received, run and published between two looks);
    /// whether anything was.
    package mutating func dropCancelsBeforeReceipt(job id: String) -> Bool {
        cancelsBeforeReceipt.removeValue(forKey: id) != nil
    }

    // MARK: Events

    /// The cancels asked for an accepted job before its group exists, taken (so that `submitted` returns only those
    /// asked after): the shell hands them to the engine with the group, before any operation can start.
    package mutating func takeEarlyCancels(job id: String) -> [String?] {
        guard var job = jobs[id], job.phase == .accepted else { return [] }
        let early = job.cancelsBeforeGroup
        job.cancelsBeforeGroup = []
        jobs[id] = job
        return early
    }

    // MARK: Notes (no actions)

    /// One of the group's operations (not one recovered) ended: for status' progress.
    package mutating func operationEnded(group: Group) {
        guard let id = byGroup[group] else { return }
        jobs[id]?.ended += 1
    }

    /// Claiming stops for good (SIGTERM).
    package mutating func stop() { stopping = true }

    /// A spool fault or an unavailable store pauses claiming (nil: over).
    package mutating func setFault(_ reason: String?) { fault = reason }

    /// A reload's budgets.
    package mutating func configure(maxActiveJobs jobs: Int, maxActiveOperations operations: Int) {
        maxActiveJobs = jobs
        maxActiveOperations = operations
    }

    /// `--once`: the inbox names present at start; claiming takes only those, and the run ends once they (and every
    /// job resumed) have ended.
    package mutating func startOnce(names: Set<String>) {
        once = true
        onceNames = names
    }

    /// `--once`: an inbox name tried and found still open for writing, to be tried again (and waited for).
    package mutating func onceRetry(_ name: String) {
        if once { onceNames?.insert(name) }
    }

    /// `--once`: whether claiming may take this inbox name; if so, it is tried now (claimed or not) and no longer
    /// waited for.
    package mutating func tryOnce(_ name: String) -> Bool {
        guard onceAllows(name) else { return false }
        onceNames?.remove(name)
        return true
    }

    /// The shell counted its parked jobs again (from its record on disk).
    package mutating func setParkedCount(_ count: Int) { parkedCount = count }

    /// A delayed job's time came: it is received again (the shell reads and plans it, `planned` logged once).
    /// False when it is not delayed (ended, or woken by a cancel meanwhile).
    package mutating func due(job id: String) -> Bool {
        guard var job = jobs[id], job.phase == .delayed else { return false }
        job.phase = .received
        job.notBefore = nil
        jobs[id] = job
        delayedCount -= 1
        return true
    }

    /// A delayed job leaves the table for the shell's record on disk (it is parked: only counted from here). False,
    /// and it stays, while it holds cancels of single operations (or is not delayed).
    package mutating func park(job id: String) -> Bool {
        guard let job = jobs[id], job.phase == .delayed, job.cancelsBeforeGroup.isEmpty else { return false }
        jobs[id] = nil
        delayedCount -= 1
        parkedCount += 1
        return true
    }

    /// A parked job comes back into the table, delayed until `until` (already announced).
    package mutating func unpark(job id: String, until: Double) {
        guard jobs[id] == nil else { return }
        jobs[id] = Job(phase: .delayed, announced: true, notBefore: until)
        delayedCount += 1
        parkedCount = max(0, parkedCount - 1)
    }

    /// The job went to the store and runs wherever the store places it (a cluster): it leaves the table and its
    /// operations the budget.
    package mutating func handOver(job id: String) {
        guard let job = jobs.removeValue(forKey: id) else { return }
        if job.phase == .delayed { delayedCount -= 1 }
        activeOperations -= job.operations
    }

    /// Operations added to a running job (a photo list, SPEC §3.5), `recovered` of them ended before a restart.
    package mutating func extend(job id: String, operations: Int, recovered: Int) {
        guard var job = jobs[id], job.phase == .running else { return }
        job.operations += operations
        job.recovered += recovered
        activeOperations += operations
        jobs[id] = job
    }

    /// A cancel of a whole job (`operation` nil) or of one operation, whatever the job's phase. `knownOperation`:
    /// the operation is in the job's plan as the shell knows it now (false before the plan is read).
    package mutating func cancel(job id: String, operation: String?, knownOperation: Bool) -> CancelResult {
        guard var job = jobs[id] else { return .notHere }
        switch job.phase {
        case .rejected:
            return .alreadyEnded
        case .delayed:
            // A cancel of the whole job ends it at once: it is started with the cancel, which ends every
            // operation before any runs. One operation's cancel waits with the job.
            job.cancelsBeforeGroup.append(operation)
            guard operation == nil else {
                jobs[id] = job
                return .kept
            }
            job.phase = .received
            job.notBefore = nil
            jobs[id] = job
            delayedCount -= 1
            return .wake(job: id)
        case .received, .accepted:
            // Before the plan is read, an operation that turns out not to exist is logged and ignored
            // once the group exists; after, it is refused now.
            if operation != nil, job.phase == .accepted, !knownOperation { return .unknownOperation }
            job.cancelsBeforeGroup.append(operation)
            jobs[id] = job
            return .kept
        case .running, .finishing:
            guard let group = job.group else { return .alreadyEnded }
            guard let operation else { return .cancelGroup(group) }
            guard knownOperation else { return .unknownOperation }
            return .cancelOperation(job: id, group: group, operation: operation)
        }
    }

    /// The job's operations were submitted to the engine as `group`: the cancels asked meanwhile go with it.
    package mutating func submitted(job id: String, group: Group) -> SubmittedResult {
        guard var job = jobs[id], job.phase == .accepted else {
            // Not expected (both happen on the shell's serial queue); stopped and dropped like a lost job's.
            lostGroups[group] = (id, .discard)
            return .stray(cancel: group)
        }
        job.phase = .running
        job.group = group
        let early = job.cancelsBeforeGroup
        job.cancelsBeforeGroup = []
        jobs[id] = job
        byGroup[group] = id
        return .running(group: group, cancels: early)
    }

    /// The store says this node no longer holds the job, or its folder cannot be kept. `resubmit`: the store has no
    /// record of it at all (its database restored from an older backup): once nothing runs in it, its folder goes
    /// back to the store to be submitted again, rather than removed. It leaves the table at once; a running group is
    /// cancelled first and its folder goes once nothing runs in it.
    package mutating func lost(job id: String, reason: String, resubmit: Bool = false) -> LostResult {
        guard let job = jobs.removeValue(forKey: id) else { return .ignore }
        if job.phase == .delayed { delayedCount -= 1 }
        activeOperations -= job.operations
        let announce = JournalEntry.lost(job: id, reason: reason)
        let end: LostEnd = resubmit ? .resubmit : .discard
        guard let group = job.group else { return .endNow(announce: announce, release: nil, end) }
        byGroup[group] = nil
        guard job.phase == .running else { return .endNow(announce: announce, release: group, end) }
        // Its commands die with the cancel; its folder goes once nothing runs in it (`groupFinished`).
        lostGroups[group] = (id, end)
        return .cancelFirst(announce: announce, group: group)
    }

    /// The job's outbox entry is placed (or, rejected, its result): it leaves the table, its group released.
    package mutating func published(job id: String) -> PublishedResult {
        guard let job = jobs[id], job.phase == .finishing || job.phase == .rejected else { return .ignore }
        jobs[id] = nil
        activeOperations -= job.operations
        if let group = job.group { byGroup[group] = nil }
        return .left(release: job.group)
    }

    /// A job enters the table (`cancels`: asked before it came here, a cluster's cancel of a job not yet claimed,
    /// kept for its group); how it came decides what is logged.
    package mutating func received(job id: String, _ arrival: Arrival, cancels: [String?] = []) -> ReceivedResult {
        guard jobs[id] == nil else { return .ignore }
        // Held until the group exists, and made with it.
        jobs[id] = Job(phase: .received, cancelsBeforeGroup: (cancelsBeforeReceipt.removeValue(forKey: id) ?? []) + cancels)
        switch arrival {
        case .inbox(let manifest): return .entered(announce: .received(job: id, manifest: manifest))
        case .resumed: return .entered(announce: nil)
        case .claimed(let fromNode): return .entered(announce: .claimed(job: id, fromNode: fromNode))
        }
    }

    /// Its plan was read: it takes its operations from the budget (`recovered` of them had ended before a restart)
    /// and goes to the engine; the shell answers with `submitted` or `rejected`.
    package mutating func planned(job id: String, operations: Int, recovered: Int) -> PlannedResult {
        guard var job = jobs[id], job.phase == .received else { return .ignore }
        job.phase = .accepted
        job.operations = operations
        job.recovered = recovered
        activeOperations += operations
        jobs[id] = job
        return .submit(announce: job.announced ? nil : .accepted(job: id, operations: operations))
    }

    /// Its plan says not before `until` (§3.7): accepted now, then waiting without a slot, out of the budgets, until
    /// `due`.
    package mutating func delayed(job id: String, operations: Int, until: Double) -> DelayedResult {
        guard var job = jobs[id], job.phase == .received else { return .ignore }
        job.phase = .delayed
        job.announced = true
        job.notBefore = until
        jobs[id] = job
        delayedCount += 1
        return .waits(announce: [.accepted(job: id, operations: operations), .delayed(job: id, until: until)])
    }

    /// Its manifest had problems, or the engine refused its graph: it is published `rejected`.
    package mutating func rejected(job id: String, problems: [String], error: String) -> RejectedResult {
        guard var job = jobs[id], job.phase == .received || job.phase == .accepted else { return .ignore }
        job.phase = .rejected
        // Cancels asked meanwhile have nothing left to cancel.
        job.cancelsBeforeGroup = []
        jobs[id] = job
        return .publish(announce: .rejected(job: id, problems: problems, error: error), error: error)
    }

    /// Every operation of its group ended (`status` and `error` as the shell reads them from the engine's records):
    /// the job is published; a lost job's group is released and its folder's end done.
    package mutating func groupFinished(group: Group, status: JobStatus, error: String?) -> GroupFinishedResult {
        if let lost = lostGroups.removeValue(forKey: group) { return .lostEnded(job: lost.job, release: group, lost.end) }
        guard let id = byGroup[group], var job = jobs[id], job.phase == .running else { return .ignore }
        job.phase = .finishing
        jobs[id] = job
        return .publish(job: id, status: status, error: error)
    }
}
