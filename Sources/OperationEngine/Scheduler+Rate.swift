// The scheduler's side of queue rates (SPEC §3.7 "At a rate"): a queue with a rate starts an operation
// only when its `RateWindow` has a start free; otherwise its ready operations stay ready and one timer
// per queue wakes the scheduler when the window frees the next start (nothing polls).
//
// Rate windows run on the clock the caller passes as `monotonic` (the engine's monotonic clock, so that
// a step of the wall clock neither stalls a queue nor frees it early); `status` gets the next free start
// converted to seconds since the epoch.

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
    /// it has no rate or a start is free now.
    func nextStartAt(_ q: Int, now: Double, monotonic: Double) -> Double? {
        guard let free = queues[q].rate?.nextFreeStart(at: monotonic) else { return nil }
        return now + (free - monotonic)
    }
}
