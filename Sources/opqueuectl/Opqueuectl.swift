// opqueuectl — the command-line tool for users and operators (SPEC §1).
//
// submit and validate work on files; wait, show and graph read the outbox; list, retry and clean work on the outbox
// whether or not the daemon runs; status, show (running jobs), cancel, suspend and resume talk to the daemon over
// <spool>/opqueued.sock.
// Exit statuses: 0 success; 1 invalid input, unknown job/operation/queue, ended job, unsuccessful job;
// 2 wait timed out; 3 no daemon; 64 usage error.
//
// This file holds the root command and what every command shares (`Common`, `fail`); each command has a file of
// its own (Submit.swift: submit and validate; Control.swift: cancel, suspend, resume, metrics; List.swift, Retry.swift,
// Clean.swift: the outbox's), completions are in Completion.swift.

import ControlPlane
import ArgumentParser
import CShims
import Daemon
import Foundation
import JobModel

struct Common: ParsableArguments {
    @Option(help: ArgumentHelp("The spool root.", valueName: "dir"), completion: .directory)
    var spool = "./spool"

    @Option(help: ArgumentHelp("The configuration property list (queues for validate).", valueName: "file"),
            completion: .file(extensions: ["plist"]))
    var config: String?

    var socket: String { spool + "/opqueued.sock" }

    func configuration() throws -> Configuration {
        do {
            return try config.map { try Configuration.load(path: $0) } ?? .builtIn
        } catch {
            FileHandle.standardError.write(Data("\(error)\n".utf8))
            throw ExitCode(1)
        }
    }

    /// What a manifest is checked against, by submit and validate alike, as the daemon will check it: besides --config
    /// (or the built-ins), the queues and commands the running daemon takes — its own, and on a cluster node those any
    /// node declares (SPEC §8: a queue only another node has is no typo) — and its download.fileRoots (an older daemon
    /// does not say them: then --config's alone). Without a daemon answering, --config alone.
    func submissionConfiguration() throws -> Configuration { try submissionContext().configuration }

    /// What a manifest is checked against (see `submissionConfiguration`), and what the daemon is: nil when none
    /// answers, else whether it is a cluster node.
    func submissionContext() throws -> (configuration: Configuration, cluster: Bool?) {
        let config = try configuration()
        guard case .success(let answer)? = try? ControlClient.request(socket, .declared, as: DeclaredAnswer.self, timeout: 2) else {
            return (config, nil)
        }
        let signatures = answer.commands
        var widened = config.widened(queues: Set(answer.queues), commands: Set(signatures.keys), signatures: signatures)
        for root in answer.fileRoots ?? [] where !widened.fileRoots.contains(root) { widened.fileRoots.append(root) }
        return (widened, answer.cluster)
    }

    /// Sends a request to the daemon and returns its answer; exits 3 when there is none, and with the answer's
    /// `exit` (its `error` on stderr) when that is not 0.
    func request<Answer: Decodable>(_ request: ControlRequest, as type: Answer.Type) throws -> Answer {
        let result: Result<Answer, ExitAnswer>
        do {
            result = try ControlClient.request(socket, request, as: type)
        } catch let error as ControlClient.Unreadable {
            throw fail("\(error)")
        } catch {
            FileHandle.standardError.write(Data("opqueuectl: \(error)\n".utf8))
            throw ExitCode(3)
        }
        switch result {
        case .success(let answer): return answer
        case .failure(let refusal): throw fail(refusal.description, Int32(clamping: refusal.exit))
        }
    }

    /// A request whose answer says nothing but that it was done (cancel, suspend, resume).
    func request(_ request: ControlRequest) throws { _ = try self.request(request, as: ExitAnswer.self) }
}

func fail(_ message: String, _ code: Int32 = 1) -> ExitCode {
    FileHandle.standardError.write(Data("opqueuectl: \(message)\n".utf8))
    return ExitCode(code)
}

@main
struct Opqueuectl: ParsableCommand {
    /// Run with standard output closed (`opqueuectl status >&-`), the control socket would take descriptor 1 and
    /// the answer be written back into it: /dev/null first takes any closed one of 0, 1 and 2.
    static func main() {
        Daemon.openStandardDescriptors()
        main(nil)
    }

    static let configuration = CommandConfiguration(
        commandName: "opqueuectl",
        abstract: "Submits, inspects and controls opqueued jobs.",
        discussion: """
            opqueuectl works on the spool of an opqueued daemon (see opqueued(8)): submit and validate read manifest \
            files (see opqueued.plist(5)); wait, show and graph read the outbox; list, retry and clean work on the \
            outbox whether or not the daemon runs (retry places an ended job's manifest in the inbox again, clean \
            removes old jobs' folders); status, show (for running jobs; \
            on a cluster node, for every job the cluster knows), cancel, suspend, resume and metrics talk to the \
            daemon through the Unix socket SPOOL/opqueued.sock, and exit 3 when no daemon answers there. --spool \
            and --config come before the command.

            Exit statuses: 0 success; 1 invalid input, an unknown job, operation or queue, cancelling a job that \
            has already ended, retrying one that has not, an unknown status (list, clean), or (wait) a job that did \
            not succeed; 2 wait timed out; 3 no daemon; 64 usage error.

            Files: SPOOL/inbox/ (manifests are placed there under a hidden name, then renamed), \
            SPOOL/outbox/JOB/result.plist (what wait, show, graph and list read), SPOOL/outbox/JOB/manifest.plist \
            (what retry submits again), SPOOL/tmp/ (where clean moves a folder to remove it), SPOOL/opqueued.sock. \
            A job is its result's job, whatever its folder's name: an outbox folder renamed by hand (mv outbox/J \
            outbox/J.keep) is listed as J, and wait, show, graph and retry find it as J when no folder is named J \
            (two such folders exit 1, naming both); the name J is then free: a new job may take it, and outbox/J \
            answers for J once it ends.
            """,
        subcommands: [Submit.self, Validate.self, Status.self, Show.self, Wait.self, Cancel.self, Suspend.self, Resume.self,
                      Graph.self, Metrics.self, List.self, Retry.self, Clean.self])

    /// `--spool` and `--config` come before the command; each command sees them through its own group.
    @OptionGroup var common: Common

    // Usage errors exit with ArgumentParser's validationFailure, which is 64 (EX_USAGE), as the contract asks.

    /// No command is a usage error too (`--help` alone is not: it is answered before this runs).
    func run() throws {
        FileHandle.standardError.write(Data((Self.helpMessage() + "\n").utf8))
        throw ExitCode.validationFailure
    }
}
