// clusterMaxConcurrentOperationCount through ClusterPermits: two nodes (two engines, two store connections) on one
// real PostgreSQL never execute more operations of a limited queue than the limit at any instant, and both use it;
// a free slot goes to the best waiting operation of either node (SPEC §8: slots go by priority).

import ClusterStore
@testable import Daemon
import Foundation
import Logging
import OperationEngine
import Synchronization
import Testing
import TestSupport
import TestTraits

@Suite("ClusterPermits", .serialized, .onItsOwnExecutor)
struct ClusterPermitsTests {
    @Test func clusterLimitHoldsAcrossTwoNodesAtEveryInstant() async throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let limit = 2
        let executing = Mutex((now: 0, most: 0, done: 0))
        var runners: [Task<Void, Never>] = []
        var permits: [ClusterPermits] = []
        var engines: [(Engine, GroupID)] = []
        for node in ["a", "b"] {
            let store = try PostgresClusterStore(url: DatabaseURL(server.url(database), passwordFile: server.passwordFile()))
            // As the daemon runs them: the store and the permits on an executor of their own, never on the shared
            // cooperative pool, which the suite's synchronous tests (and one on purpose) hold for seconds at a time.
            let executor = ClusterExecutor(label: "test-permits-\(node)")
            runners.append(Task(executorPreference: executor) { await store.run() })
            _ = try await store.migrate()
            try await store.registerNode(NodeDeclaration(node: node, queues: ["api"], commands: [], jobSlots: 4,
                                                         clusterLimits: ["api": limit]))
            // As the daemon does: a transition of a limited queue and a slot freed elsewhere nudge the permits.
            let box = Mutex<ClusterPermits?>(nil)
            let engine = Engine(observer: { events in
                for case .transition(let t) in events where t.state.isFinished { box.withLock { $0 }?.operationEnded(queue: "api") }
            })
            let api = engine.addQueue(named: "api", maxConcurrentOperationCount: 3)
            let p = ClusterPermits(store: store, node: node, leaseSeconds: 5, engine: engine, logger: Logger(label: "test"))
            box.withLock { $0 = p }
            runners.append(Task(executorPreference: executor) { for await wakeup in store.wakeups where wakeup == .slots { p.nudge() } })
            p.configure(["api": .init(queue: api, limit: limit)])
            runners.append(Task(executorPreference: executor) { await p.run() })
            permits.append(p)
            var graph = GraphBuilder()
            for i in 0..<6 {
                graph.add(OperationSpec(name: "op\(i)", queue: api, body: .sync { _ in
                    executing.withLock { $0.now += 1; $0.most = max($0.most, $0.now) }
                    usleep(40_000)
                    executing.withLock { $0.now -= 1; $0.done += 1 }
                    return nil
                }))
            }
            engines.append((engine, try engine.submit(graph)))
        }
        let started = Date()
        let deadline = Date().addingTimeInterval(30)
        while executing.withLock({ $0.done }) < 12 && Date() < deadline { try await Task.sleep(for: .milliseconds(20)) }
        let seen = executing.withLock { $0 }
        print("12 operations of 40 ms at cluster limit \(limit): \(String(format: "%.2f", Date().timeIntervalSince(started))) s")
        #expect(seen.done == 12, "every operation ran")
        #expect(seen.most <= limit, "at most \(limit) executed at once across both nodes (saw \(seen.most))")
        #expect(seen.most == limit, "both slots were used")
        for (engine, group) in engines {
            #expect(engine.records(group)?.allSatisfy { $0.state == .succeeded } == true)
        }
        // Idle again: every slot is given back.
        try await Task.sleep(for: .milliseconds(1_500))
        #expect(permits.map { $0.held.values.reduce(0, +) } == [0, 0])
        for r in runners { r.cancel() }
        for r in runners { await r.value }
    }

    /// Two nodes on one database, queue `api` limited to one slot cluster-wide and to one operation on each node,
    /// wired as the daemon wires them; operations record the order they start in.
    final class TwoNodes: @unchecked Sendable {
        let started = Mutex<[String]>([])
        var runners: [Task<Void, Never>] = []
        var nodes: [(engine: Engine, api: QueueID, permits: ClusterPermits)] = []
        let server: PostgresServer
        let database: String

        init() async throws {
            server = try PostgresServer.shared.get()
            database = try server.createDatabase()
            for node in ["a", "b"] {
                let store = try PostgresClusterStore(url: DatabaseURL(server.url(database), passwordFile: server.passwordFile()))
                let executor = ClusterExecutor(label: "test-permits-\(node)")  // as in the first test
                runners.append(Task(executorPreference: executor) { await store.run() })
                _ = try await store.migrate()
                try await store.registerNode(NodeDeclaration(node: node, queues: ["api"], commands: [], jobSlots: 4,
                                                             clusterLimits: ["api": 1]))
                // A beat a second, as a node's loop makes: a waiter counts only while its node is live (lease 5 s), and
                // on a loaded machine the operations may come more than 5 s after the registration's beat (b then kept
                // the slot from a, whose wait no longer counted: a CI run saw all five lows before the highs).
                runners.append(Task(executorPreference: executor) {
                    while !Task.isCancelled {
                        _ = try? await store.heartbeat(node: node)
                        try? await Task.sleep(for: .seconds(1))
                    }
                })
                // Every transition of a limited queue, and a slot freed elsewhere, nudge the permits.
                let box = Mutex<ClusterPermits?>(nil)
                let engine = Engine(observer: { events in
                    for case .transition(let t) in events { box.withLock { $0 }?.transition(queue: "api", state: t.state) }
                })
                let api = engine.addQueue(named: "api", maxConcurrentOperationCount: 1)
                let p = ClusterPermits(store: store, node: node, leaseSeconds: 5, engine: engine, logger: Logger(label: "test"))
                box.withLock { $0 = p }
                runners.append(
                    Task(executorPreference: executor) { for await wakeup in store.wakeups where wakeup == .slots { p.nudge() } })
                p.configure(["api": .init(queue: api, limit: 1)])
                runners.append(Task(executorPreference: executor) { await p.run() })
                nodes.append((engine, api, p))
            }
        }

        func submit(_ k: Int, _ names: [String], _ priority: QueuePriority, seconds: Double) throws -> GroupID {
            var graph = GraphBuilder()
            for name in names {
                graph.add(OperationSpec(name: name, queue: nodes[k].api, queuePriority: priority, body: .sync { [self] _ in
                    self.started.withLock { $0.append(name) }
                    usleep(UInt32(seconds * 1e6))
                    return nil
                }))
            }
            return try nodes[k].engine.submit(graph)
        }

        var order: [String] { started.withLock { $0 } }

        /// Waits until node `k`'s wait for a slot is committed to the database (the permits note it once the
        /// store has said so: read in memory, since a poll that starts a psql each time can miss a wait that
        /// lasts a fraction of a second on a loaded machine); returns the operations started by then (nil: not
        /// within 20 s).
        func waitRecorded(_ k: Int) async throws -> [String]? {
            let deadline = Date().addingTimeInterval(20)
            while Date() < deadline {
                if nodes[k].permits.recordedWaits["api"] != nil { return order }
                try await Task.sleep(for: .milliseconds(2))
            }
            return nil
        }

        /// Whether node `name`'s wait is a row of the database now.
        func waitRow(_ name: String) throws -> Bool {
            try server.psql(database, "SELECT count(*) FROM opq_slot_waiters WHERE node = '\(name)'")
                .trimmingCharacters(in: .whitespacesAndNewlines) == "1"
        }

        func waitFor(_ condition: () -> Bool) async throws {
            let deadline = Date().addingTimeInterval(20)
            while !condition() && Date() < deadline { try await Task.sleep(for: .milliseconds(10)) }
        }

        func succeeded(_ k: Int, _ group: GroupID) async throws -> Bool {
            try await waitFor { nodes[k].engine.records(group)?.allSatisfy { $0.state == .succeeded } == true }
            return nodes[k].engine.records(group)?.allSatisfy { $0.state == .succeeded } == true
        }

        func stop() async {
            for r in runners { r.cancel() }
            for r in runners { await r.value }
        }
    }

    /// Node b runs five `veryLow` operations one after another on the only slot; node a then waits with three
    /// `veryHigh` ones. Once a's wait is recorded, b's running operation is the last it starts before a's three
    /// (b does not start its next one on the slot; one more is allowed for an operation that ended just as the
    /// wait was recorded), then b gets the slot back.
    @Test func aBetterWaiterElsewhereGetsTheSlotAtTheNextOperationsEnd() async throws {
        let c = try await TwoNodes()
        let lows = (1...5).map { "low\($0)" }, highs = (1...3).map { "high\($0)" }
        // Each long enough that a's wait row, which lives until b's running operation ends, is seen by a poll that
        // starts a psql each time (0.3 s was missed once under a full CI run: the row came and went between polls).
        let low = try c.submit(1, lows, .veryLow, seconds: 1)
        try await c.waitFor { c.order == ["low1"] }
        let high = try c.submit(0, highs, .veryHigh, seconds: 0.03)
        let before = try #require(try await c.waitRecorded(0), "a's wait was recorded")
        try await c.waitFor { c.order.count == 8 }
        let order = c.order
        let first = order.firstIndex(of: "high1") ?? order.count
        #expect(Array(order.dropFirst(first).prefix(3)) == highs, "a's three ran one after another: \(order)")
        #expect(first <= before.count + 1 && first < 5, """
            a's veryHigh operations took the slot at the end of b's running operation \
            (\(before.count) started when a's wait was recorded): \(order)
            """)
        #expect(try await c.succeeded(1, low))
        #expect(try await c.succeeded(0, high))
        await c.stop()
    }

    /// Node b holds the only slot with one long operation and has five `veryHigh` ones queued behind it (its own
    /// limit is 1, so they wait for it, then for the slot); node a waited first, with five `veryLow` ones. When
    /// the long one ends, b keeps the slot, since its next operation outranks a's: all five `veryHigh` run before
    /// any `veryLow`, then a gets the slot.
    @Test func theHolderKeepsTheSlotForItsOwnBetterOperations() async throws {
        let c = try await TwoNodes()
        // Long enough that a's wait is recorded while it runs: under a full CI run (every suite at once, the shared
        // cooperative pool held by synchronous tests) the permits' round trips have taken 50 times as long as alone,
        // and 3 s was once over before a's wait was recorded.
        let hold = try c.submit(1, ["hold"], .normal, seconds: 8)
        try await c.waitFor { c.order == ["hold"] }
        let low = try c.submit(0, (1...5).map { "low\($0)" }, .veryLow, seconds: 0.03)
        #expect(try await c.waitRecorded(0) == ["hold"], "a's operations wait: b holds the only slot")
        #expect(try c.waitRow("a"), "a's wait is a row of the database")
        let high = try c.submit(1, (1...5).map { "high\($0)" }, .veryHigh, seconds: 0.03)
        #expect(c.nodes[1].engine.records(hold)?.first?.state == .executing, "b's veryHigh operations are there before the slot frees")
        try await c.waitFor { c.order.count == 11 }
        #expect(c.order == ["hold"] + (1...5).map { "high\($0)" } + (1...5).map { "low\($0)" },
                "every veryHigh operation of b before any veryLow one of a, which waited longer: \(c.order)")
        #expect(try await c.succeeded(1, hold))
        #expect(try await c.succeeded(0, low))
        #expect(try await c.succeeded(1, high))
        await c.stop()
    }
}
