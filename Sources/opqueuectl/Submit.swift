// opqueuectl validate and submit: manifests read from files or standard input, checked as the daemon will check
// them, then placed atomically in the inbox (a hidden name, synced, renamed).

import ControlPlane
import ArgumentParser
import CShims
import Daemon
import Foundation
import JobModel
import PropertyList
import SpoolFiles
import SystemCalls

struct Validate: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Exit 0 if every manifest is valid; else print every problem.",
        discussion: """
            Checked as submit checks them: queues and commands against --config (else the built-ins) and, when the \
            daemon answers, against what it takes: its own, and on a cluster node those any node of the cluster declares; \
            file:// URLs against its download.fileRoots too.
            """)
    @OptionGroup var common: Common
    @Argument(help: "Manifest files (- reads one from standard input).", completion: .file(extensions: ["plist"])) var files: [String]

    func run() throws {
        let config = try common.submissionConfiguration()
        let valid = files.map { validManifest(at: $0, config) != nil }
        if valid.contains(false) { throw ExitCode(1) }
    }
}

/// The bytes of a manifest named on the command line: `-` is standard input (read once: a second `-` finds it
/// taken); a regular file, a pipe or a device (`<(generate)`, /dev/stdin) is read; a folder is not. Reading stops
/// once past the manifest limit, so that /dev/zero ends as a manifest too large, not as a full memory.
func readManifestArgument(_ file: String) -> Result<Data, ManifestArgumentError> {
    var fd: Int32 = 0
    if file == "-" {
        if standardInputRead { return .failure(.init("standard input was read already (- may be named once)")) }
        standardInputRead = true
    } else {
        var st = stat()
        guard stat(file, &st) == 0 else { return .failure(.init(String(cString: strerror(errno)))) }
        if (st.st_mode & S_IFMT) == S_IFDIR { return .failure(.init("a directory, not a manifest file")) }
        fd = open(file, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return .failure(.init(String(cString: strerror(errno)))) }
    }
    defer { if fd != 0 { close(fd) } }
    return readBounded(fd, limit: ManifestLimits.maxBytes + 1).mapError { .init($0.description) }
}

/// Whether a `-` argument took standard input (opqueuectl reads its arguments on one thread).
nonisolated(unsafe) private var standardInputRead = false

/// Why a manifest named on the command line could not be read.
struct ManifestArgumentError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Reads and validates a manifest: the manifest in `file` (`-`: standard input) if it is valid; else nil, each
/// problem (`FILE: problem`) said through `report` (validate's output is its problems; submit's is the job ids, its
/// problems go to stderr).
func validManifest(at file: String, _ config: Configuration, report: (String) -> Void = { print($0) }) -> Data? {
    let data: Data
    switch readManifestArgument(file) {
    case .success(let read): data = read
    case .failure(let error):
        report("\(file): cannot be read: \(error)")
        return nil
    }
    if case .failure(let problems) = Manifest.parse(data, configuration: config) {
        for problem in problems.problems { report("\(file): \(problem)") }
        return nil
    }
    return data
}

struct Submit: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Validate, then place manifests atomically in the inbox; prints each job id.",
        discussion: """
            Queues and commands are checked against --config (else the built-ins) and, when the daemon answers, \
            against what it takes: its own, and on a cluster node those any node of the cluster declares; file:// URLs \
            against its download.fileRoots too.

            The id printed is the one the job gets: a manifest's job, else the one its file's name gives. When the \
            id asked for (by job, or by the file's name) is taken here (in active/ or outbox/), or on a cluster node \
            (where any node may hold it), the daemon gives another (job.1, ...): submit then waits, at most 10 s, for the daemon to take \
            the file and prints the id it gave, else the id asked for with a word on stderr.
            """)
    @OptionGroup var common: Common
    @Option(name: .customLong("at"), help: ArgumentHelp("The job waits until TIME (sets notBefore): \(TimeText.forms).", valueName: "TIME"))
    var at: String?
    @Option(name: .customLong("in"), parsing: .unconditional,
            help: ArgumentHelp("The job waits SECONDS from now (sets notBefore).", valueName: "SECONDS"))
    var delay: Double?
    @Option(name: .customLong("if-exists"),
            help: ArgumentHelp("rename (a taken id gets .1, .2 and so on) or skip (no job when the id is held).", valueName: "rename|skip"))
    var ifExists: String?
    @Argument(help: "Manifest files (- reads one from standard input).", completion: .file(extensions: ["plist"])) var files: [String]

    func validate() throws {
        if at != nil && delay != nil { throw ValidationError("give --at or --in, not both") }
        if let at, TimeText.parse(at) == nil { throw ValidationError("--at '\(at)': not a time; the forms are \(TimeText.forms)") }
        if let at, let time = TimeText.parse(at), !(time >= 0 && time < Manifest.notBeforeLimit) {
            throw ValidationError("--at '\(at)': must be from 1970 to 5138 (0 to 1e11 seconds since the epoch)")
        }
        if let delay, !(delay >= 0 && delay < Manifest.delayLimit) {
            throw ValidationError("--in: must be 0 or more and under 1e10 seconds, not \(delay)")
        }
        if let ifExists, ifExists != "rename" && ifExists != "skip" { throw ValidationError("--if-exists: must be 'rename' or 'skip'") }
    }

    /// The manifest with what --at, --in and --if-exists set (SPEC §3.7); unchanged without them.
    func flowControlled(_ data: Data) -> Data {
        let notBefore = at.flatMap(TimeText.parse) ?? delay.map { Date().timeIntervalSince1970 + $0 }
        guard notBefore != nil || ifExists != nil, var top = ManifestTree(data).dictionary else { return data }
        if let notBefore {
            top["notBefore"] = .real(notBefore)
            top["delaySeconds"] = nil
        }
        if let ifExists { top["ifJobExists"] = .string(ifExists) }
        return Data(PlistXMLWriter.document(.dictionary(top)))
    }

    func run() throws {
        let (config, cluster) = try common.submissionContext()
        var ok = true
        for file in files {
            // Stdout holds the job ids only (`ids=$(opqueuectl submit *.plist)`): a manifest's problems go to stderr.
            guard let read = validManifest(at: file, config, report: { FileHandle.standardError.write(Data("\($0)\n".utf8)) }) else {
                ok = false
                continue
            }
            let data = flowControlled(read)
            let requested = Manifest.requestedJob(in: data)
            do {
                // Standard input has no name: a manifest read from it without `job` is placed as stdin.plist.
                let name = file == "-" ? "stdin" : ((file as NSString).lastPathComponent as NSString).deletingPathExtension
                let stem = requested ?? jobID(ofManifestFile: name)
                // Taken here (asked for by the manifest, or given by its file's name), its id will be another (`job.1`,
                // …); on a cluster node any id may be taken on another node. Then the daemon says which it gave, once
                // it has taken the file.
                let taken = common.heldHere(stem)
                let placed = try common.place(data, requested: requested, stem: stem)
                guard let cluster, cluster || taken else {
                    print(placed.id)
                    continue
                }
                print(common.given(placed))
            } catch let exit as ExitCode {
                throw exit
            } catch {
                throw fail("\(file): \(error)")
            }
        }
        if !ok { throw ExitCode(1) }
    }
}

/// A manifest placed in the inbox: the id it asks for (its `job`, else the one its file name gives), its name there
/// and its inode (which file it was, for the daemon's `submitted`).
struct Placed {
    let id: String
    let name: String
    let inode: UInt64?
}

extension Common {
    /// Writes the manifest hidden in the inbox, synced, then renames it to `STEM.plist` — or, when that name is taken
    /// in the inbox (never replaced), to `STEM.XXXXXXXX.plist` — and syncs the inbox. Returns the job's id as asked:
    /// its `job`, else the one its file name gives. When that id is held, the daemon gives the next of `ID.1`, `ID.2`,
    /// … (SPEC §2), as it does to a file dropped by hand.
    func place(_ data: Data, requested: String?, stem: String) throws -> Placed {
        let inbox = spool + "/inbox"
        let unique = UUID().uuidString.prefix(8)
        let hidden = ".\(stem).\(unique).plist"
        do {
            try writeDurably(data, to: inbox + "/" + hidden, syncFolder: false)
        } catch {
            // A full or failing file system leaves no hidden half-file behind in the inbox.
            unlink(inbox + "/" + hidden)
            throw error
        }
        var st = stat()
        let inode = stat(inbox + "/" + hidden, &st) == 0 ? UInt64(st.st_ino) : nil
        let folder = open(inbox, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard folder >= 0 else { throw fail("cannot open \(inbox): \(String(cString: strerror(errno)))") }
        defer { close(folder) }
        for name in ["\(stem).plist", "\(stem).\(unique).plist"] {
            let id = requested ?? jobID(ofManifestFile: name)
            let renamed = opq_rename_noreplace(folder, hidden, name)
            if renamed == -EEXIST { continue }
            guard renamed == 0 else {
                unlinkat(folder, hidden, 0)
                throw fail("cannot rename into \(inbox): \(String(cString: strerror(-renamed)))")
            }
            // The rename is durable before the id is printed: a crash never leaves the manifest hidden, unclaimed.
            guard fsync(folder) == 0 else { throw fail("fsync \(inbox): \(String(cString: strerror(errno)))") }
            return Placed(id: id, name: name, inode: inode)
        }
        unlinkat(folder, hidden, 0)
        throw fail("no free name in \(inbox) for \(stem)")
    }

    /// Whether this spool holds a job of that id (in active/ or outbox/): the daemon gives a manifest asking for it
    /// another (SPEC §2).
    func heldHere(_ id: String) -> Bool {
        access(spool + "/active/" + id, F_OK) == 0 || access(spool + "/outbox/" + id, F_OK) == 0
    }

    /// The id the running daemon gave the manifest placed as inbox/`placed.name`, once it has taken it (at most
    /// 10 s: a daemon whose claiming is paused, or a cluster node whose database is away, may take longer); else the
    /// id it asks for (or `guess`, the one this spool's active/ and outbox/ give it now), said to be a guess.
    func given(_ placed: Placed, guess: String? = nil) -> String {
        let request = ControlRequest.submitted(manifest: placed.name, inode: placed.inode)
        let deadline = monotonicSeconds() + 10
        var pause = 0.002
        while monotonicSeconds() < deadline {
            guard case .success(let answer)? = try? ControlClient.request(socket, request, as: SubmittedAnswer.self, timeout: 2) else {
                break
            }
            if let job = answer.job { return job }
            Thread.sleep(forTimeInterval: pause)
            pause = min(pause * 2, 0.05)
        }
        FileHandle.standardError.write(Data("""
            opqueuectl: inbox/\(placed.name) is not taken by the daemon yet: \
            its job id is printed as \(guess == nil ? "it asks for it" : "this spool gives it now"), '\(guess ?? placed.id)'; \
            the daemon gives it another if that is taken when it takes the file (its result.plist says which)\n
            """.utf8))
        return guess ?? placed.id
    }
}
