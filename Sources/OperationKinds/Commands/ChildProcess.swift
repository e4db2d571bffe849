// A command's process (SPEC §3.6): started with posix_spawn in its own process group, its exit learned
// through a pidfd and its standard output and error read from pipes, all watched by one epoll thread —
// no thread waits for a child, however many run.
//
// Bounded output: the daemon reads each pipe and writes at most `limit` bytes to the log file; the rest
// is read and dropped (so the command never blocks on a full pipe, and never gets SIGXFSZ as it would
// with RLIMIT_FSIZE), and the truncation is reported.
// Each command runs under its supervisor, opqueued-supervise (Sources/opqueued-supervise/main.c), the leader of
// the command's process group and a child subreaper: whatever the command starts stays its descendant, even a
// process that left the group with setsid, and the supervisor ends them all when the command ends, on SIGTERM
// (after `killGrace`), on SIGUSR1 and when the daemon dies. When the leader has exited (a zombie still holding its
// pid, so the group id cannot have been reused) the group gets SIGKILL too, then the leader is reaped. The command
// watchdog (CommandWatchdog.swift) is told of each group started and ended, and has the supervisors end theirs when
// the daemon dies or freezes past its kill deadline. Without the supervisor binary (not installed) a command runs
// directly as its group's leader, and a process that left the group is out of reach.
//
// What it trusts: nothing the command writes; only the kernel's exit status.

import CShims
import Foundation
import SpoolFiles

#if canImport(Glibc)
import Glibc
import SystemCalls
#endif

/// How a command ended.
package struct ChildExit: Sendable {
    /// The exit status, or nil when a signal ended it.
    package var status: Int32?
    package var signal: Int32?
    /// Bytes the command wrote to each stream (kept or not).
    var stdoutBytes = 0
    var stderrBytes = 0
    var stdoutTruncated = false
    var stderrTruncated = false
    /// The end of standard error (at most 4 KB), for the failure message.
    var stderrTail = Data()
    /// Killed by the daemon's stop (`ChildProcess.killAll`): not an outcome of its operation or hook.
    package var killedByStop = false

    /// The last non-empty line of standard error.
    package var lastStderrLine: String {
        let text = String(decoding: stderrTail, as: UTF8.self)
        return text.split(whereSeparator: \.isNewline).last.map { String($0.prefix(500)) } ?? ""
    }

    package var signalName: String {
        guard let signal else { return "" }
        if let abbrev = opq_signal_name(signal) { return "SIG" + String(cString: abbrev) }
        return "signal \(signal)"
    }
}

/// One thread waiting in epoll(7) for every command's pidfd and pipes; handlers run on it, in order.
/// (libdispatch read sources were tried first: under thousands of short-lived descriptors its Linux event
/// loop crashed in _dispatch_event_loop_drain.)
final class CommandLoop: @unchecked Sendable {
    static let shared = CommandLoop()
    private let epfd: Int32
    private let lock = NSLock()
    private var handlers: [UInt64: () -> Void] = [:]
    private var nextToken: UInt64 = 1

    private init() {
        epfd = opq_epoll_create()
        guard epfd >= 0 else { return }
        let thread = Thread { [self] in run() }
        thread.name = "opqueued.commands"
        thread.start()
    }

    /// Calls `handler` on the loop's thread whenever `fd` is readable; nil if it cannot be watched.
    func watch(_ fd: Int32, _ handler: @escaping () -> Void) -> UInt64? {
        guard epfd >= 0 else { return nil }
        let token: UInt64 = lock.withLock {
            defer { nextToken += 1 }
            handlers[nextToken] = handler
            return nextToken
        }
        if opq_epoll_add(epfd, fd, token) != 0 {
            _ = lock.withLock { handlers.removeValue(forKey: token) }
            return nil
        }
        return token
    }

    /// Stops watching; the caller may close `fd` afterwards. Events already fetched for it are dropped.
    func unwatch(_ fd: Int32, token: UInt64) {
        _ = opq_epoll_remove(epfd, fd)
        _ = lock.withLock { handlers.removeValue(forKey: token) }
    }

    private func run() {
        var tokens = [UInt64](repeating: 0, count: 256)
        while true {
            let n = tokens.withUnsafeMutableBufferPointer { opq_epoll_wait(epfd, $0.baseAddress, 256, -1) }
            guard n > 0 else { continue } // EINTR
            for i in 0..<Int(n) {
                if let handler = lock.withLock({ handlers[tokens[i]] }) { handler() }
            }
        }
    }
}

package final class ChildProcess: @unchecked Sendable {
    /// Grace between SIGTERM and SIGKILL on cancellation and timeout.
    static let killGrace = 5.0
    /// After the leader's exit, pipes are read until EOF for at most this long (a process that left the
    /// group may hold them open).
    static let drainSeconds = 1.0

    let pid: pid_t
    private let pidfd: Int32
    /// The spare supervisor running the command, while it runs: its end comes as a message on the spare's socket, and
    /// the spare is given back (its pidfd with it). Nil for a supervisor started for this command alone, or once a spare
    /// died: the end is then the leader's exit, read from the pidfd.
    private var spare: SpareSupervisor?
    /// Groups of commands not yet reaped, for `killAll` (a stop must not leave them running).
    private static let running = RunningGroups()
    /// Guards everything below: the loop's thread, timers and `terminate` callers meet here.
    private let lock = NSLock()
    private var exitToken: UInt64?
    private var streams: [Stream] = []
    private var result = ChildExit()
    private var exited = false
    private var completion: ((ChildExit) -> Void)?
    private var timers: [OneShotTimer] = []
    private var terminating = false

    /// One pipe read into a file (or nowhere, `file` < 0), at most `limit` bytes kept.
    private final class Stream {
        let pipe: Int32
        let file: Int32
        let limit: Int
        let keepsTail: Bool
        var written = 0
        var total = 0
        var tail = Data()
        var token: UInt64?
        var open = true
        init(pipe: Int32, file: Int32, limit: Int, keepsTail: Bool) {
            self.pipe = pipe; self.file = file; self.limit = limit; self.keepsTail = keepsTail
        }
    }

    private init(pid: pid_t, pidfd: Int32, spare: SpareSupervisor?) {
        self.pid = pid
        self.pidfd = pidfd
        self.spare = spare
    }

    /// Starts `argv` (argv[0] an absolute path). `stdoutFile`/`stderrFile` are open descriptors the
    /// daemon writes to (-1: dropped); they stay the caller's to close after `completion`.
    /// `completion` runs once, on the loop's thread or a timer's, after the exit and the end of both pipes.
    package static func start(argv: [String], environment: [String: String], directory: String?, stdoutFile: Int32, stderrFile: Int32,
                      limit: Int, completion: @escaping (ChildExit) -> Void) -> Result<ChildProcess, KindFailure> {
        var outPipe: [Int32] = [-1, -1], errPipe: [Int32] = [-1, -1]
        let p1 = opq_pipe2(&outPipe, O_CLOEXEC)
        guard p1 == 0 else { return .failure(KindFailure(description: "cannot make a pipe: \(String(cString: strerror(-p1)))")) }
        let p2 = opq_pipe2(&errPipe, O_CLOEXEC)
        guard p2 == 0 else {
            close(outPipe[0]); close(outPipe[1])
            return .failure(KindFailure(description: "cannot make a pipe: \(String(cString: strerror(-p2)))"))
        }
        // The daemon's ends do not block its loop; the child's stay blocking, as programs expect. (F_SETFL sets only the
        // status flags, and a pipe's read end has no other.)
        for fd in [outPipe[0], errPipe[0]] { _ = fcntl(fd, F_SETFL, O_NONBLOCK) }
        var env = environment
        if env["PATH"] == nil { env["PATH"] = "/usr/bin:/bin" }
        let envStrings = env.keys.sorted().map { "\($0)=\(env[$0] ?? "")" }
        var pid: pid_t = -1, pidfd: Int32 = -1, spawned: ClosedRange<UInt64> = 0...0
        var spare: SpareSupervisor?
        let rc: Int32
        if access(argv[0], X_OK) != 0 {
            rc = -errno // a program that cannot be run is said as it is (the supervisor would only exit 127 for it)
        } else if let taken = SpareSupervisors.shared.start(argv: argv, environment: envStrings, directory: directory,
                                                            stdout: outPipe[1], stderr: errPipe[1]) {
            (pid, pidfd, spawned, spare) = (taken.pid, taken.pidfd, taken.started, taken)
            rc = 0
        } else {
            let from = CommandLedger.bootTicks()
            rc = withCStrings(Supervisor.argv(argv)) { cArgv in
                withCStrings(envStrings) { cEnv in
                    opq_spawn(Supervisor.path ?? argv[0], cArgv, cEnv, directory, outPipe[1], errPipe[1], &pid, &pidfd)
                }
            }
            spawned = from...CommandLedger.bootTicks()
        }
        close(outPipe[1]); close(errPipe[1])
        guard rc == 0 else {
            close(outPipe[0]); close(errPipe[0])
            return .failure(KindFailure(description: "cannot run \(argv[0]): \(String(cString: strerror(-rc)))"))
        }
        running.insert(pid)
        // A spare that served a command before is known to the watchdog already, and its ledger line stands.
        if spare?.watched != true { CommandWatchdog.current?.groupStarted(pid) }
        spare?.watched = true
        CommandLedger.shared.started(pid, within: spawned)
        let child = ChildProcess(pid: pid, pidfd: pidfd, spare: spare)
        child.completion = completion
        child.streams = [Stream(pipe: outPipe[0], file: stdoutFile, limit: limit, keepsTail: false),
                         Stream(pipe: errPipe[0], file: stderrFile, limit: limit, keepsTail: true)]
        // Whether the end is watched, read under the lock: once it is released the end may come, and be handled, at once.
        let watched = child.lock.withLock {
            for stream in child.streams {
                stream.token = CommandLoop.shared.watch(stream.pipe) { [child, stream] in child.locked { child.drain(stream) } }
            }
            if let spare {
                child.exitToken = CommandLoop.shared.watch(spare.socket) { [child] in child.locked { child.spareReported() } }
            } else {
                child.exitToken = CommandLoop.shared.watch(pidfd) { [child] in child.locked { child.leaderExited() } }
            }
            return child.exitToken != nil
        }
        if !watched {
            // Cannot be watched: it does not run.
            kill(-pid, SIGKILL)
            child.locked { child.forgetSpare(); child.leaderExited(blocking: true) }
        }
        return .success(child)
    }

    /// Runs `body` under the lock, then the completion if it became due.
    private func locked(_ body: () -> Void) {
        lock.lock()
        body()
        var due: (((ChildExit) -> Void), ChildExit)?
        if exited, !streams.contains(where: \.open), let completion {
            self.completion = nil
            for timer in timers { timer.cancel() }
            timers = []
            result.stdoutBytes = streams[0].total
            result.stderrBytes = streams[1].total
            result.stdoutTruncated = streams[0].total > streams[0].written
            result.stderrTruncated = streams[1].total > streams[1].written
            result.stderrTail = streams[1].tail
            due = (completion, result)
        }
        lock.unlock()
        if let (completion, result) = due { completion(result) }
    }

    /// Reads what the pipe holds; at EOF the stream ends.
    private func drain(_ stream: Stream) {
        guard stream.open else { return }
        ReadBuffer.shared.with { buffer in drain(stream, into: buffer) }
    }

    private func drain(_ stream: Stream, into buffer: UnsafeMutableRawBufferPointer) {
        while true {
            let n = retryingInterrupts { read(stream.pipe, buffer.baseAddress, buffer.count) }
            if n > 0 {
                stream.total += n
                let keep = min(n, max(0, stream.limit - stream.written))
                // Once the command is being stopped its job may be published: its logs are left alone.
                if keep > 0, stream.file >= 0, !terminating {
                    var offset = 0
                    while offset < keep {
                        let w = retryingInterrupts { write(stream.file, buffer.baseAddress.map { $0 + offset }, keep - offset) }
                        if w <= 0 { break } // a full disk loses log bytes, not the operation
                        offset += w
                    }
                }
                stream.written += keep
                if stream.keepsTail {
                    stream.tail.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
                    if stream.tail.count > 4096 { stream.tail.removeFirst(stream.tail.count - 4096) }
                }
                continue
            }
            if n < 0 && errno == EAGAIN { return }
            end(stream)
            return
        }
    }

    private func end(_ stream: Stream) {
        guard stream.open else { return }
        stream.open = false
        if let token = stream.token { CommandLoop.shared.unwatch(stream.pipe, token: token) }
        close(stream.pipe)
    }

    /// The spare's socket is readable: the command's end (spare.c's report: its wait status, and the spare's priority
    /// now), or the spare's death (the socket closed), or nonsense (it is killed). The end: the spare's processes are all
    /// gone, so its group is not killed, and it is given back for the next command (still known to the watchdog: its
    /// group ends when it is let go or dies).
    private func spareReported() {
        guard !exited, var spare else { return }
        var report = [UInt8](repeating: 0, count: 16)
        let n = report.withUnsafeMutableBytes { recv(spare.socket, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if n < 0 && (errno == EAGAIN || errno == EINTR) { return } // a spurious wake-up
        guard n == 2 + 2 * MemoryLayout<Int32>.size, report[0] == UInt8(ascii: "x"), report[9] <= 1 else {
            if n > 0 { kill(pid, SIGKILL) }
            spareDied()
            return
        }
        let status = report.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 1, as: Int32.self) }
        spare.nice = report.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 5, as: Int32.self) }
        spare.idleClass = report[9] == 1
        unwatchSpare()
        ended(status: status)
        SpareSupervisors.shared.giveBack(spare)
    }

    /// The spare is not given back (it died, or cannot be trusted): its end is its exit, read from its pidfd, which is
    /// now this process's to close.
    private func spareDied() {
        forgetSpare()
        exitToken = CommandLoop.shared.watch(pidfd) { [self] in locked { leaderExited() } }
        if exitToken == nil {
            kill(-pid, SIGKILL)
            leaderExited(blocking: true)
        }
    }

    /// Lets go of the spare's socket (the spare is not given back).
    private func forgetSpare() {
        if let spare = unwatchSpare() { close(spare.socket) }
    }

    /// Stops watching the spare's socket and lets go of the spare (the caller gives it back or closes it).
    @discardableResult
    private func unwatchSpare() -> SpareSupervisor? {
        guard let spare else { return nil }
        self.spare = nil
        if let exitToken { CommandLoop.shared.unwatch(spare.socket, token: exitToken) }
        exitToken = nil
        return spare
    }

    /// The leader is a zombie. Its group is killed (its pid cannot have been reused yet), the watchdog told
    /// it ended (still before the reap, for the same reason), then it is reaped.
    private func leaderExited(blocking: Bool = false) {
        guard !exited else { return }
        kill(-pid, SIGKILL)
        let zombie = opq_child_exited(pid, blocking ? 1 : 0)
        guard zombie != 0 else { return } // not yet (a spurious wake-up): the pidfd stays readable
        if zombie == 1 { CommandWatchdog.current?.groupEnded(pid) }
        var status: Int32 = 0
        let r = retryingInterrupts { waitpid(pid, &status, blocking ? 0 : WNOHANG) }
        guard r == pid else { return } // not yet (a spurious wake-up): the pidfd stays readable
        if let exitToken { CommandLoop.shared.unwatch(pidfd, token: exitToken) }
        exitToken = nil
        close(pidfd)
        ended(status: status)
    }

    /// The command has ended with wait status `status`, and nothing it started runs: what is left is its pipes.
    private func ended(status: Int32) {
        exited = true
        let removed = Self.running.remove(pid)
        if removed.noneLeft { CommandLedger.shared.allEnded() }
        result.killedByStop = removed.killedForStop
        if (status & 0x7f) == 0 { result.status = (status >> 8) & 0xff } else { result.signal = status & 0x7f }
        for stream in streams { drain(stream) }
        if streams.contains(where: \.open) {
            timers.append(OneShotTimer(after: Self.drainSeconds) { [self] in
                locked { for stream in streams { end(stream) } }
            })
        }
    }

    /// The cluster's kill deadline (CLOCK_MONOTONIC seconds, `CommandWatchdog.monotonicSeconds()`): unless a
    /// newer one comes first, the watchdog SIGKILLs every command's group when it passes, even if the daemon is
    /// frozen; nil: none. Does nothing without a watchdog (one is started by opqueued at start).
    static func setKillDeadline(monotonicSeconds: Double?) {
        CommandWatchdog.current?.setKillDeadline(monotonicSeconds: monotonicSeconds)
    }

    /// SIGKILL to every command's group (the daemon stops; unfinished operations run again at the next start). Their
    /// exits say `killedByStop`: not an outcome of their operation or hook.
    package static func killAll() {
        for pid in running.killForStop() { _ = Supervisor.path == nil ? kill(-pid, SIGKILL) : kill(pid, SIGUSR1) }
    }

    /// SIGTERM to the group now, SIGKILL after `killGrace` if the leader has not exited (once it has, the
    /// group is killed at once anyway). Safe from any thread; later calls do nothing.
    package func terminate() {
        locked {
            guard !terminating, !exited else { return }
            terminating = true
            kill(-pid, SIGTERM)
            // The supervisor kills what is left `killGrace` later; should it not have, SIGUSR1 has it kill all now, and
            // last the group gets SIGKILL.
            let supervised = Supervisor.path != nil
            timers.append(OneShotTimer(after: Self.killGrace + (supervised ? 1 : 0)) { [self] in
                locked { if !exited { _ = supervised ? kill(pid, SIGUSR1) : kill(-pid, SIGKILL) } }
            })
            if supervised {
                timers.append(OneShotTimer(after: Self.killGrace + 2) { [self] in locked { if !exited { kill(-pid, SIGKILL) } } })
            }
        }
    }
}

/// Where opqueued-supervise is: beside the running program (the build folder, or bin/ when installed there), else in
/// ../lib/opqueued/ (how `make install` lays it out); nil when neither holds it.
package enum Supervisor {
    package static let path: String? = {
        guard let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") else { return nil }
        let folder = (exe as NSString).deletingLastPathComponent
        return [folder + "/opqueued-supervise", folder + "/../lib/opqueued/opqueued-supervise"].first { access($0, X_OK) == 0 }
    }()

    /// The supervisor's argv for a command's: the grace before SIGKILL, this process (its parent, whose death it
    /// watches), the program and the command's argv; the command's own argv without a supervisor.
    static func argv(_ command: [String]) -> [String] {
        guard let path else { return command }
        return [path, String(ChildProcess.killGrace), daemonPID, command[0]] + command
    }

    /// The argv of a spare supervisor, or of the factory that copies them (SpareSupervisors.swift).
    static func spareArgv(factory: Bool) -> [String] {
        [path ?? "", factory ? "--factory" : "--spare", String(ChildProcess.killGrace), daemonPID]
    }

    /// This process's pid, as the supervisor's PARENT argument (the daemon never forks a copy of itself that runs this).
    private static let daemonPID = String(getpid())
}

/// The buffer pipes are read into: one for all commands (they are read on the loop's thread, one at a time), rather than
/// 64 KB allocated and zeroed at each read.
private final class ReadBuffer: @unchecked Sendable {
    static let shared = ReadBuffer()
    private let lock = NSLock()
    private let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 16)

    func with(_ body: (UnsafeMutableRawBufferPointer) -> Void) { lock.withLock { body(buffer) } }
}

private final class RunningGroups: @unchecked Sendable {
    private let lock = NSLock()
    private var pids: Set<pid_t> = []
    /// Those `killForStop` killed, until they are removed.
    private var killed: Set<pid_t> = []
    func killForStop() -> [pid_t] {
        lock.withLock {
            killed.formUnion(pids)
            return Array(pids)
        }
    }
    func insert(_ pid: pid_t) { _ = lock.withLock { pids.insert(pid) } }
    /// Returns whether none is left, and whether `killForStop` killed it.
    func remove(_ pid: pid_t) -> (noneLeft: Bool, killedForStop: Bool) {
        lock.withLock {
            pids.remove(pid)
            return (pids.isEmpty, killed.remove(pid) != nil)
        }
    }
}

/// active/.commands: one line `PID FROM TO` per command started, so that commands a killed daemon left
/// running (the watchdog, CommandWatchdog.swift, normally kills them at once; not if it was killed too) are
/// killed at the next start, before their operations run again. FROM and TO bound the leader's start time, in clock
/// ticks since boot as /proc gives it, read from the clock around the spawn rather than from /proc per command. A pid is
/// trusted only if /proc shows a start time within them (pids are reused); a line of an older build, `PID STARTTIME`,
/// is both bounds. Emptied when no command runs once past `keptBytes`, so it stays small.
package final class CommandLedger: @unchecked Sendable {
    package static let shared = CommandLedger()
    /// Past this size the ledger is emptied when no command runs; below it, it is left as it is (a line of a group
    /// that has ended is harmless: its start time no longer matches).
    static let keptBytes = 65_536
    private let lock = NSLock()
    private var fd: Int32 = -1
    private var bytes = 0
    /// The lines in the ledger now: a supervisor that serves one command after another is written once.
    private var recorded: [pid_t: ClosedRange<UInt64>] = [:]

    /// At start, before anything runs: kills the groups of recorded commands still alive, then keeps
    /// the ledger at `path`.
    package func open(_ path: String) -> [pid_t] {
        var killed: [pid_t] = []
        if case .success(let data) = readRegularFile(path, limit: 64 << 20) {
            for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
                let parts = line.split(separator: " ")
                guard parts.count == 2 || parts.count == 3, let pid = pid_t(parts[0]), pid > 1,
                      let from = UInt64(parts[1]), let to = UInt64(parts[parts.count - 1]), from <= to,
                      Self.isRecordedGroup(pid, started: from...to) else { continue }
                kill(-pid, SIGKILL)
                killed.append(pid)
            }
        }
        lock.withLock {
            if fd >= 0 { Glibc.close(fd) }
            fd = Glibc.open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0o644)
            bytes = 0
            recorded = [:]
        }
        return killed
    }

    /// `started`: `bootTicks()` read before and after the leader's spawn.
    func started(_ pid: pid_t, within started: ClosedRange<UInt64>) {
        lock.withLock {
            guard fd >= 0, recorded[pid] != started else { return }
            let line = Data("\(pid) \(started.lowerBound) \(started.upperBound)\n".utf8)
            try? writeAll(fd, line, path: "active/.commands")
            recorded[pid] = started
            bytes += line.count
        }
    }

    /// No command runs: the ledger is emptied once it has grown past `keptBytes`.
    func allEnded() {
        lock.withLock {
            guard fd >= 0, bytes > Self.keptBytes else { return }
            _ = ftruncate(fd, 0)
            bytes = 0
            recorded = [:]
        }
    }

    /// Whether the group `pgid` is still the one recorded: its leader (the command's supervisor) alive with the recorded
    /// start time; or, the leader gone (killed too), a member of its group started since. A group's id is not given to
    /// another group while a member of it lives, so such members are what the command left.
    static func isRecordedGroup(_ pgid: pid_t, started recorded: ClosedRange<UInt64>) -> Bool {
        if let start = startTime(pgid) { return UInt64(start).map { recorded.contains($0) } ?? false }
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.contains { entry in
            guard let pid = pid_t(entry), case .success(let data) = readRegularFile("/proc/\(pid)/stat", limit: 4096) else { return false }
            let text = String(decoding: data, as: UTF8.self)
            guard let close = text.lastIndex(of: ")") else { return false }
            let fields = text[text.index(after: close)...].split(separator: " ")
            return fields.count > 19 && pid_t(fields[2]) == pgid && (UInt64(fields[19]) ?? 0) >= recorded.lowerBound
        }
    }

    /// Now, in the unit of /proc/PID/stat's start time: clock ticks (`_SC_CLK_TCK`) since boot, rounded down as the
    /// kernel rounds a process's start (CLOCK_BOOTTIME is the clock it reads).
    static func bootTicks() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_BOOTTIME, &now)
        let nanoseconds = UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
        return nanoseconds / (1_000_000_000 / UInt64(max(1, sysconf(Int32(_SC_CLK_TCK)))))
    }

    /// Field 22 of /proc/PID/stat: the process's start time in clock ticks since boot.
    /// (Read into a buffer of its own, without Foundation: this runs once per command started.)
    static func startTime(_ pid: pid_t) -> String? {
        let fd = Glibc.open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { Glibc.close(fd) }
        var buffer = [UInt8](repeating: 0, count: 1024)
        let n = retryingInterrupts { buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) } }
        guard n > 0, let close = buffer[0..<n].lastIndex(of: UInt8(ascii: ")")) else { return nil }
        let fields = buffer[(close + 1)..<n].split(separator: UInt8(ascii: " "))
        return fields.count > 19 ? String(decoding: fields[19], as: UTF8.self) : nil
    }
}

/// Calls `body` with a NULL-terminated C array of the strings.
func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    pointers.append(nil)
    defer { for p in pointers { free(p) } }
    return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
}
