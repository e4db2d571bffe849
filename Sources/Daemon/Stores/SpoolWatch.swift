// SpoolWatch: how long the spool has kept the daemon waiting.
//
// A file system that hangs (frozen by fsfreeze for a snapshot, an NFS server gone, a disk failing slowly) returns
// no error: every write and every sync just waits. For one node alone that is a pause. A cluster node would go on
// renewing its lease from its own thread for jobs it can neither finish nor publish, and no other node would ever
// take them. So the spool's waits are watched: the committer says when each commit starts and ends, and a probe on
// a thread of its own rewrites one byte of tmp/.alive every second while the node has jobs (an idle node writes
// nothing). `stalledSeconds` is how long the oldest of the two still under way has waited (0 when neither is); past
// a bound a cluster node stops renewing its lease (ClusterJobStore), so that its jobs run elsewhere and it records
// nothing for them when its spool comes back.
//
// An error is an answer: a full or read-only file system is a spool fault, met where it happens (Daemon+Ends).

import Foundation
import Synchronization
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

final class SpoolWatch: Sendable {
    private struct State {
        var commitSince: Double?
        var probeSince: Double?
        var probing = false
        var stopped = false
    }

    private let state = Mutex(State())
    private let probePath: String

    init(folders: SpoolFolders) {
        probePath = folders.tmp + "/.alive"
    }

    func commitBegan() { state.withLock { $0.commitSince = monotonicSeconds() } }
    func commitEnded() { state.withLock { $0.commitSince = nil } }

    /// How long the oldest spool step still under way has waited, in seconds (0: none is).
    func stalledSeconds() -> Double {
        let now = monotonicSeconds()
        return state.withLock { s in [s.commitSince, s.probeSince].compactMap { $0.map { now - $0 } }.max() ?? 0 }
    }

    /// Starts the probe's thread (once): every `interval` while `wanted()` (an idle node writes nothing). A probe
    /// stuck in the kernel stays there until the file system answers; the thread ends at the first look after `stop`.
    func startProbing(every interval: Double = 1, while wanted: @escaping @Sendable () -> Bool) {
        let start = state.withLock { s -> Bool in
            defer { s.probing = true }
            return !s.probing && !s.stopped
        }
        guard start else { return }
        let thread = Thread { [self] in
            while !state.withLock({ $0.stopped }) {
                if wanted() {
                    state.withLock { $0.probeSince = monotonicSeconds() }
                    touch()
                    state.withLock { $0.probeSince = nil }
                }
                Thread.sleep(forTimeInterval: interval)
            }
        }
        thread.name = "opqueued.spool-watch"
        thread.start()
    }

    func stop() { state.withLock { $0.stopped = true } }

    /// One byte rewritten: a write the file system must accept (no sync: the committer's commit is watched itself).
    /// Never a wait of its own: not through a symlink, and a FIFO put there fails to open (ENXIO) instead of
    /// blocking for a reader.
    private func touch() {
        let fd = open(probePath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0o600)
        guard fd >= 0 else { return }
        var byte: UInt8 = 0x0a
        _ = write(fd, &byte, 1)
        close(fd)
    }
}
