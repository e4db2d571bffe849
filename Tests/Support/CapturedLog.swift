// A log the tests read: every entry a logger made (level, message, metadata as text), kept in order.

import Logging
import Synchronization

public final class CapturedLog: Sendable {
    public struct Entry: Sendable {
        public let level: Logger.Level
        public let message: String
        public let fields: [String: String]
    }

    private let entries = Mutex<[Entry]>([])

    public init() {}

    /// Every entry so far.
    public var all: [Entry] { entries.withLock { $0 } }

    /// A logger whose entries at `level` or above land here.
    public func logger(label: String, level: Logger.Level = .trace) -> Logger {
        var logger = Logger(label: label) { [self] _ in Handler(log: self) }
        logger.logLevel = level
        return logger
    }

    private struct Handler: LogHandler {
        let log: CapturedLog
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            var fields: [String: String] = [:]
            for (k, v) in metadata.merging(event.metadata ?? [:], uniquingKeysWith: { $1 }) { fields[k] = "\(v)" }
            let entry = Entry(level: event.level, message: "\(event.message)", fields: fields)
            log.entries.withLock { $0.append(entry) }
        }
    }
}
