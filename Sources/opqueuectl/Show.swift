// opqueuectl show: a job's operations, from the outbox once it has ended, else from the daemon.

import ControlPlane
import ArgumentParser
import Daemon
import Foundation
import JobModel

/// A job's outbox entry, once it has ended: its folder and result (outbox/<job>, or the outbox/<job>.N whose
/// result names the job when that name was taken: `Spool.entry`).
func outboxEntry(of job: String, _ common: Common) -> (folder: String, result: [String: Any])? {
    guard let folder = Spool.entry(of: job, in: common.spool + "/outbox"),
          let data = FileManager.default.contents(atPath: folder + "/result.plist"),
          let result = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any] else { return nil }
    return (folder, result)
}

/// A job's operations: from the outbox when it has ended, else from the daemon (which, in a cluster, answers for
/// jobs on every node); `node` is where it runs or ran, when known (SPEC §8).
/// `progressAt`: for a job running on another node, when that node's heartbeat sent the states shown; `notBefore`:
/// a delayed job's time (SPEC §3.7).
func operations(of job: String, _ common: Common) throws
    -> (status: String, operations: [[String: Any]], node: String?, progressAt: Double?, notBefore: Double?) {
    if let plist = outboxEntry(of: job, common)?.result {
        return (plist["status"] as? String ?? "?", plist["operations"] as? [[String: Any]] ?? [], plist["node"] as? String, nil, nil)
    }
    let response = try common.request(ControlRequest.show(job: job).wire)
    return (response["status"] as? String ?? "running", response["operations"] as? [[String: Any]] ?? [], response["node"] as? String,
            response["progressAt"] as? Double, response["notBefore"] as? Double)
}

struct Show: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Each operation's state, queue, attempts, timings, error.")
    @OptionGroup var common: Common
    @Argument(help: "A job id.", completion: .custom(completeJobs)) var job: String
    @Flag(help: "JSON output.") var json = false

    func run() throws {
        let (status, ops, node, progressAt, notBefore) = try operations(of: job, common)
        if json {
            var object: [String: Any] = ["job": job, "status": status, "operations": ops]
            if let notBefore { object["notBefore"] = notBefore }
            if let node { object["node"] = node }
            if let progressAt { object["progressAt"] = progressAt }
            let data = try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys])
            print(String(decoding: data, as: UTF8.self))
            return
        }
        // A job running on another node: its operations' states as that node's last heartbeat sent them, or
        // `unknown` for those it did not send (SPEC §8: no protocol between nodes).
        let elsewhere = ops.contains { $0["state"] as? String == "unknown" }
        var place = ""
        if let node {
            if let progressAt {
                let age = max(0, Date().timeIntervalSince1970 - progressAt)
                place = " on node \(node) (states as of its heartbeat \(String(format: "%.1f", age)) s ago)"
            } else if elsewhere {
                place = " on node \(node) (its operations' states are known there: opqueuectl show on that node)"
            } else {
                place = " (node \(node))"
            }
        }
        print("job \(job): \(status)\(place)\(notBefore.map { " until \(TimeText.local($0))" } ?? "")")
        if ops.isEmpty && status == "running" { print("  (claimed a moment ago: its manifest is being read)") }
        for op in ops {
            var line = "  \(op["id"] ?? "?")  \(op["kind"] ?? "")  queue=\(op["queue"] ?? "")  \(op["state"] ?? "")"
            if let attempts = op["attempts"] { line += "  attempts=\(attempts)" }
            if let s = op["startedAt"] as? Double, let f = op["finishedAt"] as? Double { line += String(format: "  %.3fs", f - s) }
            if let e = op["error"] as? String { line += "  error: \(e)" }
            print(line)
        }
    }
}
