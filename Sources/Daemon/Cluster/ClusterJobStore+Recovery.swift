// ClusterJobStore at a node's start: what recovery found in active/ — resumed under its lease, published because its
// end was recorded, lost because another node took it, or submitted (an inbox claim) — and the folders without a
// claim record, recognised from the database now or, when it does not answer at start, once it does.

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
    /// What recovery found in active/, sorted by what the claim records and the database say.
    private struct RecoveredFolders {
        /// Claims from the cluster that may still be this node's, with their origins.
        var candidates: [(ClaimedJob, ClusterOrigin)] = []
        /// Those the database still gives this node (or whose end it recorded under their fence).
        var kept: [(ClaimedJob, ClusterOrigin)] = []
        /// Of `kept`, those whose end was recorded: published without recording again.
        var recorded: Set<String> = []
        var resubmit: [ClaimedJob] = []
        var lost: [String] = []
        /// Folders without a record that the database could not be asked about at start.
        var unverified: [ClaimedJob] = []
    }

    public func recovered(_ jobs: [ClaimedJob]) -> [ClaimedJob] {
        var folders = foldersByRecord(jobs)
        if !folders.unverified.isEmpty {
            let unverified = folders.unverified
            lock.withLock { self.unverified = unverified }
        }
        let sentAt = monotonicSeconds()
        confirm(&folders, sentAt: sentAt)
        for id in folders.lost {
            removeTree(spool.active + "/" + id)
            spool.discardDownloads(job: id)
            event(.warning, "job \(id): lost while this node was down; another node runs it (nothing published here)",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "lost", "OPQ_JOB": .string(id), "OPQ_ERROR": "taken over while this node was down"])
        }
        let resume = lock.withLock { () -> [ClaimedJob] in
            // Without an answer (database down at start) the jobs are kept, their lease counted from now.
            if !folders.kept.isEmpty { state.assumeRenewed(at: sentAt) }
            for (job, origin) in folders.kept {
                state.hold(job.id, fence: origin.fence, recorded: folders.recorded.contains(job.id))
                origins[job.id] = origin
            }
            return folders.kept.map(\.0)
        }
        // Those set aside before the restart first: a resubmitted one is set aside now, and must be queued once.
        for (folder, job) in spool.pendingSubmissions() { enqueue(job, folder: folder) }
        for job in folders.resubmit { enqueueSubmission(job) }
        lock.withLock {
            started = true
            // Beats before this one left the database's other jobs for this node alone (any might have resumed): the
            // next one reads them all again and hands back those not resumed, not the full beat a minute later.
            state.mayHaveBeenGivenJobs()
            claimWanted = true
            controlWanted = true
        }
        reportDeadline()
        kick()
        wantSubmit()
        return resume
    }

    /// The folders by their claim records: a claim from the cluster with its origin is a candidate, one whose origin
    /// is unreadable is lost, one without a record is recognised from the database if it can be, and an inbox claim
    /// is submitted again.
    private func foldersByRecord(_ jobs: [ClaimedJob]) -> RecoveredFolders {
        var folders = RecoveredFolders()
        // Whether the database answers the lookups of folders without a record (`recognised`): after one that it
        // did not, none is tried again (each would wait out its timeout, and the node is to start without it).
        var answering = true
        for job in jobs {
            let record = spool.readClaimRecord(spool.active + "/" + job.id)
            if let origin = record?.origin {
                folders.candidates.append((job, origin))
            } else if record?.claimedFromCluster == true {
                // Claimed from the cluster, its origin (fence) unreadable: it cannot be resumed under any lease;
                // the database gives it to a node again. Never submitted again as if from the inbox.
                folders.lost.append(job.id)
            } else if record == nil {
                if let recognised = recognised(job, answering: &answering) {
                    folders.candidates.append(recognised)
                } else if answering {
                    folders.resubmit.append(job)
                } else {
                    folders.unverified.append(job)
                }
            } else {
                folders.resubmit.append(job)
            }
        }
        return folders
    }

    /// Which candidates the database still gives this node, under the same fence (one beat); a job whose end was
    /// recorded under its fence before the restart is published without recording again. Without an answer to the
    /// beat, every candidate is kept.
    private func confirm(_ folders: inout RecoveredFolders, sentAt: Double) {
        folders.kept = folders.candidates
        guard !folders.candidates.isEmpty, let beat = try? waitBounded(Self.statementTimeout, on: executor,
                                                                       doing: "renewing the lease of node \(nodeName)",
                                                                       { [store, nodeName] in
            try await store.heartbeat(node: nodeName)
        }), beat.registered else { return }
        folders.kept = []
        for (job, origin) in folders.candidates {
            if beat.held[job.id] == origin.fence { folders.kept.append((job, origin)); continue }
            let record: JobRecord?
            do {
                record = try waitBounded(Self.statementTimeout, on: executor, doing: "looking up job \(job.id)", { [store] in
                    try await store.job(job.id)
                })
            } catch {
                folders.lost.append(job.id)
                continue
            }
            if let record, record.state == .finished, record.node == nodeName, record.fence == origin.fence {
                folders.kept.append((job, origin))
                folders.recorded.insert(job.id)
            } else if record == nil, !rowMayHaveBeenPruned(job.id) {
                event(.warning, "job \(job.id): the database has no row for this job that node \(nodeName) claimed "
                      + "(restored from a backup older than the job, or another database?); submitted again from the copy here",
                      ["OPQ_JOB": .string(job.id)])
                folders.resubmit.append(job)
            } else {
                folders.lost.append(job.id)
            }
        }
        lock.withLock { _ = state.beatSucceeded(sentAt: sentAt, held: [:]) }
    }

    /// Whether the row of `job`, a claim of this node's that the database no longer has, may have been pruned: its
    /// folder was last written less than an hour before keepFinishedDays ago, or earlier. Otherwise nobody ended the
    /// job long enough ago (another node takes a job over only once this node has stopped writing its folder —
    /// within moments of its lease's end — and finishes it after that), so the row is not gone by pruning: the
    /// database lost it, and the job runs nowhere unless it is submitted again.
    func rowMayHaveBeenPruned(_ job: String) -> Bool {
        let age = Date().timeIntervalSince1970 - Spool.claimTime(spool.active + "/" + job)
        return age >= settings.keepFinishedDays * 86_400 - 3_600
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
            found = try waitBounded(Self.statementTimeout, on: executor, doing: "looking up job \(job.id)", { [store] in
                try await store.job(job.id)
            })
        } catch {
            answering = false
            return nil
        }
        guard let row = found, isThisNodesClaim(row, of: job) else { return nil }
        event(.warning, "job \(job.id): active/\(job.id) had lost its claim record (a copy without extended attributes?); "
              + "the database says this node claimed it",
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
        try? spool.writeClaimRecord(ClaimRecord(manifest: kept.name, receivedAt: kept.receivedAt, requestedJob: kept.requested,
                                                origin: kept.origin),
                                    on: spool.active + "/" + job.id)
        return (claimed, kept.origin)
    }

    /// What a row says of a job, as this node keeps it: its inbox name if a spool can hold it (else the id's), the
    /// id it asked for if valid, node names checked, a reception time that is a time.
    static func kept(id: String, manifestName: String, requestedID: String, submittedOn: String, submittedAt: Double,
                             fromNode: String?,
                             fence: Int64) -> (name: String, requested: String?, receivedAt: Double, origin: ClusterOrigin) {
        let name = manifestName.contains("/") || manifestName.utf8.count > 255 || manifestName.isEmpty ? id + ".plist" : manifestName
        let origin = ClusterOrigin(fence: fence, submittedOn: isValidNodeName(submittedOn) ? submittedOn : "unknown",
                                   fromNode: fromNode.flatMap { isValidNodeName($0) ? $0 : nil })
        return (name, requestedID != id && isValidIdentifier(requestedID) ? requestedID : nil,
                submittedAt.isFinite ? submittedAt : Date().timeIntervalSince1970, origin)
    }

    /// The folders without a record that recovery could not look up (`recognised`), now that the database answers,
    /// before anything is submitted. One whose end this node recorded is published (resumed as recovery would have);
    /// one the database knows otherwise as this node's claim, or one taken from it, is not run from this copy: the
    /// copy goes (`lost` here), and a row still this node's is handed back at the next beat (it runs here nowhere),
    /// to run again from the database. Any other is an inbox claim, submitted. A lookup that fails throws: retried
    /// after the thread's backoff.
    func verifyUnrecorded() throws {
        while let job = lock.withLock({ unverified.first }) {
            let row = try waitBounded(Self.statementTimeout, on: executor, doing: "looking up job \(job.id)", { [store] in
                try await store.job(job.id)
            })
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
                event(.warning, "job \(job.id): active/\(job.id) had lost its claim record (a copy without extended attributes?); "
                      + "its end is recorded: published here",
                      ["OPQ_JOB": .string(job.id)])
                delegate?.run([claimed])
                continue
            }
            removeTree(spool.active + "/" + job.id)
            spool.discardDownloads(job: job.id)
            event(.warning, "job \(job.id): active/\(job.id) had lost its claim record (a copy without extended attributes?); "
                  + "the database holds the job: it runs again from there",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "lost", "OPQ_JOB": .string(job.id),
                   "OPQ_ERROR": "its copy here had lost its claim record"])
        }
    }
}
