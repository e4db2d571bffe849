// Schedules (SPEC §3.7): the shell's side of ScheduleBook. At each occurrence the schedule's manifest file is read,
// given `job = NAME-<occurrence>` and `ifJobExists = skip`, and placed in the inbox like any submission, so that
// every node of a cluster may hold the same schedule and each occurrence runs once. What was handled survives a
// restart in active/.schedules (one line per schedule: name, tab, epoch seconds).

import Foundation
import JobModel
import Logging
import PropertyList
import SpoolFiles
import SystemCalls

extension Daemon {
    var schedulesPath: String { store.folders.active + "/.schedules" }

    /// On `work`: takes the configuration's schedules (at start and at each reload) and submits what is due.
    func configureSchedules(_ config: Configuration) {
        let now = Int64(Date().timeIntervalSince1970)
        let due = shared.withLock { s in s.schedules.configure(config.schedules, saved: savedSchedules(), now: now) }
        submit(due)
        // When each was first seen counts for catch-up after a restart.
        if due.isEmpty && !config.schedules.isEmpty { saveSchedules() }
        scheduleNextOccurrence()
    }

    /// On `work`: one wake-up at the earliest next occurrence (at most a minute away: a clock set forward is noticed).
    func scheduleNextOccurrence() {
        guard let next = shared.withLock({ s in s.schedules.nextWake }) else { return }
        let now = Date().timeIntervalSince1970
        let at = min(Double(next), now + 60)
        let plan = shared.withLock { s -> Bool in
            if let planned = s.schedules.plannedWake, planned <= at, planned > now { return false }
            s.schedules.plannedWake = at
            return true
        }
        guard plan else { return }
        work.asyncAfter(deadline: .now() + max(0, at - now) + 0.001) { [self] in
            let due = shared.withLock { s in
                if s.schedules.plannedWake == at { s.schedules.plannedWake = nil }
                return s.schedules.due(now: Int64(Date().timeIntervalSince1970))
            }
            submit(due)
            scheduleNextOccurrence()
        }
    }

    /// Places each occurrence's manifest in the inbox; an unreadable file is logged (the daemon goes on).
    private func submit(_ due: [(name: String, at: Int64)]) {
        guard !due.isEmpty else { return }
        for (name, at) in due {
            guard let settings = shared.withLock({ s in s.schedules.entries[name]?.settings }) else { continue }
            let job = ScheduleBook.jobID(name, at)
            do {
                let bytes = try Self.occurrence(of: settings.manifest, job: job)
                let hidden = store.folders.inbox + "/." + job + ".plist"
                // Written out before it is renamed in: the schedule's book records it submitted next.
                try writeDurably(Data(bytes), to: hidden, syncFolder: false)
                guard rename(hidden, store.folders.inbox + "/" + job + ".plist") == 0 else {
                    throw SpoolError(operation: "rename", path: hidden, errno: errno)
                }
                logger.info("schedule \(name): occurrence \(job) submitted from \(settings.manifest)", metadata: ["OPQ_JOB": .string(job)])
            } catch {
                logger.error("schedule \(name): occurrence \(job) not submitted: \(error)",
                             metadata: ["OPQ_JOB": .string(job), "OPQ_ERROR": .string("\(error)")])
            }
        }
        saveSchedules()
        scan()
    }

    /// The schedule's manifest with its occurrence's job id and `ifJobExists = skip`.
    static func occurrence(of path: String, job: String) throws -> [UInt8] {
        let data: Data
        switch readRegularFile(path) {
        case .success(let d): data = d
        case .failure(let error): throw ScheduleError("the manifest \(path) cannot be read: \(error)")
        }
        guard case .success(.dictionary(var top)) = ManifestTree(data).value else {
            throw ScheduleError("the manifest \(path) is not a property list whose top level is a dictionary")
        }
        top["job"] = .string(job)
        top["ifJobExists"] = .string("skip")
        return PlistXMLWriter.document(.dictionary(top))
    }

    private func savedSchedules() -> [String: Int64] {
        guard case .success(let data) = readRegularFile(schedulesPath, limit: 1 << 20) else { return [:] }
        var saved: [String: Int64] = [:]
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            let parts = line.split(separator: "\t")
            if parts.count == 2, let at = Int64(parts[1]) { saved[String(parts[0])] = at }
        }
        return saved
    }

    private func saveSchedules() {
        let lines = shared.withLock { s in s.schedules.entries.map { "\($0.key)\t\($0.value.since)\n" }.sorted().joined() }
        do { try replaceDurably(Data(lines.utf8), at: schedulesPath) } catch {
            logger.warning("""
                schedules: what was submitted cannot be recorded in \(schedulesPath): \(error); after a restart an \
                occurrence may be caught up again (it runs once: its id is taken)
                """)
        }
    }
}

struct ScheduleError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
