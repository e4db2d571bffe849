// ClusterJobStore's loop thread: connect (migrate, register), heartbeat and takeover, hand-backs, claims (their rounds
// and the jobs' files in +Claims), cancels and suspensions — one round trip at a time, so that a beat's answer never
// crosses a claim.

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
    func kick() { loopWake.signal() }

    /// clusterMaxConcurrentOperationCount (SPEC §8): the shell's ClusterPermits take slots only while this node's
    /// lease is good, record them here so that the lease deadline covers them, lose them at the deadline, and
    /// hear when another node frees one.
    func attach(permits: ClusterPermits) {
        lock.withLock { self.permits = permits }
        permits.attach(.init(
            mayAcquire: { [weak self] in
                guard let self else { return false }
                return self.lock.withLock { self.state.mayTakeLeases(now: monotonicSeconds()) }
            },
            holding: { [weak self] lease, held in
                guard let self else { return }
                let key = ClusterNodeState.SlotKey(queue: lease.queue, slot: lease.slot, fence: lease.fence)
                self.lock.withLock {
                    if held { self.state.addSlot(key) } else { _ = self.state.removeSlot(key) }
                }
                self.reportDeadline()
            }))
    }

    func heard(_ wakeup: Wakeup) {
        switch wakeup {
        case .jobs: lock.withLock { claimWanted = true }
        case .control: lock.withLock { controlWanted = true }
        case .slots:
            lock.withLock { permits }?.nudge()
            return
        case .rates:
            lock.withLock { rates }?.heardReport()
            return
        case .nodes:
            wantStatus()
            return
        case .connected:
            lock.withLock {
                claimWanted = true
                controlWanted = true
                probe.listenerConnected(now: monotonicSeconds())
            }
            wantStatus()
        case .disconnected:
            lock.withLock { probe.listenerDisconnected() }
            return
        case .probe(let token):
            report(lock.withLock { probe.heard(token, now: monotonicSeconds()) })
            return
        }
        kick()
    }

    func loop() {
        var backoff = 0.1
        var connected = false
        var nextBeat = 0.0, nextPoll = 0.0, nextTakeover = 0.0
        var spoolHung = false
        // Connected and registered, not yet beaten: `connected` is logged after the first beat, so that a database
        // that takes logins and registrations but holds the jobs table locked is one outage, not a `connected` and a
        // `disconnected` every few seconds.
        var joining = false
        while !lock.withLock({ stopped }) {
            // After a freeze (SIGSTOP), what the lease no longer covers stops before anything else is done.
            checkDeadline()
            // A spool that has hung for a whole lease (SpoolWatch): the node leaves the cluster as in an outage —
            // nothing is renewed, claimed or registered until it answers, so that the jobs it can neither finish nor
            // publish run elsewhere after the lease — and joins again (connects) once it answers.
            let stalled = delegate?.spoolStalledSeconds() ?? 0
            if (stalled >= spoolStallBound) != spoolHung {
                spoolHung.toggle()
                if spoolHung { connected = false }
                spoolHungChanged(spoolHung, stalledSeconds: stalled)
            }
            if spoolHung {
                sleep(upTo: 0.25)
                continue
            }
            do {
                if !connected || lock.withLock({ registerWanted }) {
                    try connect(afterOutage: !connected)
                    connected = true
                    joining = true
                    nextBeat = 0
                }
                let now = monotonicSeconds()
                if now >= nextBeat {
                    try beat()
                    // Only a whole round (connected and beaten) ends an outage's backoff: a server that accepts
                    // logins and fails statements is retried as slowly as one that refuses them.
                    backoff = 0.1
                    nextBeat = monotonicSeconds() + settings.leaseSeconds / 3
                    if joining {
                        joining = false
                        joined()
                    }
                }
                if now >= nextTakeover {
                    try takeOver()
                    nextTakeover = monotonicSeconds() + takeoverSeconds
                }
                try releaseWhatWasGivenUp()
                let (wantsClaim, wantsControl, isStarted) = lock.withLock { () -> (Bool, Bool, Bool) in
                    let polled = now >= nextPoll
                    defer { claimWanted = false; controlWanted = false }
                    return (claimWanted || polled, controlWanted || polled, started)
                }
                if now >= nextPoll { nextPoll = now + Self.pollSeconds }
                if isStarted && wantsClaim { try claim() }
                if isStarted && wantsControl { try control() }
                let next = min(nextBeat, nextPoll, nextTakeover, lock.withLock { claimDue } ?? .infinity)
                sleep(upTo: max(0, next - monotonicSeconds()))
            } catch {
                connected = false
                lock.withLock { claimDue = nil }
                disconnected(error)
                sleep(upTo: backoff)
                backoff = min(backoff * 2, 5)
            }
        }
    }

    /// Waits until kicked or `seconds` passed.
    private func sleep(upTo seconds: Double) { loopWake.wait(upTo: seconds) }

    /// How long the spool may keep a step waiting before the node lets its lease go: a whole lease, at least 5 s
    /// (a sync of much written data on a slow disk is not a hang).
    var spoolStallBound: Double { max(5, settings.leaseSeconds) }

    /// A hang is logged as the node's `disconnected` (once, as an outage is; a node already disconnected only warns);
    /// its end as a notice, before the `connected` of the node joining again.
    private func spoolHungChanged(_ hung: Bool, stalledSeconds: Double) {
        let seconds = String(format: "%.1f", stalledSeconds)
        if hung {
            let reason = "the spool has not answered for \(seconds) s"
            let held = lock.withLock { state.held.count }
            let message = "cluster: node \(nodeName) leaves the cluster until its spool answers: "
                + "the spool has kept it waiting for \(seconds) s (its file system hung or frozen?); "
                + "it renews nothing, so that the \(held) job(s) it holds run elsewhere "
                + "once its lease (\(settings.leaseSeconds.formatted()) s) has run out"
            if disconnected(reason: reason, cause: "the spool hangs", saying: message) != .began {
                logger.warning("\(message)", metadata: ["OPQ_EVENT": "cluster", "OPQ_ERROR": .string(reason)])
            }
        } else {
            logger.notice("""
                cluster: the spool of node \(nodeName) answers again; \
                the node renews its lease (jobs taken over meanwhile are logged lost)
                """,
                          metadata: ["OPQ_EVENT": "cluster"])
        }
    }

    /// Migrates, registers and says `connected`: at start, after an outage, and when asked to register again.
    private func connect(afterOutage: Bool) throws {
        let declaration = lock.withLock { configuration.declaration(node: nodeName, jobSlots: settings.jobSlots) }
        let schema = try waitBounded(Self.statementTimeout * 2, on: executor, doing: "migrating the cluster schema", { [store] in
            try await store.migrate()
        })
        if let advice = store.connectionAdvice, lock.withLock({ adviceGiven.insert(advice).inserted }) {
            logger.warning("cluster: \(advice)", metadata: ["OPQ_EVENT": "cluster"])
        }
        if schema > ClusterSchema.newest {
            logger.warning("""
                cluster: the schema is version \(schema), newer than the \(ClusterSchema.newest) this opqueued knows; \
                it says this opqueued may still run against it: upgrade node \(nodeName) when you can
                """)
        }
        // The server answered on a connection of migrate's own. After an outage the pool may still be waiting out a
        // backoff of postgres-nio's (up to a minute; see RenewablePool): a second for it, else a fresh pool. (Not
        // when only registering again: statements of other threads in flight on a working pool would fail.)
        let readOwner: @Sendable () async throws -> NodeOwner? = { [store, nodeName] in try await store.nodeOwner(nodeName) }
        let owner: NodeOwner?
        do {
            owner = try waitBounded(afterOutage ? 1 : Self.statementTimeout, on: executor, doing: "reading who holds node \(nodeName)",
                                    readOwner)
        } catch where afterOutage {
            store.reconnect()
            owner = try waitBounded(Self.statementTimeout, on: executor, doing: "reading who holds node \(nodeName)", readOwner)
        }
        // The name is this process's unless another process that may still run holds it (NodeProcess): then this
        // one waits, retried as an outage is, and joins once that one's beat has not changed for its lease by this
        // node's clock (a step of the database's clock makes no beating holder look silent), or at once when the
        // holder is an earlier run of this node on this machine, gone.
        let replacing = owner.flatMap { NodeProcess.isGoneFromThisMachine($0.info) ? $0.info : nil }
        let silentAt = owner.flatMap { owner -> Int64? in
            if replacing != nil || owner.info == NodeProcess.info { return nil }
            return lock.withLock {
                nameWatch.isSilent(owner.beat, now: monotonicSeconds(), defaultLease: settings.leaseSeconds)
            } ? owner.beat.beat : nil
        }
        let registered = try waitBounded(Self.statementTimeout, on: executor, doing: "registering node \(nodeName)", { [store, settings] in
            try await store.registerNode(declaration, leaseSeconds: settings.leaseSeconds, replacing: replacing, silentAt: silentAt)
        })
        guard registered else {
            let holder = owner.map {
                "\($0.info), last heartbeat \(String(format: "%.1f", $0.secondsSinceBeat)) s ago"
            } ?? "another process"
            throw ClusterUnavailable("node name \(nodeName) is held by another running opqueued (\(holder)); "
                                     + "each node needs its own cluster.node. This one joins once that one has been silent for "
                                     + "\(settings.leaseSeconds.formatted()) s",
                                     cause: "the node's name is held by another process")
        }
        if !lock.withLock({ hasConnected }) {
            // Slots the node's name holds now were held by a process of it that is gone (no slot is taken before
            // the first beat): a restart within the lease keeps the lease alive, so no takeover would free them.
            let freed = try waitBounded(Self.statementTimeout, on: executor,
                                        doing: "freeing the cluster slots node \(nodeName) held before", { [store, nodeName] in
                try await store.freeNodeSlots(node: nodeName)
            })
            if !freed.isEmpty { logger.notice("cluster: freed \(freed.count) cluster slot(s) an earlier process of node \(nodeName) held") }
        }
        lock.withLock {
            hasConnected = true
            registerWanted = false
            claimPacing.reset()
            claimWanted = true
            controlWanted = true
        }
        wantStatus()
        wantSubmit()
    }

    /// The first beat after `connect` went through: the outage (or the start) is over.
    private func joined() {
        let news = lock.withLock {
            lastError = nil
            return state.connectionSucceeded()
        }
        if news {
            event(.info, "cluster: node \(nodeName) connected to the database", ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"])
        }
        wantStatus()
    }

    // MARK: the connection's state

    func disconnected(_ error: any Error) {
        let reason = "\(error)"
        let cause = (error as? ClusterStoreError)?.cause ?? (error as? ClusterUnavailable)?.cause ?? reason
        let news = disconnected(reason: reason, cause: cause,
                                saying: "cluster: node \(nodeName) cannot use the database: \(reason); retrying at most 5 s apart")
        // An outage whose cause changes says so once per cause: a failover's first error is the closed connection,
        // what follows (a standby that takes no writes, a password no longer accepted) is what the operator must fix.
        if news == .newCause {
            logger.warning("cluster: node \(nodeName) still cannot use the database, now: \(reason); retrying at most 5 s apart",
                           metadata: ["OPQ_EVENT": "cluster", "OPQ_ERROR": .string(reason)])
        }
    }

    enum OutageNews { case began, newCause, known }

    /// The node is out of the cluster for `reason` (status' reason from now on): `disconnected` is logged once per
    /// outage, with `message`. Returns whether the outage began here, or its cause is new to it, or neither.
    @discardableResult
    func disconnected(reason: String, cause: String, saying message: String) -> OutageNews {
        let news = lock.withLock { () -> OutageNews in
            lastError = reason
            if state.connectionFailed() {
                outageCauses = [cause]
                return .began
            }
            return outageCauses.insert(cause).inserted ? .newCause : .known
        }
        if news == .began { event(.warning, message, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected", "OPQ_ERROR": .string(reason)]) }
        return news
    }

    // MARK: leases

    /// How often a node looks for lost nodes (`takeOver`): at most half a second after a lease ends.
    var takeoverSeconds: Double { min(settings.leaseSeconds / 3, 0.5) }

    /// One heartbeat (one statement): renews this process's lease and learns which of its jobs it lost.
    private func beat() throws {
        let progress = delegate?.progress()
        let sentAt = monotonicSeconds()
        let asks = lock.withLock { state.nextBeat(now: sentAt) }
        let beat = try waitBounded(Self.statementTimeout, on: executor,
                                   doing: "renewing the lease of node \(nodeName)", { [store, nodeName] in
            try await store.heartbeat(node: nodeName, info: NodeProcess.info, progress: progress, held: asks.held)
        })
        if !beat.registered {
            lock.withLock { registerWanted = true }
            throw ClusterUnavailable("node \(nodeName) has no row of this process in the database (registered again)")
        }
        let lost = lock.withLock { () -> [String] in
            let result = state.beatSucceeded(sentAt: sentAt, held: beat.held, asked: asks.held, covers: asks.covers)
            for id in result.lost { origins[id] = nil }
            // Jobs the database gives this node that it does not run go back to waiting; but before recovery said
            // which jobs resume, every one of them may be one of those.
            if started { jobReleases.merge(result.orphans) { $1 } }
            return result.lost
        }
        reportDeadline()
        leaseChanged(true)
        if lost.isEmpty { return }
        let forgotten = lost.filter(hasNoRow)
        let taken = lost.filter { !forgotten.contains($0) }
        if !taken.isEmpty { delegate?.lost(taken, reason: "taken over by another node") }
        if !forgotten.isEmpty {
            delegate?.forgotten(forgotten, reason: "the database has no row for this job any more "
                                + "(restored from a backup older than the job?): submitted again once stopped here")
        }
    }

    /// Whether the database has no row at all for `job`, which this node held: not taken over but forgotten (its
    /// database restored from an older backup), so that dropped it would run nowhere. Not when the row may have been
    /// pruned (`rowMayHaveBeenPruned`), nor when the lookup fails.
    func hasNoRow(_ job: String) -> Bool {
        let row = Result {
            try waitBounded(Self.statementTimeout, on: executor, doing: "looking up job \(job)", { [store] in try await store.job(job) })
        }
        guard case .success(nil) = row else { return false }
        return !rowMayHaveBeenPruned(job)
    }

    /// A takeover round: every node's beat is read, and the jobs and slots of nodes silent past their leases by this
    /// node's own clock (`SilenceWatch`) go back (any node does it; one statement more only when some node is
    /// silent). Run every `takeoverSeconds`, not only at this node's beats (every leaseSeconds/3), so that a lost
    /// node's jobs run elsewhere within a second of its lease's end, not up to a third of a lease later.
    private func takeOver() throws {
        let beats = try waitBounded(Self.statementTimeout, on: executor, doing: "reading the nodes' beats", { [store] in
            try await store.nodeBeats()
        })
        let silent = lock.withLock {
            silenceWatch.silent(in: beats, now: monotonicSeconds(), defaultLease: settings.leaseSeconds, except: nodeName)
        }
        if silent.isEmpty { return }
        let takeover = try waitBounded(Self.statementTimeout, on: executor, doing: "taking over the jobs of silent nodes", { [store] in
            try await store.takeOverSilent(silent)
        })
        lock.withLock { silenceWatch.tookOver(takeover.nodes) }
        if !takeover.jobs.isEmpty {
            lock.withLock { claimWanted = true }
            logger.notice("""
                cluster: took \(takeover.jobs.count) job(s) back from lost node(s) \
                \(Set(takeover.jobs.map { $0.fromNode }).sorted().joined(separator: ", "))
                """)
        }
        if !takeover.freedSlotQueues.isEmpty {
            // Its NOTIFY reaches every node, this one too; the permits here need not wait for it.
            lock.withLock { permits }?.nudge()
        }
    }

    private func releaseWhatWasGivenUp() throws {
        let (jobs, slots) = lock.withLock { () -> ([String: Int64], [SlotLease]) in
            let now = monotonicSeconds()
            slotReleases += droppedSlots.filter { $0.due <= now }.map(\.lease)
            droppedSlots.removeAll { $0.due <= now }
            return (jobReleases, slotReleases)
        }
        if !jobs.isEmpty {
            _ = try waitBounded(Self.statementTimeout, on: executor, doing: "handing jobs back", { [store, nodeName] in
                try await store.releaseJobs(node: nodeName, jobs)
            })
            lock.withLock { for (id, fence) in jobs where jobReleases[id] == fence { jobReleases[id] = nil } }
        }
        for lease in slots {
            _ = try waitBounded(Self.statementTimeout, on: executor, doing: "releasing a cluster slot of queue \(lease.queue)", { [store] in
                try await store.releaseSlot(lease)
            })
            lock.withLock { slotReleases.removeAll { $0 == lease } }
        }
    }

    // MARK: cancels and suspensions

    private func control() throws {
        for (queue, suspended) in lock.withLock({ pendingSuspensions }) {
            try waitBounded(Self.statementTimeout, on: executor,
                            doing: "\(suspended ? "suspending" : "resuming") queue \(queue)", { [store] in
                try await store.setSuspended(queue, suspended)
            })
            lock.withLock { if pendingSuspensions[queue] == suspended { pendingSuspensions[queue] = nil } }
        }
        try sharePendingCancels()
        let requests = try waitBounded(Self.statementTimeout, on: executor,
                                       doing: "reading the cancels for node \(nodeName)", { [store, nodeName] in
            try await store.pendingCancels(node: nodeName)
        })
        let cancels = lock.withLock {
            state.newCancels(requests.compactMap { r in r.fence.map { (job: r.job, operation: r.operation, fence: $0) } })
        }
        // Waiting jobs cancelled as a whole that nobody took: taken here (they run nothing), whatever this node declares.
        for orphan in requests where orphan.fence == nil { try takeCancelled(orphan.job) }
        let suspended = try waitBounded(Self.statementTimeout, on: executor, doing: "reading the suspended queues", { [store] in
            try await store.suspendedQueues()
        })
        let changed = lock.withLock { state.suspendedRead(suspended) }
        let delegate = self.delegate
        for cancel in cancels { delegate?.cancel(job: cancel.job, operation: cancel.operation) }
        if let changed { delegate?.suspendedQueuesChanged(changed) }
    }
}
