// Deterministic tests of the scheduling rules (SPEC §3.2, §3.4) on the Scheduler state machine:
// no threads, a clock moved by hand, timers fired by hand.

import Testing
@testable import OperationEngine

let noop = OperationBody.sync { _ in nil }
let asyncNoop = OperationBody.async { _ in }

struct Harness {
    var s = Scheduler(processorCount: 2)
    var now = 1_000.0
    var running: [String: Dispatch] = [:]

    init() { s.recordsEvents = true }

    mutating func queue(_ name: String, limit: Int = -1, qos: QualityOfService = .default, suspended: Bool = false) -> QueueID {
        s.addQueue(name: name, maxConcurrentOperationCount: limit, qualityOfService: qos, suspended: suspended)
    }

    /// Starts everything that may start; returns the names in dispatch order.
    @discardableResult
    mutating func dispatch() -> [String] {
        var names: [String] = []
        while let d = s.nextDispatch(now: now) {
            names.append(d.name)
            running[d.name] = d
        }
        return names
    }

    mutating func succeed(_ name: String, output: OperationOutput? = nil) {
        guard let d = running.removeValue(forKey: name) else { Issue.record("\(name) is not running"); return }
        now += 1
        s.finish(d.attempt, outcome: .success(output), now: now)
    }

    mutating func fail(_ name: String, _ message: String = "boom") {
        guard let d = running.removeValue(forKey: name) else { Issue.record("\(name) is not running"); return }
        now += 1
        s.finish(d.attempt, outcome: .failure(message), now: now)
    }

    mutating func takeTimers() -> [TimerRequest] {
        defer { s.timerRequests.removeAll() }
        return s.timerRequests
    }

    func states(_ group: GroupID) -> [String: OperationState] {
        Dictionary(uniqueKeysWithValues: (s.records(group) ?? []).map { ($0.name, $0.state) })
    }

    func transitions(of group: GroupID, operation: Int) -> [OperationState] {
        s.events.compactMap {
            if case .transition(let t) = $0, t.group == group, t.operation == operation { return t.state }
            return nil
        }
    }
}

func spec(_ name: String, _ queue: QueueID, qos: QualityOfService? = nil, priority: QueuePriority = .normal,
          timeout: Double? = nil, retries: Int = 0, retryDelay: Double = 1, runsAfterFailure: Bool = false,
          input: Int? = nil, body: OperationBody = noop) -> OperationSpec {
    OperationSpec(name: name, queue: queue, qualityOfService: qos, queuePriority: priority, timeout: timeout,
                  retries: retries, retryDelay: retryDelay, runsAfterFailure: runsAfterFailure, input: input, body: body)
}

@Suite struct SchedulerTests {
    /// Found by the fuzz campaign: operations cancelled while ready stay in the ready list (removed lazily);
    /// once their job is released, and its slot reused, the scheduler must skip them, not crash or run
    /// the new job's operation in their place.
    @Test func readyEntriesOfAReleasedJobAreSkipped() throws {
        var h = Harness()
        let q = h.queue("q", limit: 1, suspended: true)
        var first = GraphBuilder()
        for i in 0..<5 { first.add(spec("old\(i)", q), dependencies: []) }
        let old = try h.s.submit(first, now: h.now)
        h.s.cancel(group: old, now: h.now)
        #expect(h.s.isFinished(old))
        h.s.release(old)
        var second = GraphBuilder()
        second.add(spec("new0", q), dependencies: [])
        second.add(spec("new1", q), dependencies: [0])
        let new = try h.s.submit(second, now: h.now)
        h.s.updateQueue(q, suspended: false)
        #expect(h.dispatch() == ["new0"])
        h.succeed("new0")
        #expect(h.dispatch() == ["new1"])
        h.succeed("new1")
        #expect(h.states(new) == ["new0": .succeeded, "new1": .succeeded])
    }

    /// A cluster-wide limit (SPEC §8) reaches the engine as permits: nothing starts beyond them, whatever the
    /// queue's own limit; raising them starts work; the demand is executing plus ready within the own limit.
    @Test func outsidePermitsCapAQueueAndDemandFollowsReadyWork() throws {
        var h = Harness()
        let q = h.queue("api", limit: 3)
        h.s.setPermits(q, 0)
        var g = GraphBuilder()
        for i in 0..<5 { g.add(spec("op\(i)", q)) }
        _ = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == [])
        #expect(h.s.permitsWanted(q.rawValue) == 3)
        h.s.setPermits(q, 1)
        #expect(h.dispatch() == ["op0"])
        #expect(h.dispatch() == [])
        h.s.setPermits(q, 5)
        #expect(h.dispatch() == ["op1", "op2"])
        h.succeed("op0"); h.succeed("op1"); h.succeed("op2")
        #expect(h.s.permitsWanted(q.rawValue) == 2)
        h.s.setPermits(q, nil)
        #expect(h.dispatch() == ["op3", "op4"])
        h.s.updateQueue(q, suspended: true)
        #expect(h.s.permitsWanted(q.rawValue) == 2)
        h.succeed("op3"); h.succeed("op4")
        #expect(h.s.permitsWanted(q.rawValue) == 0)
    }

    /// An attempt that ends uses its outside permit up: the queue starts nothing on it until the holder grants it
    /// again (the holder decides whether a better waiter elsewhere gets the slot); a retried attempt too. The
    /// priority of the next ready operation is what the holder ranks its wait by.
    @Test func anEndedAttemptUsesItsPermitUp() throws {
        var h = Harness()
        let q = h.queue("api", limit: 2)
        h.s.setPermits(q, 2)
        var g = GraphBuilder()
        g.add(spec("a", q, priority: .low))
        g.add(spec("b", q, priority: .low, retries: 1, retryDelay: 0))
        g.add(spec("c", q, priority: .low))
        g.add(spec("d", q, priority: .veryHigh))
        _ = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["d", "a"])
        #expect(h.s.bestReadyPriority(q.rawValue) == .low)
        h.succeed("d")
        #expect(h.s.effectiveLimit(q.rawValue) == 1, "d's permit is used up")
        #expect(h.dispatch() == [], "nothing starts on a used-up permit")
        h.s.setPermits(q, 2)
        #expect(h.dispatch() == ["b"])
        h.fail("b")
        #expect(h.s.effectiveLimit(q.rawValue) == 1, "a retried attempt uses its permit up too")
        h.s.setPermits(q, 2)
        h.succeed("a")
        h.s.setPermits(q, 2)
        #expect(h.dispatch() == ["c"], "b waits for its retry timer")
        #expect(h.s.bestReadyPriority(q.rawValue) == nil)
    }

    @Test func dependenciesGateReadinessAcrossQueues() throws {
        var h = Harness()
        let a = h.queue("a"), b = h.queue("b")
        var g = GraphBuilder()
        g.add(spec("download", a))
        g.add(spec("filter", b), dependencies: [0])
        g.add(spec("write", a), dependencies: [1])
        let group = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["download"])
        h.succeed("download")
        #expect(h.dispatch() == ["filter"])
        h.succeed("filter")
        #expect(h.dispatch() == ["write"])
        h.succeed("write")
        #expect(h.s.isFinished(group))
        #expect(h.states(group).values.allSatisfy { $0 == .succeeded })
        for i in 0..<3 { #expect(h.transitions(of: group, operation: i) == [.pending, .ready, .executing, .succeeded]) }
    }

    @Test func queueLimitHoldsAndSerialQueueRunsOneAtATime() throws {
        var h = Harness()
        let q = h.queue("q", limit: 2)
        let serial = h.queue("serial", limit: 1)
        var g = GraphBuilder()
        for i in 0..<5 { g.add(spec("q\(i)", q)) }
        for i in 0..<3 { g.add(spec("s\(i)", serial)) }
        _ = try h.s.submit(g, now: h.now)
        #expect(Set(h.dispatch()) == ["q0", "q1", "s0"])
        #expect(h.dispatch().isEmpty)
        h.succeed("q0")
        #expect(h.dispatch() == ["q2"])
        h.succeed("s0")
        #expect(h.dispatch() == ["s1"])
        // -1 means one per processor (2 here).
        let wide = h.queue("wide")
        #expect(h.s.effectiveLimit(wide.rawValue) == 2)
    }

    @Test func priorityThenSubmissionOrder() throws {
        var h = Harness()
        let q = h.queue("q", limit: 1, suspended: true)
        var g = GraphBuilder()
        g.add(spec("low", q, priority: .low))
        g.add(spec("n1", q))
        g.add(spec("veryHigh", q, priority: .veryHigh))
        g.add(spec("n2", q))
        g.add(spec("high", q, priority: .high))
        _ = try h.s.submit(g, now: h.now)
        #expect(h.dispatch().isEmpty, "a suspended queue starts nothing")
        h.s.updateQueue(q, suspended: false)
        var order: [String] = []
        while true {
            let started = h.dispatch()
            guard let name = started.first else { break }
            #expect(started.count == 1)
            order.append(name)
            h.succeed(name)
        }
        #expect(order == ["veryHigh", "high", "n1", "n2", "low"])
    }

    @Test func fifoIsBySubmissionEvenWhenReadinessComesOutOfOrder() throws {
        var h = Harness()
        let gate = h.queue("gate", limit: 2)
        let q = h.queue("q", limit: 1, suspended: true)
        var g = GraphBuilder()
        g.add(spec("gateA", gate))
        g.add(spec("gateB", gate))
        g.add(spec("first", q), dependencies: [0])
        g.add(spec("second", q), dependencies: [1])
        g.add(spec("third", q))
        _ = try h.s.submit(g, now: h.now)
        h.dispatch()
        h.succeed("gateB") // "second" becomes ready before "first"
        h.succeed("gateA")
        h.s.updateQueue(q, suspended: false)
        var order: [String] = []
        while let name = h.dispatch().first { order.append(name); h.succeed(name) }
        #expect(order == ["first", "second", "third"])
    }

    @Test func higherEffectiveQoSQueueGoesFirst() throws {
        var h = Harness()
        let background = h.queue("bg", qos: .background)
        let interactive = h.queue("ui", qos: .userInteractive)
        let utility = h.queue("util", qos: .utility)
        var g = GraphBuilder()
        g.add(spec("bg", background))
        g.add(spec("util", utility))
        g.add(spec("ui", interactive))
        g.add(spec("bgRaised", background, qos: .userInitiated))
        _ = try h.s.submit(g, now: h.now)
        let first = h.s.nextDispatch(now: h.now)
        #expect(first?.name == "ui")
        #expect(first?.qualityOfService == .userInteractive)
        // bg queue's head is "bg" (background); its later op's QoS does not jump the queue's FIFO.
        #expect(h.s.nextDispatch(now: h.now)?.name == "util")
        #expect(h.s.nextDispatch(now: h.now)?.name == "bg")
        #expect(h.s.nextDispatch(now: h.now)?.qualityOfService == .userInitiated)
    }

    @Test func effectiveQoSOperationThenGroupThenQueueAndRaiseWithoutInversion() throws {
        var h = Harness()
        let q = h.queue("q", qos: .utility)
        var g = GraphBuilder()
        g.add(spec("own", q, qos: .background))
        g.add(spec("group", q))
        g.add(spec("lowDep", q, qos: .background))
        g.add(spec("urgent", q, qos: .userInteractive), dependencies: [2])
        let group = try h.s.submit(g, qualityOfService: .userInitiated, now: h.now)
        func ref(_ i: Int32) -> NodeRef { NodeRef(group: group.slot, index: i) }
        #expect(h.s.effectiveQoS(ref(0)) == .background)
        #expect(h.s.effectiveQoS(ref(1)) == .userInitiated)
        #expect(h.s.effectiveQoS(ref(2)) == .userInteractive, "raised by the operation waiting for it")
        let records = try #require(h.s.records(group))
        #expect(records[2].qualityOfService == .background, "results report the QoS asked for, not the raise")
        // Without a group QoS, the queue's applies and follows the queue's changes.
        var g2 = GraphBuilder()
        g2.add(spec("plain", q))
        let group2 = try h.s.submit(g2, now: h.now)
        #expect(h.s.effectiveQoS(NodeRef(group: group2.slot, index: 0)) == .utility)
        h.s.updateQueue(q, qualityOfService: .userInitiated)
        #expect(h.s.effectiveQoS(NodeRef(group: group2.slot, index: 0)) == .userInitiated)
    }

    @Test func transitiveRaiseReachesTheWholeChain() throws {
        var h = Harness()
        let q = h.queue("q", qos: .background)
        var g = GraphBuilder()
        g.add(spec("a", q))
        g.add(spec("b", q), dependencies: [0])
        g.add(spec("c", q), dependencies: [1])
        g.add(spec("top", q, qos: .userInitiated), dependencies: [2])
        let group = try h.s.submit(g, now: h.now)
        for i in 0..<3 { #expect(h.s.effectiveQoS(NodeRef(group: group.slot, index: Int32(i))) == .userInitiated) }
    }

    @Test func failureCancelsDependentsUnlessRunsAfterFailure() throws {
        var h = Harness()
        let q = h.queue("q")
        var g = GraphBuilder()
        g.add(spec("bad", q))
        g.add(spec("dependent", q), dependencies: [0])
        g.add(spec("grandchild", q), dependencies: [1])
        g.add(spec("cleanup", q, runsAfterFailure: true), dependencies: [0, 1])
        let group = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["bad"])
        h.fail("bad", "no such file")
        let records = try #require(h.s.records(group))
        #expect(records[0].state == .failed)
        #expect(records[0].error == "no such file")
        #expect(records[1].state == .cancelled)
        #expect(records[1].error == "dependency 'bad' failed")
        #expect(records[2].error == "dependency 'dependent' was cancelled")
        #expect(records[1].attempts == 0)
        #expect(h.dispatch() == ["cleanup"], "runsAfterFailure runs once all dependencies finished")
        h.succeed("cleanup")
        #expect(h.s.isFinished(group))
    }

    @Test func cancellingPendingExecutingAndAsyncOperations() throws {
        var h = Harness()
        let q = h.queue("q", limit: 2)
        var g = GraphBuilder()
        g.add(spec("sync", q))
        g.add(spec("async", q, body: asyncNoop))
        g.add(spec("waiting", q))
        let group = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["sync", "async"])
        let asyncDispatch = try #require(h.running["async"])
        let syncDispatch = try #require(h.running["sync"])
        final class Flag: @unchecked Sendable { var value = false }
        let aborted = Flag()
        #expect(h.s.setCancelHandler(asyncDispatch.attempt) { aborted.value = true } == nil)
        h.s.cancel(group: group, now: h.now)
        #expect(h.s.isCancelled(syncDispatch.attempt))
        #expect(h.states(group)["async"] == .cancelled, "an asynchronous operation ends at once")
        #expect(h.s.cancelHandlersToRun.count == 1)
        h.s.cancelHandlersToRun.forEach { $0() }
        #expect(aborted.value)
        #expect(h.states(group)["waiting"] == .cancelled)
        #expect(h.states(group)["sync"] == .executing, "a synchronous one is told, and ends when it returns")
        #expect(!h.s.isFinished(group))
        h.succeed("sync")
        #expect(h.states(group)["sync"] == .cancelled)
        #expect(h.s.isFinished(group))
        #expect(h.dispatch().isEmpty, "nothing cancelled ever starts")
        // A late completion of the cancelled asynchronous operation changes nothing.
        h.s.finish(asyncDispatch.attempt, outcome: .success(nil), now: h.now)
        #expect(h.states(group)["async"] == .cancelled)
    }

    @Test func cancellingOneOperationCancelsItsDependentsOnly() throws {
        var h = Harness()
        let q = h.queue("q")
        var g = GraphBuilder()
        g.add(spec("a", q))
        g.add(spec("b", q), dependencies: [0])
        g.add(spec("c", q))
        let group = try h.s.submit(g, now: h.now)
        h.s.cancel(NodeRef(group: group.slot, index: 0), now: h.now)
        #expect(h.states(group) == ["a": .cancelled, "b": .cancelled, "c": .ready])
    }

    @Test func retriesWithDoublingDelayThenFailure() throws {
        var h = Harness()
        let q = h.queue("q")
        var g = GraphBuilder()
        g.add(spec("flaky", q, retries: 2, retryDelay: 0.5))
        let group = try h.s.submit(g, now: h.now)
        var delays: [Double] = []
        for attempt in 1...3 {
            #expect(h.dispatch() == ["flaky"])
            #expect(h.running["flaky"]?.attempt.number == attempt)
            h.fail("flaky", "attempt \(attempt)")
            for timer in h.takeTimers() {
                delays.append(timer.delay)
                h.s.fire(timer.kind, now: h.now)
            }
        }
        #expect(delays == [0.5, 1.0])
        let record = try #require(h.s.records(group)?.first)
        #expect(record.state == .failed)
        #expect(record.attempts == 3)
        #expect(record.error == "attempt 3")
        #expect(h.transitions(of: group, operation: 0) == [.pending, .ready, .executing, .retrying, .ready, .executing, .retrying, .ready,
                                                           .executing, .failed])
    }

    @Test func attemptTimeoutFailsTheAttemptAndRetryRecovers() throws {
        var h = Harness()
        let q = h.queue("q")
        var g = GraphBuilder()
        g.add(spec("slow", q, timeout: 2, retries: 1, retryDelay: 0))
        g.add(spec("slowAsync", q, timeout: 3, body: asyncNoop))
        let group = try h.s.submit(g, now: h.now)
        h.dispatch()
        let timers = h.takeTimers()
        #expect(timers.map(\.delay).sorted() == [2, 3])
        for timer in timers { h.s.fire(timer.kind, now: h.now) }
        #expect(h.states(group)["slowAsync"] == .failed)
        #expect(h.s.records(group)?[1].error == "timed out after 3 s")
        let slow = try #require(h.running["slow"])
        #expect(h.s.isCancelled(slow.attempt), "the body is told to stop")
        h.succeed("slow") // returned late: still a timeout
        #expect(h.states(group)["slow"] == .retrying)
        for timer in h.takeTimers() { h.s.fire(timer.kind, now: h.now) }
        #expect(h.dispatch() == ["slow"])
        h.succeed("slow")
        #expect(h.states(group)["slow"] == .succeeded)
        #expect(h.s.records(group)?[0].attempts == 2)
    }

    @Test func groupDeadlineCancelsTheRest() throws {
        var h = Harness()
        let q = h.queue("q", limit: 1)
        var g = GraphBuilder()
        g.add(spec("a", q))
        g.add(spec("b", q))
        let group = try h.s.submit(g, deadline: 10, now: h.now)
        h.dispatch()
        h.succeed("a")
        h.dispatch()
        let deadline = try #require(h.takeTimers().first)
        #expect(deadline.delay == 10)
        h.s.fire(deadline.kind, now: h.now)
        h.succeed("b")
        #expect(h.states(group) == ["a": .succeeded, "b": .cancelled])
        #expect(h.s.records(group)?[1].error == "the job's deadline passed")
    }

    @Test func cyclesAndUnknownDependenciesAreRefusedNamingTheOperations() {
        var h = Harness()
        let q = h.queue("q")
        var g = GraphBuilder()
        g.add(spec("a", q), dependencies: [2])
        g.add(spec("b", q), dependencies: [0])
        g.add(spec("c", q), dependencies: [1])
        g.add(spec("free", q))
        g.add(spec("lost", q), dependencies: [99])
        do {
            _ = try h.s.submit(g, now: h.now)
            Issue.record("submission should fail")
        } catch {
            #expect(error.problems.first == "operation 'lost' depends on unknown operation #99")
            #expect(error.problems.count == 2, "the cycle is reported too: every problem, not the first")
        }
        var cyclic = GraphBuilder()
        cyclic.add(spec("a", q), dependencies: [2])
        cyclic.add(spec("b", q), dependencies: [0])
        cyclic.add(spec("c", q), dependencies: [1])
        cyclic.add(spec("after", q), dependencies: [2])
        cyclic.add(spec("self", q), dependencies: [4])
        do {
            _ = try h.s.submit(cyclic, now: h.now)
            Issue.record("submission should fail")
        } catch {
            #expect(error.problems.contains("cycle: self → self"))
            let cycle = error.problems.first { $0.hasPrefix("cycle: a") || $0.hasPrefix("cycle: b") || $0.hasPrefix("cycle: c") }
            #expect(["cycle: a → b → c → a", "cycle: b → c → a → b", "cycle: c → a → b → c"].contains(cycle ?? ""))
        }
        #expect(h.s.groups.count == 1, "nothing was kept of refused graphs")
    }

    @Test func barrierWaitsForEarlierAndHoldsLaterOperations() throws {
        var h = Harness()
        let q = h.queue("q", limit: 4)
        var g = GraphBuilder()
        g.add(spec("before1", q))
        g.add(spec("before2", q))
        let group = try h.s.submit(g, now: h.now)
        _ = h.s.addBarrier(queue: q, name: "barrier", body: noop, now: h.now)
        var later = GraphBuilder()
        later.add(spec("after", q))
        let group2 = try h.s.submit(later, now: h.now)
        #expect(Set(h.dispatch()) == ["before1", "before2"])
        h.succeed("before1")
        #expect(h.dispatch().isEmpty)
        h.fail("before2")
        #expect(h.dispatch() == ["barrier"], "a barrier runs however the earlier operations ended")
        h.succeed("barrier")
        #expect(h.dispatch() == ["after"])
        h.succeed("after")
        #expect(h.s.isFinished(group) && h.s.isFinished(group2))
    }

    @Test func twoBarriersInARow() throws {
        var h = Harness()
        let q = h.queue("q")
        _ = h.s.addBarrier(queue: q, name: "b1", body: noop, now: h.now)
        _ = h.s.addBarrier(queue: q, name: "b2", body: noop, now: h.now)
        var g = GraphBuilder()
        g.add(spec("x", q))
        _ = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["b1"])
        h.succeed("b1")
        #expect(h.dispatch() == ["b2"])
        h.succeed("b2")
        #expect(h.dispatch() == ["x"])
    }

    @Test func atEqualQoSTheOperationSubmittedFirstStartsFirstWhateverItsQueue() throws {
        var h = Harness()
        let filters = h.queue("filters")
        let io = h.queue("io")
        var g = GraphBuilder()
        g.add(spec("write-1", io))
        g.add(spec("sepia-2", filters))
        g.add(spec("write-2", io))
        _ = try h.s.submit(g, now: h.now)
        // dispatch() lists the operations in the order they were chosen.
        #expect(h.dispatch() == ["write-1", "sepia-2", "write-2"], "not the earlier-declared queue first")
    }

    @Test func outputsNotKeptAreDroppedOnceEveryDependentHasEnded() throws {
        var h = Harness()
        let q = h.queue("q", limit: 1)
        var g = GraphBuilder()
        g.add(spec("image", q))
        g.add(spec("a", q), dependencies: [0])
        g.add(spec("b", q), dependencies: [0])
        g.add(spec("leaf", q))
        let group = try h.s.submit(g, keepOutputs: false, now: h.now)
        let image = NodeRef(group: group.slot, index: 0)
        #expect(h.dispatch() == ["image"])
        h.succeed("image", output: "pixels")
        #expect(h.s.output(image) as? String == "pixels")
        #expect(h.dispatch() == ["a"])
        #expect(h.running["a"]?.input as? String == "pixels")
        h.fail("a")
        #expect(h.dispatch() == ["b"], "a retry or a second reader still needs it")
        #expect(h.s.output(image) as? String == "pixels")
        #expect(h.running["b"]?.input as? String == "pixels")
        h.succeed("b")
        #expect(h.s.output(image) == nil, "dropped once every dependent ended")
        #expect(h.dispatch() == ["leaf"])
        h.succeed("leaf", output: "unread")
        #expect(h.s.output(NodeRef(group: group.slot, index: 3)) == nil, "an output nobody reads is not kept")
    }

    @Test func outputsFlowToInputsAndGroupsGrowAtRunTime() throws {
        var h = Harness()
        let q = h.queue("q")
        var g = GraphBuilder()
        g.add(spec("list", q))
        g.add(spec("other", q))
        let group = try h.s.submit(g, now: h.now)
        h.dispatch()
        h.succeed("other", output: "other-output")
        var more = GraphBuilder(base: 2)
        more.add(spec("child", q), dependencies: [0, 1])
        more.add(spec("pick", q, input: 0), dependencies: [0, 1])
        try h.s.extend(group, with: more, now: h.now)
        #expect(h.dispatch().isEmpty)
        h.succeed("list", output: "list-output")
        #expect(Set(h.dispatch()) == ["child", "pick"])
        #expect(h.running["child"]?.input as? String == "list-output", "first dependency with an output, in order")
        #expect(h.running["pick"]?.input as? String == "list-output")
        h.succeed("child")
        h.succeed("pick")
        #expect(h.s.isFinished(group))
        #expect(throws: SubmissionError.self) { try h.s.extend(group, with: GraphBuilder(base: 4), now: h.now) }
    }

    @Test func limitChangesApplyToRunningWork() throws {
        var h = Harness()
        let q = h.queue("q", limit: 1)
        var g = GraphBuilder()
        for i in 0..<4 { g.add(spec("op\(i)", q)) }
        _ = try h.s.submit(g, now: h.now)
        #expect(h.dispatch() == ["op0"])
        h.s.updateQueue(q, maxConcurrentOperationCount: 3)
        #expect(h.dispatch() == ["op1", "op2"])
        h.s.updateQueue(q, maxConcurrentOperationCount: 1)
        h.succeed("op0")
        #expect(h.dispatch().isEmpty, "still two executing over a limit of one")
        h.succeed("op1")
        h.succeed("op2")
        #expect(h.dispatch() == ["op3"])
    }

    @Test func releasedGroupsAreForgottenAndTheirSlotReused() throws {
        var h = Harness()
        let q = h.queue("q")
        var g = GraphBuilder()
        g.add(spec("a", q))
        let group = try h.s.submit(g, now: h.now)
        h.dispatch()
        h.succeed("a")
        h.s.release(group)
        #expect(h.s.records(group) == nil)
        var g2 = GraphBuilder()
        g2.add(spec("b", q))
        let group2 = try h.s.submit(g2, now: h.now)
        #expect(group2.slot == group.slot && group2 != group)
    }

    @Test func aReadyListKeepsSubmissionOrderAndLetsABurstGo() {
        var list = ReadyList()
        for i in 0..<10_000 { list.push(ReadyEntry(seq: UInt64(2 * i), ref: NodeRef(group: 1, index: Int32(i)))) }
        list.push(ReadyEntry(seq: 1, ref: NodeRef(group: 1, index: 10_000)))
        var order: [UInt64] = []
        while let entry = list.pop() { order.append(entry.seq) }
        #expect(order.count == 10_001)
        #expect(order == order.sorted(), "late entries come out in submission order")
        #expect(list.highWater == 0, "emptied after a burst of 10,001: its storage is let go")
        list.push(ReadyEntry(seq: 1, ref: NodeRef(group: 1, index: 0)))
        list.pop()
        #expect(list.highWater == 1, "a small list keeps its storage")
    }
}
