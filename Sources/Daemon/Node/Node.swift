// The node: what `opqueued` runs once its command line is read. Process set-up in one place (signals noted while
// starting, SIGPIPE ignored, the file limit, the command watchdog forked while the process is small, the allocator,
// the timer clocks), then the log target, the configuration, the spool and the store, then the daemon — alone
// (`--once`) or as the services of one ServiceGroup until a graceful stop.

import ControlPlane
import ClusterStore
import Foundation
import JobModel
import Logging
import OperationKinds
import ServiceLifecycle
import SystemdJournal

public enum Node {
    public struct Options: Sendable {
        public var spool: String
        public var config: String?
        /// journald (true) or the console; nil: journald when its socket exists or systemd connected stderr to it.
        public var journal: Bool?
        public var once: Bool

        public init(spool: String, config: String?, journal: Bool?, once: Bool) {
            self.spool = spool
            self.config = config
            self.journal = journal
            self.once = once
        }
    }

    /// The node could not start (its configuration or spool cannot be used): exit with this status, already logged.
    public struct Refused: Error, Sendable {
        public let status: Int32
    }

    public static func run(_ options: Options) async throws {
        prepareProcess(once: options.once)
        // The command watchdog (docs: kills commands' process groups when this process dies, kill -9 included),
        // first, while the process is small: the fork copies its address space as it is now.
        let watchdog = CommandWatchdog.start()
        SpareSupervisors.prepare()
        Daemon.tuneAllocator()
        await Daemon.openTimerClocks()
        let useJournal = options.journal
            ?? (ProcessInfo.processInfo.environment["JOURNAL_STREAM"] != nil || journalIsListening())
        LoggingSystem.bootstrap { _ in useJournal ? JournalLogHandler() as any LogHandler : ConsoleLogHandler() }
        let logger = Logger(label: "opqueued")
        if case .failure(let failure) = watchdog {
            logger.warning("\(failure); commands a crash leaves running are killed at the next start instead")
        }
        let (configuration, store) = try open(options, logger: logger)
        let daemon = Daemon(configuration: configuration, configPath: options.config, logger: logger, once: options.once, store: store)
        daemon.start()
        if options.once {
            // The exporter's service (tracing.otlp) runs while the jobs do, then flushes, bounded.
            let tracing = daemon.tracing.map { ServiceGroup(services: [$0.service], logger: Logger(label: "opqueued.tracing")) }
            let exporting = Task { try? await tracing?.run() }
            await daemon.runOnce()
            daemon.tracing?.drain()
            await tracing?.triggerGracefulShutdown()
            await exporting.value
            return
        }
        let control = ControlServer(path: store.folders.root + "/opqueued.sock") { request in daemon.answer(request) }
        let watcher = InboxWatcher(path: store.folders.inbox) { names, complete in daemon.scan(hints: names, complete: complete) }
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

    /// A stop or a reload asked for while starting has been noted since before main (COpqueuedStart) and is handed to
    /// the service group once it has the signals (SpoolService, SignalService): their default actions would end the
    /// process. `--once` has no service group: there they get their default actions back. A client of the control
    /// socket that hangs up makes the next write fail with EPIPE; SIGPIPE's default action would end the daemon
    /// instead: ignored in every mode, not only under systemd's IgnoreSIGPIPE=yes.
    static func prepareProcess(once: Bool) {
        if once { Daemon.defaultTerminationSignals() }
        signal(SIGPIPE, SIG_IGN)
        Daemon.raiseFileLimit()
    }

    /// The configuration and the store the node's jobs come from: the spool alone, or (SPEC §8, with `cluster`) the
    /// cluster with the spool as its local copy; a refusal is logged as critical.
    static func open(_ options: Options, logger: Logger) throws(Refused) -> (Configuration, any JobStore) {
        let configuration: Configuration
        do {
            configuration = try options.config.map { try Configuration.load(path: $0) } ?? .builtIn
        } catch {
            logger.critical("\(error)")
            throw Refused(status: 1)
        }
        let spool: Spool
        do {
            spool = try Spool(root: options.spool)
            if configuration.cluster == nil { try spool.refuseClusterHoldings() }
            spool.preferJournalCommits()
        } catch {
            logger.critical("the spool \(options.spool) cannot be used: \(error)")
            throw Refused(status: 1)
        }
        if let newer = spool.formatTakenOver {
            logger.notice("""
                \(spool.active)/ was left by a newer opqueued \
                (\(newer > 0 ? "spool format \(newer)" : "a format this build cannot read")) but holds no job: \
                this build takes it over in its own format \(Spool.format)
                """)
        }
        guard let cluster = configuration.cluster else { return (configuration, SpoolJobStore(spool: spool)) }
        // Every entry names the node; the command watchdog kills commands whose lease ran out even if this process
        // is frozen.
        Journal.node = cluster.node
        do {
            let store = try ClusterJobStore(configuration: configuration, spool: spool, logger: logger,
                                            onLeaseDeadline: { CommandWatchdog.current?.setKillDeadline(monotonicSeconds: $0) })
            return (configuration, store)
        } catch {
            logger.critical("cluster: \(error)")
            throw Refused(status: 1)
        }
    }
}
