// Traces (SPEC §6 `tracing.otlp`) from the real daemon to a real OTLP/HTTP receiver (Tests/Support/otlp_receiver.py,
// decoding with the OpenTelemetry protocol's own definitions): one trace per job whose parentage and links are the
// manifest's graph and whose times (spans, and the attempts' events on them) are result.plist's; a collector that
// refuses or hangs costs a job nothing, and the spans it did not take are counted; a bad `tracing.otlp` is a
// configuration error naming the key.

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel
import TestTraits

/// Seconds since the epoch as result.plist has them, in nanoseconds.
private func nanos(_ value: Any?) -> UInt64? {
    (value as? NSNumber).map { UInt64(($0.doubleValue * 1e6).rounded()) * 1_000 }
}

/// What the configuration parser says is wrong with `settings` (nothing: it is valid).
private func configurationProblems(_ settings: [String: Any]) -> [String] {
    do {
        _ = try Configuration.parse(plist(settings))
        return []
    } catch {
        return (error as? Configuration.Invalid)?.problems ?? ["\(error)"]
    }
}

private func dropped(_ spool: TestSpool) throws -> Double {
    try Scrape.fromCtl(spool).value("opqueued_trace_spans_dropped_total")
}

@Suite(.serialized, .onItsOwnExecutor) struct TracingTests {
    static let submitter = (trace: "4bf92f3577b34da6a3ce929d0e0e4736", span: "00f067aa0ba902b7")

    @Test func aJobIsOneTraceShapedLikeItsManifestWithResultPlistTimes() throws {
        let receiver = try OTLPReceiver(.accept)
        let spool = TestSpool()
        try spool.start(spool.configure(["tracing": ["otlp": receiver.base]]))
        // A diamond a → (b, c) → d, and e failing twice (one retry).
        try spool.drop("graph.plist", [
            "job": "graph", "traceparent": "00-\(Self.submitter.trace)-\(Self.submitter.span)-01",
            "operations": [sleepOp("a", 0.05), sleepOp("b", 0.05, deps: ["a"]), sleepOp("c", 0, deps: ["a"]),
                           sleepOp("d", 0, deps: ["b", "c"]),
                           ["id": "e", "kind": "fail", "message": "on purpose", "retries": 1, "retryDelaySeconds": 0.05]],
        ])
        let result = try #require(spool.result("graph"))
        #expect(result["status"] as? String == "failed")
        // The root, and per operation a span with its attempts as events.
        let spans = receiver.spans(atLeast: 1 + 5)
        #expect(spans.count == 6)
        #expect(Set(spans.map(\.traceID)) == [Self.submitter.trace])
        let byID = Dictionary(spans.map { ($0.spanID, $0) }, uniquingKeysWith: { a, _ in a })
        let root = try #require(spans.first { $0.name == "job" })
        #expect(root.parentSpanID == Self.submitter.span)
        #expect(root.resource["service.name"] as? String == "opqueued")
        #expect(root.resource["opqueued.node"] as? String == ProcessInfo.processInfo.hostName)
        #expect(root.attributes["opqueued.job"] as? String == "graph" && root.attributes["opqueued.status"] as? String == "failed")
        #expect(root.statusCode == 2)
        #expect(root.start == nanos(result["receivedAt"]) && root.end == nanos(result["finishedAt"]))

        let operations = try #require(result["operations"] as? [[String: Any]])
        let spanOf = Dictionary(spans.filter { $0.name == "operation" }.map { ($0.attributes["opqueued.operation"] as? String ?? "", $0) },
                                uniquingKeysWith: { a, _ in a })
        let dependencies = ["a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": []]
        for operation in operations {
            let id = try #require(operation["id"] as? String)
            let span = try #require(spanOf[id])
            #expect(span.parentSpanID == root.spanID)
            #expect(Set(span.links) == Set((dependencies[id] ?? []).compactMap { spanOf[$0]?.spanID }), "\(id)")
            #expect(span.attributes["opqueued.kind"] as? String == operation["kind"] as? String)
            #expect(span.attributes["opqueued.queue"] as? String == operation["queue"] as? String)
            #expect(span.attributes["opqueued.status"] as? String == operation["state"] as? String)
            #expect((span.attributes["opqueued.attempt"] as? NSNumber)?.intValue == (operation["attempts"] as? NSNumber)?.intValue)
            #expect(span.end == nanos(operation["finishedAt"]), "\(id)")
            #expect(!spans.contains { $0.parentSpanID == span.spanID }, "\(id)")
            // Each attempt an event at its start, numbered; the first at startedAt, after the wait for a slot (from the
            // span's start, ready); each but the last followed by its failure; the last runs to the span's end.
            let attempts = span.events.filter { $0.name == "attempt" }
            let count = try #require((operation["attempts"] as? NSNumber)?.intValue)
            #expect(attempts.map { ($0.attributes["opqueued.attempt"] as? NSNumber)?.intValue } == (0..<count).map { $0 + 1 }, "\(id)")
            let first = try #require(attempts.first, "\(id)"), last = try #require(attempts.last)
            #expect(first.time == nanos(operation["startedAt"]), "\(id)")
            #expect(span.start <= first.time && last.time <= span.end, "\(id)")
            let names = Array(repeating: ["attempt", "attempt failed"], count: count).flatMap { $0 }.dropLast()
            #expect(span.events.map(\.name) == Array(names), "\(id)")
            #expect(zip(span.events, span.events.dropFirst()).allSatisfy { $0.time <= $1.time }, "\(id)")
            #expect(span.start >= root.start && span.end <= root.end)
        }
        // b waited for a: its span starts no earlier than a's end (ready when a finished).
        #expect(try #require(spanOf["b"]).start >= (try #require(spanOf["a"])).end)
        let e = try #require(spanOf["e"])
        #expect(e.statusCode == 2 && e.statusMessage == "on purpose")
        // e's first attempt failed, and its retry waited its 0.05 s after that.
        let failed = try #require(e.events.first { $0.name == "attempt failed" })
        #expect(failed.attributes["opqueued.error"] as? String == "on purpose"
            && (failed.attributes["opqueued.attempt"] as? NSNumber)?.intValue == 1)
        try #require(e.events.count == 3)
        #expect(e.events[2].time >= failed.time + 40_000_000)
        #expect(byID.count == spans.count)
        #expect(try dropped(spool) == 0)
    }

    @Test(arguments: [OTLPReceiver.Mode.hang, nil])
    func aCollectorThatHangsOrRefusesCostsAJobNothingAndItsSpansAreCounted(_ mode: OTLPReceiver.Mode?) throws {
        // nil: a port nobody listens on (refused at once).
        let receiver = try mode.map { try OTLPReceiver($0) }
        let base = try receiver?.base ?? {
            let closed = try OTLPReceiver(.discard)
            return closed.base
        }()
        let spool = TestSpool()
        try spool.start(spool.configure(["tracing": ["otlp": base]]))
        try spool.drop("j.plist", ["job": "j", "operations": [sleepOp("a", 0), sleepOp("b", 0, deps: ["a"])]])
        #expect(spool.result("j")?["status"] as? String == "succeeded")
        // The job was published meanwhile; the export fails after it (refused, or the 5 s timeout), and its 3 spans
        // (the root and one per operation) are counted.
        let deadline = Date().addingTimeInterval(40)
        while try dropped(spool) < 3 && Date() < deadline { usleep(200_000) }
        #expect(try dropped(spool) == 3)
        // A second job is not held by the first's export.
        try spool.drop("k.plist", ["job": "k", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("k")?["status"] as? String == "succeeded")
        // The stop is not held by the collector: a bounded flush.
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 30) == 0)
        #expect(try String(contentsOfFile: spool.logPath, encoding: .utf8).contains("tracing: each job's trace goes to \(base)/v1/traces"))
    }

    @Test func aBadOTLPValueIsAConfigurationErrorNamingTheKey() throws {
        for (value, expected) in [("ftp://127.0.0.1:4318", "tracing.otlp: must be the collector's http:// or https:// base URL"),
                                  ("127.0.0.1:4318", "tracing.otlp:"), ("http://h:1/?q=1", "tracing.otlp:")] {
            let problems = configurationProblems(["tracing": ["otlp": value]])
            #expect(problems.count == 1 && problems[0].hasPrefix(expected), "\(value): \(problems)")
        }
        #expect(configurationProblems(["tracing": ["otlp": "http://127.0.0.1:4318", "grpc": true]]) == ["tracing: unknown key 'grpc'"])
        #expect(try Configuration.parse(plist(["tracing": ["otlp": "https://collector.example:4318/base"]])).tracingOTLP
            == "https://collector.example:4318/base")
        // Read at start: a reload keeps the exporter it started with, and says so.
        let started = try Configuration.parse(plist(["tracing": ["otlp": "http://127.0.0.1:4318"]]))
        let (applied, kept) = try Configuration.reloaded(.builtIn, running: started)
        #expect(applied.tracingOTLP == "http://127.0.0.1:4318" && kept == ["tracing.otlp"])
        // The daemon refuses to start on it, naming the key.
        let spool = TestSpool()
        let r = try run("opqueued", ["--spool", spool.root, "--log-target", "console"]
            + spool.configure(["tracing": ["otlp": "ftp://x"]]), timeout: 20)
        #expect(r.status == 1)
        #expect((r.stdout + r.stderr).contains("tracing.otlp: must be the collector's http:// or https:// base URL"))
    }
}
