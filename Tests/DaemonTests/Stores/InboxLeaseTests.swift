// Manifests written in place: the daemon claims a file only once no one has it open for writing (a read
// lease, Spool.claim), and at once when it is closed (inotify's close event). Real daemon, real files.

import ControlPlane
import Foundation
import SpoolFiles
import TestSupport
import Testing
@testable import Daemon
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized, .onItsOwnExecutor) struct InboxLeaseTests {
    /// Waits until `condition` holds (polling every 20 ms); the seconds it took, or nil.
    func waitFor(_ seconds: Double, _ condition: () -> Bool) -> Double? {
        let start = Date()
        while Date().timeIntervalSince(start) < seconds {
            if condition() { return Date().timeIntervalSince(start) }
            usleep(20_000)
        }
        return nil
    }

    /// Writes `bytes` to `fd` whole.
    func put(_ fd: Int32, _ bytes: Data) {
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        #expect(written == bytes.count)
    }

    /// Holds `path` open for writing for `seconds`, checking all along that the daemon left it alone.
    func expectUnclaimed(_ spool: TestSpool, _ name: String, job: String, for seconds: Double) {
        let until = Date().addingTimeInterval(seconds)
        while Date() < until {
            usleep(250_000)
            #expect(FileManager.default.fileExists(atPath: spool.root + "/inbox/" + name),
                    "inbox/\(name) was claimed while open for writing")
            #expect(!FileManager.default.fileExists(atPath: spool.root + "/outbox/" + job),
                    "\(job) was published while its manifest was open for writing")
            if !FileManager.default.fileExists(atPath: spool.root + "/inbox/" + name) { return }
        }
    }

    @Test func aManifestHeldOpenHalfWrittenIsClaimedOnlyOnceClosed() throws {
        let spool = TestSpool()
        try spool.start()
        let manifest = plist(["job": "inplace", "operations": [sleepOp("a", 0.01)]])
        let name = "inplace.plist", path = spool.root + "/inbox/" + name
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        #expect(fd >= 0)
        put(fd, manifest.prefix(manifest.count / 2))
        // Half a manifest for 5 s, unchanged (the one-second mtime rule would have claimed it by now).
        expectUnclaimed(spool, name, job: "inplace", for: 5)
        put(fd, manifest.suffix(from: manifest.count / 2))
        close(fd)
        let took = waitFor(10) { !FileManager.default.fileExists(atPath: path) }
        let seconds = try #require(took, "claimed once closed")
        #expect(seconds < 1.5, "claimed at once when closed (took \(seconds) s)")
        let result = try #require(spool.result("inplace"))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        let log = (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? ""
        #expect(!log.contains("no read lease"), "the daemon's own user's files are leased")
    }

    @Test func aFileOpenForWritingWithNothingWrittenIsLeftAlone() throws {
        let spool = TestSpool()
        try spool.start()
        let name = "empty.plist", path = spool.root + "/inbox/" + name
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        #expect(fd >= 0)
        expectUnclaimed(spool, name, job: "empty", for: 3)
        // Written whole only now, then closed: the whole manifest is claimed.
        put(fd, plist(["job": "empty", "operations": [sleepOp("a", 0.01)]]))
        close(fd)
        let took = waitFor(10) { !FileManager.default.fileExists(atPath: path) }
        let seconds = try #require(took, "claimed once closed")
        #expect(seconds < 1.5, "claimed at once when closed (took \(seconds) s)")
        let result = try #require(spool.result("empty"))
        #expect(result["status"] as? String == "succeeded", "\(result)")
    }

    /// `--once` takes what the inbox holds at start: a manifest still open for writing then is waited for (it ran
    /// as if absent, and `--once` exited 0 without it, when a test's writer descriptor was held a moment by a child
    /// another thread forked), for at most `onceWriterWaitSeconds`; past that it is left in the inbox, and said so.
    @Test func aOnceRunWaitsForAManifestStillBeingWrittenThenLeavesOneNeverClosed() throws {
        let spool = TestSpool()
        var fds: [String: Int32] = [:]
        for name in ["late", "stuck"] {
            let fd = open(spool.root + "/inbox/\(name).plist", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
            #expect(fd >= 0)
            put(fd, plist(["job": name, "operations": [sleepOp("a", 0.01)]]))
            fds[name] = fd
        }
        try spool.drop("plain.plist", ["job": "plain", "operations": [sleepOp("a", 0.01)]])
        let late = fds["late"] ?? -1
        DispatchQueue.global().asyncAfter(deadline: .now() + 1.5) { close(late) }
        let started = Date()
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"], timeout: 60)
        let seconds = Date().timeIntervalSince(started)
        close(fds["stuck"] ?? -1)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(spool.result("plain", timeout: 1)?["status"] as? String == "succeeded")
        #expect(spool.result("late", timeout: 1)?["status"] as? String == "succeeded", "closed 1.5 s after the start: run")
        #expect(spool.result("stuck", timeout: 1) == nil)
        #expect(FileManager.default.fileExists(atPath: spool.root + "/inbox/stuck.plist"), "never closed: left in the inbox")
        let wait = Daemon.onceWriterWaitSeconds
        #expect(r.stderr.contains("inbox/stuck.plist is still open for writing after \(Int(wait)) s: "
                                  + "left in the inbox for the next run (--once)"), "\(r.stderr)")
        #expect(seconds >= wait && seconds < wait + 20, "waited for the writer, then ended (\(seconds) s)")
    }
}

@Suite(.serialized, .onItsOwnExecutor) struct InboxLeaseFallbackTests {
    /// Without CAP_LEASE and for a file another user owns, no lease can be had: the daemon says so once,
    /// and falls back to inotify's close event (and the mtime rule).
    @Test func withoutCapLeaseAClosedFileIsStillClaimedAndTheFallbackIsLoggedOnce() throws {
        let spool = TestSpool()
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = ["--bounding-set=-lease", "--inh-caps=-lease", binaries + "/opqueued",
                             "--spool", spool.root, "--log-target", "console"]
        _ = FileManager.default.createFile(atPath: spool.logPath, contents: nil)
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: spool.logPath))
        process.standardError = log
        process.standardOutput = log
        try process.run()
        spool.daemon = process
        let ready = InboxLeaseTests().waitFor(20) {
            (try? ControlClient.request(spool.root + "/opqueued.sock", ["command": "status"], timeout: 1)) != nil
        }
        #expect(ready != nil, "the daemon started")
        for name in ["first", "second"] {
            let path = spool.root + "/inbox/\(name).plist"
            let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
            #expect(fd >= 0)
            #expect(fchown(fd, 4321, 4321) == 0, "the file is another user's")
            InboxLeaseTests().put(fd, plist(["job": name, "operations": [sleepOp("a", 0.01)]]))
            close(fd)
            let took = InboxLeaseTests().waitFor(10) { !FileManager.default.fileExists(atPath: path) }
            #expect(took.map { $0 < 1.5 } == true, "claimed at once on its close event (took \(took.map { "\($0)" } ?? "forever") s)")
            #expect(spool.result(name)?["status"] as? String == "succeeded")
        }
        let text = (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? ""
        #expect(occurrences(of: "no read lease could be taken on inbox/first.plist: Permission denied", in: text) == 1,
                "\(text.suffix(2000))")
        #expect(occurrences(of: "no read lease could be taken", in: text) == 1, "logged once")
    }
}

/// Reading a folder's entries: glibc packs readdir(3)'s entries at their record length, so the last one of its
/// buffer may end right before an unmapped page. The spool reads a name through its pointer, only its bytes: an
/// entry placed at the very end of a page followed by an inaccessible one reads back (reading the whole
/// `struct dirent`, 280 bytes, as the inbox scan once did, faults — it crashed a node scanning a flooded inbox).
@Suite(.onItsOwnExecutor) struct DirectoryEntryTests {
    @Test func anEntryEndingAtAnUnmappedPageIsReadByItsNameOnly() throws {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let memory = try #require(mmap(nil, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))
        #expect(memory != MAP_FAILED)
        defer { munmap(memory, 2 * page) }
        #expect(mprotect(memory + page, page, PROT_NONE) == 0)
        // A record as getdents64 lays it out: d_ino, d_off, d_reclen, d_type, then the name and its NUL, the
        // whole rounded up to 8 bytes — here ending exactly at the guard page.
        let name = Array("x.plist".utf8)
        let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name) ?? 19
        let length = (nameOffset + name.count + 1 + 7) / 8 * 8
        let record = memory + page - length
        record.storeBytes(of: UInt16(length), toByteOffset: MemoryLayout<dirent>.offset(of: \dirent.d_reclen) ?? 16, as: UInt16.self)
        for (k, byte) in (name + [0]).enumerated() { record.storeBytes(of: byte, toByteOffset: nameOffset + k, as: UInt8.self) }
        let entry = record.assumingMemoryBound(to: dirent.self)
        #expect(direntName(entry) == name)
    }
}
