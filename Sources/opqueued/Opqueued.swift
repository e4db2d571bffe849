// opqueued — the operation-graph spool daemon.
//
// What it does: watches <spool>/inbox for property-list manifests, runs each as a graph of operations on
// named queues, and publishes the results in <spool>/outbox (SPEC.md §1, §2). This file only parses the
// command line and runs the daemon's services; everything else lives in the libraries it links.
// What it trusts: nothing in the spool; its own configuration file.

import ArgumentParser
import Foundation
import Logging
import ServiceLifecycle

enum LogTarget: String, ExpressibleByArgument, CaseIterable {
    case auto, journal, console
}

@main
struct Opqueued: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "opqueued",
        abstract: "Runs operation graphs dropped into a spool folder.")

    @Option(help: "The spool root.")
    var spool = "./spool"

    @Option(help: "The configuration property list.")
    var config: String?

    @Option(help: "Where events go: auto, journal or console.")
    var logTarget: LogTarget = .auto

    @Flag(help: "Run what is in the inbox at start, then exit.")
    var once = false

    @Flag(help: "Print the version and exit.")
    var version = false

    func run() async throws {
        if version {
            print("opqueued 0.1.0")
            return
        }
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .info
            return handler
        }
        let logger = Logger(label: "opqueued")
        let root = URL(fileURLWithPath: spool)
        do {
            for folder in ["inbox", "active", "outbox", "tmp"] {
                try FileManager.default.createDirectory(at: root.appendingPathComponent(folder), withIntermediateDirectories: true)
            }
        } catch {
            logger.error("the spool \(spool) cannot be used: \(error)")
            throw ExitCode(1)
        }
        logger.info("OPQ_EVENT=daemon OPQ_STATE=ready spool=\(spool)")
        if once { return }
        let group = ServiceGroup(
            configuration: .init(services: [.init(service: Idle())], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
        logger.info("OPQ_EVENT=daemon OPQ_STATE=stopping")
    }
}

/// Waits for the graceful shutdown (the spool service replaces it).
struct Idle: Service {
    func run() async throws {
        try? await gracefulShutdown()
    }
}
