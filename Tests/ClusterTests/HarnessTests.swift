// The harness itself, without `cluster`: a throwaway PostgreSQL with the documented role, two real nodes each alone
// on its own spool, and every helper the cluster tests use (drop, outbox waits, result.plist, journal by job, ctl,
// SIGSTOP/SIGCONT, kill -9 and restart, the database stopped and started). This passes on any daemon; the
// cluster tests beside it need the daemon of SPEC §8.

import Foundation
import Testing
import TestSupport
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite("Cluster harness", .serialized, .onItsOwnExecutor)
struct HarnessTests {
    @Test func harnessRunsNodesAndTheirHelpers() throws {
        let harness = try ClusterHarness(nodes: 2, cluster: false)
        #expect(harness[0].isReady && harness[1].isReady)
        #expect(harness[0].socketPath != harness[1].socketPath)

        // The role is what the README documents: no superuser, only CONNECT on the database and USAGE/CREATE on public.
        #expect(try harness.sql("SELECT rolsuper OR rolcreatedb OR rolcreaterole FROM pg_roles WHERE rolname = '\(harness.role)'") == "f")
        #expect(try harness.sql("SELECT has_database_privilege('\(harness.role)', '\(harness.database)', 'CONNECT')") == "t")
        #expect(try harness.sql("SELECT has_database_privilege('\(harness.role)', '\(harness.database)', 'TEMPORARY')") == "f")
        #expect(try harness.sql("SELECT has_schema_privilege('\(harness.role)', 'public', 'CREATE')") == "t")
        // The role can log in with the password file over TCP, as the nodes will.
        let login = try runProgram("/usr/bin/psql",
                                   ["-X", "-A", "-t", "-c", "SELECT current_user",
                                    harness.url.replacingOccurrences(of: "?sslmode=disable", with: "")],
                                   environment: ["PGPASSWORD": harness.rolePassword, "PGSSLMODE": "disable"])
        #expect(login.status == 0 && login.stdout.contains(harness.role), "\(login.stderr)")

        // A manifest dropped on node 1 ends in node 1's outbox (no cluster: each node alone).
        let job = "harness-\(UInt32.random(in: 1...UInt32.max))"
        try harness[1].drop(job + ".plist", ["job": job, "operations": [sleepOperation("a", 0.05)]])
        let first = try #require(harness.waitResult(job, timeout: 20))
        #expect(first.node == 1)
        #expect(first.result["status"] as? String == "succeeded")
        #expect(harness.outboxes(holding: job) == [1])
        #expect(harness.outboxJobs()[job] == [1])
        #expect(try harness[1].statusJSON()["queues"] != nil)
        #expect(try harness[0].ctl(["status"]).status == 0)
        #expect(try harness[0].ctl(["show", job]).status != 0, "node 0 never saw the job")

        // The journal, read by job (the node is in OPQ_NODE only with a cluster).
        let finished = try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "finished"])
        #expect(finished?["OPQ_STATUS"] == "succeeded")

        // SIGSTOP: no new work while frozen; SIGCONT: it goes on.
        let frozen = "frozen-\(UInt32.random(in: 1...UInt32.max))"
        harness[0].freeze()
        try harness[0].drop(frozen + ".plist", ["job": frozen, "operations": [sleepOperation("a", 0)]])
        usleep(1_500_000)
        #expect(harness[0].result(frozen) == nil, "a frozen node ran a job")
        harness[0].resume()
        #expect(harness.waitResult(frozen, timeout: 20)?.node == 0)

        // kill -9 mid-job, then a restart: the job resumes from active/ and ends once.
        let killed = "killed-\(UInt32.random(in: 1...UInt32.max))"
        try harness[0].drop(killed + ".plist", ["job": killed, "operations": [sleepOperation("a", 1.5)]])
        #expect(pollUntil(10) { harness[0].list("active").contains(killed) ? true : nil } != nil)
        let before = harness[0].pid
        harness[0].kill9()
        #expect(!harness[0].isRunning)
        try harness[0].start()
        #expect(harness[0].pid != before)
        #expect(harness.waitResult(killed, timeout: 30)?.result["status"] as? String == "succeeded")
        #expect(harness.outboxJobs()[killed] == [0])

        // The database stops and starts again on the same port; the nodes (no cluster) never notice.
        harness.stopDatabase()
        #expect(throws: (any Error).self) { try harness.sql("SELECT 1") }
        try harness[1].drop("alone.plist", ["job": job + "-alone", "operations": [sleepOperation("a", 0)]])
        #expect(harness.waitResult(job + "-alone", timeout: 20)?.node == 1)
        try harness.startDatabase()
        #expect(try harness.sql("SELECT 1") == "1")

        // Nothing the nodes showed mentions the password (they never had it).
        for k in 0..<2 { #expect(try !harness.everythingShown(by: k).contains(harness.rolePassword)) }
        // Graceful stop exits 0.
        #expect(harness[1].stop() == 0)
        harness.shutdown()
    }
}
