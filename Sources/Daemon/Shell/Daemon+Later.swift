// Later (SPEC §3.7): a job whose plan says `notBefore` (or `delaySeconds`) is accepted, logged `delayed`, and waits
// out of the budgets — its manifest and plan let go, only its id and time kept — until its time comes (read again
// from active/ and started) or a cancel ends it (started with the cancel, so that every operation ends cancelled).
// It survives restarts as any claimed job does: recovery reads its manifest and finds it delayed again.

import Foundation
import HeapModule
import Logging

/// The delayed jobs' wake-up times, earliest first, and the one wake-up scheduled (on `work`).
struct DelayedJobs {
    struct Entry: Comparable {
        let until: Double
        let job: String
        /// Its end goes through the store's publication gate (see `RunningJob.fromStore`).
        let fromStore: Bool
        static func < (a: Entry, b: Entry) -> Bool { (a.until, a.job) < (b.until, b.job) }
    }

    var heap = Heap<Entry>()
    /// When the scheduled wake-up fires, if one is.
    var wakeAt: Double?
    /// Jobs delayed since the claim round began: they left their slots free, so the round goes on.
    var addedThisRound = 0
    /// Descriptors of skipped manifests held open a while (`holdSkipped`).
    var heldSkipped = 0
    /// The longest sleep: a wall clock set forward is noticed within this.
    static let longestSleep = 60.0
}

extension Daemon {
    /// On `work`: `run`'s plan says not before `until`: it waits, holding no slot.
    func delay(_ run: RunningJob, until: Double, operations: Int) {
        let actions = lock.withLock {
            runs[run.id] = nil
            return lifecycle.handle(.delayed(job: run.id, operations: operations, until: until))
        }
        perform(actions)
        delayed.heap.insert(.init(until: until, job: run.id, fromStore: run.fromStore))
        delayed.addedThisRound += 1
        scheduleWake()
    }

    /// On `work`: one wake-up, for the earliest delayed job (at most `longestSleep` away).
    func scheduleWake() {
        guard let first = delayed.heap.min else { return }
        if let at = delayed.wakeAt, at <= first.until { return }
        let now = Date().timeIntervalSince1970
        let at = min(first.until, now + DelayedJobs.longestSleep)
        delayed.wakeAt = at
        work.asyncAfter(deadline: .now() + max(0, at - now)) { [self] in
            if delayed.wakeAt == at { delayed.wakeAt = nil }
            wakeDue()
        }
    }

    /// On `work`: starts every delayed job whose time has come (one cancelled meanwhile was started then).
    func wakeDue() {
        let now = Date().timeIntervalSince1970
        while let first = delayed.heap.min, first.until <= now {
            delayed.heap.removeMin()
            let due = lock.withLock { () -> Bool in
                guard lifecycle.phase(of: first.job) == .delayed else { return false }
                _ = lifecycle.handle(.due(job: first.job))
                return true
            }
            if due { wakeDelayed(first.job, fromStore: first.fromStore) }
        }
        scheduleWake()
    }

    /// On `work`: a delayed job whose time came, or that a cancel woke: read again from active/ and started now.
    func wakeDelayed(_ id: String, fromStore: Bool? = nil) {
        guard lock.withLock({ lifecycle.phase(of: id) == .received && runs[id] == nil }) else { return }
        let from = fromStore ?? delayed.heap.unordered.first { $0.job == id }?.fromStore ?? false
        switch spool.heldJob(id) {
        case .success(var claimed):
            let tree = claimed.tree ?? ManifestTree(claimed.manifest)
            claimed.tree = nil
            let run = RunningJob(claimed: claimed)
            run.fromStore = from
            lock.withLock { runs[id] = run }
            let config = lock.withLock { configuration }
            let (problems, parsed) = Self.problems(tree, configuration: config)
            guard problems.isEmpty, let plan = parsed else {
                perform(handle(.rejected(job: id, problems: problems, error: problems.joined(separator: "\n"))), for: run)
                return
            }
            start(run, plan, configuration: config, now: true)
        case .failure(let error):
            // Its folder is gone or unreadable: nothing can run or be published for it.
            logger.error("delayed job \(id) cannot be read back from active/: \(error); it is dropped",
                         metadata: ["OPQ_JOB": .string(id), "OPQ_ERROR": .string("\(error)")])
            perform(lock.withLock { lifecycle.handle(.lost(job: id, reason: "its folder in active/ cannot be read: \(error)")) })
        }
    }
}
