// Flow control (SPEC §3.7) through the real binaries: later (notBefore, delaySeconds) and once (ifJobExists = skip)
// on the file spool.

import Foundation
import Testing
@testable import Daemon
import TestTraits

@Suite(.serialized, .onItsOwnExecutor) struct FlowControlTests {
    func delayed(_ job: String, _ key: String, _ value: Any, ops: [[String: Any]] = [sleepOp("a", 0.05)]) -> [String: Any] {
        ["job": job, key: value, "operations": ops]
    }

    func log(_ spool: TestSpool) -> String { (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? "" }

    @Test func aDelayedJobWaitsWithoutASlotAndStartsOnTime() throws {
        let spool = TestSpool()
        // One job slot: a delayed job must not hold it.
        try spool.start(spool.configure(["maxActiveJobs": 1]))
        let dropped = Date().timeIntervalSince1970
        try spool.drop("later.plist", delayed("later", "delaySeconds", 2.0))
        try spool.drop("now.plist", ["job": "now", "operations": [sleepOp("a", 0.05)]])
        let now = try #require(spool.result("now", timeout: 5), "the undelayed job ran while the delayed one waited")
        #expect(now["status"] as? String == "succeeded")
        #expect(spool.list("outbox") == ["now"])
        let status = try spool.ctl(["status", "--json"])
        let object = try #require(JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        let jobs = try #require(object["jobs"] as? [[String: Any]])
        let notBefore = try #require(jobs.first { $0["job"] as? String == "later" }?["notBefore"] as? Double)
        #expect(abs(notBefore - (dropped + 2)) < 1, "status says until when")
        let shown = try spool.ctl(["show", "later", "--json"])
        #expect(shown.stdout.contains("\"status\" : \"delayed\""), "\(shown.stdout)")
        let later = try #require(spool.result("later", timeout: 10))
        #expect(later["status"] as? String == "succeeded")
        let ops = try #require(later["operations"] as? [[String: Any]])
        let started = try #require(ops[0]["startedAt"] as? Double)
        #expect(started >= notBefore - 0.01, "not started before its time")
        #expect(started < notBefore + 1.5, "started on time")
        let text = log(spool)
        #expect(text.contains("OPQ_JOB=later OPQ_NOT_BEFORE=") && text.contains("OPQ_STATE=delayed"))
        #expect(text.components(separatedBy: "OPQ_JOB=later OPQ_STATE=accepted").count == 2, "accepted logged once")
    }

    @Test func aDelayedJobSurvivesAStopAndAKillNine() throws {
        let spool = TestSpool()
        try spool.start()
        let at = (Date().timeIntervalSince1970 + 4).rounded(.up)
        try spool.drop("dated.plist", delayed("dated", "notBefore", Date(timeIntervalSince1970: at)))
        try spool.drop("secs.plist", delayed("secs", "notBefore", at))
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline, !log(spool).contains("OPQ_JOB=secs OPQ_NOT_BEFORE") { usleep(20_000) }
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 5) == 0, "a stop does not wait for delayed jobs")
        #expect(spool.list("active") == ["dated", "secs"])
        try spool.start()
        spool.signal(SIGKILL)
        _ = spool.waitForExit()
        try spool.start()
        for job in ["dated", "secs"] {
            let result = try #require(spool.result(job, timeout: 10))
            #expect(result["status"] as? String == "succeeded")
            let started = try #require((result["operations"] as? [[String: Any]])?.first?["startedAt"] as? Double)
            #expect(started >= at - 0.01, "\(job) waited for its time through the restarts")
        }
        #expect(spool.list("active").isEmpty)
    }

    @Test func aCancelEndsADelayedJobAtOnceAndItsTimeoutCountsFromNotBefore() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("far.plist", delayed("far", "delaySeconds", 3600.0, ops: [sleepOp("a", 1), sleepOp("b", 1, deps: ["a"])]))
        try spool.drop("timed.plist", ["job": "timed", "delaySeconds": 2.0, "timeoutSeconds": 1.5, "operations": [sleepOp("a", 0.5)]])
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline, !log(spool).contains("OPQ_JOB=far OPQ_NOT_BEFORE") { usleep(20_000) }
        let cancel = try spool.ctl(["cancel", "far"])
        #expect(cancel.status == 0, "\(cancel.stderr)")
        let far = try #require(spool.result("far", timeout: 5))
        #expect(far["status"] as? String == "cancelled")
        let ops = try #require(far["operations"] as? [[String: Any]])
        #expect(ops.map { $0["state"] as? String } == ["cancelled", "cancelled"])
        #expect(ops.map { $0["attempts"] as? Int } == [0, 0])
        #expect(try spool.ctl(["cancel", "far"]).status == 1, "an ended job cannot be cancelled again")
        let timed = try #require(spool.result("timed", timeout: 10))
        #expect(timed["status"] as? String == "succeeded", "1.5 s from its notBefore, not from its receipt, is enough")
    }

    @Test func badFlowControlKeysAreManifestProblems() throws {
        let spool = TestSpool()
        let cases: [(String, [String: Any], String)] = [
            ("both", ["notBefore": 1.0, "delaySeconds": 1.0], "notBefore and delaySeconds: give one or the other"),
            ("negative", ["delaySeconds": -1.0], "delaySeconds: must be a number of seconds from 0 to 1e10"),
            ("far", ["notBefore": Date(timeIntervalSince1970: 2e11)], "notBefore: must be a date from 1970 to 5138"),
            ("text", ["notBefore": "tomorrow"], "notBefore: must be a date"),
            ("exists", ["ifJobExists": "overwrite"], "ifJobExists: must be 'rename' or 'skip'"),
            ("trace", ["traceparent": "00-abc"], "traceparent: must be a W3C trace context"),
        ]
        for (job, keys, problem) in cases {
            var manifest: [String: Any] = ["job": job, "operations": [sleepOp("a", 0)]]
            manifest.merge(keys) { $1 }
            try spool.drop(job + ".plist", manifest)
            let validate = try spool.ctl(["validate", spool.root + "/inbox/" + job + ".plist"])
            #expect(validate.status == 1 && validate.stdout.contains(problem), "\(job): \(validate.stdout)")
        }
        try spool.start()
        for (job, _, problem) in cases {
            let result = try #require(spool.result(job))
            #expect(result["status"] as? String == "rejected")
            #expect((result["error"] as? String)?.contains(problem) == true, "\(job): \(result["error"] ?? "")")
        }
    }

    @Test func skipMakesSubmissionIdempotentOnTheJobId() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("first.plist", ["job": "once", "ifJobExists": "skip", "operations": [sleepOp("a", 1.5)]])
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline, !log(spool).contains("OPQ_JOB=once OPQ_KIND=sleep OPQ_OPERATION=a") { usleep(20_000) }
        // Held in active/: skipped; without skip, renamed.
        try spool.drop("second.plist", ["job": "once", "ifJobExists": "skip", "operations": [sleepOp("a", 0)]])
        try spool.drop("renamed.plist", ["job": "once", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("once.1") != nil)
        #expect(spool.result("once") != nil)
        // Held in outbox/: skipped.
        try spool.drop("third.plist", ["job": "once", "ifJobExists": "skip", "operations": [sleepOp("a", 0)]])
        let settled = Date().addingTimeInterval(5)
        while Date() < settled, !spool.list("inbox").isEmpty { usleep(20_000) }
        usleep(300_000)
        #expect(spool.list("outbox") == ["once", "once.1"], "no job and no outbox folder for a skipped manifest")
        #expect(spool.list("inbox").isEmpty, "the skipped manifests are removed")
        let text = log(spool)
        for name in ["second.plist", "third.plist"] {
            #expect(text.contains("OPQ_JOB=once OPQ_MANIFEST=\(name) OPQ_STATE=skipped"), "\(name) logged as skipped")
        }
        // A free id is taken as usual.
        try spool.drop("fresh.plist", ["job": "fresh", "ifJobExists": "skip", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("fresh")?["status"] as? String == "succeeded")
    }
}

extension FlowControlTests {
    /// Start times from every result.plist under outbox/, sorted.
    func starts(_ spool: TestSpool, jobs: [String]) -> [Double] {
        jobs.flatMap { job in
            (spool.result(job, timeout: 0.1)?["operations"] as? [[String: Any]] ?? []).compactMap { $0["startedAt"] as? Double }
        }.sorted()
    }

    /// The most starts any window of `seconds` holds (each start taken as a window's first).
    func busiestWindow(_ starts: [Double], seconds: Double) -> Int {
        var most = 0, j = 0
        for i in starts.indices {
            while j < starts.count && starts[j] < starts[i] + seconds { j += 1 }
            most = max(most, j - i)
        }
        return most
    }

    @Test func aQueuesRateHoldsInEveryWindowOverAMinuteOfLoad() throws {
        let spool = TestSpool()
        try spool.start(spool.configure(["queues": ["rated": ["rateLimit": ["operations": 5, "seconds": 2.0]]]]))
        // 40 jobs of 4 operations, far more than the rate lets start in a minute: the queue is never idle.
        let jobs = (0..<40).map { "r\($0)" }
        for job in jobs {
            let ops: [[String: Any]] = (0..<4).map { ["id": "o\($0)", "kind": "sleep", "seconds": 0.0, "queue": "rated"] }
            try spool.drop(job + ".plist", ["job": job, "operations": ops])
        }
        // A queue held back by its rate says when it may start again.
        var nextStart: Double?
        let deadline = Date().addingTimeInterval(10)
        while nextStart == nil, Date() < deadline {
            let status = try spool.ctl(["status", "--json"])
            let object = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
            let rated = (object?["queues"] as? [[String: Any]])?.first { $0["name"] as? String == "rated" }
            nextStart = rated?["nextStartAt"] as? Double
            if nextStart == nil { usleep(50_000) }
        }
        #expect(nextStart.map { $0 > Date().timeIntervalSince1970 - 1 } == true, "status shows the queue's next free start")
        usleep(60_000_000)
        spool.signal(SIGTERM)
        _ = spool.waitForExit()
        let times = starts(spool, jobs: jobs)
        #expect(times.count >= 120, "the rate was used, not starved: \(times.count) starts in a minute")
        #expect(busiestWindow(times, seconds: 2) <= 5, "no window of 2 s holds more than 5 starts")
        // Held back by the rate is ready, not failed: nothing failed.
        let log = log(spool)
        #expect(!log.contains("OPQ_STATE=failed"))
    }

    @Test func aBadRateIsRefusedNamingTheQueueAndTheValue() throws {
        let spool = TestSpool()
        let arguments = try spool.configure(["queues": ["rated": ["rateLimit": ["operations": 0, "seconds": 2.0]]]])
        let run = try run("opqueued", ["--spool", spool.root, "--log-target", "console"] + arguments, timeout: 10)
        #expect(run.status == 1)
        #expect(run.stderr.contains("queues.rated.rateLimit.operations: must be a positive integer"), "\(run.stderr)")
    }
}

extension FlowControlTests {
    @Test func submitSetsTheTimeAndTheRuleOfAManifest() throws {
        let spool = TestSpool()
        try spool.start()
        let file = spool.root + ".m.plist"
        defer { try? FileManager.default.removeItem(atPath: file) }
        try plist(["job": "sub", "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: file))
        let before = Date().timeIntervalSince1970
        let submitted = try spool.ctl(["submit", "--in", "2", file])
        #expect(submitted.status == 0 && submitted.stdout == "sub\n", "\(submitted.stdout)\(submitted.stderr)")
        let deadline = Date().addingTimeInterval(5)
        var shown = ""
        while Date() < deadline, !shown.contains("delayed") { shown = try spool.ctl(["show", "sub"]).stdout; usleep(50_000) }
        #expect(shown.contains("job sub: delayed until "), "\(shown)")
        #expect(try spool.ctl(["status"]).stdout.contains("delayed until"))
        let result = try #require(spool.result("sub", timeout: 10))
        let started = try #require((result["operations"] as? [[String: Any]])?.first?["startedAt"] as? Double)
        #expect(started >= before + 2 - 0.01)
        // The id is held now: skip prints it and exits 0, making no job.
        let skipped = try spool.ctl(["submit", "--if-exists", "skip", file])
        #expect(skipped.status == 0 && skipped.stdout == "sub\n", "\(skipped.stdout)\(skipped.stderr)")
        let at = Int(Date().timeIntervalSince1970) + 1
        let dated = try spool.ctl(["submit", "--at", "@\(at)", file])
        #expect(dated.status == 0 && dated.stdout == "sub.1\n", "\(dated.stdout)\(dated.stderr)")
        let renamed = try #require(spool.result("sub.1", timeout: 10))
        let startedAt = try #require((renamed["operations"] as? [[String: Any]])?.first?["startedAt"] as? Double)
        #expect(startedAt >= Double(at) - 0.01)
        #expect(spool.list("outbox") == ["sub", "sub.1"])
        #expect(try spool.ctl(["submit", "--at", "@1", "--in", "1", file]).status == 64)
        #expect(try spool.ctl(["submit", "--at", "tomorrow", file]).status == 64)
        #expect(try spool.ctl(["submit", "--if-exists", "overwrite", file]).status == 64)
    }
}

/// A delayed job runs on with what it was accepted with (opqueued(8), SIGHUP): a queue or command removed from the
/// configuration meanwhile, by a reload or across a restart, does not reject it when its time comes.
extension FlowControlTests {
    /// Its operations: a sleep on `batch`, a sleep, and the command `hi`.
    func removedAll(_ job: String) -> [String: Any] {
        delayed(job, "delaySeconds", 3.0, ops: [["id": "q", "kind": "sleep", "seconds": 0.05, "queue": "batch"], sleepOp("s", 0.05),
                                                ["id": "c", "kind": "command", "command": "hi", "arguments": [String: String]()]])
    }

    func configureBatchAndHi(_ spool: TestSpool) throws -> [String] {
        try spool.configure(["queues": ["batch": ["maxConcurrentOperationCount": 2]], "commands": ["hi": ["argv": ["/bin/echo", "hi"]]]])
    }

    /// The job ran: its queue's operation succeeded (on the queue kept until its operations end, or on `default`
    /// after a restart), and only the command's failed, naming it.
    func expectRanWithoutHi(_ spool: TestSpool, _ job: String) throws {
        let result = try #require(spool.result(job, timeout: 15))
        #expect(result["status"] as? String == "failed", "\(result)")
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops.map { $0["state"] as? String } == ["succeeded", "succeeded", "failed"], "\(ops)")
        let error = ops.last?["error"] as? String ?? ""
        #expect(error.contains("command 'hi' was removed from the configuration"), "\(error)")
        #expect(!log(spool).contains("OPQ_JOB=\(job) OPQ_STATE=rejected"), "an accepted job is never rejected")
    }

    func waitDelayed(_ spool: TestSpool, _ job: String) {
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline, !log(spool).contains("OPQ_JOB=\(job) OPQ_NOT_BEFORE") { usleep(20_000) }
    }

    @Test func aDelayedJobRunsOnAfterAReloadRemovedItsQueueAndCommand() throws {
        let spool = TestSpool()
        try spool.start(configureBatchAndHi(spool))
        try spool.drop("gone.plist", removedAll("gone"))
        waitDelayed(spool, "gone")
        try spool.configure([:])
        spool.signal(SIGHUP)
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline, log(spool).components(separatedBy: "OPQ_STATE=ready").count < 3 { usleep(20_000) }
        // New manifests are read against the reloaded configuration.
        try spool.drop("new.plist", ["job": "new", "operations": [["id": "q", "kind": "sleep", "seconds": 0.0, "queue": "batch"]]])
        #expect(spool.result("new")?["status"] as? String == "rejected")
        try expectRanWithoutHi(spool, "gone")
    }

    @Test func aDelayedJobRunsOnAfterARestartWithoutItsQueueAndCommand() throws {
        let spool = TestSpool()
        try spool.start(configureBatchAndHi(spool))
        try spool.drop("gone.plist", removedAll("gone"))
        waitDelayed(spool, "gone")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 5) == 0)
        try spool.start(spool.configure([:]))
        try expectRanWithoutHi(spool, "gone")
    }
}

/// A job resumed at a restart keeps what had succeeded (SPEC §2): a command operation that succeeded before is not
/// checked against the configuration again, so one whose command the new start's configuration lacks is neither run
/// again nor failed for it, and hands its kept output file on; the operations after it run.
extension FlowControlTests {
    /// `first` notes its run in `${log}` and writes its output file; `second` notes its run with the input it was given.
    func firstAndSecond(_ spool: TestSpool, keepFirst: Bool) throws -> [String] {
        let first: [String: Any] = ["argv": ["/bin/sh", "-c", "echo first >> \"$1\"; echo handed > \"$2\"", "sh", "${log}", "${output}"],
                                    "parameters": ["log": "string"], "output": "file"]
        let second: [String: Any] = ["argv": ["/bin/sh", "-c", "echo \"second $(cat \"$2\")\" >> \"$1\"", "sh", "${log}", "${input}"],
                                     "parameters": ["log": "string"]]
        let commands = keepFirst ? ["first": first, "second": second] : ["second": second]
        return try spool.configure(["shutdownGraceSeconds": 0.5, "commands": commands])
    }

    @Test(arguments: [SIGKILL, SIGTERM])
    func aCommandThatSucceededBeforeARestartWithoutItStaysSucceeded(_ sig: Int32) throws {
        let spool = TestSpool()
        let runs = spool.root + ".runs"
        defer { unlink(runs) }
        func ran() -> [String] { ((try? String(contentsOfFile: runs, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init) }
        try spool.start(firstAndSecond(spool, keepFirst: true))
        // The stop comes while `wait` sleeps (a sleep outlasts the grace; a command would be killed and fail).
        try spool.drop("chain.plist", ["job": "chain", "operations": [
            ["id": "one", "kind": "command", "command": "first", "arguments": ["log": runs]], sleepOp("wait", 2, deps: ["one"]),
            ["id": "two", "kind": "command", "command": "second", "arguments": ["log": runs], "dependencies": ["wait"], "input": "one"]]])
        let progress = spool.root + "/active/.progress.log"
        #expect(eventually(10) { ((try? String(contentsOfFile: progress, encoding: .utf8)) ?? "").contains("chain\tone\t") })
        spool.signal(sig)
        _ = spool.waitForExit(timeout: 15)
        #expect(spool.list("active") == ["chain"], "the job had not ended at the stop")
        try spool.start(firstAndSecond(spool, keepFirst: false))
        let result = try #require(spool.result("chain", timeout: 20))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops.map { $0["state"] as? String } == ["succeeded", "succeeded", "succeeded"], "\(ops)")
        #expect(ran() == ["first", "second handed"], "'one' ran once; 'two' was given its output")
        #expect(!log(spool).contains("was removed from the configuration"))
    }
}
