// Daemon: ties the spool, the manifests, the engine and the journal together.
//
// Strategy: spool changes (claims, publications) run on one serial dispatch queue, in order; the
// engine runs operations on its own threads; the engine's event batches (one delivery thread) are
// turned into journal entries and durable progress records. Job tables are behind one lock.
// At most `maxActiveJobs` jobs are claimed at once; the rest waits in the inbox (bounded memory).

import Foundation
import Logging
import OperationEngine

final class RunningJob: @unchecked Sendable {
    let claimed: ClaimedJob
    var plan: JobPlan?
    var group: GroupID?
    var operationIndex: [String: Int] = [:]
    /// Operations that had succeeded before a restart: not run, not logged again.
    var recovered: Set<Int> = []
    var rejection: [String] = []
    var finishing = false

    init(claimed: ClaimedJob) { self.claimed = claimed }
    var id: String { claimed.id }
}

public final class Daemon: @unchecked Sendable {
    public let spool: Spool
    let logger: Logger
    let configPath: String?
    private(set) var configuration: Configuration
    let engine: Engine
    private let sink: EventSink
    private let once: Bool

    private let lock = NSLock()
    private var jobs: [String: RunningJob] = [:]
    private var byGroup: [GroupID: RunningJob] = [:]
    private var queueIDs: [String: QueueID] = [:]
    private let defaultQueue: QueueID
    private var closedHints: Set<String> = []
    private var strangersLogged: Set<String> = []
    private var stopping = false
    private var onceNames: Set<String>?
    private var finishedWaiters: [@Sendable () -> Void] = []

    /// Claims and publications, in order.
    let work = DispatchQueue(label: "opqueued.spool")

    /// A manifest file must be this old before a scan (rather than an inotify close/move event) claims
    /// it, so a file still being written in place is not claimed half-written.
    static let settleSeconds = 1.0

    public init(spool: Spool, configuration: Configuration, configPath: String?, logger: Logger, once: Bool = false) {
        self.spool = spool
        self.configuration = configuration
        self.configPath = configPath
        self.logger = logger
        self.once = once
        let sink = EventSink()
        self.sink = sink
        engine = Engine(observer: { sink.deliver($0) })
        defaultQueue = engine.addQueue(named: "default")
        sink.daemon = self
        for name in configuration.queueNames {
            guard let q = configuration.queues[name] else { continue }
            queueIDs[name] = engine.addQueue(named: name, maxConcurrentOperationCount: q.maxConcurrentOperationCount,
                                             qualityOfService: q.qualityOfService, isSuspended: q.suspended)
        }
    }

    // MARK: Start, scan, claim

    /// Resumes what a previous run left in active/, then claims from the inbox.
    public func start() {
        work.sync {
            let (recovered, problems) = spool.recover()
            for problem in problems { logger.error("\(problem)") }
            for claimed in recovered { accept(claimed, resumed: true) }
            if once {
                lock.lock()
                // Only what is there now; a file that cannot be claimed is not waited for.
                onceNames = Set(spool.candidates(limit: Int.max).filter { spool.age(of: $0, now: 0) != nil })
                lock.unlock()
            }
        }
    }

    /// Looks at the inbox; `hints` are names inotify reported closed or moved in (claimable at once).
    public func scan(hints: [String] = []) {
        work.async { [self] in
            lock.lock()
            closedHints.formUnion(hints)
            lock.unlock()
            claimMore()
        }
    }

    private var activeCount: Int {
        lock.lock()
        defer { lock.unlock() }
        return jobs.count
    }

    /// On `work`: claims while there is room.
    private func claimMore() {
        lock.lock()
        let room = configuration.maxActiveJobs - jobs.count
        let isStopping = stopping
        let onlyThese = onceNames
        lock.unlock()
        guard room > 0, !isStopping else { return }
        for stranger in spool.strangers() {
            lock.lock()
            let fresh = strangersLogged.insert(stranger).inserted
            lock.unlock()
            if fresh { logger.notice("inbox/\(stranger) is not a manifest (*.plist) and is left alone") }
        }
        let now = Date().timeIntervalSince1970
        var claimed = 0
        for name in spool.candidates(limit: room + 64) where claimed < room {
            if let onlyThese, !onlyThese.contains(name) { continue }
            if onlyThese != nil { lock.withLock { _ = onceNames?.remove(name) } }
            lock.lock()
            let hinted = closedHints.remove(name) != nil
            lock.unlock()
            if !hinted && onlyThese == nil {
                guard let age = spool.age(of: name, now: now) else { continue }
                if age < Self.settleSeconds {
                    // Not announced by inotify and still fresh: look again once it has settled.
                    work.asyncAfter(deadline: .now() + Self.settleSeconds) { [self] in claimMore() }
                    continue
                }
            }
            do {
                switch try spool.claim(name, requestedJob: Manifest.requestedJob(in:), now: Date().timeIntervalSince1970) {
                case .claimed(let job):
                    claimed += 1
                    accept(job, resumed: false)
                case .vanished:
                    continue
                case .skipped(let reason):
                    lock.lock()
                    let fresh = strangersLogged.insert(name).inserted
                    lock.unlock()
                    if fresh { logger.warning("inbox/\(name) cannot be claimed: \(reason)") }
                }
            } catch {
                logger.error("claiming inbox/\(name) failed: \(error); it stays in the inbox")
                return
            }
        }
        checkOnceDone()
    }

    /// On `work`: validates a claimed job and runs it, or rejects it.
    private func accept(_ claimed: ClaimedJob, resumed: Bool) {
        let job = RunningJob(claimed: claimed)
        if !resumed {
            event(.info, "job \(claimed.id) received from inbox/\(claimed.manifestName)", ["OPQ_EVENT": "job", "OPQ_STATE": "received", "OPQ_JOB": claimed.id])
        }
        lock.lock()
        jobs[claimed.id] = job
        let config = configuration
        lock.unlock()
        var problems: [String] = []
        switch Manifest.parse(claimed.manifest, configuration: config) {
        case .failure(let p): problems = p.problems
        case .success(let plan): job.plan = plan
        }
        if let asked = Manifest.requestedJob(in: claimed.manifest), !isValidIdentifier(asked), !problems.contains(where: { $0.hasPrefix("job:") }) {
            problems.append("job: '\(asked)' is not a valid job id")
        }
        guard problems.isEmpty, let plan = job.plan else {
            job.rejection = problems
            event(.error, "job \(claimed.id) rejected: \(problems.joined(separator: "; "))",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "rejected", "OPQ_JOB": claimed.id, "OPQ_STATUS": "rejected", "OPQ_ERROR": problems.joined(separator: "\n")])
            publish(job, status: "rejected", error: problems.joined(separator: "\n"), records: [])
            return
        }
        var graph = GraphBuilder()
        graph.reserveCapacity(operations: plan.operations.count, dependencies: plan.operations.count)
        for (i, op) in plan.operations.enumerated() { job.operationIndex[op.id] = i }
        for (i, op) in plan.operations.enumerated() {
            let recovered = claimed.done[op.id] != nil
            if recovered { job.recovered.insert(i) }
            let queue = queueIDs[op.queue] ?? defaultQueue
            let body: OperationBody = recovered ? .sync { _ in nil } : Kinds.body(for: op.parameters)
            let deps = op.dependencies.compactMap { job.operationIndex[$0] }
            graph.add(OperationSpec(
                name: op.id, queue: queue, qualityOfService: op.qualityOfService, queuePriority: op.queuePriority ?? plan.queuePriority ?? .normal,
                timeout: recovered ? nil : op.timeoutSeconds, retries: recovered ? 0 : op.retries, retryDelay: op.retryDelaySeconds,
                runsAfterFailure: op.runsAfterFailure, input: op.input.flatMap { job.operationIndex[$0] }, body: body), dependencies: deps)
        }
        event(.info, "job \(claimed.id) accepted: \(plan.operations.count) operations", ["OPQ_EVENT": "job", "OPQ_STATE": "accepted", "OPQ_JOB": claimed.id])
        // Registered under the lock before events can be delivered for the group.
        lock.lock()
        do {
            let deadline = plan.timeoutSeconds.map { max(0.001, $0 - (Date().timeIntervalSince1970 - claimed.receivedAt)) }
            let group = try engine.submit(graph, qualityOfService: plan.qualityOfService, deadline: deadline)
            job.group = group
            byGroup[group] = job
            lock.unlock()
        } catch {
            lock.unlock()
            job.rejection = error.problems
            event(.error, "job \(claimed.id) rejected: \(error.problems.joined(separator: "; "))",
                  ["OPQ_EVENT": "job", "OPQ_STATE": "rejected", "OPQ_JOB": claimed.id, "OPQ_STATUS": "rejected", "OPQ_ERROR": error.description])
            publish(job, status: "rejected", error: error.description, records: [])
        }
    }

    // MARK: Engine events

    /// On the engine's delivery thread: journal entries, durable progress, job ends.
    fileprivate func deliver(_ events: [EngineEvent]) {
        for engineEvent in events {
            switch engineEvent {
            case .transition(let t):
                lock.lock()
                let job = byGroup[t.group]
                lock.unlock()
                guard let job, let plan = job.plan, t.operation < plan.operations.count, !job.recovered.contains(t.operation) else { continue }
                logTransition(t, job: job, operation: plan.operations[t.operation])
            case .groupFinished(let group):
                lock.lock()
                let job = byGroup[group]
                lock.unlock()
                guard let job else { continue }
                work.async { [self] in finish(job) }
            }
        }
    }

    private func logTransition(_ t: Transition, job: RunningJob, operation: OperationPlan) {
        var fields: [String: String] = [
            "OPQ_EVENT": "operation", "OPQ_STATE": t.state.name, "OPQ_JOB": job.id, "OPQ_OPERATION": operation.id,
            "OPQ_KIND": operation.kind.rawValue, "OPQ_QUEUE": operation.queue, "OPQ_QOS": t.qualityOfService.name,
            "OPQ_QUEUE_PRIORITY": (operation.queuePriority ?? job.plan?.queuePriority ?? .normal).name,
        ]
        if t.attempt > 0 { fields["OPQ_ATTEMPT"] = String(t.attempt) }
        if let error = t.error { fields["OPQ_ERROR"] = error }
        var level = Logger.Level.info
        var message = "operation \(job.id)/\(operation.id) \(t.state.name)"
        switch t.state {
        case .succeeded, .failed, .cancelled:
            if let group = job.group, let record = engine.record(group, operation: t.operation) {
                if let started = record.startedAt { fields["OPQ_DURATION_USEC"] = String(Int64(((t.time - started) * 1e6).rounded())) }
                if t.state == .succeeded, let started = record.startedAt {
                    do {
                        try spool.recordSuccess(job: job.id, operation: operation.id, record: DoneRecord(startedAt: started, finishedAt: t.time, attempts: record.attempts))
                    } catch {
                        logger.error("recording the success of \(job.id)/\(operation.id) failed: \(error); it will run again after a restart")
                    }
                }
            }
            if t.state == .failed { level = .error }
            if t.state == .cancelled { level = .warning }
        case .retrying:
            level = .warning
        default:
            break
        }
        if let error = t.error { message += ": \(error)" }
        event(level, message, fields)
    }

    // MARK: Ends

    /// On `work`: a job's graph has finished; publish its outbox entry.
    private func finish(_ job: RunningJob) {
        guard let group = job.group, let records = engine.records(group) else { return }
        var status = "succeeded"
        var errors: [String] = []
        for (i, r) in records.enumerated() where !job.recovered.contains(i) || r.state != .succeeded {
            if r.state == .failed { status = "failed" }
            if r.state != .succeeded { errors.append("\(r.name): \(r.error ?? r.state.name)") }
        }
        if status != "failed" && records.contains(where: { $0.state == .cancelled }) { status = "cancelled" }
        publish(job, status: status, error: errors.isEmpty ? nil : errors.joined(separator: "\n"), records: records)
        engine.release(group)
    }

    private func publish(_ job: RunningJob, status: String, error: String?, records: [OperationRecord]) {
        let now = Date().timeIntervalSince1970
        var result: [String: Any] = [
            "job": job.id, "manifest": job.claimed.manifestName, "status": status, "receivedAt": micro(job.claimed.receivedAt), "finishedAt": micro(now),
        ]
        if let requested = job.claimed.requestedJob { result["requestedJob"] = requested }
        if let error { result["error"] = error }
        if let metadata = job.plan?.metadata, let value = try? PropertyListSerialization.propertyList(from: metadata, format: nil) { result["metadata"] = value }
        var operations: [[String: Any]] = []
        var firstStart: Double?
        if let plan = job.plan {
            for (i, record) in records.enumerated() where i < plan.operations.count {
                let op = plan.operations[i]
                var entry: [String: Any] = [
                    "id": op.id, "kind": op.kind.rawValue, "queue": op.queue, "qualityOfService": record.qualityOfService.name,
                    "queuePriority": record.queuePriority.name, "state": record.state.name, "attempts": record.attempts, "outputs": [String](),
                ]
                var started = record.startedAt, finished = record.finishedAt, attempts = record.attempts
                if let done = job.claimed.done[op.id] { started = done.startedAt; finished = done.finishedAt; attempts = done.attempts }
                entry["attempts"] = attempts
                if let error = record.error, record.state != .succeeded { entry["error"] = error }
                if let started { entry["startedAt"] = micro(started); firstStart = min(firstStart ?? started, started) }
                if let finished { entry["finishedAt"] = micro(finished) }
                if let s = started, let f = finished { entry["durationSeconds"] = micro(f - s) }
                operations.append(entry)
            }
        }
        result["operations"] = operations
        if let firstStart {
            result["startedAt"] = micro(firstStart)
            result["durationSeconds"] = micro(now - firstStart)
        }
        do {
            let data = try PropertyListSerialization.data(fromPropertyList: result, format: .xml, options: 0)
            try spool.publish(job: job.id, manifest: job.claimed.manifest, result: data)
        } catch {
            logger.error("publishing outbox/\(job.id) failed: \(error); the job stays in active/ and is retried at the next start")
            lock.lock()
            jobs[job.id] = nil
            if let g = job.group { byGroup[g] = nil }
            lock.unlock()
            return
        }
        var fields = ["OPQ_EVENT": "job", "OPQ_STATE": "finished", "OPQ_JOB": job.id, "OPQ_STATUS": status]
        if let firstStart { fields["OPQ_DURATION_USEC"] = String(Int64(((now - firstStart) * 1e6).rounded())) }
        if let error { fields["OPQ_ERROR"] = error }
        if status != "rejected" {
            event(status == "succeeded" ? .info : status == "failed" ? .error : .warning, "job \(job.id) finished: \(status)", fields)
        }
        lock.lock()
        jobs[job.id] = nil
        if let g = job.group { byGroup[g] = nil }
        lock.unlock()
        checkOnceDone()
        work.async { [self] in claimMore() }
    }

    private func checkOnceDone() {
        guard once else { return }
        lock.lock()
        let idle = jobs.isEmpty && onceNames?.isEmpty != false
        let waiters = idle ? finishedWaiters : []
        if idle { finishedWaiters = [] }
        lock.unlock()
        for waiter in waiters { waiter() }
    }

    /// For `--once`: returns when every job claimed at start (and recovered) has ended.
    public func runOnce() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            lock.withLock { finishedWaiters.append { continuation.resume() } }
            scan()
        }
    }

    // MARK: Reload and stop

    /// SIGHUP: re-reads the configuration and applies queue settings to running work.
    public func reload() {
        event(.info, "reloading the configuration", ["OPQ_EVENT": "daemon", "OPQ_STATE": "reloading"])
        do {
            let config = try configPath.map(Configuration.load(path:)) ?? .builtIn
            lock.lock()
            let previous = configuration
            configuration = config
            lock.unlock()
            for name in config.queueNames {
                guard let q = config.queues[name] else { continue }
                if let id = queueIDs[name] {
                    engine.updateQueue(id, maxConcurrentOperationCount: q.maxConcurrentOperationCount, qualityOfService: q.qualityOfService, isSuspended: q.suspended)
                } else {
                    queueIDs[name] = engine.addQueue(named: name, maxConcurrentOperationCount: q.maxConcurrentOperationCount, qualityOfService: q.qualityOfService, isSuspended: q.suspended)
                }
                if previous.queues[name]?.suspended != q.suspended { logQueue(name, suspended: q.suspended) }
            }
        } catch {
            logger.error("the configuration was not reloaded: \(error)")
        }
        event(.info, "ready", ["OPQ_EVENT": "daemon", "OPQ_STATE": "ready"])
        scan()
    }

    /// SIGTERM: claims nothing more and starts nothing new; executing operations get `grace` seconds;
    /// unfinished jobs stay in active/ and resume at the next start.
    public func stop(grace: Double) async {
        lock.withLock { stopping = true }
        event(.info, "stopping", ["OPQ_EVENT": "daemon", "OPQ_STATE": "stopping"])
        for id in queueIDs.values { engine.updateQueue(id, isSuspended: true) }
        let deadline = Date().addingTimeInterval(grace)
        while engine.executingCount > 0 && Date() < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
        // Let publications of jobs that finished during the grace complete.
        try? await Task.sleep(for: .milliseconds(50))
        work.sync {}
    }

    public func suspend(queue name: String, _ suspended: Bool) -> Bool {
        guard let id = queueIDs[name] else { return false }
        engine.updateQueue(id, isSuspended: suspended)
        logQueue(name, suspended: suspended)
        return true
    }

    private func logQueue(_ name: String, suspended: Bool) {
        event(.info, "queue \(name) \(suspended ? "suspended" : "resumed")", ["OPQ_EVENT": "queue", "OPQ_STATE": suspended ? "suspended" : "resumed", "OPQ_QUEUE": name])
    }

    // MARK: Control

    public enum CancelOutcome { case cancelled, unknownJob, unknownOperation, alreadyEnded }

    public func cancel(job id: String, operation: String?) -> CancelOutcome {
        lock.lock()
        let job = jobs[id]
        lock.unlock()
        guard let job else {
            return access(spool.outbox + "/" + id, F_OK) == 0 ? .alreadyEnded : .unknownJob
        }
        guard let group = job.group else { return .alreadyEnded }
        if let operation {
            guard let index = job.operationIndex[operation] else { return .unknownOperation }
            if engine.record(group, operation: index)?.state.isFinished == true { return .alreadyEnded }
            engine.cancel(group, operation: index, reason: "cancelled by request")
        } else {
            engine.cancel(group, reason: "cancelled by request")
        }
        return .cancelled
    }

    public struct Status: Sendable {
        public var activeJobs: [String]
        public var waiting: Int
        public var executing: Int
        public var queues: [QueueSnapshot]
    }

    public func status() -> Status {
        lock.lock()
        let active = jobs.keys.sorted()
        lock.unlock()
        return Status(activeJobs: active, waiting: spool.candidates(limit: 100_000).count, executing: engine.executingCount, queues: engine.queues())
    }

    /// An active job's operations, for `show`.
    public func show(job id: String) -> [[String: Any]]? {
        lock.lock()
        let job = jobs[id]
        lock.unlock()
        guard let job, let plan = job.plan, let group = job.group, let records = engine.records(group) else { return nil }
        return zip(plan.operations, records).map { op, r in
            var entry: [String: Any] = ["id": op.id, "kind": op.kind.rawValue, "queue": op.queue, "state": r.state.name, "attempts": r.attempts,
                                        "dependencies": op.dependencies]
            if let s = r.startedAt { entry["startedAt"] = s }
            if let f = r.finishedAt { entry["finishedAt"] = f }
            if let e = r.error { entry["error"] = e }
            return entry
        }
    }

    // MARK: Journal

    func event(_ level: Logger.Level, _ message: String, _ fields: [String: String], file: String = #fileID, function: String = #function, line: UInt = #line) {
        var metadata: Logger.Metadata = [:]
        for (k, v) in fields { metadata[k] = .string(v) }
        logger.log(level: level, "\(message)", metadata: metadata, file: file, function: function, line: line)
    }
}

/// Times in results: seconds since the epoch, to the microsecond.
func micro(_ value: Double) -> Double { (value * 1e6).rounded() / 1e6 }

/// Breaks the reference cycle engine → observer → daemon → engine.
final class EventSink: @unchecked Sendable {
    weak var daemon: Daemon?
    func deliver(_ events: [EngineEvent]) { daemon?.deliver(events) }
}
