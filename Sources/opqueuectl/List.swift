// opqueuectl list: the ended jobs in the outbox, newest first by finishedAt (SPEC §1), read from the outbox itself
// whether or not the daemon runs.
//
// Memory: one OutboxEntry per job listed (~100 bytes: the id's characters past 15, and a node's, add theirs), never a
// whole result.plist (Stores/Outbox.swift reads its top-level keys only, a stream of the folder one entry at a time);
// sorted in place, and written out as it is formatted, 64 KB at a time. 100,000 jobs take ~10 MB.

import ArgumentParser
import Daemon
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import JobModel
import SystemCalls

struct List: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Ended jobs in the outbox, newest first: id, status, node, finish time, duration.",
        discussion: """
            Read from SPOOL/outbox, whether or not the daemon runs; with a cluster in --config, also from the \
            database's history (jobs that ran on other nodes), or, when the database cannot be used, the outbox \
            alone with a word on standard error. --since takes ISO 8601 with a zone \
            (2026-11-28T02:00:00Z, 2026-11-28T03:00:00+01:00) or @ and seconds since the epoch (@1764295200), and \
            keeps the jobs that finished then or later. The table gives times in the local zone with their offset; \
            --json gives an array of objects with job, status, node (where the job ran, in a cluster), finishedAt \
            (seconds since the epoch) and durationSeconds (absent for a job that never started). A folder whose \
            result.plist cannot be read is named on standard error and not listed. An unknown status or time exits 1.
            """)
    @OptionGroup var common: Common
    @Option(help: ArgumentHelp("Only the jobs that ended so: succeeded, failed, cancelled or rejected.", valueName: "status"),
            completion: .list(Outbox.statuses))
    var status: String?
    @Option(help: ArgumentHelp("Only the jobs that finished at this time or later.", valueName: "time"))
    var since: String?
    @Flag(help: "JSON output.") var json = false

    func run() throws {
        let statuses = try statusFilter(status)
        let from = try since.map { text in
            guard let time = TimeText.parse(text) else { throw fail("--since '\(text)' is not a time: \(TimeText.forms)") }
            return time
        }
        let reader: OutboxReader
        do { reader = try OutboxReader(common.spool + "/outbox") } catch { throw fail("\(error)") }
        var entries: [OutboxEntry] = []
        while let next = reader.next() {
            switch next {
            case .failure(let problem):
                FileHandle.standardError.write(Data("opqueuectl: \(problem); not listed\n".utf8))
            case .success(let entry):
                guard statuses.map({ $0.contains(entry.status) }) != false, from.map({ entry.finishedAt >= $0 }) != false else { continue }
                entries.append(entry)
            }
        }
        entries += try clusterEntries(besides: entries, statuses: statuses, since: from)
        // Newest first; jobs that finished at the same instant by name.
        entries.sort { $0.finishedAt != $1.finishedAt ? $0.finishedAt > $1.finishedAt : $0.name < $1.name }
        var out = BufferedOutput()
        if json { Self.writeJSON(entries, to: &out) } else { Self.writeTable(entries, to: &out) }
        out.flush()
    }

    /// With a cluster in --config, the jobs of the database's history that this outbox does not hold (those that
    /// ran on other nodes, or whose folders were removed here). A database that cannot be used is said on standard
    /// error; the outbox is listed all the same.
    func clusterEntries(besides local: [OutboxEntry], statuses: Set<String>?, since: Double?) throws -> [OutboxEntry] {
        let config = try common.configuration()
        guard config.cluster != nil else { return [] }
        let history: [OutboxEntry]
        do { history = try ClusterHistory.entries(configuration: config, statuses: statuses, since: since) } catch {
            FileHandle.standardError.write(Data("opqueuectl: \(error); only \(common.spool)/outbox is listed\n".utf8))
            return []
        }
        let here = Set(local.map(\.job))
        return history.filter { !here.contains($0.job) }
    }

    /// `[` one object per line `]`, keys sorted (JSONSerialization's output would need every entry as an NSDictionary).
    static func writeJSON(_ entries: [OutboxEntry], to out: inout BufferedOutput) {
        out.write("[")
        for (i, entry) in entries.enumerated() {
            var object = i == 0 ? "\n  {" : ",\n  {"
            if let duration = entry.durationSeconds { object += "\"durationSeconds\": \(duration), " }
            object += "\"finishedAt\": \(entry.finishedAt), \"job\": \(jsonString(entry.job)), "
            if let node = entry.node { object += "\"node\": \(jsonString(node)), " }
            object += "\"status\": \(jsonString(entry.status))}"
            out.write(object)
        }
        out.write(entries.isEmpty ? "]\n" : "\n]\n")
    }

    /// Aligned columns, two spaces apart (as `status` prints its tables); NODE only when some job names one.
    static func writeTable(_ entries: [OutboxEntry], to out: inout BufferedOutput) {
        guard !entries.isEmpty else { return }
        let withNodes = entries.contains { $0.node != nil }
        var jobWidth = 3, statusWidth = 6, nodeWidth = 4
        for entry in entries {
            jobWidth = max(jobWidth, entry.job.count)
            statusWidth = max(statusWidth, entry.status.count)
            nodeWidth = max(nodeWidth, entry.node?.count ?? 0)
        }
        func pad(_ text: String, _ width: Int) -> String { text + String(repeating: " ", count: max(0, width - text.count) + 2) }
        let finishedWidth = TimeText.local(0).count
        var header = pad("JOB", jobWidth) + pad("STATUS", statusWidth)
        if withNodes { header += pad("NODE", nodeWidth) }
        out.write(header + pad("FINISHED", finishedWidth) + "DURATION\n")
        for entry in entries {
            var line = pad(entry.job, jobWidth) + pad(entry.status, statusWidth)
            if withNodes { line += pad(entry.node ?? "-", nodeWidth) }
            line += pad(TimeText.local(entry.finishedAt), finishedWidth) + (entry.durationSeconds.map(seconds) ?? "-") + "\n"
            out.write(line)
        }
    }

    /// A duration to the millisecond: `12.345s`.
    static func seconds(_ value: Double) -> String {
        // Beyond a millennium (or not a number: a result.plist is a user's file), the number as it is.
        guard value < 3e10 else { return "\(value)s" }
        let milliseconds = Int64((max(0, value) * 1_000).rounded())
        let fraction = String(milliseconds % 1_000)
        return "\(milliseconds / 1_000).\(String(repeating: "0", count: 3 - fraction.count))\(fraction)s"
    }
}

/// `--status` of list and clean: nil, or the status asked for; one that no job ends with exits 1 (SPEC §1).
func statusFilter(_ status: String?) throws -> Set<String>? {
    guard let status else { return nil }
    guard Outbox.statuses.contains(status) else {
        throw fail("unknown status '\(status)': a job ends \(Outbox.statuses.joined(separator: ", "))")
    }
    return [status]
}

/// A JSON string literal.
func jsonString(_ text: String) -> String {
    var out = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case _ where scalar.value < 0x20: out += "\\u00" + (scalar.value < 0x10 ? "0" : "") + String(scalar.value, radix: 16)
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out + "\""
}

/// Standard output written 64 KB at a time: a list of 100,000 jobs is neither 100,000 writes nor one string.
struct BufferedOutput {
    private var bytes: [UInt8] = []

    mutating func write(_ text: String) {
        bytes.append(contentsOf: text.utf8)
        if bytes.count >= 1 << 16 { flush() }
    }

    mutating func flush() {
        bytes.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = retryingInterrupts { Glibc.write(STDOUT_FILENO, raw.baseAddress! + offset, raw.count - offset) }
                guard n > 0 else { return }  // a reader gone (EPIPE): nothing more can be said
                offset += n
            }
        }
        bytes.removeAll(keepingCapacity: true)
    }
}
