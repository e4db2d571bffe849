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
        _ = try common.request(ControlRequest.cancel(job: job, operation: operation).wire)
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
    _ = try common.request((command == "suspend" ? ControlRequest.suspend(queue: queue) : .resume(queue: queue)).wire)
}

struct Metrics: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The daemon's metrics in the Prometheus text format (for node_exporter's textfile collector and scripts).")
    @OptionGroup var common: Common

    func run() throws {
        let response = try common.request(ControlRequest.metrics.wire)
        guard (response["exit"] as? Int) == 0, let text = response["text"] as? String else {
            throw fail(response["error"] as? String ?? "the daemon gave no metrics", Int32(response["exit"] as? Int ?? 1))
        }
        print(text, terminator: text.hasSuffix("\n") ? "" : "\n")
    }
}
