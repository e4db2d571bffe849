// SPEC §8 cancels and suspensions from another node: a cancel reaches the node running the job or ends a
// waiting one, and a suspended queue is held on every node and kept.

import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

extension ClusterTests {
    // MARK: 6. Cancel and suspend from another node

    @Test func cancelFromAnotherNodeReachesTheRunningOne() throws {
        let harness = try ClusterHarness(nodes: 2)
        let job = uniqueJob("cancel")
        try harness[0].drop(job + ".plist",
                            ["job": job, "operations": [sleepOperation("a", 60), sleepOperation("b", 0, dependencies: ["a"])]])
        let running = try #require(try harness.waitClaimed(job)).node
        #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_OPERATION": "a", "OPQ_STATE": "executing"]) != nil)
        let other = 1 - running
        let asked = epochNow()
        let cancel = try harness[other].ctl(["cancel", job])
        #expect(cancel.status == 0, "\(cancel.stderr)")
        let result = try #require(harness.waitResult(job, timeout: 15))
        #expect(result.node == running)
        #expect(result.result["status"] as? String == "cancelled")
        let ended = result.result["finishedAt"] as? Double
        #expect(ended.map { $0 - asked < 3 } == true, "cancel reached the running node within about a second")
        // Cancelling it again, from either node, says it has ended.
        #expect(try harness[other].ctl(["cancel", job]).status == 1)
        #expect(try harness[other].ctl(["cancel", uniqueJob("nosuch")]).status == 1)
    }

    /// SPEC §3.4 in a cluster: an operation that has not started never starts, also when its job was cancelled while it
    /// waited in the database. The cancels come with the claim and go into the engine with the job's group; they were
    /// made at the node's next control round, and the operation had started by then (attempts 1, or even succeeded).
    @Test func aJobCancelledWhileItWaitsNeverStartsItsOperations() throws {
        let harness = try ClusterHarness(nodes: 1, settings: { _ in ["maxActiveJobs": 1] })
        let blocker = uniqueJob("blocker")
        try harness[0].drop(blocker + ".plist", sleepJob(blocker, 60))
        #expect(try harness.waitJournal(["OPQ_JOB": blocker, "OPQ_OPERATION": "a", "OPQ_STATE": "executing"]) != nil)
        let whole = uniqueJob("whole"), one = uniqueJob("one")
        try harness[0].drop(whole + ".plist",
                            ["job": whole, "operations": [sleepOperation("a", 2), sleepOperation("b", 0, dependencies: ["a"])]])
        try harness[0].drop(one + ".plist", ["job": one, "operations": [sleepOperation("a", 2), sleepOperation("b", 0)]])
        let waiting = try pollUntil(20) { () -> Bool? in
            try harness.sql("SELECT count(*) FROM opq_live WHERE id IN ('\(whole)', '\(one)') AND state = 'waiting'") == "2" ? true : nil
        }
        #expect(waiting == true, "both wait in the database behind the blocker")
        #expect(try harness[0].ctl(["cancel", whole]).status == 0)
        #expect(try harness[0].ctl(["cancel", one, "a"]).status == 0)
        // An operation the waiting job does not have is refused, as for a job running here (it was recorded, exit 0).
        let typo = try harness[0].ctl(["cancel", one, "nosuch"])
        #expect(typo.status == 1 && typo.stderr.contains("job '\(one)' has no operation 'nosuch'"), "\(typo.stderr)")
        #expect(try harness[0].ctl(["cancel", blocker]).status == 0)
        let cancelled = try #require(harness.waitResult(whole, timeout: 20)).result
        #expect(cancelled["status"] as? String == "cancelled")
        let operations = cancelled["operations"] as? [[String: Any]] ?? []
        #expect(operations.count == 2 && operations.allSatisfy {
            $0["state"] as? String == "cancelled" && $0["attempts"] as? Int == 0 && $0["startedAt"] == nil
        }, "\(operations)")
        let partly = try #require(harness.waitResult(one, timeout: 20)).result
        let states = (partly["operations"] as? [[String: Any]] ?? [])
            .map { "\($0["id"] ?? "?")=\($0["state"] ?? "?")/\($0["attempts"] ?? "?")" }
        #expect(states == ["a=cancelled/0", "b=succeeded/1"], "\(states)")
        #expect(partly["status"] as? String == "cancelled")
        for job in [whole, one] {
            #expect(try harness.journal(["OPQ_JOB": job, "OPQ_OPERATION": "a", "OPQ_STATE": "executing"]).isEmpty,
                    "\(job)/a never executed")
        }
    }

    /// A whole-job cancel recorded for a waiting job that no node took (the node that asked died between its two
    /// statements, or lost the database there) is taken by any node's next control round and ends cancelled — here a
    /// job whose only queue is declared by a node long gone, which nobody would ever claim to run.
    @Test func aCancelledJobLeftWaitingIsEndedByAnyNode() throws {
        let harness = try ClusterHarness(nodes: 1)
        let job = uniqueJob("orphan")
        let xml = try PropertyListSerialization.data(fromPropertyList: sleepJob(job, 0, queue: "gpu"), format: .xml, options: 0)
        let manifest = String(decoding: xml, as: UTF8.self)
        try harness.sql("""
            INSERT INTO opq_nodes (node, queues, commands, job_slots, info, last_heartbeat, lease_seconds)
            VALUES ('ghost', '{gpu}', '{}', 1, 'elsewhere', now() - interval '1 day', 5);
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
            VALUES ('\(job)', '\(job)', convert_to($m$\(manifest)$m$, 'UTF8'), '\(job).plist', 'ghost', 2, 2, '{gpu}', '{}');
            \(PostgresServer.waitingFromHand);
            INSERT INTO opq_cancel_requests (job, operation) VALUES ('\(job)', NULL);
            """)
        let ended = try #require(harness.waitResult(job, timeout: 15))
        #expect(ended.node == 0 && ended.result["status"] as? String == "cancelled")
        let operations = (ended.result["operations"] as? [[String: Any]] ?? [])
            .map { "\($0["queue"] ?? "?") \($0["state"] ?? "?")/\($0["attempts"] ?? "?")" }
        #expect(operations == ["gpu cancelled/0"], "\(operations)")
    }

    @Test func suspendFromAnotherNodeHoldsTheQueueEverywhereAndIsKept() throws {
        let queues: [String: Any] = ["queues": ["api": ["maxConcurrentOperationCount": 2]]]
        let harness = try ClusterHarness(nodes: 2, settings: { _ in queues })
        #expect(try harness[1].ctl(["suspend", "api"]).status == 0)
        // Every node shows it suspended within about a second.
        for k in 0..<2 {
            let seen = try pollUntil(3) { () -> Bool? in
                let list = try harness[k].statusJSON()["queues"] as? [[String: Any]] ?? []
                return list.contains { $0["name"] as? String == "api" && $0["suspended"] as? Bool == true } ? true : nil
            }
            #expect(seen != nil, "node \(k) follows the suspension")
        }
        let job = uniqueJob("suspended")
        try harness[0].drop(job + ".plist", sleepJob(job, 0, queue: "api"))
        usleep(3_000_000)
        #expect(harness.outboxes(holding: job).isEmpty, "no operation of a suspended queue starts, on any node")
        // Kept in the database across a restart of every node.
        harness[0].stop(); harness[1].stop()
        try harness.startAll()
        usleep(2_000_000)
        #expect(harness.outboxes(holding: job).isEmpty)
        #expect(try harness[0].ctl(["resume", "api"]).status == 0)
        #expect(harness.waitResult(job, timeout: 15)?.result["status"] as? String == "succeeded")
    }
}
