// The statement pool, renewable. postgres-nio's pool retries a server that refused it on a backoff of its own that
// grows to a minute between attempts (and after a minute of failures fails every request at once until one of its
// own attempts succeeds): a node would come back up to a minute after its database did. SPEC §8 wants the retries
// at most 5 s apart, so the node's loop decides when to try: once a connection of its own has reached the server
// and the pool still does not answer, `renew` puts a fresh pool in its place, whose first request connects at once.
// Statements in flight on the old pool fail (it is shut down) and are retried like any failed statement.

import Logging
import PostgresNIO
import Synchronization

final class RenewablePool: Sendable {
    private struct Current: Sendable {
        var client: PostgresClient
        var retire: AsyncStream<Void>.Continuation
    }

    private let configuration: PostgresClient.Configuration
    private let logger: Logger
    private let current: Mutex<Current>
    /// Every pool to run, in order: `run` runs each until it is retired (or `run` is cancelled).
    private let pools: AsyncStream<(PostgresClient, AsyncStream<Void>)>
    private let poolsContinuation: AsyncStream<(PostgresClient, AsyncStream<Void>)>.Continuation

    init(configuration: PostgresClient.Configuration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        (pools, poolsContinuation) = AsyncStream.makeStream(of: (PostgresClient, AsyncStream<Void>).self)
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        let (retired, retire) = AsyncStream.makeStream(of: Void.self)
        current = Mutex(Current(client: client, retire: retire))
        poolsContinuation.yield((client, retired))
    }

    /// The pool statements go through now.
    var client: PostgresClient { current.withLock { $0.client } }

    /// A fresh pool from now on; the old one is shut down.
    func renew() {
        let fresh = PostgresClient(configuration: configuration, backgroundLogger: logger)
        let (retired, retire) = AsyncStream.makeStream(of: Void.self)
        let old = current.withLock { current in
            defer { current = Current(client: fresh, retire: retire) }
            return current.retire
        }
        poolsContinuation.yield((fresh, retired))
        old.finish()
    }

    /// Runs each pool until it is retired; returns when the calling task is cancelled.
    func run() async {
        await withDiscardingTaskGroup { group in
            for await (client, retired) in pools {
                group.addTask {
                    await withTaskGroup(of: Void.self) { one in
                        one.addTask { await client.run() }
                        one.addTask { for await _ in retired {} }
                        _ = await one.next()
                        one.cancelAll()
                    }
                }
            }
        }
    }
}
