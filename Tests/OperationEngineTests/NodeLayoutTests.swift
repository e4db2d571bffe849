// The scheduler's compact layouts: a node's raised QoS packed with its flags, and the dependents rows that
// `prepare` fills from the back.

import Testing
@testable import OperationEngine

@Suite struct NodeLayoutTests {
    @Test func aRaiseAndTheFlagsShareAByteWithoutEitherLosingTheOther() throws {
        #expect(MemoryLayout<Scheduler.Node>.stride == 48, "a million operations: 48 MB of nodes, not 56")
        var h = Harness()
        let q = h.queue("q", qos: .background)
        var g = GraphBuilder()
        g.add(spec("low", q, runsAfterFailure: true))
        g.add(spec("top", q, qos: .userInteractive), dependencies: [0])
        let group = try h.s.submit(g, now: h.now)
        let low = NodeRef(group: group.slot, index: 0)
        #expect(h.s.effectiveQoS(low) == .userInteractive, "raised by the operation waiting for it")
        #expect(h.s.groups[Int(group.slot)].nodes[0].flags & Scheduler.Node.runsAfterFailure != 0, "the raise kept the flag")
        #expect(h.dispatch() == ["low"])
        h.s.cancel(low, reason: "stop", now: h.now)
        let node = h.s.groups[Int(group.slot)].nodes[0]
        #expect(node.flags & Scheduler.Node.cancelRequested != 0)
        #expect(node.flags & Scheduler.Node.runsAfterFailure != 0)
        #expect(h.s.effectiveQoS(low) == .userInteractive, "the cancel flag kept the raise")
    }

    @Test func dependentsRowsKeepDependentOrder() throws {
        var h = Harness()
        let q = h.queue("q", limit: 10)
        var g = GraphBuilder()
        g.add(spec("a", q))
        g.add(spec("b", q))
        g.add(spec("c", q), dependencies: [0, 1])
        g.add(spec("d", q), dependencies: [1])
        g.add(spec("e", q), dependencies: [0, 0, 3])
        g.add(spec("f", q), dependencies: [0])
        let group = try h.s.submit(g, now: h.now)
        let rows = (0..<6).map { Array(h.s.dependents(of: NodeRef(group: group.slot, index: Int32($0)))) }
        #expect(rows == [[2, 4, 4, 5], [2, 3], [], [4], [], []])
        // Each dependent waits for every dependency it named, and starts in submission order once they end.
        #expect(h.dispatch() == ["a", "b"])
        h.succeed("a")
        h.succeed("b")
        #expect(h.dispatch() == ["c", "d", "f"])
        h.succeed("d")
        #expect(h.dispatch() == ["e"])
    }
}
