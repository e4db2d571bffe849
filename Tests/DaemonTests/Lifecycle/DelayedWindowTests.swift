// Later (SPEC §3.7) with more delayed jobs than the daemon keeps in memory, through the real binaries: a window of 3
// (OPQUEUED_DELAYED_WINDOW) and the rest parked in active/.delayed.

import Foundation
import Testing
@testable import Daemon
import TestTraits

@Suite(.serialized, .onItsOwnExecutor) struct DelayedWindowTests {
    func log(_ spool: TestSpool) -> String { (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? "" }

    func statusObject(_ spool: TestSpool) throws -> [String: Any] {
        let status = try spool.ctl(["status", "--json"])
        return try #require(JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
    }

    /// Waits until the journal says every job in `jobs` is delayed (at most 20 s).
    func waitDelayed(_ spool: TestSpool, _ jobs: [String]) {
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline, !jobs.allSatisfy({ log(spool).contains("OPQ_JOB=\($0) OPQ_NOT_BEFORE") }) { usleep(20_000) }
    }

    @Test func moreDelayedJobsThanTheWindowStartInTimeOrderThroughAStopAndAKillNine() throws {
        let spool = TestSpool()
        spool.environment = ["OPQUEUED_DELAYED_WINDOW": "3"]
        try spool.start()
        // Twelve jobs, their times 0.4 s apart in an order unlike their arrival's: the latest arrive first and are
        // parked as earlier ones come (the window's latest goes out), the rest after the horizon parked at once.
        let base = (Date().timeIntervalSince1970 + 10).rounded(.up)
        let order = [11, 10, 3, 9, 0, 8, 5, 2, 7, 1, 6, 4]
        var times: [String: Double] = [:]
        for k in order {
            let job = String(format: "d%02d", k)
            times[job] = base + 0.4 * Double(k)
            try spool.drop(job + ".plist", ["job": job, "notBefore": times[job]!, "operations": [sleepOp("a", 0.05)]])
        }
        let jobs = times.keys.sorted()
        waitDelayed(spool, jobs)

        let status = try statusObject(spool)
        #expect(status["delayed"] as? Int == 12, "status counts every delayed job: \(status)")
        let listed = (status["jobs"] as? [[String: Any]] ?? []).compactMap { $0["job"] as? String }
        #expect(listed.count <= 3, "only the window is listed: \(listed)")
        #expect(listed.allSatisfy { ["d00", "d01", "d02"].contains($0) }, "the window holds the earliest: \(listed)")
        let lines = (try? String(contentsOfFile: spool.root + "/active/.delayed", encoding: .utf8))?.split(separator: "\n") ?? []
        #expect(lines.count >= 9, "the others are parked on disk: \(lines)")
        let text = try spool.ctl(["status"]).stdout
        #expect(text.contains("jobs active: 12") && text.contains("delayed: 12"), "\(text)")

        // A parked job answers `show` from its manifest, and a cancel ends it at once.
        let shown = try spool.ctl(["show", "d09", "--json"])
        let object = try #require(JSONSerialization.jsonObject(with: Data(shown.stdout.utf8)) as? [String: Any])
        #expect(object["status"] as? String == "delayed", "\(shown.stdout)")
        #expect(abs((object["notBefore"] as? Double ?? 0) - times["d09"]!) < 0.001, "\(shown.stdout)")
        #expect(try spool.ctl(["cancel", "d09"]).status == 0)
        let cancelled = try #require(spool.result("d09", timeout: 5), "a parked job cancelled ends at once")
        #expect(cancelled["status"] as? String == "cancelled")
        #expect((cancelled["operations"] as? [[String: Any]])?.first?["attempts"] as? Int == 0)
        #expect(try statusObject(spool)["delayed"] as? Int == 11)

        // A stop, a start, a kill -9 with jobs parked, a start: every job is found again.
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 5) == 0)
        try spool.start()
        #expect(try statusObject(spool)["delayed"] as? Int == 11, "recovery finds every delayed job")
        spool.signal(SIGKILL)
        _ = spool.waitForExit()
        try spool.start()
        let ready = Date().timeIntervalSince1970
        #expect(try statusObject(spool)["delayed"] as? Int == 11)

        var started: [(job: String, at: Double)] = []
        for job in jobs where job != "d09" {
            let result = try #require(spool.result(job, timeout: 30), "\(job) ran")
            #expect(result["status"] as? String == "succeeded")
            let at = try #require((result["operations"] as? [[String: Any]])?.first?["startedAt"] as? Double)
            let due = times[job]!
            #expect(at >= due - 0.01, "\(job) not started before its time")
            #expect(at < max(due, ready) + 2, "\(job) started on time")
            started.append((job, at))
        }
        // In time order (their times are 0.4 s apart; two woken in one pass start a moment apart).
        for (a, b) in zip(started, started.dropFirst()) where times[a.job]! >= ready {
            #expect(b.at >= a.at - 0.05, "\(a.job) at \(a.at) before \(b.job) at \(b.at)")
        }
        #expect(spool.list("active").isEmpty)
        #expect(try statusObject(spool)["delayed"] == nil, "none is delayed any more")
    }
}
