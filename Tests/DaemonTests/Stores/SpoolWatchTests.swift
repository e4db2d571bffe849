// SpoolWatch: how long the spool keeps the daemon waiting — a commit under way counts from its start, the probe
// writes only while wanted, and nothing put in the probe's place can make the probe itself wait.

@testable import Daemon
import Foundation
import Testing
import TestSupport
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite("SpoolWatch", .onItsOwnExecutor)
struct SpoolWatchTests {
    private func spool() throws -> (Spool, String) {
        let root = NSTemporaryDirectory() + "opq-watch-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        return (try Spool(root: root), root)
    }

    @Test func aCommitUnderWayCountsFromItsStart() throws {
        let (spool, root) = try spool()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let watch = SpoolWatch(folders: spool.folders)
        #expect(watch.stalledSeconds() == 0)
        watch.commitBegan()
        usleep(200_000)
        #expect(watch.stalledSeconds() >= 0.2)
        watch.commitEnded()
        #expect(watch.stalledSeconds() == 0)
    }

    @Test func theProbeWritesOnlyWhileWanted() throws {
        let (spool, root) = try spool()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let watch = SpoolWatch(folders: spool.folders)
        let wanted = Locked(false)
        watch.startProbing(every: 0.02) { wanted.withLock { $0 } }
        defer { watch.stop() }
        usleep(200_000)
        #expect(!FileManager.default.fileExists(atPath: spool.tmp + "/.alive"), "an idle node writes nothing")
        wanted.withLock { $0 = true }
        #expect(pollUntil(2) { FileManager.default.fileExists(atPath: spool.tmp + "/.alive") ? true : nil } != nil)
        #expect(watch.stalledSeconds() < 1)
    }

    /// A FIFO in the probe's place (opened for writing, it would wait for a reader forever) or a symlink: the probe
    /// fails to open it and goes on; the spool is not taken for hung.
    @Test func nothingInTheProbesPlaceMakesItWait() throws {
        let (spool, root) = try spool()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let path = spool.tmp + "/.alive"
        #expect(mkfifo(path, 0o600) == 0)
        let watch = SpoolWatch(folders: spool.folders)
        watch.startProbing(every: 0.02) { true }
        defer { watch.stop() }
        usleep(500_000)
        #expect(watch.stalledSeconds() < 0.3, "stalled \(watch.stalledSeconds()) s on a FIFO")
        // The probe may make its file again between the unlink and the link: tried until the link is in place.
        #expect(pollUntil(5) { () -> Bool? in
            unlink(path)
            return symlink(root + "/elsewhere", path) == 0 ? true : nil
        } != nil)
        usleep(200_000)
        #expect(watch.stalledSeconds() < 0.3)
        #expect(!FileManager.default.fileExists(atPath: root + "/elsewhere"), "not written through the link")
    }
}
