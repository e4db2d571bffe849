// `kind = command` (SPEC §3.6): one attempt of a configured command as an asynchronous operation. It
// holds its queue's slot and no thread: the body spawns and returns; the exit arrives on ChildProcess's
// queue and finishes the attempt.
//
// Files, in the job's folder active/<job>/ (the future outbox entry):
//   .work/<n>/             an attempt's scratch and working directory (${workdir}): empty when the attempt
//                          starts; after it, kept for a later attempt of the job when the command left it
//                          empty, else removed (ScratchFolders, below); .work/ goes before publication
//                          (never published)
//   .work/<n>/input, output   ${input} (the input's bytes; an image is encoded to
//                          PNG), ${output}
//   logs/<operation>.stdout, .stderr  the command's streams, each cut at maxOutputBytes (published)
//   .outputs/<operation>   an `output = file` result kept after success, so a restart need not run the
//                          command again (removed before publication)
// QoS: the body runs on a worker thread of the operation's effective QoS (the engine applies nice,
// SCHED_IDLE and the idle I/O class per thread), and posix_spawn's child inherits them from that thread.
//
// What it trusts: nothing the command produces: exit statuses are interpreted, outputs bounded.

import Foundation
import JobModel
import OperationEngine
import SpoolFiles
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

package enum CommandOperation {
    /// Where attempts are concluded: off the command loop's thread (reading the output, writing the kept
    /// copy and removing the scratch are file I/O), and one thread only (a global queue grows threads
    /// while they block on the file system). An attempt with no output whose scratch folder is empty skips it.
    static let conclusions = DispatchQueue(label: "opqueued.commands.conclude")

    package static func workFolder(_ jobFolder: String) -> String { jobFolder + "/.work" }
    /// `path` made absolute against the daemon's working directory: a command runs in its own working
    /// directory, so the paths placed in its argv (${workdir}, ${input}, ${output}, ${outbox}) must not be
    /// relative to the daemon's (`--spool ./spool`, as `make run` gives).
    package static func absolute(_ path: String) -> String {
        path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
    }
    static func keptFolder(_ jobFolder: String) -> String { jobFolder + "/.outputs" }
    /// Before publication: what the job's commands left that is not part of the outbox entry.
    package static func removeScratch(_ jobFolder: String) {
        ScratchFolders.forget(absolute(jobFolder))
        removeTree(workFolder(jobFolder))
        removeTree(keptFolder(jobFolder))
    }

    package static func logPaths(_ operation: String) -> [String] { logNames(operation).map { "logs/" + $0 } }
    /// Standard output's and standard error's files in logs/.
    static func logNames(_ operation: String) -> [String] { ["\(operation).stdout", "\(operation).stderr"] }

    /// The job's logs/ folder, made by its first command, opened without following a link: a link or a file planted
    /// there is refused (ELOOP, ENOTDIR), never written through.
    static func openLogsFolder(_ path: String) throws -> Int32 {
        var fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        if fd < 0, errno == ENOENT, ScratchFolders.makeFolder(path) == 0 {
            fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        }
        guard fd >= 0 else { throw SpoolError(operation: "open the command logs' folder", path: path, errno: errno) }
        return fd
    }

    static func body(_ spec: CommandSpec, arguments: [String: String], environment: KindEnvironment) -> OperationBody {
        .async { context in
            do {
                try start(spec, arguments: arguments, environment: environment, context: context)
            } catch {
                context.finish(.failure(error))
            }
        }
    }

    private static func start(_ spec: CommandSpec, arguments: [String: String], environment: KindEnvironment,
                              context: OperationContext) throws {
        let folder = absolute(environment.jobFolder)
        let operation = context.name
        // A folder of its own per attempt: an attempt that timed out may still be in its grace (SIGTERM ignored)
        // when the next one starts, and its end must not remove the next one's scratch.
        let work = try ScratchFolders.make(jobFolder: folder)
        var values = arguments
        values["job"] = (folder as NSString).lastPathComponent
        values["operation"] = operation
        values["attempt"] = String(context.attempt)
        values["workdir"] = work
        values["output"] = work + "/output"
        if spec.placeholders.contains("input") {
            let input = work + "/input"
            let check: CancellationCheck = { if context.isCancelled { throw OperationCancelled() } }
            switch context.input {
            // A copy, not the file itself: the command may change its input, and a download's file is the job's record.
            case let file as DownloadedFile: try writeFile(to: input) { fd, path in try Kinds.copy(file, into: fd, path: path) }
            case let bytes as Data: try writeFile(bytes, to: input)
            case let image as Image: try writeFile(Codecs.encode(image, format: "png", quality: 90), to: input)
            case let chain as ImagePipeline:
                try writeFile(to: input) { fd, _ in
                    try chain.encode(to: fd, format: "png", quality: 90, maxPixels: environment.maxPixels, check: check)
                }
            default: throw FinalFailure("command '\(spec.name)' uses ${input} but the operation has no input (a dependency with an output)")
            }
            values["input"] = work + "/input"
        }
        let logs = logPaths(operation).map { folder + "/" + $0 }
        let logsFolder = try openLogsFolder(folder + "/logs")
        defer { close(logsFolder) }
        var files: [Int32] = []
        for (path, name) in zip(logs, logNames(operation)) {
            let fd = openat(logsFolder, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o644)
            guard fd >= 0 else {
                let e = errno
                for f in files { close(f) }
                throw SpoolError(operation: "create", path: path, errno: e)
            }
            files.append(fd)
        }
        if context.isCancelled { for f in files { close(f) }; throw OperationCancelled() }
        let started = ChildProcess.start(
            argv: spec.expand(values), environment: spec.environment, directory: work, stdoutFile: files[0], stderrFile: files[1],
            limit: spec.maxOutputBytes
        ) { exit in
            for f in files { close(f) }
            // Killed by the daemon's stop: not this attempt's outcome. It stays unfinished, and the job in active/,
            // to run again at the next start.
            if exit.killedByStop { return }
            let concluded: @Sendable (Bool) -> Void = { empty in
                context.finish(Result {
                    try conclude(spec, exit: exit, operation: operation, folder: folder, work: work, logs: logs, empty: empty)
                })
            }
            // Without an output to read and with nothing left in the scratch folder (the usual command), the attempt
            // ends here on the loop's thread: no file to read, no tree to remove, no hop to another thread.
            if spec.output == .none, ScratchFolders.isEmptyFolder(work) { concluded(true) } else { conclusions.async { concluded(false) } }
        }
        switch started {
        case .success(let child): context.onCancel { child.terminate() }
        case .failure(let failure):
            for f in files { close(f) }
            ScratchFolders.release(work, jobFolder: folder)
            throw FinalFailure(failure.description)
        }
    }

    /// The attempt's result from how the command ended.
    /// `empty`: the scratch folder was seen empty after the exit.
    private static func conclude(_ spec: CommandSpec, exit: ChildExit, operation: String, folder: String, work: String,
                                 logs: [String], empty: Bool) throws -> OperationOutput? {
        defer { ScratchFolders.release(work, jobFolder: folder, empty: empty) }
        var notes: [String] = []
        if exit.stdoutTruncated { notes.append("standard output cut at \(spec.maxOutputBytes) of \(exit.stdoutBytes) bytes") }
        if exit.stderrTruncated { notes.append("standard error cut at \(spec.maxOutputBytes) of \(exit.stderrBytes) bytes") }
        let noted = notes.isEmpty ? "" : " (" + notes.joined(separator: "; ") + ")"
        if exit.signal != nil {
            throw FinalFailure("killed by \(exit.signalName)" + (exit.lastStderrLine.isEmpty ? "" : ": \(exit.lastStderrLine)") + noted)
        }
        let status = exit.status ?? -1
        if status != 0 {
            let message = "exit status \(status)" + (exit.lastStderrLine.isEmpty ? "" : ": \(exit.lastStderrLine)") + noted
            if spec.tempFailExitCodes.contains(status) { throw KindFailure(description: message) }
            throw FinalFailure(message)
        }
        switch spec.output {
        case .none:
            return nil
        case .stdout:
            // A cut output is not the command's output: passing it on would hand dependents a truncated file.
            if exit.stdoutTruncated {
                throw FinalFailure("the standard output is \(exit.stdoutBytes) bytes, more than maxOutputBytes (\(spec.maxOutputBytes))")
            }
            return try readRegularFile(logs[0], limit: spec.maxOutputBytes + 1).get()
        case .file:
            let produced = work + "/output"
            var st = stat()
            guard lstat(produced, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else {
                throw FinalFailure("command '\(spec.name)' exited 0 but wrote no regular file at ${output}")
            }
            guard Int(st.st_size) <= spec.maxOutputBytes else {
                throw FinalFailure("the output file is \(st.st_size) bytes, more than maxOutputBytes (\(spec.maxOutputBytes))")
            }
            let data = try readRegularFile(produced, limit: spec.maxOutputBytes + 1).get()
            // Kept for a restart (the success is recorded after this returns).
            let kept = keptFolder(folder)
            if mkdir(kept, 0o755) != 0 && errno != EEXIST { throw SpoolError(operation: "mkdir", path: kept, errno: errno) }
            try writeDurably(data, to: kept + "/" + operation, syncFolder: false)
            return data
        }
    }

    /// What a command that succeeded before a restart hands its dependents, without running again.
    package static func recovered(_ spec: CommandSpec, operation: String, folder: String) -> OperationBody {
        switch spec.output {
        case .none: .sync { _ in nil }
        case .stdout:
            .sync { _ in try readRegularFile(folder + "/" + logPaths(operation)[0], limit: Int.max).get() }
        case .file:
            .sync { _ in try readRegularFile(keptFolder(folder) + "/" + operation, limit: Int.max).get() }
        }
    }

    /// The same for a command removed from the configuration since: it is not run again either. It hands over its
    /// kept output file when it has one (it declared `output = file`), else nothing: whether it declared `stdout` or
    /// `none` is no longer known, and a dependent handed the wrong input would run on it silently.
    package static func recoveredWithoutSpec(operation: String, folder: String) -> OperationBody {
        .sync { _ in
            let kept = keptFolder(folder) + "/" + operation
            guard access(kept, F_OK) == 0 else { return nil }
            return try readRegularFile(kept, limit: Int.max).get()
        }
    }
}

// Commands' scratch folders (${workdir}, SPEC §3.6): `.work/<n>` in the job's folder, one per attempt at a time, kept
// for the next attempt rather than removed.
//
// On ext4 a new folder takes a block and removing it frees the block again (a synchronous trim where the file
// system is mounted with `discard`): for a short command, a fresh folder per attempt was the larger part of its
// file system cost. So a folder its command left empty stays where it is, in the job's pool, and the next attempt
// of the same job is given it as it is: no rename, no new inode. The names say nothing of the operation (a folder
// serves many); the journal and `show` say which attempt runs. A folder with anything left in it is removed.
// Pooled folders are never published: they live in .work/, which goes before publication
// (CommandOperation.removeScratch) and at recovery. One the pool names but that is gone (removed with its .work/)
// is passed over.
//
// What it trusts: nothing in the folders; emptiness is read from the folder itself when the attempt has ended, and
// the mode is set again when a folder is given out (the last command may have changed it).
enum ScratchFolders {
    /// Folders kept at most per job folder (about its commands' concurrency); beyond, empty folders are removed.
    static let sparesPerJob = 64

    private static let lock = NSLock()
    /// Job folder → its empty folders' paths.
    nonisolated(unsafe) private static var spares: [String: [String]] = [:]
    nonisolated(unsafe) private static var made = 0

    /// An empty folder in `jobFolder`'s .work/ (made if missing) for one attempt: a kept one, else a new one.
    static func make(jobFolder: String) throws -> String {
        while let spare = take(jobFolder) {
            // The mode as a new folder's, whatever the last command made of it; gone (its .work/ removed): the next.
            if chmod(spare, 0o755) == 0 { return spare }
        }
        let path = jobFolder + "/.work/" + String(lock.withLock { made += 1; return made })
        // .work/ is made by the job's first command (ENOENT), not looked for at each.
        var failure = makeNew(path)
        if failure == ENOENT, makeFolder(CommandOperation.workFolder(jobFolder)) == 0 { failure = makeNew(path) }
        if failure != 0 { throw SpoolError(operation: "mkdir", path: path, errno: failure) }
        return path
    }

    /// The attempt at `path` has ended (its command and whatever it started are gone): its folder is kept when it is
    /// empty (`empty`: already seen so), else removed. Only under the supervisor: without it a process the command
    /// left behind could still be in the folder when it next serves another attempt.
    static func release(_ path: String, jobFolder: String, empty: Bool = false) {
        if Supervisor.path != nil, empty || isEmptyFolder(path) {
            let kept = lock.withLock {
                guard spares[jobFolder, default: []].count < sparesPerJob else { return false }
                spares[jobFolder, default: []].append(path)
                return true
            }
            if kept { return }
        }
        removeTree(path)
    }

    /// The job's .work/ is being removed (publication): its folders go with it.
    static func forget(_ jobFolder: String) {
        _ = lock.withLock { spares.removeValue(forKey: jobFolder) }
    }

    private static func take(_ jobFolder: String) -> String? {
        lock.withLock {
            guard var list = spares[jobFolder], let spare = list.popLast() else { return nil }
            spares[jobFolder] = list.isEmpty ? nil : list
            return spare
        }
    }

    /// mkdir(2) of a folder that must be new: one a previous run left under the name is removed first.
    private static func makeNew(_ path: String) -> Int32 {
        if mkdir(path, 0o755) == 0 { return 0 }
        guard errno == EEXIST else { return errno }
        removeTree(path)
        return mkdir(path, 0o755) == 0 ? 0 : errno
    }

    /// mkdir(2) with mode 0755: 0 once the folder exists (made now or before), else the errno.
    static func makeFolder(_ path: String) -> Int32 { mkdir(path, 0o755) == 0 || errno == EEXIST ? 0 : errno }

    /// Whether `path` is a folder (not a link to one) with nothing in it.
    static func isEmptyFolder(_ path: String) -> Bool {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0, let dir = fdopendir(fd) else {
            if fd >= 0 { close(fd) }
            return false
        }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let name = direntName(entry)
            if name != [0x2E] && name != [0x2E, 0x2E] { return false }
        }
        return true
    }
}
