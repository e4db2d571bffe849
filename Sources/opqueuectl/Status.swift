// opqueuectl status: the daemon's state, queues, cluster nodes and jobs, as JSON or as aligned tables.

import ControlPlane
import ArgumentParser
import Daemon
import Foundation
import JobModel

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Daemon state, queues and jobs.")
    @OptionGroup var common: Common
    @Flag(help: "JSON output.") var json = false
    @Flag(help: "Also the bytes the daemon's allocator has handed out (walks its free lists).") var memory = false

    func run() throws {
        let answer = try common.request(.status(memory: memory), as: StatusAnswer.self)
        if json {
            print(String(decoding: try ControlJSON.data(answer, pretty: true), as: UTF8.self))
            return
        }
        print(statusReport(answer), terminator: "")
    }
}

/// `status` for people: a summary line, the queues and the jobs as aligned tables.
func statusReport(_ answer: StatusAnswer) -> String {
    var out = "state: \(answer.state)  jobs active: \(answer.activeJobs.count + unlistedDelayed(answer))  "
        + "waiting in the inbox: \(answer.waiting)  operations executing: \(answer.executing)\n"
    if let fault = answer.fault { out += "claiming paused: \(fault)\n" }
    if let held = answer.submissions, held > 0 {
        let oldest = answer.submissionsSince.map { max(0, Date().timeIntervalSince1970 - $0) }
        let since = oldest.map { String(format: " (the oldest for %.0f s)", $0) } ?? ""
        out += "of those, taken from the inbox for the cluster and not yet in the database: \(held)\(since)\n"
    }
    if let operations = answer.operations, let budget = answer.maxActiveOperations {
        out += "operations in active jobs: \(operations) of \(budget)\(operations >= budget ? " (claiming paused until some end)" : "")\n"
    }
    if let heap = answer.heapBytes { out += "heap in use: \(heap / 1024) KiB\n" }
    out += queuesReport(answer)
    out += flowControlReport(answer)
    out += nodesReport(answer)
    out += clusterReport(answer)
    out += jobsReport(answer)
    return out
}

/// The queues' table, and what holds them: the cluster's suspensions not yet read, cluster-wide limits.
func queuesReport(_ answer: StatusAnswer) -> String {
    var out = ""
    var queues = [["QUEUE", "LIMIT", "QOS", "EXECUTING", "PENDING", "SUSPENDED"]]
    var held = false
    for q in answer.queues {
        let limit = q.maxConcurrentOperationCount
        let suspended = q.held == true ? "held" : q.suspended ? "yes" : "no"
        held = held || suspended == "held"
        queues.append([q.name, limit < 0 ? "per-core" : String(limit), q.qualityOfService, String(q.executing), String(q.pending),
                       suspended])
    }
    out += "\n" + table(queues)
    if held {
        out += "held: no operation starts on these queues until this node has read from the database "
            + "which queues are suspended cluster-wide\n"
    }
    // clusterMaxConcurrentOperationCount: an operation executes only while its node holds one of the queue's slots.
    for q in answer.queues {
        guard let limit = q.clusterMaxConcurrentOperationCount else { continue }
        out += "\(q.name): at most \(limit) executing across the cluster; this node holds \(q.clusterSlotsHeld ?? 0) of its slots"
        if let priority = q.clusterSlotWait { out += " and waits for more (its wait recorded at priority \(priority))" }
        out += "\n"
    }
    return out
}

/// A cluster node (SPEC §8) speaks for the whole cluster: its nodes as it last read them.
func nodesReport(_ answer: StatusAnswer) -> String {
    var out = ""
    if let nodes = answer.nodes {
        // Read from the database: while this node cannot reach it, the table is the last one it read.
        if let state = answer.cluster?.state, state != "connected", !nodes.isEmpty {
            out += "\nthe nodes as this node last read them from the database (it is \(state) now: CONNECTED may be out of date):"
        }
        if nodes.isEmpty { out += "\nthe nodes: not read from the database yet\n" }
        var rows = [["NODE", "CONNECTED", "LAST HEARTBEAT", "JOBS", "FREE SLOTS", "SCHEMA"]]
        let now = Date().timeIntervalSince1970
        for n in nodes {
            let beat = String(format: "%.1f s ago", max(0, now - n.lastHeartbeat))
            rows.append([n.node, n.connected ? "yes" : "no", beat, String(n.jobs), String(n.freeSlots), n.schema.map(String.init) ?? "<6"])
        }
        if !nodes.isEmpty { out += "\n" + table(rows) }
        // Nodes being upgraded one by one: which are left.
        let schemas = Set(nodes.map { $0.schema ?? 5 })
        if schemas.count > 1, let newest = schemas.max() {
            let behind = nodes.filter { ($0.schema ?? 5) < newest }.map(\.node)
            out += "nodes whose opqueued knows an older schema than \(newest) (upgrade them): \(behind.joined(separator: ", "))\n"
        }
    }
    return out
}

/// The cluster as this node sees it: connected or not, wake-ups, the jobs no live node can run, the queues' counts.
func clusterReport(_ answer: StatusAnswer) -> String {
    var out = ""
    if let cluster = answer.cluster {
        out += "\ncluster: \(cluster.state)\(cluster.reason.map { " (\($0))" } ?? "")\n"
        if !cluster.wakeupsArrive {
            out += "wake-ups do not reach this node (a connection pooler in transaction mode?): jobs start by the 1 s poll\n"
        }
        for stuck in cluster.unrunnable { out += "waiting: \(stuck.job): \(stuck.reason)\n" }
        // SPEC §8: each queue's cluster-wide counts, as this node last read them.
        if let read = cluster.queuesReadAt {
            let ago = String(format: "%.1f", max(0, Date().timeIntervalSince1970 - read))
            if cluster.queues.isEmpty {
                out += "the cluster's queues: no job waits or runs (read from the database \(ago) s ago)\n"
            } else {
                var rows = [["QUEUE", "WAITING", "RUNNING"]]
                for (name, count) in cluster.queues.sorted(by: { $0.key < $1.key }) {
                    rows.append([name, String(count.waiting), String(count.running)])
                }
                out += "\nthe cluster's jobs per queue (read from the database \(ago) s ago; a job counts in each of its queues):\n"
                    + table(rows)
            }
        }
    }
    return out
}

/// The active jobs and their progress (a delayed one: until when).
func jobsReport(_ answer: StatusAnswer) -> String {
    var out = ""
    // `jobs` (with progress) comes from daemons that know it; `activeJobs` alone from older ones.
    let progress = answer.jobs ?? answer.activeJobs.map { StatusAnswer.Job(job: $0, operations: 0, ended: 0, notBefore: nil) }
    if !progress.isEmpty {
        var rows = [["JOB", "PROGRESS"]]
        for job in progress {
            let state = job.notBefore.map { "delayed until \(TimeText.local($0))" }
                ?? (job.operations == 0 ? "being read" : "\(job.ended)/\(job.operations) done")
            rows.append([job.job, state])
        }
        out += "\n" + table(rows)
    }
    if let delayed = answer.delayed {
        let unlisted = unlistedDelayed(answer)
        out += "delayed: \(delayed)\(unlisted > 0 ? " (\(unlisted) not listed, all later than those listed)" : "")\n"
    }
    return out
}

/// Delayed jobs the daemon counts but does not list (SPEC §3.7: parked out of its memory).
func unlistedDelayed(_ answer: StatusAnswer) -> Int {
    let listed = (answer.jobs ?? []).filter { $0.notBefore != nil }.count
    return max(0, (answer.delayed ?? 0) - listed)
}

/// Left-aligned columns two spaces apart, numbers included (headers are words).
func table(_ rows: [[String]]) -> String {
    var widths: [Int] = []
    for row in rows {
        for (i, cell) in row.enumerated() {
            if i < widths.count { widths[i] = max(widths[i], cell.count) } else { widths.append(cell.count) }
        }
    }
    return rows.map { row in
        row.enumerated().map { i, cell in
            i == row.count - 1 ? cell : cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
        }.joined(separator: "  ")
    }.joined(separator: "\n") + "\n"
}

/// SPEC §3.7: each rated queue's rate and next free start, and each schedule's next occurrence.
func flowControlReport(_ answer: StatusAnswer) -> String {
    var out = ""
    for q in answer.queues {
        guard let rate = q.rateLimit else { continue }
        out += "\(q.name): at most \(rate.operations) starts in any \(numberText(rate.seconds)) s"
        if let next = q.nextStartAt { out += "; next free start \(TimeText.local(next))" }
        out += "\n"
    }
    let schedules = answer.schedules ?? []
    if !schedules.isEmpty {
        var rows = [["SCHEDULE", "CRON", "ZONE", "NEXT"]]
        for s in schedules { rows.append([s.name, s.cron, s.timeZone, s.next.map(TimeText.local) ?? "none"]) }
        out += "\n" + table(rows)
    }
    return out
}

/// A number as it reads in JSON: a whole one without a fraction (60, not 60.0).
func numberText(_ value: Double) -> String {
    value.rounded() == value && abs(value) < 1e15 ? String(Int(value)) : "\(value)"
}
