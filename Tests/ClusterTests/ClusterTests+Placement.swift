// SPEC §8 placement from outside: queues pin jobs to the nodes that declare them, a full spool pauses
// claiming, claims follow QoS, priority and submission order, and clusterMaxConcurrentOperationCount holds
// across nodes, by priority, as status shows.

import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

extension ClusterTests {
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
        #expect(pollUntil(5) {
            (try? harness.sql("SELECT state FROM opq_job_states WHERE requested_id = '\(job)'")) == "waiting" ? true : nil
        } == true,
                "submitted to the cluster, waiting for the node that declares `late`")
        #expect(harness.outboxes(holding: job).isEmpty, "not rejected as naming an unknown queue")
    }

    @Test func queueDeclaredOnOneNodePinsItsJobsThereAndStatusNamesWhatNoLiveNodeHas() throws {
        let harness = try ClusterHarness(nodes: 2,
                                         settings: { k in k == 0 ? ["queues": ["gpu": ["maxConcurrentOperationCount": 1]]] : [:] })
        // Submitted on node 1, which does not declare `gpu`: accepted, and every one runs on node 0.
        let jobs = try dropSleepJobs(harness, "pinned", 0..<6, seconds: 0.1, queue: "gpu", node: { _ in 1 })
        #expect(harness.waitAll(jobs, timeout: 40).isEmpty)
        for job in jobs { #expect(harness.outboxes(holding: job) == [0]) }
        try expectShowOnAnotherNodeGivesTheRunningNodesStates(harness)
        try expectSubmitAndValidateAsTheNodesInboxDoes(harness)
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
        #expect(pollUntil(20) { (try? harness.sql("SELECT state FROM opq_live WHERE id = '\(stuck)'")) == "waiting" ? true : nil } == true)
        #expect(try harness[1].ctl(["cancel", stuck]).status == 0)
        let ended = try #require(harness.waitResult(stuck, timeout: 10))
        #expect(ended.node == 1 && ended.result["status"] as? String == "cancelled")
        let stuckOps = (ended.result["operations"] as? [[String: Any]] ?? [])
            .map { "\($0["queue"] ?? "?") \($0["state"] ?? "?")/\($0["attempts"] ?? "?")" }
        #expect(stuckOps == ["gpu cancelled/0"], "\(stuckOps)")
        #expect(try harness[1].ctl(["cancel", stuck]).status == 1, "it has ended")
        try harness[0].start()
        #expect(harness.waitResult(waiting, timeout: 20)?.node == 0)
    }

    /// `show` on node 1 of a job node 0 is running, in a `gpu` queue only node 0 declares.
    private func expectShowOnAnotherNodeGivesTheRunningNodesStates(_ harness: ClusterHarness) throws {
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
    }

    /// `submit` and `validate` on node 1, which does not declare `gpu`, with its daemon answering and without.
    private func expectSubmitAndValidateAsTheNodesInboxDoes(_ harness: ClusterHarness) throws {
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
        let offline = try runProgram("opqueuectl",
                                     ["--spool", harness[1].spool + ".nodaemon", "--config", harness[1].configPath, "validate", file])
        #expect(offline.status == 1 && offline.stdout.contains("unknown queue 'gpu'"), "\(offline.stdout)\(offline.stderr)")
        try PropertyListSerialization.data(fromPropertyList: sleepJob(uniqueJob("refused"), 0, queue: "gpuu"), format: .xml, options: 0)
            .write(to: URL(fileURLWithPath: file))
        let refused = try harness[1].ctl(["submit", file])
        #expect(refused.status == 1 && refused.stderr.contains("unknown queue 'gpuu'"), "\(refused.stdout)\(refused.stderr)")
        let typoChecked = try harness[1].ctl(["validate", file])
        #expect(typoChecked.status == 1 && typoChecked.stdout.contains("unknown queue 'gpuu'"),
                "\(typoChecked.stdout)\(typoChecked.stderr)")
    }

    /// A node whose spool is full when it claims (its own file system out of inodes: a real ENOSPC): the row goes
    /// back, the node logs the fault and pauses claiming — no loop of claims and hand-backs, which a full disk
    /// turned into 78 commits per job — and runs the job once its spool works again.
    @Test func fullSpoolPausesClaimingUntilItWorksAgain() throws {
        let harness = try ClusterHarness(nodes: 2,
                                         settings: { k in k == 0 ? ["queues": ["disk": ["maxConcurrentOperationCount": 1]]] : [:] },
                                         start: false)
        let mount = harness[0].spool
        try FileManager.default.createDirectory(atPath: mount, withIntermediateDirectories: true)
        #expect(try runProgram("/bin/mount", ["-t", "tmpfs", "-o", "size=16m,nr_inodes=2048", "tmpfs", mount]).status == 0)
        defer { _ = try? runProgram("/bin/umount", ["-l", mount]) }
        try harness.startAll()
        try harness.waitRegistered(2)
        let fillers = mount + "/fillers"
        _ = try fillWithEmptyFiles(fillers)
        #expect(errno == ENOSPC)

        let job = uniqueJob("full")
        try harness[1].drop(job + ".plist", sleepJob(job, 0, queue: "disk"))
        let fault = try pollUntil(30) { try harness.journal(node: 0).first { $0["MESSAGE"]?.contains("claiming is paused") == true } }
        #expect(fault?["MESSAGE"]?.contains("No space left") == true, "\(fault ?? [:])")
        #expect(try harness.journal(node: 0, ["OPQ_JOB": job]).contains { $0["MESSAGE"]?.contains("handed back to the cluster") == true })
        let fence = try harness.sql("SELECT last_value FROM opq_fence")
        usleep(2_000_000)
        #expect(try harness.sql("SELECT last_value FROM opq_fence") == fence, "no claim while the spool is full")
        #expect(try harness.sql("SELECT state FROM opq_live WHERE id = '\(job)'") == "waiting")

        try FileManager.default.removeItem(atPath: fillers)
        let result = harness.waitResult(job, timeout: 30)
        #expect(result?.node == 0 && result?.result["status"] as? String == "succeeded")
        #expect(try harness.journal(node: 0).contains { $0["MESSAGE"]?.contains("the spool works again") == true })
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
        let waiting = try pollUntil(20) {
            try harness.sql("SELECT count(*) FROM opq_live WHERE id LIKE '\(prefix)-%' AND state = 'waiting'") == "5" ? true : nil
        }
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
            try harness.sql("SELECT count(*) FROM opq_queue_slots WHERE queue = 'api' AND holder = '\(harness[0].name)'") == "1"
                ? true : nil
        }
        #expect(running != nil, "node 0 took the slot")
        try harness[1].drop(high + ".plist", job(high, pin: "high", "veryHigh", count: 3, seconds: 0.05))
        let waiting = try pollUntil(20) { () -> Double? in
            try harness.sql("SELECT count(*) FROM opq_slot_waiters WHERE queue = 'api' AND node = '\(harness[1].name)'") == "1"
                ? epochNow() : nil
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
        #expect(Array(order.dropFirst(first).prefix(3)) == ["veryHigh1", "veryHigh2", "veryHigh3"],
                "node 1's three ran one after another: \(order)")
        #expect(first <= before + 1 && first < 5, """
            node 1's veryHigh operations took the slot at the end of node 0's running one \
            (\(before) started when the wait was recorded): \(order)
            """)
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
        #expect(text.contains("api: at most 1 executing across the cluster; this node holds 0 of its slots and waits for more"
                              + " (its wait recorded at priority high)"), "\(text)")
        let scrape = try Scrape.parse(harness[1].ctl(["metrics"]).stdout)
        #expect(scrape.value("opqueued_cluster_slot_waiting", ["queue": "api"]) == 1
                    && scrape.value("opqueued_cluster_slots_held", ["queue": "api"]) == 0,
                "node 1's gauges")
        #expect(try Scrape.parse(harness[0].ctl(["metrics"]).stdout).value("opqueued_cluster_slots_held", ["queue": "api"]) == 1,
                "node 0's gauge")
        #expect(try apiQueue(0)?["clusterSlotWait"] == nil, "node 0 waits for nothing")
        #expect(try harness[0].ctl(["cancel", long]).status == 0)
        #expect(harness.waitResult(waiter, timeout: 30)?.result["status"] as? String == "succeeded")
        let done = try pollUntil(10) { try apiQueue(1)?["clusterSlotWait"] == nil ? true : nil }
        #expect(done != nil, "node 1 no longer waits once its operation ran: \(String(describing: try? apiQueue(1)))")
    }
}
