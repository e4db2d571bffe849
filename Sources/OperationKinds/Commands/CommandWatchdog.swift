// The command watchdog (issue 17, SPEC §8 "a command's processes die with the node that started them"):
// one small process per daemon, forked at start, that SIGKILLs every command process group the daemon
// started and has not yet reaped when the daemon ends — kill -9 or a crash included, since the kernel closes
// the pipe whatever ended the process — and when a kill deadline the daemon set passes without renewal (a
// daemon frozen by SIGSTOP past its cluster lease). The C half (Sources/CShims/watchdog.c) says why it is not
// PR_SET_PDEATHSIG. Without a watchdog (not started, or gone) commands still die at the next start, from
// the ledger active/.commands (ChildProcess.swift), and under systemd with the unit's cgroup.
//
// What it trusts: the kernel's pipe; nothing a command does can reach the pipe (close-on-exec, and commands
// start with every descriptor above 2 closed).

import CShims
import Foundation
import Logging

#if canImport(Glibc)
import Glibc
import SystemCalls
#endif

public final class CommandWatchdog: @unchecked Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// The watchdog's pid (a child of the daemon, in a session of its own).
    public let pid: pid_t
    /// The write end of its pipe: closing it (or the daemon's end) makes it kill every recorded group and exit.
    private var fd: Int32
    private let lock = NSLock()
    /// Set when a message could not be sent. The watchdog is then ended: one that missed the end of a group
    /// could later kill a group id the kernel gave to another process.
    private var failure: String?

    private init(fd: Int32, pid: pid_t) {
        self.fd = fd
        self.pid = pid
    }

    /// A new watchdog process, for the daemon (through `start`) or a test; nil with the reason when it
    /// cannot be forked.
    public static func spawn() -> Result<CommandWatchdog, Failure> {
        var fd: Int32 = -1, pid: pid_t = -1
        let rc = opq_watchdog_start(&fd, &pid)
        guard rc == 0 else { return .failure(Failure(description: "cannot start the command watchdog: \(String(cString: strerror(-rc)))")) }
        return .success(CommandWatchdog(fd: fd, pid: pid))
    }

    private static let currentLock = NSLock()
    nonisolated(unsafe) private static var _current: CommandWatchdog?

    /// The daemon's watchdog, once `start` made it.
    public static var current: CommandWatchdog? { currentLock.withLock { _current } }

    /// Starts the daemon's watchdog, once per process (later calls return the same one). Call it first
    /// thing at start, while the process is small: the fork copies the address space as it is then.
    @discardableResult
    public static func start() -> Result<CommandWatchdog, Failure> {
        currentLock.withLock {
            if let _current { return .success(_current) }
            let made = spawn()
            if case .success(let watchdog) = made { _current = watchdog }
            return made
        }
    }

    /// CLOCK_MONOTONIC in seconds: the clock of `setKillDeadline` (the same in every process of the machine;
    /// it does not jump with the wall clock).
    public static func monotonicSeconds() -> Double { Double(opq_monotonic_ns()) / 1e9 }

    /// A command's process group started (its leader is the daemon's child).
    func groupStarted(_ pgid: pid_t) { send(Int32(OPQ_WATCHDOG_ADD), pgid, 0) }

    /// A command's process group ended. Sent while its leader is still an unreaped zombie, so the group id
    /// cannot name another group before the watchdog has read this.
    func groupEnded(_ pgid: pid_t) { send(Int32(OPQ_WATCHDOG_REMOVE), pgid, 0) }

    /// "If you hear no newer deadline by `monotonicSeconds` (CLOCK_MONOTONIC, see `monotonicSeconds()`),
    /// SIGKILL every recorded group" — and every group started later, until a new deadline or nil comes.
    /// nil: no deadline. Each call replaces the previous one.
    public func setKillDeadline(monotonicSeconds: Double?) {
        let ns: Int64 = monotonicSeconds.map { $0 <= 0 ? 0 : $0 >= 9e9 ? Int64.max / 2 : Int64($0 * 1e9) } ?? -1
        send(Int32(OPQ_WATCHDOG_DEADLINE), 0, ns)
    }

    /// Closes the pipe: the watchdog kills every group still recorded and exits (what the daemon's own exit
    /// does; for tests, and for a daemon that would go on without one).
    public func close() {
        lock.withLock {
            if fd >= 0 { Glibc.close(fd) }
            fd = -1
        }
    }

    /// Why messages stopped reaching the watchdog, if they did.
    public var problem: String? { lock.withLock { failure } }

    private func send(_ type: Int32, _ pgid: pid_t, _ value: Int64) {
        let report: String? = lock.withLock {
            guard fd >= 0, failure == nil else { return nil }
            let rc = opq_watchdog_send(fd, type, pgid, value)
            guard rc != 0 else { return nil }
            failure = rc == -EAGAIN ? "its pipe is full (is it stopped?)" : rc == -EPIPE ? "it is gone" : String(cString: strerror(-rc))
            // SIGKILL before the pipe closes, so that it does not kill the groups it knows of on the way out.
            kill(pid, SIGKILL)
            Glibc.close(fd)
            fd = -1
            var status: Int32 = 0
            _ = retryingInterrupts { waitpid(pid, &status, 0) }
            return failure
        }
        if let report {
            Logger(label: "opqueued").warning("""
                the command watchdog (pid \(pid)) cannot be told of commands: \(report); \
                it was ended, and commands a crash leaves running are killed at the next start instead
                """)
        }
    }
}
