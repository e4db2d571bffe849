// opqueuectl graph: a manifest's or a job's operation graph in Graphviz DOT.

import ArgumentParser
import ControlPlane
import Daemon
import Foundation
import JobModel
import SpoolFiles

struct Graph: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "The operation graph in Graphviz DOT, states as colours.")
    @OptionGroup var common: Common
    @Argument(help: "A job id or a manifest file (- reads one from standard input).") var target: String

    /// What the drawing needs of an operation: from a manifest, or from the daemon's `show` of a running job.
    struct Node {
        var id: String, kind: String, queue: String, dependencies: [String]
    }

    func run() throws {
        var states: [String: String] = [:]
        var nodes: [Node]
        var name = target
        // As submit checks: with the running daemon's queues and commands (an ended job's manifest may use them).
        let config = try common.submissionConfiguration()
        var isFolder: ObjCBool = false
        if target == "-" || (FileManager.default.fileExists(atPath: target, isDirectory: &isFolder) && !isFolder.boolValue) {
            let data: Data
            switch readManifestArgument(target) {
            case .success(let read): data = read
            case .failure(let error): throw fail("\(target): cannot be read: \(error)")
            }
            switch Manifest.parse(data, configuration: config) {
            case .success(let plan):
                nodes = Self.nodes(plan)
                name = plan.job ?? target
            case .failure(let problems): throw fail("\(target): " + problems.problems.joined(separator: "\n"))
            }
        } else {
            // An ended job: its manifest in the outbox, states from its result. A running one: the daemon's
            // `show` gives each operation's kind, queue, dependencies and current state.
            let ops = try shown(target, common).operations
            for op in ops { states[op.id] = op.state }
            let name = try endedEntry(of: target, common)?.name ?? target
            let manifest = common.spool + "/outbox/" + name + "/manifest.plist"
            // Read as retry reads it: a link or a FIFO planted there is not followed.
            if case .success(let data) = readRegularFile(manifest),
               case .success(let plan) = Manifest.parse(data, configuration: config) {
                nodes = Self.nodes(plan)
            } else {
                nodes = ops.compactMap { op in
                    op.dependencies.map { Node(id: op.id, kind: op.kind ?? "", queue: op.queue ?? "", dependencies: $0) }
                }
                if nodes.isEmpty { throw fail("no manifest for job '\(target)'") }
            }
        }
        let colours = ["pending": "gray80", "ready": "lightyellow", "executing": "lightblue", "retrying": "orange",
                       "succeeded": "palegreen", "failed": "salmon", "cancelled": "gray60"]
        // Every name is quoted for DOT: a file's path (the graph's name when the manifest has no `job`) may hold
        // quotes or backslashes.
        func q(_ text: String) -> String {
            "\"" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
                .replacingOccurrences(of: "\n", with: "\\n") + "\""
        }
        var dot = "digraph \(q(name)) {\n  rankdir=LR;\n  node [shape=box, style=filled];\n"
        for node in nodes {
            let state = states[node.id] ?? "pending"
            dot += "  \(q(node.id)) [label=\(q("\(node.id)\n\(node.kind) · \(node.queue)\n\(state)")), "
                + "fillcolor=\(colours[state] ?? "white")];\n"
        }
        for node in nodes {
            for dep in node.dependencies { dot += "  \(q(dep)) -> \(q(node.id));\n" }
        }
        print(dot + "}")
    }

    static func nodes(_ plan: JobPlan) -> [Node] {
        plan.operations.map { Node(id: $0.id, kind: $0.kind.rawValue, queue: $0.queue, dependencies: $0.dependencies) }
    }
}
