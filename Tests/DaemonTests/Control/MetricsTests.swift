// Metrics (SPEC §6): `opqueuectl metrics` and the HTTP listener scraped while jobs run, parsed by
// prometheus_client's own parser (Tests/Support/metrics_client.py, Debian's python3-prometheus-client),
// the numbers checked against what the jobs did; the listener under hostile clients.

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel
import TestTraits

extension Scrape {
    static func fromCtl(_ spool: TestSpool) throws -> Scrape {
        let r = try spool.ctl(["metrics"])
        guard r.status == 0 else { throw SupportFailure("opqueuectl metrics: \(r.status) \(r.stderr)") }
        return try parse(r.stdout)
    }

    static func fromHTTP(_ address: String) throws -> Scrape {
        let r = try run(systemPython, [supportFolder + "/metrics_client.py", "scrape", "http://\(address)/metrics"])
        guard r.status == 0 else { throw SupportFailure("scrape failed: \(r.stderr)") }
        return try Scrape(json: r.stdout)
    }
}

/// The address the daemon says its listener bound (port 0 in the configuration: any free port).
func metricsAddress(_ spool: TestSpool) -> String? {
    let deadline = Date().addingTimeInterval(10)
    while Date() < deadline {
        if let log = try? String(contentsOfFile: spool.logPath, encoding: .utf8),
           let range = log.range(of: #"listening on http://([0-9.\[\]:a-f]+)/metrics"#, options: .regularExpression) {
            return String(log[range].dropFirst("listening on http://".count).dropLast("/metrics".count))
        }
        usleep(20_000)
    }
    return nil
}

@Suite(.serialized, .onItsOwnExecutor) struct MetricsTests {
    @Test func countersAndGaugesFollowWhatTheJobsDid() throws {
        let spool = TestSpool()
        let config = try spool.configure(["metrics": ["listen": "127.0.0.1:0"]])
        try spool.start(config)
        let address = try #require(metricsAddress(spool))
        let before = try Scrape.fromCtl(spool)
        // (The parser names a counter family without its _total.)
        #expect(before.types["opqueued_jobs"] == "counter")
        #expect(before.types["opqueued_pickup_seconds"] == "histogram")
        #expect(before.value("opqueued_queue_suspended", ["queue": "io"]) == 0)

        // 20 operations that succeed and one that fails, in one job; a long one keeps `default` busy.
        try spool.drop("long.plist", ["job": "long", "operations": [sleepOp("hold", 30)]])
        let twenty = (0..<20).map { sleepOp("s\($0)", 0) } + [["id": "boom", "kind": "fail", "message": "on purpose"]]
        try spool.drop("twenty.plist", ["job": "twenty", "operations": twenty])
        try spool.drop("bad.plist", ["job": "bad", "operations": [["id": "x", "kind": "teleport"]]])
        #expect(spool.result("twenty")?["status"] as? String == "failed")
        #expect(spool.result("bad")?["status"] as? String == "rejected")
        #expect(try spool.ctl(["suspend", "io"]).status == 0)

        for scrape in [try Scrape.fromCtl(spool), try Scrape.fromHTTP(address)] {
            func delta(_ name: String, _ labels: [String: String] = [:]) -> Double {
                scrape.value(name, labels) - before.value(name, labels)
            }
            #expect(delta("opqueued_operations_total", ["kind": "sleep", "queue": "default", "state": "succeeded"]) == 20)
            #expect(delta("opqueued_operations_total", ["kind": "fail", "queue": "default", "state": "failed"]) == 1)
            #expect(delta("opqueued_jobs_total", ["status": "failed"]) == 1)
            #expect(delta("opqueued_jobs_total", ["status": "rejected"]) == 1)
            #expect(delta("opqueued_jobs_total", ["status": "succeeded"]) == 0)
            #expect(scrape.value("opqueued_queue_suspended", ["queue": "io"]) == 1)
            #expect(scrape.value("opqueued_queue_suspended", ["queue": "default"]) == 0)
            #expect(scrape.value("opqueued_queue_executing", ["queue": "default"]) == 1)
            #expect(scrape.value("opqueued_queue_limit", ["queue": "io"]) == 2)
            #expect(scrape.value("opqueued_active_jobs") == 1)
            // Every ended attempt was timed; every started one waited; each of the three manifests was picked up.
            #expect(delta("opqueued_operation_run_seconds_count", ["kind": "sleep"]) == 20)
            #expect(delta("opqueued_operation_wait_seconds_count", ["queue": "default"]) == 22)
            #expect(delta("opqueued_pickup_seconds_count") == 3)
            #expect(scrape.value("opqueued_pickup_seconds_bucket", ["le": "+Inf"]) == scrape.value("opqueued_pickup_seconds_count"))
        }
        #expect(try Scrape.fromHTTP(address).contentType == "text/plain; version=0.0.4; charset=utf-8")

        // status shows the same, for people.
        let status = try spool.ctl(["status"]).stdout
        #expect(status.contains("long  0/1 done"))
        #expect(status.range(of: #"io +2 +utility +0 +0 +yes"#, options: .regularExpression) != nil)
        #expect(try spool.ctl(["cancel", "long"]).status == 0)
    }

    @Test func downloadsCountBytesAndErrors() throws {
        let spool = TestSpool()
        let files = spool.root + ".files"
        try FileManager.default.createDirectory(atPath: files, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: files) }
        try Data(repeating: 7, count: 12_345).write(to: URL(fileURLWithPath: files + "/blob"))
        let server = try LoopbackServer(folder: files)
        // The tests' server is on loopback, which downloads refuse unless it is opened.
        try spool.start(spool.configure(["download": ["allowNetworks": ["127.0.0.0/8"]]]))
        try spool.drop("dl.plist", ["job": "dl", "operations": [
            ["id": "ok", "kind": "download", "url": server.url("/file/blob")],
            ["id": "missing", "kind": "download", "url": server.url("/status/404")],
        ]])
        #expect(spool.result("dl")?["status"] as? String == "failed")
        let scrape = try Scrape.fromCtl(spool)
        #expect(scrape.value("opqueued_download_bytes_total") == 12_345)
        #expect(scrape.value("opqueued_download_errors_total") == 1)
    }

    @Test func theListenerSurvivesHostileClients() throws {
        let spool = TestSpool()
        let config = try spool.configure(["metrics": ["listen": "127.0.0.1:0"]])
        try spool.start(config)
        let address = try #require(metricsAddress(spool))
        let port = String(address.split(separator: ":").last ?? "")
        let abuse = try run(systemPython, [supportFolder + "/metrics_client.py", "abuse", "127.0.0.1", port], timeout: 60)
        #expect(abuse.status == 0, "\(abuse.stderr)")
        let seen = try #require(try JSONSerialization.jsonObject(with: Data(abuse.stdout.utf8)) as? [String: Any])
        #expect((seen["garbage"] as? String)?.hasPrefix("HTTP/1.1 400") == true)
        // A stalled request is dropped by the server, within its 10 s (with slack for a loaded machine).
        let stalled = seen["stalled"] as? [String: Any]
        let closedAfter = (stalled?["closedAfter"] as? NSNumber)?.doubleValue
        #expect(closedAfter != nil && closedAfter! < 20)
        #expect(spool.daemon?.isRunning == true)
        // And it still serves, as does the control socket.
        let deadline = Date().addingTimeInterval(20)
        var served = false
        while !served && Date() < deadline {
            served = (try? Scrape.fromHTTP(address))?.types["opqueued_jobs"] == "counter"
            if !served { usleep(200_000) }
        }
        #expect(served)
        #expect(try spool.ctl(["status"]).status == 0)
    }

    /// A queue a reload removes leaves `status` and the exposition once none of its operations remain (its gauges
    /// kept their last value, and status listed it, for as long as the daemon ran); the counters it had stay, as
    /// counters do; a queue a reload adds appears.
    @Test func aQueueRemovedByAReloadLeavesStatusAndTheGauges() throws {
        let spool = TestSpool()
        let queues = { (names: [String]) in Dictionary(uniqueKeysWithValues: names.map { ($0, ["maxConcurrentOperationCount": 3]) }) }
        let config = try spool.configure(["metrics": ["listen": "127.0.0.1:0"], "queues": queues(["default", "batch"])])
        try spool.start(config)
        let address = try #require(metricsAddress(spool))
        try spool.drop("one.plist", ["job": "one", "operations": [sleepOperation("a", 0, queue: "batch")]])
        #expect(spool.result("one")?["status"] as? String == "succeeded")
        try spool.drop("long.plist", ["job": "long", "operations": [sleepOperation("b", 3, queue: "batch")]])
        #expect(eventually(10) { (try? Scrape.fromHTTP(address))?.value("opqueued_queue_executing", ["queue": "batch"]) == 1 })
        func series(_ scrape: Scrape, queue: String) -> Set<String> {
            Set(scrape.samples.filter { $0.labels["queue"] == queue }.map(\.name))
        }
        let gauges: Set = ["opqueued_queue_pending", "opqueued_queue_executing", "opqueued_queue_limit", "opqueued_queue_suspended"]

        try spool.configure(["metrics": ["listen": "127.0.0.1:0"], "queues": queues(["default", "fresh"])])
        spool.signal(SIGHUP)
        var after: Scrape?
        #expect(eventually(10) {
            after = try? Scrape.fromHTTP(address)
            return after.map { series($0, queue: "fresh").isSuperset(of: gauges) } == true
        }, "the added queue shows after the reload")
        // Its operation still executing, the removed queue is still shown.
        #expect(after?.value("opqueued_queue_executing", ["queue": "batch"]) == 1)
        #expect(try spool.ctl(["status"]).stdout.range(of: #"\nbatch +3 "#, options: .regularExpression) != nil)

        #expect(spool.result("long")?["status"] as? String == "succeeded")
        #expect(eventually(10) { (try? Scrape.fromHTTP(address)).map { series($0, queue: "batch").isDisjoint(with: gauges) } == true },
                "the removed queue's gauges go once its operations have ended")
        for scrape in [try Scrape.fromHTTP(address), try Scrape.fromCtl(spool)] {
            #expect(series(scrape, queue: "batch").contains("opqueued_operations_total"), "its counter stays")
            #expect(scrape.value("opqueued_queue_limit", ["queue": "default"]) == 3)
        }
        let status = try spool.ctl(["status"]).stdout
        #expect(status.range(of: #"\nbatch "#, options: .regularExpression) == nil, "\(status)")
        #expect(status.range(of: #"\nfresh +3 "#, options: .regularExpression) != nil, "\(status)")
    }

    @Test func listenIsCheckedInTheConfiguration() throws {
        for bad in ["9464", "localhost", "127.0.0.1:99999", ":80", "127.0.0.1:x"] {
            #expect(throws: Configuration.Invalid.self) { try Configuration.parse(plist(["metrics": ["listen": bad]])) }
        }
        #expect(throws: Configuration.Invalid.self) { try Configuration.parse(plist(["metrics": ["port": 1]])) }
        #expect(try Configuration.parse(plist(["metrics": ["listen": "[::1]:9464"]])).metricsListen == "[::1]:9464")
        #expect(Configuration.builtIn.metricsListen == nil)
    }
}
