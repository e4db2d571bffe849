// Schedules (SPEC §3.7): the daemon submitting them through its inbox (the book of occurrences: JobModelTests).

import Cron
import Foundation
import Testing
@testable import Daemon
import TestTraits

@Suite(.serialized, .onItsOwnExecutor) struct ScheduleTests {
    func manifest(_ root: String) throws -> String {
        let path = root + ".scheduled.plist"
        try plist(["operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: path))
        return path
    }

    @Test func aScheduleSubmitsEachOccurrenceOnceAndCatchesUpTheLatest() throws {
        let spool = TestSpool()
        let file = try manifest(spool.root)
        defer { try? FileManager.default.removeItem(atPath: file) }
        // Handled up to ten minutes ago (as a previous run would have left it): the latest missed minute runs once.
        try FileManager.default.createDirectory(atPath: spool.root + "/active", withIntermediateDirectories: true)
        let now = Int64(Date().timeIntervalSince1970)
        try "every\t\(now - 600)\nnone\t\(now - 600)\n".write(toFile: spool.root + "/active/.schedules", atomically: true, encoding: .utf8)
        let arguments = try spool.configure(["schedules": [
            "every": ["cron": "* * * * *", "manifest": file, "timeZone": "Europe/Paris"],
            "none": ["cron": "* * * * *", "manifest": file, "catchUp": "none"],
            "broken": ["cron": "*/30 * * * *", "manifest": spool.root + ".missing.plist"],
        ]])
        try spool.start(arguments)
        let latest = (now / 60) * 60
        let caughtUp = "every-" + CronSchedule.jobIDSuffix(latest)
        let result = try #require(spool.result(caughtUp, timeout: 10), "the latest missed occurrence ran")
        #expect(result["status"] as? String == "succeeded")
        #expect(spool.list("outbox") == [caughtUp], "only the latest, and nothing for catchUp = none")
        // status lists each schedule with its next occurrence.
        let status = try spool.ctl(["status", "--json"])
        let object = try #require(JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        let schedules = try #require(object["schedules"] as? [[String: Any]])
        #expect(schedules.compactMap { $0["name"] as? String } == ["broken", "every", "none"])
        let next = try #require(schedules.first { $0["name"] as? String == "every" }?["next"] as? Double)
        #expect(next == Double(latest + 60))
        // The next minute: one job each for `every` and `none`.
        let minute = "-" + CronSchedule.jobIDSuffix(latest + 60)
        #expect(spool.result("every" + minute, timeout: 75) != nil)
        #expect(spool.result("none" + minute, timeout: 5) != nil)
        // A restart in the same minute submits nothing again (and were it to, the id is held: skipped).
        spool.signal(SIGTERM)
        _ = spool.waitForExit()
        try spool.start(arguments)
        usleep(1_500_000)
        let outbox = spool.list("outbox")
        #expect(outbox.filter { $0.hasPrefix("every-") }.count == 2 && outbox.filter { $0.hasPrefix("none-") }.count == 1, "\(outbox)")
        #expect(!outbox.contains { $0.contains(".1") })
    }

    @Test func badSchedulesAreRefusedNamingTheScheduleAndTheValue() throws {
        let spool = TestSpool()
        let cases: [([String: Any], String)] = [
            (["cron": "61 * * * *", "manifest": "/m.plist"], "schedules.s.cron: '61 * * * *': minute field: 61 is out of range 0-59"),
            (["cron": "@daily", "manifest": "/m.plist", "timeZone": "Mars/Olympus"], "schedules.s.timeZone: 'Mars/Olympus'"),
            (["cron": "@daily", "manifest": "/m.plist", "catchUp": "all"], "schedules.s.catchUp: must be 'latest' or 'none', not 'all'"),
            (["cron": "@daily", "manifest": "m.plist"], "schedules.s.manifest: must be an absolute path"),
        ]
        for (settings, problem) in cases {
            let arguments = try spool.configure(["schedules": ["s": settings]])
            let run = try run("opqueued", ["--spool", spool.root, "--log-target", "console"] + arguments, timeout: 10)
            #expect(run.status == 1)
            #expect(run.stderr.contains(problem), "\(run.stderr)")
        }
    }
}
