// opqueued — the operation-graph spool daemon.
//
// What it does: watches <spool>/inbox for property-list manifests, runs each as a graph of operations on
// named queues, and publishes the results in <spool>/outbox (SPEC.md §1, §2). This file parses the command
// line, picks the log target and runs the daemon as services (swift-service-lifecycle): the spool service,
// the signal service (SIGHUP reloads; SIGUSR1/2 are logged) and the systemd status/watchdog service.
// Everything else is in `Daemon`.
// What it trusts: nothing in the spool; its own configuration file.

import ArgumentParser
import COpqueuedStart
import ClusterStore
import Daemon
import Foundation
import Logging
import OperationEngine
import ServiceLifecycle
import UnixSignals

enum LogTarget: String, ExpressibleByArgument, CaseIterable {
    case auto, journal, console

    static var allValueDescriptions: [String: String] {
        ["auto": "journald when its socket exists, else the console",
         "journal": "journald, through libsystemd",
         "console": "one key=value line per event on standard error"]
    }
}

@main
struct Opqueued: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "opqueued",
        abstract: "Runs operation graphs dropped into a spool folder.",
        discussion: """
            opqueued watches SPOOL/inbox for property-list manifests (see opqueued.plist(5)), claims each by renaming \
            it into SPOOL/active, runs its operations on named queues with concurrency limits, quality of service \
            and priorities, and publishes every claimed manifest as exactly one folder SPOOL/outbox/JOB holding \
            manifest.plist, result.plist and the files its write operations produced. Every lifecycle transition \
            is logged to journald (SYSLOG_IDENTIFIER=opqueued, fields OPQ_*). opqueuectl(1) submits and inspects jobs.

            Signals: SIGHUP reloads the configuration (queue limits, quality of service, suspension) without \
            restarting work. SIGTERM and SIGINT stop gracefully: nothing new is claimed, executing operations get \
            shutdownGraceSeconds to finish, unfinished jobs stay in SPOOL/active and resume at the next start. \
            SIGUSR1 and SIGUSR2 mean nothing to opqueued: each is logged and ignored (with --once they keep their \
            default actions).

            Under systemd (Type=notify) it sends READY=1 once recovery is done, STATUS= lines with live counts, \
            RELOADING=1 around a reload, STOPPING=1, and WATCHDOG=1 when WATCHDOG_USEC is set.

            Exit status: 0 after a graceful stop or a --once run; 1 if the configuration or the spool cannot be \
            used, or another opqueued holds the spool.

            Files: SPOOL/inbox, SPOOL/active, SPOOL/outbox, SPOOL/tmp, SPOOL/opqueued.sock (the control socket), \
            SPOOL/opqueued.lock; the unit opqueued.service runs it on /var/spool/opqueued.
            """)

    @Option(help: ArgumentHelp("The spool root; missing folders are created.", valueName: "dir"), completion: .directory)
    var spool = "./spool"

    @Option(help: ArgumentHelp("The configuration property list (opqueued.plist(5)); without it, built-in defaults.", valueName: "file"),
            completion: .file(extensions: ["plist"]))
    var config: String?

    @Option(help: ArgumentHelp("Where events go.", valueName: "target"))
    var logTarget: LogTarget = .auto

    @Flag(help: "Run what is in the inbox at start, then exit.")
    var once = false

    @Flag(help: "Print the version and exit.")
    var version = false

    func run() async throws {
        // A stop or a reload asked for while starting (loading, reading the configuration, recovering active/) has
        // been noted since before main (COpqueuedStart) and is handed to the service group once it has the signals
        // (see SpoolService, SignalService): their default actions would end the process. `--once` has no service
        // group: there they get their default actions back. (The command watchdog forked below sets its own.)
        opq_start_linked()
        if once { Daemon.defaultTerminationSignals() }
        // A client of the control socket that hangs up makes the next write to it fail with EPIPE; SIGPIPE's
        // default action would end the daemon instead. Ignored here, first, for every mode (`--once` too), not
        // only under systemd's IgnoreSIGPIPE=yes.
        signal(SIGPIPE, SIG_IGN)
        Daemon.raiseFileLimit()
        if version {
            print("opqueued 0.2.0")
            return
        }
        // The command watchdog (docs: kills commands' process groups when this process dies, kill -9 included),
        // first, while the process is small: the fork copies its address space as it is now.
        let watchdog = CommandWatchdog.start()
        Daemon.tuneAllocator()
        await Daemon.openTimerClocks()
        let useJournal = logTarget == .journal ||
            (logTarget == .auto && (ProcessInfo.processInfo.environment["JOURNAL_STREAM"] != nil || journalIsListening()))
        LoggingSystem.bootstrap { _ in useJournal ? JournalLogHandler() as any LogHandler : ConsoleLogHandler() }
        let logger = Logger(label: "opqueued")
        if case .failure(let failure) = watchdog {
            logger.warning("\(failure); commands a crash leaves running are killed at the next start instead")
        }

        let configuration: Configuration
        do {
            configuration = try config.map { try Configuration.load(path: $0) } ?? .builtIn
        } catch {
            logger.critical("\(error)")
            throw ExitCode(1)
        }
        let spoolFolder: Spool
        do {
            spoolFolder = try Spool(root: spool)
            if configuration.cluster == nil { try spoolFolder.refuseClusterHoldings() }
        } catch {
            logger.critical("the spool \(spool) cannot be used: \(error)")
            throw ExitCode(1)
        }
        if let newer = spoolFolder.formatTakenOver {
            logger.notice("""
                \(spoolFolder.active)/ was left by a newer opqueued \
                (\(newer > 0 ? "spool format \(newer)" : "a format this build cannot read")) but holds no job: \
                this build takes it over in its own format \(Spool.format)
                """)
        }
        // SPEC §8: with `cluster`, the jobs this node runs come from PostgreSQL; every entry names the node, and the
        // command watchdog kills commands whose lease ran out even if this process is frozen.
        var store: (any JobStore)?
        if let cluster = configuration.cluster {
            Journal.node = cluster.node
            do {
                store = try ClusterJobStore(configuration: configuration, spool: spoolFolder, logger: logger,
                                            onLeaseDeadline: { CommandWatchdog.current?.setKillDeadline(monotonicSeconds: $0) })
            } catch {
                logger.critical("cluster: \(error)")
                throw ExitCode(1)
            }
        }
        let daemon = Daemon(spool: spoolFolder, configuration: configuration, configPath: config, logger: logger, once: once, store: store)
        daemon.start()
        if once {
            // The exporter's service (tracing.otlp) runs while the jobs do, then flushes, bounded.
            let tracing = daemon.tracing.map { ServiceGroup(services: [$0.service], logger: Logger(label: "opqueued.tracing")) }
            let exporting = Task { try? await tracing?.run() }
            await daemon.runOnce()
            await tracing?.triggerGracefulShutdown()
            await exporting.value
            return
        }
        let control = ControlServer(path: spoolFolder.root + "/opqueued.sock") { request in handle(request, daemon) }
        let watcher = InboxWatcher(path: spoolFolder.inbox) { names, complete in daemon.scan(hints: names, complete: complete) }
        // The exporter (tracing.otlp) first: stopped last, after the last jobs are published; its end never ends the daemon.
        let tracing = daemon.tracing.map { [ServiceGroupConfiguration.ServiceConfiguration(
            service: $0.service, successTerminationBehavior: .ignore, failureTerminationBehavior: .ignore)] } ?? []
        let group = ServiceGroup(configuration: .init(
            services: tracing + [
                .init(service: SpoolService(daemon: daemon, control: control, watcher: watcher, metricsListen: configuration.metricsListen,
                                            grace: configuration.shutdownGraceSeconds, logger: logger)),
                .init(service: SignalService(daemon: daemon, logger: logger)),
                .init(service: StatusService(daemon: daemon)),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: Logger(label: "opqueued.lifecycle", factory: { _ in SwiftLogNoOpLogHandler() })))
        try await group.run()
    }
}

/// Opens the control socket and the inbox watch and says ready, then runs until the graceful shutdown and
/// drains: no new claims, executing operations get the grace. Readiness comes from here, after the service
/// group has taken SIGTERM and SIGINT: a client (or systemd) that sees the daemon ready and stops it at once
/// gets a graceful stop, never the signal's default action.
struct SpoolService: Service {
    let daemon: Daemon
    let control: ControlServer
    let watcher: InboxWatcher
    /// `metrics.listen`, read at start (a reload does not move the listener).
    let metricsListen: String?
    let grace: Double
    let logger: Logger

    func run() async throws {
        // The service group has SIGTERM and SIGINT now; one that came while starting was only noted.
        let stopAskedWhileStarting = Daemon.notedTerminationSignal
        var metricsServer: MetricsServer?
        if stopAskedWhileStarting != 0 {
            // (The `stopping` event itself comes from the drain below, once, as for any stop.)
            logger.notice("signal \(stopAskedWhileStarting) came while starting: stopping without becoming ready")
            kill(getpid(), stopAskedWhileStarting)
        } else {
            do {
                try await control.start()
                try watcher.start()
                if let metricsListen {
                    let server = try MetricsServer(listen: metricsListen) { [daemon] in daemon.metricsText() }
                    logger.info("metrics: listening on http://\(server.boundAddress)/metrics")
                    metricsServer = server
                }
            } catch {
                logger.critical("\(error)")
                throw ExitCode(1)
            }
            logger.info("ready", metadata: ["OPQ_EVENT": "daemon", "OPQ_STATE": "ready"])
            SystemdNotifier.notify("READY=1\nSTATUS=ready")
        }
        // The control socket, removed while the daemon runs (a careless clean-up), is made again within 2 s.
        let keeper = Task { [control, logger] in
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(2))
                if !Task.isCancelled, await control.restoreIfMissing() {
                    logger.warning("\(control.path) was removed or replaced while the daemon ran: listening on it again")
                }
            }
        }
        try? await gracefulShutdown()
        keeper.cancel()
        _ = await keeper.result
        SystemdNotifier.notify("STOPPING=1")
        watcher.stop()
        metricsServer?.stop()
        await daemon.stop(grace: grace)
        await control.stop()
    }
}

/// SIGHUP reloads the configuration. SIGUSR1 and SIGUSR2 mean nothing to opqueued: each is logged and ignored, where
/// its default action would end the daemon (a log-rotation habit from another daemon, `kill -USR1`, must not stop
/// this one and the commands it runs).
struct SignalService: Service {
    let daemon: Daemon
    let logger: Logger

    func run() async throws {
        let signals = await UnixSignalsSequence(trapping: .sighup, .sigusr1, .sigusr2)
        // A signal that came while starting was only noted (its default action would have ended the process): the
        // configuration may have changed since it was read, so it is read again now.
        if Daemon.notedHangup { reload() }
        for signal in Daemon.notedUserSignals { ignored(signal == SIGUSR1 ? "SIGUSR1" : "SIGUSR2") }
        await cancelWhenGracefulShutdown {
            for await signal in signals {
                if signal == .sighup { reload() } else { ignored(signal.description) }
            }
        }
    }

    private func ignored(_ name: String) {
        logger.notice("\(name) means nothing to opqueued and is ignored (SIGHUP reloads the configuration, SIGTERM stops the daemon)")
    }

    private func reload() {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        let usec = UInt64(ts.tv_sec) * 1_000_000 + UInt64(ts.tv_nsec) / 1_000
        SystemdNotifier.notify("RELOADING=1\nMONOTONIC_USEC=\(usec)")
        daemon.reload()
        SystemdNotifier.notify("READY=1")
    }
}

/// Live STATUS= lines and WATCHDOG=1 pings for systemd.
struct StatusService: Service {
    let daemon: Daemon

    func run() async throws {
        let watchdog = SystemdNotifier.watchdogInterval()
        let interval = min(watchdog ?? 2, 2)
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                let status = daemon.status()
                var message = "STATUS=jobs active \(status.activeJobs.count), waiting \(status.waiting); "
                    + "operations executing \(status.executing)"
                if let fault = status.fault { message += "; claiming paused: \(fault)" }
                if watchdog != nil { message += "\nWATCHDOG=1" }
                SystemdNotifier.notify(message)
                try await Task.sleep(for: .seconds(interval))
            }
        }
    }
}

/// The control socket's commands.
func handle(_ request: [String: Any], _ daemon: Daemon) -> [String: Any] {
    let command = request["command"] as? String ?? ""
    switch command {
    case "status":
        let status = daemon.status()
        var response: [String: Any] = [
            "exit": 0, "state": "running", "activeJobs": status.activeJobs, "waiting": status.waiting, "executing": status.executing,
            "operations": status.operations, "maxActiveOperations": status.maxActiveOperations,
            "queues": status.queues.map { q in
                var queue: [String: Any] = ["name": q.name, "maxConcurrentOperationCount": q.maxConcurrentOperationCount,
                                            "qualityOfService": q.qualityOfService.name, "suspended": q.isSuspended,
                                            "pending": q.pending, "executing": q.executing]
                // SPEC §3.7: a rated queue's rate and its next free start.
                if let rate = q.rateLimit { queue["rateLimit"] = ["operations": rate.operations, "seconds": rate.seconds] }
                if let next = q.nextStartAt { queue["nextStartAt"] = next }
                // Suspended only until this node has read the cluster's suspensions.
                if q.isSuspended && status.held.contains(q.name) { queue["held"] = true }
                // A cluster-wide limit: the slots this node holds, and its wait for more, if it waits.
                if let slots = status.clusterSlots[q.name] {
                    queue["clusterMaxConcurrentOperationCount"] = slots.limit
                    queue["clusterSlotsHeld"] = slots.held
                    if let priority = slots.waitingAt { queue["clusterSlotWait"] = priority.name }
                }
                return queue
            },
        ]
        if !status.schedules.isEmpty {
            response["schedules"] = status.schedules.map { s in
                var entry: [String: Any] = ["name": s.name, "cron": s.cron, "timeZone": s.zone]
                if let next = s.next { entry["next"] = next }
                return entry
            }
        }
        if let fault = status.fault { response["fault"] = fault }
        if status.submissions > 0 {
            response["submissions"] = status.submissions
            if let since = status.submissionsSince { response["submissionsSince"] = since }
        }
        // SPEC §8: a node speaks for the whole cluster (as of its last heartbeat; never waiting on the database).
        if let cluster = daemon.store.snapshot() {
            response["nodes"] = cluster.nodes.map { n in
                var node: [String: Any] = ["node": n.node, "connected": n.connected, "lastHeartbeat": n.lastHeartbeat, "jobs": n.jobs,
                                           "freeSlots": n.freeSlots]
                if let schema = n.schema { node["schema"] = schema }
                return node
            }
            var summary: [String: Any] = ["node": cluster.node, "state": cluster.connected ? "connected" : "disconnected"]
            if let error = cluster.lastError, !cluster.connected { summary["reason"] = error }
            summary["wakeupsArrive"] = cluster.wakeupsArrive
            summary["unrunnable"] = cluster.unrunnable.map { ["job": $0.job, "reason": $0.reason] }
            summary["queues"] = Dictionary(uniqueKeysWithValues: cluster.queues.map {
                ($0.key, ["waiting": $0.value.waiting, "running": $0.value.running])
            })
            // When those counts were read (seconds since the epoch): a node reads them less often under a huge backlog.
            if let read = cluster.refreshedAt { summary["queuesReadAt"] = Date().timeIntervalSince1970 - (monotonicSeconds() - read) }
            response["cluster"] = summary
        }
        response["jobs"] = status.jobs.map { job in
            var entry: [String: Any] = ["job": job.job, "operations": job.operations, "ended": job.ended]
            if let notBefore = job.notBefore { entry["notBefore"] = notBefore }
            return entry
        }
        if request["memory"] as? Bool == true { response["heapBytes"] = daemon.heapBytesInUse }
        return response
    case "declared":
        let names = daemon.submissionNames()
        return ["exit": 0, "queues": names.queues, "commands": names.commands, "cluster": daemon.store.node != nil]
    case "submitted":
        guard let manifest = request["manifest"] as? String else { return ["exit": 64, "error": "submitted needs a manifest"] }
        // Not yet: still in the inbox, being read, or (a cluster) not yet inserted.
        let inode = (request["inode"] as? Int).flatMap { UInt64(exactly: $0) }
        guard let job = daemon.submittedJob(manifest: manifest, inode: inode) else { return ["exit": 0] }
        return ["exit": 0, "job": job]
    case "show":
        guard let job = request["job"] as? String else { return ["exit": 64, "error": "show needs a job"] }
        switch daemon.show(job: job) {
        case .operations(let operations)?: return ["exit": 0, "job": job, "status": "running", "operations": operations]
        // Claimed a moment ago, its manifest being read: not an unknown job.
        case .starting?: return ["exit": 0, "job": job, "status": "running", "starting": true, "operations": [[String: Any]]()]
        case .delayed(let until, let operations)?:
            return ["exit": 0, "job": job, "status": "delayed", "notBefore": until, "operations": operations]
        case nil: break
        }
        // A job the store knows that this node does not run (a cluster's): waiting, running elsewhere or ended.
        do {
            if let record = try daemon.store.job(job) { return clusterShow(record) }
        } catch {
            return ["exit": 3, "error": "job '\(job)' is not on this node and the cluster cannot be asked now: \(error); try again"]
        }
        return ["exit": 1, "error": "unknown job '\(job)'"]
    case "cancel":
        guard let job = request["job"] as? String else { return ["exit": 64, "error": "cancel needs a job"] }
        let operation = request["operation"] as? String
        switch daemon.cancel(job: job, operation: operation) {
        case .cancelled: return ["exit": 0]
        case .unknownJob: return ["exit": 1, "error": "unknown job '\(job)'"]
        case .unknownOperation: return ["exit": 1, "error": "job '\(job)' has no operation '\(operation ?? "")'"]
        case .alreadyEnded:
            return ["exit": 1,
                    "error": operation.map { "operation '\($0)' of job '\(job)' has already ended" } ?? "job '\(job)' has already ended"]
        case .unavailable(let reason):
            return ["exit": 3, "error": "job '\(job)' is not on this node and the cluster cannot be asked now: \(reason); try again"]
        }
    case "metrics":
        return ["exit": 0, "text": daemon.metricsText()]
    case "suspend", "resume":
        guard let queue = request["queue"] as? String else { return ["exit": 64, "error": "\(command) needs a queue"] }
        return daemon.suspend(queue: queue, command == "suspend") ? ["exit": 0] : ["exit": 1, "error": "unknown queue '\(queue)'"]
    default:
        return ["exit": 64, "error": "unknown command '\(command)'"]
    }
}

/// `show` of a job the cluster knows and this node does not run (SPEC §8): waiting, running elsewhere or ended;
/// an ended one's operations come from the result.plist the database keeps. While it runs on another node, its
/// operations' states are those that node's last heartbeat sent (ClusterProgress; `progressAt` says when): an
/// operation it did not send (the job left out of a full beat, or not started at that beat) is `unknown`, never a
/// `pending` that may be false.
func clusterShow(_ record: JobRecord) -> [String: Any] {
    /// An operation as the running node's last heartbeat sent it.
    func sent(_ id: String, _ operation: ClusterProgress.Sent) -> [String: Any] {
        ["id": id, "state": operation.state, "attempts": operation.attempts, "queue": operation.queue]
    }
    var answer: [String: Any] = ["exit": 0, "job": record.id, "submittedOn": record.submittedOn]
    if let node = record.node { answer["node"] = node }
    var progress: [String: ClusterProgress.Sent] = [:]
    if record.state == .running, let bytes = record.nodeProgress, let sent = ClusterProgress.decode(bytes, job: record.id) {
        progress = sent
        if let at = record.nodeProgressAt { answer["progressAt"] = at }
    }
    switch record.state {
    case .waiting:
        if let notBefore = record.notBefore, notBefore > Date().timeIntervalSince1970 {
            answer["status"] = "delayed"
            answer["notBefore"] = notBefore
        } else {
            answer["status"] = "waiting"
        }
    case .running: answer["status"] = "running"
    case .finished: answer["status"] = record.status ?? "finished"
    }
    // States from the kept result.plist (ended), the graph (kind, queue, dependencies) from the manifest.
    var ended: [String: [String: Any]] = [:]
    if let bytes = record.result,
       let plist = try? PropertyListSerialization.propertyList(from: Data(bytes), format: nil) as? [String: Any] {
        for op in plist["operations"] as? [[String: Any]] ?? [] { if let id = op["id"] as? String { ended[id] = op } }
    }
    var operations: [[String: Any]] = []
    let manifest = (try? PropertyListSerialization.propertyList(from: Data(record.manifest), format: nil)) as? [String: Any]
    for op in manifest?["operations"] as? [[String: Any]] ?? [] {
        guard let id = op["id"] as? String else { continue }
        var entry = ended.removeValue(forKey: id)
            ?? progress.removeValue(forKey: id).map { sent(id, $0) }
            ?? (record.state == .running ? ["id": id, "state": "unknown"] : ["id": id, "state": "pending", "attempts": 0])
        entry["dependencies"] = op["dependencies"] as? [String] ?? []
        if entry["kind"] == nil, let kind = op["kind"] as? String { entry["kind"] = kind }
        if entry["queue"] == nil { entry["queue"] = op["queue"] as? String ?? "" }
        operations.append(entry)
    }
    // Operations only the result or the progress knows (a photo list's, SPEC §3.5), in id order.
    operations += ended.values.sorted { ($0["id"] as? String ?? "") < ($1["id"] as? String ?? "") }
    operations += progress.sorted { $0.key < $1.key }.map { sent($0.key, $0.value) }
    answer["operations"] = operations
    return answer
}
