// A statement is never left waiting on a connection that has closed.
//
// postgres-nio 1.33.2 writes a statement to its connection's channel without a promise
// (`PostgresClient.query`, `PostgresConnection.query`: `channel.write(…, promise: nil)`). When the server ends the
// session (a restart, a failover, `pg_terminate_backend`), NIO marks the channel inactive, then removes its
// handlers, then completes `closeFuture`; the pool leases the connection as idle until then. A statement whose
// write reaches the channel after the handlers are gone is dropped by the pipeline (ioOnClosedChannel, to a nil
// promise) and nothing ever completes it — cancelling its task does not either. Measured with 4 statements at once
// after each `pg_terminate_backend`: 32 of 400 never returned (0 with a promise on the write; the upstream fix,
// vapor/postgres-nio#487, covers `PostgresConnection.query` only). The node's loop gave such a heartbeat up after
// 5 s and called the database gone, and each one left a suspended task behind.
//
// So every statement on a pooled or dedicated connection runs under `InFlightStatements.run`: when the connection
// closes, what is still in flight on it 100 ms later (time for the statements the driver does fail to say so
// themselves) fails with `StatementLostOnClosedConnection`. Such a statement never reached the server, so the
// caller's retry is safe. One close watcher per connection, not per statement: a connection serving a million
// statements keeps one callback.

import NIOCore
import PostgresNIO
import Synchronization

/// A statement given up on because its connection closed under it (postgres-nio dropped its write).
struct StatementLostOnClosedConnection: Error, CustomStringConvertible {
    var description: String { "the connection closed before the statement could be sent" }
}

final class InFlightStatements: Sendable {
    /// Where the statements run: never the cooperative pool, which threads blocked elsewhere may hold.
    private let executor: ClusterExecutor
    /// Per connection watched (until its close watcher has run): the connection itself, held so that no other can
    /// take its address and with it its key while its entry lives, and each statement in flight on it, as the way
    /// to fail it.
    private struct Watched {
        let connection: PostgresConnection
        var statements: [UInt64: @Sendable () -> Void] = [:]
    }
    private let state = Mutex<(next: UInt64, connections: [ObjectIdentifier: Watched])>((0, [:]))

    init(executor: ClusterExecutor) { self.executor = executor }

    /// How long after a connection closed its statements still in flight are failed.
    static let grace: TimeAmount = .milliseconds(100)

    /// Runs `body` (statements on `connection`) to its end, or until `connection` closes under it.
    func run<T: Sendable>(on connection: PostgresConnection, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let key = ObjectIdentifier(connection)
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let once = ResumeOnce(continuation)
            let fail: @Sendable () -> Void = {
                if once.resume(.failure(StatementLostOnClosedConnection())) { once.cancelTask() }
            }
            let (id, watch) = state.withLock { state -> (UInt64, Bool) in
                state.next += 1
                let watch = state.connections[key] == nil
                state.connections[key, default: Watched(connection: connection)].statements[state.next] = fail
                return (state.next, watch)
            }
            once.attach(Task(executorPreference: executor) {
                let result: Result<T, any Error>
                do { result = .success(try await body()) } catch { result = .failure(error) }
                self.state.withLock { _ = $0.connections[key]?.statements.removeValue(forKey: id) }
                once.resume(result)
            })
            // Registered once per connection; on a connection already closed it runs at once.
            if watch {
                connection.closeFuture.whenComplete { [self] _ in
                    connection.eventLoop.scheduleTask(in: Self.grace) {
                        let lost = self.state.withLock { $0.connections.removeValue(forKey: key) }?.statements ?? [:]
                        for fail in lost.values { fail() }
                    }
                }
            }
        }
    }

    /// Connections watched now (for tests: one per open connection, none left once they closed).
    var watchedConnections: Int { state.withLock { $0.connections.count } }
}

/// A continuation resumed at most once, from whichever side comes first, and the task of the side that may lose.
private final class ResumeOnce<T: Sendable>: Sendable {
    private let continuation: Mutex<CheckedContinuation<T, any Error>?>
    private let task = Mutex<Task<Void, Never>?>(nil)

    init(_ continuation: CheckedContinuation<T, any Error>) { self.continuation = Mutex(continuation) }

    func attach(_ task: Task<Void, Never>) { self.task.withLock { $0 = task } }

    /// Cancels the statement's task (in vain for a dropped write, but a statement that was sent is cancelled).
    func cancelTask() { task.withLock { $0?.cancel() } }

    /// Whether this call resumed it.
    @discardableResult
    func resume(_ result: Result<T, any Error>) -> Bool {
        guard let continuation = continuation.withLock({ c in defer { c = nil }; return c }) else { return false }
        continuation.resume(with: result)
        return true
    }
}
