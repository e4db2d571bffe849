// The operator's verbs in a cluster (SPEC §1): `opqueuectl list` gives the database's history beside the outbox, so
// one node lists the jobs that ran anywhere, whether or not its daemon runs; without the database, its own outbox.

import Foundation
import Testing
import TestSupport
import TestTraits

@Suite("Cluster: the operator's verbs (SPEC §1)", .serialized, .onItsOwnExecutor)
struct OperatorClusterTests {
    @Test func listGivesTheDatabasesHistoryBesideTheOutbox() throws {
        let harness = try ClusterHarness(nodes: 2)
        // Which node runs a job is the database's race: rounds of 12 until both nodes have run some (the list is
        // to name both), at most five.
        var jobs: [String] = [], ranOn: [String: [Int]] = [:]
        for round in 0..<5 {
            let batch = (0..<12).map { uniqueJob("hist\(round)-\($0)") }
            for (k, job) in batch.enumerated() { _ = try harness[k % 2].drop("\(job).plist", sleepJob(job, 0.1)) }
            #expect(harness.waitAll(Set(batch), timeout: 60).isEmpty)
            jobs += batch
            ranOn = harness.outboxJobs()
            if Set(jobs.compactMap { ranOn[$0]?.first }).count == 2 { break }
        }
        #expect(Set(jobs.compactMap { ranOn[$0]?.first }).count == 2, "the jobs ran on both nodes: \(ranOn)")
        for node in harness.nodes { #expect(node.stop() == 0) }

        // Node 0 alone, its daemon stopped: every job once, with the node it ran on, newest first.
        let listed = try listJSON(harness[0], [])
        let byJob = Dictionary(grouping: listed, by: { $0["job"] as? String ?? "" })
        for job in jobs {
            #expect(byJob[job]?.count == 1, "\(job) listed once: \(byJob[job] ?? [])")
            let node = ranOn[job]?.first.map { harness[$0].name }
            #expect(byJob[job]?.first?["node"] as? String == node, "\(job) ran on \(node ?? "?")")
            #expect(byJob[job]?.first?["durationSeconds"] as? Double != nil, "\(job) has its duration")
        }
        let times = listed.compactMap { $0["finishedAt"] as? Double }
        #expect(times == times.sorted(by: >), "newest first")
        #expect(try listJSON(harness[0], ["--status", "failed"]).isEmpty)
        #expect(try listJSON(harness[0], ["--since", "@\(Int(epochNow()) + 3600)"]).isEmpty)

        // The database away: the outbox alone, and a word on standard error.
        harness.stopDatabase()
        let alone = try harness[0].ctl(["list", "--json"])
        #expect(alone.status == 0)
        #expect(alone.stderr.contains("database"), "says the database could not be used: \(alone.stderr)")
        let own = Set(harness[0].list("outbox"))
        let names = try parse(alone.stdout).compactMap { $0["job"] as? String }
        #expect(Set(names) == own.intersection(jobs), "only node 0's own outbox")
    }

    func listJSON(_ node: ClusterNode, _ arguments: [String]) throws -> [[String: Any]] {
        let run = try node.ctl(["list", "--json"] + arguments)
        #expect(run.status == 0, "list \(arguments) exited \(run.status): \(run.stderr)")
        #expect(run.stderr.isEmpty, "nothing on standard error: \(run.stderr)")
        return try parse(run.stdout)
    }

    func parse(_ text: String) throws -> [[String: Any]] {
        try #require(JSONSerialization.jsonObject(with: Data(text.utf8)) as? [[String: Any]])
    }
}
