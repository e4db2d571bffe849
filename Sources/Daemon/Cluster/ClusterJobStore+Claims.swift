// ClusterJobStore's claim rounds, on the loop thread: how many jobs to claim and when (ClaimPacing), the claim
// statement, and the claimed rows made jobs of this node (written to the spool, handed to the shell) or handed back.

import ClusterStore
import Foundation
import JobModel
import Logging
import SpoolFiles
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

extension ClusterJobStore {
    /// Claims a waiting job cancelled as a whole for this node (whatever it declares: it runs nothing), for the loop's
    /// next claim round to take in; nothing when it no longer waits or another node is taking it.
    func takeCancelled(_ job: String) throws {
        let row: ClusterClaimedJob?
        do {
            row = try waitBounded(Self.statementTimeout, on: executor,
                                  doing: "claiming the cancelled job \(job)", { [store, nodeName, maxManifestBytes] in
                try await store.claimCancelled(job: job, node: nodeName, maxManifestBytes: maxManifestBytes)
            })
        } catch {
            // The claim may have been made, its answer lost.
            lock.withLock { state.mayHaveBeenGivenJobs() }
            throw error
        }
        guard let row else { return }
        lock.withLock {
            cancelledClaims.append(row)
            claimWanted = true
        }
        kick()
    }

    /// One claim round for the room the shell has, and the jobs' files written before they run.
    func claim() throws {
        // Cancelled jobs `requestCancel` claimed here: taken in whatever the room (they run nothing).
        let cancelled = lock.withLock { () -> [ClusterClaimedJob] in
            defer { cancelledClaims = [] }
            return cancelledClaims
        }
        if !cancelled.isEmpty { take(cancelled, limit: nil) }
        let (limit, budget, declaration) = lock.withLock { () -> (Int, Int, NodeDeclaration) in
            let now = monotonicSeconds()
            let running = state.running, free = settings.jobSlots - running
            let may = state.mayTakeLeases(now: now) && !claimsStopped
            var limit = may && manifestBudget > 0 ? min(room, free) : 0
            claimDue = nil
            // A small round of a busy node while more waits: put off (ClaimPacing), the loop asked to come back.
            if limit > 0, case .putOff(let until) = claimPacing.decide(limit: limit, held: running,
                                                                       slots: settings.jobSlots, now: now) {
                limit = 0
                claimDue = until
                claimWanted = true
            }
            claimInFlight = limit > 0
            return (limit, manifestBudget, configuration.declaration(node: nodeName, jobSlots: settings.jobSlots))
        }
        if limit <= 0 { return }
        defer {
            lock.withLock { claimInFlight = false }
            claimEnded.signal()
        }
        let rows = try waitBounded(Self.statementTimeout, on: executor,
                                   doing: "claiming jobs for node \(nodeName)", { [store, nodeName, maxManifestBytes] in
            try await store.claimJobs(node: nodeName, limit: limit, queues: declaration.queues, commands: declaration.commands,
                                      budget: budget, maxManifestBytes: maxManifestBytes)
        })
        lock.withLock { claimPacing.claimed(rows: rows.count, limit: limit) }
        take(rows, limit: limit)
    }

    /// What one `take` did with its rows so far.
    private struct TakeRound {
        /// Written to the spool, not yet handed to the shell.
        var run: [ClaimedJob] = []
        var handedOver = 0
        var overBudget = false
        var refused: [JobCompletion] = []
        /// Handed back to the cluster: job → fence.
        var failed: [String: Int64] = [:]
        var spoolError: (job: String, error: any Error)?
    }

    /// Makes claimed rows jobs of this node (its spool's copy, then the shell's), or hands them back. `limit`: the claim
    /// round's, when they are its rows (a full round looks again at once).
    private func take(_ rows: [ClusterClaimedJob], limit: Int?) {
        if rows.isEmpty { return }
        var round = TakeRound()
        for row in rows { take(row, into: &round) }
        settle(round)
        guard round.handedOver > 0 || !round.run.isEmpty else { return }
        // No spool commit before they run: the database holds the job, not this copy. A crash that loses the copy
        // (or half of it: a folder whose record is gone is recognised from the database at recovery, `recognised`)
        // leaves the row running under this node's fence; the restarted node hands it back at its first beat, or
        // another takes it over after the lease. The publication commits result.plist before the fenced completion.
        if !round.run.isEmpty {
            reportDeadline()
            delegate?.run(round.run)
        }
        // More may wait: look again at once while there is room (not when the budget sent rows back: the shell
        // offers more once its jobs have taken their operations).
        guard !round.overBudget, let limit else { return }
        lock.withLock { if room > 0 && rows.count == limit { claimWanted = true } }
        if rows.count == limit { kick() }
    }

    /// One claimed row: refused when unusable, handed back when it cannot be taken now, else written to the spool.
    private func take(_ row: ClusterClaimedJob, into round: inout TakeRound) {
        // The spool cannot take jobs now (disk full, …): the rest goes back untried.
        if round.spoolError != nil {
            round.failed[row.id] = row.fence
            return
        }
        guard isValidIdentifier(row.id) else {
            round.refused.append(rejection(row, "its id is not a valid job id ([A-Za-z0-9._-]{1,128}, not starting with '.')"))
            return
        }
        guard row.manifestBytes <= maxManifestBytes else {
            round.refused.append(rejection(row, "its manifest is \(row.manifestBytes) bytes, "
                                           + "more than the \(maxManifestBytes) a manifest may hold"))
            return
        }
        guard row.manifest.count == row.manifestBytes else {
            // Past this claim's budget (the manifests before it may hold the rest of the shell's operations):
            // handed back, to be claimed when there is room, here or on another node.
            round.failed[row.id] = row.fence
            round.overBudget = true
            return
        }
        if delegate?.holds(job: row.id) == true {
            // A job of this node's that was rejected here at submission under the same id is ending: the row
            // waits until the id is free here (the shell would take one job for the other).
            round.failed[row.id] = row.fence
            return
        }
        materialise(row, into: &round)
    }

    /// The file of this node's own submission `row`, when it is still here. A row claimed while its insert's answer is
    /// on its way (the claim can come first) waits for that answer rather than write the bytes again: briefly, the loop
    /// thread also beats (half a second at most, a twentieth of the lease). Only a row whose inbox name the insert
    /// under way carries waits: a backlog's rows, claimed long after their files were reaped, never do.
    private func adoptableFile(_ row: ClusterClaimedJob) -> String? {
        let until = monotonicSeconds() + min(0.5, settings.leaseSeconds / 20)
        while true {
            let (file, wait) = lock.withLock { () -> (String?, Bool) in
                if let file = adoptable.removeValue(forKey: row.id) { return (file, false) }
                return (nil, row.submittedOn == nodeName && insertingNames.contains(row.manifestName))
            }
            guard wait, monotonicSeconds() < until else { return file }
            usleep(1_000)
        }
    }

    /// Writes a usable row's job to the spool and holds it; the shell gets the jobs by chunks of `handOverChunk`.
    private func materialise(_ row: ClusterClaimedJob, into round: inout TakeRound) {
        let (name, requested, receivedAt, origin) = Self.kept(id: row.id, manifestName: row.manifestName, requestedID: row.requestedID,
                                                              submittedOn: row.submittedOn, submittedAt: row.submittedAt,
                                                              fromNode: row.fromNode, fence: row.fence)
        // One of this node's own submissions whose file is still here: renamed in, not written again.
        let file = adoptableFile(row)
        do {
            try spool.materialise(job: row.id, manifest: row.manifest, manifestName: name, receivedAt: receivedAt,
                                  requestedJob: requested, origin: origin, manifestFile: file)
            let data = Data(row.manifest)
            round.run.append(ClaimedJob(id: row.id, requestedJob: requested, manifestName: name, receivedAt: receivedAt, manifest: data,
                                        tree: ManifestTree(data), done: [:],
                                        cancels: row.cancels))
            lock.withLock {
                state.hold(row.id, fence: row.fence)
                state.claimedWithCancels(row.id, row.cancels)
                origins[row.id] = origin
                room = max(0, room - 1)
                manifestBudget -= row.manifestBytes
            }
            // The shell starts the first jobs of a big claim while the rest are written.
            if round.run.count == Self.handOverChunk {
                reportDeadline()
                delegate?.run(round.run)
                round.handedOver += round.run.count
                round.run = []
            }
        } catch let error as SpoolError where error.errno == EEXIST {
            // This node's own inbox claim of a manifest asking for the same id, on its way to
            // active/.submissions: left alone; the row is claimed again once the name is free.
            logger.debug("job \(row.id): active/\(row.id) is in use here for a moment; handed back to the cluster",
                         metadata: ["OPQ_JOB": .string(row.id)])
            round.failed[row.id] = row.fence
        } catch {
            // `materialise` removed what it wrote. Claiming stops here (no room until the shell offers it again,
            // once the spool works): claimed again at once, the row would fail again, in a loop of claims and
            // hand-backs.
            logger.error("job \(row.id): claimed but cannot be written to the spool: \(error); handed back to the cluster",
                         metadata: ["OPQ_JOB": .string(row.id), "OPQ_ERROR": .string("\(error)")])
            round.failed[row.id] = row.fence
            round.spoolError = (row.id, error)
            lock.withLock {
                room = 0
                claimWanted = false
            }
        }
    }

    /// The round's hand-backs queued for the next beat, a spool failure reported, unusable rows recorded `rejected`.
    private func settle(_ round: TakeRound) {
        if !round.failed.isEmpty { lock.withLock { jobReleases.merge(round.failed) { $1 } } }
        if let spoolError = round.spoolError {
            delegate?.spoolFailed("writing the claimed job active/\(spoolError.job)", spoolError.error)
        }
        if !round.refused.isEmpty {
            let refused = round.refused
            _ = try? waitBounded(Self.statementTimeout, on: executor, doing: "recording rejected rows", { [store] in
                try await store.completeJobs(refused)
            })
        }
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
}
