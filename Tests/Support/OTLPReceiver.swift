// otlp_receiver.py (beside this file) on a free loopback port: a collector that decodes what arrives with the
// OpenTelemetry protocol's own definitions (`accept`), one that answers without decoding (`discard`), or one that
// takes connections and never answers (`hang`). Killed when released.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

public final class OTLPReceiver {
    public enum Mode: String, Sendable { case accept, discard, hang }

    /// One span as it arrived: ids in hex, times in nanoseconds since the epoch (strings in the JSON: beyond a double's 53 bits).
    public struct Span {
        public let resource: [String: Any]
        public let traceID: String
        public let spanID: String
        public let parentSpanID: String
        public let name: String
        public let start: UInt64
        public let end: UInt64
        public let attributes: [String: Any]
        /// 0 unset, 1 OK, 2 error.
        public let statusCode: Int
        public let statusMessage: String
        public let links: [String]
        public let events: [Event]
    }

    /// An event on a span: its time in nanoseconds since the epoch.
    public struct Event {
        public let name: String
        public let time: UInt64
        public let attributes: [String: Any]
    }

    let process = Process()
    let output: String
    public let port: Int
    public var base: String { "http://127.0.0.1:\(port)" }

    public init(_ mode: Mode) throws {
        output = NSTemporaryDirectory() + "otlp-" + UUID().uuidString.prefix(8) + ".jsonl"
        _ = FileManager.default.createFile(atPath: output, contents: nil)
        let failure = "the OTLP receiver did not start (is opentelemetry-proto installed under .build/python? make test does)"
        port = try startHelperServer(process, ["otlp_receiver.py", mode.rawValue, output], failure: failure)
    }

    deinit {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        try? FileManager.default.removeItem(atPath: output)
    }

    /// The lines written so far (spans when accepting, request sizes when discarding).
    public var lines: [String] {
        ((try? String(contentsOfFile: output, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// Every span received so far.
    public var spans: [Span] {
        lines.compactMap { line in
            guard let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return nil }
            let status = o["status"] as? [String: Any] ?? [:]
            return Span(resource: o["resource"] as? [String: Any] ?? [:], traceID: o["traceId"] as? String ?? "",
                        spanID: o["spanId"] as? String ?? "", parentSpanID: o["parentSpanId"] as? String ?? "",
                        name: o["name"] as? String ?? "", start: UInt64(o["start"] as? String ?? "") ?? 0,
                        end: UInt64(o["end"] as? String ?? "") ?? 0, attributes: o["attributes"] as? [String: Any] ?? [:],
                        statusCode: (status["code"] as? NSNumber)?.intValue ?? 0, statusMessage: status["message"] as? String ?? "",
                        links: (o["links"] as? [[String: Any]] ?? []).compactMap { $0["spanId"] as? String },
                        events: (o["events"] as? [[String: Any]] ?? []).map { e in
                            Event(name: e["name"] as? String ?? "", time: UInt64(e["time"] as? String ?? "") ?? 0,
                                  attributes: e["attributes"] as? [String: Any] ?? [:])
                        })
        }
    }

    /// `spans(atLeast:timeout:)` for an async caller: it polls without holding its thread.
    public func arrival(atLeast count: Int, timeout: Double = 30) async throws -> [Span] {
        let deadline = Date().addingTimeInterval(timeout)
        var seen = spans
        while seen.count < count && Date() < deadline {
            try await Task.sleep(for: .milliseconds(50))
            seen = spans
        }
        return seen
    }

    /// Waits until `count` spans have arrived (at most `timeout` seconds); returns what arrived.
    public func spans(atLeast count: Int, timeout: Double = 30) -> [Span] {
        let deadline = Date().addingTimeInterval(timeout)
        var seen = spans
        while seen.count < count && Date() < deadline {
            usleep(50_000)
            seen = spans
        }
        return seen
    }
}
