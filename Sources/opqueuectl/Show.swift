// opqueuectl show: a job's operations, from the outbox once it has ended, else from the daemon.

import ControlPlane
import ArgumentParser
import Daemon
import Foundation
import JobModel
import SpoolFiles

/// A job's outbox entry, once it has ended (outbox/<job>, or the outbox/<job>.N whose result names the job when
/// that name was taken; else the one folder, whatever its name, whose result names it: `Outbox.find`); nil while
/// there is none. An entry whose result cannot be read is an error that says which file and why: the job has ended,
/// and asking the daemon (or waiting) would never say more; so are two folders that both say they are the job's.
/// `search` false, or a job of that id in active/ or waiting as inbox/<job>.plist: its own names only (a renamed
/// folder then is an older job's of the same id; a wait polling its own names looks at the rest once, not each time).
func endedEntry(of job: String, _ common: Common, search: Bool = true) throws -> OutboxEntry? {
    let held = access(common.spool + "/active/" + job, F_OK) == 0 || access(common.spool + "/inbox/" + job + ".plist", F_OK) == 0
    switch Outbox.find(job, in: common.spool + "/outbox", search: search && !held && isValidIdentifier(job)) {
    case nil: return nil
    case .entry(let entry)?: return entry
    case .unreadable(let problem)?: throw fail("job '\(job)' has ended, but its result cannot be read: \(problem)")
    case .several(let entries)?:
        let folders = entries.map { "outbox/\($0.name) (\($0.status), finished \(TimeText.local($0.finishedAt)))" }
        throw fail("job '\(job)': \(entries.count) outbox folders say they are its, none named \(job): "
            + folders.joined(separator: ", ") + "; rename the job's own to outbox/\(job)")
    }
}

/// A job's outbox entry with its whole result (every operation), once it has ended.
func outboxEntry(of job: String, _ common: Common) throws -> (folder: String, result: ShownResult)? {
    guard let entry = try endedEntry(of: job, common) else { return nil }
    let folder = common.spool + "/outbox/" + entry.name
    do {
        let data = try readRegularFile(folder + "/result.plist").get()
        return (folder, try PropertyListDecoder().decode(ShownResult.self, from: data))
    } catch {
        throw fail("job '\(job)' has ended, but its result cannot be read: \(folder)/result.plist: \(error)")
    }
}

/// A job as `show` prints it, and its `--json`: `node` is where it runs or ran, when known (SPEC §8); `progressAt`:
/// for a job running on another node, when that node's heartbeat sent the states shown; `notBefore`: a delayed
/// job's time (SPEC §3.7).
struct Shown: Encodable {
    var job: String
    var status: String
    var operations: [ShowAnswer.Operation]
    var notBefore: Double?
    var node: String?
    var progressAt: Double?
}

/// A job's operations: from the outbox when it has ended, else from the daemon (which, in a cluster, answers for
/// jobs on every node).
func shown(_ job: String, _ common: Common) throws -> Shown {
    if let result = try outboxEntry(of: job, common)?.result {
        return Shown(job: job, status: result.status ?? "?", operations: result.operations ?? [], node: result.node)
    }
    let answer = try common.request(.show(job: job), as: ShowAnswer.self)
    return Shown(job: job, status: answer.status, operations: answer.operations, notBefore: answer.notBefore, node: answer.node,
                 progressAt: answer.progressAt)
}

struct Show: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Each operation's state, queue, attempts, timings, error.")
    @OptionGroup var common: Common
    @Argument(help: "A job id.", completion: .custom(completeJobs)) var job: String
    @Flag(help: "JSON output.") var json = false

    func run() throws {
        let shown = try shown(job, common)
        if json {
            print(String(decoding: try ControlJSON.data(shown, pretty: true), as: UTF8.self))
            return
        }
        let (status, ops, node, progressAt, notBefore) = (shown.status, shown.operations, shown.node, shown.progressAt, shown.notBefore)
        // A job running on another node: its operations' states as that node's last heartbeat sent them, or
        // `unknown` for those it did not send (SPEC §8: no protocol between nodes).
        let elsewhere = ops.contains { $0.state == "unknown" }
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
            var line = "  \(op.id)  \(op.kind ?? "")  queue=\(op.queue ?? "")  \(op.state)"
            if let attempts = op.attempts { line += "  attempts=\(attempts)" }
            if let s = op.startedAt, let f = op.finishedAt { line += String(format: "  %.3fs", f - s) }
            if let e = op.error { line += "  error: \(e)" }
            print(line)
        }
    }
}
