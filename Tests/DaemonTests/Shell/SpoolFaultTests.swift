// SpoolFault alone: a fault begins once, waits with its publications in order, backs off, and ends only when a
// step works with nothing left waiting.

import Testing
@testable import Daemon
import TestTraits

@Suite(.onItsOwnExecutor) struct SpoolFaultTests {
    @Test func aFaultBeginsOnceAndEndsWithItsLength() {
        var fault = SpoolFault<String>()
        let none = fault.worked(now: 5)
        #expect(none == nil, "no fault: nothing ends")
        let began = fault.failed("claiming inbox/a.plist", now: 10)
        let beganAgain = fault.failed("publishing outbox/b", now: 11)
        #expect(began && !beganAgain, "a second failure only adds to the fault")
        #expect(fault.current?.what == "claiming inbox/a.plist")
        let ended = fault.worked(now: 13.5)
        #expect(ended?.what == "claiming inbox/a.plist" && ended?.seconds == 3.5)
        #expect(!fault.isOn)
        let later = fault.failed("committing", now: 20)
        #expect(later, "a later failure begins a new fault")
    }

    @Test func retriesBackOffOneAtATimeAndStartOverAfterAFault() {
        var fault = SpoolFault<String>()
        _ = fault.failed("x", now: 0)
        var delays: [Double] = []
        for _ in 0..<6 {
            guard let delay = fault.scheduleRetry() else { Issue.record("no retry scheduled"); return }
            let second = fault.scheduleRetry()
            #expect(second == nil, "one retry scheduled at a time")
            delays.append(delay)
            let due = fault.retryDue()
            #expect(due == .probe)
        }
        #expect(delays == [0.25, 0.5, 1, 2, 2, 2])
        _ = fault.worked(now: 1)
        let first = fault.scheduleRetry()
        #expect(first == 0.25, "a new fault backs off from the first delay again")
        let due = fault.retryDue()
        #expect(due == .none, "the fault ended before its retry: nothing to do")
    }

    @Test func stalledPublicationsWaitInOrderAndAreRepublishedFirst() {
        var fault = SpoolFault<String>()
        _ = fault.failed("publishing outbox/a", now: 0)
        fault.stall(["a"])
        fault.stall(["b", "c"])
        _ = fault.scheduleRetry()
        let due = fault.retryDue()
        #expect(due == .republish)
        let taken = fault.takeStalled()
        #expect(taken == ["a", "b", "c"])
        #expect(fault.stalled.isEmpty && fault.isOn, "the fault lasts until a step works")
        _ = fault.scheduleRetry()
        let next = fault.retryDue()
        #expect(next == .probe)
    }
}
