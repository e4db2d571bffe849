// opqueuectl cancel, suspend, resume and metrics: one request each to the daemon's control socket.

import ControlPlane
import ArgumentParser
import Daemon
import Foundation

struct Cancel: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Cancel a whole job, or one operation (its dependents follow).")
    @OptionGroup var common: Common
    @Argument(help: "A job id.", completion: .custom(completeJobs)) var job: String
    @Argument(help: "One operation of the job (default: the whole job).") var operation: String?

    func run() throws {
        try common.request(.cancel(job: job, operation: operation))
    }
}

struct Suspend: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Suspend a queue: executing operations go on, no new ones start.",
        discussion: """
            On a daemon alone it stands until the daemon restarts, or until a reload changes the queue's suspended \
            in the configuration (the newer word wins); a reload for anything else leaves it. On a cluster node it is \
            kept in the database and holds on every node.
            """)
    @OptionGroup var common: Common
    @Argument(help: "A queue name.", completion: .custom(completeQueues)) var queue: String
    func run() throws { try toggle(common, queue, "suspend") }
}

struct Resume: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Resume a suspended queue.")
    @OptionGroup var common: Common
    @Argument(help: "A queue name.", completion: .custom(completeQueues)) var queue: String
    func run() throws { try toggle(common, queue, "resume") }
}

func toggle(_ common: Common, _ queue: String, _ command: String) throws {
    try common.request(command == "suspend" ? .suspend(queue: queue) : .resume(queue: queue))
}

struct Metrics: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The daemon's metrics in the Prometheus text format (for node_exporter's textfile collector and scripts).")
    @OptionGroup var common: Common

    func run() throws {
        let text = try common.request(.metrics, as: MetricsAnswer.self).text
        print(text, terminator: text.hasSuffix("\n") ? "" : "\n")
    }
}
