// The real daemon and its spool: hostile and huge inbox entries, the operation budget, ids and outbox names
// already taken, folders removed or replaced while it runs, a second daemon, a spool over two mounts.

import ControlPlane
import Foundation
import Testing
import TestSupport
@testable import Daemon

extension EndToEndTests {
    /// Issue 5.3/5.6: what a submitter can put in the inbox besides a manifest — a symlink to a file
    /// elsewhere, a hard link to one, a FIFO, a folder, a name that is not UTF-8, a very long name —
    /// gets an answer and leads nowhere outside the spool; the control socket answers owner and group only.
    @Test func hostileInboxEntriesAndTheSocketsMode() throws {
        let spool = TestSpool()
        let outside = spool.root + ".outside"
        try Data("secret".utf8).write(to: URL(fileURLWithPath: outside))
        defer { try? FileManager.default.removeItem(atPath: outside) }
        let inbox = spool.root + "/inbox/"
        #expect(symlink(outside, inbox + "link.plist") == 0)
        #expect(link(outside, inbox + "hard.plist") == 0)
        #expect(mkfifo(inbox + "fifo.plist", 0o644) == 0)
        #expect(mkdir(inbox + "folder.plist", 0o755) == 0)
        let raw: [UInt8] = Array("bad".utf8) + [0xFF, 0xFE] + Array(".plist".utf8)
        let manifest = plist(["operations": [sleepOp("a", 0)]])
        // The name with invalid bytes is made from the raw bytes (a Swift String cannot hold them).
        let rawPath = (Array(inbox.utf8) + raw + [0]).map { CChar(bitPattern: $0) }
        try manifest.write(to: URL(fileURLWithPath: spool.root + "/inbox/.raw"))
        #expect(rename(spool.root + "/inbox/.raw", rawPath) == 0)
        let long = String(repeating: "L", count: 240) + ".plist"
        try spool.drop(long, ["operations": [sleepOp("a", 0)]])
        try spool.start()
        try spool.drop("after.plist", ["job": "after", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("after", timeout: 10)?["status"] as? String == "succeeded", "a FIFO or a folder in the inbox blocks nothing")
        let renamed = try #require(spool.result("bad__", timeout: 10), "the non-UTF-8 name was renamed and claimed")
        #expect(renamed["manifest"] as? String == "bad__.plist")
        let longID = String(repeating: "L", count: 128)
        #expect(spool.result(longID, timeout: 10)?["status"] as? String == "succeeded", "a long name gives a job id cut to 128")
        usleep(300_000)
        let inboxNow = spool.list("inbox")
        #expect(inboxNow == ["fifo.plist", "folder.plist", "hard.plist", "link.plist"], "left alone: \(inboxNow)")
        #expect(try String(contentsOfFile: outside, encoding: .utf8) == "secret")
        let log = try String(contentsOfFile: spool.logPath, encoding: .utf8)
        for name in ["link.plist", "hard.plist", "fifo.plist", "folder.plist"] {
            #expect(log.contains("inbox/\(name) cannot be claimed"), "\(name) is logged")
        }
        // Each says what it is, not the errno O_NOFOLLOW or the type check gave ("Too many levels of symbolic links").
        #expect(log.contains("inbox/hard.plist: the file has 2 hard links: one linked elsewhere is not handed over"))
        #expect(log.contains("inbox/link.plist: a symbolic link, which is not followed (move or copy the file itself here)"))
        #expect(log.contains("inbox/fifo.plist: a FIFO (named pipe), not a regular file"))
        #expect(log.contains("inbox/folder.plist: a folder, not a regular file"))
        #expect(!log.contains("symbolic links") && !log.contains("Invalid argument"))
        // None of them waits for anything: status does not count them as waiting.
        let waiting = try ControlClient.request(spool.root + "/opqueued.sock", ["command": "status"], timeout: 2)["waiting"] as? Int
        #expect(waiting == 0, "status counts \(waiting ?? -1) waiting for \(inboxNow)")

        // The socket: mode 0660; another user is refused, a member of its group is answered.
        var st = stat()
        #expect(stat(spool.root + "/opqueued.sock", &st) == 0 && st.st_mode & 0o777 == 0o660)
        chmod(spool.root, 0o755)
        let ctl = binaries + "/opqueuectl"
        let stranger = try run("/usr/bin/setpriv",
                               ["--reuid=65534", "--regid=65534", "--clear-groups", ctl, "--spool", spool.root, "status"])
        #expect(stranger.status == 3, "another user: \(stranger.stderr)")
        #expect(stranger.stderr.contains("Permission denied"))
        let member = try run("/usr/bin/setpriv",
                             ["--reuid=65534", "--regid=\(st.st_gid)", "--clear-groups", ctl, "--spool", spool.root, "status"])
        #expect(member.status == 0, "the socket's group: \(member.stderr)")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
    }

    /// huge0 … huge7 (2 GiB each) rejected by their size, and the daemon's peak memory where it was.
    func expectHugeFilesRejectedUnread(_ spool: TestSpool, pid: Int32) {
        for i in 0..<8 {
            let result = spool.result("huge\(i)", timeout: 20)
            #expect(result?["status"] as? String == "rejected")
            #expect((result?["error"] as? String)?
                        .contains("the manifest is 2147483648 bytes; the limit is 268435456 bytes (256 MiB)") == true,
                    "\(result?["error"] ?? "no result")")
        }
        let peak = processMemoryMB(pid)
        #expect(peak > 0 && peak < 150, "peak RSS \(peak) MB")
    }

    /// Files far bigger than a manifest may be (sparse: 2 GiB each, costing no disk) are rejected by their size,
    /// which the error gives, without being read: eight of them at once leave the daemon's peak memory where it
    /// was (it read 256 MiB of each, and held several at once: 1.6 GB).
    @Test func anInboxOfHugeFilesIsRejectedWithoutReadingThem() throws {
        let spool = TestSpool()
        try spool.start()
        let pid = try #require(spool.daemon?.processIdentifier)
        let inbox = spool.root + "/inbox/"
        for i in 0..<8 {
            let hidden = inbox + ".huge\(i).plist"
            let fd = creat(hidden, 0o644)
            #expect(fd >= 0 && ftruncate(fd, 2 << 30) == 0)
            close(fd)  // a file still open for writing is left for its writer to finish
            #expect(rename(hidden, inbox + "huge\(i).plist") == 0)
        }
        expectHugeFilesRejectedUnread(spool, pid: pid)
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
    }

    /// The same files left in active/ by a crash between their claim and their rejection (what a kill -9 at that
    /// moment leaves: the folder, its record, the file renamed in) are rejected at recovery by their size, unread:
    /// recovery read 256 MiB of each and held them all at once.
    @Test func hugeFilesLeftInActiveByACrashAreRejectedUnreadAtRecovery() throws {
        let spool = TestSpool()
        try spool.start()
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        for i in 0..<8 {
            let dir = spool.root + "/active/huge\(i)"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            let record = try PropertyListSerialization.data(fromPropertyList: ["manifest": "huge\(i).plist", "receivedAt": 1.0e9],
                                                            format: .xml, options: 0)
            try record.write(to: URL(fileURLWithPath: dir + "/job.plist"))
            let fd = creat(dir + "/manifest.plist", 0o644)
            #expect(fd >= 0 && ftruncate(fd, 2 << 30) == 0)
            close(fd)
        }
        try spool.start()
        let pid = try #require(spool.daemon?.processIdentifier)
        expectHugeFilesRejectedUnread(spool, pid: pid)
        #expect(spool.list("active").isEmpty)
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
    }

    @Test func claimingPausesWhileTheActiveJobsHoldTheOperationBudget() throws {
        let spool = TestSpool()
        try spool.start(try spool.configure(["maxActiveOperations": 2]))
        for k in 0..<3 {
            try spool.drop("b\(k).plist", ["job": "b\(k)", "operations": [sleepOp("a", 0.3), sleepOp("b", 0.3, deps: ["a"])]])
        }
        usleep(300_000)
        let status = try ControlClient.request(spool.root + "/opqueued.sock", ["command": "status"], timeout: 5)
        #expect(status["operations"] as? Int == 2 && status["maxActiveOperations"] as? Int == 2, "\(status)")
        #expect((status["activeJobs"] as? [String])?.count == 1, "one job holds the whole budget")
        #expect(try spool.ctl(["status"]).stdout.contains("operations in active jobs: 2 of 2 (claiming paused until some end)"))
        // One after the other: each job is claimed only once the one before it has ended.
        let results = (0..<3).compactMap { spool.result("b\($0)") }
        #expect(results.count == 3 && results.allSatisfy { $0["status"] as? String == "succeeded" })
        let spans = results.compactMap { r -> (Double, Double)? in
            guard let received = r["receivedAt"] as? Double, let finished = r["finishedAt"] as? Double else { return nil }
            return (received, finished)
        }.sorted { $0.0 < $1.0 }
        #expect(spans.count == 3)
        for k in 1..<spans.count { #expect(spans[k].0 >= spans[k - 1].1, "job \(k) was claimed before the one before it ended") }
    }

    /// A manifest asking for the id of a job that is ending (its folder already renamed into outbox/ and taken away
    /// from there by the user, its end not yet announced) gets an id of its own and runs: it is never taken for the
    /// job that is ending (it was, and got no answer at all).
    @Test func aJobAskingForTheIdOfOneEndingRunsUnderItsOwnId() throws {
        let spool = TestSpool()
        try spool.start()
        let count = 400
        // A user who takes every answer away as soon as it is complete, as the fuzz campaign does.
        final class Answers: @unchecked Sendable { var manifests: [String] = []; var done = false; let lock = NSLock() }
        let answers = Answers()
        let outbox = spool.root + "/outbox"
        let reader = Thread {
            while !answers.lock.withLock({ answers.done }) {
                for entry in (try? FileManager.default.contentsOfDirectory(atPath: outbox)) ?? [] where !entry.hasPrefix(".") {
                    guard let data = FileManager.default.contents(atPath: outbox + "/" + entry + "/result.plist"),
                          let result = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any],
                          let manifest = result["manifest"] as? String else { continue }
                    answers.lock.withLock { answers.manifests.append(manifest) }
                    try? FileManager.default.removeItem(atPath: outbox + "/" + entry)
                }
                usleep(200)
            }
        }
        reader.start()
        defer { answers.lock.withLock { answers.done = true } }
        for k in 0..<count {
            let operations: [[String: Any]] = k % 2 == 0 ? [["id": "x", "kind": "teleport"]] : [sleepOp("a", 0)]
            try spool.drop("t\(k).plist", ["job": "twin", "operations": operations])
            usleep(UInt32.random(in: 0...2_000))
        }
        let deadline = Date().addingTimeInterval(60)
        while answers.lock.withLock({ answers.manifests.count }) < count && Date() < deadline { usleep(50_000) }
        usleep(200_000)
        let got = answers.lock.withLock { answers.manifests }
        #expect(got.count == count && Set(got) == Set((0..<count).map { "t\($0).plist" }),
                "\(got.count) answers for \(count) manifests; left in active/: \(spool.list("active"))")
        #expect(spool.list("active").isEmpty && spool.list("inbox").isEmpty)
    }

    /// A user makes outbox/<job> while that job runs: it is left as it is, the job's entry becomes outbox/<job>.1
    /// (said in the log), and the daemon goes on (it used to take the refused rename for a spool fault and pause
    /// claiming for good).
    @Test func anOutboxNameTakenWhileTheJobRunsIsLeftAloneAndTheJobPublishedBesideIt() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("x.plist", ["job": "x", "operations": [sleepOp("a", 0.6)]])
        let deadline = Date().addingTimeInterval(10)
        while !spool.list("active").contains("x") && Date() < deadline { usleep(10_000) }
        try FileManager.default.createDirectory(atPath: spool.root + "/outbox/x", withIntermediateDirectories: true)
        try Data("mine".utf8).write(to: URL(fileURLWithPath: spool.root + "/outbox/x/notes.txt"))
        let result = try #require(spool.result("x.1"))
        #expect(result["job"] as? String == "x" && result["status"] as? String == "succeeded")
        #expect(try String(contentsOfFile: spool.root + "/outbox/x/notes.txt", encoding: .utf8) == "mine")
        #expect(spool.list("outbox/x") == ["notes.txt"])
        let wait = try spool.ctl(["wait", "x", "--timeout", "5"])
        #expect(wait.status == 0 && wait.stdout == "x: succeeded\n", "\(wait)")
        #expect(try spool.ctl(["show", "x"]).stdout.hasPrefix("job x: succeeded"))
        try spool.drop("y.plist", ["job": "y", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("y")?["status"] as? String == "succeeded", "claiming goes on")
        let status = try spool.ctl(["status"]).stdout
        #expect(!status.contains("paused"), "\(status)")
        let log = (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? ""
        #expect(log.contains("outbox/x was taken by something else") && log.contains("the job's entry is \(spool.root)/outbox/x.1"))
    }

    /// An outbox entry whose result.plist cannot be read: `wait` and `show` say which file and why and exit 1 at
    /// once (they waited for ever, or said "unknown job"); a folder without a result is someone's own and is still
    /// waited past; a result bigger than any whole-file read is found by its top-level keys.
    @Test func anUnreadableResultIsSaidAndABigOneFound() throws {
        let spool = TestSpool()
        let outbox = spool.root + "/outbox"
        for name in ["bad", "mine", "big"] {
            try FileManager.default.createDirectory(atPath: outbox + "/" + name, withIntermediateDirectories: true)
        }
        try Data("<plist><dict><key>job</key>".utf8).write(to: URL(fileURLWithPath: outbox + "/bad/result.plist"))
        let started = Date()
        let wait = try spool.ctl(["wait", "bad", "--timeout", "20"])
        #expect(wait.status == 1 && Date().timeIntervalSince(started) < 10, "\(wait)")
        #expect(wait.stderr.contains("job 'bad' has ended, but its result cannot be read: \(outbox)/bad/result.plist"), "\(wait.stderr)")
        let show = try spool.ctl(["show", "bad"])
        #expect(show.status == 1 && show.stderr.contains("\(outbox)/bad/result.plist"), "\(show)")
        let mine = try spool.ctl(["wait", "mine", "--timeout", "0.5"])
        #expect(mine.status == 2, "a folder without a result is not an ended job: \(mine)")
        // 70 MB of metadata before the keys wait reads.
        let padding = String(repeating: "x", count: 70 << 20)
        let big = "<plist><dict><key>a</key><string>\(padding)</string><key>job</key><string>big</string>"
            + "<key>status</key><string>failed</string><key>finishedAt</key><real>1</real></dict></plist>"
        try Data(big.utf8).write(to: URL(fileURLWithPath: outbox + "/big/result.plist"))
        let found = try spool.ctl(["wait", "big", "--timeout", "20"])
        #expect(found.status == 1 && found.stdout == "big: failed\n", "\(found)")
    }

    /// A user removes active/<job> while the job runs: the job ends `failed`, saying why, in an outbox entry holding
    /// its manifest (from memory), and the daemon goes on (it used to wait for the folder for good, claiming paused).
    @Test func aJobWhoseFolderIsRemovedWhileItRunsEndsFailedAndTheDaemonGoesOn() throws {
        let spool = TestSpool()
        try spool.start()
        let manifest: [String: Any] = ["job": "gone", "operations": [sleepOp("a", 0.6)]]
        try spool.drop("gone.plist", manifest)
        let deadline = Date().addingTimeInterval(10)
        while !spool.list("active").contains("gone") && Date() < deadline { usleep(10_000) }
        usleep(100_000)
        try FileManager.default.removeItem(atPath: spool.root + "/active/gone")
        let result = try #require(spool.result("gone"))
        #expect(result["status"] as? String == "failed")
        #expect((result["error"] as? String ?? "").contains("active/gone was removed while the job ran"), "\(result)")
        let bytes = plist(manifest)
        #expect(FileManager.default.contents(atPath: spool.root + "/outbox/gone/manifest.plist") == bytes)
        try spool.drop("next.plist", ["job": "next", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("next")?["status"] as? String == "succeeded", "claiming goes on")
        let status = try spool.ctl(["status"]).stdout
        #expect(!status.contains("paused"), "\(status)")
    }

    /// A user removes the outbox, then the inbox, while the daemon runs: each is made again (a warning says so), the
    /// next manifests end in the outbox, and one dropped into the inbox made again is claimed (its watch added again).
    @Test func spoolFoldersRemovedWhileTheDaemonRunsAreMadeAgain() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("first.plist", ["job": "first", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("first") != nil)
        try FileManager.default.removeItem(atPath: spool.root + "/outbox")
        try spool.drop("second.plist", ["job": "second", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("second", timeout: 30)?["status"] as? String == "succeeded", "published once outbox/ is made again")

        try FileManager.default.removeItem(atPath: spool.root + "/inbox")
        let deadline = Date().addingTimeInterval(30)
        while !FileManager.default.fileExists(atPath: spool.root + "/inbox") && Date() < deadline { usleep(50_000) }
        #expect(FileManager.default.fileExists(atPath: spool.root + "/inbox"), "inbox/ made again")
        usleep(2_500_000)  // past a timer tick of the watcher, which watches the new folder from then on
        let dropped = Date()
        try spool.drop("third.plist", ["job": "third", "operations": [sleepOp("a", 0)]])
        let third = spool.result("third", timeout: 30)
        #expect(third?["status"] as? String == "succeeded")
        let claimedAfter = (third?["receivedAt"] as? Double ?? .infinity) - dropped.timeIntervalSince1970
        #expect(claimedAfter < 0.8, "claimed \(claimedAfter) s after the drop: by the watch, not by the next rescan (2 s)")
        let log = (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? ""
        #expect(log.contains("outbox/ was missing from the spool (removed while the daemon ran): made again"))
        #expect(log.contains("inbox/ was missing from the spool (removed while the daemon ran): made again"))
        let status = try spool.ctl(["status"]).stdout
        #expect(!status.contains("paused"), "\(status)")
    }

    /// A user replaces the inbox while the daemon runs — `mv inbox inbox.old; mkdir inbox`, or `rm -rf inbox; mkdir
    /// inbox` — and the new folder is watched at once: each manifest dropped into it is claimed by its inotify event,
    /// not by the next rescan (the watch stayed on the old folder, or on none, so every pickup waited up to 2 s, for
    /// as long as the daemon ran). What is dropped into the folder moved away is not the inbox's: never claimed.
    @Test func anInboxReplacedWhileTheDaemonRunsIsWatchedAtOnce() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("first.plist", ["job": "first", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("first") != nil)
        let inbox = spool.root + "/inbox"
        // Seconds from each drop to its claim, three drops in turn (a rescan every 2 s could catch one by chance,
        // not three: after a claim by a rescan, the next drop waits for the next).
        func pickups(_ tag: String) throws -> [Double] {
            try (0..<3).map { i in
                let job = "\(tag)\(i)"
                let dropped = Date().timeIntervalSince1970
                try spool.drop(job + ".plist", ["job": job, "operations": [sleepOp("a", 0)]])
                return (spool.result(job, timeout: 10)?["receivedAt"] as? Double ?? .infinity) - dropped
            }
        }
        #expect(rename(inbox, spool.root + "/inbox.old") == 0 && mkdir(inbox, 0o755) == 0)
        let moved = try pickups("moved")
        #expect(moved.allSatisfy { $0 < 0.8 }, "claimed \(moved) s after each drop into the inbox made after the old one was moved away")
        try FileManager.default.removeItem(atPath: inbox)
        #expect(mkdir(inbox, 0o755) == 0)
        let remade = try pickups("remade")
        #expect(remade.allSatisfy { $0 < 0.8 }, "claimed \(remade) s after each drop into the inbox removed and made again")
        try plist(["job": "stray", "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: spool.root + "/inbox.old/stray.plist"))
        usleep(2_500_000)  // past a rescan
        #expect(!FileManager.default.fileExists(atPath: spool.root + "/outbox/stray"))
        #expect(FileManager.default.fileExists(atPath: spool.root + "/inbox.old/stray.plist"))
    }

    /// A careless clean-up removes the control socket, then puts a file in its place: the daemon listens again
    /// within seconds, each time, and says so (it used to go on unreachable: opqueuectl said no daemon ran).
    @Test func aControlSocketRemovedWhileTheDaemonRunsIsMadeAgain() throws {
        let spool = TestSpool()
        try spool.start()
        let socket = spool.root + "/opqueued.sock"
        unlink(socket)
        #expect(try spool.ctl(["status"]).status == 3)
        #expect(eventually(10) { (try? spool.ctl(["status"]).status) == 0 }, "listening again")
        unlink(socket)
        try Data("x".utf8).write(to: URL(fileURLWithPath: socket))
        #expect(eventually(10) { (try? spool.ctl(["status"]).status) == 0 }, "a file in its place is replaced")
        // The line is logged just after the socket is listening again: a status may be answered before it is written.
        let log = { (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? "" }
        #expect(eventually(5) {
            log().components(separatedBy: "opqueued.sock was removed or replaced while the daemon ran: listening on it again").count == 3
        },
                "\(log())")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 20) == 0)
        #expect(!FileManager.default.fileExists(atPath: socket), "removed at stop")
    }

    /// active/ is the daemon's, but what someone put there by hand is not deleted at recovery: a manifest file (it
    /// belongs in inbox/) and a folder of someone's files without a manifest stay, each named in an error; the
    /// leftovers of a claim a crash interrupted (an empty folder, or one holding only its job.plist record) go.
    @Test func whatSomeoneLeftInActiveIsNotDeleted() throws {
        let spool = TestSpool()
        let active = spool.root + "/active"
        try FileManager.default.createDirectory(atPath: active + "/notes", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: active + "/interrupted", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: active + "/recorded", withIntermediateDirectories: true)
        try plist(["job": "misplaced", "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: active + "/misplaced.plist"))
        try Data("mine".utf8).write(to: URL(fileURLWithPath: active + "/notes/todo.txt"))
        try plist(["manifest": "recorded.plist", "receivedAt": 1.7e9]).write(to: URL(fileURLWithPath: active + "/recorded/job.plist"))
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(r.status == 0, "\(r)")
        #expect(r.stderr.contains("active/misplaced.plist is not a job folder (the daemon's are folders);"
                                  + " left in place — manifests go into inbox/"), "\(r.stderr)")
        #expect(r.stderr.contains("active/notes/ has no manifest.plist but holds todo.txt: not a job the daemon claimed; left in place"),
                "\(r.stderr)")
        #expect(FileManager.default.fileExists(atPath: active + "/misplaced.plist"))
        #expect((try? String(contentsOfFile: active + "/notes/todo.txt", encoding: .utf8)) == "mine")
        #expect(!FileManager.default.fileExists(atPath: active + "/interrupted")
                    && !FileManager.default.fileExists(atPath: active + "/recorded"))
        #expect(spool.list("outbox").isEmpty, "none of them was taken for a job")
    }

    /// One daemon per spool: a second one exits 1 saying so — also after a careless clean-up removed the lock file.
    @Test func aSecondDaemonOnTheSameSpoolIsRefusedEvenWithoutTheLockFile() throws {
        let spool = TestSpool()
        try spool.start()
        let second = try run("opqueued", ["--spool", spool.root, "--log-target", "console"], timeout: 20)
        #expect(second.status == 1 && (second.stdout + second.stderr).contains("another opqueued holds the lock on"), "\(second)")
        unlink(spool.root + "/opqueued.lock")
        let third = try run("opqueued", ["--spool", spool.root, "--log-target", "console"], timeout: 20)
        #expect(third.status == 1 && (third.stdout + third.stderr).contains("another opqueued holds the lock on \(spool.root)"), "\(third)")
        #expect(try spool.ctl(["status"]).status == 0, "the first one goes on")
    }

    /// An inbox that is a link to another file system: refused at start, saying which folders and why (every claim
    /// used to fail with EXDEV, pausing and resuming claims every few seconds for good).
    @Test func aSpoolSpreadOverTwoMountsIsRefusedAtStart() throws {
        let spool = TestSpool()
        let elsewhere = "/dev/shm/opq-test-inbox-\(UInt64.random(in: 1...UInt64.max))"
        try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: elsewhere) }
        try FileManager.default.removeItem(atPath: spool.root + "/inbox")
        #expect(symlink(elsewhere, spool.root + "/inbox") == 0)
        var a = stat(), b = stat()
        #expect(stat(elsewhere, &a) == 0 && stat(spool.root, &b) == 0 && a.st_dev != b.st_dev, "/dev/shm is another file system here")
        let r = try run("opqueued", ["--spool", spool.root, "--log-target", "console"], timeout: 20)
        #expect(r.status == 1)
        #expect((r.stdout + r.stderr).contains("inbox/ and active/ are on different mounts (a rename between them fails:"
                                               + " Invalid cross-device link); the whole spool must be on one mount"),
                "\(r)")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: elsewhere)) ?? ["?"]).isEmpty, "the check leaves nothing behind")
    }

    /// A stopped daemon is told apart from none: the client says no daemon answers (connected, no answer), not that
    /// none runs; once continued it answers.
    @Test func aStoppedDaemonIsNotCalledAbsent() throws {
        let spool = TestSpool()
        try spool.start()
        defer { spool.signal(SIGCONT) }
        #expect(spool.freeze(), "the daemon is stopped")
        let socket = spool.root + "/opqueued.sock"
        #expect {
            _ = try ControlClient.request(socket, ["command": "status"], timeout: 1)
        } throws: { error in
            "\(error)" == "no daemon answers on \(socket) (connected, but no answer within 1 s: is it stopped (SIGSTOP) or hung?)"
        }
        spool.signal(SIGCONT)
        #expect((try? ControlClient.request(socket, ["command": "status"], timeout: 5)) != nil)
    }

    /// While a spool fault pauses claiming (here a real ENOSPC: the spool's file system out of inodes), manifests that
    /// arrive are still counted: status's `waiting` and `opqueued_inbox_files` say how many wait, not what the last
    /// read before the fault saw; once the spool works again they are all claimed.
    @Test func manifestsArrivingWhileClaimingIsPausedByAFaultAreCounted() throws {
        let spool = TestSpool()
        #expect(try runProgram("/bin/mount", ["-t", "tmpfs", "-o", "size=16m,nr_inodes=512", "tmpfs", spool.root]).status == 0)
        defer { _ = try? runProgram("/bin/umount", ["-l", spool.root]) }
        try FileManager.default.createDirectory(atPath: spool.root + "/inbox", withIntermediateDirectories: true)
        // Written (hidden, so not yet manifests) while there are inodes; renaming them in takes none.
        let names = (0..<4).map { "full\($0)" }
        for name in names {
            try plist(["job": name, "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: spool.root + "/inbox/." + name))
        }
        try spool.start()
        let fillers = spool.root + "/fillers"
        _ = try fillWithEmptyFiles(fillers)
        #expect(errno == ENOSPC)
        func moveIn(_ name: String) { #expect(rename(spool.root + "/inbox/." + name, spool.root + "/inbox/" + name + ".plist") == 0) }
        func status() throws -> [String: Any] {
            try ControlClient.request(spool.root + "/opqueued.sock", ["command": "status"], timeout: 5)
        }
        moveIn(names[0])
        #expect(try eventually(10) { try status()["fault"] != nil }, "claiming the first one fails: the fault begins")
        for name in names.dropFirst() { moveIn(name) }
        // Counted by the reads made while paused (the watcher's, every 2 s at most).
        var waiting: Int?
        #expect(try eventually(10) {
            waiting = try status()["waiting"] as? Int
            return waiting == 4
        }, "waiting: \(waiting ?? -1)")
        let scrape = try Scrape.fromCtl(spool)
        #expect(scrape.value("opqueued_inbox_files") == 4 && scrape.value("opqueued_claiming_paused") == 1)
        #expect(spool.list("outbox").isEmpty && spool.list("inbox").count == 4)

        try FileManager.default.removeItem(atPath: fillers)
        for name in names { #expect(spool.result(name)?["status"] as? String == "succeeded", "\(name)") }
        #expect(try eventually(10) { try status()["waiting"] as? Int == 0 && status()["fault"] == nil })
    }
}
