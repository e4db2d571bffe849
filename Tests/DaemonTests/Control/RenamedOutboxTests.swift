// An outbox folder an operator renamed (`mv outbox/J outbox/J.keep`), through the real daemon and opqueuectl: the job
// is its result's `job` whatever its folder's name, so list, show, wait, graph and retry all answer for J; a job of
// that id that has not ended (the name is free again) answers for itself; two renamed folders of one id are named,
// not chosen between; clean and outbox.keepDays remove a renamed folder by its job's age.

import Foundation
import Testing
import TestSupport
@testable import Daemon
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized, .onItsOwnExecutor) struct RenamedOutboxTests {
    @Test func showWaitGraphAndRetryFindARenamedFolderByItsJob() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("j.plist", ["job": "j", "operations": [sleepOp("s", 0)]])
        #expect(spool.result("j")?["status"] as? String == "succeeded")
        #expect(rename(spool.outbox + "/j", spool.outbox + "/j.keep") == 0)
        #expect(try spool.listJSON().map { $0["job"] as? String } == ["j"])

        let show = try spool.ctl(["show", "j"])
        #expect(show.status == 0 && show.stdout.hasPrefix("job j: succeeded\n") && show.stdout.contains("  s  sleep"), "\(show)")
        let wait = try spool.ctl(["wait", "j", "--timeout", "2"])
        #expect(wait.status == 0 && wait.stdout == "j: succeeded\n", "\(wait)")
        let graph = try spool.ctl(["graph", "j"])
        #expect(graph.status == 0 && graph.stdout.contains("\"s\"") && graph.stdout.contains("palegreen"), "\(graph)")
        let cancel = try spool.ctl(["cancel", "j"])
        #expect(cancel.status == 1 && cancel.stderr.contains("job 'j' has already ended"), "ended, not unknown: \(cancel)")

        // The name j is free: the retry takes it, and outbox/j, once there, answers for j.
        let retry = try spool.ctl(["retry", "j"])
        #expect(retry.status == 0 && retry.stdout == "j\n", "\(retry)")
        #expect(spool.result("j")?["status"] as? String == "succeeded")
        #expect(spool.list("outbox") == ["j", "j.keep"])
        #expect(try spool.ctl(["wait", "j", "--timeout", "2"]).stdout == "j: succeeded\n")

        // A job of a renamed folder's id that has not ended answers for itself: running, not the old folder's end.
        try writeEndedJob(outbox: spool.outbox, job: "long", status: "failed", finishedAt: 1_000)
        #expect(rename(spool.outbox + "/long", spool.outbox + "/long.old") == 0)
        try spool.drop("long.plist", ["job": "long", "operations": [sleepOp("s", 30)]])
        #expect(spool.waitFor(spool.root + "/active/long"))
        let running = try spool.ctl(["show", "long"])
        #expect(running.status == 0 && running.stdout.hasPrefix("job long: running"), "\(running)")
        let waiting = try spool.ctl(["wait", "long", "--timeout", "0.5"])
        #expect(waiting.status == 2, "\(waiting)")
        #expect(try spool.ctl(["retry", "long"]).stderr.contains("job 'long' has not ended"))
        #expect(try spool.ctl(["cancel", "long"]).status == 0)
        #expect(spool.result("long")?["status"] as? String == "cancelled")
        #expect(try spool.ctl(["show", "long"]).stdout.hasPrefix("job long: cancelled"))
    }

    @Test func twoRenamedFoldersOfOneJobAreNamedNotChosenBetween() throws {
        let spool = TestSpool()
        try spool.start()
        try writeEndedJob(outbox: spool.outbox, job: "x", status: "failed", finishedAt: 1_000)
        #expect(rename(spool.outbox + "/x", spool.outbox + "/x.a") == 0)
        try writeEndedJob(outbox: spool.outbox, job: "x", status: "succeeded", finishedAt: 2_000)
        #expect(rename(spool.outbox + "/x", spool.outbox + "/x.b") == 0)
        for command in [["show", "x"], ["wait", "x", "--timeout", "2"], ["retry", "x"], ["graph", "x"]] {
            let r = try spool.ctl(command)
            #expect(r.status == 1, "\(command): \(r)")
            #expect(r.stderr.contains("job 'x': 2 outbox folders say they are its, none named x: outbox/x.a (failed, finished ")
                    && r.stderr.contains("outbox/x.b (succeeded, finished ") && r.stderr.contains("rename the job's own to outbox/x"),
                    "\(command): \(r.stderr)")
        }
        #expect(spool.list("inbox").isEmpty, "nothing was retried")
        // A folder under the job's own name answers first.
        try writeEndedJob(outbox: spool.outbox, job: "x", status: "cancelled", finishedAt: 3_000)
        let show = try spool.ctl(["show", "x"])
        #expect(show.status == 0 && show.stdout.hasPrefix("job x: cancelled"), "\(show)")
    }

    @Test func cleanAndKeepDaysRemoveARenamedFolderByItsJobsAge() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.outbox, withIntermediateDirectories: true)
        let now = Date().timeIntervalSince1970
        try writeEndedJob(outbox: spool.outbox, job: "old", finishedAt: now - 10 * 86_400)
        #expect(rename(spool.outbox + "/old", spool.outbox + "/old.keep") == 0)
        try writeEndedJob(outbox: spool.outbox, job: "new", finishedAt: now)
        #expect(rename(spool.outbox + "/new", spool.outbox + "/new.keep") == 0)
        let dry = try spool.ctl(["clean", "--older-than", "2", "--dry-run"])
        #expect(dry.status == 0 && dry.stdout.hasPrefix("would remove old.keep (job old, succeeded, finished "), "\(dry)")
        #expect(dry.stdout.hasSuffix("would remove 1 ended job folder\n"), "\(dry)")
        #expect(spool.list("outbox") == ["new.keep", "old.keep"])

        // keepDays = 0.0001 (8.64 s): the old one goes at start, the new one once it is that old.
        try spool.start(try spool.configure(["outbox": ["keepDays": 0.0001]]))
        #expect(spool.waitFor(spool.outbox + "/old.keep", gone: true, timeout: 10))
        #expect(spool.waitFor(spool.outbox + "/new.keep", gone: true, timeout: 20))
        #expect(spool.list("tmp").isEmpty)
    }
}
