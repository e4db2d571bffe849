// SPEC §8 from outside: real opqueued nodes (.build/debug), one real PostgreSQL, the node role with only the
// documented GRANTs (Tests/Support/ClusterHarness.swift). Each test has its own database and nodes; each of the two
// suites (this one, and leases and outages in ClusterFailureTests) runs serially (two cores: more clusters at once
// would only measure the machine). Liveness bounds carry slack for a loaded
// machine; figures are measured by Benchmarks/cluster/run.sh, never asserted here.
//
// What these tests assume of the daemon, besides SPEC §8's words: `status --json` has a top-level `nodes` array and
// each queue's `suspended` in `queues`; a job no live node can run is named, with the missing queue, somewhere in
// `status` (text and JSON); the schema version is in `opq_schema_version(version)` and the jobs in `opq_jobs` (the
// store's migration 0001, Sources/ClusterStore/SQL), their states in `opq_live` and `opq_ended` (migration 0011); which
// code may run against each newer version in `opq_schema_readers(version, oldest_reader)` (migration 0006).

import Foundation
import Testing
import TestSupport
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// A fresh job id (the journal is shared with other runs: ids must never repeat).
func uniqueJob(_ prefix: String) -> String { "\(prefix)-\(String(UInt64.random(in: 1...UInt64.max), radix: 36))" }

/// A one-operation job that sleeps `seconds` (on `queue` when given).
func sleepJob(_ job: String, _ seconds: Double, queue: String? = nil) -> [String: Any] {
    ["job": job, "operations": [sleepOperation("a", seconds, queue: queue)]]
}

/// Drops a one-operation sleep job for each of `range` (ids `prefix-i-…`), job i into the inbox of node `node(i)` (by
/// default the nodes in turn); returns their ids.
func dropSleepJobs(_ harness: ClusterHarness, _ prefix: String, _ range: Range<Int>, seconds: Double, queue: String? = nil,
                   node: ((Int) -> Int)? = nil) throws -> Set<String> {
    var jobs: Set<String> = []
    for i in range {
        let job = uniqueJob("\(prefix)-\(i)")
        jobs.insert(job)
        _ = try harness[node?(i) ?? i % harness.nodes.count].drop(job + ".plist", sleepJob(job, seconds, queue: queue))
    }
    return jobs
}

/// Drops a one-operation sleep job (`prefix-…`, `seconds` long) into node `k`'s inbox and waits until a node has
/// claimed it and its operation executes; returns its id and the node that claimed it.
func startSleepJob(_ harness: ClusterHarness, _ prefix: String, seconds: Double, on k: Int,
                   sourceLocation: SourceLocation = #_sourceLocation) throws -> (job: String, node: Int) {
    let job = uniqueJob(prefix)
    _ = try harness[k].drop(job + ".plist", sleepJob(job, seconds))
    let claimed = try #require(try harness.waitClaimed(job), "\(job) not claimed", sourceLocation: sourceLocation)
    #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "executing"]) != nil, "\(job) not executing",
            sourceLocation: sourceLocation)
    return (job, claimed.node)
}

/// Real seconds since the epoch, as result.plist has them.
func epochNow() -> Double { Date().timeIntervalSince1970 }

/// When journald received a journal entry, in seconds since the epoch (0 when it does not say).
func loggedAt(_ entry: [String: String]) -> Double { (entry["__REALTIME_TIMESTAMP"].flatMap { Double($0) } ?? 0) / 1e6 }

/// The greatest number of [start, end) intervals open at one instant.
func maxOverlap(_ intervals: [(start: Double, end: Double)]) -> Int {
    var events: [(time: Double, step: Int)] = []
    for interval in intervals {
        events.append((interval.start, 1))
        events.append((interval.end, -1))
    }
    // An end and a start at the same instant do not overlap: ends first.
    events.sort { a, b in a.time != b.time ? a.time < b.time : a.step < b.step }
    var open = 0, most = 0
    for event in events {
        open += event.step
        most = max(most, open)
    }
    return most
}

@Suite("Cluster (SPEC §8)", .serialized, .onItsOwnExecutor)
struct ClusterTests {
    // MARK: 1. Schema, role

    @Test func schemaIsCreatedByTheRoleAndANewerOneIsRefused() throws {
        let harness = try ClusterHarness(nodes: 2)  // waits until both registered
        // Created once, owned by the node role (no superuser), versioned.
        #expect(try harness.sql("SELECT count(*) > 0 FROM opq_schema_version") == "t")
        #expect(try harness.sql("SELECT tableowner FROM pg_tables WHERE tablename = 'opq_jobs'") == harness.role)
        #expect(try harness.sql("SELECT rolsuper FROM pg_roles WHERE rolname = '\(harness.role)'") == "f")
        // Both nodes registered.
        let nodes = try harness.sql("SELECT string_agg(node, ',' ORDER BY node) FROM opq_nodes")
        #expect(nodes == "\(harness[0].name),\(harness[1].name)")
        // Each node's row says the schema its code knows; status shows it, and names the nodes left behind (here one
        // made to look registered by an opqueued from before schema 6).
        let newest = try harness.sql("SELECT max(version) FROM opq_schema_version")
        let schemas = try pollUntil(20) { () -> [String]? in
            let json = try JSONSerialization.jsonObject(with: Data(harness[1].ctl(["status", "--json"]).stdout.utf8)) as? [String: Any]
            let listed = (json?["nodes"] as? [[String: Any]] ?? []).map { "\($0["schema"] ?? "-")" }
            return listed.count == 2 ? listed : nil
        }
        #expect(schemas == [newest, newest])
        try harness.sql("UPDATE opq_nodes SET schema = NULL WHERE node = '\(harness[0].name)'")
        let behind = try pollUntil(20) { () -> String? in
            let text = try harness[1].ctl(["status"]).stdout
            return text.contains("older schema than \(newest) (upgrade them): \(harness[0].name)\n") ? text : nil
        }
        #expect(behind?.contains("<6") == true, "\(behind ?? "status never named the node left behind")")
        // A schema newer than the node knows: it refuses to start, saying so. Either it exits non-zero, or (SPEC §8:
        // a node that cannot use the database still starts) it stays up unconnected, never logging `connected`.
        try harness.sql("INSERT INTO opq_schema_version (version) VALUES (9999)")
        harness[1].stop()
        let relaunched = Date().timeIntervalSince1970
        try harness[1].launch()
        // Entries of the relaunched process only (by pid: journald's reception time can lag the old process's lines).
        let pid = harness[1].process.map { String($0.processIdentifier) } ?? "?"
        let since = { (entry: [String: String]) in
            entry["_PID"] == pid && loggedAt(entry) >= relaunched - 0.5
        }
        let refused = try pollUntil(30) { () -> String? in
            if !harness[1].isRunning { return harness[1].logTail(50) }
            let entries = try harness.journal(node: 1, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]).filter(since)
            return entries.map { ($0["MESSAGE"] ?? "") + " " + ($0["OPQ_ERROR"] ?? "") }
                .first { $0.contains("9999") || $0.lowercased().contains("newer") }
        }
        let said = try #require(refused, "a node started against schema 9999 neither exited nor said why")
        #expect(said.contains("9999") || said.lowercased().contains("newer"), "the refusal says why: \(said)")
        if harness[1].isRunning {
            usleep(2_000_000)
            #expect(try harness.journal(node: 1, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]).filter(since).isEmpty)
        } else {
            #expect(harness[1].process?.terminationStatus != 0)
            try harness[1].launch()
        }
        // The newer version says code of the node's version may still run against it (it only added what that code
        // never touches: how nodes are upgraded one by one): the node joins at its next retry, says it should be
        // upgraded, and runs jobs.
        try harness.sql("INSERT INTO opq_schema_readers SELECT 9999, max(version) FROM opq_schema_readers")
        let joined = try pollUntil(30) { () -> Bool? in
            let current = harness[1].process.map { String($0.processIdentifier) }
            return try harness.journal(node: 1, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]).contains { $0["_PID"] == current }
                ? true : nil
        }
        #expect(joined == true, "\(harness[1].logTail())")
        #expect(
            try harness.journal(node: 1)
                .contains { ($0["MESSAGE"] ?? "").contains("version 9999, newer than") && ($0["MESSAGE"] ?? "").contains("upgrade node") })
        let job = uniqueJob("newer-schema")
        try harness[1].drop(job + ".plist", sleepJob(job, 0))
        #expect(harness.waitResult(job, timeout: 30)?.result["status"] as? String == "succeeded")
    }

    // MARK: 2, 3, 7. Submission on one node, placement on both, results

    @Test func twoNodesRunJobsSubmittedOnOne() throws {
        let harness = try ClusterHarness(nodes: 2, clusterSettings: { _ in ["jobSlots": 2] })
        var jobs = try dropSleepJobs(harness, "both", 0..<16, seconds: 0.4, node: { _ in 0 })
        // And one through `opqueuectl submit` on the other node.
        let file = harness.folder + "/submitted.plist"
        let submitted = uniqueJob("ctl")
        try propertyListData(sleepJob(submitted, 0)).write(to: URL(fileURLWithPath: file))
        let submit = try harness[1].ctl(["submit", file])
        #expect(submit.status == 0, "\(submit.stderr)")
        let submittedID = submit.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(submittedID == submitted)
        jobs.insert(submittedID)
        // Submitted again on the other node, the id it asks for is taken in the cluster: submit prints the one the
        // cluster gave it.
        let again = try harness[0].ctl(["submit", file])
        #expect(again.status == 0 && again.stdout == submitted + ".1\n", "\(again.stdout)\(again.stderr)")
        jobs.insert(submitted + ".1")

        // The same requested id on both nodes: ids are unique across the cluster (SPEC §2's `.1` rule).
        let twin = uniqueJob("twin")
        try harness[0].drop("twin-a.plist", sleepJob(twin, 0))
        try harness[1].drop("twin-b.plist", sleepJob(twin, 0))

        #expect(harness.waitAll(jobs, timeout: 60).isEmpty)
        #expect(harness.waitAll([twin, twin + ".1"], timeout: 20).isEmpty, "both twins end, under two ids")
        let outboxes = harness.outboxJobs()
        #expect(outboxes[twin]?.count == 1 && outboxes[twin + ".1"]?.count == 1)
        var ranOn: Set<String> = []
        for job in jobs {
            #expect(outboxes[job]?.count == 1, "\(job) in outboxes \(outboxes[job] ?? [])")
            guard let k = outboxes[job]?.first, let result = harness[k].result(job) else { continue }
            #expect(result["status"] as? String == "succeeded")
            #expect(result["node"] as? String == harness[k].name, "result.plist names the node that ran it")
            #expect(result["submittedOn"] as? String == (job == submittedID ? harness[1].name : harness[0].name))
            // The cluster's record of the end holds the very bytes of the outbox's result.plist.
            let published = FileManager.default.contents(atPath: harness[k].spool + "/outbox/" + job + "/result.plist")
            let recorded = try harness.sql("SELECT encode(result, 'hex') FROM opq_ended WHERE id = '\(job)'")
            #expect(published.map { $0.map { String(format: "%02x", $0) }.joined() } == recorded,
                    "\(job): the database's result differs from result.plist")
            ranOn.insert(harness[k].name)
        }
        #expect(ranOn.count == 2, "both nodes ran jobs: \(ranOn)")
        // Nothing is left in any inbox or active/.
        for node in harness.nodes { #expect(node.list("inbox").isEmpty); #expect(node.list("active").isEmpty) }

        // status --json on either node lists both nodes (SPEC §8's `nodes` objects).
        let status = try harness[1].statusJSON()
        let nodes = try #require(status["nodes"] as? [[String: Any]])
        #expect(Set(nodes.compactMap { $0["node"] as? String }) == [harness[0].name, harness[1].name])
        for node in nodes {
            #expect(node["connected"] as? Bool == true)
            #expect((node["lastHeartbeat"] as? Double).map { abs($0 - epochNow()) < 60 } == true)
            #expect(node["jobs"] as? Int != nil)
            #expect(node["freeSlots"] as? Int != nil)
        }
        // show / graph answer for a job that ran on the other node.
        let ranElsewhere = try #require(jobs.first { outboxes[$0]?.first == 0 })
        let show = try harness[1].ctl(["show", ranElsewhere])
        #expect(show.status == 0 && show.stdout.contains(harness[0].name), "\(show.stdout)\(show.stderr)")
        let waited = try harness[1].ctl(["wait", ranElsewhere, "--timeout", "5"])
        #expect(waited.status == 0 && waited.stdout == "\(ranElsewhere): succeeded (on \(harness[0].name))\n", "\(waited)")
        #expect(try harness[1].ctl(["graph", ranElsewhere]).stdout.contains("digraph"))

        // The journal: each job claimed once, by a node that says who it is.
        for job in jobs.prefix(4) {
            let claimed = try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "claimed"])
            #expect(claimed.count == 1)
            #expect(claimed.first?["OPQ_FROM_NODE"] == nil)
            #expect(claimed.first.flatMap { $0["MESSAGE_ID"] }?.count == 32)
        }
        #expect(try !harness.journal(node: 0).isEmpty && !harness.journal(node: 1).isEmpty)
        // Every entry a node logs carries OPQ_NODE (SPEC §4, §8).
        for job in jobs.prefix(4) {
            let story = try harness.journal(["OPQ_JOB": job])
            #expect(!story.isEmpty)
            #expect(story.allSatisfy { $0["OPQ_NODE"].map { harness.index(of: $0) != nil } == true })
        }
    }

    /// A flood into one node's inbox is submitted a round at a time, each behind the jobs the cluster handed this
    /// node meanwhile: the node starts running jobs while most of the flood still waits in its inbox, rather than
    /// holding the jobs it claimed (under its lease, unrun) until the whole inbox is in the database.
    @Test func aFloodIntoANodesInboxDoesNotHoldUpTheJobsItRuns() throws {
        let harness = try ClusterHarness(nodes: 1)
        // 3,000: the shell hands manifests over 256 at a time, and under the whole suite's load the first claim has
        // come after four such rounds (1,024 of 2,000 received) — still a minority of a flood this size.
        let count = 3_000
        let tag = uniqueJob("flood")
        let inbox = harness[0].spool + "/inbox/"
        for i in 0..<count {
            try propertyListData(sleepJob("\(tag)-\(i)", 0)).write(to: URL(fileURLWithPath: inbox + ".\(i).plist"))
        }
        // All at once, as fast as renames go.
        for i in 0..<count where rename(inbox + ".\(i).plist", inbox + "\(i).plist") != 0 {
            throw SupportFailure("rename: \(String(cString: strerror(errno)))")
        }
        let jobs = Set((0..<count).map { "\(tag)-\($0)" })
        #expect(harness.waitAll(jobs, timeout: 120).isEmpty)
        // The node's story in order: how many manifests it had received when it accepted its first job to run.
        let states = try harness.journal(node: 0, ["OPQ_EVENT": "job"]).compactMap { $0["OPQ_STATE"] }
        #expect(states.filter { $0 == "received" }.count == count)
        let firstAccepted = try #require(states.firstIndex(of: "accepted"))
        let receivedBefore = states[..<firstAccepted].filter { $0 == "received" }.count
        print("ClusterTests: \(receivedBefore) of \(count) manifests received before the first job was accepted to run")
        #expect(receivedBefore <= count / 2, "\(receivedBefore) of \(count) manifests were taken from the inbox before any job ran")
    }

    // MARK: 7. sharedOutbox

    @Test func sharedOutboxHoldsEveryResultOnce() throws {
        let shared = NSTemporaryDirectory() + "opq-shared-" + uniqueJob("outbox")
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: shared) }
        let harness = try ClusterHarness(nodes: 2, clusterSettings: { _ in ["sharedOutbox": shared] })
        var jobs = try dropSleepJobs(harness, "shared", 0..<8, seconds: 0.2)
        let rejected = uniqueJob("shared-rejected")
        try harness[1].drop(rejected + ".plist", ["job": rejected, "operations": [["id": "x", "kind": "teleport"]]])
        jobs.insert(rejected)
        let published = pollUntil(40) { () -> Set<String>? in
            let names = Set(((try? FileManager.default.contentsOfDirectory(atPath: shared)) ?? []).filter { !$0.hasPrefix(".") })
            return jobs.isSubset(of: names) ? names : nil
        }
        #expect(published == jobs, "every job, the rejected one too, under sharedOutbox and nothing else")
        #expect(harness.outboxJobs().isEmpty, "nothing in the nodes' own outboxes")
        for job in jobs {
            let data = FileManager.default.contents(atPath: shared + "/" + job + "/result.plist")
            let result = data.flatMap { try? PropertyListSerialization.propertyList(from: $0, format: nil) as? [String: Any] }
            #expect(result?["status"] as? String == (job == rejected ? "rejected" : "succeeded"))
            if job != rejected { #expect((result?["node"] as? String).flatMap { harness.index(of: $0) } != nil) }
        }
    }

    // MARK: 8. sslmode

    @Test func sslModeRequireIsHonoured() throws {
        // The throwaway server has no TLS: a node told `sslmode=require` must not fall back to plain text.
        let harness = try ClusterHarness(nodes: 1, start: false)
        var section = harness[0].settings["cluster"] as? [String: Any] ?? [:]
        section["database"] = harness.url.replacingOccurrences(of: "sslmode=disable", with: "sslmode=require")
        harness[0].settings["cluster"] = section
        try harness[0].start()
        #expect(try harness.waitJournal(["OPQ_NODE": harness[0].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]) != nil)
        usleep(2_000_000)
        #expect(try harness.journal(node: 0, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]).isEmpty, "connected without TLS")
        #expect(try harness.sql("SELECT count(*) FROM pg_stat_activity WHERE usename = '\(harness.role)'") == "0")
    }

    /// A node on the database's own machine reaches it through the server's Unix-domain socket, as libpq's URLs
    /// say (`host=` a folder), with peer authentication: the system says who connects, no password anywhere. The
    /// other node comes over TCP with its password; jobs dropped on either run, and the socket node's session is
    /// one the server sees without an address.
    @Test func aNodeOnTheDatabasesMachineConnectsThroughTheSocketWithoutAPassword() throws {
        let harness = try ClusterHarness(nodes: 2, start: false)
        // The operating system's user this test runs as logs in as the node role, by the server's peer check.
        let me = try #require(getpwuid(geteuid())).pointee.pw_name.map { String(cString: $0) } ?? "root"
        let data = harness.server.folder + "/data"
        let hba = try String(contentsOfFile: data + "/pg_hba.conf", encoding: .utf8)
        try ("local \(harness.database) \(harness.role) peer map=opq\n" + hba).write(
            toFile: data + "/pg_hba.conf", atomically: false, encoding: .utf8)
        try "opq \(me) \(harness.role)\n".write(toFile: data + "/pg_ident.conf", atomically: false, encoding: .utf8)
        try harness.server.psql("postgres", "SELECT pg_reload_conf()")
        var section = harness[1].settings["cluster"] as? [String: Any] ?? [:]
        section["database"] = "postgresql://\(harness.role)@/\(harness.database)?host=\(harness.server.folder)&port=\(harness.server.port)"
        section["passwordFile"] = nil
        harness[1].settings["cluster"] = section
        try harness.startAll()
        try harness.waitRegistered(2)
        #expect(try harness.waitJournal(["OPQ_NODE": harness[1].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]) != nil,
                "\(harness[1].logTail())")

        let jobs = [uniqueJob("sock-a"), uniqueJob("sock-b")]
        try harness[0].drop(jobs[0] + ".plist", sleepJob(jobs[0], 0))
        try harness[1].drop(jobs[1] + ".plist", sleepJob(jobs[1], 0))
        #expect(harness.waitAll(Set(jobs), timeout: 30).isEmpty, "\(harness.diagnosis(jobs[1]))")
        #expect(jobs.allSatisfy { harness.outboxes(holding: $0).count == 1 })
        let overSocket = try harness.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = '\(harness.role)' AND client_addr IS NULL AND client_port = -1")
        #expect((Int(overSocket) ?? 0) > 0, "no session of the node role came through the socket")
        let status = try harness[1].ctl(["status"])
        #expect(status.status == 0 && status.stdout.contains(harness[1].name), "\(status.stderr)")
    }

    /// A node stopped gracefully (SIGTERM: `systemctl stop`) hands back at once the jobs none of whose operations had
    /// started: another node runs them within seconds, not once the stopped node's lease has run out. The job it
    /// was executing stays its own in the database (resumed at its restart, or run elsewhere after the lease). While it
    /// waits out its grace it claims nothing more, not even what it handed back (it hears that NOTIFY too, and has
    /// room again): here no other node is up until it has exited, so a re-claim would hold them for the whole lease.
    @Test func aStoppedNodeHandsBackTheJobsItHadNotStarted() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 20,
                                         settings: { _ in ["shutdownGraceSeconds": 3,
                                                           "queues": ["default": ["maxConcurrentOperationCount": 1]]] },
                                         clusterSettings: { _ in ["jobSlots": 4] }, start: false)
        try harness[0].start()
        try harness.waitRegistered(1)
        let busy = uniqueJob("busy")
        try harness[0].drop(busy + ".plist", sleepJob(busy, 120))
        #expect(try harness.waitJournal(["OPQ_JOB": busy, "OPQ_OPERATION": "a", "OPQ_STATE": "executing"], timeout: 40) != nil)
        let unstarted = (0..<3).map { uniqueJob("unstarted-\($0)") }
        for job in unstarted { try harness[0].drop(job + ".plist", sleepJob(job, 0)) }
        // All four are node 0's: one executing, three claimed behind it on a queue of one.
        let held = pollUntil(20) {
            (try? harness.sql("SELECT count(*) FROM opq_live WHERE state = 'running' AND node = '\(harness[0].name)'")) == "4"
                ? true : nil
        }
        #expect(held == true, "\(harness.diagnosis(unstarted[0]))")
        let stopping = epochNow()
        #expect(harness[0].stop() == 0)
        try harness[1].start()
        for job in unstarted {
            let ran = harness.waitResult(job, timeout: 40)
            #expect(ran?.node == 1 && ran?.result["status"] as? String == "succeeded", "\(job): \(harness.diagnosis(job))")
            // Well within the 20 s lease the other node would otherwise have waited out.
            #expect(((ran?.result["finishedAt"] as? Double) ?? .infinity) - stopping < 10, "\(job) ran only after the lease")
            let lost = try harness.journal(node: 0, ["OPQ_JOB": job, "OPQ_STATE": "lost"])
            #expect(lost.first?["OPQ_ERROR"]?.contains("handed back") == true, "\(lost)")
            #expect(try harness.journal(node: 0, ["OPQ_JOB": job, "OPQ_STATE": "executing"]).isEmpty)
            #expect(try harness.journal(node: 0, ["OPQ_JOB": job, "OPQ_STATE": "claimed"]).count == 1,
                    "claimed again by the node that stopped")
        }
        #expect(!harness[0].list("active").contains { unstarted.contains($0) }, "\(harness[0].list("active"))")
        #expect(try harness.sql("SELECT state || ' ' || node FROM opq_live WHERE id = '\(busy)'") == "running \(harness[0].name)")
    }

    // MARK: 3. A hand-inserted bad row

    @Test func handInsertedBadRowEndsRejected() throws {
        let harness = try ClusterHarness(nodes: 2)
        let bad = uniqueJob("badrow")
        let junk = uniqueJob("junkrow")
        // A manifest with an unknown kind, and bytes that are no property list at all.
        let manifest = try propertyListData(["job": bad, "operations": [["id": "x", "kind": "teleport"]]])
        let hex = manifest.map { String(format: "%02x", $0) }.joined()
        for (job, bytes) in [(bad, "\\x" + hex), (junk, "\\x6e6f74206120706c697374")] {
            try harness.sql("""
                INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
                VALUES ('\(job)', '\(job)', '\(bytes)'::bytea, '\(job).plist', 'psql', 0, 0, '{default}', '{}');
                \(PostgresServer.waitingFromHand)
                """)
        }
        // No NOTIFY: the nodes' poll (at least once a second) must find rows nobody announced.
        for job in [bad, junk] {
            let result = try #require(harness.waitResult(job, timeout: 20))
            #expect(result.result["status"] as? String == "rejected")
            #expect((result.result["error"] as? String)?.isEmpty == false)
        }
        #expect(harness[0].isReady && harness[1].isReady, "no node crashed")
        #expect(try harness.sql("SELECT string_agg(status, ',') FROM opq_ended WHERE id IN ('\(bad)', '\(junk)')") == "rejected,rejected")
    }

    // MARK: 8. The password

    @Test func passwordIsNeverShown() throws {
        let harness = try ClusterHarness(nodes: 2, start: false)
        // Node 1 has a wrong password: its login is refused, and the server's own message says so.
        let wrong = "wrong-\(UInt64.random(in: 1...UInt64.max))-secret"
        var section = harness[1].settings["cluster"] as? [String: Any] ?? [:]
        let wrongFile = try harness.server.passwordFile(wrong)
        // Left readable by everyone, as a careless `echo pw > file` leaves it: the node says so at start.
        chmod(wrongFile, 0o644)
        section["passwordFile"] = wrongFile
        harness[1].settings["cluster"] = section
        try harness.startAll()
        let exposed = try harness.waitJournal(["OPQ_NODE": harness[1].name, "OPQ_EVENT": "cluster", "PRIORITY": "4"])
        #expect(exposed?["MESSAGE"]?.contains("\(wrongFile) is readable by every user of this machine (mode 644)") == true,
                "\(exposed?["MESSAGE"] ?? "no warning")")
        #expect(try harness.journal(node: 0, ["OPQ_EVENT": "cluster"]).allSatisfy { !($0["MESSAGE"] ?? "").contains("is readable by") },
                "node 0's file is 0600: no warning")
        let refused = try #require(try harness.waitJournal(["OPQ_NODE": harness[1].name, "OPQ_EVENT": "cluster",
                                                            "OPQ_STATE": "disconnected"]))
        #expect(((refused["MESSAGE"] ?? "") + (refused["OPQ_ERROR"] ?? "")).contains("password authentication failed"))
        let job = uniqueJob("secret")
        try harness[0].drop(job + ".plist", sleepJob(job, 0))
        #expect(harness.waitResult(job, timeout: 20) != nil)
        // Logs, journal, status and process titles of both nodes, and a failing command's error: no password.
        for k in 0..<2 {
            let shown = try harness.everythingShown(by: k)
            #expect(!shown.contains(harness.rolePassword), "node \(k) showed the password")
            #expect(!shown.contains(wrong), "node \(k) showed the wrong password")
        }
        let errors = try harness[1].ctl(["cancel", uniqueJob("nosuch")])
        #expect(!(errors.stdout + errors.stderr).contains(wrong))
    }

    /// Password rotation without a restart: the role's password changed and the new one written into the node's
    /// passwordFile (replaced whole, as a secrets agent does); when the node's sessions are cut it logs in again
    /// with the new one, and jobs run. A node that kept the password read at start would stay disconnected
    /// ("password authentication failed") until restarted.
    @Test func aPasswordRotatedInTheFileIsUsedWhenTheNodeConnectsAgain() throws {
        let harness = try ClusterHarness(nodes: 1)
        let before = uniqueJob("rot-before")
        try harness[0].drop(before + ".plist", sleepJob(before, 0))
        #expect(harness.waitResult(before, timeout: 20) != nil)
        let rotated = "rotated-\(UInt64.random(in: 1...UInt64.max))-secret"
        try harness.server.psql("postgres", "ALTER ROLE \(harness.role) PASSWORD '\(rotated)'")
        try (rotated + "\n").write(toFile: harness.passwordFile, atomically: true, encoding: .utf8)
        let cutAt = Date()
        _ = try harness.server.psql("postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '\(harness.role)'")
        let after = uniqueJob("rot-after")
        try harness[0].drop(after + ".plist", sleepJob(after, 0))
        #expect(harness.waitResult(after, timeout: 30) != nil, "a job dropped after the rotation runs")
        let back = try pollUntil(15) {
            try harness.journal(node: 0, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]).contains {
                loggedAt($0) >= cutAt.timeIntervalSince1970
            } ? true : nil
        }
        #expect(back != nil, "the node logged connected again after its sessions were cut")
        let connected = try pollUntil(10) {
            try harness[0].statusJSON()["cluster"].flatMap { ($0 as? [String: Any])?["state"] as? String } == "connected" ? true : nil
        }
        #expect(connected != nil, "status says connected")
        #expect(!(try harness.everythingShown(by: 0)).contains(rotated), "the new password is shown nowhere")
    }

    // MARK: The bounded campaign: random kill -9 or SIGTERM of random nodes, one database restart, every job exactly once

    @Test func campaignEveryJobExactlyOnce() throws {
        let jobsCount = Int(ProcessInfo.processInfo.environment["OPQ_CLUSTER_CAMPAIGN_JOBS"] ?? "") ?? 240
        // One operation at a time per node and up to 6 jobs claimed: a node usually holds jobs it has not started when
        // it is stopped, which a graceful stop hands back.
        let harness = try ClusterHarness(nodes: 3, leaseSeconds: 3,
                                         settings: { _ in ["queues": ["default": ["maxConcurrentOperationCount": 1]]] },
                                         clusterSettings: { _ in ["jobSlots": 6] })
        var random = SplitMix(state: UInt64(ProcessInfo.processInfo.environment["OPQ_SEED"] ?? "") ?? UInt64.random(in: 1...UInt64.max))
        print("cluster campaign seed \(random.state) jobs \(jobsCount)")
        var jobs: [String] = []
        var kills = 0, stops = 0
        var restartedDatabase = false
        let batches = 12
        for batch in 0..<batches {
            for _ in 0..<(jobsCount / batches) {
                let job = uniqueJob("camp")
                jobs.append(job)
                let k = Int(random.next() % 3)
                // The node may be down right now: a manifest dropped into its inbox waits for it.
                try harness[k].drop(job + ".plist", sleepJob(job, Double(random.next() % 300) / 1000))
            }
            usleep(UInt32(300_000 + random.next() % 700_000))
            let victim = Int(random.next() % 3)
            if random.next() % 2 == 0 {
                harness[victim].kill9()
                kills += 1
            } else {
                // A graceful stop hands back at once what the node had not started, and keeps what it had (resumed at
                // its restart below, well within the lease): neither may be lost or run twice.
                let status = harness[victim].stop()
                #expect(status == 0, "node \(victim) stopped with \(status.map { "status \($0)" } ?? "a SIGKILL after 30 s")")
                stops += 1
            }
            usleep(UInt32(random.next() % 1_500_000))
            try harness[victim].start()
            if batch == batches / 2 {
                harness.stopDatabase()
                usleep(4_000_000)
                try harness.startDatabase()
                restartedDatabase = true
            }
        }
        #expect(restartedDatabase && kills + stops == batches)
        let missing = harness.waitAll(Set(jobs), timeout: 240)
        #expect(missing.isEmpty, "\(missing.count) jobs never ended: \(missing.prefix(5))")
        usleep(3_000_000) // a late duplicate would show up after the lease
        let outboxes = harness.outboxJobs()
        var duplicated: [String] = []
        for job in jobs where (outboxes[job]?.count ?? 0) > 1 { duplicated.append(job) }
        #expect(duplicated.isEmpty, "published more than once: \(duplicated.prefix(5))")
        #expect(Set(outboxes.keys) == Set(jobs), "no outbox folder other than the jobs dropped")
        for job in jobs {
            guard let k = outboxes[job]?.first, let result = harness[k].result(job) else { continue }
            #expect(result["status"] as? String == "succeeded", "\(job): \(result["status"] ?? "?")")
        }
        for node in harness.nodes { #expect(node.list("inbox").isEmpty && node.list("active").isEmpty) }
        // How many jobs the graceful stops handed back (the node logs `lost` with this reason for each).
        let handedBack = try harness.journal(["OPQ_STATE": "lost"])
            .filter { $0["OPQ_ERROR"]?.hasPrefix("handed back to the cluster at stop") == true }.count
        print("cluster campaign: \(jobs.count) jobs, \(kills) kills, \(stops) graceful stops (\(handedBack) jobs handed back),"
              + " 1 database restart, lost \(missing.count), duplicated \(duplicated.count)")
    }
}
