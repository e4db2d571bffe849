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
        let response = try common.request(ControlRequest.status(memory: memory).wire)
        if json {
            let data = try JSONSerialization.data(withJSONObject: response, options: [.prettyPrinted, .sortedKeys])
            print(String(decoding: data, as: UTF8.self))
            return
        }
        print(statusReport(response), terminator: "")
    }
}

/// `status` for people: a summary line, the queues and the jobs as aligned tables.
func statusReport(_ response: [String: Any]) -> String {
    let active = response["activeJobs"] as? [String] ?? []
    var out = "state: \(response["state"] as? String ?? "?")  jobs active: \(active.count + unlistedDelayed(response))  "
        + "waiting in the inbox: \(response["waiting"] as? Int ?? 0)  operations executing: \(response["executing"] as? Int ?? 0)\n"
    if let fault = response["fault"] as? String { out += "claiming paused: \(fault)\n" }
    if let held = response["submissions"] as? Int, held > 0 {
        let oldest = (response["submissionsSince"] as? Double).map { max(0, Date().timeIntervalSince1970 - $0) }
        let since = oldest.map { String(format: " (the oldest for %.0f s)", $0) } ?? ""
        out += "of those, taken from the inbox for the cluster and not yet in the database: \(held)\(since)\n"
    }
    if let operations = response["operations"] as? Int, let budget = response["maxActiveOperations"] as? Int {
        out += "operations in active jobs: \(operations) of \(budget)\(operations >= budget ? " (claiming paused until some end)" : "")\n"
    }
    if let heap = response["heapBytes"] as? Int { out += "heap in use: \(heap / 1024) KiB\n" }
    out += queuesReport(response)
    out += flowControlReport(response)
    out += nodesReport(response)
    out += clusterReport(response)
    out += jobsReport(response)
    return out
}

/// The queues' table, and what holds them: the cluster's suspensions not yet read, cluster-wide limits.
func queuesReport(_ response: [String: Any]) -> String {
    var out = ""
    var queues = [["QUEUE", "LIMIT", "QOS", "EXECUTING", "PENDING", "SUSPENDED"]]
    var held = false
    for q in response["queues"] as? [[String: Any]] ?? [] {
        let limit = q["maxConcurrentOperationCount"] as? Int ?? 0
        let suspended = (q["held"] as? Bool) == true ? "held" : (q["suspended"] as? Bool) == true ? "yes" : "no"
        held = held || suspended == "held"
        queues.append([q["name"] as? String ?? "?", limit < 0 ? "per-core" : String(limit), q["qualityOfService"] as? String ?? "",
                       String(q["executing"] as? Int ?? 0), String(q["pending"] as? Int ?? 0), suspended])
    }
    out += "\n" + table(queues)
    if held {
        out += "held: no operation starts on these queues until this node has read from the database "
            + "which queues are suspended cluster-wide\n"
    }
    // clusterMaxConcurrentOperationCount: an operation executes only while its node holds one of the queue's slots.
    for q in response["queues"] as? [[String: Any]] ?? [] {
        guard let limit = q["clusterMaxConcurrentOperationCount"] as? Int else { continue }
        let heldHere = q["clusterSlotsHeld"] as? Int ?? 0
        out += "\(q["name"] as? String ?? "?"): at most \(limit) executing across the cluster; this node holds \(heldHere) of its slots"
        if let priority = q["clusterSlotWait"] as? String { out += " and waits for more (its wait recorded at priority \(priority))" }
        out += "\n"
    }
    return out
}

/// A cluster node (SPEC §8) speaks for the whole cluster: its nodes as it last read them.
func nodesReport(_ response: [String: Any]) -> String {
    var out = ""
    if let nodes = response["nodes"] as? [[String: Any]] {
        // Read from the database: while this node cannot reach it, the table is the last one it read.
        let state = (response["cluster"] as? [String: Any])?["state"] as? String
        if let state, state != "connected", !nodes.isEmpty {
            out += "\nthe nodes as this node last read them from the database (it is \(state) now: CONNECTED may be out of date):"
        }
        if nodes.isEmpty { out += "\nthe nodes: not read from the database yet\n" }
        var rows = [["NODE", "CONNECTED", "LAST HEARTBEAT", "JOBS", "FREE SLOTS", "SCHEMA"]]
        let now = Date().timeIntervalSince1970
        for n in nodes {
            let beat = (n["lastHeartbeat"] as? Double).map { String(format: "%.1f s ago", max(0, now - $0)) } ?? "never"
            rows.append([n["node"] as? String ?? "?", (n["connected"] as? Bool) == true ? "yes" : "no", beat,
                         String(n["jobs"] as? Int ?? 0), String(n["freeSlots"] as? Int ?? 0),
                         (n["schema"] as? Int).map(String.init) ?? "<6"])
        }
        if !nodes.isEmpty { out += "\n" + table(rows) }
        // Nodes being upgraded one by one: which are left.
        let schemas = Set(nodes.compactMap { $0["schema"] as? Int ?? 5 })
        if schemas.count > 1, let newest = schemas.max() {
            let behind = nodes.filter { ($0["schema"] as? Int ?? 5) < newest }.compactMap { $0["node"] as? String }
            out += "nodes whose opqueued knows an older schema than \(newest) (upgrade them): \(behind.joined(separator: ", "))\n"
        }
    }
    return out
}

/// The cluster as this node sees it: connected or not, wake-ups, the jobs no live node can run, the queues' counts.
func clusterReport(_ response: [String: Any]) -> String {
    var out = ""
    if let cluster = response["cluster"] as? [String: Any] {
        if let state = cluster["state"] as? String { out += "\ncluster: \(state)\(cluster["reason"].map { " (\($0))" } ?? "")\n" }
        if cluster["wakeupsArrive"] as? Bool == false {
            out += "wake-ups do not reach this node (a connection pooler in transaction mode?): jobs start by the 1 s poll\n"
        }
        for stuck in cluster["unrunnable"] as? [[String: Any]] ?? [] {
            out += "waiting: \(stuck["job"] as? String ?? "?"): \(stuck["reason"] as? String ?? "no live node can run it")\n"
        }
        // SPEC §8: each queue's cluster-wide counts, as this node last read them.
        if let read = cluster["queuesReadAt"] as? Double, let counts = cluster["queues"] as? [String: [String: Any]] {
            let ago = String(format: "%.1f", max(0, Date().timeIntervalSince1970 - read))
            if counts.isEmpty {
                out += "the cluster's queues: no job waits or runs (read from the database \(ago) s ago)\n"
            } else {
                var rows = [["QUEUE", "WAITING", "RUNNING"]]
                for (name, count) in counts.sorted(by: { $0.key < $1.key }) {
                    rows.append([name, String(count["waiting"] as? Int ?? 0), String(count["running"] as? Int ?? 0)])
                }
                out += "\nthe cluster's jobs per queue (read from the database \(ago) s ago; a job counts in each of its queues):\n"
                    + table(rows)
            }
        }
    }
    return out
}

/// The active jobs and their progress (a delayed one: until when).
func jobsReport(_ response: [String: Any]) -> String {
    var out = ""
    let active = response["activeJobs"] as? [String] ?? []
    // `jobs` (with progress) comes from daemons that know it; `activeJobs` alone from older ones.
    let progress = response["jobs"] as? [[String: Any]] ?? active.map { ["job": $0] }
    if !progress.isEmpty {
        var rows = [["JOB", "PROGRESS"]]
        for job in progress {
            let total = job["operations"] as? Int ?? 0
            let state = (job["notBefore"] as? Double).map { "delayed until \(TimeText.local($0))" }
                ?? (total == 0 ? "being read" : "\(job["ended"] as? Int ?? 0)/\(total) done")
            rows.append([job["job"] as? String ?? "?", state])
        }
        out += "\n" + table(rows)
    }
    if let delayed = response["delayed"] as? Int {
        let unlisted = unlistedDelayed(response)
        out += "delayed: \(delayed)\(unlisted > 0 ? " (\(unlisted) not listed, all later than those listed)" : "")\n"
    }
    return out
}

/// Delayed jobs the daemon counts but does not list (SPEC §3.7: parked out of its memory).
func unlistedDelayed(_ response: [String: Any]) -> Int {
    let listed = (response["jobs"] as? [[String: Any]] ?? []).filter { $0["notBefore"] != nil }.count
    return max(0, (response["delayed"] as? Int ?? 0) - listed)
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
func flowControlReport(_ response: [String: Any]) -> String {
    var out = ""
    for q in response["queues"] as? [[String: Any]] ?? [] {
        guard let rate = q["rateLimit"] as? [String: Any] else { continue }
        out += "\(q["name"] as? String ?? "?"): at most \(rate["operations"] ?? "?") starts in any \(rate["seconds"] ?? "?") s"
        if let next = q["nextStartAt"] as? Double { out += "; next free start \(TimeText.local(next))" }
        out += "\n"
    }
    let schedules = response["schedules"] as? [[String: Any]] ?? []
    if !schedules.isEmpty {
        var rows = [["SCHEDULE", "CRON", "ZONE", "NEXT"]]
        for s in schedules {
            rows.append([s["name"] as? String ?? "?", s["cron"] as? String ?? "", s["timeZone"] as? String ?? "",
                         (s["next"] as? Double).map(TimeText.local) ?? "none"])
        }
        out += "\n" + table(rows)
    }
    return out
}
