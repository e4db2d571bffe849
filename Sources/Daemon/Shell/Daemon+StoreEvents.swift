// The shell as the job store's delegate (see Daemon.swift and Stores/JobStore.swift).

import JobModel
import Logging
import OperationEngine

// MARK: The store's calls (any thread; each hops onto `work`)

/// Forwards the engine's event batches and the job store's calls to the daemon while it lives (weak: the daemon owns
/// the engine and the store). Its own object: the delegate's `cancel(job:operation:)` would collide with the control
/// plane's.
final class Relay: JobStoreDelegate, @unchecked Sendable {
    weak var daemon: Daemon?
    func deliver(_ events: [EngineEvent]) { daemon?.deliver(events) }
    func run(_ jobs: [ClaimedJob]) { daemon?.storeRun(jobs) }
    func lost(_ jobs: [String], reason: String) { daemon?.storeLost(jobs, reason: reason) }
    func forgotten(_ jobs: [String], reason: String) { daemon?.storeLost(jobs, reason: reason, resubmit: true) }
    func cancel(job: String, operation: String?) { daemon?.storeCancel(job: job, operation: operation) }
    func suspendedQueuesChanged(_ queues: Set<String>) { daemon?.storeSuspendedQueuesChanged(queues) }
    func spoolFailed(_ what: String, _ error: any Error) { daemon?.storeSpoolFailed(what, error) }
    func holds(job: String) -> Bool { daemon?.idInUse(job) ?? false }
    func spoolStalledSeconds() -> Double { daemon?.durability.watch.stalledSeconds() ?? 0 }
    func submitted(_ ids: [(manifest: String, inode: UInt64?, job: String)]) { daemon?.recordSubmitted(ids) }
    func progress() -> [UInt8]? {
        guard let daemon else { return nil }
        return daemon.telemetry.progress.sample { [weak daemon] in daemon?.clusterProgress() ?? [] }
    }
}

extension Daemon {
    func storeRun(_ jobs: [ClaimedJob]) {
        work.async { [self] in
            // Rows are input: each is read against this node's configuration, a bad one ends `rejected` here.
            let config = shared.withLock { s in s.configuration }
            for job in jobs {
                // A job cancelled as a whole before it came here runs nothing: read as its submitter read it (against
                // what the cluster declares), it ends cancelled here even when this node lacks one of its queues or
                // commands (an operation's queue unknown here stands for it: none of them starts).
                var read = config
                if job.cancels.contains(where: { $0 == nil }) {
                    read = store.submissionConfiguration(config)
                    // What the cluster declares may have grown since the store last read it.
                    if case .failure = Manifest.parse(job.tree ?? ManifestTree(job.manifest), configuration: read),
                       let fresh = store.freshSubmissionConfiguration(config) {
                        read = fresh
                    }
                }
                accept(job, .claimed(fromNode: store.origin(of: job.id)?.fromNode), configuration: read)
            }
        }
    }

    func storeLost(_ jobs: [String], reason: String, resubmit: Bool = false) {
        work.async { [self] in
            for job in jobs {
                lose(job, reason: reason, resubmit: resubmit)
            }
            checkOnceDone()
            claimMore()
            offerRoom()
        }
    }

    func storeSpoolFailed(_ what: String, _ error: any Error) {
        work.async { [self] in spoolFailed(what, error) }
    }

    func storeCancel(job: String, operation: String?) {
        work.async { [self] in _ = cancelHere(job: job, operation: operation) }
    }

    func storeSuspendedQueuesChanged(_ queues: Set<String>) {
        work.async { [self] in
            let (config, previous, first, stopping, local, queueIDs) = shared.withLock { s in
                defer { s.storeSuspended = queues; s.awaitingStoreSuspensions = false }
                let stopping: Bool
                if case .stopping = s.lifecycle.admission { stopping = true } else { stopping = false }
                // A local suspension or resumption the store now agrees with is the store's again.
                for (name, asked) in s.localSuspensions where queues.contains(name) == asked { s.localSuspensions[name] = nil }
                return (s.configuration, s.storeSuspended, s.awaitingStoreSuspensions, stopping, s.localSuspensions, s.queueIDs)
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
