// The operator's verbs through the real binaries (SPEC §1 list, retry, clean; §6 outbox.keepDays): ended jobs'
// folders are written straight into the outbox (an old finishedAt is what makes a job old) or made by a daemon;
// opqueuectl runs with or without one. The 100,000-job test asserts memory, never time (time is benchmarked:
// `opqueue-bench outbox`).

import Foundation
import Testing
import TestSupport
@testable import Daemon
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

extension TestSpool {
    var outbox: String { root + "/outbox" }

    /// `list --json` parsed: the jobs' objects in the order printed.
    func listJSON(_ extra: [String] = []) throws -> [[String: Any]] {
        let r = try ctl(["list", "--json"] + extra)
        #expect(r.status == 0, "\(r.stderr)")
        return try #require(try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [[String: Any]], "\(r.stdout)")
    }

    /// Waits until `path` exists (or, `gone`, no longer exists), at most `timeout` seconds.
    func waitFor(_ path: String, gone: Bool = false, timeout: Double = 20) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if (access(path, F_OK) == 0) != gone { return true }
            usleep(20_000)
        }
        return false
    }
}

@Suite(.serialized, .onItsOwnExecutor) struct OperatorVerbsTests {
    @Test func listNewestFirstWithFiltersAndBothOutputs() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.outbox, withIntermediateDirectories: true)
        try writeEndedJob(outbox: spool.outbox, job: "a", status: "succeeded", finishedAt: 1_000.5, durationSeconds: 1.25)
        try writeEndedJob(outbox: spool.outbox, job: "b", status: "failed", finishedAt: 3_000, node: "worker-1")
        try writeEndedJob(outbox: spool.outbox, job: "c", status: "cancelled", finishedAt: 2_000)
        try writeEndedJob(outbox: spool.outbox, job: "d", status: "rejected", finishedAt: 4_000, durationSeconds: nil)
        try FileManager.default.createDirectory(atPath: spool.outbox + "/someones", withIntermediateDirectories: true)

        // No daemon runs: list reads the outbox itself.
        let all = try spool.listJSON()
        #expect(all.map { $0["job"] as? String } == ["d", "b", "c", "a"])
        #expect(all[1]["node"] as? String == "worker-1" && all[1]["status"] as? String == "failed")
        #expect(all[1]["finishedAt"] as? Double == 3_000)
        #expect(all[3]["durationSeconds"] as? Double == 1.25 && all[3]["finishedAt"] as? Double == 1_000.5)
        #expect(all[0]["durationSeconds"] == nil && all[0]["node"] == nil)
        #expect(Set(all[1].keys) == ["job", "status", "node", "finishedAt", "durationSeconds"])
        #expect(try spool.listJSON(["--status", "failed"]).map { $0["job"] as? String } == ["b"])
        // --since: the forms of submit --at, compared with finishedAt (2,500 s after the epoch).
        for since in ["@2500", "1970-01-01T00:41:40Z", "1970-01-01T01:41:40+01:00", "1969-12-31T19:41:40-0500"] {
            #expect(try spool.listJSON(["--since", since]).map { $0["job"] as? String } == ["d", "b"], "\(since)")
        }
        #expect(try spool.listJSON(["--since", "@3000", "--status", "failed"]).count == 1, "--since includes its own instant")

        let text = try spool.ctl(["list"])
        #expect(text.status == 0)
        let lines = text.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 5 && lines[0].hasPrefix("JOB  STATUS     NODE      FINISHED") && lines[0].hasSuffix("DURATION"), "\(lines)")
        #expect(lines[2].contains("worker-1") && lines[4].hasSuffix("1.250s") && lines[1].hasSuffix("-"), "\(lines)")
        #expect(lines[1].firstMatch(of: /\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d\d:\d\d/) != nil, "local time with its offset: \(lines[1])")
        #expect(text.stderr.contains("outbox/someones/result.plist") && text.stderr.contains("not listed"), "\(text.stderr)")

        let unknown = try spool.ctl(["list", "--status", "done"])
        #expect(unknown.status == 1 && unknown.stderr.contains("unknown status 'done'"), "\(unknown.stderr)")
        let badTime = try spool.ctl(["list", "--since", "yesterday"])
        #expect(badTime.status == 1 && badTime.stderr.contains("'yesterday' is not a time"), "\(badTime.stderr)")
        #expect(try spool.ctl(["list", "--json", "--status", "failed", "--since", "@5000"]).stdout == "[]\n")
    }

    @Test func retryGivesTheNextIdAndTheDaemonRunsIt() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("r.plist", ["job": "r", "operations": [sleepOp("s", 0)]])
        try spool.drop("photo one.plist", ["operations": [sleepOp("s", 0)]])
        try spool.drop("bad.plist", ["job": "bad", "operations": [["id": "x", "kind": "teleport"]]])
        for job in ["r", "photo_one", "bad"] { #expect(spool.result(job) != nil, "\(job) ended") }

        let first = try spool.ctl(["retry", "r"])
        #expect(first.status == 0 && first.stdout == "r.1\n", "\(first.stdout)\(first.stderr)")
        let again = spool.result("r.1")
        #expect(again?["status"] as? String == "succeeded" && again?["requestedJob"] as? String == "r")
        // Retrying the retried job asks for `r` again: the next free id.
        #expect(try spool.ctl(["retry", "r.1"]).stdout == "r.2\n")
        // A manifest without `job` asks again for the id its file gave it.
        #expect(try spool.ctl(["retry", "photo_one"]).stdout == "photo_one.1\n")
        #expect(spool.result("photo_one.1")?["status"] as? String == "succeeded")

        // A job that has not ended, an unknown one, one whose manifest is still not valid.
        try spool.drop("long.plist", ["job": "long", "operations": [sleepOp("s", 30)]])
        #expect(spool.waitFor(spool.root + "/active/long"))
        let running = try spool.ctl(["retry", "long"])
        #expect(running.status == 1 && running.stderr.contains("job 'long' has not ended"), "\(running.stderr)")
        let unknown = try spool.ctl(["retry", "nope"])
        #expect(unknown.status == 1 && unknown.stderr.contains("unknown job 'nope'"), "\(unknown.stderr)")
        let invalid = try spool.ctl(["retry", "bad"])
        #expect(invalid.status == 1 && invalid.stderr.contains("job 'bad'") && invalid.stderr.contains("teleport"), "\(invalid.stderr)")
        #expect(try spool.ctl(["cancel", "long"]).status == 0)
        #expect(spool.result("long") != nil)

        // Without a daemon the id is the one the spool gives it now, and the next daemon gives it that id.
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        let offline = try spool.ctl(["retry", "r"])
        #expect(offline.status == 0 && offline.stdout == "r.3\n", "\(offline.stdout)\(offline.stderr)")
        #expect(spool.list("inbox") == ["r.plist"])
        try spool.start()
        #expect(spool.result("r.3")?["requestedJob"] as? String == "r")
    }

    /// A result.plist is a user's file: times no calendar holds are printed as numbers, never a trap.
    @Test func listAndCleanTakeTimesBeyondAnyCalendar() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.outbox, withIntermediateDirectories: true)
        try writeEndedJob(outbox: spool.outbox, job: "far", finishedAt: 1e20, durationSeconds: 1e19)
        try writeEndedJob(outbox: spool.outbox, job: "before", finishedAt: -1e20, durationSeconds: -5)
        try writeEndedJob(outbox: spool.outbox, job: "huge", finishedAt: 9.3e18, durationSeconds: 1)
        try writeEndedJob(outbox: spool.outbox, job: "now", finishedAt: Date().timeIntervalSince1970)
        let list = try spool.ctl(["list"])
        #expect(list.status == 0 && list.stdout.contains("1e+20") && list.stdout.contains("1e+19s"), "\(list.stdout)\(list.stderr)")
        #expect(list.stdout.split(separator: "\n").count == 5)
        let clean = try spool.ctl(["clean", "--older-than", "1"])
        #expect(clean.status == 0 && clean.stdout.hasSuffix("removed 1 ended job folder\n"), "\(clean.stdout)\(clean.stderr)")
        #expect(spool.list("outbox") == ["far", "huge", "now"])
    }

    /// A folder moved out of the outbox that cannot all be removed (an immutable file in it) is a failure: exit 1.
    @Test func cleanSaysWhatCouldNotBeRemoved() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.outbox, withIntermediateDirectories: true)
        try writeEndedJob(outbox: spool.outbox, job: "stuck", finishedAt: 1_000)
        try writeEndedJob(outbox: spool.outbox, job: "old", finishedAt: 1_000)
        let file = spool.outbox + "/stuck/kept"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        #expect(try runProgram("/usr/bin/chattr", ["+i", file]).status == 0, "chattr +i (root on ext4)")
        let clean = try spool.ctl(["clean", "--older-than", "1"])
        let inTmp = (try? FileManager.default.contentsOfDirectory(atPath: spool.root + "/tmp")) ?? []
        let left = inTmp.filter { $0.hasPrefix(".removing.") }
        for name in left { _ = try? runProgram("/usr/bin/chattr", ["-i", spool.root + "/tmp/" + name + "/kept"]) }
        #expect(clean.status == 1, "\(clean.stdout)\(clean.stderr)")
        #expect(clean.stdout.hasSuffix("removed 1 ended job folder; 1 could not be removed\n"), "\(clean.stdout)")
        #expect(clean.stderr.contains("outbox/stuck: moved to"), "\(clean.stderr)")
        #expect(clean.stderr.contains("not all of it could be removed"), "\(clean.stderr)")
        #expect(left.count == 1 && spool.list("outbox").isEmpty)
    }

    @Test func cleanRemovesExactlyTheOldOnes() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.outbox, withIntermediateDirectories: true)
        let now = Date().timeIntervalSince1970
        try writeEndedJob(outbox: spool.outbox, job: "ten-days", status: "succeeded", finishedAt: now - 10 * 86_400)
        try writeEndedJob(outbox: spool.outbox, job: "three-days", status: "failed", finishedAt: now - 3 * 86_400)
        try writeEndedJob(outbox: spool.outbox, job: "two-days-failed", status: "failed", finishedAt: now - 2.2 * 86_400)
        try writeEndedJob(outbox: spool.outbox, job: "hour", status: "succeeded", finishedAt: now - 3_600)
        try FileManager.default.createDirectory(atPath: spool.outbox + "/someones", withIntermediateDirectories: true)
        // By finishedAt, not by the folder's time: an old folder of a job that has just ended stays.
        var old = [timeval(tv_sec: Int(now) - 400 * 86_400, tv_usec: 0), timeval(tv_sec: Int(now) - 400 * 86_400, tv_usec: 0)]
        #expect(utimes(spool.outbox + "/hour", &old) == 0)

        let dry = try spool.ctl(["clean", "--older-than", "2", "--dry-run"])
        #expect(dry.status == 0 && dry.stdout.hasSuffix("would remove 3 ended job folders\n"), "\(dry.stdout)")
        #expect(dry.stdout.contains("would remove ten-days (succeeded, finished "))
        #expect(dry.stderr.contains("someones") && dry.stderr.contains("left alone"), "\(dry.stderr)")
        #expect(spool.list("outbox").count == 5, "a dry run removes nothing")

        let failed = try spool.ctl(["clean", "--older-than", "2.5", "--status", "failed"])
        #expect(failed.status == 0 && failed.stdout.hasSuffix("removed 1 ended job folder\n"), "\(failed.stdout)")
        #expect(spool.list("outbox") == ["hour", "someones", "ten-days", "two-days-failed"])
        let fractional = try spool.ctl(["clean", "--older-than", "0.5"])
        #expect(fractional.status == 0 && fractional.stdout.hasSuffix("removed 2 ended job folders\n"), "\(fractional.stdout)")
        #expect(spool.list("outbox") == ["hour", "someones"])
        #expect(spool.list("tmp").isEmpty && ((try? FileManager.default.contentsOfDirectory(atPath: spool.root + "/tmp")) ?? []).isEmpty)

        let unknown = try spool.ctl(["clean", "--older-than", "1", "--status", "finished"])
        #expect(unknown.status == 1 && unknown.stderr.contains("unknown status 'finished'"), "\(unknown.stderr)")
        let negative = try spool.ctl(["clean", "--older-than", "-1"])
        #expect(negative.status == 64 && negative.stderr.contains("--older-than must be 0 or more days, not -1.0"), "\(negative.stderr)")
        #expect(try spool.ctl(["clean"]).status == 64, "--older-than is required")
        // Usage errors a careless hand makes: no command at all, a negative or NaN timeout, a time past the bound.
        let nothing = try spool.ctl([])
        #expect(nothing.status == 64 && nothing.stderr.contains("SUBCOMMANDS"), "\(nothing)")
        #expect(try spool.ctl(["--help"]).status == 0)
        for bad in ["-5", "nan", "inf"] {
            let wait = try spool.ctl(["wait", "hour", "--timeout", bad])
            #expect(wait.status == 64 && wait.stderr.contains("--timeout must be 0 or more seconds"), "\(bad): \(wait.stderr)")
        }
        let far = try spool.ctl(["submit", "--at", "9999-12-31T00:00:00Z", "/dev/null"])
        #expect(far.status == 64 && far.stderr.contains("must be from 1970 to 5138"), "\(far.stderr)")
        let early = try spool.ctl(["submit", "--in", "-5", "/dev/null"])
        #expect(early.status == 64 && early.stderr.contains("--in: must be 0 or more and under 1e10 seconds, not -5.0"), "\(early.stderr)")
        #expect(spool.list("outbox") == ["hour", "someones"])
    }

    @Test func keepDaysRemovesOldFoldersAtStartAndLater() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.outbox, withIntermediateDirectories: true)
        let now = Date().timeIntervalSince1970
        for i in 0..<250 { try writeEndedJob(outbox: spool.outbox, job: "old\(i)", finishedAt: now - 86_400 - Double(i)) }
        try writeEndedJob(outbox: spool.outbox, job: "fresh", finishedAt: now)
        // keepDays = 0.0001: 8.64 s.
        let arguments = try spool.configure(["outbox": ["keepDays": 0.0001]])
        try spool.start(arguments)
        let deadline = Date().addingTimeInterval(10)
        while spool.list("outbox").contains(where: { $0.hasPrefix("old") }) && Date() < deadline { usleep(50_000) }
        #expect(spool.list("outbox").allSatisfy { !$0.hasPrefix("old") }, "every old folder went at start, in batches")
        #expect(spool.list("outbox").contains("fresh"))
        try spool.drop("ran.plist", ["job": "ran", "operations": [sleepOp("s", 0)]])
        #expect(spool.result("ran") != nil)
        // Then at least once a minute (here, as keepDays is short, within a second or so of their time).
        #expect(spool.waitFor(spool.outbox + "/fresh", gone: true, timeout: 20))
        #expect(spool.waitFor(spool.outbox + "/ran", gone: true, timeout: 20))
        #expect(spool.list("tmp").isEmpty)
        let log = (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? ""
        let lines = log.split(separator: "\n").filter { $0.contains("outbox: removed") }
        #expect(lines.first?.contains("removed 250 ended job folder(s) finished more than 0.0001 day(s) ago") == true, "\(lines)")
        #expect(lines.allSatisfy { $0.contains("OPQ_EVENT=daemon") && !$0.contains("OPQ_STATE") }, "\(lines)")
        try spool.expectServing("after the retention")
    }

    @Test func aBadKeepDaysIsRefusedNamingTheKey() throws {
        for bad: Any in [0, -2, "two"] {
            let spool = TestSpool()
            let arguments = try spool.configure(["outbox": ["keepDays": bad]])
            let r = try run("opqueued", ["--spool", spool.root, "--log-target", "console"] + arguments, timeout: 10)
            #expect(r.status == 1 && r.stderr.contains("outbox.keepDays: must be more than 0 days"), "\(bad): \(r.stderr)")
        }
    }

    /// 20,000 ended jobs (a tiny result each): list and clean stay within a bounded peak resident set. (100,000 take
    /// minutes of a debug build on a busy machine: `opqueue-bench outbox 100000` runs them, in a release build.)
    @Test func twentyThousandJobsInBoundedMemory() throws {
        let count = 20_000
        let spool = TestSpool()
        let now = Date().timeIntervalSince1970
        // Every other job finished 30 days ago, the rest an hour ago.
        try writeEndedJobs(outbox: spool.outbox, count: count, status: { $0 % 3 == 0 ? "failed" : "succeeded" },
                           finishedAt: { now - ($0 % 2 == 0 ? 30 * 86_400 : 3_600) - Double($0) })
        let ctl = binaries + "/opqueuectl"
        let list = try runMeasuringMemory(ctl, ["--spool", spool.root, "list"])
        #expect(list.status == 0 && list.stdout.utf8.reduce(0) { $1 == 0x0A ? $0 + 1 : $0 } == count + 1, "\(list.stderr)")
        let json = try runMeasuringMemory(ctl, ["--spool", spool.root, "list", "--json", "--status", "failed"])
        #expect(json.status == 0 && json.stdout.hasPrefix("[\n  {"))
        let dry = try runMeasuringMemory(ctl, ["--spool", spool.root, "clean", "--older-than", "7", "--dry-run"])
        #expect(dry.status == 0 && dry.stdout.hasSuffix("would remove \(count / 2) ended job folders\n"))
        let clean = try runMeasuringMemory(ctl, ["--spool", spool.root, "clean", "--older-than", "7"])
        #expect(clean.status == 0 && clean.stdout.hasSuffix("removed \(count / 2) ended job folders\n"), "\(clean.stderr)")
        #expect(spool.list("outbox").count == count / 2)
        for (what, run) in [("list", list), ("list --json", json), ("clean --dry-run", dry), ("clean", clean)] {
            print(String(format: "outbox of %d: %@ peak RSS %.1f MB in %.1f s", count, what, run.peakRSSMegabytes, run.seconds))
            #expect(run.peakRSSMegabytes < 150, "\(what): \(run.peakRSSMegabytes) MB")
        }
    }

    /// `submit` into an inbox whose file system is full fails, and leaves no hidden half-file there.
    @Test func submitIntoAFullInboxLeavesNothingBehind() throws {
        let spool = TestSpool()
        let inbox = spool.root + "/inbox"
        try FileManager.default.createDirectory(atPath: inbox, withIntermediateDirectories: true)
        try runTool(["/bin/mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", inbox])
        defer { try? runTool(["/bin/umount", "-l", inbox]) }
        let filler = inbox + "/.filler"
        let fd = open(filler, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
        let block = [UInt8](repeating: 0, count: 4096)
        while write(fd, block, block.count) > 0 {}
        close(fd)
        let manifest = spool.root + "-big.plist"
        try plist(["job": "big", "metadata": ["note": String(repeating: "x", count: 200_000)], "operations": [sleepOp("a", 0)]])
            .write(to: URL(fileURLWithPath: manifest))
        defer { unlink(manifest) }
        let submitted = try spool.ctl(["submit", manifest])
        #expect(submitted.status == 1, "\(submitted)")
        unlink(filler)
        let left = (try? FileManager.default.contentsOfDirectory(atPath: inbox)) ?? ["?"]
        #expect(left.isEmpty, "\(left)")
    }

    /// Outbox entries a hostile user planted: a manifest.plist that is a link (to a valid manifest elsewhere, so
    /// that only the link is refused), a folder that is a link, a plain file. retry and graph follow none; clean removes
    /// the planted links, never what they name.
    @Test func retryGraphAndCleanFollowNoLinkInTheOutbox() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.outbox, withIntermediateDirectories: true)
        let elsewhere = spool.root + "-elsewhere"
        try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: elsewhere) }
        let manifest = plist(["job": "x", "operations": [sleepOp("s", 0)]])
        try manifest.write(to: URL(fileURLWithPath: elsewhere + "/manifest.plist"))
        try writeEndedJob(outbox: spool.outbox, job: "linked", finishedAt: 1_000)
        #expect(symlink(elsewhere + "/manifest.plist", spool.outbox + "/linked/manifest.plist") == 0)
        try writeEndedJob(outbox: elsewhere, job: "folder", finishedAt: 1_000, manifest: manifest)
        #expect(symlink(elsewhere + "/folder", spool.outbox + "/folder") == 0)
        #expect(FileManager.default.createFile(atPath: spool.outbox + "/plain", contents: Data("x".utf8)))

        let linked = try spool.ctl(["retry", "linked"])
        #expect(linked.status == 1 && linked.stderr.contains("manifest.plist cannot be read")
                && linked.stderr.contains("symbolic link"), "\(linked.stderr)")
        for job in ["folder", "plain"] {
            let r = try spool.ctl(["retry", job])
            #expect(r.status == 1 && r.stderr.contains("unknown job '\(job)'"), "\(r.stderr)")
        }
        #expect(spool.list("inbox").isEmpty)
        // graph draws an ended job from its outbox manifest: not from the one the link names (operation "s").
        let graph = try spool.ctl(["graph", "linked"])
        #expect(graph.status == 1 && !graph.stdout.contains("\"s\""), "\(graph.stdout)\(graph.stderr)")
        let clean = try spool.ctl(["clean", "--older-than", "1"])
        #expect(clean.status == 0 && clean.stdout.hasSuffix("removed 1 ended job folder\n"), "\(clean.stdout)\(clean.stderr)")
        #expect(access(elsewhere + "/manifest.plist", F_OK) == 0 && access(elsewhere + "/folder/result.plist", F_OK) == 0)
        #expect(spool.list("outbox") == ["folder", "plain"])
    }
}
