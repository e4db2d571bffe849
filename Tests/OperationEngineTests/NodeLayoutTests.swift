// The scheduler's compact layouts: a node's raised QoS packed with its flags, the dependents rows that
// `prepare` fills from the back, and room reserved in a ready list for a batch ready at once.

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

    @Test func roomReservedForABurstIsLetGoOnceItHasRun() throws {
        var list = ReadyList()
        list.reserve(10_000)
        #expect(list.highWater == 10_000)
        for i in 0..<3 { list.push(ReadyEntry(seq: UInt64(i), ref: NodeRef(group: 1, index: Int32(i)))) }
        #expect(list.pop()?.seq == 0)
        #expect(list.pop()?.seq == 1)
        #expect(list.highWater == 10_000, "not empty yet")
        #expect(list.pop()?.seq == 2)
        #expect(list.highWater == 0, "emptied: the reserved storage is let go")
        // A whole queue of independent operations ready at submission comes out in submission order.
        var h = Harness()
        let q = h.queue("q", limit: 1)
        var g = GraphBuilder()
        for i in 0..<5_000 { g.add(spec("op\(i)", q)) }
        _ = try h.s.submit(g, now: h.now)
        var started: [String] = []
        while let d = h.s.nextDispatch(now: h.now) {
            started.append(d.name)
            h.s.finish(d.attempt, outcome: .succeeded(nil), now: h.now)
        }
        #expect(started == (0..<5_000).map { "op\($0)" })
    }
}
