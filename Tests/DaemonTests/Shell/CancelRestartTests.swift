// A cancel of one operation (SPEC §3.4) survives a restart (§2: jobs resume as if nothing had happened): after a
// kill -9 or a SIGTERM and a new start, the operation cancelled still never starts and its dependents are cancelled,
// for a running job and for a delayed one (§3.7), whose `show` says so before its time. So does a cancel of a whole
// job killed before its publication: a running one ends cancelled, its command not run again; a delayed one ends
// cancelled at once, not at its time.

import Foundation
import Testing
@testable import Daemon
import TestTraits

@Suite(.serialized, .onItsOwnExecutor) struct CancelRestartTests {
    /// `show JOB --json`'s operations: id → state (empty when the job is not shown).
    func states(_ spool: TestSpool, _ job: String) -> [String: String] {
        guard let shown = try? spool.ctl(["show", job, "--json"]),
              let object = try? JSONSerialization.jsonObject(with: Data(shown.stdout.utf8)) as? [String: Any],
              let operations = object["operations"] as? [[String: Any]] else { return [:] }
        var states: [String: String] = [:]
        for op in operations { if let id = op["id"] as? String { states[id] = op["state"] as? String } }
        return states
    }

    /// A result's operations: id → (state, attempts).
    func operations(_ result: [String: Any]) -> [String: (state: String?, attempts: Int?)] {
        var ops: [String: (state: String?, attempts: Int?)] = [:]
        for op in result["operations"] as? [[String: Any]] ?? [] {
            if let id = op["id"] as? String { ops[id] = (op["state"] as? String, op["attempts"] as? Int) }
        }
        return ops
    }

    /// Stops the daemon with `sig` (a SIGTERM's grace is short: the job must not end before the restart).
    func stop(_ spool: TestSpool, _ sig: Int32) {
        spool.signal(sig)
        let status = spool.waitForExit(timeout: 15)
        if sig == SIGTERM { #expect(status == 0) }
    }

    @Test(arguments: [SIGKILL, SIGTERM])
    func anOperationCancelledInARunningJobStaysCancelledAfterARestart(_ sig: Int32) throws {
        let spool = TestSpool()
        let config = try spool.configure(["shutdownGraceSeconds": 0.5])
        try spool.start(config)
        try spool.drop("nd3.plist", ["job": "nd3", "operations": [sleepOp("s", 3), sleepOp("a", 0.1, deps: ["s"]),
                                                                   sleepOp("b", 0.1, deps: ["a"]), sleepOp("c", 0.1)]])
        #expect(eventually(10) { states(spool, "nd3")["s"] == "executing" })
        let cancel = try spool.ctl(["cancel", "nd3", "a"])
        #expect(cancel.status == 0, "\(cancel.stderr)")
        #expect(states(spool, "nd3")["a"] == "cancelled")
        stop(spool, sig)
        #expect(spool.list("active") == ["nd3"], "the job had not ended at the stop")
        try spool.start(config)
        let result = try #require(spool.result("nd3", timeout: 20))
        #expect(result["status"] as? String == "cancelled", "\(result)")
        let ops = operations(result)
        #expect(ops["s"]?.state == "succeeded")
        #expect(ops["c"]?.state == "succeeded")
        #expect(ops["a"]?.state == "cancelled" && ops["a"]?.attempts == 0, "the cancelled operation never ran: \(ops)")
        #expect(ops["b"]?.state == "cancelled" && ops["b"]?.attempts == 0, "its dependent is cancelled too: \(ops)")
    }

    /// A kill -9 at once after the answer (the answer follows the cancel's commit: CancelCommitTests).
    @Test func anOperationCancelAnsweredThenKilledAtOnceStaysCancelled() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("k9.plist", ["job": "k9", "operations": [sleepOp("s", 3), sleepOp("a", 0.1, deps: ["s"]), sleepOp("c", 0.1)]])
        #expect(eventually(10) { states(spool, "k9")["s"] == "executing" })
        let cancel = try spool.ctl(["cancel", "k9", "a"])
        spool.signal(SIGKILL)
        #expect(cancel.status == 0, "\(cancel.stderr)")
        _ = spool.waitForExit(timeout: 15)
        try spool.start()
        let result = try #require(spool.result("k9", timeout: 20))
        #expect(result["status"] as? String == "cancelled", "\(result)")
        let ops = operations(result)
        #expect(ops["a"]?.state == "cancelled" && ops["a"]?.attempts == 0, "\(ops)")
        #expect(ops["s"]?.state == "succeeded" && ops["c"]?.state == "succeeded", "\(ops)")
    }

    @Test(arguments: [SIGKILL, SIGTERM])
    func anOperationCancelledInADelayedJobStaysCancelledAfterARestart(_ sig: Int32) throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("dop3.plist", ["job": "dop3", "delaySeconds": 6.0,
                                      "operations": [sleepOp("a", 0.05), sleepOp("b", 0.05, deps: ["a"]), sleepOp("c", 0.05)]])
        #expect(eventually(10) { states(spool, "dop3")["a"] == "pending" })
        let cancel = try spool.ctl(["cancel", "dop3", "a"])
        #expect(cancel.status == 0, "\(cancel.stderr)")
        let shown = states(spool, "dop3")
        #expect(shown == ["a": "cancelled", "b": "cancelled", "c": "pending"], "show says what the cancel did: \(shown)")
        stop(spool, sig)
        try spool.start()
        #expect(states(spool, "dop3")["a"] == "cancelled", "and says so after the restart")
        let result = try #require(spool.result("dop3", timeout: 20))
        #expect(result["status"] as? String == "cancelled", "\(result)")
        let ops = operations(result)
        #expect(ops["a"]?.state == "cancelled" && ops["a"]?.attempts == 0, "\(ops)")
        #expect(ops["b"]?.state == "cancelled" && ops["b"]?.attempts == 0, "\(ops)")
        #expect(ops["c"]?.state == "succeeded", "\(ops)")
    }

    /// A command that appends a line to the file it is given, then sleeps ignoring SIGTERM (the cancel's signal: it
    /// dies of the SIGKILL 5 s later).
    func slowCommand() -> [String: Any] {
        ["argv": ["/bin/sh", "-c", "echo run >> \"$1\"; trap '' TERM; sleep 4", "sh", "${log}"],
         "parameters": ["log": "string"], "output": "none"]
    }

    func commandOp(_ id: String, log: String) -> [String: Any] {
        ["id": id, "kind": "command", "command": "slow", "arguments": ["log": log]]
    }

    /// Starts a daemon that dies (SIGKILL at a crash point) as a cancelled job's result is staged, before its
    /// publication; drops `manifest`, waits for `ready`, cancels the whole job, and starts the daemon again once it
    /// died with the job unpublished.
    func cancelThroughAKill(_ spool: TestSpool, _ config: [String], _ manifest: [String: Any], ready: () -> Bool) throws {
        let job = try #require(manifest["job"] as? String)
        spool.environment = ["OPQUEUED_CRASH_POINTS": "publish.staged:1"]
        try spool.start(config)
        try spool.drop(job + ".plist", manifest)
        let isReady = eventually(10, ready)
        #expect(isReady)
        _ = try spool.ctl(["cancel", job])  // answered, or not: the daemon may die first
        #expect(spool.waitForExit(timeout: 15) != nil)
        #expect(spool.list("active") == [job], "the job had not been published")
        spool.environment = [:]
        try spool.start(config)
    }

    func runs(_ path: String) -> Int {
        (try? String(contentsOfFile: path, encoding: .utf8))?.split(separator: "\n").count ?? 0
    }

    /// Killed (SIGKILL, at a crash point) as the cancelled job's result is staged, before its publication: the engine
    /// ends a cancelled command's operation at once, and the job is published a moment after the cancel.
    @Test func aRunningJobCancelledWholeEndsCancelledAfterAKillBeforeItsPublication() throws {
        let spool = TestSpool()
        let log = spool.root + ".runs"
        defer { unlink(log) }
        let config = try spool.configure(["commands": ["slow": slowCommand()]])
        let manifest: [String: Any] = ["job": "wc", "operations": [commandOp("c", log: log), sleepOp("after", 0.05, deps: ["c"])]]
        try cancelThroughAKill(spool, config, manifest) { runs(log) == 1 }
        let result = try #require(spool.result("wc", timeout: 20))
        #expect(result["status"] as? String == "cancelled", "\(result)")
        let ops = operations(result)
        #expect(ops["c"]?.state == "cancelled", "\(ops)")
        #expect(ops["after"]?.state == "cancelled" && ops["after"]?.attempts == 0, "\(ops)")
        #expect(runs(log) == 1, "the command did not run again")
    }

    /// A SIGTERM just after the cancel, while the command is still dying: the stop publishes the job it ended (or,
    /// were it not published, the restart ends it cancelled); either way the command never runs again.
    @Test func aRunningJobCancelledWholeEndsCancelledThroughAStop() throws {
        let spool = TestSpool()
        let log = spool.root + ".runs"
        defer { unlink(log) }
        let config = try spool.configure(["shutdownGraceSeconds": 0.5, "commands": ["slow": slowCommand()]])
        try spool.start(config)
        try spool.drop("wt.plist", ["job": "wt", "operations": [commandOp("c", log: log)]])
        #expect(eventually(10) { runs(log) == 1 })
        let cancel = try spool.ctl(["cancel", "wt"])
        #expect(cancel.status == 0, "\(cancel.stderr)")
        stop(spool, SIGTERM)
        try spool.start(config)
        let result = try #require(spool.result("wt", timeout: 20))
        #expect(result["status"] as? String == "cancelled", "\(result)")
        usleep(300_000)
        #expect(runs(log) == 1, "the command did not run again")
    }

    @Test func aDelayedJobCancelledWholeEndsCancelledAtOnceAfterARestart() throws {
        let spool = TestSpool()
        let log = spool.root + ".runs"
        defer { unlink(log) }
        let config = try spool.configure(["commands": ["slow": slowCommand()]])
        try cancelThroughAKill(spool, config, ["job": "dw", "delaySeconds": 3600.0, "operations": [commandOp("c", log: log)]]) {
            states(spool, "dw")["c"] == "pending"
        }
        let result = try #require(spool.result("dw", timeout: 20), "it ends now, not in an hour")
        #expect(result["status"] as? String == "cancelled", "\(result)")
        #expect(operations(result)["c"]?.state == "cancelled" && operations(result)["c"]?.attempts == 0, "\(result)")
        #expect(runs(log) == 0, "the command never ran")
    }
}
