// The statement pool, renewable. postgres-nio's pool retries a server that refused it on a backoff of its own that
// grows to a minute between attempts (and after a minute of failures fails every request at once until one of its
// own attempts succeeds): a node would come back up to a minute after its database did. SPEC §8 wants the retries
// at most 5 s apart, so the node's loop decides when to try: once a connection of its own has reached the server
// and the pool still does not answer, `renew` puts a fresh pool in its place, whose first request connects at once.
// Statements in flight on the old pool fail (it is shut down) and are retried like any failed statement.

import Dispatch
import Logging
import PostgresNIO
import Synchronization

final class RenewablePool: Sendable {
    private struct Current: Sendable {
        var client: PostgresClient
        var retire: AsyncStream<Void>.Continuation
    }

    /// A pool handed to `run`: `begin` (once, just before its run() starts) makes it the one statements use.
    private struct Pool: Sendable {
        let client: PostgresClient
        let retired: AsyncStream<Void>
        let begin: @Sendable () -> Void
    }

    /// Makes a fresh pool's configuration (the password file read again); when it throws, the last one serves.
    private let makeConfiguration: @Sendable () throws -> PostgresClient.Configuration
    private let lastConfiguration: Mutex<PostgresClient.Configuration>
    private let logger: Logger
    private let current: Mutex<Current>
    /// Set once the first pool's run() is about to start: statements wait for it (see `client()`).
    private let firstRunning = RunningFlag()
    /// Every pool to run, in order: `run` runs each until it is retired (or `run` is cancelled).
    private let pools: AsyncStream<Pool>
    private let poolsContinuation: AsyncStream<Pool>.Continuation

    init(makeConfiguration: @escaping @Sendable () throws -> PostgresClient.Configuration, logger: Logger) throws {
        let configuration = try makeConfiguration()
        self.makeConfiguration = makeConfiguration
        lastConfiguration = Mutex(configuration)
        self.logger = logger
        (pools, poolsContinuation) = AsyncStream.makeStream(of: Pool.self)
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        let (retired, retire) = AsyncStream.makeStream(of: Void.self)
        current = Mutex(Current(client: client, retire: retire))
        poolsContinuation.yield(Pool(client: client, retired: retired, begin: { [firstRunning] in firstRunning.set() }))
    }

    /// The pool statements go through now, once the first pool runs: a statement made before its run() started
    /// (the node's loop may ask before the task running the pools has been scheduled) would have postgres-nio warn
    /// in the journal that run() "hasn't been called yet". Waits at most five seconds for that (a loaded host can take
    /// over a second to schedule a task), then goes on (the statement then waits in the pool as before).
    func client() async -> PostgresClient {
        var waited = 0
        while !firstRunning.isSet && waited < 5000 {
            try? await Task.sleep(for: .milliseconds(1))
            waited += 1
        }
        return current.withLock { $0.client }
    }

    /// A fresh pool from now on; the old one is shut down. The fresh pool becomes the one statements use when its
    /// run() starts, never before (postgres-nio warns of a pool used before it runs): returns then, or after
    /// `wait` seconds (a cooperative pool too busy to start it: the old pool serves until it does). Blocks: call it
    /// from a thread of its own (the node's loop), not from a task.
    func renew(wait: Double = 1) {
        let configuration = lastConfiguration.withLock { last in
            if let fresh = try? makeConfiguration() { last = fresh }
            return last
        }
        let fresh = PostgresClient(configuration: configuration, backgroundLogger: logger)
        let (retired, retire) = AsyncStream.makeStream(of: Void.self)
        let running = DispatchSemaphore(value: 0)
        let begin: @Sendable () -> Void = { [weak self] in
            let old = self?.current.withLock { current in
                defer { current = Current(client: fresh, retire: retire) }
                return current.retire
            }
            // The old pool is shut down, and the caller let go, a moment later: by then this thread has long
            // entered the fresh pool's run() (called right after this returns), whose first step marks it running;
            // done at once, the woken caller's statement could reach the pool in between.
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(5)) {
                old?.finish()
                running.signal()
            }
        }
        poolsContinuation.yield(Pool(client: fresh, retired: retired, begin: begin))
        _ = running.wait(timeout: .now() + wait)
    }

    /// Runs each pool until it is retired; returns when the calling task is cancelled.
    func run() async {
        await withDiscardingTaskGroup { group in
            for await pool in pools {
                group.addTask {
                    await withTaskGroup(of: Void.self) { one in
                        one.addTask {
                            // Made current on this thread, then run() at once: its first step marks the pool
                            // running, before any statement can have found it.
                            pool.begin()
                            await pool.client.run()
                        }
                        one.addTask { for await _ in pool.retired {} }
                        _ = await one.next()
                        one.cancelAll()
                    }
                }
            }
        }
    }
}

/// A flag set once, read from any thread.
private final class RunningFlag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}
