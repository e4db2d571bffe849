// TraceExport through swift-otel to a real OTLP/HTTP receiver (Tests/Support/otlp_receiver.py, decoding with the
// OpenTelemetry protocol's own definitions): what arrives is what `spans()` described, under the submitter's
// trace; a collector that refuses has every span counted as dropped, exactly (the coupling to swift-otel's
// diagnostic messages, pinned).

import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import Testing
import TestSupport
import TestTraits
@testable import JobTracing

/// Runs `export`'s service around `body`, then stops it gracefully. A child task, so that the service runs on the
/// test's own executor (an unstructured task would run on the shared cooperative pool, which the synchronous suites
/// beside it hold for seconds at a time: the exporter then never ran).
func running(_ export: TraceExport, _ body: () async throws -> Void) async throws {
    let group = ServiceGroup(services: [export.service], logger: Logger(label: "test"))
    try await withThrowingTaskGroup(of: Void.self) { tasks in
        tasks.addTask { try await group.run() }
        try await body()
        await group.triggerGracefulShutdown()
        try await tasks.waitForAll()
    }
}

@Suite(.serialized, .onItsOwnExecutor) struct TraceExportTests {
    @Test func whatArrivesIsWhatWasDescribedUnderTheSubmittersTrace() async throws {
        let receiver = try OTLPReceiver(.accept)
        // A minute per export: on a loaded machine a first POST may take longer than the daemon's 5 s (then dropped).
        let export = try TraceExport(otlp: receiver.base, node: "node-7", log: Logger(label: "test"), timeoutSeconds: 60) { _ in }
        var job = diamond()
        job.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        let described = job.spans()
        try await running(export) {
            export.emit(job)
            _ = try await receiver.arrival(atLeast: described.count, timeout: 120)
        }
        let arrived = receiver.spans
        #expect(arrived.count == described.count, "\(arrived.count) spans arrived of \(described.count)")
        #expect(Set(arrived.map(\.traceID)) == ["0af7651916cd43dd8448eb211c80319c"])
        #expect(arrived.allSatisfy {
            $0.resource["service.name"] as? String == "opqueued" && $0.resource["opqueued.node"] as? String == "node-7"
        })
        // Each description matched to what arrived by name, instants and operation/attempt; parents and links agree.
        func key(_ name: String, _ start: UInt64, _ end: UInt64, _ operation: String?, _ attempt: Int?) -> String {
            "\(name)|\(start)|\(end)|\(operation ?? "")|\(attempt.map(String.init) ?? "")"
        }
        func string(_ a: SpanDescription.Attribute?) -> String? { if case .string(let s) = a { s } else { nil } }
        func int(_ a: SpanDescription.Attribute?) -> Int? { if case .int(let i) = a { i } else { nil } }
        let byKey = Dictionary(arrived.map { span in
            (key(span.name, span.start, span.end, span.attributes["opqueued.operation"] as? String,
                 (span.attributes["opqueued.attempt"] as? NSNumber)?.intValue), span)
        }, uniquingKeysWith: { a, _ in a })
        let matched = try described.map { d in
            let operation = string(d.attributes["opqueued.operation"]), attempt = int(d.attributes["opqueued.attempt"])
            let found = byKey[key(d.name, d.start, d.end, operation, attempt)]
            return try #require(found, "\(d.name) \(d.attributes)")
        }
        for (d, span) in zip(described, matched) {
            #expect(span.parentSpanID == (d.parent.map { matched[$0].spanID } ?? "b7ad6b7169203331"))
            #expect(span.links == d.links.map { matched[$0].spanID })
            #expect(span.statusCode == (d.error == nil ? 0 : 2) && span.statusMessage == (d.error ?? ""))
            #expect(span.attributes.count == d.attributes.count)
            // The attempts' events, at their instants, with their number and a retried attempt's error.
            #expect(span.events.map(\.name) == d.events.map(\.name) && span.events.map(\.time) == d.events.map(\.time))
            for (arrived, event) in zip(span.events, d.events) {
                #expect((arrived.attributes["opqueued.attempt"] as? NSNumber)?.intValue == int(event.attributes["opqueued.attempt"]))
                #expect(arrived.attributes["opqueued.error"] as? String == string(event.attributes["opqueued.error"]))
                #expect(arrived.attributes.count == event.attributes.count)
            }
        }
        #expect(arrived.flatMap(\.events).count == 5)
    }

    @Test func aCollectorThatRefusesHasEverySpanCountedAsDropped() async throws {
        let closed = try OTLPReceiver(.discard).base
        let dropped = Mutex(0)
        let export = try TraceExport(otlp: closed, node: "n", log: Logger(label: "test")) { n in dropped.withLock { $0 += n } }
        let spans = diamond().spans().count
        try await running(export) {
            export.emit(diamond())
            export.emit(diamond())
            let deadline = Date().addingTimeInterval(30)
            while dropped.withLock({ $0 }) < 2 * spans && Date() < deadline { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(dropped.withLock { $0 } == 2 * spans)
    }
}
