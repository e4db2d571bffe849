// ClusterJobStore's submissions: manifests claimed from this node's inbox (or folders handed over from active/) set
// aside in active/.submissions, inserted by the batch on a thread of their own, their local copies removed only
// after the commit (or renamed into active/<job>/ when this node claims the row first).

import ClusterStore
import Foundation
import JobModel
import Logging
import SpoolFiles
import SystemCalls

extension ClusterJobStore {
    func enqueueSubmission(_ job: ClaimedJob) {
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

    func enqueue(_ job: ClaimedJob, folder: String) {
        // The key survives a restart: the node and which inbox file it was (a file claimed for the cluster), or the
        // inbox name and the reception time recorded at claim (a folder handed over from active/).
        let key = job.id.hasPrefix(".") ? "\(nodeName)/\(job.id.dropFirst())" : "\(nodeName)/\(job.manifestName)/\(job.receivedAt)"
        let new = row(for: job, submittedOn: nodeName, key: key)
        lock.withLock { pending.append((folder, job.id.hasPrefix("."), key, new, job.inboxInode, job.receivedAt)) }
    }

    /// What the database keeps of a job this node holds: its manifest and where it may run.
    func row(for job: ClaimedJob, submittedOn: String, key: String?) -> NewJob {
        let config = submissionConfiguration(lock.withLock { configuration })
        var placement = (qos: 2, priority: 2, queues: [String](), commands: [String]())
        var plan = job.plan
        // The plan the shell made of a manifest from the inbox (not parsed again); a folder handed over from
        // active/, or one a previous run left to submit, is read here.
        if plan == nil, case .success(let parsed) = Manifest.parse(job.tree ?? ManifestTree(job.manifest), configuration: config) {
            plan = parsed
        }
        if let plan { placement = plan.clusterPlacement(config) }
        // A folder handed over from active/ was accepted here before: its id is its own, never skipped.
        return NewJob(requestedID: job.requestedJob ?? job.id, manifest: Array(job.manifest), manifestName: job.manifestName,
                      submittedOn: submittedOn, qosRank: placement.qos, priorityRank: placement.priority,
                      queues: placement.queues, commands: placement.commands, submissionKey: key,
                      notBefore: plan?.startsAt(receivedAt: job.receivedAt),
                      skipIfExists: job.id.hasPrefix(".") && plan?.skipIfExists == true)
    }

    func wantSubmit() { submitWake.signal() }

    /// Inserts what waits in `pending`, a batch (one statement) at a time, beside the loop's beats and claims: a
    /// flood into this node's inbox neither holds back its heartbeat nor its claims. Waits for the loop's first
    /// connection (the schema). After a failure, again `backoff` later (0.1 s doubling to 5 s), however many
    /// manifests arrive meanwhile; the loop is asked to check the connection, and it logs `disconnected` and
    /// `connected`.
    func submitLoop() {
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

    /// Inserts one batch of what waits (up to 256, one transaction); the local copies go only after the commit.
    /// Returns whether more wait.
    private func submitPending() throws -> Bool {
        try verifyUnrecorded()
        do {
            let batch = lock.withLock { Array(pending.prefix(256)) }
            if batch.isEmpty { return false }
            let jobs = batch.map(\.job)
            lock.withLock { insertingNames = Set(batch.lazy.filter(\.isFile).map(\.job.manifestName)) }
            defer { lock.withLock { insertingNames = [] } }
            let inserted = try waitBounded(Self.statementTimeout * 2, on: executor, doing: "inserting \(jobs.count) job(s)", { [store] in
                try await store.insertJobs(jobs)
            })
            logSubmitted(zip(batch.map(\.job), inserted))
            // Answers come in batch order; a batch answered short says nothing of which is which.
            if inserted.count == batch.count {
                delegate?.submitted(zip(batch, inserted).map { ($0.job.manifestName, $0.inode, $1.id) })
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
                insertingNames = []
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
    func reap(_ jobs: [String]) {
        for job in jobs {
            if let file = lock.withLock({ adoptable.removeValue(forKey: job) }) { removeTree(file) }
        }
    }

    /// The journal's word on a batch just inserted: a skipped manifest (§3.7), a delayed job and its time.
    private func logSubmitted(_ rows: Zip2Sequence<[NewJob], [InsertedJob]>) {
        let now = Date().timeIntervalSince1970
        for (job, row) in rows {
            if row.skipped {
                logger.info("inbox/\(job.manifestName) skipped: job \(row.id) exists in the cluster (ifJobExists = skip)",
                            metadata: ["OPQ_EVENT": "job", "OPQ_STATE": "skipped", "OPQ_JOB": .string(row.id),
                                       "OPQ_MANIFEST": .string(job.manifestName)])
            } else if let until = job.notBefore, until > now {
                logger.info("job \(row.id) accepted and delayed until \(TimeText.local(until))",
                            metadata: ["OPQ_EVENT": "job", "OPQ_STATE": "delayed", "OPQ_JOB": .string(row.id),
                                       "OPQ_NOT_BEFORE": .string(TimeText.epoch(until))])
            } else {
                logger.debug("job \(row.id): submitted to the cluster", metadata: ["OPQ_JOB": .string(row.id)])
            }
        }
    }
}
