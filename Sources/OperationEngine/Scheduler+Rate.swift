// The scheduler's side of queue rates (SPEC §3.7 "At a rate"): a queue with a rate starts an operation
// only when its `RateWindow` has a start free; otherwise its ready operations stay ready and one timer
// per queue wakes the scheduler when the window frees the next start (nothing polls).
//
// Rate windows run on the clock the caller passes as `monotonic` (the engine's monotonic clock, so that
// a step of the wall clock neither stalls a queue nor frees it early); `status` gets the next free start
// converted to seconds since the epoch.
//
// A cluster-wide rate (SPEC §3.7 `clusterRateLimit`) is a start budget granted from outside: so many starts,
// each to be made before a deadline on the same monotonic clock, else not at all (the grantor stops counting
// a grant it gave some time after that deadline). Unlike a cluster slot's permit it is used up by starting,
// not by ending. The holder takes back what is left and grants anew; nothing starts without one.

/// Starts granted to a queue from outside (`Engine.grantStarts`).
struct StartBudget {
    /// Starts left to make.
    var starts = 0
    /// They must be made before this (monotonic seconds).
    var until = -Double.infinity
    /// When the grantor said the next grant frees (monotonic seconds), for `status`; nil: unknown.
    var nextFree: Double?
}

extension Scheduler {
    /// Sets, changes (keeping the starts made so far) or removes (nil) a queue's rate.
    mutating func setRate(_ q: Int, _ limit: RateLimit?) {
        let had = queues[q].rate != nil
        if let limit {
            if had { queues[q].rate?.change(to: limit) } else { queues[q].rate = RateWindow(limit) }
        } else {
            queues[q].rate = nil
            queues[q].rateTimer = nil
        }
        ratedQueues += (limit == nil ? 0 : 1) - (had ? 1 : 0)
    }

    /// Whether the queue's rate lets an operation start at `time`. When it does not, a timer is asked for
    /// the next free start, unless one that fires no later is armed already.
    mutating func rateAllows(_ q: Int, at time: Double) -> Bool {
        guard let free = queues[q].rate?.nextFreeStart(at: time) else { return true }
        if let armed = queues[q].rateTimer, armed <= free { return false }
        queues[q].rateTimer = free
        timerRequests.append(TimerRequest(delay: free - time, kind: .rateWindow(queue: q, at: free)))
        return false
    }

    /// The queue's next free start in seconds since the epoch (`now`, read with `monotonic`): nil when
    /// it has no rate or a start is free now (a start budget that is spent and says no time: as far as known).
    func nextStartAt(_ q: Int, now: Double, monotonic: Double) -> Double? {
        var free = queues[q].rate?.nextFreeStart(at: monotonic)
        if let budget = queues[q].budget, budget.starts == 0 || monotonic >= budget.until,
           let next = budget.nextFree, next > monotonic {
            free = max(free ?? next, next)
        }
        return free.map { now + ($0 - monotonic) }
    }

    /// Whether an operation of the queue may start at `time`: a start budget left before its deadline, and a
    /// start free in the rate's window.
    mutating func startAllowed(_ q: Int, at time: Double) -> Bool {
        if let budget = queues[q].budget, budget.starts <= 0 || time >= budget.until { return false }
        return queues[q].rate == nil || rateAllows(q, at: time)
    }

    /// An operation of the queue starts at `time`: the rate records it, the budget spends one.
    mutating func noteStart(_ q: Int, at time: Double) {
        queues[q].rate?.record(time)
        queues[q].budget?.starts -= 1
    }

    /// Gives the queue a start budget (empty: nothing starts until starts are granted), or removes it (nil).
    mutating func setStartBudget(_ q: Int, enabled: Bool) {
        let had = queues[q].budget != nil
        guard had != enabled else { return }
        queues[q].budget = enabled ? StartBudget() : nil
        ratedQueues += enabled ? 1 : -1
    }

    /// How many of the queue's ready operations could start now were starts granted: its ready ones, within its
    /// limits (0 while suspended).
    func startDemand(_ q: Int) -> Int {
        if queues[q].suspended { return 0 }
        return max(0, min(queues[q].readyCount, effectiveLimit(q) - queues[q].executing))
    }
}

extension Scheduler.Queue {
    /// Whether its starts are gated (a rate or a start budget).
    var gatesStarts: Bool { rate != nil || budget != nil }
}
