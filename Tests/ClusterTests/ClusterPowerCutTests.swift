// A cluster node's power cut: the node's spool on an ext4 image of its own, shut down as by a power cut while the node
// runs jobs from the database. A job the node announced is recorded ended in the database and never runs again, so
// its outbox entry must have survived whole; after a restart every job ends exactly once. Both ways of committing
// (ext4's journal, and syncfs) are held to it.

import Foundation
import Testing
import TestSupport
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite("Cluster: a node's power cut", .serialized, .onItsOwnExecutor)
struct ClusterPowerCutTests {
    @Test(arguments: ["journal", "syncfs"])
    func whatANodeAnnouncedSurvivesAPowerCut(method: String) throws {
        // Eight jobs at a time: the cut comes while most are still to run.
        let harness = try ClusterHarness(nodes: 1, leaseSeconds: 3, logTarget: "console", settings: { _ in ["maxActiveJobs": 8] },
                                         start: false)
        let node = harness[0]
        var image = harness.folder + "/n0.img"
        try FileManager.default.createDirectory(atPath: node.spool, withIntermediateDirectories: true)
        try PowerCut.mountImage(image, on: node.spool)
        defer {
            node.kill9()
            try? PowerCut.unmount(node.spool, lazily: true)
            unlink(image)
        }
        if method == "syncfs" { node.environment["OPQUEUED_SPOOL_SYNC"] = "syncfs" }
        try node.start()
        try harness.waitRegistered(1)
        let count = 240
        for i in 0..<count {
            // The second sleep is 10 ms: a loaded machine still cuts with jobs in flight.
            let operations = [sleepOperation("a", 0), sleepOperation("b", 0.01, dependencies: ["a"])]
            try node.drop("c\(i).plist", ["job": "c\(i)", "operations": operations])
        }
        // Synced as a careful client does: from here on each manifest is in the inbox, the node's spool or the database.
        try #require(try runProgram("/bin/sync", ["-f", node.spool]).status == 0)
        let wanted = count / 4
        let reached = pollUntil(60) { PowerCut.announcedSuccesses(log: node.logPath).count >= wanted ? true : nil }
        try #require(reached != nil, "\(PowerCut.announcedSuccesses(log: node.logPath).count) of \(wanted) announced:\n\(node.logTail())")
        node.freeze()
        usleep(300_000)
        let promised = PowerCut.announcedSuccesses(log: node.logPath)
        #expect(promised.count < count, "the cut came after the last job")
        try PowerCut.cut(node.spool)
        node.kill9()
        image = try PowerCut.remount(image, on: node.spool)
        let damaged = promised.sorted().filter { node.result($0)?["status"] as? String != "succeeded" }
        #expect(damaged.isEmpty, "\(method): \(damaged.count) of \(promised.count) announced entries gone or damaged: \(damaged.prefix(5))")

        try node.start()
        let all = Set((0..<count).map { "c\($0)" })
        // Jobs the database gave this node whose folders the cut took are handed back at the first beat after recovery
        // (the full beat a minute later, before): all end well within that minute.
        let missing = harness.waitAll(all, timeout: 40)
        #expect(missing.isEmpty, "\(missing.count) of \(count) jobs never ended: \(missing.sorted().prefix(5))")
        let twice = harness.outboxJobs().filter { $0.value.count > 1 || !all.contains($0.key) }
        #expect(twice.isEmpty, "\(twice)")
        let damagedAfter = all.sorted().filter { node.result($0)?["status"] as? String != "succeeded" }
        // What each ended as, and why: a failure here says which path took the job, not only which jobs.
        let outcomes = damagedAfter.prefix(5).map { job in
            let result = node.result(job)
            return "\(job): \(result?["status"] as? String ?? "no result.plist") \(result?["error"] as? String ?? "")"
        }
        #expect(damagedAfter.isEmpty, "\(damagedAfter.count) not succeeded: \(outcomes)\n\(node.logTail(40))")
    }
}
