// A command's process (SPEC §3.6): started with posix_spawn in its own process group, its exit learned
// through a pidfd and its standard output and error read from pipes, all on one serial dispatch queue —
// no thread waits for a child, however many run.
//
// Bounded output: the daemon reads each pipe and writes at most `limit` bytes to the log file; the rest
// is read and dropped (so the command never blocks on a full pipe, and never gets SIGXFSZ as it would
// with RLIMIT_FSIZE), and the truncation is reported.
// The group dies with its leader: when the leader has exited (a zombie still holding its pid, so the
// group id cannot have been reused) the group gets SIGKILL, then the leader is reaped. Nothing the
// command started outlives its operation (a process that left the group with setsid is out of reach).
//
// What it trusts: nothing the command writes; only the kernel's exit status.

import CShims
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// How a command ended.
struct ChildExit: Sendable {
    /// The exit status, or nil when a signal ended it.
    var status: Int32?
    var signal: Int32?
    /// Bytes the command wrote to each stream (kept or not).
    var stdoutBytes = 0
    var stderrBytes = 0
    var stdoutTruncated = false
    var stderrTruncated = false
    /// The end of standard error (at most 4 KB), for the failure message.
    var stderrTail = Data()

    /// The last non-empty line of standard error.
    var lastStderrLine: String {
        let text = String(decoding: stderrTail, as: UTF8.self)
        return text.split(whereSeparator: \.isNewline).last.map { String($0.prefix(500)) } ?? ""
    }

    var signalName: String {
        guard let signal else { return "" }
        if let abbrev = opq_signal_name(signal) { return "SIG" + String(cString: abbrev) }
        return "signal \(signal)"
    }
}

final class ChildProcess: @unchecked Sendable {
    /// Every child's events, in order; mutable state below is touched only here.
    static let events = DispatchQueue(label: "opqueued.commands")
    /// Grace between SIGTERM and SIGKILL on cancellation and timeout.
    static let killGrace = 5.0
    /// After the leader's exit, pipes are read until EOF for at most this long (a process that left the
    /// group may hold them open).
    static let drainSeconds = 1.0

    let pid: pid_t
    private let pidfd: Int32
    private var exitSource: (any DispatchSourceRead)?
    private var streams: [Stream] = []
    private var result = ChildExit()
    private var exited = false
    private var completion: ((ChildExit) -> Void)?
    private var timers: [OneShotTimer] = []
    private var terminating = false

    /// One pipe read into a file (or nowhere, `fd` < 0), at most `limit` bytes kept.
    private final class Stream {
        let pipe: Int32
        let file: Int32
        let limit: Int
        let keepsTail: Bool
        var written = 0
        var total = 0
        var tail = Data()
        var source: (any DispatchSourceRead)?
        var open = true
        init(pipe: Int32, file: Int32, limit: Int, keepsTail: Bool) {
            self.pipe = pipe; self.file = file; self.limit = limit; self.keepsTail = keepsTail
        }
    }

    private init(pid: pid_t, pidfd: Int32) {
        self.pid = pid
        self.pidfd = pidfd
    }

    /// Starts `argv` (argv[0] an absolute path). `stdoutFile`/`stderrFile` are open descriptors the
    /// daemon writes to (-1: dropped); they stay the caller's to close after `completion`.
    /// `completion` runs once, on `events`, after the exit and the end of both pipes.
    static func start(argv: [String], environment: [String: String], directory: String?, stdoutFile: Int32, stderrFile: Int32,
                      limit: Int, completion: @escaping (ChildExit) -> Void) -> Result<ChildProcess, KindFailure> {
        var outPipe: [Int32] = [-1, -1], errPipe: [Int32] = [-1, -1]
        guard opq_pipe2(&outPipe, O_CLOEXEC | O_NONBLOCK) == 0 else { return .failure(KindFailure(description: "cannot make a pipe: \(String(cString: strerror(errno)))")) }
        guard opq_pipe2(&errPipe, O_CLOEXEC | O_NONBLOCK) == 0 else {
            let e = errno
            close(outPipe[0]); close(outPipe[1])
            return .failure(KindFailure(description: "cannot make a pipe: \(String(cString: strerror(e)))"))
        }
        // The child's ends are blocking, as programs expect.
        for fd in [outPipe[1], errPipe[1]] { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) }
        var env = environment
        if env["PATH"] == nil { env["PATH"] = "/usr/bin:/bin" }
        let envStrings = env.keys.sorted().map { "\($0)=\(env[$0] ?? "")" }
        var pid: pid_t = -1, pidfd: Int32 = -1
        let rc = withCStrings(argv) { cArgv in
            withCStrings(envStrings) { cEnv in
                opq_spawn(argv[0], cArgv, cEnv, directory, outPipe[1], errPipe[1], &pid, &pidfd)
            }
        }
        close(outPipe[1]); close(errPipe[1])
        guard rc == 0 else {
            close(outPipe[0]); close(errPipe[0])
            return .failure(KindFailure(description: "cannot run \(argv[0]): \(String(cString: strerror(-rc)))"))
        }
        let child = ChildProcess(pid: pid, pidfd: pidfd)
        child.completion = completion
        child.streams = [Stream(pipe: outPipe[0], file: stdoutFile, limit: limit, keepsTail: false),
                         Stream(pipe: errPipe[0], file: stderrFile, limit: limit, keepsTail: true)]
        events.async { child.watch() }
        return .success(child)
    }

    /// On `events`: sources for the exit and both pipes.
    private func watch() {
        let exit = DispatchSource.makeReadSource(fileDescriptor: pidfd, queue: Self.events)
        exit.setEventHandler { [self] in leaderExited() }
        exit.setCancelHandler { [pidfd] in close(pidfd) }
        exitSource = exit
        exit.resume()
        for stream in streams {
            let source = DispatchSource.makeReadSource(fileDescriptor: stream.pipe, queue: Self.events)
            source.setEventHandler { [self] in drain(stream) }
            source.setCancelHandler { [fd = stream.pipe] in close(fd) }
            stream.source = source
            source.resume()
        }
    }

    /// Reads what the pipe holds; at EOF the stream ends.
    private func drain(_ stream: Stream) {
        guard stream.open else { return }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(stream.pipe, $0.baseAddress, $0.count) }
            if n > 0 {
                stream.total += n
                let keep = min(n, max(0, stream.limit - stream.written))
                // Once the command is being stopped its job may be published: its logs are left alone.
                if keep > 0, stream.file >= 0, !terminating {
                    var offset = 0
                    while offset < keep {
                        let w = buffer.withUnsafeBytes { write(stream.file, $0.baseAddress! + offset, keep - offset) }
                        if w < 0 && errno == EINTR { continue }
                        if w <= 0 { break } // a full disk loses log bytes, not the operation
                        offset += w
                    }
                }
                stream.written += keep
                if stream.keepsTail {
                    stream.tail.append(contentsOf: buffer[0..<n])
                    if stream.tail.count > 4096 { stream.tail.removeFirst(stream.tail.count - 4096) }
                }
                continue
            }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && errno == EAGAIN { return }
            end(stream)
            return
        }
    }

    private func end(_ stream: Stream) {
        guard stream.open else { return }
        stream.open = false
        stream.source?.cancel()
        stream.source = nil
        finishIfDone()
    }

    /// On `events`: the leader is a zombie. Its group is killed (its pid cannot have been reused yet),
    /// then it is reaped.
    private func leaderExited() {
        guard !exited else { return }
        kill(-pid, SIGKILL)
        var status: Int32 = 0
        var r: pid_t
        repeat { r = waitpid(pid, &status, WNOHANG) } while r < 0 && errno == EINTR
        guard r == pid else { return } // not yet (a spurious wake-up): the source fires again
        exited = true
        exitSource?.cancel()
        exitSource = nil
        if (status & 0x7f) == 0 { result.status = (status >> 8) & 0xff } else { result.signal = status & 0x7f }
        for stream in streams { drain(stream) }
        if streams.contains(where: \.open) {
            timers.append(OneShotTimer(after: Self.drainSeconds) { [self] in
                Self.events.async { for stream in self.streams { self.end(stream) } }
            })
        }
        finishIfDone()
    }

    private func finishIfDone() {
        guard exited, !streams.contains(where: \.open), let completion else { return }
        self.completion = nil
        for timer in timers { timer.cancel() }
        timers = []
        result.stdoutBytes = streams[0].total
        result.stderrBytes = streams[1].total
        result.stdoutTruncated = streams[0].total > streams[0].written
        result.stderrTruncated = streams[1].total > streams[1].written
        result.stderrTail = streams[1].tail
        completion(result)
    }

    /// SIGTERM to the group now, SIGKILL after `killGrace` if the leader has not exited (once it has, the
    /// group is killed at once anyway). Safe from any thread; later calls do nothing.
    func terminate() {
        Self.events.async { [self] in
            guard !terminating, !exited else { return }
            terminating = true
            kill(-pid, SIGTERM)
            timers.append(OneShotTimer(after: Self.killGrace) { [self] in
                Self.events.async { if !self.exited { kill(-self.pid, SIGKILL) } }
            })
        }
    }
}

/// Calls `body` with a NULL-terminated C array of the strings.
func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    pointers.append(nil)
    defer { for p in pointers { free(p) } }
    return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
}
