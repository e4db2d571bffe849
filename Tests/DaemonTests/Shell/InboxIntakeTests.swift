// InboxIntake alone: names tried once each in order, reported names at once, a busy one first once closed, memory
// bounded at scanBatch names, and the inbox read when due and not more often.

import Testing
@testable import Daemon
import TestTraits

@Suite(.onItsOwnExecutor) struct InboxIntakeTests {
    private func drain(_ intake: inout InboxIntake) -> [String] {
        var names: [String] = []
        while let name = intake.next() { names.append(name) }
        return names
    }

    @Test func aNameReadAndReportedIsTriedOnceInOrder() {
        var intake = InboxIntake()
        intake.read(["a.plist", "b.plist"], waiting: 2, now: 100, seconds: 0.001)
        intake.reported(["b.plist", "c.plist"], complete: true)
        #expect(drain(&intake) == ["a.plist", "b.plist", "c.plist"])
        #expect(!intake.hasMore)
    }

    @Test func aNameFoundBusyIsTriedFirstOnceReportedClosed() {
        var intake = InboxIntake()
        intake.read(["a.plist", "b.plist"], waiting: 2, now: 100, seconds: 0.001)
        #expect(intake.next() == "a.plist")
        intake.markBusy("a.plist")
        intake.reported(["a.plist"], complete: true)
        #expect(drain(&intake) == ["a.plist", "b.plist"])
    }

    @Test func reportsPastTheBatchAreLeftToTheNextRead() {
        var intake = InboxIntake()
        intake.read([], waiting: 0, now: 100, seconds: 0.001)
        intake.reported((0..<(InboxIntake.scanBatch + 10)).map { "\($0).plist" }, complete: true)
        #expect(intake.hasMore)
        #expect(drain(&intake).count == InboxIntake.scanBatch)
        #expect(intake.hasMore, "the rest waits in the inbox for the next read")
        #expect(intake.readDue(now: 100.1, takes: true), "an empty queue with names left is read again at once")
    }

    @Test func theInboxIsReadWhenDueAndNotMoreOften() {
        var intake = InboxIntake()
        #expect(intake.readDue(now: 0, takes: true), "at start, read whole")
        intake.read(["a.plist"], waiting: 1, now: 100, seconds: 0.5)
        #expect(!intake.readDue(now: 100.1, takes: true), "nothing reported: no read")
        intake.reported(["b.plist"], complete: true)
        #expect(!intake.readDue(now: 101, takes: true), "reported names are tried without a read")
        #expect(intake.readDue(now: 100 + InboxIntake.rescanInterval, takes: true), "but the folder is read within the interval")
        // With nothing to take, a read that took 0.5 s is made at most every 10 s (twenty times its time).
        #expect(!intake.readDue(now: 105, takes: false))
        #expect(intake.readDue(now: 110, takes: false))
        intake.reported([], complete: false)
        #expect(intake.readDue(now: 100.2, takes: true), "an overflow or the watcher's timer: read at once")
    }

    @Test func reportsWhileARoundWaitsJoinIt() {
        var reports = InboxReports()
        let first = reports.add(["a.plist"], complete: true)
        let second = reports.add(["b.plist"], complete: true)
        #expect(first && !second, "the first report posts a round, the next joins it")
        let round = reports.take()
        #expect(round.names == ["a.plist", "b.plist"] && round.complete)
        let third = reports.add(["c.plist"], complete: false)
        #expect(third, "after the round began, a new one")
        let whole = reports.take()
        #expect(whole.names.isEmpty && !whole.complete, "not all that arrived: the inbox is read whole")
        let flood = (0...InboxIntake.scanBatch).map { "\($0).plist" }
        _ = reports.add(flood, complete: true)
        let many = reports.take()
        #expect(many.names.isEmpty && !many.complete, "too many to hold: read whole")
    }
}

@Suite(.onItsOwnExecutor) struct MemoryTrimTests {
    @Test func trimsAtMostEveryIntervalOrAfterManyOperations() {
        var trim = MemoryTrim()
        var action = trim.idle(now: 100)
        #expect(action == .trim)
        trim.released(10)
        action = trim.idle(now: 101)
        #expect(action == .later(4), "idle sooner: once the interval is up")
        action = trim.idle(now: 102)
        #expect(action == .none, "one later at a time")
        trim.fired()
        trim.released(MemoryTrim.operations)
        action = trim.idle(now: 102.5)
        #expect(action == .trim, "after many operations, at once")
        action = trim.idle(now: 107.6)
        #expect(action == .trim)
    }
}
