// `jobFinished` (SPEC §6): a configured command run once per ended job, after its outbox entry is
// published, with ${job}, ${status} and ${outbox}.
//
// At least once: before a publication's first commit a marker active/.hooks/<job> (holding the status)
// is written, so it is durable before the outbox rename; it is removed when the hook has ended. At start,
// a marker whose job is in the outbox runs the hook (a crash came between publication and hook); one
// whose job is still in active/ waits for that job's publication; any other is stale and removed.
// Hooks run like commands (ChildProcess: no thread waits) and never hold up publication; their
// standard output is dropped, standard error kept for the failure message, which is logged with OPQ_JOB.
// Their working directory is the spool's tmp/. At most `maxRunning` run at once; the others wait their turn in
// order (their markers already durable): a slow hook and a flood of ended jobs must not fork without bound.

import DequeModule
import Foundation
import JobModel
import OperationKinds
import SpoolFiles
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

final class JobHooks: @unchecked Sendable {
    /// Hooks running at once, at most.
    static let maxRunning = 8

    let folder: String
    let folders: SpoolFolders
    /// Logs a hook's failure for a job: (job, message).
    let report: @Sendable (String, String) -> Void
    /// Hooks running, and those waiting for one of them to end.
    private let turns = Mutex<(running: Int, waiting: Deque<Due>)>((0, []))

    private struct Due {
        let spec: CommandSpec
        let job: String
        let status: String
        let entry: String?
    }

    init(folders: SpoolFolders, report: @escaping @Sendable (String, String) -> Void) {
        self.folders = folders
        folder = folders.active + "/.hooks"
        self.report = report
        mkdir(folder, 0o755)
    }

    /// Records that the hook is due for `job` (durable with the spool's next commit, once the caller hands the
    /// returned path to it).
    func markDue(job: String, status: String) throws -> String {
        try writeFile(Data(status.utf8), to: folder + "/" + job)
        return folder + "/" + job
    }

    /// Runs the hook for a published job (`entry`: the path of its outbox entry — under sharedOutbox when set, named
    /// <job>.N when outbox/<job> was taken; nil: outbox/<job>); the marker goes once it has ended.
    func run(_ spec: CommandSpec, job: String, status: String, entry: String? = nil) {
        let due = Due(spec: spec, job: job, status: status, entry: entry)
        let now = turns.withLock { t -> Bool in
            guard t.running < Self.maxRunning else {
                t.waiting.append(due)
                return false
            }
            t.running += 1
            return true
        }
        if now { start(due) }
    }

    /// A hook has ended: the next waiting one takes its turn.
    private func ended() {
        let next = turns.withLock { t -> Due? in
            guard let next = t.waiting.popFirst() else {
                t.running -= 1
                return nil
            }
            return next
        }
        if let next { start(next) }
    }

    private func start(_ due: Due) {
        let (spec, job, status, entry) = (due.spec, due.job, due.status, due.entry)
        let marker = folder + "/" + job
        let argv = spec.expand(["job": job, "status": status, "outbox": CommandOperation.absolute(entry ?? folders.outbox + "/" + job)])
        let timer = TimerBox()
        let started = ChildProcess.start(argv: argv, environment: spec.environment, directory: folders.tmp, stdoutFile: -1, stderrFile: -1,
                                         limit: 0) { [report, self] exit in
            timer.cancel()
            // Killed by the daemon's stop: its marker stays, and it runs again at the next start.
            if exit.killedByStop { return }
            unlink(marker)
            defer { ended() }
            if exit.signal != nil {
                report(job, "the jobFinished command '\(spec.name)' was killed by \(exit.signalName)"
                            + (exit.lastStderrLine.isEmpty ? "" : ": \(exit.lastStderrLine)"))
            } else if let status = exit.status, status != 0 {
                report(job, "the jobFinished command '\(spec.name)' failed: exit status \(status)"
                            + (exit.lastStderrLine.isEmpty ? "" : ": \(exit.lastStderrLine)"))
            }
        }
        switch started {
        case .success(let child):
            timer.set(OneShotTimer(after: spec.timeoutSeconds) { child.terminate() })
        case .failure(let failure):
            unlink(marker)
            report(job, "the jobFinished command '\(spec.name)' did not start: \(failure.description)")
            ended()
        }
    }

    /// At start: hooks due for jobs published before a crash run now (the entry found in `outbox`: the spool's, or
    /// sharedOutbox); stale markers go.
    func recover(_ spec: CommandSpec?, outbox: String) {
        for job in ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).sorted() {
            let marker = folder + "/" + job
            if access(folders.active + "/" + job, F_OK) == 0 { continue } // published again later, hook then
            guard let spec, let entry = Spool.entry(of: job, in: outbox),
                  case .success(let data) = readRegularFile(marker, limit: 64) else {
                unlink(marker)
                continue
            }
            run(spec, job: job, status: String(decoding: data, as: UTF8.self), entry: entry)
        }
    }
}

/// A timer set after the closure that cancels it was made.
private final class TimerBox: @unchecked Sendable {
    private let lock = NSLock()
    private var timer: OneShotTimer?
    private var cancelled = false
    func set(_ t: OneShotTimer) {
        lock.lock()
        defer { lock.unlock() }
        if cancelled { t.cancel() } else { timer = t }
    }
    func cancel() {
        lock.lock()
        defer { lock.unlock() }
        cancelled = true
        timer?.cancel()
        timer = nil
    }
}
