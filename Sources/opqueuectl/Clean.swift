// opqueuectl clean: removes the outbox folders of jobs that ended more than DAYS days ago (by finishedAt), as the
// daemon's outbox.keepDays does, on demand and whether or not the daemon runs. Each folder is moved into the spool's
// tmp/ and removed there (Stores/Outbox.swift, the retention's code): a reader, or the daemon, never sees half of one.
// The outbox is read as a stream, one entry at a time: memory does not grow with it.

import ArgumentParser
import Daemon
import Foundation
import JobModel

struct Clean: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Removes the outbox folders of jobs that finished more than DAYS days ago.",
        discussion: """
            What outbox.keepDays does (see opqueued.plist(5)), on demand, whether or not the daemon runs: a job's age is \
            counted from its finishedAt, and DAYS may be fractional (0.5 is twelve hours). Each folder is moved into \
            SPOOL/tmp, then removed there, so that no one sees half of one. Prints each job removed (with --dry-run, \
            that would be) and their count: a folder's name, and the job its result names when that is another (a \
            folder renamed by hand is removed by its job's age like any other); a folder whose result.plist cannot be \
            read is named on standard error and left alone. An unknown status, or a folder that could not be removed, exits 1.
            """)
    @OptionGroup var common: Common
    @Option(name: .customLong("older-than"), parsing: .unconditional,
            help: ArgumentHelp("Jobs that finished more than this many days ago.", valueName: "days"))
    var olderThan: Double
    @Option(help: ArgumentHelp("Only the jobs that ended so: succeeded, failed, cancelled or rejected.", valueName: "status"),
            completion: .list(Outbox.statuses))
    var status: String?
    @Flag(help: "Say what would be removed, and remove nothing.") var dryRun = false

    func validate() throws {
        guard olderThan.isFinite, olderThan >= 0 else { throw ValidationError("--older-than must be 0 or more days, not \(olderThan)") }
    }

    func run() throws {
        let statuses = try statusFilter(status)
        let criteria = OutboxSweep.Criteria(cutoff: Date().timeIntervalSince1970 - olderThan * 86_400, statuses: statuses)
        let sweep: OutboxSweep
        do {
            sweep = try OutboxSweep(outbox: common.spool + "/outbox", tmp: common.spool + "/tmp", criteria: criteria, dryRun: dryRun)
        } catch {
            throw fail("\(error)")
        }
        var removed = 0, failed = 0
        _ = sweep.step(limit: Int.max) { event in
            switch event {
            case .removed(let entry):
                removed += 1
                let finished = TimeText.local(entry.finishedAt)
                // A folder renamed by hand is named with the job it holds.
                let job = entry.name == entry.job ? "" : "job \(entry.job), "
                print("\(dryRun ? "would remove" : "removed") \(entry.name) (\(job)\(entry.status), finished \(finished))")
            case .failed(_, let problem):
                failed += 1
                FileHandle.standardError.write(Data("opqueuectl: \(problem)\n".utf8))
            case .unreadable(let problem):
                FileHandle.standardError.write(Data("opqueuectl: \(problem); left alone\n".utf8))
            }
        }
        print("\(dryRun ? "would remove" : "removed") \(removed) ended job folder\(removed == 1 ? "" : "s")"
            + (failed > 0 ? "; \(failed) could not be removed" : ""))
        if failed > 0 { throw ExitCode(1) }
    }
}
