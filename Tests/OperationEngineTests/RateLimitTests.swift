// Tests of queue rates (SPEC §3.7 "At a rate"): the window on its own (tables), the scheduler's rules with
// a clock moved by hand, and the threaded engine in real time (starts per window, throughput, reloads, and
// an engine left idle while the rate holds its work).

import Foundation
import Synchronization
import Testing
@testable import OperationEngine
import TestTraits

func rate(_ operations: Int, per seconds: Double) -> RateLimit {
    guard let limit = RateLimit(operations: operations, seconds: seconds) else { preconditionFailure("a bad rate in a test") }
    return limit
}

/// The most starts that lie in one window of `seconds`, each start taken as a window's beginning.
/// `slack` narrows the window: the events' wall clock may drift from the limiter's monotonic clock.
func busiestWindow(_ starts: [Double], seconds: Double, slack: Double = 0.001) -> Int {
    let sorted = starts.sorted()
    var busiest = 0
    for (i, start) in sorted.enumerated() {
        busiest = max(busiest, sorted[i...].prefix { $0 < start + seconds - slack }.count)
    }
    return busiest
}

@Suite(.onItsOwnExecutor) struct RateWindowTests {
    @Test func aRateMustBePositive() {
        let cases: [(operations: Int, seconds: Double, valid: Bool)] = [
            (5, 0.4, true), (1, 1e-6, true), (1_000_000, 86_400, true),
            (0, 1, false), (-1, 1, false), (1, 0, false), (1, -2, false), (1, .infinity, false), (1, .nan, false),
        ]
        for c in cases {
            #expect((RateLimit(operations: c.operations, seconds: c.seconds) != nil) == c.valid, "\(c)")
        }
    }

    @Test func theNextFreeStartIsTheOldestOfTheLastNPlusTheWindow() {
        // A start at t is free when fewer than N starts lie in (t − S, t].
        let cases: [(n: Int, s: Double, starts: [Double], at: Double, next: Double?)] = [
            (3, 10, [], 0, nil),
            (3, 10, [0, 1], 1, nil),
            (3, 10, [0, 1, 2], 2, 10),
            (3, 10, [0, 1, 2], 9.999, 10),
            (3, 10, [0, 1, 2], 10, nil),
            (3, 10, [0, 1, 2, 10], 10, 11),
            (3, 10, [0, 1, 2, 10, 11, 12], 12, 20),
            (3, 10, [0, 0, 0], 5, 10),
            (1, 0.5, [5], 5.25, 5.5),
            (1, 0.5, [5], 5.5, nil),
        ]
        for c in cases {
            var window = RateWindow(rate(c.n, per: c.s))
            for start in c.starts { window.record(start) }
            #expect(window.nextFreeStart(at: c.at) == c.next, "\(c)")
            #expect(window.recorded == Array(c.starts.suffix(c.n)), "the ring keeps the last N, oldest first: \(c)")
        }
    }

    @Test func aNewLimitKeepsTheStartsMade() {
        let cases: [(from: RateLimit, starts: [Double], to: RateLimit, kept: [Double], at: Double, next: Double?)] = [
            (rate(3, per: 10), [0, 1, 2, 3, 4], rate(2, per: 10), [3, 4], 4, 13),
            (rate(2, per: 10), [0, 1, 2], rate(5, per: 10), [1, 2], 2, nil),
            (rate(3, per: 10), [0, 1, 2], rate(3, per: 1), [0, 1, 2], 2, nil),
            (rate(3, per: 1), [0, 1, 2], rate(3, per: 10), [0, 1, 2], 2, 10),
            (rate(1, per: 10), [7], rate(1, per: 10), [7], 8, 17),
        ]
        for c in cases {
            var window = RateWindow(c.from)
            for start in c.starts { window.record(start) }
            window.change(to: c.to)
            #expect(window.limit == c.to)
            #expect(window.recorded == c.kept, "\(c)")
            #expect(window.nextFreeStart(at: c.at) == c.next, "\(c)")
            // The ring goes on from what was kept.
            window.record(100)
            #expect(window.recorded == Array((c.kept + [100]).suffix(c.to.operations)), "\(c)")
        }
    }
}

/// The scheduler's rules for rates, one step at a time (the rates' clock is the harness's `now`).
@Suite(.onItsOwnExecutor) struct RateSchedulerTests {
    /// The harness counts two processors: the default limit would be 2.
    func ratedQueue(_ h: inout Harness, _ name: String, limit: Int = 10, suspended: Bool = false, rate: RateLimit?) -> QueueID {
        h.s.addQueue(name: name, maxConcurrentOperationCount: limit, qualityOfService: .default, suspended: suspended, rateLimit: rate)
    }

    func nextStartAt(_ h: Harness, _ q: QueueID, wall: Double) -> Double? {
        h.s.snapshot(q.rawValue, now: wall, monotonic: h.now).nextStartAt
    }

    @Test func heldOperationsStayReadyAndOneTimerWakesTheQueue() throws {
        var h = Harness()
        let q = ratedQueue(&h, "api", rate: rate(2, per: 10))
        var g = GraphBuilder()
        for i in 0..<5 { g.add(spec("op\(i)", q)) }
        let group = try h.s.submit(g, now: h.now)
        #expect(nextStartAt(h, q, wall: 5_000) == nil, "a start is free")
        #expect(h.dispatch() == ["op0", "op1"])
        #expect(h.states(group)["op2"] == .ready)
        let timers = h.takeTimers()
        #expect(timers.map(\.delay) == [10], "one timer for the queue, at its next free start")
        // Seconds since the epoch: the wall clock read with the rates' clock, plus what is left of the window.
        #expect(nextStartAt(h, q, wall: 5_000) == 5_010)
        h.now += 9.5
        #expect(h.dispatch() == [])
        #expect(h.takeTimers().isEmpty, "the timer armed already fires in time")
        #expect(nextStartAt(h, q, wall: 5_000) == 5_000.5)
        h.now += 0.5
        for timer in timers { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == ["op2", "op3"])
        #expect(h.takeTimers().map(\.delay) == [10])
        #expect(h.states(group)["op4"] == .ready)
        #expect(h.s.snapshot(q.rawValue).rateLimit == rate(2, per: 10))
    }

    @Test func aRetryIsAStart() throws {
        var h = Harness()
        let q = ratedQueue(&h, "api", rate: rate(2, per: 10))
        var g = GraphBuilder()
        g.add(spec("flaky", q, retries: 2, retryDelay: 0))
        let group = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["flaky"])
        h.fail("flaky")
        for timer in h.takeTimers() { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == ["flaky"], "the second attempt: two starts in the window")
        h.fail("flaky")
        for timer in h.takeTimers() { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == [], "a third start must wait for the first to leave the window")
        #expect(h.states(group)["flaky"] == .ready)
        let held = h.takeTimers()
        #expect(held.map(\.delay) == [8])
        h.now += 8
        for timer in held { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == ["flaky"])
        #expect(h.s.records(group)?.first?.attempts == 3)
    }

    @Test func aReloadKeepsTheWindowRaisingOrRemovingTheRateStartsAtOnce() throws {
        var h = Harness()
        let q = ratedQueue(&h, "api", rate: rate(1, per: 100))
        var g = GraphBuilder()
        for i in 0..<5 { g.add(spec("op\(i)", q)) }
        _ = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["op0"])
        _ = ratedQueue(&h, "api", rate: rate(1, per: 100))
        #expect(h.dispatch() == [], "the same rate again keeps the start already made")
        h.s.updateQueue(q, rateLimit: rate(3, per: 100))
        #expect(h.dispatch() == ["op1", "op2"], "three in the window, one of them made before the reload")
        h.s.updateQueue(q, suspended: true)
        h.s.updateQueue(q, suspended: false)
        #expect(h.s.snapshot(q.rawValue).rateLimit == rate(3, per: 100), "a change of something else keeps the rate")
        h.s.updateQueue(q, rateLimit: .some(nil))
        #expect(h.dispatch() == ["op3", "op4"])
        #expect(h.s.snapshot(q.rawValue).rateLimit == nil)
        #expect(h.s.ratedQueues == 0)
        _ = ratedQueue(&h, "api", rate: rate(1, per: 100))
        _ = ratedQueue(&h, "api", rate: nil)
        #expect(h.s.ratedQueues == 0, "adding a queue again sets every setting, the rate included")
    }

    @Test func theRateTheLimitAndPermitsAllHold() throws {
        var h = Harness()
        let q = ratedQueue(&h, "api", limit: 1, rate: rate(2, per: 10))
        var g = GraphBuilder()
        for i in 0..<4 { g.add(spec("op\(i)", q)) }
        let group = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["op0"], "the limit")
        h.succeed("op0")
        #expect(h.dispatch() == ["op1"])
        h.succeed("op1")
        #expect(h.dispatch() == [], "the rate")
        #expect(h.states(group)["op2"] == .ready)
        let held = h.takeTimers()
        h.s.setPermits(q, 0)
        h.now = 1_010
        for timer in held { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == [], "the permits")
        h.s.setPermits(q, 1)
        #expect(h.dispatch() == ["op2"])
        #expect(h.dispatch() == [])
    }

    @Test func aSuspendedQueueStartsNothingAndArmsNothing() throws {
        var h = Harness()
        let q = ratedQueue(&h, "api", suspended: true, rate: rate(1, per: 10))
        var g = GraphBuilder()
        for i in 0..<2 { g.add(spec("op\(i)", q)) }
        _ = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == [])
        #expect(h.takeTimers().isEmpty)
        h.s.updateQueue(q, suspended: false)
        #expect(h.dispatch() == ["op0"])
        #expect(h.takeTimers().map(\.delay) == [10])
    }

    @Test func aHeldOperationIsCancelledAtOnce() throws {
        var h = Harness()
        let q = ratedQueue(&h, "api", rate: rate(1, per: 10))
        var g = GraphBuilder()
        for i in 0..<2 { g.add(spec("op\(i)", q)) }
        let group = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["op0"])
        let held = h.takeTimers()
        h.s.cancel(NodeRef(group: group.slot, index: 1), now: h.now)
        #expect(h.states(group)["op1"] == .cancelled)
        h.succeed("op0")
        #expect(h.s.isFinished(group))
        h.now = 1_010
        for timer in held { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == [])
        #expect(h.s.snapshot(q.rawValue).pending == 0)
    }

    @Test func priorityStillOrdersWhatTheRateLetsGo() throws {
        var h = Harness()
        let q = ratedQueue(&h, "api", rate: rate(1, per: 10))
        var first = GraphBuilder()
        first.add(spec("low0", q, priority: .low))
        first.add(spec("low1", q, priority: .low))
        _ = try h.s.submit(first, now: h.now)
        #expect(h.dispatch() == ["low0"])
        var second = GraphBuilder()
        second.add(spec("urgent", q, priority: .veryHigh))
        _ = try h.s.submit(second, now: h.now)
        #expect(h.dispatch() == [])
        let held = h.takeTimers()
        h.now = 1_010
        for timer in held { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == ["urgent"])
    }

    @Test func aBarrierNeitherWaitsForTheRateNorUsesIt() throws {
        var h = Harness()
        let q = ratedQueue(&h, "api", rate: rate(1, per: 10))
        var before = GraphBuilder()
        before.add(spec("before", q))
        _ = try h.s.submit(before, now: h.now)
        _ = h.s.addBarrier(queue: q, name: "barrier", body: noop, now: h.now)
        var after = GraphBuilder()
        after.add(spec("after", q))
        _ = try h.s.submit(after, now: h.now)
        #expect(h.dispatch() == ["before"])
        h.succeed("before")
        #expect(h.dispatch() == ["barrier"], "the window is full, but a barrier is no work of the queue's")
        h.succeed("barrier")
        #expect(h.dispatch() == [], "what follows the barrier waits for the rate")
        let held = h.takeTimers()
        #expect(held.map(\.delay) == [8])
        h.now = 1_010
        for timer in held { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == ["after"])
    }

    @Test func aRateOnOneQueueDoesNotSlowAnother() throws {
        var h = Harness()
        let slow = ratedQueue(&h, "slow", rate: rate(1, per: 100))
        let fast = h.queue("fast", limit: 10)
        var g = GraphBuilder()
        for i in 0..<3 { g.add(spec("slow\(i)", slow)) }
        for i in 0..<3 { g.add(spec("fast\(i)", fast)) }
        _ = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["slow0", "fast0", "fast1", "fast2"])
    }
}

/// What the observer saw start: each attempt's start time (the scheduler's clock, read as it dispatched).
final class StartLog: Sendable {
    private let starts = Mutex<[(group: GroupID, operation: Int, time: Double)]>([])

    func observe(_ batch: [EngineEvent]) {
        starts.withLock { starts in
            for case .transition(let t) in batch where t.state == .executing { starts.append((t.group, t.operation, t.time)) }
        }
    }

    func times(of group: GroupID) -> [Double] { starts.withLock { $0.filter { $0.group == group }.map(\.time) } }
    func attempts(of group: GroupID, operation: Int) -> [Double] {
        starts.withLock { $0.filter { $0.group == group && $0.operation == operation }.map(\.time) }
    }
}

/// The engine in real time: small windows, real timers, real threads.
@Suite(.serialized, .onItsOwnExecutor) struct RateEngineTests {
    @Test func noWindowHoldsMoreThanTheRateAndTheRateIsReached() throws {
        let log = StartLog()
        let engine = Engine(observer: { log.observe($0) })
        let (n, s) = (5, 0.4)
        let q = engine.addQueue(named: "api", rateLimit: rate(n, per: s))
        var g = GraphBuilder()
        for i in 0..<30 { g.add(OperationSpec(name: "op\(i)", queue: q)) }
        let group = try engine.submit(g)
        engine.wait(group)
        engine.shutdown()
        let starts = log.times(of: group).sorted()
        try #require(starts.count == 30)
        let busiest = busiestWindow(starts, seconds: s)
        let span = starts[starts.count - 1] - starts[0]
        // The first N start at once, then N per window: (count − N) starts over the span is the rate reached.
        let achieved = Double(starts.count - n) / span
        print("rate \(n) per \(s) s: 30 starts over \(span) s, at most \(busiest) in any \(s) s, \(achieved) starts/s")
        #expect(busiest <= n)
        #expect(achieved >= 0.8 * Double(n) / s, "the limiter holds back more than the rate asks")
    }

    @Test func retriedAttemptsAreStarts() throws {
        let log = StartLog()
        let engine = Engine(observer: { log.observe($0) })
        let q = engine.addQueue(named: "api", rateLimit: rate(2, per: 0.5))
        let failures = Atomic<Int>(0)
        var g = GraphBuilder()
        g.add(OperationSpec(name: "flaky", queue: q, retries: 3, retryDelay: 0.01, body: .sync { _ in
            if failures.add(1, ordering: .relaxed).newValue <= 2 { throw OperationCancelled() }
            return nil
        }))
        let group = try engine.submit(g)
        engine.wait(group)
        engine.shutdown()
        #expect(engine.records(group)?.first?.state == .succeeded)
        let attempts = log.attempts(of: group, operation: 0)
        try #require(attempts.count == 3)
        print("retries at rate 2 per 0.5 s: attempts at +\(attempts[1] - attempts[0]) s, +\(attempts[2] - attempts[0]) s")
        #expect(attempts[1] - attempts[0] < 0.4, "the second attempt was free to start")
        #expect(attempts[2] - attempts[0] >= 0.5 - 0.001, "the third waited for the first to leave the window")
    }

    @Test func theQueueShowsItsNextFreeStartInEpochSeconds() throws {
        let engine = Engine()
        let q = engine.addQueue(named: "api", rateLimit: rate(2, per: 1))
        #expect(engine.queues().first?.nextStartAt == nil)
        #expect(engine.queues().first?.rateLimit == rate(2, per: 1))
        var g = GraphBuilder()
        for i in 0..<2 { g.add(OperationSpec(name: "op\(i)", queue: q)) }
        let before = Date().timeIntervalSince1970
        let group = try engine.submit(g)
        engine.wait(group)
        let next = try #require(engine.queues().first?.nextStartAt)
        #expect(next >= before + 1 - 0.01 && next <= Date().timeIntervalSince1970 + 1 + 0.01)
        Thread.sleep(forTimeInterval: max(0, next - Date().timeIntervalSince1970) + 0.02)
        #expect(engine.queues().first?.nextStartAt == nil)
        engine.shutdown()
    }

    @Test func reloadingTheRateStartsHeldOperationsAtOnce() throws {
        let engine = Engine()
        let q = engine.addQueue(named: "api", rateLimit: rate(1, per: 60))
        var g = GraphBuilder()
        for i in 0..<4 { g.add(OperationSpec(name: "op\(i)", queue: q)) }
        let group = try engine.submit(g)
        func succeeded() -> Int { engine.records(group)?.count { $0.state == .succeeded } ?? 0 }
        #expect(eventually { succeeded() == 1 })
        engine.updateQueue(q, rateLimit: rate(2, per: 60))
        #expect(eventually { succeeded() == 2 }, "one more start: the window kept the first")
        Thread.sleep(forTimeInterval: 0.05)
        #expect(succeeded() == 2)
        #expect(engine.records(group)?.last?.state == .ready)
        engine.addQueue(named: "api")
        #expect(eventually { engine.isFinished(group) }, "adding the queue again without a rate removed it")
        engine.shutdown()
    }

    @Test func aSerialRatedQueueKeepsBothLimitsAndAnotherQueueRunsFreely() throws {
        let log = StartLog()
        let engine = Engine(observer: { log.observe($0) })
        let (n, s) = (3, 0.3)
        let serial = engine.addQueue(named: "serial", maxConcurrentOperationCount: 1, rateLimit: rate(n, per: s))
        let free = engine.addQueue(named: "free", maxConcurrentOperationCount: 4)
        let running = Atomic<Int>(0)
        let mostRunning = Atomic<Int>(0)
        var slow = GraphBuilder()
        for i in 0..<9 {
            slow.add(OperationSpec(name: "s\(i)", queue: serial, body: .sync { _ in
                let now = running.add(1, ordering: .relaxed).newValue
                mostRunning.max(now, ordering: .relaxed)
                usleep(20_000)
                running.subtract(1, ordering: .relaxed)
                return nil
            }))
        }
        let slowGroup = try engine.submit(slow)
        var fast = GraphBuilder()
        for i in 0..<50 { fast.add(OperationSpec(name: "f\(i)", queue: free)) }
        let fastGroup = try engine.submit(fast)
        engine.wait(fastGroup)
        #expect(!engine.isFinished(slowGroup), "the free queue finished while the rated one was held")
        engine.wait(slowGroup)
        engine.shutdown()
        #expect(mostRunning.load(ordering: .relaxed) == 1)
        let starts = log.times(of: slowGroup)
        #expect(starts.count == 9)
        #expect(busiestWindow(starts, seconds: s) <= n)
    }

    @Test func heldWorkLeavesTheEngineIdle() throws {
        let engine = Engine()
        let q = engine.addQueue(named: "api", rateLimit: rate(1, per: 60))
        var g = GraphBuilder()
        for i in 0..<20 { g.add(OperationSpec(name: "op\(i)", queue: q)) }
        let group = try engine.submit(g)
        #expect(eventually { engine.records(group)?.first?.state == .succeeded })
        Thread.sleep(forTimeInterval: 0.05)
        let (cpu, fired) = (engine.threadsCPUTime, engine.firedTimers)
        Thread.sleep(forTimeInterval: 1)
        let used = engine.threadsCPUTime - cpu
        print("held for 1 s: the engine's threads used \(used) s of CPU, \(engine.firedTimers - fired) timers fired")
        #expect(used < 0.1)
        #expect(engine.firedTimers == fired, "no timer fired before the window frees a start")
        #expect(engine.records(group)?.dropFirst().allSatisfy { $0.state == .ready } == true)
        engine.cancel(group)
        #expect(engine.isFinished(group), "held operations are cancelled at once")
        #expect(engine.records(group)?.dropFirst().allSatisfy { $0.state == .cancelled } == true)
        // The meter reads the engine's threads: work on them shows.
        let busy = engine.addQueue(named: "busy")
        var work = GraphBuilder()
        work.add(OperationSpec(name: "spin", queue: busy, body: .sync { _ in spin(0.05); return nil }))
        let before = engine.threadsCPUTime
        engine.wait(try engine.submit(work))
        #expect(engine.threadsCPUTime - before >= 0.04)
        engine.shutdown()
    }
}

/// Polls `condition` for up to `seconds` (the test's own wait, not the engine's).
func eventually(within seconds: Double = 5, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        Thread.sleep(forTimeInterval: 0.005)
    }
    return condition()
}
