// SPEC §8 leases from outside: a node killed, frozen, cut off by a locked table, a silent database or a hung
// file system loses its jobs to the others and publishes nothing for them; a node's name is held by one process
// at a time and each node is lost after its own lease.

import Foundation
import Testing
import TestSupport
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// Leases, fences and outages: a suite of its own, serial like "Cluster (SPEC §8)" and beside it, so that the two
/// halves of the cluster's tests overlap their waiting.
@Suite("Cluster: leases and outages (SPEC §8)", .serialized, .onItsOwnExecutor)
struct ClusterFailureTests {
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

    /// SPEC §3.4 across a takeover: a cancel answered by the node running the job is also recorded in the database,
    /// so the node that takes the job over once that node is killed makes it again before anything starts.
    @Test func aCancelMadeByTheRunningNodeHoldsAfterATakeover() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        let job = uniqueJob("cancelkill")
        try harness[0].drop(job + ".plist", ["job": job, "operations": [sleepOperation("a", 60), sleepOperation("b", 10)]])
        let victim = try #require(try harness.waitClaimed(job)).node
        for operation in ["a", "b"] {
            #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_OPERATION": operation, "OPQ_STATE": "executing"]) != nil)
        }
        let cancel = try harness[victim].ctl(["cancel", job, "a"])
        #expect(cancel.status == 0, "\(cancel.stderr)")
        #expect(try harness.sql("SELECT count(*) FROM opq_cancel_requests WHERE job = '\(job)' AND operation = 'a'") == "1",
                "recorded in the database before the answer")
        harness[victim].kill9()
        let second = try harness.waitClaimed(job, excluding: [victim], timeout: Double(harness.leaseSeconds) + 15)
        if second == nil { Issue.record("not taken over:\n\(harness.diagnosis(job))") }
        let result = try #require(harness.waitResult(job, timeout: 40))
        #expect(result.node == 1 - victim)
        #expect(result.result["status"] as? String == "cancelled")
        let states = (result.result["operations"] as? [[String: Any]] ?? [])
            .map { "\($0["id"] ?? "?")=\($0["state"] ?? "?")/\($0["attempts"] ?? "?")" }
        #expect(states == ["a=cancelled/0", "b=succeeded/1"], "\(states)")
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_OPERATION": "a", "OPQ_STATE": "executing"]).count == 1,
                "a never started again on the survivor")
    }

    /// The same for a whole job. It ends at once on its node, which then cannot record its end: the job's row is
    /// locked (FOR NO KEY UPDATE: the cancel's insert still gets through) past the server's statement_timeout (10 s), so
    /// the node is killed with its job ended and not published, and the survivor ends it cancelled without running it.
    @Test func aWholeJobCancelMadeByTheRunningNodeHoldsAfterATakeover() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        let (job, victim) = try startSleepJob(harness, "cancelkill", seconds: 30, on: 0)
        let released = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            _ = try? harness.sql("BEGIN; SELECT 1 FROM opq_live WHERE id = '\(job)' FOR NO KEY UPDATE; SELECT pg_sleep(12); COMMIT")
            released.signal()
        }
        let locked = pollUntil(5) { () -> Bool? in
            let holders = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%NO KEY UPDATE%pg_sleep%' AND pid <> pg_backend_pid()"
            return (try? harness.sql(holders)) == "1" ? true : nil
        }
        #expect(locked == true, "the row lock is held")
        let cancel = try harness[victim].ctl(["cancel", job])
        #expect(cancel.status == 0, "\(cancel.stderr)")
        #expect(try harness.waitJournal(["OPQ_JOB": job, "OPQ_OPERATION": "a", "OPQ_STATE": "cancelled"], timeout: 5) != nil)
        harness[victim].kill9()
        #expect(harness.outboxes(holding: job).isEmpty, "killed before its end was recorded")
        #expect(released.wait(timeout: .now() + 20) == .success)
        let second = try harness.waitClaimed(job, excluding: [victim], timeout: Double(harness.leaseSeconds) + 20)
        if second == nil { Issue.record("not taken over:\n\(harness.diagnosis(job))") }
        let result = try #require(harness.waitResult(job, timeout: 40))
        #expect(result.node == 1 - victim)
        #expect(result.result["status"] as? String == "cancelled")
        let states = (result.result["operations"] as? [[String: Any]] ?? []).map { "\($0["state"] ?? "?")/\($0["attempts"] ?? "?")" }
        #expect(states == ["cancelled/0"], "\(states)")
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_OPERATION": "a", "OPQ_STATE": "executing"]).count == 1,
                "a never started again on the survivor")
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
        _ = try harness.sql(
            "UPDATE opq_nodes SET last_heartbeat = last_heartbeat + interval '1 hour' WHERE node = '\(harness[victim].name)'")
        let killedAt = Date()
        let again = try harness.waitClaimed(next, excluding: [victim], timeout: Double(harness.leaseSeconds) + 10)
        #expect(again != nil, "taken over after the lease, not after the hour:\n\(harness.diagnosis(next))")
        #expect(Date().timeIntervalSince(killedAt) <= Double(harness.leaseSeconds) + 6)
    }

    // MARK: 4. Leases: the jobs table locked by hand

    /// An operator's `VACUUM FULL opq_live` (the jobs' states; or `CLUSTER`, an `ALTER TABLE`, a `LOCK TABLE`) held past the lease:
    /// no heartbeat gets through it, so each node takes it for an outage — the running job is stopped before its
    /// lease would end and logged `lost` — and once the lock is let go the job runs again; it ends exactly once.
    @Test func theJobsTableLockedPastTheLeaseIsAnOutageAndTheJobEndsOnce() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        let (job, firstNode) = try startSleepJob(harness, "locked", seconds: 8, on: 0)
        let released = DispatchSemaphore(value: 0)
        let lockedAt = Date()
        DispatchQueue.global().async {
            _ = try? harness.sql("BEGIN; LOCK TABLE opq_live IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(7); COMMIT")
            released.signal()
        }
        let lost = try harness.waitJournal(["OPQ_JOB": job, "OPQ_STATE": "lost", "OPQ_NODE": harness[firstNode].name], timeout: 15)
        #expect(lost != nil, "the running job is stopped when its lease cannot be renewed:\n\(harness.diagnosis(job))")
        #expect(Date().timeIntervalSince(lockedAt) < 6.5, "stopped before the lock is let go (lease 3 s)")
        #expect(try harness.waitJournal(["OPQ_NODE": harness[firstNode].name, "OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"],
                                        timeout: 5) != nil)
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
        func backends() throws -> Int {
            Int(try harness.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")) ?? -1
        }
        let before = try backends()
        let released = DispatchSemaphore(value: 0)
        final class Moment: @unchecked Sendable { var date = Date.distantFuture }
        let letGo = Moment()
        DispatchQueue.global().async {
            _ = try? harness.sql("BEGIN; LOCK TABLE opq_live IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(30); COMMIT")
            letGo.date = Date()
            released.signal()
        }
        // From when the lock is held (a beat that got in just before it may log a `connected` after this line ran).
        let held = try pollUntil(10) { () -> Bool? in
            try harness.sql("SELECT count(*) FROM pg_locks WHERE relation = 'opq_live'::regclass"
                            + " AND mode = 'AccessExclusiveLock' AND granted") == "1" ? true : nil
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
                try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"])
                    .first { loggedAt($0) >= releasedAt.timeIntervalSince1970 - 1 }
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
        // The other node's last beat went out before the freeze, so its own lease has run out 3 s after it; until
        // then it rightly says `connected` (its beats run up to a third of a lease apart from the first node's).
        while Date().timeIntervalSince(frozenAt) < 3 { usleep(50_000) }
        func timed(_ arguments: [String]) throws -> (run: ProgramResult, seconds: Double) {
            let asked = Date()
            let run = try harness[other].ctl(arguments, timeout: 20)
            return (run, Date().timeIntervalSince(asked))
        }
        let status = try timed(["status", "--json"])
        let json = try? JSONSerialization.jsonObject(with: Data(status.run.stdout.utf8)) as? [String: Any]
        let cluster = json?["cluster"] as? [String: Any]
        #expect(status.seconds < 2 && cluster?["state"] as? String == "disconnected", "\(status.run.stdout.prefix(600))")
        #expect((cluster?["reason"] as? String)?.isEmpty == false, "says why")
        for arguments in [["show", job], ["cancel", job]] {
            let asked = try timed(arguments)
            #expect(asked.seconds < 2.5 && asked.run.status == 3, "\(arguments): \(asked.seconds) s, exit \(asked.run.status)")
            #expect(asked.run.stderr.contains("the cluster cannot be asked now"), "\(asked.run.stderr)")
        }
        let waited = try timed(["wait", job, "--timeout", "1"])
        #expect(waited.run.status == 2 && waited.seconds < 3, "wait --timeout 1: \(waited.seconds) s, exit \(waited.run.status)")
        #expect(waited.run.stderr.contains("the cluster cannot be asked now") && !waited.run.stderr.contains("no daemon"),
                "\(waited.run.stderr)")
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
            let outage = try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"])
                .filter { loggedAt($0) > frozenAt.timeIntervalSince1970 }
            #expect(outage.count == 1, "node \(k): one outage, said once")
            let back = try pollUntil(20) {
                try harness.journal(node: k, ["OPQ_EVENT": "cluster", "OPQ_STATE": "connected"])
                    .first { loggedAt($0) > thawedAt.timeIntervalSince1970 - 0.5 }
            }
            #expect(back != nil, "node \(k) connected again by itself")
        }
        let next = uniqueJob("thawed")
        try harness[1].drop(next + ".plist", sleepJob(next, 0))
        #expect(harness.waitResult(next, timeout: 30)?.result["status"] as? String == "succeeded")
    }

    /// A cancel asked of a node whose connection is open as the server freezes is sent at once and waits in the
    /// server's socket; the node tells its client the cluster cannot be asked (exit 3). When the server answers again
    /// it reads the cancel after the node's deadline and does not make it: the job ends as if never cancelled.
    @Test func aCancelTheClientWasToldCouldNotBeMadeIsNotMadeLater() throws {
        let harness = try ClusterHarness(nodes: 2, leaseSeconds: 3)
        let (job, firstNode) = try startSleepJob(harness, "late-cancel", seconds: 4, on: 0)
        let other = 1 - firstNode
        #expect(try harness[other].ctl(["show", job]).status == 0, "the other node's connection is open")
        harness.server.freeze()
        let cancel = try harness[other].ctl(["cancel", job], timeout: 20)
        #expect(cancel.status == 3 && cancel.stderr.contains("the cluster cannot be asked now"), "\(cancel.status): \(cancel.stderr)")
        harness.server.thaw()
        let result = try #require(harness.waitResult(job, timeout: 60), "\(harness.diagnosis(job))")
        #expect(result.result["status"] as? String == "succeeded", "a cancel read after its client was answered is not made")
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "cancelled"]).isEmpty)
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
        try PowerCut.mountImage(image, on: spool, megabytes: 64)
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
        #expect(pollUntil(5) { FileManager.default.fileExists(atPath: spool + "/tmp/.alive") ? true : nil } != nil,
                "probed while it has a job")
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
        #expect(try Scrape.parse(harness[0].ctl(["metrics"]).stdout).value("opqueued_cluster_connected") == 0,
                "an alert on the gauge sees it")

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
        #expect(pollUntil(10) {
            (try? harness.journal(node: 0, ["OPQ_EVENT": "cluster"]))?.contains { ($0["MESSAGE"] ?? "").contains("answers again") } == true
                ? true : nil
        } != nil)
        #expect(pollUntil(10) {
            (try? harness.journal(node: 0, ["OPQ_EVENT": "cluster"]))?.last?["OPQ_STATE"] == "connected" ? true : nil
        } != nil,
                "joins again")
        #expect(harness[0].isReady, "the thawed node goes on serving")
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
            try harness.journal(["OPQ_EVENT": "cluster", "OPQ_STATE": "disconnected"])
                .first { $0["MESSAGE"]?.contains("held by another running opqueued") == true }
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
        // Frozen first, so that it still lives while its row is rewritten: once its process is gone from this
        // machine, the second rightly takes the name at once (as a restart on the same host does).
        harness[0].freeze()
        _ = try harness.sql("UPDATE opq_nodes SET info = 'opqueued pid 1 on elsewhere boot x pidns y run 1',"
                            + " last_heartbeat = now() - interval '1 hour' WHERE node = 'twin'")
        let rewritten = Date()
        harness[0].kill9()
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
        let harness = try ClusterHarness(nodes: 2,
                                         settings: { k in k == 0 ? ["queues": ["slow": ["maxConcurrentOperationCount": 1]]] : [:] },
                                         clusterSettings: { k in ["leaseSeconds": k == 0 ? 12 : 2] })
        let job = uniqueJob("patient")
        try harness[1].drop(job + ".plist", sleepJob(job, 6, queue: "slow"))
        let result = harness.waitResult(job, timeout: 60)
        #expect(result?.node == 0 && result?.result["status"] as? String == "succeeded")
        #expect(try harness.journal(["OPQ_JOB": job, "OPQ_STATE": "executing"]).count == 1, "ran once")
        #expect(try harness.journal(["OPQ_STATE": "lost"]).isEmpty)
    }
}
