// clusterMaxConcurrentOperationCount through ClusterPermits: two nodes (two engines, two store connections) on one
// real PostgreSQL never execute more operations of a limited queue than the limit at any instant, and both use it.

import ClusterStore
@testable import Daemon
import Foundation
import Logging
import OperationEngine
import Synchronization
import Testing
import TestSupport

@Suite("ClusterPermits", .serialized)
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
            runners.append(Task { await store.run() })
            _ = try await store.migrate()
            try await store.registerNode(NodeDeclaration(node: node, queues: ["api"], commands: [], jobSlots: 4, clusterLimits: ["api": limit]))
            // As the daemon does: a transition of a limited queue and a slot freed elsewhere nudge the permits.
            let box = Mutex<ClusterPermits?>(nil)
            let engine = Engine(observer: { events in
                for case .transition(let t) in events where t.state.isFinished { box.withLock { $0 }?.operationEnded(queue: "api") }
            })
            let api = engine.addQueue(named: "api", maxConcurrentOperationCount: 3)
            let p = ClusterPermits(store: store, node: node, engine: engine, logger: Logger(label: "test"))
            box.withLock { $0 = p }
            runners.append(Task { for await wakeup in store.wakeups where wakeup == .slots { p.nudge() } })
            p.configure(["api": .init(queue: api, limit: limit)])
            runners.append(Task { await p.run() })
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
}
