// Tests of start budgets (a cluster-wide rate's grants, SPEC §3.7 `clusterRateLimit`): the scheduler's rules one
// step at a time, with the harness's clock as the budget's monotonic one.

import Testing
@testable import OperationEngine

@Suite struct StartBudgetTests {
    func budgeted(_ h: inout Harness, limit: Int = 10, rate: RateLimit? = nil) -> QueueID {
        let q = h.s.addQueue(name: "api", maxConcurrentOperationCount: limit, qualityOfService: .default, suspended: false,
                             rateLimit: rate)
        h.s.setStartBudget(q.rawValue, enabled: true)
        return q
    }

    func grant(_ h: inout Harness, _ q: QueueID, _ count: Int, within: Double = 1, nextFree: Double? = nil) {
        h.s.queues[q.rawValue].budget = StartBudget(starts: count, until: h.now + within, nextFree: nextFree)
    }

    @Test func nothingStartsWithoutAGrantAndEachStartSpendsOne() throws {
        var h = Harness()
        let q = budgeted(&h)
        var g = GraphBuilder()
        for i in 0..<5 { g.add(spec("op\(i)", q)) }
        let group = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == [], "an empty budget holds every start")
        #expect(h.states(group)["op0"] == .ready)
        #expect(h.s.startDemand(q.rawValue) == 5)
        #expect(h.takeTimers().isEmpty, "the holder grants; the scheduler arms nothing")
        grant(&h, q, 2)
        #expect(h.dispatch() == ["op0", "op1"])
        #expect(h.s.queues[q.rawValue].budget?.starts == 0)
        #expect(h.s.startDemand(q.rawValue) == 3)
        h.succeed("op0")
        #expect(h.dispatch() == [], "an ending gives no start back, unlike a permit")
    }

    @Test func aGrantIsUsedBeforeItsDeadlineOrNotAtAll() throws {
        var h = Harness()
        let q = budgeted(&h)
        var g = GraphBuilder()
        for i in 0..<3 { g.add(spec("op\(i)", q)) }
        _ = try h.s.submit(g, now: h.now)
        grant(&h, q, 3, within: 1)
        h.now += 1
        #expect(h.dispatch() == [], "at its deadline a grant is no longer good")
        #expect(h.s.queues[q.rawValue].budget?.starts == 3, "what is left is for the holder to report unused")
        grant(&h, q, 1, within: 1)
        h.now += 0.999
        #expect(h.dispatch() == ["op0"])
    }

    @Test func aRetryIsAStartAndABarrierNeedsNone() throws {
        var h = Harness()
        let q = budgeted(&h)
        var g = GraphBuilder()
        g.add(spec("flaky", q, retries: 1, retryDelay: 0))
        _ = try h.s.submit(g, now: h.now)
        grant(&h, q, 1)
        #expect(h.dispatch() == ["flaky"])
        h.fail("flaky")
        for timer in h.takeTimers() { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == [], "the second attempt waits for a grant of its own")
        grant(&h, q, 1)
        #expect(h.dispatch() == ["flaky"])
    }

    @Test func theBudgetTheLocalRateAndTheLimitAllHold() throws {
        var h = Harness()
        let q = budgeted(&h, limit: 2, rate: rate(3, per: 10))
        var g = GraphBuilder()
        for i in 0..<6 { g.add(spec("op\(i)", q)) }
        _ = try h.s.submit(g, now: h.now)
        #expect(h.s.startDemand(q.rawValue) == 2, "demand counts what the queue's own limit lets start")
        grant(&h, q, 5, within: 100)
        #expect(h.dispatch() == ["op0", "op1"], "the limit")
        h.succeed("op0")
        h.succeed("op1")
        #expect(h.dispatch() == ["op2"], "the local rate: 3 per 10 s")
        #expect(h.s.queues[q.rawValue].budget?.starts == 2)
    }

    @Test func statusShowsWhenTheNextGrantFrees() throws {
        var h = Harness()
        let q = budgeted(&h)
        var g = GraphBuilder()
        for i in 0..<2 { g.add(spec("op\(i)", q)) }
        _ = try h.s.submit(g, now: h.now)
        grant(&h, q, 1, nextFree: h.now + 4)
        #expect(h.s.snapshot(q.rawValue, now: 5_000, monotonic: h.now).nextStartAt == nil, "a start is free now")
        #expect(h.dispatch() == ["op0"])
        #expect(h.s.snapshot(q.rawValue, now: 5_000, monotonic: h.now).nextStartAt == 5_004)
        h.now += 5
        #expect(h.s.snapshot(q.rawValue, now: 5_000, monotonic: h.now).nextStartAt == nil, "a time gone by says nothing")
    }

    @Test func removingTheBudgetFreesTheQueue() throws {
        var h = Harness()
        let q = budgeted(&h)
        #expect(h.s.ratedQueues == 1, "the engine reads the monotonic clock for it")
        var g = GraphBuilder()
        for i in 0..<2 { g.add(spec("op\(i)", q)) }
        _ = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == [])
        h.s.setStartBudget(q.rawValue, enabled: false)
        #expect(h.s.ratedQueues == 0)
        #expect(h.dispatch() == ["op0", "op1"])
    }
}
