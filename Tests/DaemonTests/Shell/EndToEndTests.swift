// End-to-end tests: the real opqueued and opqueuectl binaries on temporary spools (EndToEndFixtures.swift), real
// files, real signals. Here a run with --once, failures, cancels and retries in results, submit's validation, the
// daemon's control verbs and exit codes, and kill -9 at random moments; signals, the spool, the control socket and
// the journal are in the EndToEndTests+*.swift files beside it.

import ControlPlane
import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel
import TestTraits

@Suite(.serialized, .onItsOwnExecutor) struct EndToEndTests {
    @Test func onceRunsTheInboxAndEveryManifestEndsInTheOutbox() throws {
        let spool = TestSpool()
        try spool.drop("good.plist", ["job": "good", "metadata": ["owner": "ana", "n": 3],
                                      "operations": [sleepOp("a", 0.05),
                                                     ["id": "b", "kind": "spin", "seconds": 0.05, "dependencies": ["a"]]]])
        try spool.drop("bad.plist", ["operations": [["id": "x", "kind": "teleport"]], "extra": 1])
        try Data("not a plist".utf8).write(to: URL(fileURLWithPath: spool.root + "/inbox/junk.plist"))
        try Data("notes".utf8).write(to: URL(fileURLWithPath: spool.root + "/inbox/README.txt"))
        try spool.drop("zdup.plist", ["job": "good", "operations": [sleepOp("a", 0)]])
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(spool.list("outbox") == ["bad", "good", "good.1", "junk"])
        #expect(spool.list("inbox") == ["README.txt"], "other files are left alone")
        #expect(spool.list("active").isEmpty)
        #expect(spool.list("tmp").isEmpty)

        let good = try #require(spool.result("good"))
        #expect(good["status"] as? String == "succeeded")
        #expect(good["manifest"] as? String == "good.plist")
        #expect((good["metadata"] as? [String: Any])?["owner"] as? String == "ana")
        let ops = try #require(good["operations"] as? [[String: Any]])
        #expect(ops.map { $0["id"] as? String } == ["a", "b"])
        #expect(ops.allSatisfy { $0["state"] as? String == "succeeded" && $0["attempts"] as? Int == 1 && $0["startedAt"] is Double })
        for key in ["receivedAt", "startedAt", "finishedAt", "durationSeconds"] { #expect(good[key] is Double, "\(key)") }
        #expect(good["requestedJob"] == nil)
        let original = try Data(contentsOf: URL(fileURLWithPath: spool.root + "/outbox/good/manifest.plist"))
        #expect(Manifest.requestedJob(in: original) == "good", "the original bytes are kept")

        let dup = try #require(spool.result("good.1"))
        #expect(dup["requestedJob"] as? String == "good")

        let bad = try #require(spool.result("bad"))
        #expect(bad["status"] as? String == "rejected")
        let error = bad["error"] as? String ?? ""
        #expect(error.contains("unknown key 'extra'") && error.contains("operation 'x': unknown kind 'teleport'"), "\(error)")
        #expect(spool.result("junk")?["status"] as? String == "rejected")
        #expect(r.stderr.contains("inbox/README.txt is not a manifest"))
    }

    @Test func failureCancellationAndRetriesInResults() throws {
        let spool = TestSpool()
        try spool.drop("f.plist", ["job": "f", "operations": [
            ["id": "flaky", "kind": "fail", "message": "disk on fire", "retries": 2, "retryDelaySeconds": 0.05],
            sleepOp("after", 0, deps: ["flaky"]),
            ["id": "cleanup", "kind": "sleep", "seconds": 0, "dependencies": ["flaky"], "runsAfterFailure": true],
            ["id": "slow", "kind": "spin", "seconds": 5, "timeoutSeconds": 0.2],
        ]])
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(r.status == 0)
        let result = try #require(spool.result("f"))
        #expect(result["status"] as? String == "failed")
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops[0]["state"] as? String == "failed")
        #expect(ops[0]["attempts"] as? Int == 3)
        #expect(ops[0]["error"] as? String == "disk on fire")
        #expect((ops[0]["durationSeconds"] as? Double ?? 0) >= 0.15, "includes the retry delays 0.05 + 0.1")
        #expect(ops[1]["state"] as? String == "cancelled")
        #expect(ops[1]["attempts"] as? Int == 0)
        #expect(ops[1]["startedAt"] == nil)
        #expect(ops[2]["state"] as? String == "succeeded")
        #expect(ops[3]["error"] as? String == "timed out after 0.2 s")
        #expect(r.stderr.contains("OPQ_STATE=retrying"))
    }

    @Test func aJobCancelledWhileItIsBeingAcceptedEndsCancelled() throws {
        // A job is known from its claim on, but reading and submitting 100,000 operations takes a while:
        // a cancel in that window must be kept and applied, not answered "already ended" and forgotten.
        let spool = TestSpool()
        try spool.start()
        let operations = [sleepOp("gate", 60)] + (0..<100_000).map { sleepOp("s\($0)", 0, deps: ["gate"]) }
        try spool.drop("big.plist", ["job": "big", "operations": operations])
        var answer: [String: Any] = [:]
        // A liveness bound only: the claim comes 5-10 s after the drop in a debug build on a quiet machine, and took
        // over 30 s in CI beside the other suites.
        let deadline = Date().addingTimeInterval(180)
        repeat {
            answer = (try? ControlClient.request(spool.root + "/opqueued.sock", ["command": "cancel", "job": "big"], timeout: 5)) ?? [:]
        } while (answer["error"] as? String)?.hasPrefix("unknown job") != false && answer["exit"] as? Int != 0 && Date() < deadline
        let acceptedBefore = (try? String(contentsOfFile: spool.logPath, encoding: .utf8))?.contains("job big accepted") ?? true
        #expect(answer["exit"] as? Int == 0, "answered \(answer)")
        #expect(!acceptedBefore, "the cancel was meant to arrive while the job was being accepted")
        // A liveness bound only: a debug build takes 40-80 s here beside the other suites.
        let result = try #require(spool.result("big", timeout: 240))
        #expect(result["status"] as? String == "cancelled")
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops.count == 100_001)
        #expect(ops.allSatisfy { $0["state"] as? String == "cancelled" })
    }

    /// `opqueuectl submit` validates as the daemon will: a queue of the daemon's configuration is no typo though the
    /// command names no --config (it was refused as unknown); without a daemon, --config or the built-ins alone.
    @Test func submitValidatesAgainstWhatTheRunningDaemonTakes() throws {
        let spool = TestSpool()
        try spool.start(try spool.configure(["queues": ["procs": ["maxConcurrentOperationCount": 2]]]))
        let manifest = spool.root + "/m.plist"
        func write(_ job: String, queue: String) throws {
            try plist(["job": job, "operations": [["id": "a", "kind": "sleep", "seconds": 0, "queue": queue]]]).write(
                to: URL(fileURLWithPath: manifest))
        }
        try write("mine", queue: "procs")
        let submitted = try spool.ctl(["submit", manifest])
        #expect(submitted.status == 0 && submitted.stdout == "mine\n", "\(submitted.stdout)\(submitted.stderr)")
        #expect(try spool.ctl(["wait", "mine", "--timeout", "10"]).status == 0)
        try write("typo", queue: "prcs")
        let typo = try spool.ctl(["submit", manifest])
        #expect(typo.status == 1 && typo.stderr.contains("unknown queue 'prcs'") && typo.stdout.isEmpty, "\(typo)")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        try write("alone", queue: "procs")
        let alone = try spool.ctl(["submit", manifest])
        #expect(alone.status == 1 && alone.stderr.contains("unknown queue 'procs'"), "no daemon, no --config: the built-ins: \(alone)")
    }

    @Test func daemonControlAndExitCodes() throws {
        let spool = TestSpool()
        try spool.start()
        try expectWaitAndTheControlVerbs(spool)
        try expectSubmitAndValidate(spool)
        try expectManifestsWithoutJobAndStandardInput(spool)
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        try expectUsageWithoutADaemon(spool)
    }

    /// wait, status, show, cancel, suspend and graph on a running job, and their exit statuses.
    private func expectWaitAndTheControlVerbs(_ spool: TestSpool) throws {
        try spool.drop("long.plist", ["job": "long", "operations": [sleepOp("a", 30), sleepOp("b", 0, deps: ["a"])]])
        // Claimed first: a look while the manifest is still in the inbox would say so at the timeout.
        #expect(eventually(10) {
            (try? ControlClient.request(spool.socketPath, ["command": "show", "job": "long"], timeout: 5))?["exit"] as? Int == 0
        })
        let running = try spool.ctl(["wait", "long", "--timeout", "0.3"])
        #expect(running.status == 2)
        #expect(running.stderr == "opqueuectl: long: still not ended after 0.3 s\n")
        // An id nobody has seen is waited for too (it may be dropped later), but the timeout says it was never seen.
        let typo = try spool.ctl(["wait", "lnog", "--timeout", "0.3"])
        #expect(typo.status == 2)
        #expect(typo.stderr.contains("lnog: still not ended after 0.3 s (not seen yet: the daemon knows no job 'lnog'"), "\(typo.stderr)")
        // A manifest still being written is not claimed: the wait names the file it waits for.
        let writing = open(spool.root + "/inbox/later.plist", O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
        #expect(writing >= 0)
        let later = try spool.ctl(["wait", "later", "--timeout", "0.3"])
        #expect(later.stderr.contains("(not seen yet: inbox/later.plist waits to be claimed)"), "\(later.stderr)")
        close(writing)
        unlink(spool.root + "/inbox/later.plist")
        let status = try spool.ctl(["status", "--json"])
        #expect(status.status == 0)
        #expect(status.stdout.contains("\"long\""))
        #expect(try spool.ctl(["show", "long"]).stdout.contains("a  sleep  queue=default  executing"))
        #expect(try spool.ctl(["cancel", "long", "nosuch"]).status == 1)
        #expect(try spool.ctl(["cancel", "nosuch"]).status == 1)
        #expect(try spool.ctl(["suspend", "nosuch"]).status == 1)
        #expect(try spool.ctl(["frobnicate"]).status == 64)
        #expect(try spool.ctl(["cancel", "long"]).status == 0)
        let waited = try spool.ctl(["wait", "long", "--timeout", "10"])
        #expect(waited.status == 1)
        #expect(waited.stdout.contains("long: cancelled"))
        #expect(try spool.ctl(["cancel", "long"]).status == 1, "cancelling a job that has ended")
        #expect(try spool.ctl(["show", "long"]).stdout.contains("a  sleep  queue=default  cancelled"))
        #expect(try spool.ctl(["graph", "long"]).stdout.contains("\"a\" -> \"b\""))
    }

    /// submit validates, then places atomically; validate and submit say why a file cannot be a manifest.
    private func expectSubmitAndValidate(_ spool: TestSpool) throws {
        try spool.drop("ok.plist", ["job": "ok", "operations": [sleepOp("a", 0)]])
        #expect(try spool.ctl(["wait", "ok", "--timeout", "10"]).status == 0)
        // submit validates, then places atomically.
        let manifest = spool.root + "/m.plist"
        try plist(["job": "viactl", "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: manifest))
        let submitted = try spool.ctl(["submit", manifest])
        #expect(submitted.stdout == "viactl\n")
        #expect(try spool.ctl(["wait", "viactl", "--timeout", "10"]).status == 0)
        // Submitted again, the id it asks for is taken (outbox/viactl): submit prints the one the daemon gave, not the
        // one asked for (`wait viactl` answered at once, for the first job, while the second still ran).
        let resubmitted = try spool.ctl(["submit", manifest])
        #expect(resubmitted.status == 0 && resubmitted.stdout == "viactl.1\n", "\(resubmitted)")
        #expect(try spool.ctl(["wait", "viactl.1", "--timeout", "10"]).status == 0)
        try plist(["operations": [["id": "x"]]]).write(to: URL(fileURLWithPath: manifest))
        let invalid = try spool.ctl(["validate", manifest])
        #expect(invalid.status == 1)
        #expect(invalid.stdout == "\(manifest): operation 'x': kind is missing\n")
        // A file that cannot be a manifest says why, on stderr: stdout holds only the ids of what was submitted.
        let good = spool.root + "/good.plist"
        try plist(["job": "amidstrays", "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: good))
        let strays = try spool.ctl(["submit", spool.root + "/inbox", good, spool.root + "/nosuch.plist"])
        #expect(strays.status == 1)
        #expect(strays.stdout == "amidstrays\n", "\(strays.stdout)")
        #expect(strays.stderr == "\(spool.root)/inbox: cannot be read: a directory, not a manifest file\n"
                    + "\(spool.root)/nosuch.plist: cannot be read: No such file or directory\n",
                "\(strays.stderr)")
        #expect(try spool.ctl(["wait", "amidstrays", "--timeout", "10"]).status == 0)
    }

    /// Manifests without `job` and manifests read from standard input, submitted, validated and drawn.
    private func expectManifestsWithoutJobAndStandardInput(_ spool: TestSpool) throws {
        // A manifest without `job` gets the id its file's name gives, and submit prints that id: wait finds each.
        // Submitted again while the first is still known, it gets the next of `.1`, `.2`, as a file dropped by hand.
        let keyless = spool.root + "-no key.plist"
        try plist(["operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: keyless))
        defer { unlink(keyless) }
        let keylessID = (keyless as NSString).lastPathComponent
            .replacingOccurrences(of: " ", with: "_").replacingOccurrences(of: ".plist", with: "")
        let first = try spool.ctl(["submit", keyless])
        #expect(first.status == 0 && first.stdout == keylessID + "\n", "\(first)")
        #expect(try spool.ctl(["wait", keylessID, "--timeout", "10"]).status == 0)
        let second = try spool.ctl(["submit", keyless])
        let again = second.stdout.trimmingCharacters(in: .newlines)
        #expect(second.status == 0 && again == keylessID + ".1", "\(second)")
        #expect(try spool.ctl(["wait", again, "--timeout", "10"]).status == 0, "\(again)")
        // `-` is standard input (`generate | opqueuectl submit -`): read once; a manifest from it without `job` is
        // placed as stdin.plist. A pipe or device named by path is read too, never past the manifest limit.
        let piped = try spool.ctl(["submit", "-"], input: plist(["job": "piped", "operations": [sleepOp("a", 0)]]))
        #expect(piped.status == 0 && piped.stdout == "piped\n", "\(piped)")
        #expect(try spool.ctl(["wait", "piped", "--timeout", "10"]).status == 0)
        let unnamed = try spool.ctl(["submit", "-", "-"], input: plist(["operations": [sleepOp("a", 0)]]))
        #expect(unnamed.status == 1 && unnamed.stdout == "stdin\n", "\(unnamed)")
        #expect(unnamed.stderr == "-: cannot be read: standard input was read already (- may be named once)\n", "\(unnamed)")
        #expect(try spool.ctl(["wait", "stdin", "--timeout", "10"]).status == 0)
        let checked = try spool.ctl(["validate", "-"], input: plist(["operations": [["id": "x"]]]))
        #expect(checked.status == 1 && checked.stdout == "-: operation 'x': kind is missing\n", "\(checked)")
        let endless = try spool.ctl(["validate", "/dev/zero"])
        #expect(endless.status == 1 && endless.stdout.hasPrefix("/dev/zero: the manifest is larger than the limit"), "\(endless)")
        let drawn = try spool.ctl(["graph", "-"],
                                  input: plist(["job": "drawn", "operations": [sleepOp("a", 0), sleepOp("b", 0, deps: ["a"])]]))
        #expect(drawn.status == 0 && drawn.stdout.hasPrefix("digraph \"drawn\" {") && drawn.stdout.contains("\"a\" -> \"b\";"), "\(drawn)")
        // A keyless manifest's graph is named by its path, quoted for DOT whatever the path holds.
        let quoted = spool.root + "/say \"hi\".plist"
        try plist(["operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: quoted))
        let quotedGraph = try spool.ctl(["graph", quoted])
        #expect(quotedGraph.status == 0 && quotedGraph.stdout.hasPrefix("digraph \"\(spool.root)/say \\\"hi\\\".plist\" {"),
                "\(quotedGraph)")
    }

    /// With the daemon stopped: what status, wait and a mistyped --spool say, and ids no job can have.
    private func expectUsageWithoutADaemon(_ spool: TestSpool) throws {
        let stopped = try spool.ctl(["status"])
        #expect(stopped.status == 3 && stopped.stderr == "opqueuectl: no daemon is running on \(spool.root)/opqueued.sock (no socket)\n",
                "no daemon: \(stopped)")
        // A mistyped --spool says so, with the same exit status.
        for (wrong, why) in [(spool.root + "-typo", "there is no folder \(spool.root)-typo"),
                             ("/etc/passwd", "there is no folder /etc/passwd"),
                             (spool.root + "/inbox", "\(spool.root)/inbox is not a spool: it has no inbox/")] {
            let mistyped = try run("opqueuectl", ["--spool", wrong, "status"])
            let joiner = why.hasPrefix("there") ? ": " : ", and "
            #expect(mistyped.status == 3 && mistyped.stderr.contains("(no socket\(joiner)\(why); is --spool right?)"),
                    "\(wrong): \(mistyped)")
        }
        #expect(try spool.ctl(["frobnicate"]).status == 64, "usage errors whether or not a daemon runs")
        let alone = try spool.ctl(["wait", "lnog", "--timeout", "0.3"])
        #expect(alone.status == 2, "wait reads the outbox, with or without a daemon")
        #expect(alone.stderr.contains("(no daemon answers at \(spool.root)/opqueued.sock)"), "\(alone.stderr)")
        // An id no job can have is refused at once (without --timeout it was waited for for ever).
        for impossible in ["", "../../etc", "a b", ".hidden", String(repeating: "x", count: 129)] {
            let never = try spool.ctl(["wait", impossible])
            #expect(never.status == 1 && never.stderr.contains("cannot be a job's id"), "\(impossible.debugDescription): \(never)")
            #expect(never.stderr.contains("gets the id") == (impossible == "a b" || impossible.count == 129),
                    "\(impossible.debugDescription): \(never)")
        }
        // A manifest's file name given for its id: what id such a file gets, from the daemon's own rule.
        let named = try spool.ctl(["wait", "photo 1.plist"])
        #expect(named.status == 1 && named.stderr.hasSuffix("; a manifest file photo 1.plist without `job` gets the id 'photo_1'\n"),
                "\(named)")
        let plain = try spool.ctl(["wait", "inbox.plist", "--timeout", "0.2"])
        #expect(plain.status == 2 && plain.stderr.hasSuffix("; a manifest file inbox.plist without `job` gets the id 'inbox'\n"),
                "\(plain)")
    }

    @Test func killNineResumesWithoutRerunningWhatSucceeded() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("crash.plist", ["job": "crash", "operations": [sleepOp("first", 0.05), sleepOp("second", 2, deps: ["first"])]])
        // Wait until "first" has been recorded as succeeded.
        let progress = spool.root + "/active/.progress.log"
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline,
              !((try? String(contentsOfFile: progress, encoding: .utf8))?.hasPrefix("crash\tfirst\t") ?? false) { usleep(10_000) }
        let firstRecord = try String(contentsOfFile: progress, encoding: .utf8)
        spool.signal(SIGKILL)
        _ = spool.waitForExit()
        #expect(spool.list("active") == ["crash"])
        try spool.start()
        let result = try #require(spool.result("crash"))
        #expect(result["status"] as? String == "succeeded")
        let ops = try #require(result["operations"] as? [[String: Any]])
        let started = firstRecord.split(separator: "\t")[2]
        #expect(ops[0]["startedAt"] as? Double == micro(Double(started) ?? 0), "'first' kept its original run")
        #expect(ops[0]["attempts"] as? Int == 1)
        #expect(ops[1]["state"] as? String == "succeeded")
        #expect(spool.list("outbox") == ["crash"])
        #expect(spool.list("active").isEmpty)
        let log = try String(contentsOfFile: spool.logPath, encoding: .utf8)
        #expect(log.components(separatedBy: "OPQ_OPERATION=first OPQ_QOS=default OPQ_QUEUE=default OPQ_QUEUE_PRIORITY=normal"
                                   + " OPQ_STATE=executing").count == 2,
                "'first' ran once, before the crash")
    }

    /// An id given again (its earlier job published, the outbox entry removed) starts from nothing after a crash:
    /// the earlier job's lines, still in the progress log, are not the new job's.
    @Test func anIdGivenAgainDoesNotInheritTheEarlierJobsProgressAfterKillNine() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("once.plist", ["job": "again", "operations": [sleepOp("s", 0.05)]])
        #expect(spool.result("again")?["status"] as? String == "succeeded")
        // Its active folder goes a moment after its result appears; until then the id is taken and a new job given
        // it would be published as again.1 (the .1 rule).
        #expect(eventually(10) { !spool.list("active").contains("again") })
        try FileManager.default.removeItem(atPath: spool.root + "/outbox/again")
        try spool.drop("twice.plist", ["job": "again", "operations": [sleepOp("s", 1.5), sleepOp("t", 0, deps: ["s"])]])
        #expect(eventually(10) { (try? spool.ctl(["show", "again"]).stdout.contains("executing")) == true })
        spool.signal(SIGKILL)
        _ = spool.waitForExit()
        try spool.start()
        let result = try #require(spool.result("again", timeout: 20))
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(result["status"] as? String == "succeeded")
        let ran = (ops[0]["finishedAt"] as? Double ?? 0) - (ops[0]["startedAt"] as? Double ?? 0)
        #expect(ran >= 1.4, "'s' ran its 1.5 s after the restart, not taken for the earlier job's 0.05 s: \(ops[0])")
    }

    @Test func killNineAtRandomMomentsLosesAndDuplicatesNothing() throws {
        let spool = TestSpool()
        let jobs = 200
        for i in 0..<jobs {
            var ops: [[String: Any]] = [sleepOp("s", Double.random(in: 0...0.05))]
            ops.append(["id": "c", "kind": "spin", "seconds": 0.002, "dependencies": ["s"]])
            if i % 7 == 0 { ops.append(["id": "f", "kind": "fail", "dependencies": ["s"], "retries": 1, "retryDelaySeconds": 0.01]) }
            ops.append(["id": "end", "kind": "sleep", "seconds": 0, "dependencies": ["c"]])
            try spool.drop("job\(i).plist", ["job": "job\(i)", "operations": ops])
        }
        var kills = 0
        for _ in 0..<6 {
            try spool.start()
            usleep(UInt32.random(in: 50_000...400_000))
            spool.signal(SIGKILL)
            _ = spool.waitForExit()
            kills += 1
        }
        try spool.start()
        let deadline = Date().addingTimeInterval(120)
        while spool.list("outbox").count < jobs && Date() < deadline { usleep(50_000) }
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        let outbox = spool.list("outbox")
        #expect(outbox.count == jobs, "lost or duplicated: \(outbox.count) entries for \(jobs) jobs after \(kills) kills")
        #expect(Set(outbox) == Set((0..<jobs).map { "job\($0)" }), "no job renamed: each ended exactly once")
        #expect(spool.list("active").isEmpty)
        #expect(spool.list("tmp").isEmpty)
        #expect(spool.list("inbox").isEmpty)
        for i in 0..<jobs {
            let result = try #require(spool.result("job\(i)", timeout: 1))
            let ops = result["operations"] as? [[String: Any]] ?? []
            #expect(result["status"] as? String == (i % 7 == 0 ? "failed" : "succeeded"), "job\(i)")
            #expect(ops.count == (i % 7 == 0 ? 4 : 3))
            #expect(ops.allSatisfy { $0["state"] is String && $0["attempts"] is Int }, "job\(i)")
        }
    }
}
