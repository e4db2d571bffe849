// The processes a bench starts that run until told to stop (daemons, engine runs in a process of their own) end with
// the bench when it is interrupted or terminated (SIGINT, SIGTERM, SIGHUP): a bench stopped by Ctrl-C or `timeout`
// used to leave its daemons running, holding CPU and spools for the next run to trip over. SIGKILL cannot be caught.

import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

enum Children {
    private static let lock = NSLock()
    nonisolated(unsafe) private static var started: [Process] = []
    nonisolated(unsafe) private static var stopping = false
    /// The write end of the pipe the signal handler writes the signal's number to.
    nonisolated(unsafe) private static var wakeWrite: Int32 = -1

    /// Whether the bench is stopping on a signal: what the main thread measures meanwhile is not printed.
    static var isStopping: Bool { lock.withLock { stopping } }

    /// `process`, just started, is ended with the bench if the bench is stopped by a signal.
    static func track(_ process: Process) {
        let late = lock.withLock { () -> Bool in
            started.removeAll { !$0.isRunning }
            started.append(process)
            return stopping
        }
        // Started while the bench stops (its main thread went on when the process before ended): ended at once.
        if late { kill(process.processIdentifier, SIGKILL) }
    }

    /// From then on SIGINT, SIGTERM and SIGHUP end every tracked process still running (SIGTERM, then SIGKILL after
    /// 5 s), remove the run's leftovers, and exit 128 + the signal's number. A handler, not SIG_IGN and a dispatch
    /// source: an ignored signal stays ignored in the children Process starts, and `terminate()` would not stop them.
    static func endWithTheBench() {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { return }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        wakeWrite = ends[1]
        for number in [SIGINT, SIGTERM, SIGHUP] {
            _ = signal(number) { caught in
                var byte = UInt8(truncatingIfNeeded: caught)
                _ = write(Children.wakeWrite, &byte, 1)
            }
        }
        let readEnd = ends[0]
        Thread.detachNewThread {
            var byte: UInt8 = 0
            while read(readEnd, &byte, 1) != 1 {}
            stop(signal: Int32(byte))
        }
    }

    private static func stop(signal number: Int32) {
        let running = lock.withLock { () -> [Process] in
            stopping = true
            return started.filter(\.isRunning)
        }
        for process in running { kill(process.processIdentifier, SIGTERM) }
        _ = pollUntil(5) { running.contains(where: \.isRunning) ? nil : true }
        for process in running where process.isRunning { kill(process.processIdentifier, SIGKILL) }
        Leftovers.shared.removeAll()
        let said = "opqueue-bench: stopped by signal \(number); \(running.count) process(es) it started ended\n"
        FileHandle.standardError.write(Data(said.utf8))
        exit(128 + number)
    }
}
