// Later (SPEC §3.7): a job whose plan says `notBefore` (or `delaySeconds`) is accepted, logged `delayed`, and waits
// out of the budgets — its manifest and plan let go — until its time comes (read again from active/ and started) or
// a cancel ends it (started with the cancel, so that every operation ends cancelled). It survives restarts as any
// claimed job does: recovery reads its manifest and finds it delayed again.
//
// Memory: only a window of the earliest delayed jobs (`DelayedJobs.window`) is kept, each with its id and time (and
// its entry in the lifecycle's table). The others are parked: a line in active/.delayed (Stores/DelayedRecord.swift)
// and a count in the lifecycle. Every parked job comes after `horizon`, every job of the window at or before it, so
// the window's earliest is the earliest of all; when the window runs low it is filled again from the file, a buffer
// at a time. `show` and `cancel` of a parked job read its manifest (in active/) as they find it.

import Foundation
import HeapModule
import JobModel
import Logging

/// The delayed jobs' window, earliest first, the parked ones' file, and the one wake-up scheduled (on `work`).
struct DelayedJobs {
    struct Entry: Comparable {
        let until: Double
        let job: String
        /// Its end goes through the store's publication gate (see `RunningJob.fromStore`).
        let fromStore: Bool
        static func < (a: Entry, b: Entry) -> Bool { (a.until, a.job) < (b.until, b.job) }
        static func == (a: Entry, b: Entry) -> Bool { (a.until, a.job) == (b.until, b.job) }
    }

    /// The window (a min-max heap: its latest is the one parked when it overflows).
    var heap = Heap<Entry>()
    /// Every parked job comes after this, every job of the window at or before it; nil: none is parked.
    var horizon: Entry?
    /// Where parked jobs are written (nil: none is parked; a store that places jobs itself keeps them all).
    var record: DelayedRecord?
    var recordFailureLogged = false
    /// When the scheduled wake-up fires, if one is.
    var wakeAt: Double?
    /// Jobs delayed since the claim round began: they left their slots free, so the round goes on.
    var addedThisRound = 0
    /// Descriptors of skipped manifests held open a while (`holdSkipped`).
    var heldSkipped = 0
    /// The longest sleep: a wall clock set forward is noticed within this.
    static let longestSleep = 60.0
    /// Delayed jobs kept in memory at most (OPQUEUED_DELAYED_WINDOW, for tests), beside those holding cancels of
    /// single operations (never parked).
    static let window: Int = ProcessInfo.processInfo.environment["OPQUEUED_DELAYED_WINDOW"].flatMap { Int($0) }
        .map { max(1, $0) } ?? 1000
}

extension Daemon {
    /// On `work`, at start: parked jobs go to active/.delayed, emptied (recovery parks again those still waiting).
    /// A store that places jobs itself keeps its few delayed jobs (a clock behind the database's) in memory.
    func openDelayedRecord() {
        guard !store.capabilities.contains(.keepsDelayedJobs) else { return }
        let record = DelayedRecord(path: store.folders.active + "/.delayed")
        do {
            try record.reset()
            onWork.delayed.record = record
        } catch {
            logger.error("\(record.path) cannot be written: \(error); every delayed job is kept in memory")
        }
    }

    /// On `work`: `run`'s plan says not before `until`: it waits, holding no slot (in the window, or parked).
    func delay(_ run: RunningJob, until: Double, operations: Int) {
        let result = shared.withLock { s in
            s.runs[run.id] = nil
            return s.lifecycle.delayed(job: run.id, operations: operations, until: until)
        }
        if case .waits(let announce) = result { announce.forEach(log) }
        let entry = DelayedJobs.Entry(until: until, job: run.id, fromStore: run.fromStore)
        // After the horizon: parked at once. Else into the window, whose latest are parked if it overflows.
        if !(onWork.delayed.horizon.map { $0 < entry } == true && park(entry)) {
            onWork.delayed.heap.insert(entry)
            parkLatest()
        }
        onWork.delayed.addedThisRound += 1
        scheduleWake()
    }

    /// On `work`: takes a delayed job out of the lifecycle's table and writes its line; false when it stays in
    /// memory (it holds cancels of single operations, or the file cannot be written).
    private func park(_ entry: DelayedJobs.Entry) -> Bool {
        guard let record = onWork.delayed.record, shared.withLock({ $0.lifecycle.park(job: entry.job) }) else { return false }
        do {
            try record.append(until: entry.until, job: entry.job)
            return true
        } catch {
            shared.withLock { $0.lifecycle.unpark(job: entry.job, until: entry.until) }
            if !onWork.delayed.recordFailureLogged {
                onWork.delayed.recordFailureLogged = true
                logger.error("\(record.path) cannot be written: \(error); delayed jobs are kept in memory meanwhile (logged once)")
            }
            return false
        }
    }

    /// On `work`: parks the window's latest jobs while it holds more than `window` (those that cannot be parked stay,
    /// beside the window; one cancelled meanwhile, no longer delayed, is only dropped).
    private func parkLatest() {
        var kept: [DelayedJobs.Entry] = []
        while onWork.delayed.heap.count > DelayedJobs.window, let latest = onWork.delayed.heap.popMax() {
            guard isWaiting(latest) else { continue }
            guard park(latest) else {
                kept.append(latest)
                continue
            }
            // The heap holds at least `window` (one or more) entries here.
            if let last = onWork.delayed.heap.max { onWork.delayed.horizon = min(onWork.delayed.horizon ?? last, last) }
        }
        for entry in kept { onWork.delayed.heap.insert(entry) }
    }

    /// Whether a window's entry is its job's as it waits now (not one left by a job cancelled meanwhile, whose id a
    /// new job may have taken since).
    private func isWaiting(_ entry: DelayedJobs.Entry) -> Bool {
        shared.withLock { s in s.lifecycle.jobs[entry.job].map { $0.phase == .delayed && $0.notBefore == entry.until } == true }
    }

    /// On `work`: one wake-up, for the earliest delayed job (at most `longestSleep` away).
    func scheduleWake() {
        guard let first = onWork.delayed.heap.min else { return }
        if let at = onWork.delayed.wakeAt, at <= first.until { return }
        let now = Date().timeIntervalSince1970
        let at = min(first.until, now + DelayedJobs.longestSleep)
        onWork.delayed.wakeAt = at
        work.asyncAfter(deadline: .now() + max(0, at - now)) { [self] in
            if onWork.delayed.wakeAt == at { onWork.delayed.wakeAt = nil }
            wakeDue()
        }
    }

    /// On `work`: starts every delayed job whose time has come (one cancelled meanwhile was started then), and
    /// fills the window again from the parked jobs once it is half empty.
    func wakeDue() {
        let now = Date().timeIntervalSince1970
        while let first = onWork.delayed.heap.min, first.until <= now {
            onWork.delayed.heap.removeMin()
            let due = isWaiting(first) && shared.withLock { $0.lifecycle.due(job: first.job) }
            if due { wakeDelayed(first.job, fromStore: first.fromStore, timeCame: true) }
            if onWork.delayed.heap.count <= DelayedJobs.window / 2, onWork.delayed.horizon != nil { refillWindow() }
        }
        scheduleWake()
    }

    /// On `work`: the earliest parked jobs come back into the window (as many as it has room for); the file is
    /// written again when most of its lines are of jobs no longer parked.
    func refillWindow() {
        guard let record = onWork.delayed.record else { return }
        let room = DelayedJobs.window - onWork.delayed.heap.count, horizon = onWork.delayed.horizon
        guard room > 0 else { return }
        var chosen = Heap<DelayedJobs.Entry>()
        var chosenIDs = Set<String>()
        let fromStore = false  // parked jobs are the spool's own: a store that places jobs keeps no record
        do {
            try record.forEach { until, job in
                let entry = DelayedJobs.Entry(until: until, job: job, fromStore: fromStore)
                if let horizon, entry <= horizon { return }
                if chosen.count >= room, let latest = chosen.max, !(entry < latest) { return }
                guard !chosenIDs.contains(job), isParked(job) else { return }
                chosen.insert(entry)
                chosenIDs.insert(job)
                if chosen.count > room, let dropped = chosen.popMax() { chosenIDs.remove(dropped.job) }
            }
        } catch {
            logger.error("\(record.path) cannot be read: \(error); parked delayed jobs wait for the next start")
            return
        }
        // Fewer than there was room for: every parked job is back.
        let all = chosen.count < room
        onWork.delayed.horizon = all ? nil : chosen.max
        shared.withLock { s in
            for entry in chosen.unordered { s.lifecycle.unpark(job: entry.job, until: entry.until) }
            if all { s.lifecycle.setParkedCount(0) }
        }
        for entry in chosen.unordered { onWork.delayed.heap.insert(entry) }
        compactDelayedRecord(record, empty: all)
    }

    /// Whether a job of a line in active/.delayed is parked: not in the table, its folder still there (never under
    /// `shared`). A line of a job that ended, or of one that runs (woken, or cancelled), is not.
    private func isParked(_ job: String) -> Bool {
        shared.withLock { s in s.lifecycle.phase(of: job) == nil && s.runs[job] == nil } && store.hasFolder(job: job)
    }

    /// On `work`: active/.delayed emptied (no job parked) or written again with only its parked jobs' lines when
    /// most of it is lines of jobs gone; what it holds then is the parked count.
    private func compactDelayedRecord(_ record: DelayedRecord, empty: Bool) {
        let parked = shared.withLock { s in s.lifecycle.parkedCount }
        guard empty || record.lines > 2 * parked + DelayedJobs.window else { return }
        do {
            if empty {
                try record.reset()
                return
            }
            let horizon = onWork.delayed.horizon
            let counted = try record.rewrite { until, job in
                horizon.map { DelayedJobs.Entry(until: until, job: job, fromStore: false) > $0 } ?? true && isParked(job)
            }
            shared.withLock { $0.lifecycle.setParkedCount(counted) }
        } catch {
            logger.error("\(record.path) cannot be written again: \(error); it is kept as it is")
        }
    }

    /// On `work`: a job found out of the table with its folder in active/ (for a cancel): if its manifest gives it a
    /// time, it was parked, and comes back into the window to be cancelled there.
    func unparkForCancel(_ id: String) {
        guard shared.withLock({ s in s.lifecycle.phase(of: id) == nil && s.runs[id] == nil && s.lifecycle.parkedCount > 0 }),
              let until = heldDelayedPlan(id, comeToo: true)?.until else { return }
        shared.withLock { $0.lifecycle.unpark(job: id, until: until) }
        onWork.delayed.heap.insert(.init(until: until, job: id, fromStore: false))  // parked: the spool's own
        scheduleWake()
    }

    /// A job's time as its manifest in active/ says, if it is still to come (or, `comeToo`, if it has one: a parked
    /// job whose time came a moment ago waits for the window to be filled again), and its plan.
    func heldDelayedPlan(_ id: String, comeToo: Bool = false) -> (until: Double, plan: JobPlan)? {
        let config = shared.withLock { s in s.configuration }
        guard case .success(let claimed) = store.heldJob(id),
              case .success(let plan) = Manifest.parse(claimed.tree ?? ManifestTree(claimed.manifest), configuration: config,
                                                       accepted: true),
              let until = plan.startsAt(receivedAt: claimed.receivedAt), comeToo || until > Date().timeIntervalSince1970
        else { return nil }
        return (until, plan)
    }

    /// On `work`: a delayed job whose time came, or that a cancel woke: read again from active/ and started now
    /// (one whose time came is delayed again if its manifest says a later time: a stale line of active/.delayed).
    func wakeDelayed(_ id: String, fromStore: Bool? = nil, timeCame: Bool = false) {
        guard shared.withLock({ s in s.lifecycle.phase(of: id) == .received && s.runs[id] == nil }) else { return }
        let from = fromStore ?? onWork.delayed.heap.unordered.first { $0.job == id }?.fromStore ?? false
        switch store.heldJob(id) {
        case .success(var claimed):
            let tree = claimed.tree ?? ManifestTree(claimed.manifest)
            claimed.tree = nil
            let run = RunningJob(claimed: claimed)
            run.fromStore = from
            shared.withLock { s in s.runs[id] = run }
            let config = shared.withLock { s in s.configuration }
            // Accepted before: a queue or command a reload removed since does not reject it (`Manifest.parse`).
            let (problems, parsed) = Self.problems(tree, configuration: config, accepted: true)
            guard problems.isEmpty, let plan = parsed else {
                reject(run, problems: problems, error: problems.joined(separator: "\n"))
                return
            }
            start(run, plan, configuration: config, now: !timeCame)
        case .failure(let error):
            // Its folder is gone or unreadable: nothing can run or be published for it.
            logger.error("delayed job \(id) cannot be read back from active/: \(error); it is dropped",
                         metadata: ["OPQ_JOB": .string(id), "OPQ_ERROR": .string("\(error)")])
            lose(id, reason: "its folder in active/ cannot be read: \(error)")
        }
    }
}
