// SPEC §8 database outages from outside: the database restarted under load, refusing writes, behind a
// transaction pooler, down when a node starts, or restored without some of its rows; nothing is lost and each
// job ends once.

import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

extension ClusterFailureTests {
    // MARK: 2, 4. The database stopped and started under load

    @Test func databaseRestartUnderLoadLosesNothing() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 4)
        var jobs = try dropSleepJobs(harness, "db", 0..<40, seconds: 0.3)
        usleep(1_000_000)
        harness.stopDatabase()
        // Dropped while the database is down: they wait in the inbox.
        jobs.formUnion(try dropSleepJobs(harness, "db", 40..<50, seconds: 0.1))
        for k in 0..<2 {
            #expect(try harness.waitJournal(["OPQ_NODE": harness[k].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"],
                                            timeout: 15) != nil)
        }
        #expect(harness[0].isReady && harness[1].isReady, "nodes keep serving their sockets")
        usleep(6_000_000)
        // What waits for the database, in the inbox or set aside in active/.submissions, is what `status` and the
        // metrics call waiting: the ten dropped meanwhile, and any of the first forty not inserted before the stop.
        var waiting = 0
        for k in 0..<2 {
            let onDisk = harness[k].list("inbox").count + harness[k].list("active/.submissions").count
            let json = try harness[k].statusJSON()
            let status = json["waiting"] as? Int
            #expect(status == onDisk, "node \(k): status says \(status ?? -1) waiting, \(onDisk) manifests wait on disk")
            // Those taken before the node knew: how many, and since when.
            let setAside = harness[k].list("active/.submissions").count
            #expect(json["submissions"] as? Int ?? 0 == setAside && (setAside == 0) == (json["submissionsSince"] == nil),
                    "node \(k): \(json)")
            // The nodes table is the last one read: the text says so rather than show it as now.
            let text = try harness[k].ctl(["status"]).stdout
            #expect(text.contains("as this node last read them from the database (it is disconnected now"), "node \(k): \(text)")
            let scrape = try Scrape.parse(harness[k].ctl(["metrics"]).stdout)
            let gauge = scrape.value("opqueued_inbox_files")
            #expect(gauge == Double(onDisk), "node \(k): opqueued_inbox_files \(gauge), \(onDisk) on disk")
            #expect(scrape.types["opqueued_cluster_connected"] == "gauge" && scrape.value("opqueued_cluster_connected") == 0,
                    "node \(k): an alert on the gauge sees the outage")
            waiting += onDisk
        }
        #expect(waiting >= 10)
        let restartedAt = Date()
        try harness.startDatabase()
        for k in 0..<2 {
            let reconnected = try pollUntil(15) {
                try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]).contains {
                    loggedAt($0) >= restartedAt.timeIntervalSince1970 - 1
                } ? true : nil
            }
            #expect(reconnected != nil, "node \(k) logged connected after the restart (retries at most 5 s apart)")
        }
        #expect(harness.waitAll(jobs, timeout: 90).isEmpty)
        let outboxes = harness.outboxJobs()
        for job in jobs { #expect(outboxes[job]?.count == 1, "\(job): \(outboxes[job] ?? [])") }
        #expect(try harness.sql("SELECT count(*) FROM opq_live") == "0")
        for k in 0..<2 {
            let scrape = try Scrape.parse(harness[k].ctl(["metrics"]).stdout)
            #expect(scrape.value("opqueued_cluster_connected") == 1, "node \(k)")
            #expect(scrape.value("opqueued_cluster_wakeups_arriving") == 1, "node \(k)")
            let live = try pollUntil(10) {
                try Scrape.parse(harness[k].ctl(["metrics"]).stdout).value("opqueued_cluster_nodes_connected") == 2 ? true : nil
            }
            #expect(live != nil, "node \(k) counts both nodes connected")
        }
    }

    /// A failover that leaves `cluster.database` on a standby, or an operator's `default_transaction_read_only`:
    /// the database answers but takes no write. The nodes say so (not just "cannot reach"), keep serving, run
    /// nothing they cannot record, keep what is dropped meanwhile, and once writes are taken again run every job
    /// exactly once.
    @Test func aDatabaseThatTakesNoWritesLosesNothingAndSaysWhy() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 4)
        let before = try dropSleepJobs(harness, "rw", 0..<6, seconds: 0)
        #expect(harness.waitAll(before, timeout: 30).isEmpty)
        let disconnectedBefore = try (0..<2).map {
            try harness.journal(node: $0, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]).count
        }
        // As a failover: the primary goes away (the outage begins with a connection that fails), and what answers
        // at the URL afterwards takes no writes (read-only from the next session on).
        _ = try harness.sql("ALTER DATABASE \(harness.database) SET default_transaction_read_only = on")
        harness.stopDatabase()
        for k in 0..<2 {
            let out = try pollUntil(20) {
                try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]).count > disconnectedBefore[k]
                    ? true : nil
            }
            #expect(out != nil, "node \(k) logged disconnected while the server was down\n\(harness[k].logTail())")
        }
        try harness.startDatabase()
        let during = try dropSleepJobs(harness, "ro", 0..<8, seconds: 0)
        for k in 0..<2 {
            let said = try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]).last
            #expect(said?["OPQ_ERROR"]?.contains("read-only") == false, "node \(k): the outage began without the server: \(said ?? [:])")
            // The outage's first error is the lost server; the node then says, once, what it meets next.
            let since = said.map(loggedAt) ?? 0
            let why = try pollUntil(10) { () -> [[String: String]]? in
                let saying = try harness.journal(node: k, ["OPQ_EVENT": "cluster"]).filter {
                    loggedAt($0) >= since && ($0["OPQ_ERROR"] ?? "").contains("read-only transaction")
                }
                return saying.isEmpty ? nil : saying
            }
            #expect(why?.first?["OPQ_ERROR"]?.contains("takes no writes") == true, "node \(k): \(why ?? [])\n\(harness[k].logTail())")
            #expect(harness[k].isReady, "node \(k) keeps serving its socket")
        }
        usleep(2_000_000)
        for k in 0..<2 {
            let saying = try harness.journal(node: k, ["OPQ_EVENT": "cluster"])
                .filter { ($0["OPQ_ERROR"] ?? "").contains("read-only transaction") }
            #expect(saying.count == 1, "node \(k) said it once, though it retries every few seconds: \(saying.map { $0["MESSAGE"] ?? "" })")
        }
        let outboxes = harness.outboxJobs()
        for job in during { #expect(outboxes[job] == nil, "\(job) ran while no end could be recorded") }
        let waiting = (0..<2).map { harness[$0].list("inbox").count + harness[$0].list("active/.submissions").count }.reduce(0, +)
        #expect(waiting == during.count, "every manifest dropped meanwhile waits on disk: \(waiting)")
        let text = try harness[0].ctl(["status"]).stdout
        #expect(text.contains("read-only transaction"), "status says why: \(text)")

        _ = try harness.sql("BEGIN READ WRITE; ALTER DATABASE \(harness.database) RESET default_transaction_read_only; COMMIT")
        _ = try harness.sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        #expect(harness.waitAll(during, timeout: 60).isEmpty)
        let after = harness.outboxJobs()
        for job in before.union(during) { #expect(after[job]?.count == 1, "\(job): \(after[job] ?? [])") }
        #expect(try harness.sql("SELECT count(*) FROM opq_live") == "0")
    }

    /// Through the real binaries: a node behind PgBouncer in transaction mode runs the jobs dropped into its inbox
    /// (by the poll) and says, in the journal, in `status` (text and JSON) and in its metrics, that wake-ups do not
    /// reach it; a node beside it on the database itself says they do.
    @Test func aNodeBehindATransactionPoolerSaysSoEverywhereAnOperatorLooks() throws {
        let harness = try ClusterHarness(nodes: 2, start: false)
        let bouncer = try PgBouncer(server: harness.server, database: harness.database, role: harness.role, password: harness.rolePassword)
        defer { bouncer.stop() }
        var section = try #require(harness[0].settings["cluster"] as? [String: Any])
        section["database"] = bouncer.url(harness.database)
        harness[0].settings["cluster"] = section
        try harness.startAll()
        try harness.waitRegistered(2)

        let warned = try pollUntil(30) {
            try harness.journal(node: 0, ["PRIORITY": "4"]).first { $0["MESSAGE"]?.contains("wake-ups do not reach node") == true }
        }
        #expect(warned != nil, "the pooled node warns in the journal")
        #expect((try harness[0].statusJSON()["cluster"] as? [String: Any])?["wakeupsArrive"] as? Bool == false)
        #expect(try harness[0].ctl(["status"]).stdout.contains("wake-ups do not reach this node"))
        let pooled = try Scrape.parse(harness[0].ctl(["metrics"]).stdout)
        #expect(pooled.types["opqueued_cluster_wakeups_arriving"] == "gauge" && pooled.value("opqueued_cluster_wakeups_arriving") == 0)
        #expect((try harness[1].statusJSON()["cluster"] as? [String: Any])?["wakeupsArrive"] as? Bool == true)
        #expect(try Scrape.parse(harness[1].ctl(["metrics"]).stdout).value("opqueued_cluster_wakeups_arriving") == 1)
        #expect(try harness.journal(node: 1).allSatisfy { $0["MESSAGE"]?.contains("wake-ups do not reach") != true })

        let job = uniqueJob("pooled")
        try harness[0].drop(job + ".plist", sleepJob(job, 0.1))
        #expect(harness.waitAll([job], timeout: 30).isEmpty, "jobs still run through the pooler")
    }

    /// SPEC §8: once a node knows the database is away it leaves new manifests in its inbox, where the operator sees
    /// them and may move them to a node that can reach it; each goes in exactly once when the database returns.
    @Test func aDisconnectedNodeLeavesNewManifestsInItsInbox() throws {
        let harness = try ClusterHarness(nodes: 1, leaseSeconds: 4)
        #expect(harness[0].waitConnected())
        harness.stopDatabase()
        #expect(try harness.waitJournal(["OPQ_NODE": harness[0].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"],
                                        timeout: 15) != nil)
        var jobs: [String] = []
        for _ in 0..<3 {
            let job = uniqueJob("away")
            try harness[0].drop(job + ".plist", sleepJob(job, 0))
            jobs.append(job)
        }
        usleep(2_000_000)
        #expect(Set(harness[0].list("inbox")) == Set(jobs.map { $0 + ".plist" }), "\(harness[0].list("inbox"))")
        #expect(harness[0].list("active/.submissions").isEmpty, "nothing taken while the node knows the database is away")
        #expect(try harness.journal(node: 0, ["OPQ_EVENT": "job", "OPQ_STATE": "received"]).isEmpty)
        let status = try harness[0].statusJSON()
        #expect(status["waiting"] as? Int == 3 && status["submissions"] == nil, "\(status)")
        try harness.startDatabase()
        for job in jobs { #expect(harness.waitResult(job, timeout: 30)?.result["status"] as? String == "succeeded", "\(job)") }
        let outboxes = harness.outboxJobs()
        for job in jobs { #expect(outboxes[job]?.count == 1, "\(job): \(outboxes[job] ?? [])") }
    }

    // MARK: 2. A node started while the database is down

    @Test func nodeStartedWithTheDatabaseDownBecomesReady() throws {
        let harness = try ClusterHarness(nodes: 1, start: false)
        harness.stopDatabase()
        try harness[0].start(timeout: 30)
        #expect(try harness.waitJournal(["OPQ_NODE": harness[0].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]) != nil)
        let job = uniqueJob("late")
        try harness[0].drop(job + ".plist", sleepJob(job, 0))
        usleep(1_500_000)
        // Still in the inbox, or claimed and waiting for its insert (active/, or a hidden folder under it).
        let waitingCopies = harness[0].list("inbox") + harness[0].list("active") + harness[0].list("active/.submissions")
        #expect(!waitingCopies.isEmpty, "the manifest waits on the node")
        #expect(harness[0].result(job) == nil)
        // …and is counted as waiting: the node reads its inbox though it cannot submit yet.
        let counted = try pollUntil(5) {
            try harness[0].statusJSON()["waiting"] as? Int == 1
                && Scrape.parse(harness[0].ctl(["metrics"]).stdout).value("opqueued_inbox_files") == 1 ? true : nil
        }
        #expect(counted != nil, "status: \(String(describing: try? harness[0].statusJSON()["waiting"])) waiting, one manifest in the inbox")
        // Every queue is held until the node has read which are suspended cluster-wide, and status says so (not "yes",
        // as for a queue someone suspended); it has read no node yet.
        let before = try harness[0].ctl(["status"]).stdout
        let queueLines = before.split(separator: "\n").filter { $0.hasPrefix("default ") || $0.hasPrefix("io ") }
        #expect(queueLines.count == 2 && queueLines.allSatisfy { $0.hasSuffix("  held") }, "\(before)")
        #expect(before.contains("held: no operation starts on these queues until this node has read from the database"), "\(before)")
        #expect(before.contains("the nodes: not read from the database yet") && !before.contains("\nNODE "), "\(before)")
        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(harness[0].ctl(["status", "--json"]).stdout.utf8)) as? [String: Any])
        let queues = json["queues"] as? [[String: Any]] ?? []
        #expect(!queues.isEmpty && queues.allSatisfy { $0["suspended"] as? Bool == true && $0["held"] as? Bool == true }, "\(queues)")
        // A job this node does not run cannot be looked up now: "try again" (exit 3), never "unknown job" (exit 1).
        for command in [["cancel", "elsewhere-job"], ["show", "elsewhere-job"]] {
            let answer = try harness[0].ctl(command)
            #expect(answer.status == 3 && answer.stderr.contains("cannot be asked now") && answer.stderr.contains("try again"),
                    "\(command): exit \(answer.status): \(answer.stderr)")
        }
        try harness.startDatabase()
        #expect(try harness.waitJournal(["OPQ_NODE": harness[0].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "connected"],
                                        timeout: 15) != nil)
        #expect(harness.waitResult(job, timeout: 30)?.result["status"] as? String == "succeeded")
        let after = try harness[0].ctl(["status"]).stdout
        #expect(!after.contains("held") && after.contains("\nNODE ") && after.contains(harness[0].name + "  yes"), "\(after)")
        // With the database back, the same questions have their answers.
        #expect(try harness[0].ctl(["cancel", "elsewhere-job"]).status == 1)
        #expect(try harness[0].ctl(["cancel", job]).stderr.contains("already ended"))
    }

    /// A node restarted without `cluster` (taken out by an edit of its configuration) would run alone what it had set
    /// aside for the cluster or claimed from it, while the cluster runs them too. It refuses to start, naming them and
    /// what to do, and touches nothing; started with its cluster configuration again, it runs each once; then, with
    /// nothing of the cluster's left in active/, it starts alone.
    @Test func aNodeRestartedWithoutClusterRefusesTheClustersJobs() throws {
        let harness = try ClusterHarness(nodes: 1, leaseSeconds: 3, logTarget: "console")
        let node = harness[0]
        let clusterSettings = node.settings
        func startAlone() throws -> (status: Int32?, log: String) {
            node.settings["cluster"] = nil
            let before = (try? String(contentsOfFile: node.logPath, encoding: .utf8))?.count ?? 0
            try node.launch()
            let status = node.waitExit(timeout: 20)
            if status == nil { node.kill9() }  // it did not refuse: the expectations below say so; nothing left running
            let log = String(((try? String(contentsOfFile: node.logPath, encoding: .utf8)) ?? "").dropFirst(before))
            node.settings = clusterSettings
            return (status, log)
        }

        // A manifest set aside while the database is away (the node has joined once: it knows what the cluster runs).
        #expect(node.waitConnected())
        let waiting = uniqueJob("waiting")
        harness.stopDatabase()
        try node.drop(waiting + ".plist", sleepJob(waiting, 0))
        #expect(pollUntil(10) { node.list("active/.submissions").count == 1 ? true : nil } != nil, "set aside: \(node.list("inbox"))")
        #expect(node.stop() == 0)
        let first = try startAlone()
        #expect(first.status == 1)
        #expect(first.log.contains("active/ holds 1 manifest set aside for it (active/.submissions/: ")
                    && first.log.contains("the configuration has no cluster"),
                "\(first.log)")
        #expect(node.list("active/.submissions").count == 1 && node.list("outbox").isEmpty, "untouched")

        // Back in the cluster, it runs; then a job claimed from the database, left by a kill -9.
        try harness.startDatabase()
        try node.start()
        #expect(harness.waitResult(waiting, timeout: 30)?.result["status"] as? String == "succeeded")
        let claimed = uniqueJob("claimed")
        try node.drop(claimed + ".plist", sleepJob(claimed, 4))
        #expect(pollUntil(15) { node.list("active").contains(claimed) ? true : nil } != nil)
        node.kill9()
        let second = try startAlone()
        #expect(second.status == 1)
        #expect(second.log.contains("active/ holds 1 job claimed from the cluster's database (active/: \(claimed)), "
                                    + "and the configuration has no cluster"), "\(second.log)")
        let once = try runProgram(binariesFolder + "/opqueued", ["--spool", node.spool, "--once", "--log-target", "console"])
        #expect(once.status == 1 && once.stderr.contains("job claimed from the cluster's database"), "--once: \(once.stderr)")
        #expect(node.list("active").contains(claimed) && node.result(claimed) == nil, "untouched")

        try node.start()
        #expect(harness.waitResult(claimed, timeout: 40)?.result["status"] as? String == "succeeded")
        #expect(node.stop() == 0)
        node.settings["cluster"] = nil
        try node.start()
        #expect(node.isReady, "runs alone now")
        #expect(harness.outboxes(holding: waiting) == [0] && harness.outboxes(holding: claimed) == [0])
        node.stop()
    }

    /// One node of a fresh cluster executing `job`, a sleep of `seconds`.
    private func oneNodeExecuting(_ prefix: String, seconds: Double) throws -> (harness: ClusterHarness, job: String) {
        let harness = try ClusterHarness(nodes: 1, leaseSeconds: 3)
        let job = uniqueJob(prefix)
        try harness[0].drop(job + ".plist", sleepJob(job, seconds))
        #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "executing"]) != nil)
        return (harness, job)
    }

    /// Deletes `job`'s row, as restoring the database from a backup older than the job does.
    private func forgetRow(_ job: String, in harness: ClusterHarness) throws {
        #expect(try harness.sql("WITH gone AS (DELETE FROM opq_jobs WHERE id = '\(job)' RETURNING id) SELECT count(*) FROM gone") == "1")
    }

    /// `job` ran to its end once, on node 0, and its row says so.
    private func expectEndedOnce(_ job: String, in harness: ClusterHarness) throws {
        #expect(harness.waitResult(job, timeout: 40)?.result["status"] as? String == "succeeded")
        #expect(harness.outboxes(holding: job) == [0])
        #expect(try harness.sql("SELECT state FROM opq_job_states WHERE id = '\(job)'") == "finished")
    }

    /// The database restored, while a node was down, from a backup older than a job the node held: no row for it.
    /// The node submits it again from its copy as it starts, and it runs once.
    @Test func aJobTheRestoredDatabaseForgotRunsFromTheNodesCopy() throws {
        let (harness, job) = try oneNodeExecuting("forgotten", seconds: 5)
        harness[0].kill9()
        try forgetRow(job, in: harness)
        try harness[0].start()
        #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_NODE": harness[0].name, "PRIORITY": "4"], timeout: 20)?["MESSAGE"]?
            .contains("the database has no row for this job") == true)
        try expectEndedOnce(job, in: harness)
    }

    /// The same while the node runs the job (a restore under a running node): at its next beat it stops the job,
    /// logs `lost` saying why, and submits it again; it runs once to the end.
    @Test func aJobTheDatabaseForgetsWhileItRunsIsSubmittedAgain() throws {
        let (harness, job) = try oneNodeExecuting("forgotten-running", seconds: 6)
        try forgetRow(job, in: harness)
        let lost = try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "lost"], timeout: 15)
        #expect(lost?["OPQ_ERROR"]?.contains("the database has no row for this job any more") == true, "\(String(describing: lost))")
        try expectEndedOnce(job, in: harness)
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "claimed"]).count == 2, "claimed, then claimed again")
    }
}
