// The shell's intake (see Daemon.swift): the inbox read (inotify's reports joined into one round at a time, rescans),
// manifests claimed while the lifecycle admits more — run here, or (a store that places jobs itself) checked and
// handed to the store a round at a time between the jobs it hands back — and room offered to such a store.

import DequeModule
import Foundation
import JobModel
import Logging
import OperationEngine
import OperationKinds
import SpoolFiles
import SystemCalls

extension Daemon {
    // MARK: Start, scan, claim

    /// Resumes what a previous run left in active/ (those the store says this node still holds), then claims.
    public func start() {
        work.sync {
            let held: Spool.Held, problems: [String]
            do {
                (held, problems) = try store.recoverHeld()
            } catch {
                // Without a progress log, successes could not be recorded: say so; jobs still run.
                logger.error("the progress log cannot be written: \(error); operations that succeed may run again after a restart")
                (held, problems) = (Spool.Held(jobs: []), [])
            }
            for problem in problems { logger.error("\(problem)") }
            let leftovers = CommandLedger.shared.open(store.folders.active + "/.commands")
            if !leftovers.isEmpty {
                logger.notice("""
                    killed \(leftovers.count) command process groups left running by the previous run: \
                    \(leftovers.map(String.init).joined(separator: ", "))
                    """)
            }
            let commands = shared.withLock { !$0.configuration.commands.isEmpty }
            if commands && Supervisor.path == nil {
                let missing = "opqueued-supervise is neither beside this program nor in ../lib/opqueued/: commands run without it, "
                    + "and a process a command starts in a session of its own (setsid) outlives its operation"
                logger.warning("\(missing)")
            }
            let (hook, outbox) = shared.withLock { s in
                (s.configuration.jobFinishedHook, store.outbox.folder)
            }
            hooks.recover(hook, outbox: outbox)
            openDelayedRecord()
            resume(held)
            if onWork.delayed.addedThisRound > 0 {
                releaseMemoryIfIdle(released: onWork.delayed.addedThisRound)
                onWork.delayed.addedThisRound = 0
            }
            if once {
                // Only what is there now; a file that cannot be claimed is not waited for.
                let names = (try? store.scanInbox(limit: Int.max).manifests) ?? []
                let present = Set(names.filter { store.inboxAge(of: $0, now: 0) != nil })
                shared.withLock { $0.lifecycle.startOnce(names: present) }
            }
            offerRoom()
            configureSchedules(shared.withLock { $0.configuration })
        }
        // After recovery has emptied tmp/: the outbox's retention (outbox.keepDays) removes through it.
        startRetention()
    }

    /// On `work`, at start: the jobs recovery found in active/, read and resumed (those the store says this node still
    /// holds). The file spool's are read one at a time: a hundred thousand delayed jobs are never all in memory.
    private func resume(_ held: Spool.Held) {
        func read(_ id: String, _ done: [String: DoneRecord]) -> ClaimedJob? {
            guard case .success(var claimed) = store.heldJob(id) else {
                logger.error("active/\(id)/manifest.plist cannot be read; left in place")
                return nil
            }
            // Lines of an earlier job of the same id (published, its outbox entry removed, the id given again) may
            // still be in the log: only what started after this job's claim is its own.
            claimed.done = done.filter { $0.value.startedAt >= claimed.receivedAt }
            // Operations cancelled by request before the restart are cancelled again before any operation starts.
            claimed.cancels = held.cancels(of: claimed)
            return claimed
        }
        func resume(_ claimed: ClaimedJob) {
            // Commands that were running at the crash start again in an empty scratch folder.
            removeTree(CommandOperation.workFolder(store.folders.job(claimed.id)))
            accept(claimed, .resumed, configuration: shared.withLock { $0.configuration })
        }
        if store.capabilities.contains(.leasesJobs) {
            for claimed in store.recovered(held.jobs.compactMap(read)) { resume(claimed) }
        } else {
            // Without leases every job found is still this node's (`recovered` keeps them all): one at a time.
            for (id, done) in held.jobs { read(id, done).map(resume) }
        }
    }

    /// Looks at the inbox. `hints` are names inotify reported closed or moved in: each is tried at once
    /// (claimable at once, without reading the folder). `complete` says they are all that arrived (an event
    /// batch without overflow); otherwise (start, overflow, the watcher's timer) the folder is read whole now.
    public func scan(hints: [String] = [], complete: Bool = false) {
        // Reports that come while one waits its turn on `work` join it: a flood's inotify reads queue one round,
        // not one each (each would claim a batch ahead of the jobs the store hands over meanwhile).
        guard shared.withLock({ $0.reports.add(hints, complete: complete) }) else { return }
        work.async { [self] in
            let (hints, complete) = shared.withLock { $0.reports.take() }
            // Only names a scan would offer are kept (a hidden file written and renamed in is not).
            let names = hints.filter(Spool.isManifestName)
            shared.withLock { $0.closedHints.formUnion(names) }
            onWork.intake.reported(names, complete: complete)
            claimMore()
        }
    }

    /// On `work`: tells the store how many more jobs could run here (a cluster store claims that many); while
    /// there is room, again within a second.
    func offerRoom() {
        guard store.capabilities.contains(.placesJobs) else { return }
        let room: Int, budget: Int
        let admission = shared.withLock { s in s.lifecycle.admission(leaving: min(s.recording, s.configuration.maxActiveJobs)) }
        switch admission {
        case .room(let jobs, let operations): (room, budget) = (jobs, operations)
        case .full, .stopping, .paused: return
        }
        // The inbox's rule: a manifest of B bytes may hold B / minimumBytesPerOperation + 1 operations.
        store.want(room: room, manifestBytes: budget.multipliedReportingOverflow(by: Self.minimumBytesPerOperation).overflow
                   ? Int.max : budget * Self.minimumBytesPerOperation)
        guard !onWork.wantScheduled else { return }
        onWork.wantScheduled = true
        work.asyncAfter(deadline: .now() + 1) { [self] in
            onWork.wantScheduled = false
            offerRoom()
        }
    }

    /// On `work`: reads the inbox again, keeping the oldest names.
    func refill() throws {
        let began = monotonicSeconds()
        let scan = try store.scanInbox(limit: InboxIntake.scanBatch)
        onWork.intake.read(scan.manifests, waiting: scan.waiting, now: Date().timeIntervalSince1970, seconds: monotonicSeconds() - began)
        let fresh = shared.withLock { s in
            // Names already found unclaimable (a folder, a link, a FIFO named *.plist: logged once, tried again at each
            // scan) wait for nothing: not counted as waiting.
            s.waiting = scan.waiting - scan.manifests.reduce(0) { s.strangersLogged.contains($1) ? $0 + 1 : $0 }
            if scan.manifests.count == scan.waiting {
                // The whole inbox was read: what is remembered of names no longer there is let go, so
                // names that come and go cannot grow these sets.
                let present = Set(scan.manifests).union(scan.strangers)
                s.closedHints.formIntersection(present)
                s.strangersLogged.formIntersection(present)
            }
            return scan.strangers.filter { s.strangersLogged.insert($0).inserted }
        }
        for stranger in fresh { logger.notice("inbox/\(stranger) is not a manifest (*.plist) and is left alone") }
        for (from, to) in scan.renamed { logger.notice("inbox/\(from) was renamed inbox/\(to): its name is not UTF-8") }
    }

    /// On `work`: claims while the lifecycle admits more, then commits the claims together and accepts them
    /// (or, when the store places jobs itself, hands them to it).
    func claimMore() {
        let runsHere = !store.capabilities.contains(.placesJobs)
        var room: Int, budget: Int
        switch shared.withLock({ $0.lifecycle.admission }) {
        case .room(let jobs, let operations): (room, budget) = (jobs, operations)
        case .full: (room, budget) = (0, 0)
        case .stopping: return
        case .paused:
            // Nothing is claimed until the spool works again; what waits in the inbox is still counted (status's
            // `waiting`, `opqueued_inbox_files`), not left at what the last read before the fault saw.
            _ = refillIfDue(now: Date().timeIntervalSince1970, takes: false)
            return
        }
        let now = Date().timeIntervalSince1970
        guard refillIfDue(now: now, takes: runsHere ? room > 0 && budget > 0 : store.acceptsSubmissions) else { return }
        // Manifests that go to the store do not wait for room here; they wait in the inbox until the store can
        // validate them (a cluster node that has not yet learnt what the cluster declares), tried again shortly.
        if !runsHere {
            guard store.acceptsSubmissions else {
                retrySubmissionsShortly()
                return
            }
            (room, budget) = (Self.handOverBatch, Int.max)
        }
        guard room > 0, budget > 0 else { return }
        let (claimed, settling) = claimRound(room: room, budget: budget, now: now)
        endClaimRound(claimed, settling: settling, runsHere: runsHere)
        checkOnceDone()
    }

    /// On `work`: reads the inbox again if it is due; false when it could not be read (a spool fault).
    ///
    /// An empty queue alone is no reason to read the inbox: every job's end asks for more, and reading a folder that
    /// once held a flood costs all its blocks (a directory never shrinks) even when it is empty. With nothing to take
    /// now (`takes` false: no room; a cluster node that cannot submit yet) it is still read when due, at most every
    /// `rescanInterval` (and every twenty times a read's own time, for a huge backlog): what waits there is counted
    /// all the same (status's `waiting`, `opqueued_inbox_files`), not left at what the last read before the node
    /// filled up saw.
    private func refillIfDue(now: Double, takes: Bool) -> Bool {
        guard onWork.intake.readDue(now: now, takes: takes) else { return true }
        do {
            try refill()
            return true
        } catch {
            spoolFailed("reading the inbox", error)
            return false
        }
    }

    private func retrySubmissionsShortly() {
        guard !onWork.submissionRetryScheduled else { return }
        onWork.submissionRetryScheduled = true
        work.asyncAfter(deadline: .now() + 0.5) { [self] in
            onWork.submissionRetryScheduled = false
            claimMore()
        }
    }

    /// On `work`: claims inbox names in order while there is room and the operations they may hold fit the budget;
    /// the claimed jobs, and the names still being written (tried again once settled).
    private func claimRound(room: Int, budget: Int, now: Double) -> (claimed: [ClaimedJob], settling: [String]) {
        // Operations the claimed manifests may hold, before they are parsed: no operation takes fewer than this many
        // bytes in either format.
        var mayHold = 0
        var claimed: [ClaimedJob] = []
        var settling: [String] = []
        while claimed.count < room, mayHold < budget, let name = onWork.intake.next() {
            if once {
                guard shared.withLock({ $0.lifecycle.tryOnce(name) }) else { continue }
            }
            let hinted = shared.withLock { $0.closedHints.remove(name) != nil }
            // Used only where no lease can be had: not announced by inotify and still fresh, it may be being written
            // in place. (Not a regular file: `claim` says why it is left alone.)
            let settled = hinted || once || (store.inboxAge(of: name, now: now) ?? Self.settleSeconds) >= Self.settleSeconds
            let outcome: Spool.ClaimOutcome
            let changedAt = store.inboxChangeTime(of: name)
            do {
                outcome = try store.claim(name, now: Date().timeIntervalSince1970, settled: settled, inUse: idInUse)
            } catch {
                onWork.intake.add(name, first: true)
                spoolFailed("claiming inbox/\(name)", error)
                break
            }
            switch outcome {
            case .claimed(let job):
                onWork.intake.notBusy(name)
                onWork.onceBusySince[name] = nil
                if let changedAt { metrics.pickedUp(after: job.receivedAt - changedAt) }
                claimed.append(job)
                mayHold += job.manifest.count / Self.minimumBytesPerOperation + 1
            case .unsettled: settling.append(name)
            case .vanished:
                onWork.intake.notBusy(name)
                onWork.onceBusySince[name] = nil
                continue
            default: notClaimed(name, outcome)
            }
            logLeaseFallbackOnce()
        }
        return (claimed, settling)
    }

    /// On `work`: a manifest left in the inbox (busy, refused) or skipped (`ifJobExists = skip`).
    private func notClaimed(_ name: String, _ outcome: Spool.ClaimOutcome) {
        switch outcome {
        case .busy:
            onWork.intake.markBusy(name)
            if once { waitOnceForWriter(name) }
        case .exists(let job, let inode, let held):
            onWork.intake.notBusy(name)
            holdSkipped(held)
            shared.withLock { $0.waiting = max(0, $0.waiting - 1) }
            recordSubmitted([(name, inode, job)])
            event(.info, "inbox/\(name) skipped: job \(job) exists (ifJobExists = skip)",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "skipped", "OPQ_JOB": .string(job), "OPQ_MANIFEST": .string(name)])
        case .skipped(let reason):
            let fresh = shared.withLock { s in
                let fresh = s.strangersLogged.insert(name).inserted
                if fresh { s.waiting = max(0, s.waiting - 1) }
                return fresh
            }
            if fresh { logger.warning("inbox/\(name) cannot be claimed: \(reason)") }
        case .claimed, .unsettled, .vanished:
            break
        }
    }

    /// On `work`, `--once`: a manifest present at start but still open for writing is tried again every 0.1 s (its
    /// writer about to close it, or a child that inherited the writer's descriptor for a moment) for at most
    /// `onceWriterWaitSeconds`; then it is left in the inbox, and said so.
    private func waitOnceForWriter(_ name: String) {
        let now = Date().timeIntervalSince1970
        let since = onWork.onceBusySince[name] ?? now
        guard now - since < Self.onceWriterWaitSeconds else {
            onWork.onceBusySince[name] = nil
            logger.warning("""
                inbox/\(name) is still open for writing after \(Int(Self.onceWriterWaitSeconds)) s: left in the inbox \
                for the next run (--once)
                """)
            return  // the claim round's end sees the run done
        }
        onWork.onceBusySince[name] = since
        shared.withLock { $0.lifecycle.onceRetry(name) }
        work.asyncAfter(deadline: .now() + 0.1) { [self] in
            onWork.intake.add(name, first: true)
            claimMore()
        }
    }

    private func logLeaseFallbackOnce() {
        guard !onWork.leaseFallbackLogged, let reason = store.leaseRefused else { return }
        onWork.leaseFallbackLogged = true
        logger.notice("""
            no read lease could be taken on \(reason); a manifest still open for writing is told apart by inotify's close events \
            and \(Self.settleSeconds) s without change instead (logged once)
            """)
    }

    /// On `work`: after a claim round, the settling names tried again later, the claims committed and accepted, and
    /// the next round queued when this one could not take everything.
    private func endClaimRound(_ claimed: [ClaimedJob], settling: [String], runsHere: Bool) {
        if !settling.isEmpty {
            work.asyncAfter(deadline: .now() + Self.settleSeconds) { [self, settling] in
                for name in settling { onWork.intake.add(name) }
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
                    spoolFailed("committing \(claimed.count) claims "
                                + "(they run, and are recovered from active/ after a restart if the disk kept them)", error)
                }
            }
            shared.withLock { $0.waiting = max(0, $0.waiting - claimed.count) }
            receiveFromInbox(claimed)
        }
        // Manifests for the store are claimed a round at a time, each queued behind what came meanwhile (the jobs
        // the store hands over to run here, publications): a flood into this node's inbox does not hold up the
        // jobs this node runs.
        if !runsHere, !claimed.isEmpty, onWork.intake.hasMore, !onWork.submissionRoundPosted {
            onWork.submissionRoundPosted = true
            work.async { [self] in
                onWork.submissionRoundPosted = false
                claimMore()
            }
        }
        // Jobs delayed in this round hold no slot: claiming goes on behind what came meanwhile, not at the next rescan.
        if onWork.delayed.addedThisRound > 0 {
            let added = onWork.delayed.addedThisRound
            onWork.delayed.addedThisRound = 0
            if onWork.intake.hasMore { work.async { [self] in claimMore() } } else { releaseMemoryIfIdle(released: added) }
        }
    }

    /// On `work`: keeps a skipped manifest's descriptor open for 15 s (at most 256 at once), so that its inode is not
    /// the next file's while `opqueuectl submit` may still ask which job its file got.
    func holdSkipped(_ fd: Int32) {
        guard fd >= 0 else { return }
        guard onWork.delayed.heldSkipped < 256 else { close(fd); return }
        onWork.delayed.heldSkipped += 1
        work.asyncAfter(deadline: .now() + 15) { [self] in
            close(fd)
            onWork.delayed.heldSkipped -= 1
        }
    }

    /// Whether a job id is still this node's though its folder may have left active/: publication renames a job into
    /// outbox/ before its end is announced, and the user may take it from there at once. A claim never reuses such
    /// an id (the new job would be taken for the one ending, and never answered).
    func idInUse(_ id: String) -> Bool {
        shared.withLock { $0.runs[id] != nil || $0.lifecycle.phase(of: id) != nil }
    }

    /// On `work`: manifests just claimed from the inbox. Each is read against the store's submission
    /// configuration; one with problems is rejected here (published locally); the others go to the store,
    /// and those it returns run here with the plans just made.
    func receiveFromInbox(_ claimed: [ClaimedJob]) {
        let config = store.submissionConfiguration(shared.withLock { $0.configuration })
        if store.capabilities.contains(.placesJobs) {
            submitFromInbox(claimed, configuration: config)
            return
        }
        // Here a claim gives the job its id, accepted or not.
        recordSubmitted(claimed.map { ($0.manifestName, $0.inboxInode, $0.id) })
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
            shared.withLock { s in
                s.runs[id] = nil
                s.lifecycle.handOver(job: id)
            }
        }
    }

    /// On `work`: a job resumed from active/ or claimed for this node by the store: read against the local
    /// configuration and run, or rejected.
    func accept(_ claimed: ClaimedJob, _ arrival: JobLifecycle<GroupID>.Arrival, configuration config: Configuration) {
        var claimed = claimed
        let tree = claimed.tree ?? ManifestTree(claimed.manifest)
        claimed.tree = nil
        guard let (run, plan) = receive(claimed, arrival, tree: tree, configuration: config) else { return }
        start(run, plan, configuration: config)
    }

    /// On `work`, for a store that places jobs itself: manifests claimed for submission (SPEC §8) are read against
    /// the store's submission configuration; the good ones go to the store (never registered here: they run
    /// wherever the store places them), one with problems is moved into active/ and rejected here like any other.
    func submitFromInbox(_ claimed: [ClaimedJob], configuration: Configuration) {
        var submissions: [ClaimedJob] = []
        var config = configuration, refreshed = false
        for var job in claimed {
            let tree = job.tree ?? ManifestTree(job.manifest)
            job.tree = nil
            var (problems, plan) = Self.problems(tree, configuration: config)
            // What the cluster declares may have grown since the store last read it (a node that just joined):
            // read once more, at most once per batch, before a manifest is rejected.
            if !problems.isEmpty && !refreshed, let fresh = store.freshSubmissionConfiguration(shared.withLock({ $0.configuration })) {
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
                guard case .claimed(var local) = try store.keepHere(job, inUse: idInUse) else { continue }
                recordSubmitted([(local.manifestName, local.inboxInode, local.id)])
                local.tree = nil
                _ = receive(local, .inbox(manifest: local.manifestName), tree: tree, configuration: config)
            } catch {
                // Left in active/.submissions: the cluster gets it, and the node that claims it rejects it there.
                logger.error("""
                    inbox/\(job.manifestName) is rejected but cannot be moved into active/ to be published here: \(error); \
                    it goes to the cluster, where the node that claims it rejects it
                    """,
                             metadata: ["OPQ_ERROR": .string("\(error)")])
                submissions.append(job)
            }
        }
        if !submissions.isEmpty { _ = store.submit(submissions) }
    }

    /// What is wrong with a manifest under `config` (empty: nothing), and its plan when nothing is; `accepted`, read
    /// again as a job accepted before (see `Manifest.parse`).
    static func problems(_ tree: ManifestTree, configuration config: Configuration,
                         accepted: Bool = false) -> (problems: [String], plan: JobPlan?) {
        var problems: [String] = []
        var parsed: JobPlan?
        switch Manifest.parse(tree, configuration: config, accepted: accepted) {
        case .failure(let p): problems = p.problems
        case .success(let plan): parsed = plan
        }
        if !problems.isEmpty, let asked = tree.requestedJob, !isValidIdentifier(asked),
           !problems.contains(where: { $0.hasPrefix("job:") }) {
            problems.append("job: '\(clipped(asked))' is not a valid job id")
        }
        return (problems, parsed)
    }

    /// Notes the ids manifests from the inbox got (see `recentSubmissions`).
    func recordSubmitted(_ ids: [(manifest: String, inode: UInt64?, job: String)]) {
        shared.withLock { s in for (manifest, inode, job) in ids { s.recentSubmissions.record(manifest, (inode, job)) } }
    }

    /// The id the manifest this daemon took lately from inbox/`manifest` got, if it has one yet; with `inode`, only
    /// if that was the file (a name comes again: an earlier file's id is not this one's).
    public func submittedJob(manifest: String, inode: UInt64?) -> String? {
        guard let (recorded, job) = shared.withLock({ $0.recentSubmissions[manifest] }) else { return nil }
        if let inode, let recorded, inode != recorded { return nil }
        return job
    }
}

/// The last `capacity` names recorded, each with its latest value; the oldest name goes first.
struct RecentNames {
    private var values: [String: (inode: UInt64?, job: String)] = [:]
    private var order: [String] = []
    private var oldest = 0
    let capacity: Int

    init(capacity: Int) { self.capacity = max(1, capacity) }

    subscript(name: String) -> (inode: UInt64?, job: String)? { values[name] }

    mutating func record(_ name: String, _ value: (inode: UInt64?, job: String)) {
        if values.updateValue(value, forKey: name) != nil { return }
        if order.count < capacity {
            order.append(name)
        } else {
            values[order[oldest]] = nil
            order[oldest] = name
            oldest = (oldest + 1) % capacity
        }
    }
}
