// opqueuectl wait: polls the outbox (and the daemon, for a cluster's jobs) until the job has ended.

import ControlPlane
import ArgumentParser
import Daemon
import Foundation
import JobModel

struct Wait: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Waits for the job's outbox entry: 0 succeeded, 1 not, 2 timeout.",
        discussion: """
            An id not seen yet is waited for (its manifest may be dropped later). On a terminal, and at a timeout, \
            wait says why such a job is not seen: its manifest waits in the inbox to be claimed, the daemon knows no \
            job of that id (a job's id is its manifest's job key, else its file's name without .plist, each character \
            outside A-Z a-z 0-9 . _ - made _), or no daemon answers; given a manifest's file name, it says the id such \
            a file gets. An outbox entry whose result.plist cannot be read ends the wait with 1 and a message naming \
            the file and what is wrong with it.
            """)
    @OptionGroup var common: Common
    @Argument(help: "A job id.", completion: .custom(completeJobs)) var job: String
    // `.unconditional`: `--timeout -5` is a value to refuse, not a missing one.
    @Option(parsing: .unconditional, help: "Give up after this many seconds (exit 2).") var timeout: Double?

    func validate() throws {
        if let timeout, !(timeout.isFinite && timeout >= 0) {
            throw ValidationError("--timeout must be 0 or more seconds, not \(timeout) (without it, wait waits for ever)")
        }
    }

    func run() throws {
        // An id no job can have is never seen: waiting for it (for ever, without --timeout) helps no one.
        guard isValidIdentifier(job) else {
            throw fail("'\(job)' cannot be a job's id: an id is 1 to 128 of A-Z a-z 0-9 . _ -, not starting with '.' "
                + "(a manifest's `job`, else its file's name)\(fileHint)")
        }
        let deadline = timeout.map { Date().addingTimeInterval($0) }
        let tty = isatty(STDERR_FILENO) == 1
        var spinner = 0
        var polls = 0
        // What the daemon last said of the job (the loop asks every half second), for the message at the deadline:
        // asking again then could take the daemon's answer time past it.
        var lastLook: Look?
        while true {
            // A folder renamed from the job's own name is looked for once: a job that ends meanwhile is placed
            // under its own names, which each poll looks at.
            if let entry = try endedEntry(of: job, common, search: polls == 0) {
                let status = entry.status
                if tty { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
                print("\(job): \(status)")
                if status != "succeeded" { throw ExitCode(1) }
                return
            }
            // In a cluster (SPEC §8) the job may end on another node: the daemon answers for it from the database
            // (never waited for past the deadline).
            polls += 1
            if polls % 10 == 1 {
                switch (look(timeout: within(2, deadline)), lastLook) {
                case (.ended(let answer), _):
                    if tty { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
                    print("\(job): \(answer.status)\(answer.node.map { " (on \($0))" } ?? "")")
                    if answer.status != "succeeded" { throw ExitCode(1) }
                    return
                case (.silent, _?):
                    break  // an answer that did not come in the time left does not hide what the daemon said before
                case (let fresh, _):
                    lastLook = fresh
                }
            }
            if let deadline, Date() >= deadline {
                if tty { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
                let why: String
                switch lastLook ?? look(timeout: 1) {
                case .unseen(let reason), .unknowable(let reason?), .silent(let reason): why = " (\(reason))"
                case .running, .ended, .unknowable(nil): why = ""
                }
                throw fail("\(job): still not ended after \(timeout ?? 0) s\(why)\(fileHint)", 2)
            }
            if tty { progress(&spinner) }
            usleep(50_000)
        }
    }

    /// For an argument that looks like a manifest's file name (`photo 1.plist`, `inbox/hello.plist`): the id such a
    /// file gets when its manifest has no `job` key (the daemon's rule: the name without `.plist`, each character
    /// outside A-Z a-z 0-9 . _ - made `_`), as a hint; "" when that is the argument itself or no id.
    var fileHint: String {
        // A path is a file's only when it names a manifest; a hidden name is never claimed.
        if job.contains("/") && !job.hasSuffix(".plist") { return "" }
        var name = job.split(separator: "/", omittingEmptySubsequences: false).last.map(String.init) ?? job
        if !name.hasSuffix(".plist") { name += ".plist" }
        guard name != ".plist", !name.hasPrefix(".") else { return "" }
        let id = jobID(ofManifestFile: name)
        guard isValidIdentifier(id), id != job else { return "" }
        return "; a manifest file \(name) without `job` gets the id '\(id)'"
    }

    /// What the daemon says of a job not in the outbox yet.
    enum Look {
        /// It knows the job: its operations (on another node of a cluster, as that node's last heartbeat sent them:
        /// the progress bar counts those ended there).
        case running([ShowAnswer.Operation])
        /// It ended on another node of a cluster: the daemon's answer (`status`, `node`).
        case ended(ShowAnswer)
        /// Not seen: why, as far as can be told from here (a typo in the id waits as long as a job not yet dropped).
        case unseen(String)
        /// The daemon answered something else (a cluster that cannot be asked now: what it said).
        case unknowable(String?)
        /// The daemon did not answer in time.
        case silent(String)
    }

    /// At most `seconds`, and no later than `deadline` (a tenth of a second at least).
    func within(_ seconds: Double, _ deadline: Date?) -> Double {
        deadline.map { max(0.1, min(seconds, $0.timeIntervalSinceNow)) } ?? seconds
    }

    func look(timeout: Double) -> Look {
        let result: Result<ShowAnswer, ExitAnswer>
        do {
            result = try ControlClient.request(common.socket, .show(job: job), as: ShowAnswer.self, timeout: timeout)
        } catch let error as ControlClient.NoDaemon where error.silent {
            return .silent("the daemon at \(common.socket) did not answer within \(String(format: "%.1f", timeout)) s")
        } catch {
            return .unseen("no daemon answers at \(common.socket)")
        }
        switch result {
        case .success(let answer):
            if ["succeeded", "failed", "cancelled", "rejected"].contains(answer.status) { return .ended(answer) }
            return .running(answer.operations)
        case .failure(let refusal) where refusal.exit == 1:
            if FileManager.default.fileExists(atPath: common.spool + "/inbox/" + job + ".plist") {
                return .unseen("not seen yet: inbox/\(job).plist waits to be claimed")
            }
            return .unseen("not seen yet: the daemon knows no job '\(job)'; a job's id is its manifest's `job`, else its file's name")
        case .failure(let refusal): return .unknowable(refusal.error)
        }
    }

    private func progress(_ spinner: inout Int) {
        spinner += 1
        guard spinner % 4 == 0 else { return }
        let line: String
        switch look(timeout: 1) {
        case .running(let ops) where !ops.isEmpty:
            let done = ops.filter(\.hasEnded).count
            let width = 30
            let filled = width * done / ops.count
            line = "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
                + "] \(done)/\(ops.count) \(job)"
        case .unseen(let reason): line = "\(job): \(reason)"
        default: return
        }
        FileHandle.standardError.write(Data("\r\u{1B}[K\(line)".utf8))
    }
}
