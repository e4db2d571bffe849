// Ended jobs written straight into an outbox (for `list`, `clean` and keepDays at 100,000 folders, far faster than
// running that many jobs), and a program run to its end with its own peak resident set (wait4's ru_maxrss), for the
// tests and `opqueue-bench outbox`.

import CShims
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A result.plist as the daemon writes it (SPEC §5; keys sorted, XML), with no operations.
public func endedJobResult(job: String, status: String, finishedAt: Double, durationSeconds: Double? = 0.5, node: String? = nil) -> String {
    var keys = ""
    if let durationSeconds { keys += "\t<key>durationSeconds</key>\n\t<real>\(durationSeconds)</real>\n" }
    keys += "\t<key>finishedAt</key>\n\t<real>\(finishedAt)</real>\n\t<key>job</key>\n\t<string>\(job)</string>\n"
    keys += "\t<key>manifest</key>\n\t<string>\(job).plist</string>\n"
    if let node { keys += "\t<key>node</key>\n\t<string>\(node)</string>\n" }
    keys += "\t<key>operations</key>\n\t<array/>\n\t<key>receivedAt</key>\n\t<real>\(finishedAt - 1)</real>\n"
    keys += "\t<key>status</key>\n\t<string>\(status)</string>\n"
    return """
        <?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
        <plist version="1.0">
        <dict>
        \(keys)</dict>
        </plist>

        """
}

/// Writes an ended job's folder, outbox/`job`/result.plist (and manifest.plist when given), directly.
public func writeEndedJob(outbox: String, job: String, status: String = "succeeded", finishedAt: Double,
                          durationSeconds: Double? = 0.5, node: String? = nil, manifest: Data? = nil) throws {
    let folder = outbox + "/" + job
    guard mkdir(folder, 0o750) == 0 || errno == EEXIST else { throw SupportFailure("mkdir \(folder): \(String(cString: strerror(errno)))") }
    try writeWhole(folder + "/result.plist", Array(endedJobResult(job: job, status: status, finishedAt: finishedAt,
                                                                  durationSeconds: durationSeconds, node: node).utf8))
    if let manifest { try writeWhole(folder + "/manifest.plist", [UInt8](manifest)) }
}

/// Writes `count` ended jobs `prefix`0 … into `outbox` (made if missing), job i finished at `finishedAt(i)`.
public func writeEndedJobs(outbox: String, count: Int, prefix: String = "j", status: (Int) -> String = { _ in "succeeded" },
                           finishedAt: (Int) -> Double) throws {
    if mkdir(outbox, 0o750) != 0 && errno != EEXIST { throw SupportFailure("mkdir \(outbox): \(String(cString: strerror(errno)))") }
    for i in 0..<count { try writeEndedJob(outbox: outbox, job: "\(prefix)\(i)", status: status(i), finishedAt: finishedAt(i)) }
}

/// Writes `bytes` to `path` whole through a descriptor closed on exec. Foundation's `Data.write` leaves its
/// descriptor inheritable: a child another test's thread forks meanwhile may hold the file open for writing, and the
/// daemon leaves such a manifest alone as still being written.
public func writeWhole(_ path: String, _ bytes: [UInt8]) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw SupportFailure("create \(path): \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    guard written == bytes.count else { throw SupportFailure("write \(path): \(String(cString: strerror(errno)))") }
}

/// A program's run: its exit status (128 + N for a signal), output, peak resident set and wall time.
public struct MeasuredRun: Sendable {
    public let status: Int32
    public let stdout: String
    public let stderr: String
    public let peakRSSMegabytes: Double
    public let seconds: Double
}

/// Runs `program` with `arguments` to its end, its output into files (no pipe to drain), and reads its own peak
/// resident set from wait4(2)'s rusage: that child's alone, whatever else this process runs meanwhile. Linux counts in
/// a child's ru_maxrss the resident set of the process it was forked from, as it was at the child's exec (this
/// process's tens of megabytes, not the child's): so the child is started through GNU time (/usr/bin/time, a
/// process of about a megabyte), whose own wait4 gives the child's figure. Without it, wait4's figure here is
/// the larger of the two, an upper bound.
public func runMeasuringMemory(_ program: String, _ arguments: [String]) throws -> MeasuredRun {
    let base = NSTemporaryDirectory() + "opq-measured-\(getpid())-\(UUID().uuidString.prefix(8))"
    defer { unlink(base + ".out"); unlink(base + ".err"); unlink(base + ".rss") }
    let timer = "/usr/bin/time"
    let viaTime = access(timer, X_OK) == 0
    let command = viaTime ? [timer, "-f", "%M", "-o", base + ".rss", program] + arguments : [program] + arguments
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, base + ".out", O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_addopen(&actions, 2, base + ".err", O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    // Nothing else of this process's: a descriptor another test's thread holds open for writing (an inbox file)
    // would stay open as long as the child lives, and a daemon would leave that file alone as still being written.
    let closing = opq_spawn_actions_close_from(&actions, 3)
    guard closing == 0 else { throw SupportFailure("posix_spawn_file_actions_addclosefrom_np: \(String(cString: strerror(closing)))") }
    let argv = command.map { strdup($0) } + [nil]
    defer { for p in argv { free(p) } }
    var pid: pid_t = 0
    let began = Date()
    let spawned = posix_spawn(&pid, command[0], &actions, nil, argv, environ)
    guard spawned == 0 else { throw SupportFailure("posix_spawn \(command[0]): \(String(cString: strerror(spawned)))") }
    var status: Int32 = 0
    var usage = rusage()
    while wait4(pid, &status, 0, &usage) < 0 {
        guard errno == EINTR else { throw SupportFailure("wait4 \(program): \(String(cString: strerror(errno)))") }
    }
    let seconds = Date().timeIntervalSince(began)
    let signal = status & 0x7F
    let read = { (path: String) in String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self) }
    // GNU time's last line is the child's peak in KB (a line before it says so when the child was killed).
    let timed = viaTime ? read(base + ".rss").split(separator: "\n").last.flatMap { Double($0) } : nil
    return MeasuredRun(status: signal == 0 ? (status >> 8) & 0xFF : 128 + signal, stdout: read(base + ".out"),
                       stderr: read(base + ".err"), peakRSSMegabytes: (timed ?? Double(usage.ru_maxrss)) / 1024, seconds: seconds)
}
