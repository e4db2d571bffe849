// SPEC §8 from outside: real opqueued nodes (.build/debug), one real PostgreSQL, the node role with only the
// documented GRANTs (Tests/Support/ClusterHarness.swift). Each test has its own server and nodes; the suite runs
// serially (two cores: parallel clusters would only measure the machine). Liveness bounds carry slack for a loaded
// machine; figures are measured by Benchmarks/cluster/run.sh, never asserted here.
//
// What these tests assume of the daemon, besides SPEC §8's words: `status --json` has a top-level `nodes` array and
// each queue's `suspended` in `queues`; a job no live node can run is named, with the missing queue, somewhere in
// `status` (text and JSON); the schema version is in `opq_schema_version(version)` and the jobs in `opq_jobs` (the
// store's migration 0001, Sources/ClusterStore/SQL); which code may run against each newer version in
// `opq_schema_readers(version, oldest_reader)` (migration 0006).

import Foundation
import Testing
import TestSupport

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
    #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "executing"]) != nil, "\(job) not executing", sourceLocation: sourceLocation)
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

@Suite("Cluster (SPEC §8)", .serialized)
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
            return entries.map { ($0["MESSAGE"] ?? "") + " " + ($0["OPQ_ERROR"] ?? "") }.first { $0.contains("9999") || $0.lowercased().contains("newer") }
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
            try harness.journal(node: 1, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]).contains { $0["_PID"] == harness[1].process.map { String($0.processIdentifier) } } ? true : nil
        }
        #expect(joined == true, "\(harness[1].logTail())")
        #expect(try harness.journal(node: 1).contains { ($0["MESSAGE"] ?? "").contains("version 9999, newer than") && ($0["MESSAGE"] ?? "").contains("upgrade node") })
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
            let recorded = try harness.sql("SELECT encode(result, 'hex') FROM opq_jobs WHERE id = '\(job)'")
            #expect(published.map { $0.map { String(format: "%02x", $0) }.joined() } == recorded, "\(job): the database's result differs from result.plist")
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
        try ("local \(harness.database) \(harness.role) peer map=opq\n" + hba).write(toFile: data + "/pg_hba.conf", atomically: false, encoding: .utf8)
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
        let overSocket = try harness.sql("SELECT count(*) FROM pg_stat_activity WHERE usename = '\(harness.role)' AND client_addr IS NULL AND client_port = -1")
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
                                         settings: { _ in ["shutdownGraceSeconds": 3, "queues": ["default": ["maxConcurrentOperationCount": 1]]] },
                                         clusterSettings: { _ in ["jobSlots": 4] }, start: false)
        try harness[0].start()
        try harness.waitRegistered(1)
        let busy = uniqueJob("busy")
        try harness[0].drop(busy + ".plist", sleepJob(busy, 120))
        #expect(try harness.waitJournal(["OPQ_JOB": busy, "OPQ_OPERATION": "a", "OPQ_STATE": "executing"]) != nil)
        let unstarted = (0..<3).map { uniqueJob("unstarted-\($0)") }
        for job in unstarted { try harness[0].drop(job + ".plist", sleepJob(job, 0)) }
        // All four are node 0's: one executing, three claimed behind it on a queue of one.
        let held = pollUntil(20) { (try? harness.sql("SELECT count(*) FROM opq_jobs WHERE state = 'running' AND node = '\(harness[0].name)'")) == "4" ? true : nil }
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
            #expect(try harness.journal(node: 0, ["OPQ_JOB": job, "OPQ_STATE": "claimed"]).count == 1, "claimed again by the node that stopped")
        }
        #expect(!harness[0].list("active").contains { unstarted.contains($0) }, "\(harness[0].list("active"))")
        #expect(try harness.sql("SELECT state || ' ' || node FROM opq_jobs WHERE id = '\(busy)'") == "running \(harness[0].name)")
    }

    // MARK: 4. Leases: kill -9

    @Test func killedNodesJobRunsElsewhereAndTheNodeDiscardsItWhenBack() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        // Long enough to be still running when the kill comes however slowly the journal is read on a busy machine
        // (with 6 s, once the job had ended before it).
        let (job, victim) = try startSleepJob(harness, "kill", seconds: 15, on: 0)
        let survivor = 1 - victim
        harness[victim].kill9()
        let killedAt = Date()
        let claimedAgain = try harness.waitClaimed(job, excluding: [victim], timeout: Double(harness.leaseSeconds) + 15)
        if claimedAgain == nil { Issue.record("not taken over:\n\(harness.diagnosis(job))") }
        let second = try #require(claimedAgain)
        #expect(second.node == survivor)
        #expect(second.entry["OPQ_FROM_NODE"] == harness[victim].name)
        #expect(Date().timeIntervalSince(killedAt) <= Double(harness.leaseSeconds) + 8, "taken over after the lease, not much later")
        let result = try #require(harness.waitResult(job, timeout: 40))
        #expect(result.node == survivor)
        #expect(result.result["status"] as? String == "succeeded")
        // Run from the start on the survivor (at least once per operation): its start follows the kill.
        let operation = (result.result["operations"] as? [[String: Any]])?.first
        #expect((operation?["startedAt"] as? Double).map { $0 >= killedAt.timeIntervalSince1970 - 0.5 } == true)

        // The killed node comes back: it publishes nothing for the job and logs `lost`.
        try harness[victim].start()
        #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "lost", "OPQ_NODE": harness[victim].name], timeout: 20) != nil)
        usleep(2_000_000)
        #expect(harness.outboxes(holding: job) == [survivor], "exactly one outbox folder cluster-wide")
        #expect(!harness[victim].list("active").contains(job))
    }

    // MARK: 4. Leases: SIGSTOP past the lease

    @Test func frozenNodePublishesNothingForWhatItLost() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        let (job, frozen) = try startSleepJob(harness, "frozen", seconds: 10, on: 1)
        let other = 1 - frozen
        harness[frozen].freeze()
        let second = try #require(try harness.waitClaimed(job, excluding: [frozen], timeout: Double(harness.leaseSeconds) + 15))
        #expect(second.node == other)
        #expect(second.entry["OPQ_FROM_NODE"] == harness[frozen].name)
        // Wake the frozen node while its copy of the job would still be running (sleep 10 > lease 3 + takeover)…
        harness[frozen].resume()
        // …it stops it, logs `lost`, and publishes nothing; the other node publishes the one result.
        #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "lost", "OPQ_NODE": harness[frozen].name], timeout: 15) != nil)
        let result = try #require(harness.waitResult(job, timeout: 30))
        #expect(result.node == other)
        usleep(2_000_000) // past the end the frozen node's copy would have had (it started 10 s before the other's)
        #expect(harness.outboxes(holding: job) == [other])
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "finished", "OPQ_NODE": harness[frozen].name]).isEmpty)
        #expect(harness[frozen].isReady, "the woken node goes on serving")
    }

    // MARK: 4. Leases: a step of the database server's clock

    /// A step of the database server's clock (NTP stepping, a VM moved or resumed) is neither a beat nor a silence:
    /// each node judges the others' leases by its own monotonic clock, the database's clock only telling it that a
    /// beat happened. Simulated by moving a node's last beat an hour back (what a step forward does to it) and an hour
    /// ahead (a step back).
    @Test func aStepOfTheDatabasesClockNeitherTakesALiveNodesJobNorHidesADeadOnes() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        let (job, firstNode) = try startSleepJob(harness, "clock", seconds: 5, on: 0)
        // For longer than the lease, the running node's last beat looks an hour old by the database's clock.
        let runner = harness[firstNode].name
        let until = Date().addingTimeInterval(4)
        while Date() < until {
            _ = try harness.sql("UPDATE opq_nodes SET last_heartbeat = last_heartbeat - interval '1 hour' WHERE node = '\(runner)'")
            usleep(100_000)
        }
        let result = try #require(harness.waitResult(job, timeout: 30), "\(harness.diagnosis(job))")
        #expect(result.node == firstNode, "run once, where it started")
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "lost"]).isEmpty, "never taken from the live node")
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "claimed"]).count == 1)

        // The node running the next job is killed, and its last beat moved an hour ahead: taken over after the
        // lease all the same, not an hour later.
        let (next, victim) = try startSleepJob(harness, "clock-back", seconds: 20, on: 0)
        harness[victim].kill9()
        _ = try harness.sql("UPDATE opq_nodes SET last_heartbeat = last_heartbeat + interval '1 hour' WHERE node = '\(harness[victim].name)'")
        let killedAt = Date()
        let again = try harness.waitClaimed(next, excluding: [victim], timeout: Double(harness.leaseSeconds) + 10)
        #expect(again != nil, "taken over after the lease, not after the hour:\n\(harness.diagnosis(next))")
        #expect(Date().timeIntervalSince(killedAt) <= Double(harness.leaseSeconds) + 6)
    }

    // MARK: 4. Leases: the jobs table locked by hand

    /// An operator's `VACUUM FULL opq_jobs` (or `CLUSTER`, an `ALTER TABLE`, a `LOCK TABLE`) held past the lease:
    /// no heartbeat gets through it, so each node takes it for an outage — the running job is stopped before its
    /// lease would end and logged `lost` — and once the lock is let go the job runs again; it ends exactly once.
    @Test func theJobsTableLockedPastTheLeaseIsAnOutageAndTheJobEndsOnce() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        let (job, firstNode) = try startSleepJob(harness, "locked", seconds: 8, on: 0)
        let released = DispatchSemaphore(value: 0)
        let lockedAt = Date()
        DispatchQueue.global().async {
            _ = try? harness.sql("BEGIN; LOCK TABLE opq_jobs IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(7); COMMIT")
            released.signal()
        }
        let lost = try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "lost", "OPQ_NODE": harness[firstNode].name], timeout: 15)
        #expect(lost != nil, "the running job is stopped when its lease cannot be renewed:\n\(harness.diagnosis(job))")
        #expect(Date().timeIntervalSince(lockedAt) < 6.5, "stopped before the lock is let go (lease 3 s)")
        #expect(try harness.waitJournal(["OPQ_NODE": harness[firstNode].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"], timeout: 5) != nil)
        #expect(released.wait(timeout: .now() + 20) == .success)
        let result = try #require(harness.waitResult(job, timeout: 40), "\(harness.diagnosis(job))")
        #expect(result.result["status"] as? String == "succeeded")
        let operation = (result.result["operations"] as? [[String: Any]])?.first
        #expect((operation?["startedAt"] as? Double).map { $0 >= lockedAt.timeIntervalSince1970 } == true, "run again from the start")
        usleep(1_000_000)
        #expect(harness.outboxes(holding: job).count == 1, "exactly one outbox folder cluster-wide")
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "finished"]).count == 1)
    }

    /// The same lock held for 30 s. Each node's statements stuck behind it used to wait on at the server after the
    /// node gave up on them, and the node's retries through fresh connections added more: two nodes took two more
    /// of the server's connections every 5 s, until none was left for anyone. The server now ends what a node stopped
    /// waiting for (statement_timeout, asked at connection), so the count levels off; and a node that can register
    /// but not beat is one outage — one `disconnected`, no `connected` until the lock is let go.
    @Test func aLockHeldLongIsOneOutageAndTakesNoMoreConnections() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        for k in 0..<2 {
            #expect(try harness.waitJournal(["OPQ_NODE": harness[k].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]) != nil)
        }
        func backends() throws -> Int { Int(try harness.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")) ?? -1 }
        let before = try backends()
        let released = DispatchSemaphore(value: 0)
        final class Moment: @unchecked Sendable { var date = Date.distantFuture }
        let letGo = Moment()
        DispatchQueue.global().async {
            _ = try? harness.sql("BEGIN; LOCK TABLE opq_jobs IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(30); COMMIT")
            letGo.date = Date()
            released.signal()
        }
        // From when the lock is held (a beat that got in just before it may log a `connected` after this line ran).
        let held = try pollUntil(10) { () -> Bool? in
            try harness.sql("SELECT count(*) FROM pg_locks WHERE relation = 'opq_jobs'::regclass AND mode = 'AccessExclusiveLock' AND granted") == "1" ? true : nil
        }
        #expect(held != nil)
        let lockedAt = Date()
        var most = before
        while released.wait(timeout: .now() + 1) == .timedOut {
            most = max(most, try backends())
        }
        // A beat that waited behind the lock goes through the instant it is let go, before the locker hears its
        // COMMIT's answer: what is logged in the last second counts as after.
        let releasedAt = letGo.date.addingTimeInterval(-1)
        #expect(most - before <= 14, "connections during the lock: \(before) before, at most \(most)")
        for k in 0..<2 {
            let during = { (state: String) throws -> Int in
                try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": state]).filter {
                    loggedAt($0) > lockedAt.timeIntervalSince1970 && loggedAt($0) < releasedAt.timeIntervalSince1970
                }.count
            }
            #expect(try during("disconnected") == 1, "node \(k): one outage")
            #expect(try during("connected") == 0, "node \(k): never `connected` while it cannot beat")
            let back = try pollUntil(15) {
                try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]).first { loggedAt($0) >= releasedAt.timeIntervalSince1970 - 1 }
            }
            #expect(back != nil, "node \(k) connected again once the lock was let go")
        }
        let job = uniqueJob("after-lock")
        try harness[1].drop(job + ".plist", sleepJob(job, 0))
        #expect(harness.waitResult(job, timeout: 30)?.result["status"] as? String == "succeeded")
    }

    /// The database server stops answering and closes nothing (its machine paused, a network that drops every
    /// packet): statements hang, connections stay open, new ones are never answered. The node running a job stops it
    /// before its lease ends (`lost`), every node says `disconnected` once; when the server answers again the nodes
    /// come back by themselves and the job runs again and ends exactly once.
    @Test func aDatabaseThatStopsAnsweringIsAnOutageAndTheJobEndsOnce() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        let (job, firstNode) = try startSleepJob(harness, "frozen", seconds: 5, on: 0)
        harness.server.freeze()
        let frozenAt = Date()
        let lost = try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "lost", "OPQ_NODE": harness[firstNode].name], timeout: 15)
        let stoppedAfter = Date().timeIntervalSince(frozenAt)
        // The other node's control plane answers meanwhile, at once, and says why, rather than hanging with the
        // database (show and cancel used to take 5 s each; `wait --timeout 1` 4 s, blaming a daemon that was running).
        let other = 1 - firstNode
        func timed(_ arguments: [String]) throws -> (run: ProgramResult, seconds: Double) {
            let asked = Date()
            let run = try harness[other].ctl(arguments, timeout: 20)
            return (run, Date().timeIntervalSince(asked))
        }
        let status = try timed(["status", "--json"])
        let cluster = (try? JSONSerialization.jsonObject(with: Data(status.run.stdout.utf8)) as? [String: Any])?["cluster"] as? [String: Any]
        #expect(status.seconds < 2 && cluster?["state"] as? String == "disconnected", "\(status.run.stdout.prefix(600))")
        #expect((cluster?["reason"] as? String)?.isEmpty == false, "says why")
        for arguments in [["show", job], ["cancel", job]] {
            let asked = try timed(arguments)
            #expect(asked.seconds < 2.5 && asked.run.status == 3, "\(arguments): \(asked.seconds) s, exit \(asked.run.status)")
            #expect(asked.run.stderr.contains("the cluster cannot be asked now"), "\(asked.run.stderr)")
        }
        let waited = try timed(["wait", job, "--timeout", "1"])
        #expect(waited.run.status == 2 && waited.seconds < 3, "wait --timeout 1: \(waited.seconds) s, exit \(waited.run.status)")
        #expect(waited.run.stderr.contains("the cluster cannot be asked now") && !waited.run.stderr.contains("no daemon"), "\(waited.run.stderr)")
        while Date().timeIntervalSince(frozenAt) < 12 { usleep(100_000) }
        harness.server.thaw()
        let thawedAt = Date()
        #expect(lost != nil, "the running job is stopped when its lease cannot be renewed")
        #expect(stoppedAfter < 6.5, "stopped before the server answered again (lease 3 s): after \(stoppedAfter) s")
        let result = try #require(harness.waitResult(job, timeout: 60), "\(harness.diagnosis(job))")
        #expect(result.result["status"] as? String == "succeeded")
        usleep(1_000_000)
        #expect(harness.outboxes(holding: job).count == 1, "exactly one outbox folder cluster-wide")
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "finished"]).count == 1)
        for k in 0..<2 {
            let outage = try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]).filter { loggedAt($0) > frozenAt.timeIntervalSince1970 }
            #expect(outage.count == 1, "node \(k): one outage, said once")
            let back = try pollUntil(20) {
                try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"]).first { loggedAt($0) > thawedAt.timeIntervalSince1970 - 0.5 }
            }
            #expect(back != nil, "node \(k) connected again by itself")
        }
        let next = uniqueJob("thawed")
        try harness[1].drop(next + ".plist", sleepJob(next, 0))
        #expect(harness.waitResult(next, timeout: 30)?.result["status"] as? String == "succeeded")
    }

    // MARK: 4. Leases: a node whose file system hangs

    /// A node's file system frozen (fsfreeze, as a snapshot tool does it; a dead NFS server looks the same): every
    /// write waits, none fails, and the node's heartbeats, made on threads of their own, would keep its jobs from
    /// every other node for as long as the freeze lasts. The node lets its lease go once its spool has kept it
    /// waiting for a whole lease (at least 5 s); the other node runs the job; thawed, the node logs `lost`, publishes
    /// nothing for it and goes on serving.
    @Test func aNodeWhoseFileSystemFreezesLetsItsJobRunElsewhere() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3, start: false)
        // Node 0's spool on a file system of its own, which the test can freeze.
        let spool = harness[0].spool, image = harness.folder + "/n0.img"
        try FileManager.default.createDirectory(atPath: spool, withIntermediateDirectories: true)
        for (program, arguments) in [("/usr/bin/truncate", ["-s", "64M", image]), ("/sbin/mkfs.ext4", ["-q", "-F", image]),
                                     ("/bin/mount", ["-o", "loop", image, spool])] {
            let run = try runProgram(program, arguments)
            try #require(run.status == 0, "\(program): \(run.stderr)")
        }
        var frozen = false
        defer {
            if frozen { _ = try? runProgram("/usr/sbin/fsfreeze", ["-u", spool]) }
            harness[0].kill9()
            _ = try? runProgram("/bin/umount", ["-l", spool])
        }
        try harness[0].start()
        try harness.waitRegistered(1)
        usleep(1_500_000)
        #expect(!FileManager.default.fileExists(atPath: spool + "/tmp/.alive"), "an idle node does not probe its spool")
        let (job, claimedOn) = try startSleepJob(harness, "hung", seconds: 8, on: 0)
        #expect(claimedOn == 0)
        #expect(pollUntil(5) { FileManager.default.fileExists(atPath: spool + "/tmp/.alive") ? true : nil } != nil, "probed while it has a job")
        try harness[1].start()
        try harness.waitRegistered(2)

        let freeze = try runProgram("/usr/sbin/fsfreeze", ["-f", spool])
        try #require(freeze.status == 0, "fsfreeze: \(freeze.stderr)")
        frozen = true
        let frozenAt = Date()
        let taken = try harness.waitClaimed(job, excluding: [0], timeout: 5 + Double(harness.leaseSeconds) + 15)
        if taken == nil { Issue.record("not taken over:\n\(harness.diagnosis(job))") }
        let second = try #require(taken)
        #expect(second.node == 1)
        #expect(second.entry["OPQ_FROM_NODE"] == harness[0].name)
        #expect(Date().timeIntervalSince(frozenAt) <= 5 + Double(harness.leaseSeconds) + 8, "within the bound, a lease and a takeover")
        // The node says it has left the cluster, as for an outage: in the journal, and in its status.
        let left = try harness.journal(node: 0, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]).last
        #expect(left?["MESSAGE"]?.contains("leaves the cluster until its spool answers") == true)
        #expect(left?["OPQ_ERROR"]?.hasPrefix("the spool has not answered for") == true)
        #expect(left?["MESSAGE_ID"] != nil)
        let cluster = try harness[0].statusJSON()["cluster"] as? [String: Any]
        #expect(cluster?["state"] as? String == "disconnected")
        #expect((cluster?["reason"] as? String)?.hasPrefix("the spool has not answered for") == true)
        #expect(try Scrape.parse(harness[0].ctl(["metrics"]).stdout).value("opqueued_cluster_connected") == 0, "an alert on the gauge sees it")

        let thaw = try runProgram("/usr/sbin/fsfreeze", ["-u", spool])
        #expect(thaw.status == 0, "fsfreeze -u: \(thaw.stderr)")
        frozen = false
        #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "lost", "OPQ_NODE": harness[0].name], timeout: 15) != nil)
        let result = try #require(harness.waitResult(job, timeout: 30))
        #expect(result.node == 1)
        #expect(result.result["status"] as? String == "succeeded")
        usleep(2_000_000)
        #expect(harness.outboxes(holding: job) == [1], "exactly one outbox folder cluster-wide")
        #expect(!harness[0].list("active").contains(job))
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "finished", "OPQ_NODE": harness[0].name]).isEmpty)
        #expect(pollUntil(10) { (try? harness.journal(node: 0, ["OPQ_EVENT": "cluster"]))?.contains { ($0["MESSAGE"] ?? "").contains("answers again") } == true ? true : nil } != nil)
        #expect(pollUntil(10) { (try? harness.journal(node: 0, ["OPQ_EVENT": "cluster"]))?.last?["OPQ_STATE"] == "connected" ? true : nil } != nil,
                "joins again")
        #expect(harness[0].isReady, "the thawed node goes on serving")
    }

    // MARK: 2, 4. The database stopped and started under load

    @Test func databaseRestartUnderLoadLosesNothing() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 4)
        var jobs = try dropSleepJobs(harness, "db", 0..<40, seconds: 0.3)
        usleep(1_000_000)
        harness.stopDatabase()
        // Dropped while the database is down: they wait in the inbox.
        jobs.formUnion(try dropSleepJobs(harness, "db", 40..<50, seconds: 0.1))
        for k in 0..<2 {
            #expect(try harness.waitJournal(["OPQ_NODE": harness[k].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"], timeout: 15) != nil)
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
            #expect(json["submissions"] as? Int ?? 0 == setAside && (setAside == 0) == (json["submissionsSince"] == nil), "node \(k): \(json)")
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
        #expect(try harness.sql("SELECT count(*) FROM opq_jobs WHERE state <> 'finished'") == "0")
        for k in 0..<2 {
            let scrape = try Scrape.parse(harness[k].ctl(["metrics"]).stdout)
            #expect(scrape.value("opqueued_cluster_connected") == 1, "node \(k)")
            #expect(scrape.value("opqueued_cluster_wakeups_arriving") == 1, "node \(k)")
            let live = try pollUntil(10) { try Scrape.parse(harness[k].ctl(["metrics"]).stdout).value("opqueued_cluster_nodes_connected") == 2 ? true : nil }
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
        let disconnectedBefore = try (0..<2).map { try harness.journal(node: $0, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]).count }
        // As a failover: the primary goes away (the outage begins with a connection that fails), and what answers
        // at the URL afterwards takes no writes (read-only from the next session on).
        _ = try harness.sql("ALTER DATABASE \(harness.database) SET default_transaction_read_only = on")
        harness.stopDatabase()
        for k in 0..<2 {
            let out = try pollUntil(20) { try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]).count > disconnectedBefore[k] ? true : nil }
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
            let saying = try harness.journal(node: k, ["OPQ_EVENT": "cluster"]).filter { ($0["OPQ_ERROR"] ?? "").contains("read-only transaction") }
            #expect(saying.count == 1, "node \(k) said it once, though it retries every few seconds: \(saying.map { $0["MESSAGE"] ?? "" })")
        }
        let outboxes = harness.outboxJobs()
        for job in during { #expect(outboxes[job] == nil, "\(job) ran while no end could be recorded") }
        let waiting = (0..<2).map { harness[$0].list("inbox").count + harness[$0].list("active/.submissions").count }.reduce(0, +)
        #expect(waiting == during.count, "every manifest dropped meanwhile waits on disk: \(waiting)")
        let text = try harness[0].ctl(["status"]).stdout
        #expect(text.contains("read-only transaction"), "status says why: \(text)")

        _ = try harness.sql("BEGIN READ WRITE; ALTER DATABASE \(harness.database) RESET default_transaction_read_only; COMMIT")
        _ = try harness.sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        #expect(harness.waitAll(during, timeout: 60).isEmpty)
        let after = harness.outboxJobs()
        for job in before.union(during) { #expect(after[job]?.count == 1, "\(job): \(after[job] ?? [])") }
        #expect(try harness.sql("SELECT count(*) FROM opq_jobs WHERE state <> 'finished'") == "0")
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
        #expect(try harness.waitJournal(["OPQ_NODE": harness[0].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"], timeout: 15) != nil)
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
            try harness[0].statusJSON()["waiting"] as? Int == 1 && Scrape.parse(harness[0].ctl(["metrics"]).stdout).value("opqueued_inbox_files") == 1 ? true : nil
        }
        #expect(counted != nil, "status: \(String(describing: try? harness[0].statusJSON()["waiting"])) waiting, one manifest in the inbox")
        // Every queue is held until the node has read which are suspended cluster-wide, and status says so (not "yes",
        // as for a queue someone suspended); it has read no node yet.
        let before = try harness[0].ctl(["status"]).stdout
        let queueLines = before.split(separator: "\n").filter { $0.hasPrefix("default ") || $0.hasPrefix("io ") }
        #expect(queueLines.count == 2 && queueLines.allSatisfy { $0.hasSuffix("  held") }, "\(before)")
        #expect(before.contains("held: no operation starts on these queues until this node has read from the database"), "\(before)")
        #expect(before.contains("the nodes: not read from the database yet") && !before.contains("\nNODE "), "\(before)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(harness[0].ctl(["status", "--json"]).stdout.utf8)) as? [String: Any])
        let queues = json["queues"] as? [[String: Any]] ?? []
        #expect(!queues.isEmpty && queues.allSatisfy { $0["suspended"] as? Bool == true && $0["held"] as? Bool == true }, "\(queues)")
        // A job this node does not run cannot be looked up now: "try again" (exit 3), never "unknown job" (exit 1).
        for command in [["cancel", "elsewhere-job"], ["show", "elsewhere-job"]] {
            let answer = try harness[0].ctl(command)
            #expect(answer.status == 3 && answer.stderr.contains("cannot be asked now") && answer.stderr.contains("try again"),
                    "\(command): exit \(answer.status): \(answer.stderr)")
        }
        try harness.startDatabase()
        #expect(try harness.waitJournal(["OPQ_NODE": harness[0].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "connected"], timeout: 15) != nil)
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
        #expect(first.log.contains("active/ holds 1 manifest set aside for it (active/.submissions/: ") && first.log.contains("the configuration has no cluster"),
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
        #expect(second.log.contains("active/ holds 1 job claimed from the cluster's database (active/: \(claimed)), and the configuration has no cluster"), "\(second.log)")
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
        #expect(try harness.sql("SELECT state FROM opq_jobs WHERE id = '\(job)'") == "finished")
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

    // MARK: 6. Cancel and suspend from another node

    @Test func cancelFromAnotherNodeReachesTheRunningOne() throws {
        let harness = try ClusterHarness(nodes: 2)
        let job = uniqueJob("cancel")
        try harness[0].drop(job + ".plist", ["job": job, "operations": [sleepOperation("a", 60), sleepOperation("b", 0, dependencies: ["a"])]])
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
        try harness[0].drop(whole + ".plist", ["job": whole, "operations": [sleepOperation("a", 2), sleepOperation("b", 0, dependencies: ["a"])]])
        try harness[0].drop(one + ".plist", ["job": one, "operations": [sleepOperation("a", 2), sleepOperation("b", 0)]])
        let waiting = try pollUntil(20) { () -> Bool? in
            try harness.sql("SELECT count(*) FROM opq_jobs WHERE id IN ('\(whole)', '\(one)') AND state = 'waiting'") == "2" ? true : nil
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
        let states = (partly["operations"] as? [[String: Any]] ?? []).map { "\($0["id"] ?? "?")=\($0["state"] ?? "?")/\($0["attempts"] ?? "?")" }
        #expect(states == ["a=cancelled/0", "b=succeeded/1"], "\(states)")
        #expect(partly["status"] as? String == "cancelled")
        for job in [whole, one] {
            #expect(try harness.journal(["OPQ_JOB": job, "OPQ_OPERATION": "a", "OPQ_STATE": "executing"]).isEmpty, "\(job)/a never executed")
        }
    }

    /// A whole-job cancel recorded for a waiting job that no node took (the node that asked died between its two
    /// statements, or lost the database there) is taken by any node's next control round and ends cancelled — here a
    /// job whose only queue is declared by a node long gone, which nobody would ever claim to run.
    @Test func aCancelledJobLeftWaitingIsEndedByAnyNode() throws {
        let harness = try ClusterHarness(nodes: 1)
        let job = uniqueJob("orphan")
        let manifest = String(decoding: try PropertyListSerialization.data(fromPropertyList: sleepJob(job, 0, queue: "gpu"), format: .xml, options: 0), as: UTF8.self)
        try harness.sql("""
            INSERT INTO opq_nodes (node, queues, commands, job_slots, info, last_heartbeat, lease_seconds)
            VALUES ('ghost', '{gpu}', '{}', 1, 'elsewhere', now() - interval '1 day', 5);
            INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)
            VALUES ('\(job)', '\(job)', convert_to($m$\(manifest)$m$, 'UTF8'), '\(job).plist', 'ghost', 2, 2, '{gpu}', '{}');
            INSERT INTO opq_cancel_requests (job, operation) VALUES ('\(job)', NULL);
            """)
        let ended = try #require(harness.waitResult(job, timeout: 15))
        #expect(ended.node == 0 && ended.result["status"] as? String == "cancelled")
        let operations = (ended.result["operations"] as? [[String: Any]] ?? []).map { "\($0["queue"] ?? "?") \($0["state"] ?? "?")/\($0["attempts"] ?? "?")" }
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

    // MARK: 3. Pinning

    /// A node that registered a moment ago (its row there, this node's last look at the declarations older) is
    /// known before a manifest naming its queue is rejected: the declarations are read again first.
    @Test func aQueueDeclaredAMomentAgoIsNotATypo() throws {
        let harness = try ClusterHarness(nodes: 1)
        usleep(300_000)  // the node's first look at what is declared is done
        // A node row written without the notification RegisterNode sends: this node's status thread would see it
        // only at its next round (leaseSeconds / 3 = 5 s).
        try harness.sql("""
            INSERT INTO opq_nodes (node, queues, commands, job_slots, info, last_heartbeat, lease_seconds)
            VALUES ('ghost', '{late}', '{}', 1, 'elsewhere', now(), 600)
            """)
        let job = uniqueJob("late")
        try harness[0].drop(job + ".plist", sleepJob(job, 0, queue: "late"))
        #expect(pollUntil(5) { (try? harness.sql("SELECT state FROM opq_jobs WHERE requested_id = '\(job)'")) == "waiting" ? true : nil } == true,
                "submitted to the cluster, waiting for the node that declares `late`")
        #expect(harness.outboxes(holding: job).isEmpty, "not rejected as naming an unknown queue")
    }

    @Test func queueDeclaredOnOneNodePinsItsJobsThereAndStatusNamesWhatNoLiveNodeHas() throws {
        let harness = try ClusterHarness(nodes: 2, settings: { k in k == 0 ? ["queues": ["gpu": ["maxConcurrentOperationCount": 1]]] : [:] })
        // Submitted on node 1, which does not declare `gpu`: accepted, and every one runs on node 0.
        let jobs = try dropSleepJobs(harness, "pinned", 0..<6, seconds: 0.1, queue: "gpu", node: { _ in 1 })
        #expect(harness.waitAll(jobs, timeout: 40).isEmpty)
        for job in jobs { #expect(harness.outboxes(holding: job) == [0]) }
        // `show` on node 1 of a job node 0 is running: where it runs, and its operations' states as node 0's last
        // heartbeat sent them (nodes never talk to each other: through the database, in the beat it sends anyway),
        // never a `pending` that is false while node 0 executes it.
        let long = uniqueJob("long")
        try harness[1].drop(long + ".plist", ["job": long, "operations": [sleepOperation("a", 0, queue: "gpu"),
                                                                          sleepOperation("b", 30, queue: "gpu", dependencies: ["a"])]])
        let executing = try pollUntil(20) { () -> Bool? in
            try harness[0].ctl(["show", long]).stdout.contains("executing") ? true : nil
        }
        #expect(executing != nil, "node 0 executes it")
        var elsewhere: [String: Any]?
        var states: [String] = []
        _ = try pollUntil(10) { () -> Bool? in
            elsewhere = try JSONSerialization.jsonObject(with: Data(harness[1].ctl(["show", long, "--json"]).stdout.utf8)) as? [String: Any]
            states = (elsewhere?["operations"] as? [[String: Any]] ?? []).map {
                "\($0["id"] ?? "?")=\($0["state"] ?? "-")/\($0["attempts"] ?? "-")/\($0["queue"] ?? "-")"
            }
            return states == ["a=succeeded/1/gpu", "b=executing/1/gpu"] ? true : nil
        }
        #expect(states == ["a=succeeded/1/gpu", "b=executing/1/gpu"], "as node 0's beats (every second here) said: \(states)")
        #expect(elsewhere?["status"] as? String == "running" && elsewhere?["node"] as? String == harness[0].name)
        #expect((elsewhere?["progressAt"] as? Double).map { abs($0 - epochNow()) < 5 } == true, "\(elsewhere ?? [:])")
        let text = try harness[1].ctl(["show", long]).stdout
        #expect(text.contains("on node \(harness[0].name) (states as of its heartbeat") && text.contains("executing")
                && !text.contains("pending") && !text.contains("unknown"), "\(text)")
        #expect(try harness[1].ctl(["cancel", long]).status == 0)
        #expect(harness.waitResult(long, timeout: 20)?.result["status"] as? String == "cancelled")
        // `opqueuectl submit` on node 1 validates as node 1's inbox does (SPEC §8): a `gpu` job is taken, a typo refused.
        let submitted = uniqueJob("submitted")
        let file = harness[1].spool + ".manifest.plist"
        try PropertyListSerialization.data(fromPropertyList: sleepJob(submitted, 0, queue: "gpu"), format: .xml, options: 0)
            .write(to: URL(fileURLWithPath: file))
        let taken = try harness[1].ctl(["submit", file])
        #expect(taken.status == 0 && taken.stdout == submitted + "\n", "\(taken.stdout)\(taken.stderr)")
        #expect(harness.waitResult(submitted, timeout: 20)?.node == 0)
        // `validate` checks as `submit` does: with node 1's daemon answering, `gpu` is no typo; with none (another spool),
        // node 1's configuration alone knows no `gpu`.
        let checked = try harness[1].ctl(["validate", file])
        #expect(checked.status == 0 && checked.stdout.isEmpty, "\(checked.stdout)\(checked.stderr)")
        let offline = try runProgram("opqueuectl", ["--spool", harness[1].spool + ".nodaemon", "--config", harness[1].configPath, "validate", file])
        #expect(offline.status == 1 && offline.stdout.contains("unknown queue 'gpu'"), "\(offline.stdout)\(offline.stderr)")
        try PropertyListSerialization.data(fromPropertyList: sleepJob(uniqueJob("refused"), 0, queue: "gpuu"), format: .xml, options: 0)
            .write(to: URL(fileURLWithPath: file))
        let refused = try harness[1].ctl(["submit", file])
        #expect(refused.status == 1 && refused.stderr.contains("unknown queue 'gpuu'"), "\(refused.stdout)\(refused.stderr)")
        let typoChecked = try harness[1].ctl(["validate", file])
        #expect(typoChecked.status == 1 && typoChecked.stdout.contains("unknown queue 'gpuu'"), "\(typoChecked.stdout)\(typoChecked.stderr)")
        // A queue no node declares is a typo: rejected where it was dropped.
        let typo = uniqueJob("typo")
        try harness[1].drop(typo + ".plist", sleepJob(typo, 0, queue: "gpuu"))
        let rejected = try #require(harness.waitResult(typo, timeout: 20))
        #expect(rejected.node == 1 && rejected.result["status"] as? String == "rejected")
        #expect((rejected.result["error"] as? String)?.contains("gpuu") == true)
        // Node 0 goes away: a `gpu` job is still accepted (a node that is down still counts), waits, and status says why.
        harness[0].stop()
        let waiting = uniqueJob("waits")
        try harness[1].drop(waiting + ".plist", sleepJob(waiting, 0, queue: "gpu"))
        let named = try pollUntil(20) { () -> Bool? in
            let text = try harness[1].ctl(["status"]).stdout
            let json = try harness[1].ctl(["status", "--json"]).stdout
            // SPEC §8 names the missing queue; the job itself may be listed in either form.
            return (text.contains(waiting) || json.contains(waiting)) && text.contains("gpu") && json.contains("gpu") ? true : nil
        }
        #expect(named != nil, "status names the waiting job and the queue no live node declares")
        // And each queue's cluster-wide counts (SPEC §8), in text and JSON, with when they were read.
        let counted = try pollUntil(20) { () -> String? in
            let text = try harness[1].ctl(["status"]).stdout
            return text.split(separator: "\n").contains { $0.split(separator: " ") == ["gpu", "1", "0"] } ? text : nil
        }
        #expect(counted?.contains("the cluster's jobs per queue (read from the database") == true, "\(counted ?? "no row gpu 1 0")")
        let json = try JSONSerialization.jsonObject(with: Data(harness[1].ctl(["status", "--json"]).stdout.utf8)) as? [String: Any]
        let summary = json?["cluster"] as? [String: Any]
        #expect(((summary?["queues"] as? [String: Any])?["gpu"] as? [String: Any])?["waiting"] as? Int == 1, "\(summary ?? [:])")
        #expect((summary?["queuesReadAt"] as? Double).map { abs($0 - epochNow()) < 10 } == true, "\(summary ?? [:])")
        #expect(harness[1].result(waiting) == nil)
        // Cancelled while no live node can run it: it ends at once, cancelled, published by the node that asked, its
        // operations never started — rather than wait for a node that may never come back.
        let stuck = uniqueJob("stuck")
        try harness[1].drop(stuck + ".plist", sleepJob(stuck, 0, queue: "gpu"))
        #expect(pollUntil(20) { (try? harness.sql("SELECT state FROM opq_jobs WHERE id = '\(stuck)'")) == "waiting" ? true : nil } == true)
        #expect(try harness[1].ctl(["cancel", stuck]).status == 0)
        let ended = try #require(harness.waitResult(stuck, timeout: 10))
        #expect(ended.node == 1 && ended.result["status"] as? String == "cancelled")
        let stuckOps = (ended.result["operations"] as? [[String: Any]] ?? []).map { "\($0["queue"] ?? "?") \($0["state"] ?? "?")/\($0["attempts"] ?? "?")" }
        #expect(stuckOps == ["gpu cancelled/0"], "\(stuckOps)")
        #expect(try harness[1].ctl(["cancel", stuck]).status == 1, "it has ended")
        try harness[0].start()
        #expect(harness.waitResult(waiting, timeout: 20)?.node == 0)
    }

    /// A node whose spool is full when it claims (its own file system out of inodes: a real ENOSPC): the row goes
    /// back, the node logs the fault and pauses claiming — no loop of claims and hand-backs, which a full disk
    /// turned into 78 commits per job — and runs the job once its spool works again.
    @Test func fullSpoolPausesClaimingUntilItWorksAgain() throws {
        let harness = try ClusterHarness(nodes: 2, settings: { k in k == 0 ? ["queues": ["disk": ["maxConcurrentOperationCount": 1]]] : [:] },
                                         start: false)
        let mount = harness[0].spool
        try FileManager.default.createDirectory(atPath: mount, withIntermediateDirectories: true)
        #expect(try runProgram("/bin/mount", ["-t", "tmpfs", "-o", "size=16m,nr_inodes=2048", "tmpfs", mount]).status == 0)
        defer { _ = try? runProgram("/bin/umount", ["-l", mount]) }
        try harness.startAll()
        try harness.waitRegistered(2)
        let fillers = mount + "/fillers"
        try FileManager.default.createDirectory(atPath: fillers, withIntermediateDirectories: true)
        var count = 0
        while true {
            let fd = open(fillers + "/\(count)", O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
            if fd < 0 { break }
            close(fd)
            count += 1
        }
        #expect(errno == ENOSPC)

        let job = uniqueJob("full")
        try harness[1].drop(job + ".plist", sleepJob(job, 0, queue: "disk"))
        let fault = try pollUntil(30) { try harness.journal(node: 0).first { $0["MESSAGE"]?.contains("claiming is paused") == true } }
        #expect(fault?["MESSAGE"]?.contains("No space left") == true, "\(fault ?? [:])")
        #expect(try harness.journal(node: 0, ["OPQ_JOB": job]).contains { $0["MESSAGE"]?.contains("handed back to the cluster") == true })
        let fence = try harness.sql("SELECT last_value FROM opq_fence")
        usleep(2_000_000)
        #expect(try harness.sql("SELECT last_value FROM opq_fence") == fence, "no claim while the spool is full")
        #expect(try harness.sql("SELECT state FROM opq_jobs WHERE id = '\(job)'") == "waiting")

        try FileManager.default.removeItem(atPath: fillers)
        let result = harness.waitResult(job, timeout: 30)
        #expect(result?.node == 0 && result?.result["status"] as? String == "succeeded")
        #expect(try harness.journal(node: 0).contains { $0["MESSAGE"]?.contains("the spool works again") == true })
    }

    /// SPEC §8: node names are unique in the cluster. Two processes started under one name by mistake (a
    /// configuration copied to a second machine) must not both run as it: each took the other's jobs for orphans
    /// and handed them back, and 20 jobs ran 67 times. The second now waits — `disconnected`, saying why — every
    /// job runs once; the first, killed and restarted, takes its name back at once; once it has stopped, the second
    /// joins and runs what it is given.
    @Test func aSecondProcessUnderANodesNameWaitsInsteadOfRunningJobsTwice() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 8, clusterSettings: { _ in ["node": "twin"] }, start: false)
        try harness[0].start()
        try harness.waitRegistered(1)
        try harness[1].start()
        let refused = try pollUntil(20) {
            try harness.journal(["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]).first { $0["MESSAGE"]?.contains("held by another running opqueued") == true }
        }
        #expect(refused?["MESSAGE"]?.contains("each node needs its own cluster.node") == true, "\(refused ?? [:])")
        let jobs = try dropSleepJobs(harness, "twin", 0..<20, seconds: 0.2, node: { _ in 0 })
        #expect(harness.waitAll(jobs, timeout: 60).isEmpty)
        for job in jobs {
            #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "executing"]).count == 1, "\(job) ran once")
            #expect(harness.outboxes(holding: job) == [0])
        }
        #expect(try harness.journal(["OPQ_STATE": "lost"]).isEmpty)
        let status = try harness[1].ctl(["status", "--json"]).stdout
        #expect(status.contains("held by another running opqueued"), "status says why: \(status)")
        let second = try #require(harness[1].pid)
        let saidHeld = try harness.journal(["OPQ_EVENT": "cluster"]).filter {
            $0["_PID"] == String(second) && ($0["MESSAGE"] ?? "").contains("held by another running opqueued")
        }
        #expect(saidHeld.count == 1, "said once, though it asked again every few seconds: \(saidHeld.map { $0["MESSAGE"] ?? "" })")

        // The first is killed and restarted at once (the second stopped, so that it cannot take the name in between):
        // an earlier run of the node on this machine, gone, so it takes its name back without waiting for the lease.
        harness[1].stop()
        harness[0].kill9()
        try harness[0].start()
        let back = uniqueJob("back")
        let restarted = Date()
        try harness[0].drop(back + ".plist", sleepJob(back, 0))
        #expect(harness.waitResult(back, timeout: 30)?.node == 0)
        #expect(Date().timeIntervalSince(restarted) < 6, "rejoined before the lease (8 s) ran out")

        // The first stops and the second starts again: the name's holder is gone from this machine, so it joins.
        harness[0].stop()
        try harness[1].start()
        let later = uniqueJob("later")
        try harness[1].drop(later + ".plist", sleepJob(later, 0))
        #expect(harness.waitResult(later, timeout: 30)?.node == 1)
    }

    /// Who may take a node's name from a process that holds it is judged by the taker's own clock, never the
    /// database's: with the holder's last beat moved an hour back every 100 ms (what a step of the database
    /// server's clock forward looks like), a second process under its name used to register at once, and the two
    /// took the name from each other in turn. Now the second waits, saying why, for as long as the holder beats;
    /// every job runs once. Once the holder is gone — its row saying another machine's process, so that nothing
    /// tells the second it is dead — the second takes the name after the lease by its own clock, not before, and runs
    /// what it is given.
    @Test func aNodesNameIsFreedByTheTakersClockNotTheDatabases() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3, clusterSettings: { _ in ["node": "twin"] }, start: false)
        try harness[0].start()
        try harness.waitRegistered(1)
        let holder = try #require(harness[0].pid)
        let stepped = DispatchSemaphore(value: 0)
        let stepUntil = Date().addingTimeInterval(9)
        DispatchQueue.global().async {
            while Date() < stepUntil {
                _ = try? harness.sql("UPDATE opq_nodes SET last_heartbeat = last_heartbeat - interval '1 hour' WHERE node = 'twin'")
                usleep(100_000)
            }
            stepped.signal()
        }
        try harness[1].start()
        let second = try #require(harness[1].pid)
        let jobs = try dropSleepJobs(harness, "twin-clock", 0..<5, seconds: 0.2, node: { _ in 0 })
        #expect(stepped.wait(timeout: .now() + 20) == .success)
        #expect(harness.waitAll(jobs, timeout: 60).isEmpty)
        func entries(_ pid: Int32, _ state: String) throws -> [[String: String]] {
            try harness.journal(["OPQ_EVENT": "cluster", "OPQ_STATE": state]).filter { $0["_PID"] == String(pid) }
        }
        #expect(try entries(second, "connected").isEmpty, "never took the name from the beating holder")
        #expect(try entries(second, "disconnected").contains { $0["MESSAGE"]?.contains("held by another running opqueued") == true })
        #expect(try entries(holder, "disconnected").isEmpty, "the holder kept its name")
        for job in jobs {
            #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "executing"]).count == 1, "\(job) ran once")
        }
        #expect(try harness.journal(["OPQ_STATE": "lost"]).isEmpty)

        // The holder dies, and its row says a process of another machine: nothing tells the second it is gone.
        harness[0].kill9()
        _ = try harness.sql("UPDATE opq_nodes SET info = 'opqueued pid 1 on elsewhere boot x pidns y run 1', last_heartbeat = now() - interval '1 hour' WHERE node = 'twin'")
        let rewritten = Date()
        let joined = try pollUntil(Double(harness.leaseSeconds) + 15) { try entries(second, "connected").first }
        #expect(joined != nil, "took the name once the holder had been silent for its lease")
        #expect(Date().timeIntervalSince(rewritten) >= Double(harness.leaseSeconds) - 0.1, "not before the lease by its own clock")
        let later = uniqueJob("twin-later")
        try harness[1].drop(later + ".plist", sleepJob(later, 0))
        #expect(harness.waitResult(later, timeout: 30)?.node == 1)
    }

    /// Nodes configured with different leaseSeconds: a node is lost after its own lease, not the looker's. Node 0
    /// (leaseSeconds 12) beats every 4 s; node 1 (leaseSeconds 2) used to take its jobs over between two beats,
    /// again and again. A 6 s job pinned to node 0 now runs once, and no one logs `lost`.
    @Test func eachNodeIsLostAfterItsOwnLeaseWhateverTheOthersSay() throws {
        let harness = try ClusterHarness(nodes: 2, settings: { k in k == 0 ? ["queues": ["slow": ["maxConcurrentOperationCount": 1]]] : [:] },
                                         clusterSettings: { k in ["leaseSeconds": k == 0 ? 12 : 2] })
        let job = uniqueJob("patient")
        try harness[1].drop(job + ".plist", sleepJob(job, 6, queue: "slow"))
        let result = harness.waitResult(job, timeout: 60)
        #expect(result?.node == 0 && result?.result["status"] as? String == "succeeded")
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "executing"]).count == 1, "ran once")
        #expect(try harness.journal(["OPQ_STATE": "lost"]).isEmpty)
    }

    // MARK: 3. Claim order: QoS, then queuePriority, then submission order

    @Test func jobsAreClaimedByQoSThenPriorityThenSubmissionOrder() throws {
        // `ordered` lives on node 1 only, one job at a time; node 1 is down while the jobs are submitted on node 0.
        let harness = try ClusterHarness(nodes: 2, settings: { k in
            k == 1 ? ["queues": ["ordered": ["maxConcurrentOperationCount": 1, "qualityOfService": "background"]]] : [:]
        }, clusterSettings: { k in k == 1 ? ["jobSlots": 1] : [:] })
        harness[1].stop()
        let specs: [(String, String, String)] = [("j1", "utility", "normal"), ("j2", "userInitiated", "low"), ("j3", "utility", "high"),
                                                 ("j4", "userInitiated", "low"), ("j5", "background", "veryHigh")]
        let prefix = uniqueJob("order")
        for (name, qos, priority) in specs {
            try harness[0].drop(name + ".plist", ["job": "\(prefix)-\(name)", "qualityOfService": qos, "queuePriority": priority,
                                                  "operations": [sleepOperation("a", 0.2, queue: "ordered")]])
            usleep(50_000) // submission order is the order of the inserts
        }
        let waiting = try pollUntil(20) { try harness.sql("SELECT count(*) FROM opq_jobs WHERE id LIKE '\(prefix)-%' AND state = 'waiting'") == "5" ? true : nil }
        #expect(waiting != nil, "all five inserted and waiting for the node that declares `ordered`")
        try harness[1].start()
        let ids = specs.map { "\(prefix)-\($0.0)" }
        #expect(harness.waitAll(Set(ids), timeout: 40).isEmpty)
        let started = ids.compactMap { id -> (String, Double)? in
            guard let k = harness.outboxes(holding: id).first,
                  let start = (harness[k].result(id)?["operations"] as? [[String: Any]])?.first?["startedAt"] as? Double else { return nil }
            return (id, start)
        }.sorted { $0.1 < $1.1 }.map { $0.0 }
        #expect(started == ["j2", "j4", "j3", "j1", "j5"].map { "\(prefix)-\($0)" })
    }

    // MARK: 5. clusterMaxConcurrentOperationCount

    @Test func clusterLimitIsNeverExceeded() throws {
        let settings: [String: Any] = ["queues": ["api": ["maxConcurrentOperationCount": 2, "clusterMaxConcurrentOperationCount": 2]]]
        let harness = try ClusterHarness(nodes: 3, settings: { _ in settings }, clusterSettings: { _ in ["jobSlots": 4] })
        let jobs = try dropSleepJobs(harness, "limit", 0..<18, seconds: 0.5, queue: "api")
        // One node killed while it holds a slot and restarted within its lease: the new process keeps the node's
        // lease alive, so no takeover frees what the dead one held — the new process must (else the queue stalls).
        let holding = try pollUntil(30) { () -> Bool? in
            try harness.sql("SELECT count(*) FROM opq_queue_slots WHERE holder = '\(harness[2].name)'") != "0" ? true : nil
        }
        #expect(holding != nil, "node 2 took a slot of `api`")
        harness[2].kill9()
        usleep(200_000)
        try harness[2].start()
        #expect(harness.waitAll(jobs, timeout: 120).isEmpty)
        var intervals: [(start: Double, end: Double)] = []
        var nodes: Set<Int> = []
        for job in jobs {
            let k = harness.outboxes(holding: job).first
            let result = k.flatMap { harness[$0].result(job) }
            guard let k, let result, let operation = (result["operations"] as? [[String: Any]])?.first,
                  let start = operation["startedAt"] as? Double, let end = operation["finishedAt"] as? Double else {
                Issue.record("\(job): no result with times on node \(k.map(String.init) ?? "none"): \(result ?? [:])"); continue
            }
            intervals.append((start, end))
            nodes.insert(k)
        }
        #expect(maxOverlap(intervals) <= 2, "at most 2 `api` operations at once across the cluster")
        #expect(maxOverlap(intervals) == 2, "the limit is used (2 at once), not a serial run")
        #expect(nodes.count >= 2)
    }

    /// Slots go by priority like operations do (SPEC §8), across nodes. `api` has one slot cluster-wide; node 0
    /// alone declares queue `low`, node 1 alone `high`, which pins each job to its node. Node 0 runs five `veryLow`
    /// `api` operations one after another; while the first runs, node 1 gets three `veryHigh` ones. Once node 1's
    /// wait for the slot is recorded, node 0's running operation is the last it starts before node 1's three (one
    /// more is allowed for an operation that ended just then); then node 0 goes on — published start times show it.
    @Test func clusterSlotsGoByPriorityAcrossNodes() throws {
        let api: [String: Any] = ["maxConcurrentOperationCount": 1, "clusterMaxConcurrentOperationCount": 1]
        let harness = try ClusterHarness(nodes: 2, settings: { k in
            ["queues": ["api": api, (k == 0 ? "low" : "high"): ["maxConcurrentOperationCount": 1]]]
        })
        func job(_ name: String, pin: String, _ priority: String, count: Int, seconds: Double) -> [String: Any] {
            var operations: [[String: Any]] = [sleepOperation("pin", 0, queue: pin)]
            for i in 1...count {
                var operation = sleepOperation("\(priority)\(i)", seconds, queue: "api")
                operation["queuePriority"] = priority
                operations.append(operation)
            }
            return ["job": name, "operations": operations]
        }
        let low = uniqueJob("slots-low")
        let high = uniqueJob("slots-high")
        try harness[0].drop(low + ".plist", job(low, pin: "low", "veryLow", count: 5, seconds: 0.8))
        let running = try pollUntil(20) { () -> Bool? in
            try harness.sql("SELECT count(*) FROM opq_queue_slots WHERE queue = 'api' AND holder = '\(harness[0].name)'") == "1" ? true : nil
        }
        #expect(running != nil, "node 0 took the slot")
        try harness[1].drop(high + ".plist", job(high, pin: "high", "veryHigh", count: 3, seconds: 0.05))
        let waiting = try pollUntil(20) { () -> Double? in
            try harness.sql("SELECT count(*) FROM opq_slot_waiters WHERE queue = 'api' AND node = '\(harness[1].name)'") == "1" ? epochNow() : nil
        }
        let recorded = try #require(waiting, "node 1's wait for the slot was recorded")
        let lowResult = try #require(harness.waitResult(low, timeout: 60))
        let highResult = try #require(harness.waitResult(high, timeout: 60))
        #expect(lowResult.node == 0 && highResult.node == 1, "pinned")
        func starts(_ result: [String: Any]) -> [String: Double] {
            var starts: [String: Double] = [:]
            for operation in result["operations"] as? [[String: Any]] ?? [] {
                if let id = operation["id"] as? String, id != "pin", let start = operation["startedAt"] as? Double { starts[id] = start }
            }
            return starts
        }
        let lowStarts = starts(lowResult.result)
        let order = (lowStarts.merging(starts(highResult.result)) { a, _ in a }).sorted { $0.value < $1.value }.map(\.key)
        let before = lowStarts.values.filter { $0 < recorded }.count
        let first = order.firstIndex(of: "veryHigh1") ?? order.count
        #expect(Array(order.dropFirst(first).prefix(3)) == ["veryHigh1", "veryHigh2", "veryHigh3"], "node 1's three ran one after another: \(order)")
        #expect(first <= before + 1 && first < 5,
                "node 1's veryHigh operations took the slot at the end of node 0's running one (\(before) started when the wait was recorded): \(order)")
    }

    /// What an operator asking why a limited queue does not start sees: each node's status and metrics say how many
    /// of the queue's cluster slots it holds and whether (at which priority) it waits for one. `api` has one slot;
    /// node 0 holds it for a long operation, node 1 waits for it with a `high` one, until node 0's job is cancelled.
    @Test func statusShowsTheClusterSlotsANodeHoldsAndWaitsFor() throws {
        let api: [String: Any] = ["maxConcurrentOperationCount": 1, "clusterMaxConcurrentOperationCount": 1]
        let harness = try ClusterHarness(nodes: 2, settings: { k in
            ["queues": ["api": api, (k == 0 ? "low" : "high"): ["maxConcurrentOperationCount": 1]]]
        })
        func job(_ name: String, pin: String, priority: String, seconds: Double) -> [String: Any] {
            var operation = sleepOperation("call", seconds, queue: "api", dependencies: ["pin"])
            operation["queuePriority"] = priority
            return ["job": name, "operations": [sleepOperation("pin", 0, queue: pin), operation]]
        }
        func apiQueue(_ k: Int) throws -> [String: Any]? {
            (try harness[k].statusJSON()["queues"] as? [[String: Any]])?.first { $0["name"] as? String == "api" }
        }
        let long = uniqueJob("slot-holder")
        let waiter = uniqueJob("slot-waiter")
        try harness[0].drop(long + ".plist", job(long, pin: "low", priority: "normal", seconds: 60))
        let holding = try pollUntil(20) { try apiQueue(0)?["clusterSlotsHeld"] as? Int == 1 ? true : nil }
        #expect(holding != nil, "node 0 says it holds api's slot: \(String(describing: try? apiQueue(0)))")
        try harness[1].drop(waiter + ".plist", job(waiter, pin: "high", priority: "high", seconds: 0))
        let waiting = try pollUntil(20) { try apiQueue(1)?["clusterSlotWait"] as? String == "high" ? true : nil }
        #expect(waiting != nil, "node 1 says it waits for a slot at priority high: \(String(describing: try? apiQueue(1)))")
        let queue1 = try #require(try apiQueue(1))
        #expect(queue1["clusterMaxConcurrentOperationCount"] as? Int == 1 && queue1["clusterSlotsHeld"] as? Int == 0, "\(queue1)")
        let text = try harness[1].ctl(["status"]).stdout
        #expect(text.contains("api: at most 1 executing across the cluster; this node holds 0 of its slots and waits for more (its wait recorded at priority high)"), "\(text)")
        let scrape = try Scrape.parse(harness[1].ctl(["metrics"]).stdout)
        #expect(scrape.value("opqueued_cluster_slot_waiting", ["queue": "api"]) == 1 && scrape.value("opqueued_cluster_slots_held", ["queue": "api"]) == 0,
                "node 1's gauges")
        #expect(try Scrape.parse(harness[0].ctl(["metrics"]).stdout).value("opqueued_cluster_slots_held", ["queue": "api"]) == 1, "node 0's gauge")
        #expect(try apiQueue(0)?["clusterSlotWait"] == nil, "node 0 waits for nothing")
        #expect(try harness[0].ctl(["cancel", long]).status == 0)
        #expect(harness.waitResult(waiter, timeout: 30)?.result["status"] as? String == "succeeded")
        let done = try pollUntil(10) { try apiQueue(1)?["clusterSlotWait"] == nil ? true : nil }
        #expect(done != nil, "node 1 no longer waits once its operation ran: \(String(describing: try? apiQueue(1)))")
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
                VALUES ('\(job)', '\(job)', '\(bytes)'::bytea, '\(job).plist', 'psql', 0, 0, '{default}', '{}')
                """)
        }
        // No NOTIFY: the nodes' poll (at least once a second) must find rows nobody announced.
        for job in [bad, junk] {
            let result = try #require(harness.waitResult(job, timeout: 20))
            #expect(result.result["status"] as? String == "rejected")
            #expect((result.result["error"] as? String)?.isEmpty == false)
        }
        #expect(harness[0].isReady && harness[1].isReady, "no node crashed")
        #expect(try harness.sql("SELECT string_agg(status, ',') FROM opq_jobs WHERE id IN ('\(bad)', '\(junk)')") == "rejected,rejected")
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
        let refused = try #require(try harness.waitJournal(["OPQ_NODE": harness[1].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"]))
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
        let connected = try pollUntil(10) { try harness[0].statusJSON()["cluster"].flatMap { ($0 as? [String: Any])?["state"] as? String } == "connected" ? true : nil }
        #expect(connected != nil, "status says connected")
        #expect(!(try harness.everythingShown(by: 0)).contains(rotated), "the new password is shown nowhere")
    }

    // MARK: The bounded campaign: random kill -9 or SIGTERM of random nodes, one database restart, every job exactly once

    @Test func campaignEveryJobExactlyOnce() throws {
        let jobsCount = Int(ProcessInfo.processInfo.environment["OPQ_CLUSTER_CAMPAIGN_JOBS"] ?? "") ?? 240
        // One operation at a time per node and up to 6 jobs claimed: a node usually holds jobs it has not started when
        // it is stopped, which a graceful stop hands back.
        let harness = try ClusterHarness(nodes: 3, leaseSeconds: 3, settings: { _ in ["queues": ["default": ["maxConcurrentOperationCount": 1]]] },
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
        let handedBack = try harness.journal(["OPQ_STATE": "lost"]).filter { $0["OPQ_ERROR"]?.hasPrefix("handed back to the cluster at stop") == true }.count
        print("cluster campaign: \(jobs.count) jobs, \(kills) kills, \(stops) graceful stops (\(handedBack) jobs handed back), 1 database restart, lost \(missing.count), duplicated \(duplicated.count)")
    }
}
