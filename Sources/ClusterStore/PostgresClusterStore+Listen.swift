// The dedicated LISTEN connection: postgres-nio's pool hands connections out per query and never listens, so
// one connection of its own waits for notifications, reconnecting (0.1 s, doubling to at most 5 s apart) when
// it drops. Notifications are hints: a node still polls at least once a second.

import Logging
import PostgresNIO

extension PostgresClusterStore {
    func listen() async {
        var delay = Duration.milliseconds(100)
        var lastFailure: String?
        while !Task.isCancelled {
            do {
                let connection = try await PostgresConnection.connect(
                    configuration: try url.connectionConfiguration(), id: 1, logger: logger)
                do {
                    try await connection.listen(on: Self.channel) { notifications in
                        lastFailure = nil
                        delay = .milliseconds(100)
                        wakeupContinuation.yield(.connected)
                        for try await notification in notifications {
                            switch notification.payload {
                            case "jobs": wakeupContinuation.yield(.jobs)
                            case "control": wakeupContinuation.yield(.control)
                            case "slots": wakeupContinuation.yield(.slots)
                            case "rates": wakeupContinuation.yield(.rates)
                            case "nodes": wakeupContinuation.yield(.nodes)
                            case let payload where payload.hasPrefix("probe "):
                                wakeupContinuation.yield(.probe(String(payload.dropFirst("probe ".count))))
                            default: break  // a newer node's wake-up: the poll covers it
                            }
                        }
                    }
                    try? await connection.close()
                    if !Task.isCancelled { wakeupContinuation.yield(.disconnected("the listening connection ended")) }
                } catch {
                    try? await connection.close()
                    throw error
                }
            } catch {
                if Task.isCancelled { break }
                let message = ClusterStoreError.wrapping(error, doing: "listening for wake-ups").description
                // Repeated identical failures are said once; the caller logs transitions.
                if message != lastFailure { wakeupContinuation.yield(.disconnected(message)) }
                lastFailure = message
            }
            try? await Task.sleep(for: delay)
            delay = min(delay * 2, .seconds(5))
        }
    }
}
