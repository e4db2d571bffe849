// Supervisors started ahead of need (their side: Sources/opqueued-supervise/spare.c). A command's start is then one
// message to a process already running: the supervisor's exec and start, a third of a short command's path when
// commands run one after another, happen beside the command before instead of in front of this one.
//
// Spares are copies of a factory (a supervisor started once with `--factory`) rather than an exec each: in a virtual
// machine a static program's start costs ~0.7 ms of CPU (spare.c says why), more than the daemon's own work for a
// command; when the factory cannot make one, a spare is started with posix_spawn.
//
// Up to `target` spares wait. The factory is started on a thread of its own, at the daemon's own priority; after that,
// the command that takes a spare asks the factory for the next (one message) and takes in the answers that have come,
// so that a start wakes no other thread of the daemon. A spare takes on an operation's nice value, SCHED_IDLE and idle
// I/O class, which it may lower but not raise, so an operation of a higher priority than the daemon's (possible with
// CAP_SYS_NICE) is started directly. Spares are made only while commands
// start, and let go `idleSeconds` after the last start; one whose message does not fit, or that is gone, leaves the
// command to the direct start (ChildProcess.start). A spare runs only what its messages say, one command at a time:
// when a command has ended it says so on its socket and is given back, to wait for the next (no new process per
// command); the daemon's end of its socket closed (let go, or the daemon died) ends it.

import CShims
import Foundation
import SpoolFiles

#if canImport(Glibc)
import Glibc
#endif

/// A supervisor started for a command to come.
struct SpareSupervisor {
    let pid: pid_t
    let pidfd: Int32
    /// The daemon's end of its socket.
    let socket: Int32
    /// Bounds of its start time, in `CommandLedger.bootTicks()`: the command ledger's line when it is taken.
    let started: ClosedRange<UInt64>
    /// Its nice value: it can take on an operation's equal or higher (a lower priority), not a lower one.
    var nice: Int32
    /// Whether it runs in SCHED_IDLE (it took an idle operation's class): it serves idle operations only.
    var idleClass = false
    /// Whether the command watchdog was told of its group: from its first command until it is let go or dies, so that
    /// the commands it serves one after another cost the watchdog no message each.
    var watched = false
}

package final class SpareSupervisors: @unchecked Sendable {
    static let shared = SpareSupervisors()
    /// Spares kept waiting while commands start.
    static let target = 2
    /// Seconds after the last command's start when the spares are let go.
    static let idleSeconds = 5.0
    /// Arguments, environment and folder past this many bytes: the command is started directly (spare.c reads 128 KiB).
    static let messageLimit = 100_000
    /// Seconds the factory has to name a spare it was asked for; past them it is let go (and spares started directly).
    static let answerSeconds = 2
    /// Supervisors kept waiting at most, counting those given back after their command: past it one given back is let go.
    static let keptMost = 32

    private let condition = NSCondition()
    private var idle: [SpareSupervisor] = []
    /// When a command last asked for a spare (monotonic seconds); spares are made until `idleSeconds` after it.
    private var lastDemand = -Double.infinity
    /// The process that makes spares (spare.c), while there are any.
    private var factory: SpareSupervisor?
    /// Spares asked of the factory and not yet answered, oldest first (it answers in order): the daemon's end of each
    /// one's socket, and when it was asked (boot ticks for the ledger, monotonic seconds for the timeout).
    private var asked: [(socket: Int32, ticks: UInt64, at: Double)] = []
    /// For the spares' thread to let go: a factory found broken by a command's start (it may have to wait for answers),
    /// supervisors given back past `keptMost`.
    private var leaving: [SpareSupervisor] = []

    /// Starts the spares' thread: called at the daemon's start, so that it has the daemon's priority rather than that
    /// of the operation whose command would otherwise start it (threads inherit their creator's).
    package static func prepare() { _ = shared }

    private init() {
        let thread = Thread { [self] in keep() }
        thread.name = "opqueued.spares"
        thread.start()
    }

    /// Hands the command to a spare, and returns it (at the operation's priority now): the command's end comes as a
    /// message on its socket, after which the caller gives it back (`giveBack`); or its socket closes when it died.
    /// Nil when none is ready or the command does not fit a message (a spare is then made for the next one); the
    /// caller starts it directly.
    func start(argv: [String], environment: [String], directory: String?, stdout: Int32, stderr: Int32) -> SpareSupervisor? {
        guard Supervisor.path != nil else { return nil }
        let nice = opq_get_thread_nice(), idleClass = opq_thread_is_idle() != 0
        let strings = [String(nice), idleClass ? "1" : "0", directory ?? "", argv[0], String(argv.count)] + argv + environment
        var message: [UInt8] = []
        for string in strings {
            // A NUL inside a string would shift every string after it: such a command goes the direct way (which
            // cuts it there, as C does).
            if string.utf8.contains(0) { demand(); return nil }
            message += string.utf8
            message.append(0)
        }
        guard message.count <= Self.messageLimit else { demand(); return nil }
        while var spare = take(nice: nice, idleClass: idleClass) {
            let sent = message.withUnsafeBytes { opq_send_with_descriptors(spare.socket, $0.baseAddress, $0.count, stdout, stderr) }
            if sent == 0 {
                spare.nice = nice
                spare.idleClass = idleClass
                return spare
            }
            Self.letGo(spare)
        }
        return nil
    }

    /// A supervisor whose command has ended (it said so on its socket, its processes all gone) waits for the next one;
    /// past `keptMost` waiting, it is let go by the spares' thread.
    func giveBack(_ spare: SpareSupervisor) {
        condition.withLock {
            if idle.count < Self.keptMost {
                idle.append(spare)
            } else {
                leaving.append(spare)
                condition.signal()
            }
        }
    }

    /// Notes a command's start, takes in the factory's answers, takes a spare of at most `nice` if one waits (nil:
    /// none wanted), and asks the factory for the next. The spares' thread is woken only when it has work: no factory
    /// yet, or one to let go; a command's start otherwise costs no other thread a wake-up.
    private func take(nice: Int32?, idleClass: Bool = false) -> SpareSupervisor? {
        condition.lock()
        defer { condition.unlock() }
        lastDemand = Self.monotonicSeconds()
        collect(waiting: false)
        var spare: SpareSupervisor?
        if let nice, let index = idle.firstIndex(where: { $0.nice <= nice && (idleClass || !$0.idleClass) }) {
            spare = idle.remove(at: index)
        }
        if factory != nil { askFactory() }
        if factory == nil && idle.count < Self.target || !leaving.isEmpty { condition.signal() }
        return spare
    }

    /// A command started directly: spares are still wanted for the next ones.
    private func demand() { _ = take(nice: nil) }

    /// Under the lock, with a factory: asks it for spares up to `target`, counting those waiting and those asked.
    private func askFactory() {
        guard let maker = factory else { return }
        while idle.count + asked.count < Self.target {
            var ends: [Int32] = [-1, -1]
            guard opq_seqpacket_pair(&ends) == 0 else { return }
            let ticks = CommandLedger.bootTicks()
            let sent = [UInt8(ascii: "s")].withUnsafeBytes { opq_send_with_descriptors(maker.socket, $0.baseAddress, 1, ends[1], ends[1]) }
            close(ends[1])
            guard sent == 0 else {
                close(ends[0])
                breakFactory()
                return
            }
            asked.append((ends[0], ticks, Self.monotonicSeconds()))
        }
    }

    /// Under the lock: takes in the factory's answers, a spare each, in the order asked. `waiting`: for each one
    /// asked (the socket's timeout), as when the spares are let go; else only those already answered. A factory that
    /// closed its socket, sent nonsense or left one unanswered for `answerSeconds` is broken: let go, made again.
    private func collect(waiting: Bool) {
        guard let maker = factory else { return }
        while let first = asked.first {
            var answer = [UInt8](repeating: 0, count: 32)
            let got = answer.withUnsafeMutableBytes { recv(maker.socket, $0.baseAddress, $0.count, waiting ? 0 : Int32(MSG_DONTWAIT)) }
            if got < 0, errno == EAGAIN || errno == EWOULDBLOCK, !waiting {
                if Self.monotonicSeconds() - first.at > Double(Self.answerSeconds) { breakFactory() }
                return
            }
            asked.removeFirst()
            guard got > 0, let pid = pid_t(String(decoding: answer[0..<got], as: UTF8.self)), pid > 0 else {
                close(first.socket)
                breakFactory()
                return
            }
            let started = first.ticks...CommandLedger.bootTicks()
            if let spare = Self.adopt(pid, socket: first.socket, started: started, nice: maker.nice) { idle.append(spare) }
        }
    }

    /// Under the lock: the factory goes to the spares' thread to be let go; what it was asked is forgotten (a copy it
    /// made and did not name ends when its socket closes).
    private func breakFactory() {
        if let maker = factory { leaving.append(maker) }
        factory = nil
        for request in asked { close(request.socket) }
        asked = []
    }

    /// The spares' thread: makes the factory (or spares without one) while commands start, lets them go when they
    /// stop, and lets go a broken factory.
    private func keep() {
        condition.lock()
        while true {
            let quietFor = Self.monotonicSeconds() - lastDemand
            if !leaving.isEmpty {
                let gone = leaving
                leaving = []
                condition.unlock()
                for maker in gone { Self.letGo(maker) }
                condition.lock()
            } else if quietFor > Self.idleSeconds, !idle.isEmpty || factory != nil {
                collect(waiting: true)
                let gone = idle + (factory.map { [$0] } ?? [])
                idle = []
                factory = nil
                condition.unlock()
                for spare in gone { Self.letGo(spare) }
                condition.lock()
            } else if quietFor <= Self.idleSeconds, factory == nil, idle.count < Self.target {
                condition.unlock()
                let maker = Self.spawn(Supervisor.spareArgv(factory: true))
                // Without a factory, a spare started itself.
                let spare = maker == nil ? Self.spawn(Supervisor.spareArgv(factory: false)) : nil
                condition.lock()
                factory = maker
                if let spare { idle.append(spare) }
                askFactory()
                if maker == nil && spare == nil { _ = condition.wait(until: Date(timeIntervalSinceNow: 1)) }
            } else {
                let wake = idle.isEmpty && factory == nil ? 3_600 : Self.idleSeconds - quietFor + 0.01
                _ = condition.wait(until: Date(timeIntervalSinceNow: wake))
            }
        }
    }

    /// Starts a spare, or the factory, with posix_spawn.
    private static func spawn(_ argv: [String]) -> SpareSupervisor? {
        var ends: [Int32] = [-1, -1]
        guard opq_seqpacket_pair(&ends) == 0 else { return nil }
        var pid: pid_t = -1, pidfd: Int32 = -1
        let from = CommandLedger.bootTicks()
        let rc = withCStrings(argv) { opq_spawn_spare(argv[0], $0, ends[1], &pid, &pidfd) }
        let to = CommandLedger.bootTicks()
        close(ends[1])
        guard rc == 0 else {
            close(ends[0])
            return nil
        }
        // For waiting on the factory's answers (`collect`): a factory that does not answer in time is let go.
        var timeout = timeval(tv_sec: Self.answerSeconds, tv_usec: 0)
        _ = setsockopt(ends[0], SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return SpareSupervisor(pid: pid, pidfd: pidfd, socket: ends[0], started: from...to, nice: opq_get_thread_nice())
    }

    /// A copy the factory made and named: this process's child (spare.c), held by its pidfd, at the factory's nice
    /// value. Nil if it is gone.
    private static func adopt(_ pid: pid_t, socket: Int32, started: ClosedRange<UInt64>, nice: Int32) -> SpareSupervisor? {
        let pidfd = opq_pidfd_open(pid)
        guard pidfd >= 0 else {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            close(socket)
            return nil
        }
        return SpareSupervisor(pid: pid, pidfd: pidfd, socket: socket, started: started, nice: nice)
    }

    /// Ends a spare that is not running a command, and reaps it (the watchdog told first, while it cannot be reaped).
    private static func letGo(_ spare: SpareSupervisor) {
        close(spare.socket)
        kill(spare.pid, SIGKILL)
        if spare.watched { CommandWatchdog.current?.groupEnded(spare.pid) }
        var status: Int32 = 0
        while waitpid(spare.pid, &status, 0) < 0 && errno == EINTR {}
        close(spare.pidfd)
    }

    /// The spares waiting now (for tests).
    var waiting: [pid_t] { condition.withLock { idle.map(\.pid) } }

    private static func monotonicSeconds() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }
}
