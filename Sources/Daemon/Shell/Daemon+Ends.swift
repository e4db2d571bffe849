// The shell's ends (see Daemon.swift): a finished job's result staged, made durable, recorded by the store (the
// publication gate), placed in the outbox, made durable and announced, in batches; spool faults (claiming paused,
// publications held, the spool probed until it works again); `--once`.

import Foundation
import JobModel
import Logging
import OperationEngine
import CShims
import OperationKinds
import SpoolFiles
import SystemCalls

extension Daemon {
    // MARK: Ends

    /// On `work`: a group has finished; its job's outbox entry is published with the next batch (a lost job's
    /// group is released and its folder discarded instead).
    func finish(_ group: GroupID) {
        let run = shared.withLock { s in s.lifecycle.job(of: group).flatMap { s.runs[$0] } }
        guard let run else {
            groupFinished(group, status: .cancelled, error: nil)
            return
        }
        guard let records = records(group, of: run) else { return }
        var errors: [String] = []
        for r in records where r.state != .succeeded {
            errors.append("\(r.name): \(r.error ?? r.state.name)")
        }
        let status = JobStatus(ended: records.map(\.state))
        groupFinished(group, status: status, error: errors.isEmpty ? nil : errors.joined(separator: "\n"), for: run, records: records)
    }

    /// On `work`: the first publication of a batch schedules the batch; later ones join it.
    func enqueuePublication(_ publication: Publication) {
        onWork.publications.append(publication)
        if onWork.publications.count == 1 { work.async { [self] in publishPending() } }
    }

    /// On `work`: write every pending result.plist, commit, have the store record the ends, move the entries
    /// it recorded to the outbox, commit, then announce them.
    func publishPending() {
        let batch = takePublications()
        guard !batch.isEmpty else {
            // What waited was lost meanwhile: nothing is left to retry.
            if onWork.fault.isOn, onWork.fault.stalled.isEmpty, let made = try? store.probe() {
                logRemade(made)
                spoolWorked()
                claimMore()
            }
            return
        }
        let now = Date().timeIntervalSince1970
        var staged: [(publication: Publication, firstStart: Double?)] = []
        var results: [String: [UInt8]] = [:]
        let keepsResults = store.capabilities.contains(.recordsEnds)
        let hook = shared.withLock { $0.configuration.jobFinishedHook }
        let node = store.node
        for publication in batch {
            if hook != nil {
                do {
                    store.commitWithNext(file: try hooks.markDue(job: publication.job.id, status: publication.status.rawValue))
                } catch {
                    // The hook still runs after publication; only a crash before it would lose it.
                    logger.error("job \(publication.job.id): the jobFinished marker could not be written: \(error)")
                }
            }
            // Commands' scratch and kept outputs are the daemon's, not part of the entry.
            if publication.job.mayHave(.command) { CommandOperation.removeScratch(store.folders.job(publication.job.id)) }
            var publication = publication
            publication.dropped += checkEntry(publication.job)
            do {
                let keep = keepsResults && publication.job.fromStore
                let (firstStart, kept) = try stageResult(&publication, now: now, node: node, keepingBytes: keep)
                if let kept { results[publication.job.id] = kept }
                staged.append((publication, firstStart))
            } catch {
                stall(publication, error)
            }
        }
        // result.plist made durable off `work` (which stages the next batch meanwhile), then the ends recorded.
        shared.withLock { $0.publishing += 1 }
        durability.commits.after { [self, staged, results] outcome in
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

    /// On `work`: the pending publications, emptied; a job lost while its publication waited is no longer in the
    /// table: nothing is published for it.
    private func takePublications() -> [Publication] {
        let waiting = onWork.publications
        let batch = shared.withLock { s in
            waiting.filter { publication in
                let phase = s.lifecycle.phase(of: publication.job.id)
                return s.runs[publication.job.id] === publication.job && (phase == .finishing || phase == .rejected)
            }
        }
        onWork.publications = []
        return batch
    }

    /// On `work`: a job's result.plist staged in its folder; the time its first operation started, and the bytes as
    /// written when `keepingBytes` (a store that keeps the result gets them, not read back from the file). A folder
    /// removed under the running job is restored, and `publication` becomes a failure that says so.
    private func stageResult(_ publication: inout Publication, now: Double, node: String?,
                             keepingBytes: Bool) throws -> (firstStart: Double?, kept: [UInt8]?) {
        var firstStart: Double?
        let origin = store.origin(of: publication.job.id)
        var kept: [UInt8]? = keepingBytes ? [] : nil
        func stage(_ publication: Publication) throws {
            kept = kept.map { _ in [] }
            try store.stage(job: publication.job.id) { sink in
                firstStart = try ResultWriter.write(job: publication.job, status: publication.status, error: publication.error,
                                                    records: publication.records, now: now, origin: origin, node: node,
                                                    dropped: publication.dropped) { bytes in
                    kept?.append(contentsOf: bytes)
                    try sink(bytes)
                }
            }
        }
        do {
            try stage(publication)
        } catch let error as SpoolError where error.errno == ENOENT && !store.hasFolder(job: publication.job.id) {
            // Someone removed active/<job> while the job ran: the manifest comes back from memory and the
            // job ends failed, saying so (what its operations wrote there is gone), instead of waiting for a
            // folder that will never come back.
            try store.restoreFolder(job: publication.job.id, manifest: publication.job.claimed.manifest)
            let why = "active/\(publication.job.id) was removed while the job ran (not by the daemon): its manifest is restored, "
                + "what its operations wrote there is lost"
            publication = Publication(job: publication.job,
                                      status: publication.status == .succeeded ? .failed : publication.status,
                                      error: [publication.error, why].compactMap { $0 }.joined(separator: "\n"),
                                      records: publication.records, dropped: publication.dropped)
            logger.error("job \(publication.job.id): \(why)", metadata: ["OPQ_JOB": .string(publication.job.id)])
            try stage(publication)
        }
        return (firstStart, kept)
    }

    /// On `work`: what the job's folder holds that is not published is removed (EntryCheck), each path logged with
    /// why; the manifest's bytes are written again if its copy was one of them (SPEC §2: every entry holds it).
    private func checkEntry(_ job: RunningJob) -> [DroppedPath] {
        let dropped = EntryCheck.sweep(store.folders.job(job.id))
        guard !dropped.isEmpty else { return [] }
        if dropped.contains(where: { $0.path == "manifest.plist" }) {
            try? store.restoreFolder(job: job.id, manifest: job.claimed.manifest)
        }
        let what = dropped.map { "\($0.path) (\($0.reason))" }.joined(separator: "; ")
        logger.warning("job \(job.id): removed from active/\(job.id) before publication: \(what)", metadata: ["OPQ_JOB": .string(job.id)])
        return dropped
    }

    /// On the committer's thread, a batch's result.plist files durable: the store records the ends, then `place`
    /// on `work`. The publication gate: only the ends the store recorded are placed; the others were lost. A
    /// manifest rejected at submission (it never reached a cluster store) is this node's to publish.
    func record(_ batch: [Publication], _ staged: [(publication: Publication, firstStart: Double?)], results: [String: [UInt8]],
                        now: Double, hook: CommandSpec?) {
        let allGated = !store.capabilities.contains(.recordsEnds)
        let gated = staged.filter { allGated || $0.publication.job.fromStore }
        let ungated = Set(staged.lazy.filter { !(allGated || $0.publication.job.fromStore) }.map { $0.publication.job.id })
        let ends = gated.map { entry in
            let job = entry.publication.job.id
            return JobEnd(job: job, status: entry.publication.status.rawValue, resultFile: store.stagedResult(job: job),
                          result: results[job])
        }
        if ends.isEmpty || allGated {
            // The spool's own store records nothing elsewhere: at once.
            let recorded = ends.isEmpty ? .success(ungated) : Result { try store.complete(ends) }
            work.async { [self] in place(batch, staged, recorded: recorded, now: now, hook: hook) }
        } else {
            // A remote store: off the committer (which syncs the next batches meanwhile); each job stays
            // `finishing` until its batch is placed, but its slot and place go to new jobs at once, since the
            // recorder waits for more ends (Daemon.recordSpacing).
            shared.withLock { $0.recording += ends.count }
            store.ending(ends.map(\.job))
            durability.recorder.add(Recording(batch: batch, staged: staged, ends: ends, ungated: ungated, now: now, hook: hook))
            work.async { [self] in offerRoom() }
        }
    }

    /// On the recorder's queue: every batch that waited, recorded by the store in one round trip.
    func recordEnds(_ waiting: [Recording]) {
        let result = Result { try store.complete(waiting.flatMap(\.ends)) }
        // Back among the jobs in the shell's count until placed (a place is freed only then, if not by this count).
        shared.withLock { $0.recording -= waiting.reduce(0) { $0 + $1.ends.count } }
        for r in waiting {
            let recorded = result.map { $0.union(r.ungated) }
            work.async { [self] in place(r.batch, r.staged, recorded: recorded, now: r.now, hook: r.hook) }
        }
    }

    /// On `work`: a publication batch handed to the committer was announced or stalled.
    func publicationEnded() {
        shared.withLock { $0.publishing -= 1 }
    }

    /// On `work`: the second half of a publication batch, once the store answered: the recorded ends are placed
    /// in the outbox and committed, the others were lost; a store that could not answer stalls the batch.
    func place(_ batch: [Publication], _ staged: [(publication: Publication, firstStart: Double?)],
                       recorded answer: Result<Set<String>, any Error>, now: Double, hook: CommandSpec?) {
        let recorded: Set<String>
        switch answer {
        case .success(let ids): recorded = ids
        case .failure(let error):
            // Not known whether the store recorded them: they wait, as in a spool fault, and are offered again.
            onWork.fault.stall(staged.map(\.publication))
            spoolFailed("recording \(staged.count) job ends in the job store", error)
            publicationEnded()
            return
        }
        var placed: [(publication: Publication, firstStart: Double?, entry: String)] = []
        for entry in staged {
            guard recorded.contains(entry.publication.job.id) else {
                lose(entry.publication.job.id, reason: "the job store did not record its end (another node holds it)")
                _ = telemetry.timelines.take(job: entry.publication.job.id)
                continue
            }
            do {
                let id = entry.publication.job.id
                let (folder, name) = try store.place(job: id, inUse: idInUse)
                if name != id {
                    logger.warning("""
                        job \(id): \(folder)/\(id) was taken by something else after the job was claimed (left as it is); \
                        the job's entry is \(folder)/\(name)
                        """,
                                   metadata: ["OPQ_JOB": .string(id)])
                }
                placed.append((entry.publication, entry.firstStart, folder + "/" + name))
            } catch {
                stall(entry.publication, error)
            }
        }
        // Out of active/, the placed jobs leave the lifecycle now: their slots take the next claims while the renames
        // are made durable (each id stays in `runs` until it is announced: no claim reuses it, and the progress
        // log keeps its lines, in case a crash loses the rename and the job is found in active/ again).
        if !placed.isEmpty {
            for entry in placed {
                let result = shared.withLock { $0.lifecycle.published(job: entry.publication.job.id) }
                if case .left(let group?) = result { engine.release(group) }
            }
            claimMore()
            offerRoom()
        }
        // The renames made durable off `work`, then announced.
        durability.commits.after { [self, placed] outcome in
            work.async { [self] in announce(batch, placed, committed: outcome, now: now, hook: hook) }
        }
    }

    /// On `work`: the last step of a publication batch, its outbox renames committed (or not: then they stand,
    /// whole, and only their durability is in doubt): each job finished is announced and its id let go.
    func announce(_ batch: [Publication], _ placed: [(publication: Publication, firstStart: Double?, entry: String)],
                          committed: Result<Void, any Error>, now: Double, hook: CommandSpec?) {
        defer { publicationEnded() }
        switch committed {
        case .success:
            // Every step of the batch worked (and nothing waits from an earlier one): a fault is over.
            if onWork.fault.stalled.isEmpty { spoolWorked() }
        case .failure(let error):
            // The entries are in the outbox already (whole, by rename); only the renames' durability is in doubt,
            // and a rename the disk lost leaves the job in active/, published again at the next start.
            spoolFailed("committing \(placed.count) outbox entries (a crash before the disk recovers republishes them at the next start)",
                        error)
        }
        for (publication, firstStart, entry) in placed {
            let job = publication.job
            // Its downloads are no longer needed once the entry is out of active/ (a crash before this
            // leaves them to recovery, which removes the folders of jobs no longer active).
            if job.mayHave(.download) { store.discardDownloads(job: job.id) }
            var fields: Logger.Metadata = ["OPQ_EVENT": "job", "OPQ_STATE": "finished", "OPQ_JOB": .string(job.id),
                                           "OPQ_STATUS": .string(publication.status.rawValue)]
            if let firstStart { fields["OPQ_DURATION_USEC"] = .string(String(Int64(((now - firstStart) * 1e6).rounded()))) }
            if let error = publication.error { fields["OPQ_ERROR"] = .string(error) }
            metrics.jobEnded(status: publication.status)
            if tracing != nil { emitTrace(publication, finishedAt: now) }
            if publication.status != .rejected {
                event(publication.status == .succeeded ? .info : publication.status == .failed ? .error : .warning,
                      "job \(job.id) finished: \(publication.status.rawValue)", fields)
            }
            shared.withLock { $0.runs[job.id] = nil }
            if let hook { hooks.run(hook, job: job.id, status: publication.status.rawValue, entry: entry) }
        }
        do {
            try store.compactProgressIfLarge(active: shared.withLock { Set($0.runs.keys) })
        } catch {
            logger.error("rewriting the progress log failed: \(error); it keeps growing until the next start")
        }
        checkOnceDone()
        claimMore()
        offerRoom()
        releaseMemoryIfIdle(released: batch.reduce(0) { $0 + ($1.job.plan?.operations.count ?? 0) })
    }

    /// On `work`: once nothing is active, memory freed by the jobs that ended (a big manifest's tree, plan
    /// and records) goes back to the system when MemoryTrim says so.
    func releaseMemoryIfIdle(released: Int) {
        onWork.trim.released(released)
        // Idle: nothing in the table but delayed jobs (their manifests and plans were let go).
        guard shared.withLock({ $0.lifecycle.count == $0.lifecycle.delayedCount }) else { return }
        switch onWork.trim.idle(now: Date().timeIntervalSince1970) {
        case .trim: opq_release_free_memory()
        case .later(let seconds):
            work.asyncAfter(deadline: .now() + seconds) { [self] in
                onWork.trim.fired()
                releaseMemoryIfIdle(released: 0)
            }
        case .none: break
        }
    }

    // MARK: Spool faults

    /// On `work`: a publication could not be completed; it waits in active/ and is retried.
    func stall(_ publication: Publication, _ error: any Error) {
        onWork.fault.stall(CollectionOfOne(publication))
        spoolFailed("publishing outbox/\(publication.job.id)", error)
    }

    /// On `work`: a spool operation failed. The first failure of a fault is logged, claiming pauses,
    /// and a retry is scheduled; nothing is lost (claimed jobs stay in active/, the rest in the inbox).
    func spoolFailed(_ what: String, _ error: any Error) {
        if onWork.fault.failed(what, now: Date().timeIntervalSince1970) {
            shared.withLock { $0.lifecycle.setFault("\(what) failed: \(error)") }
            logger.error("""
                \(what) failed: \(error); claiming is paused and publication waits until the spool works again \
                (retried every few seconds)
                """)
        }
        scheduleFaultRetry()
    }

    /// On `work`: the spool worked; if a fault was on, it is over.
    func spoolWorked() {
        guard let ended = onWork.fault.worked(now: Date().timeIntervalSince1970) else { return }
        shared.withLock { $0.lifecycle.setFault(nil) }
        let seconds = String(format: "%.1f", ended.seconds)
        logger.notice("the spool works again after \(seconds) s (\(ended.what) had failed); claiming resumes")
    }

    func scheduleFaultRetry() {
        guard let delay = onWork.fault.scheduleRetry() else { return }
        work.asyncAfter(deadline: .now() + delay) { [self] in
            let retry = onWork.fault.retryDue()
            guard retry != .none else { return }
            do {
                logRemade(try store.probe())
            } catch {
                scheduleFaultRetry()
                return
            }
            if retry == .probe {
                spoolWorked()
                claimMore()
                offerRoom()
            } else {
                // Publication retried first; success there ends the fault (and claims more).
                onWork.publications = onWork.fault.takeStalled() + onWork.publications
                publishPending()
            }
        }
    }

    /// The spool's folders a fault's probe made again: someone removed them while the daemon ran.
    func logRemade(_ folders: [String]) {
        for folder in folders {
            logger.warning("\(folder) was missing from the spool (removed while the daemon ran): made again")
        }
    }

    func checkOnceDone() {
        guard once else { return }
        let waiters = shared.withLock { s in
            // Placed jobs have left the lifecycle; each is done once announced.
            guard s.lifecycle.onceDone && s.runs.isEmpty else { return [] as [@Sendable () -> Void] }
            defer { s.finishedWaiters = [] }
            return s.finishedWaiters
        }
        for waiter in waiters { waiter() }
    }

    /// For `--once`: returns when every job claimed at start (and recovered) has ended.
    public func runOnce() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            shared.withLock { $0.finishedWaiters.append { continuation.resume() } }
            scan()
        }
    }
}
