// swift-otel's batch processor keeps its count of dropped spans to itself, but says it through its diagnostic
// logger: "Spans were dropped …" (metadata dropped_count: its queue was full) and "Failed to export batch."
// (metadata batch_size: the collector refused, hung past the timeout or was not there). This handler turns those
// into a count; every message also goes to the daemon's log at debug.

import Logging

struct DropCounter: LogHandler {
    let log: Logger
    let onDropped: @Sendable (Int) -> Void
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .warning

    init(log: Logger, onDropped: @escaping @Sendable (Int) -> Void) {
        self.log = log
        self.onDropped = onDropped
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        let message = event.message.description
        if let dropped = Self.dropped(message: message, metadata: all), dropped > 0 { onDropped(dropped) }
        let details = all.keys.sorted().map { "\($0)=\(all[$0]!)" }.joined(separator: " ")
        log.debug("tracing: \(message)\(details.isEmpty ? "" : " (\(details))")\(event.error.map { ": \($0)" } ?? "")")
    }

    /// How many spans `message` says were lost, if it says so.
    static func dropped(message: String, metadata: Logger.Metadata) -> Int? {
        let key = message.hasPrefix("Spans were dropped") ? "dropped_count"
            : message.hasPrefix("Failed to export batch") ? "batch_size" : nil
        return key.flatMap { metadata[$0] }.flatMap { Int("\($0)") }
    }
}
