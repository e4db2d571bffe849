// The node's long-lived parts as services of one ServiceGroup (swift-service-lifecycle): the spool service (control
// socket, inbox watch, metrics listener, readiness, then the drain at a graceful stop), the signal service (SIGHUP
// reloads; SIGUSR1/2 are logged) and the systemd status/watchdog service.

import ControlPlane
import Foundation
import Logging
import ServiceLifecycle
import SystemdJournal
import UnixSignals

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
                throw Node.Refused(status: 1)
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
        // The last jobs' traces reach the exporter before it stops (it is the group's last service to stop).
        daemon.tracing?.drain()
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
                var message = "STATUS=jobs active \(status.activeJobs.count + status.parked), waiting \(status.waiting); "
                    + "operations executing \(status.executing)"
                if let fault = status.fault { message += "; claiming paused: \(fault)" }
                if watchdog != nil { message += "\nWATCHDOG=1" }
                SystemdNotifier.notify(message)
                try await Task.sleep(for: .seconds(interval))
            }
        }
    }
}
