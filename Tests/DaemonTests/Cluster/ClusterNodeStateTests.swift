// ClusterNodeState, the pure part of a cluster node, without any I/O: lease deadlines, lost jobs and orphans,
// fences, cancels, suspensions, connection lines, the wake-up probe and cluster slots.

import Foundation
import Logging
import Synchronization
import Testing
import TestSupport
@testable import Daemon
import CShims
import OperationEngine
import PropertyList
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// The pure part: leases, deadlines, fences, cancels, suspensions, connection lines.
@Suite(.onItsOwnExecutor) struct ClusterNodeStateTests {
    @Test func deadlineCountsFromTheLastBeatSent() {
        var s = ClusterNodeState(leaseSeconds: 15)
        #expect(s.deadline == nil && !s.mayTakeLeases(now: 0))
        let news = s.connectionSucceeded()
        #expect(news)
        _ = s.beatSucceeded(sentAt: 100, held: [:])
        #expect(s.deadline == 114 && s.mayTakeLeases(now: 113.9) && !s.mayTakeLeases(now: 114))
        // A beat answered late but sent earlier does not move the deadline back.
        _ = s.beatSucceeded(sentAt: 90, held: [:])
        #expect(s.deadline == 114)
        #expect(ClusterNodeState(leaseSeconds: 2).margin == 0.4)
        s.hold("j", fence: 7)
        #expect(s.watchdogDeadline == 114)
        #expect(s.checkDeadline(now: 113.99).lost.isEmpty)
        #expect(s.checkDeadline(now: 114).lost == ["j"])
        #expect(s.held.isEmpty && s.watchdogDeadline == nil)
    }

    @Test func beatsFindLostJobsAndOrphans() {
        var s = ClusterNodeState(leaseSeconds: 15)
        s.hold("a", fence: 1)
        s.hold("b", fence: 2)
        s.hold("c", fence: 3)
        _ = s.beginCompleting(["c"])
        let result = s.beatSucceeded(sentAt: 1, held: ["a": 1, "b": 20, "z": 9])
        #expect(result.lost == ["b"], "another fence: lost; an end being recorded is left to its answer")
        #expect(result.orphans == ["b": 20, "z": 9])
        #expect(s.held.keys.sorted() == ["a", "c"])
        #expect(s.endCompleting(["c"], recorded: []) == ["c"])
        #expect(s.held.keys.sorted() == ["a"])
        _ = s.beginCompleting(["a"])
        #expect(s.endCompleting(["a"], recorded: nil).isEmpty && s.held["a"]?.completing == false, "no answer: the batch waits")
        #expect(s.checkDeadline(now: 1000).lost == ["a"])
    }

    /// A job that ran to its end here takes no job slot, and stays held (beats, the deadline) until its end's answer.
    @Test func jobsThatEndedHoldNoSlot() {
        var s = ClusterNodeState(leaseSeconds: 15)
        s.hold("a", fence: 1)
        s.hold("b", fence: 2)
        s.ending(["a", "unknown"])
        #expect(s.running == 1 && s.held.count == 2)
        #expect(s.beatSucceeded(sentAt: 1, held: ["b": 2]).lost == ["a"], "ended, not yet being recorded: the beat judges it")
        s.hold("c", fence: 3)
        s.ending(["c"])
        _ = s.beginCompleting(["c"])
        #expect(s.endCompleting(["c"], recorded: nil).isEmpty && s.running == 1, "no answer: still ended, still no slot")
        #expect(s.endCompleting(["c"], recorded: ["c"]).isEmpty && s.held.keys.sorted() == ["b"])
    }

    /// Beats ask about the held ids only while nothing may have given the node a job it does not know of; the first
    /// beat, the one after a failed connection, after a lease ran out or `mayHaveBeenGivenJobs`, and one a minute
    /// read every job the database gives it. A job held here and not asked about is not lost.
    @Test func beatsAskByIdUntilSomethingMayHaveGivenTheNodeAJob() {
        var s = ClusterNodeState(leaseSeconds: 15)
        s.hold("a", fence: 1)
        s.hold("b", fence: 2)
        var next = s.nextBeat(now: 10)
        #expect(next.held == nil, "the first beat is a full one")
        _ = s.beatSucceeded(sentAt: 10, held: ["a": 1, "b": 2], asked: next.held, covers: next.covers)
        next = s.nextBeat(now: 15)
        #expect(next.held == ["a", "b"])
        s.hold("c", fence: 3)
        let byIds = s.beatSucceeded(sentAt: 15, held: ["a": 1], asked: next.held, covers: next.covers)
        #expect(byIds.lost == ["b"] && s.held.keys.sorted() == ["a", "c"], "c was claimed after the beat was sent")
        #expect(s.nextBeat(now: 10 + ClusterNodeState.fullBeatSeconds).held == nil, "a full beat every minute")
        // An uncertainty while a full beat is in flight is not covered by it.
        next = s.nextBeat(now: 20)
        s.mayHaveBeenGivenJobs()
        #expect(s.nextBeat(now: 20).held == nil)
        _ = s.beatSucceeded(sentAt: 20, held: ["a": 1, "c": 3], asked: next.held, covers: next.covers)
        next = s.nextBeat(now: 21)
        #expect(next.held == nil)
        _ = s.beatSucceeded(sentAt: 21, held: ["a": 1, "c": 3], asked: next.held, covers: next.covers)
        #expect(s.nextBeat(now: 21.5).held == ["a", "c"])
        _ = s.connectionFailed()
        next = s.nextBeat(now: 22)
        #expect(next.held == nil, "after a failed connection")
        let full = s.beatSucceeded(sentAt: 22, held: ["a": 1, "c": 3, "z": 9], asked: next.held, covers: next.covers)
        #expect(full.orphans == ["z": 9])
        #expect(s.nextBeat(now: 23).held == ["a", "c"])
        #expect(s.checkDeadline(now: 1000).lost == ["a", "c"])
        #expect(s.nextBeat(now: 1000).held == nil, "after the lease ran out: what it forgot may still be its own there")
    }

    @Test func recordedBeforeARestartIsPublishedWithoutTheDatabase() {
        var s = ClusterNodeState(leaseSeconds: 15)
        s.hold("r", fence: 5, recorded: true)
        #expect(s.beatSucceeded(sentAt: 1, held: [:]).lost.isEmpty)
        #expect(s.checkDeadline(now: 1000).lost.isEmpty)
        #expect(s.alreadyRecorded(["r", "x"]) == ["r"])
    }

    @Test func cancelsPassedOnOncePerFence() {
        var s = ClusterNodeState(leaseSeconds: 15)
        s.hold("j", fence: 4)
        let requests: [(job: String, operation: String?, fence: Int64)] = [("j", nil, 4), ("j", "op", 4), ("j", nil, 3), ("k", nil, 1)]
        #expect(s.newCancels(requests).map { "\($0.job)/\($0.operation ?? "*")" } == ["j/*", "j/op"])
        #expect(s.newCancels(requests).isEmpty)
        s.forget("j")
        s.hold("j", fence: 8)
        #expect(s.newCancels([("j", nil, 8)]).count == 1, "a new claim of the job hears its cancels again")
    }

    @Test func suspensionsAndConnectionLinesOnChangesOnly() {
        var s = ClusterNodeState(leaseSeconds: 15)
        #expect(s.suspendedRead([]) == [])
        #expect(s.suspendedRead([]) == nil)
        #expect(s.suspendedRead(["io"]) == ["io"])
        let lines = [s.connectionFailed(), s.connectionFailed(), s.connectionSucceeded(), s.connectionSucceeded(), s.connectionFailed()]
        #expect(lines == [true, false, true, false, true])
    }

    /// The wake-up probe as pure state: a probe heard keeps wake-ups `arriving` and sets the next a minute later;
    /// one missed is tried again at once, two missed in a row say `notArriving` once; a probe heard later says
    /// `arriving` again. Another node's token, or a probe lost with a listener that reconnected, judges nothing.
    @Test func wakeupProbeSaysOnceWhenWakeupsStopAndWhenTheyCome() {
        var p = WakeupProbe()
        #expect(!p.due(now: 0), "nothing before the listener is up")
        p.listenerConnected(now: 10)
        #expect(p.due(now: 10))
        p.sent("t1", now: 10)
        #expect(!p.due(now: 10) && p.nextEvent() == 10 + WakeupProbe.wait)
        #expect(p.heard("another node's", now: 10.1) == nil)
        #expect(p.heard("t1", now: 10.2) == nil, "arriving was assumed: nothing to say")
        #expect(p.heardCount == 1 && p.nextEvent() == 10.2 + WakeupProbe.every)
        #expect(!p.due(now: 60) && p.due(now: 70.2))

        p.sent("t2", now: 71)
        #expect(p.check(now: 73) == nil, "not yet waited long enough")
        #expect(p.check(now: 74) == nil, "one miss: tried again at once")
        #expect(p.due(now: 74))
        p.sent("t3", now: 74)
        #expect(p.check(now: 77) == .notArriving)
        #expect(p.verdict == .notArriving && !p.due(now: 100) && p.due(now: 137))
        p.sent("t4", now: 137)
        #expect(p.check(now: 140) == nil, "said once")
        p.sent("t5", now: 140)
        #expect(p.heard("t5", now: 140.5) == .arriving)

        // A probe in flight when the listener dropped is not a miss.
        p.sent("t6", now: 300)
        p.listenerDisconnected()
        #expect(p.check(now: 400) == nil && !p.due(now: 400) && p.nextEvent() == nil)
        p.listenerConnected(now: 401)
        #expect(p.heard("t6", now: 401) == nil && p.due(now: 401))
        // A probe that could not be sent is not a miss either; another goes `wait` later.
        p.sent("t7", now: 401)
        p.notSent(now: 401)
        #expect(p.check(now: 410) == nil && p.verdict == .arriving && p.due(now: 401 + WakeupProbe.wait))
    }

    @Test func slotsDroppedAtTheDeadline() {
        var s = ClusterNodeState(leaseSeconds: 3)
        _ = s.connectionSucceeded()
        _ = s.beatSucceeded(sentAt: 10, held: [:])
        s.addSlot(.init(queue: "api", slot: 1, fence: 9))
        #expect(abs((s.watchdogDeadline ?? 0) - 12.4) < 1e-9)
        #expect(s.checkDeadline(now: 12.5).slots.count == 1)
        let removed = s.removeSlot(.init(queue: "api", slot: 1, fence: 9))
        #expect(!removed)
    }
}
