// Tests of the worker governor: its decisions on their own, and the engine's workers under it (real threads).

import Dispatch
import Foundation
import Synchronization
import Testing
@testable import OperationEngine

@Suite struct GovernorTests {
    @Test func aWorkerShedsOnlyAfterAStreakWhileAnotherIsBusyAndAStretchWasMeasured() {
        var g = Governor(classes: 2)
        let shed1 = g.workerStep(1, time: 10, streak: 20, busy: 2)
        #expect(!shed1, "the first step only begins the stretch")
        let shed2 = g.workerStep(1, time: 10.000_1, streak: 20, busy: 2)
        #expect(!shed2, "a stretch shorter than shortestWindow")
        for i in 1...8 { _ = g.workerStep(1, time: 10.000_1 + Double(i) * 1e-6, streak: 0, busy: 2) }
        let shed3 = g.workerStep(1, time: 10.001, streak: g.streakToShed - 1, busy: 2)
        #expect(!shed3, "streak too short")
        let shed4 = g.workerStep(1, time: 10.001, streak: g.streakToShed, busy: 1)
        #expect(!shed4, "nobody else is busy")
        #expect(!g.isGoverned(0) && !g.isGoverned(1))
        let shed5 = g.workerStep(1, time: 10.001, streak: g.streakToShed, busy: 2)
        #expect(shed5)
        #expect(g.isGoverned(1) && !g.isGoverned(0) && g.sheds == 1)
        // 12 steps ended, 12 before the shed's over the millisecond since the stretch began (the first step, at 10).
        #expect(abs(g.classes[1].rateBefore - 12 / 0.001) < 1)
        let shed6 = g.workerStep(1, time: 10.002, streak: 50, busy: 2)
        #expect(!shed6, "a governed class does not shed again")
    }

    /// A class governed since `shedAt`, which ran at `rateBefore` (steps a second) before it shed.
    private func governed(rateBefore: Double, shedAt: Double = 5) -> Governor {
        var g = Governor(classes: 1)
        g.classes[0].governed = true
        g.classes[0].rateBefore = rateBefore
        (g.classes[0].markTime, g.classes[0].markSteps) = (shedAt, 0)
        return g
    }

    private func run(_ g: inout Governor, steps: Int, from: Double, to: Double) {
        for i in 0..<steps { _ = g.workerStep(0, time: from + (to - from) * Double(i + 1) / Double(steps), streak: 0, busy: 1) }
    }

    @Test func aGovernedClassStaysWhileClearlyFaster() {
        var g = governed(rateBefore: 1_000_000)
        run(&g, steps: 1_000, from: 5, to: 5.000_5)  // 2,000,000 a second
        let shed7 = g.check(0, now: 5.000_5, idle: false)
        #expect(!shed7)
        #expect(g.isGoverned(0) && g.classes[0].markSteps == 1_000 && g.classes[0].markTime == 5.000_5)
    }

    @Test func aGovernedClassIsReleasedWhenItsWorkerMadeNoStep() {
        var g = governed(rateBefore: 1_000_000)
        let shed8 = g.check(0, now: 5.000_5, idle: false)
        #expect(shed8)
        #expect(!g.isGoverned(0) && g.releases == 1)
        #expect(g.classes[0].noShedBefore == -.infinity, "a long operation is no reason not to shed again later")
    }

    @Test func aClassNotClearlyFasterIsReleasedAndWaitsLongerEachTime() {
        var g = governed(rateBefore: 1_000_000)
        run(&g, steps: 520, from: 5, to: 5.000_5)  // 1,040,000 a second: less than margin × before
        let shed9 = g.check(0, now: 5.000_5, idle: false)
        #expect(shed9)
        let first = g.classes[0].noShedBefore - 5.000_5
        #expect(first > 0)
        let shed10 = g.workerStep(0, time: 5.000_6, streak: 50, busy: 2)
        #expect(!shed10, "no shed while backing off")
        g.classes[0].governed = true
        (g.classes[0].markTime, g.classes[0].markSteps) = (6, g.classes[0].steps)
        run(&g, steps: 10, from: 6, to: 6.000_5)
        let shed11 = g.check(0, now: 6.000_5, idle: false)
        #expect(shed11)
        #expect(abs(g.classes[0].noShedBefore - 6.000_5 - 2 * first) < 1e-9, "the backoff doubles")
    }

    @Test func anIdleGovernedClassIsReleased() {
        var g = governed(rateBefore: 1)
        run(&g, steps: 1_000, from: 5, to: 5.000_5)
        let shed12 = g.check(0, now: 5.000_5, idle: true)
        #expect(shed12)
        #expect(!g.isGoverned(0) && g.classes[0].noShedBefore == -.infinity)
    }

    /// Workers that shed whenever another is busy (as they do when they keep finding the lock taken): the busy one
    /// runs what they leave, in order of submission, and all of it runs once.
    @Test func whatAShedWorkerLeavesIsRunInOrderByTheBusyOne() throws {
        let engine = Engine(processorCount: 4)
        defer { engine.shutdown() }
        engine.setGovernorStreakForTesting(0)
        let queue = engine.addQueue(named: "brief", maxConcurrentOperationCount: 4)
        let order = Mutex<[Int]>([])
        var graph = GraphBuilder()
        for i in 0..<20_000 {
            graph.add(OperationSpec(name: "", queue: queue, body: .sync { _ in
                order.withLock { $0.append(i) }
                return nil
            }), dependencies: [])
        }
        engine.wait(try engine.submit(consume graph))
        let ran = order.withLock { $0 }
        #expect(Set(ran).count == 20_000 && ran.count == 20_000)
        #expect(engine.governorCounts.sheds > 0)
        // Governed, one worker starts each operation after the one before it; the rest of the time up to four run at
        // once and neighbours may swap. So most, not all, follow their predecessor.
        let inOrder = zip(ran, ran.dropFirst()).filter { $0 + 1 == $1 }.count
        #expect(inOrder > 10_000)
    }

    /// A governed class's one busy worker runs an operation that waits for another of the same class: the check
    /// releases the class and wakes a second worker, which runs it. Without that, the first waits forever.
    @Test func anOperationThatWaitsForAnotherOfItsClassIsNotHeldUpByGovernance() throws {
        let engine = Engine(processorCount: 2)
        defer { engine.shutdown() }
        let queue = engine.addQueue(named: "pair", maxConcurrentOperationCount: 2, qualityOfService: .utility)
        engine.governForTesting(.utility)
        let signal = DispatchSemaphore(value: 0)
        let sawIt = Atomic<Bool>(false)
        var graph = GraphBuilder()
        graph.add(OperationSpec(name: "waits", queue: queue, body: .sync { _ in
            sawIt.store(signal.wait(timeout: .now() + 10) == .success, ordering: .relaxed)
            return nil
        }), dependencies: [])
        graph.add(OperationSpec(name: "signals", queue: queue, body: .sync { _ in signal.signal(); return nil }),
                  dependencies: [])
        engine.wait(try engine.submit(consume graph))
        let saw = sawIt.load(ordering: .relaxed)
        #expect(saw, "the second operation ran while the first waited")
        #expect(engine.governorCounts.releases >= 1)
    }
}
