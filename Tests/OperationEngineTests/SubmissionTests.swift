// Submission's shortcuts for large graphs: the queues checked against the highest one named, and a first batch's
// ready operations listed while numbering it when they are few, rather than found by a scan of every node.

import Testing
@testable import OperationEngine

@Suite struct SubmissionTests {
    @Test func anUnknownQueueIsRefusedNamingEachOperationThatNamesIt() throws {
        var h = Harness()
        let q = h.queue("q")
        var g = GraphBuilder()
        g.add(spec("fine", q))
        g.add(spec("ghost", QueueID(3)))
        g.add(spec("also fine", q), dependencies: [0])
        g.add(spec("phantom", QueueID(1)), dependencies: [7])
        do {
            _ = try h.s.submit(g, now: h.now)
            Issue.record("submission should fail")
        } catch {
            #expect(error.problems == ["operation 'ghost': unknown queue queue#3", "operation 'phantom': unknown queue queue#1",
                                       "operation 'phantom' depends on unknown operation #7"])
        }
        var known = GraphBuilder()
        known.add(spec("a", q))
        known.add(spec("b", h.queue("r")))
        let group = try h.s.submit(known, now: h.now)
        #expect(h.dispatch() == ["a", "b"])
        #expect(h.states(group).count == 2)
    }

    /// Few ready among many (listed while numbering) and many ready (found by a scan) start alike: in submission order,
    /// the ones waiting only once what they wait for ends.
    @Test func aFirstBatchReadyOperationsStartInOrderWhetherFewOrMany() throws {
        for readyEvery in [80, 2] {
            var h = Harness()
            let q = h.queue("q", limit: 1_000)
            var g = GraphBuilder()
            var ready: [String] = []
            for i in 0..<640 {
                if i % readyEvery == 0 {
                    ready.append("op\(i)")
                    g.add(spec("op\(i)", q))
                } else {
                    g.add(spec("op\(i)", q), dependencies: [i - i % readyEvery])
                }
            }
            let group = try h.s.submit(g, now: h.now)
            #expect(h.dispatch() == ready)
            h.succeed("op0")
            #expect(h.dispatch() == (1..<readyEvery).map { "op\($0)" })
            #expect(h.states(group).values.filter { $0 == .pending }.count == 640 - ready.count - (readyEvery - 1))
        }
    }
}
