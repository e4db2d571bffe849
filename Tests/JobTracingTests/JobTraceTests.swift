// A finished job's spans, pure: parentage and links from the manifest's graph, instants from result.plist's
// times to the microsecond, attempts as events on their operation's span (its wait before the first), errors as
// status; and how swift-otel's diagnostic messages are read as dropped spans.

import Logging
import Testing
@testable import JobTracing

/// A diamond a → (b, c) → d, received at 100 s; b retried once; c failed; d cancelled without running.
func diamond() -> JobTrace {
    let a = OperationTrace(id: "a", kind: "sleep", queue: "default", qualityOfService: "utility", dependencies: [], state: "succeeded",
                           attempts: 1, error: nil, startedAt: 100.25, finishedAt: 101.5, readyAt: 100.000_001,
                           attemptTimes: [AttemptTime(start: 100.25, end: 101.5, error: nil)])
    let b = OperationTrace(id: "b", kind: "download", queue: "downloads", qualityOfService: "utility", dependencies: ["a"],
                           state: "succeeded", attempts: 2, error: nil, startedAt: 101.6, finishedAt: 104, readyAt: 101.5,
                           attemptTimes: [AttemptTime(start: 101.6, end: 102, error: "HTTP 503"),
                                          AttemptTime(start: 103, end: 104, error: nil)])
    let c = OperationTrace(id: "c", kind: "fail", queue: "default", qualityOfService: "default", dependencies: ["a"], state: "failed",
                           attempts: 1, error: "on purpose", startedAt: 101.5, finishedAt: 101.7, readyAt: 101.5,
                           attemptTimes: [AttemptTime(start: 101.5, end: 101.7, error: "on purpose")])
    let d = OperationTrace(id: "d", kind: "write", queue: "io", qualityOfService: "utility", dependencies: ["b", "c"], state: "cancelled",
                           attempts: 0, error: "a dependency failed", startedAt: nil, finishedAt: 104, readyAt: nil)
    return JobTrace(job: "diamond", status: "failed", error: "c: on purpose\nd: a dependency failed", receivedAt: 100,
                    finishedAt: 104.000_002, traceparent: nil, operations: [a, b, c, d])
}

@Suite struct JobTraceTests {
    @Test func theRootCoversTheJobAndEachOperationIsItsChildLinkedToItsDependencies() throws {
        let spans = diamond().spans()
        let root = spans[0]
        #expect(root.name == "job" && root.parent == nil)
        #expect(root.start == 100_000_000_000 && root.end == 104_000_002_000)
        #expect(root.attributes["opqueued.job"] == .string("diamond") && root.attributes["opqueued.status"] == .string("failed"))
        #expect(root.error == "c: on purpose\nd: a dependency failed")
        let operations = spans.indices.filter { spans[$0].name == "operation" }
        #expect(operations.count == 4)
        #expect(operations.allSatisfy { spans[$0].parent == 0 })
        func index(_ id: String) throws -> Int {
            try #require(operations.first { spans[$0].attributes["opqueued.operation"] == .string(id) })
        }
        #expect(spans[try index("a")].links.isEmpty)
        #expect(spans[try index("b")].links == [try index("a")])
        #expect(spans[try index("d")].links == [try index("b"), try index("c")])
        // One span per operation and the root, nothing else.
        #expect(spans.count == 5 && spans.map(\.name) == ["job", "operation", "operation", "operation", "operation"])
    }

    @Test func instantsAreResultPlistTimesToTheMicrosecond() throws {
        let spans = diamond().spans()
        let a = try #require(spans.first { $0.attributes["opqueued.operation"] == .string("a") })
        #expect(a.start == 100_000_001_000 && a.end == 101_500_000_000)
        // Its wait for a slot: from the span's start (ready) to its one attempt's start; the attempt to the span's end.
        #expect(a.events == [EventDescription(name: "attempt", time: 100_250_000_000, attributes: ["opqueued.attempt": .int(1)])])
        #expect(nanos(1_764_000_000.123_456_7) == 1_764_000_000_123_457_000)
        #expect(nanos(0.000_000_4) == 0)
    }

    @Test func eachAttemptIsAnEventWithItsNumberAndARetriedOnesErrorAtItsEnd() throws {
        let spans = diamond().spans()
        let b = try #require(spans.first { $0.attributes["opqueued.operation"] == .string("b") })
        #expect(b.attributes["opqueued.attempt"] == .int(2) && b.error == nil)
        #expect(b.start == 101_500_000_000 && b.end == 104_000_000_000)
        #expect(b.events == [
            EventDescription(name: "attempt", time: 101_600_000_000, attributes: ["opqueued.attempt": .int(1)]),
            EventDescription(name: "attempt failed", time: 102_000_000_000,
                             attributes: ["opqueued.attempt": .int(1), "opqueued.error": .string("HTTP 503")]),
            EventDescription(name: "attempt", time: 103_000_000_000, attributes: ["opqueued.attempt": .int(2)]),
        ])
        // The last attempt's error is the span's status.
        let c = try #require(spans.first { $0.attributes["opqueued.operation"] == .string("c") })
        #expect(c.error == "on purpose" && c.attributes["opqueued.status"] == .string("failed"))
        #expect(c.events.map(\.name) == ["attempt"] && c.events[0].time == c.start)
        // Cancelled before it ran: a span at its end, no attempt.
        let d = try #require(spans.first { $0.attributes["opqueued.operation"] == .string("d") })
        #expect(d.start == d.end && d.error == "a dependency failed" && d.events.isEmpty)
    }

    @Test func attemptsNotSeenOneByOneAreOneEvent() {
        var job = diamond()
        job.operations = [OperationTrace(id: "old", kind: "sleep", queue: "default", qualityOfService: "utility", dependencies: [],
                                         state: "succeeded", attempts: 3, error: nil, startedAt: 50, finishedAt: 60)]
        var spans = job.spans()
        #expect(spans.map(\.name) == ["job", "operation"])
        #expect(spans[1].start == 50_000_000_000
            && spans[1].events == [EventDescription(name: "attempts", time: 50_000_000_000, attributes: ["opqueued.attempt": .int(3)])])
        // Seen after a restart: the attempts seen are the last ones, at their own start.
        job.operations[0].attemptTimes = [AttemptTime(start: 55, end: 60, error: nil)]
        spans = job.spans()
        #expect(spans[1].events == [EventDescription(name: "attempt", time: 55_000_000_000, attributes: ["opqueued.attempt": .int(3)])])
    }

    @Test func swiftOTelsDiagnosticsAreReadAsDroppedSpans() {
        #expect(DropCounter.dropped(message: "Failed to export batch.", metadata: ["batch_size": "17", "batch_id": "3"]) == 17)
        #expect(DropCounter.dropped(message: "Spans were dropped this iteration because queue was full",
                                    metadata: ["dropped_count": "5", "queue_size": "2048"]) == 5)
        #expect(DropCounter.dropped(message: "Exported batch.", metadata: ["batch_size": "17"]) == nil)
        #expect(TraceExport.endpoint("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces")
        #expect(TraceExport.endpoint("http://collector/base/") == "http://collector/base/v1/traces")
    }
}
