// The scheduler's compact layouts: a node's raised QoS packed with its flags, the dependents rows that
// `prepare` fills from the back, room reserved in a ready list for a batch ready at once, and the list's order.

import Testing
@testable import OperationEngine

@Suite struct NodeLayoutTests {
    @Test func aRaiseAndTheFlagsShareAByteWithoutEitherLosingTheOther() throws {
        #expect(MemoryLayout<Scheduler.Node>.stride == 32, "a million operations: 32 MB of nodes, two to a cache line")
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

    @Test func aReadyListGivesSubmissionOrderHoweverItsEntriesArrive() {
        func entry(_ seq: Int) -> ReadyEntry { ReadyEntry(seq: UInt64(seq), ref: NodeRef(group: 1, index: Int32(seq))) }
        var list = ReadyList()
        // One at a time (a chain): each entry alone in the list.
        for seq in 0..<3 {
            list.push(entry(seq))
            #expect(list.peek()?.seq == UInt64(seq))
            #expect(list.pop()?.seq == UInt64(seq))
            #expect(list.isEmpty)
        }
        // A second entry, earlier than the one waiting alone, comes out first.
        list.push(entry(20))
        list.push(entry(10))
        #expect(list.pop()?.seq == 10)
        list.push(entry(15))
        #expect(list.pop()?.seq == 15)
        #expect(list.pop()?.seq == 20)
        #expect(list.pop() == nil)
        // Layers made ready out of order, popped while others arrive: always the smallest waiting.
        var rng = SystemRandomNumberGenerator()
        var waiting = Set<Int>()
        var next = 100
        for _ in 0..<2_000 {
            if waiting.isEmpty || Int.random(in: 0..<3, using: &rng) > 0 {
                let seq = next + Int.random(in: 0..<64, using: &rng)
                guard !waiting.contains(seq) else { continue }
                waiting.insert(seq)
                list.push(entry(seq))
                if Int.random(in: 0..<32, using: &rng) == 0 { next += 64 }
            } else {
                let popped = list.pop().map { Int($0.seq) }
                #expect(popped == waiting.min())
                if let popped { waiting.remove(popped) }
            }
        }
        while let popped = list.pop() {
            #expect(Int(popped.seq) == waiting.min())
            waiting.remove(Int(popped.seq))
        }
        #expect(waiting.isEmpty)
    }

    @Test func operationsSharingABodyKeepItOnceAndADifferentOneWritesThemOut() throws {
        let shared = OperationBody.sync { _ in "shared" }
        let other = OperationBody.async { $0.finish(.success("other")) }
        #expect(shared.isSame(as: shared) && !shared.isSame(as: other))
        #expect(!shared.isSame(as: OperationBody.sync { _ in "shared" }), "a closure made apart is another body")
        var bodies = Bodies()
        for _ in 0..<3 { bodies.append(shared) }
        #expect(bodies.count == 3 && bodies.isShared)
        bodies.append(other)
        bodies.append(shared)
        #expect(bodies.count == 5 && !bodies.isShared)
        var more = Bodies()
        more.append(other)
        bodies.append(contentsOf: more)
        let kinds = (0..<bodies.count).map { if case .async = bodies[$0] { "async" } else { "sync" } }
        #expect(kinds == ["sync", "sync", "sync", "async", "sync", "async"])
        // Through the scheduler: each operation runs its own body.
        var h = Harness()
        let q = h.queue("q", limit: 10)
        var g = GraphBuilder()
        for i in 0..<4 { g.add(OperationSpec(name: "\(i)", queue: q, body: i == 2 ? other : shared)) }
        let group = try h.s.submit(g, now: h.now)
        let asyncOnes = (0..<4).filter { if case .async = h.s.groups[Int(group.slot)].bodies[$0] { true } else { false } }
        #expect(asyncOnes == [2])
    }

    @Test func optionsAndInputsKeptApartFromTheNodesFollowTheirOperationsIntoAnExtension() throws {
        var h = Harness()
        let q = h.queue("q", limit: 10)
        var g = GraphBuilder()
        g.add(spec("a", q, retries: 1, retryDelay: 0))
        g.add(spec("b", q))
        let group = try h.s.submit(g, now: h.now)
        var more = GraphBuilder(base: 2)
        more.add(spec("c", q, timeout: 5, retries: 3, retryDelay: 0))
        more.add(spec("d", q, input: 1), dependencies: [0, 1])
        try h.s.extend(group, with: more, now: h.now)
        let stored = h.s.groups[Int(group.slot)]
        #expect((0..<4).map { stored.optionIndex[$0] } == [0, -1, 1, -1])
        #expect(stored.options[1].retries == 3 && stored.options[1].timeout == 5)
        #expect((0..<4).map { stored.inputs[$0] } == [-1, -1, -1, 1])
        #expect(Set(h.dispatch()) == ["a", "b", "c"])
        #expect(h.takeTimers().map(\.delay) == [5], "c's timeout, not a's options")
        h.succeed("a", output: "from-a")
        h.succeed("b", output: "from-b")
        #expect(h.dispatch() == ["d"])
        #expect(h.running["d"]?.input as? String == "from-b", "its input named, not its first dependency")
    }
}
