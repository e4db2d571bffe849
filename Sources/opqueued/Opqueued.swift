// opqueued — the operation-graph spool daemon.
//
// What it does: watches <spool>/inbox for property-list manifests, runs each as a graph of operations on
// named queues, and publishes the results in <spool>/outbox (SPEC.md §1, §2). This file parses the command
// line and runs the node (Daemon's `Node`: process set-up, the log target, the configuration, the spool and the
// store, then the daemon's services until a graceful stop).
// What it trusts: nothing in the spool; its own configuration file.

import ArgumentParser
import COpqueuedStart
import Daemon

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

    @Flag(help: ArgumentHelp("Run what is in the inbox at start, and the jobs held in the spool, then exit.",
                             discussion: "A delayed job (notBefore, delaySeconds) is waited for until its time; "
                                 + "cancel it first to exit sooner. A manifest still open for writing at start is "
                                 + "waited for up to 10 s, then left in the inbox with a warning."))
    var once = false

    @Flag(help: "Print the version and exit.")
    var version = false

    func run() async throws {
        // Links the constructor that notes SIGTERM, SIGINT and SIGHUP before main (COpqueuedStart).
        opq_start_linked()
        if version {
            print("opqueued 0.2.0")
            return
        }
        let journal: Bool? = switch logTarget {
        case .auto: nil
        case .journal: true
        case .console: false
        }
        do {
            try await Node.run(.init(spool: spool, config: config, journal: journal, once: once))
        } catch let refused as Node.Refused {
            throw ExitCode(refused.status)
        }
    }
}
