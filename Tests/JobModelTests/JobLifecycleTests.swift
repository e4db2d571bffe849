// The job lifecycle (JobLifecycle.swift) as a pure state machine: each event's own result, no I/O.
// Groups are plain integers here (the machine is generic over the engine's group id).

import Testing
@testable import JobModel

private typealias Machine = JobLifecycle<Int>

@Suite struct JobLifecycleTests {
    private func machine(jobs: Int = 4, operations: Int = 100) -> Machine {
        Machine(maxActiveJobs: jobs, maxActiveOperations: operations)
    }

    /// Received from the inbox, planned and submitted as group `group`.
    private func running(_ m: inout Machine, _ job: String, operations: Int = 3, group: Int) {
        _ = m.received(job: job, .inbox(manifest: job + ".plist"))
        _ = m.planned(job: job, operations: operations, recovered: 0)
        _ = m.submitted(job: job, group: group)
    }

    @Test func aJobGoesFromReceivedToPublished() {
        var m = machine()
        #expect(m.received(job: "a", .inbox(manifest: "a.plist")) == .entered(announce: .received(job: "a", manifest: "a.plist")))
        #expect(m.phase(of: "a") == .received)
        #expect(m.activeOperations == 0, "operations count once the plan is read")
        #expect(
            m.planned(job: "a", operations: 3, recovered: 1) == .submit(announce: .accepted(job: "a", operations: 3)))
        #expect(m.phase(of: "a") == .accepted)
        #expect(m.activeOperations == 3)
        #expect(m.submitted(job: "a", group: 7) == .running(group: 7, cancels: []))
        #expect(m.phase(of: "a") == .running)
        #expect(m.job(of: 7) == "a")
        m.operationEnded(group: 7)
        #expect(m.progress("a")?.operations == 3)
        #expect(m.progress("a")?.ended == 2, "one ended here, one before the restart")
        #expect(m.groupFinished(group: 7, status: .failed, error: "b: boom")
                    == .publish(job: "a", status: .failed, error: "b: boom"))
        #expect(m.phase(of: "a") == .finishing)
        #expect(m.activeOperations == 3, "counted until published")
        #expect(m.published(job: "a") == .left(release: 7))
        #expect(m.phase(of: "a") == nil)
        #expect(m.job(of: 7) == nil)
        #expect(m.activeOperations == 0)
        #expect(m.isEmpty)
    }

    @Test func resumedJobsAreNotLoggedAsReceivedAndClaimedOnesNameTheirNode() {
        var m = machine()
        #expect(m.received(job: "r", .resumed) == .entered(announce: nil))
        #expect(m.received(job: "c", .claimed(fromNode: "n2")) == .entered(announce: .claimed(job: "c", fromNode: "n2")))
        #expect(m.received(job: "c", .claimed(fromNode: nil)) == .ignore, "a job already in the table is not received twice")
        #expect(m.count == 2)
    }

    @Test func aRejectedJobIsPublishedWithItsProblems() {
        var m = machine()
        _ = m.received(job: "bad", .inbox(manifest: "bad.plist"))
        #expect(m.rejected(job: "bad", problems: ["x", "y"], error: "x\ny")
                    == .publish(announce: .rejected(job: "bad", problems: ["x", "y"], error: "x\ny"), error: "x\ny"))
        #expect(m.phase(of: "bad") == .rejected)
        #expect(m.cancel(job: "bad", operation: nil, knownOperation: true) == .alreadyEnded)
        #expect(m.groupFinished(group: 1, status: .succeeded, error: nil) == .ignore, "no group: nothing to finish")
        #expect(m.published(job: "bad") == .left(release: nil), "no group to release")
        #expect(m.isEmpty)
    }

    @Test func aRefusedSubmissionRejectsAndKeepsCountingUntilPublished() {
        var m = machine()
        _ = m.received(job: "a", .resumed)
        _ = m.planned(job: "a", operations: 5, recovered: 0)
        _ = m.cancel(job: "a", operation: nil, knownOperation: true)
        #expect(m.rejected(job: "a", problems: ["cycle"], error: "cycle!")
                    == .publish(announce: .rejected(job: "a", problems: ["cycle"], error: "cycle!"), error: "cycle!"))
        #expect(m.activeOperations == 5)
        _ = m.published(job: "a")
        #expect(m.activeOperations == 0)
    }

    @Test func cancelsBeforeTheGroupExistAreAppliedWhenItIsSubmitted() {
        var m = machine()
        _ = m.received(job: "a", .inbox(manifest: "a.plist"))
        // Before the plan is read, any operation name is taken (checked once the group exists).
        #expect(m.cancel(job: "a", operation: "zz", knownOperation: false) == .kept)
        _ = m.planned(job: "a", operations: 2, recovered: 0)
        // After, an unknown operation is refused at once.
        #expect(m.cancel(job: "a", operation: "nope", knownOperation: false) == .unknownOperation)
        #expect(m.cancel(job: "a", operation: "b", knownOperation: true) == .kept)
        #expect(m.cancel(job: "a", operation: nil, knownOperation: true) == .kept)
        #expect(m.submitted(job: "a", group: 3) == .running(group: 3, cancels: ["zz", "b", nil]))
        #expect(m.groupFinished(group: 3, status: .cancelled, error: nil) == .publish(job: "a", status: .cancelled, error: nil))
    }

    @Test func cancelsBeforeReceiptAreKeptAndAppliedWhenTheJobIsReceived() {
        var m = machine()
        // Claimed, its manifest still being read: not in the table yet.
        var kept = m.keepCancelBeforeReceipt(job: "a", operation: "zz")
        #expect(kept)
        kept = m.keepCancelBeforeReceipt(job: "a", operation: nil)
        #expect(kept)
        _ = m.received(job: "a", .inbox(manifest: "a.plist"))
        kept = m.keepCancelBeforeReceipt(job: "a", operation: "b")
        #expect(!kept, "a job in the table takes its cancels as they come")
        _ = m.planned(job: "a", operations: 2, recovered: 0)
        #expect(m.submitted(job: "a", group: 4) == .running(group: 4, cancels: ["zz", nil]))
        // One that came and went between two looks: what was kept for it is dropped, once.
        kept = m.keepCancelBeforeReceipt(job: "gone", operation: nil)
        var dropped = m.dropCancelsBeforeReceipt(job: "gone")
        #expect(kept && dropped)
        dropped = m.dropCancelsBeforeReceipt(job: "gone")
        #expect(!dropped)
    }

    @Test func cancelsAfterTheGroupExistGoToTheEngine() {
        var m = machine()
        running(&m, "a", group: 9)
        #expect(m.cancel(job: "a", operation: nil, knownOperation: true) == .cancelGroup(9))
        #expect(m.cancel(job: "a", operation: "b", knownOperation: true)
                    == .cancelOperation(job: "a", group: 9, operation: "b"))
        #expect(m.cancel(job: "a", operation: "nope", knownOperation: false) == .unknownOperation)
        _ = m.groupFinished(group: 9, status: .cancelled, error: nil)
        // Finishing: the engine answers for the operation; the whole job's cancel is harmless.
        #expect(m.cancel(job: "a", operation: nil, knownOperation: true) == .cancelGroup(9))
    }

    @Test func aJobNotInTheTableIsTheStoresToAnswer() {
        var m = machine()
        #expect(m.cancel(job: "elsewhere", operation: nil, knownOperation: false) == .notHere)
        running(&m, "a", group: 1)
        _ = m.groupFinished(group: 1, status: .succeeded, error: nil)
        _ = m.published(job: "a")
        #expect(m.cancel(job: "a", operation: nil, knownOperation: false) == .notHere, "published: the outbox answers")
    }

    @Test func aJobLostWhileRunningIsStoppedAndDiscardedOnceItsGroupEnds() {
        var m = machine()
        running(&m, "a", operations: 4, group: 5)
        #expect(m.lost(job: "a", reason: "lease ran out") == .cancelFirst(announce: .lost(job: "a", reason: "lease ran out"), group: 5))
        #expect(m.phase(of: "a") == nil)
        #expect(m.activeOperations == 0, "its operations no longer count")
        m.operationEnded(group: 5)
        #expect(m.cancel(job: "a", operation: nil, knownOperation: true) == .notHere)
        // Its group ends (cancelled): released, folder discarded, nothing published.
        #expect(m.groupFinished(group: 5, status: .cancelled, error: nil) == .lostEnded(job: "a", release: 5, .discard))
        #expect(m.groupFinished(group: 5, status: .cancelled, error: nil) == .ignore, "once")
        #expect(m.published(job: "a") == .ignore, "a publication that was queued does not bring it back")
        #expect(m.lost(job: "a", reason: "again") == .ignore, "lost twice: logged once")
    }

    /// A job the store has no record of any more (its database restored from an older backup) is stopped as a lost
    /// one is, and its folder then given back to the store to be submitted again instead of removed.
    @Test func aJobTheStoreForgotIsStoppedThenSubmittedAgain() {
        var m = machine()
        running(&m, "a", operations: 3, group: 7)
        #expect(
            m.lost(job: "a", reason: "no row", resubmit: true) == .cancelFirst(announce: .lost(job: "a", reason: "no row"), group: 7))
        #expect(m.activeOperations == 0)
        #expect(m.groupFinished(group: 7, status: .cancelled, error: nil) == .lostEnded(job: "a", release: 7, .resubmit))
        #expect(m.isEmpty)
        // Not yet running: at once.
        _ = m.received(job: "b", .claimed(fromNode: nil))
        _ = m.planned(job: "b", operations: 1, recovered: 0)
        #expect(m.lost(job: "b", reason: "no row", resubmit: true)
                    == .endNow(announce: .lost(job: "b", reason: "no row"), release: nil, .resubmit))
    }

    @Test func aJobLostWhileFinishingIsDiscardedAtOnce() {
        var m = machine()
        running(&m, "a", group: 2)
        _ = m.groupFinished(group: 2, status: .succeeded, error: nil)
        #expect(
            m.lost(job: "a", reason: "taken over") == .endNow(announce: .lost(job: "a", reason: "taken over"), release: 2, .discard))
        #expect(m.published(job: "a") == .ignore)
        #expect(m.isEmpty)
    }

    @Test func aJobLostBeforeItsGroupExistsIsDiscardedAtOnce() {
        var m = machine()
        _ = m.received(job: "a", .claimed(fromNode: nil))
        _ = m.planned(job: "a", operations: 2, recovered: 0)
        #expect(m.lost(job: "a", reason: "x") == .endNow(announce: .lost(job: "a", reason: "x"), release: nil, .discard))
        #expect(m.activeOperations == 0)
        // A submission that comes anyway is stopped and dropped.
        #expect(m.submitted(job: "a", group: 4) == .stray(cancel: 4))
        #expect(m.groupFinished(group: 4, status: .cancelled, error: nil) == .lostEnded(job: "a", release: 4, .discard))
    }

    @Test func admissionCountsJobsAndOperations() {
        var m = machine(jobs: 2, operations: 10)
        #expect(m.admission == .room(jobs: 2, operations: 10))
        _ = m.received(job: "a", .resumed)
        #expect(m.admission == .room(jobs: 1, operations: 10), "a job being read takes a slot")
        _ = m.planned(job: "a", operations: 6, recovered: 0)
        #expect(m.admission == .room(jobs: 1, operations: 4))
        _ = m.submitted(job: "a", group: 1)
        m.extend(job: "a", operations: 4, recovered: 0)
        #expect(m.admission == .full, "the operation budget is spent")
        m.configure(maxActiveJobs: 2, maxActiveOperations: 20)
        #expect(m.admission == .room(jobs: 1, operations: 10))
        _ = m.received(job: "b", .resumed)
        #expect(m.admission == .full, "no room for jobs")
        m.handOver(job: "b")
        #expect(m.admission == .room(jobs: 1, operations: 10), "a job handed to the store leaves the table")
        #expect(m.admission(leaving: 1) == .room(jobs: 2, operations: 10), "a job leaving gives its place")
    }

    @Test func faultsAndStoppingPauseClaiming() {
        var m = machine()
        m.setFault("reading the inbox failed: EIO")
        #expect(m.admission == .paused("reading the inbox failed: EIO"))
        m.setFault(nil)
        #expect(m.admission == .room(jobs: 4, operations: 100))
        m.stop()
        #expect(m.admission == .stopping)
        m.setFault("x")
        #expect(m.admission == .stopping, "stopping wins")
    }

    @Test func onceEndsWhenTheNamesFromTheStartAreTriedAndNothingRuns() {
        var m = machine()
        #expect(!m.onceDone, "without --once never done")
        running(&m, "resumed", group: 1)
        m.startOnce(names: ["x.plist", "y.plist"])
        #expect(m.onceAllows("x.plist"))
        #expect(!m.onceAllows("late.plist"))
        let triedX = m.tryOnce("x.plist")
        #expect(triedX)
        #expect(!m.onceAllows("x.plist"))
        let again = m.tryOnce("x.plist")
        #expect(!again, "tried once only")
        let late = m.tryOnce("late.plist")
        #expect(!late)
        let triedY = m.tryOnce("y.plist")
        #expect(triedY)
        #expect(!m.onceDone, "a job still runs")
        _ = m.groupFinished(group: 1, status: .succeeded, error: nil)
        #expect(!m.onceDone)
        _ = m.published(job: "resumed")
        #expect(m.onceDone)
    }

    @Test func eventsForUnknownJobsAreIgnored() {
        var m = machine()
        #expect(m.planned(job: "ghost", operations: 3, recovered: 0) == .ignore)
        m.extend(job: "ghost", operations: 3, recovered: 0)
        #expect(m.rejected(job: "ghost", problems: [], error: "") == .ignore)
        m.operationEnded(group: 42)
        #expect(m.activeOperations == 0)
        #expect(m.isEmpty)
    }
}

extension JobLifecycleTests {
    @Test func aDelayedJobHoldsNoSlotIsAcceptedOnceAndACancelWakesIt() {
        var m = machine(jobs: 1)
        _ = m.received(job: "d", .inbox(manifest: "d.plist"))
        #expect(m.admission == .full)
        #expect(m.delayed(job: "d", operations: 2, until: 100)
                    == .waits(announce: [.accepted(job: "d", operations: 2), .delayed(job: "d", until: 100)]))
        #expect(m.phase(of: "d") == .delayed)
        #expect(m.jobs["d"]?.notBefore == 100)
        #expect(m.admission == .room(jobs: 1, operations: 100), "a delayed job holds no slot and no operations")
        #expect(m.cancel(job: "d", operation: "a", knownOperation: false) == .kept, "waits with the job")
        #expect(m.phase(of: "d") == .delayed)
        let dueD = m.due(job: "d")
        #expect(dueD)
        #expect(m.phase(of: "d") == .received)
        #expect(m.admission == .full)
        #expect(m.planned(job: "d", operations: 2, recovered: 0) == .submit(announce: nil), "accepted is not logged twice")
        #expect(m.takeEarlyCancels(job: "d") == ["a"])

        _ = m.received(job: "e", .resumed)
        _ = m.delayed(job: "e", operations: 1, until: 200)
        #expect(m.cancel(job: "e", operation: nil, knownOperation: false) == .wake(job: "e"))
        #expect(m.phase(of: "e") == .received)
        let dueE = m.due(job: "e")
        #expect(!dueE, "a woken job is not due again")
        _ = m.received(job: "f", .resumed)
        _ = m.delayed(job: "f", operations: 1, until: 300)
        _ = m.lost(job: "f", reason: "gone")
        #expect(m.delayedCount == 0)
    }

    @Test func aParkedJobLeavesTheTableForACountAndComesBackDelayed() {
        var m = machine(jobs: 1)
        _ = m.received(job: "p", .inbox(manifest: "p.plist"))
        _ = m.delayed(job: "p", operations: 3, until: 500)
        let parked = m.park(job: "p")
        #expect(parked)
        #expect(m.phase(of: "p") == nil && m.isEmpty, "no entry in the table")
        #expect(m.parkedCount == 1 && m.delayedCount == 0)
        #expect(m.admission == .room(jobs: 1, operations: 100))
        m.unpark(job: "p", until: 500)
        #expect(m.phase(of: "p") == .delayed && m.jobs["p"]?.notBefore == 500)
        #expect(m.parkedCount == 0 && m.delayedCount == 1)
        #expect(m.cancel(job: "p", operation: nil, knownOperation: false) == .wake(job: "p"))
        #expect(m.planned(job: "p", operations: 3, recovered: 0) == .submit(announce: nil), "accepted was logged when delayed")

        // One holding a cancel of a single operation is not parked (the cancel would be lost with its entry).
        _ = m.received(job: "q", .resumed)
        _ = m.delayed(job: "q", operations: 1, until: 600)
        _ = m.cancel(job: "q", operation: "a", knownOperation: false)
        let parkedQ = m.park(job: "q")
        #expect(!parkedQ)
        #expect(m.phase(of: "q") == .delayed && m.parkedCount == 0)
        // Only a delayed job is parked.
        let parkedAgain = m.park(job: "p")
        #expect(!parkedAgain)
        #expect(m.phase(of: "p") == .accepted && m.parkedCount == 0)
        m.setParkedCount(4)
        #expect(m.parkedCount == 4)
    }

    @Test func onceWaitsForParkedJobs() {
        var m = machine(jobs: 1)
        m.startOnce(names: [])
        _ = m.received(job: "p", .resumed)
        _ = m.delayed(job: "p", operations: 1, until: 500)
        let parkedP = m.park(job: "p")
        #expect(parkedP)
        #expect(m.isEmpty && !m.onceDone, "a parked job is still to run")
        m.unpark(job: "p", until: 500)
        let dueP = m.due(job: "p")
        #expect(dueP)
        _ = m.lost(job: "p", reason: "gone")
        #expect(m.onceDone)
    }

    @Test func cancelsTheStoreKeptComeInWithTheJobAndGoWithItsGroup() {
        var m = machine()
        let kept = m.keepCancelBeforeReceipt(job: "c", operation: "x")
        #expect(kept)
        #expect(m.received(job: "c", .claimed(fromNode: "n2"), cancels: ["y", nil])
                    == .entered(announce: .claimed(job: "c", fromNode: "n2")))
        _ = m.planned(job: "c", operations: 2, recovered: 0)
        #expect(m.takeEarlyCancels(job: "c") == ["x", "y", nil], "kept before receipt first, then the store's")
    }
}
