// The engine's side of a cluster-wide rate (SPEC §3.7 `clusterRateLimit`): a queue given a start budget starts
// its operations only on starts granted from outside, each before the grant's deadline (see Scheduler+Rate.swift).
// The holder (the daemon's ClusterRates) grants, takes back what is left, and learns what was used from the
// difference.

extension Engine {
    /// Gives a queue a start budget, empty at first (nothing starts until `grantStarts`), or removes it
    /// (`enabled` false: its starts are no longer gated by one; what was left is forgotten).
    public func setStartBudget(_ id: QueueID, enabled: Bool) {
        locked { s in
            guard s.queues.indices.contains(id.rawValue) else { return }
            s.setStartBudget(id.rawValue, enabled: enabled)
        }
    }

    /// Sets the queue's budget to `count` starts, to be made before `until` (monotonic seconds, CLOCK_MONOTONIC),
    /// replacing what was left (take it back first). `nextFree` (monotonic seconds): when the grantor said the
    /// next grant frees, for `status`. Starts work at once.
    public func grantStarts(_ id: QueueID, _ count: Int, until: Double, nextFree: Double?) {
        locked { s in
            guard s.queues.indices.contains(id.rawValue), s.queues[id.rawValue].budget != nil else { return }
            s.queues[id.rawValue].budget = StartBudget(starts: max(0, count), until: until, nextFree: nextFree)
        }
    }

    /// Empties the queue's budget and returns the starts that were left (made or not, none is made after this).
    public func takeBackStarts(_ id: QueueID) -> Int {
        locked { s in
            guard s.queues.indices.contains(id.rawValue), let budget = s.queues[id.rawValue].budget else { return 0 }
            s.queues[id.rawValue].budget?.starts = 0
            return budget.starts
        }
    }

    /// The starts left in the queue's budget, and how many of its ready operations could start now were starts
    /// granted (within its limits; 0 while suspended).
    public func startDemand(_ id: QueueID) -> (left: Int, wanted: Int) {
        locked { s in
            guard s.queues.indices.contains(id.rawValue) else { return (0, 0) }
            return (s.queues[id.rawValue].budget?.starts ?? 0, s.startDemand(id.rawValue))
        }
    }

    /// Notes when the grantor said the next grant frees (monotonic seconds; nil: unknown), for `status`.
    public func setNextFreeStart(_ id: QueueID, _ nextFree: Double?) {
        locked { s in
            guard s.queues.indices.contains(id.rawValue) else { return }
            s.queues[id.rawValue].budget?.nextFree = nextFree
        }
    }
}
