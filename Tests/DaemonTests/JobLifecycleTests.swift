// The job lifecycle (Lifecycle/JobLifecycle.swift) as a pure state machine: events in, actions out, no I/O.
// Groups are plain integers here (the machine is generic over the engine's group id).

import Testing
@testable import Daemon

private typealias Machine = JobLifecycle<Int>

@Suite struct JobLifecycleTests {
    private func machine(jobs: Int = 4, operations: Int = 100) -> Machine {
        Machine(maxActiveJobs: jobs, maxActiveOperations: operations)
    }

    /// Received from the inbox, planned and submitted as group `group`.
    private func running(_ m: inout Machine, _ job: String, operations: Int = 3, group: Int) {
        _ = m.handle(.received(job: job, .inbox(manifest: job + ".plist")))
        _ = m.handle(.planned(job: job, operations: operations, recovered: 0))
        _ = m.handle(.submitted(job: job, group: group))
    }

    @Test func aJobGoesFromReceivedToPublished() {
        var m = machine()
        #expect(m.handle(.received(job: "a", .inbox(manifest: "a.plist"))) == [.journal(.received(job: "a", manifest: "a.plist"))])
        #expect(m.phase(of: "a") == .received)
        #expect(m.activeOperations == 0, "operations count once the plan is read")
        #expect(m.handle(.planned(job: "a", operations: 3, recovered: 1)) == [.journal(.accepted(job: "a", operations: 3)), .submit(job: "a")])
        #expect(m.phase(of: "a") == .accepted)
        #expect(m.activeOperations == 3)
        #expect(m.handle(.submitted(job: "a", group: 7)) == [])
        #expect(m.phase(of: "a") == .running)
        #expect(m.job(of: 7) == "a")
        #expect(m.handle(.operationEnded(group: 7)) == [])
        #expect(m.progress("a")?.operations == 3)
        #expect(m.progress("a")?.ended == 2, "one ended here, one before the restart")
        #expect(m.handle(.groupFinished(group: 7, status: "failed", error: "b: boom")) == [.publish(job: "a", status: "failed", error: "b: boom")])
        #expect(m.phase(of: "a") == .finishing)
        #expect(m.activeOperations == 3, "counted until published")
        #expect(m.handle(.published(job: "a")) == [.releaseGroup(7)])
        #expect(m.phase(of: "a") == nil)
        #expect(m.job(of: 7) == nil)
        #expect(m.activeOperations == 0)
        #expect(m.isEmpty)
    }

    @Test func resumedJobsAreNotLoggedAsReceivedAndClaimedOnesNameTheirNode() {
        var m = machine()
        #expect(m.handle(.received(job: "r", .resumed)) == [])
        #expect(m.handle(.received(job: "c", .claimed(fromNode: "n2"))) == [.journal(.claimed(job: "c", fromNode: "n2"))])
        #expect(m.handle(.received(job: "c", .claimed(fromNode: nil))) == [], "a job already in the table is not received twice")
        #expect(m.count == 2)
    }

    @Test func aRejectedJobIsPublishedWithItsProblems() {
        var m = machine()
        _ = m.handle(.received(job: "bad", .inbox(manifest: "bad.plist")))
        #expect(m.handle(.rejected(job: "bad", problems: ["x", "y"], error: "x\ny")) == [
            .journal(.rejected(job: "bad", problems: ["x", "y"], error: "x\ny")), .publish(job: "bad", status: "rejected", error: "x\ny"),
        ])
        #expect(m.phase(of: "bad") == .rejected)
        #expect(m.handle(.cancel(job: "bad", operation: nil, knownOperation: true)) == [.answer(.alreadyEnded)])
        #expect(m.handle(.groupFinished(group: 1, status: "succeeded", error: nil)) == [], "no group: nothing to finish")
        #expect(m.handle(.published(job: "bad")) == [], "no group to release")
        #expect(m.isEmpty)
    }

    @Test func aRefusedSubmissionRejectsAndKeepsCountingUntilPublished() {
        var m = machine()
        _ = m.handle(.received(job: "a", .resumed))
        _ = m.handle(.planned(job: "a", operations: 5, recovered: 0))
        _ = m.handle(.cancel(job: "a", operation: nil, knownOperation: true))
        #expect(m.handle(.rejected(job: "a", problems: ["cycle"], error: "cycle!")).last == .publish(job: "a", status: "rejected", error: "cycle!"))
        #expect(m.activeOperations == 5)
        _ = m.handle(.published(job: "a"))
        #expect(m.activeOperations == 0)
    }

    @Test func cancelsBeforeTheGroupExistAreAppliedWhenItIsSubmitted() {
        var m = machine()
        _ = m.handle(.received(job: "a", .inbox(manifest: "a.plist")))
        // Before the plan is read, any operation name is taken (checked once the group exists).
        #expect(m.handle(.cancel(job: "a", operation: "zz", knownOperation: false)) == [.answer(.cancelled)])
        _ = m.handle(.planned(job: "a", operations: 2, recovered: 0))
        // After, an unknown operation is refused at once.
        #expect(m.handle(.cancel(job: "a", operation: "nope", knownOperation: false)) == [.answer(.unknownOperation)])
        #expect(m.handle(.cancel(job: "a", operation: "b", knownOperation: true)) == [.answer(.cancelled)])
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: true)) == [.answer(.cancelled)])
        #expect(m.handle(.submitted(job: "a", group: 3)) == [
            .cancelOperation(job: "a", group: 3, operation: "zz"), .cancelOperation(job: "a", group: 3, operation: "b"), .cancelGroup(3),
        ])
        #expect(m.handle(.groupFinished(group: 3, status: "cancelled", error: nil)) == [.publish(job: "a", status: "cancelled", error: nil)])
    }

    @Test func cancelsAfterTheGroupExistGoToTheEngine() {
        var m = machine()
        running(&m, "a", group: 9)
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: true)) == [.cancelGroup(9), .answer(.cancelled)])
        #expect(m.handle(.cancel(job: "a", operation: "b", knownOperation: true)) == [.cancelOperation(job: "a", group: 9, operation: "b"), .answer(.cancelled)])
        #expect(m.handle(.cancel(job: "a", operation: "nope", knownOperation: false)) == [.answer(.unknownOperation)])
        _ = m.handle(.groupFinished(group: 9, status: "cancelled", error: nil))
        // Finishing: the engine answers for the operation; the whole job's cancel is harmless.
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: true)) == [.cancelGroup(9), .answer(.cancelled)])
    }

    @Test func aJobNotInTheTableIsTheStoresToAnswer() {
        var m = machine()
        #expect(m.handle(.cancel(job: "elsewhere", operation: nil, knownOperation: false)) == [.answer(.notHere)])
        running(&m, "a", group: 1)
        _ = m.handle(.groupFinished(group: 1, status: "succeeded", error: nil))
        _ = m.handle(.published(job: "a"))
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: false)) == [.answer(.notHere)], "published: the outbox answers")
    }

    @Test func aJobLostWhileRunningIsStoppedAndDiscardedOnceItsGroupEnds() {
        var m = machine()
        running(&m, "a", operations: 4, group: 5)
        #expect(m.handle(.lost(job: "a", reason: "lease ran out")) == [.journal(.lost(job: "a", reason: "lease ran out")), .cancelGroup(5)])
        #expect(m.phase(of: "a") == nil)
        #expect(m.activeOperations == 0, "its operations no longer count")
        #expect(m.handle(.operationEnded(group: 5)) == [])
        #expect(m.handle(.cancel(job: "a", operation: nil, knownOperation: true)) == [.answer(.notHere)])
        // Its group ends (cancelled): released, folder discarded, nothing published.
        #expect(m.handle(.groupFinished(group: 5, status: "cancelled", error: nil)) == [.releaseGroup(5), .discard(job: "a")])
        #expect(m.handle(.groupFinished(group: 5, status: "cancelled", error: nil)) == [], "once")
        #expect(m.handle(.published(job: "a")) == [], "a publication that was queued does not bring it back")
        #expect(m.handle(.lost(job: "a", reason: "again")) == [], "lost twice: logged once")
    }

    @Test func aJobLostWhileFinishingIsDiscardedAtOnce() {
        var m = machine()
        running(&m, "a", group: 2)
        _ = m.handle(.groupFinished(group: 2, status: "succeeded", error: nil))
        #expect(m.handle(.lost(job: "a", reason: "taken over")) == [.journal(.lost(job: "a", reason: "taken over")), .releaseGroup(2), .discard(job: "a")])
        #expect(m.handle(.published(job: "a")) == [])
        #expect(m.isEmpty)
    }

    @Test func aJobLostBeforeItsGroupExistsIsDiscardedAtOnce() {
        var m = machine()
        _ = m.handle(.received(job: "a", .claimed(fromNode: nil)))
        _ = m.handle(.planned(job: "a", operations: 2, recovered: 0))
        #expect(m.handle(.lost(job: "a", reason: "x")) == [.journal(.lost(job: "a", reason: "x")), .discard(job: "a")])
        #expect(m.activeOperations == 0)
        // A submission that comes anyway is stopped and dropped.
        #expect(m.handle(.submitted(job: "a", group: 4)) == [.cancelGroup(4)])
        #expect(m.handle(.groupFinished(group: 4, status: "cancelled", error: nil)) == [.releaseGroup(4), .discard(job: "a")])
    }

    @Test func admissionCountsJobsAndOperations() {
        var m = machine(jobs: 2, operations: 10)
        #expect(m.admission == .room(jobs: 2, operations: 10))
        _ = m.handle(.received(job: "a", .resumed))
        #expect(m.admission == .room(jobs: 1, operations: 10), "a job being read takes a slot")
        _ = m.handle(.planned(job: "a", operations: 6, recovered: 0))
        #expect(m.admission == .room(jobs: 1, operations: 4))
        _ = m.handle(.submitted(job: "a", group: 1))
        _ = m.handle(.extended(job: "a", operations: 4, recovered: 0))
        #expect(m.admission == .full, "the operation budget is spent")
        _ = m.handle(.configured(maxActiveJobs: 2, maxActiveOperations: 20))
        #expect(m.admission == .room(jobs: 1, operations: 10))
        _ = m.handle(.received(job: "b", .resumed))
        #expect(m.admission == .full, "no room for jobs")
        _ = m.handle(.handedOver(job: "b"))
        #expect(m.admission == .room(jobs: 1, operations: 10), "a job handed to the store leaves the table")
    }

    @Test func faultsAndStoppingPauseClaiming() {
        var m = machine()
        _ = m.handle(.fault("reading the inbox failed: EIO"))
        #expect(m.admission == .paused("reading the inbox failed: EIO"))
        _ = m.handle(.fault(nil))
        #expect(m.admission == .room(jobs: 4, operations: 100))
        _ = m.handle(.stopping)
        #expect(m.admission == .stopping)
        _ = m.handle(.fault("x"))
        #expect(m.admission == .stopping, "stopping wins")
    }

    @Test func onceEndsWhenTheNamesFromTheStartAreTriedAndNothingRuns() {
        var m = machine()
        #expect(!m.onceDone, "without --once never done")
        running(&m, "resumed", group: 1)
        _ = m.handle(.once(names: ["x.plist", "y.plist"]))
        #expect(m.onceAllows("x.plist"))
        #expect(!m.onceAllows("late.plist"))
        _ = m.handle(.onceTried(name: "x.plist"))
        #expect(!m.onceAllows("x.plist"))
        _ = m.handle(.onceTried(name: "y.plist"))
        #expect(!m.onceDone, "a job still runs")
        _ = m.handle(.groupFinished(group: 1, status: "succeeded", error: nil))
        #expect(!m.onceDone)
        _ = m.handle(.published(job: "resumed"))
        #expect(m.onceDone)
    }

    @Test func eventsForUnknownJobsAreIgnored() {
        var m = machine()
        #expect(m.handle(.planned(job: "ghost", operations: 3, recovered: 0)) == [])
        #expect(m.handle(.extended(job: "ghost", operations: 3, recovered: 0)) == [])
        #expect(m.handle(.rejected(job: "ghost", problems: [], error: "")) == [])
        #expect(m.handle(.operationEnded(group: 42)) == [])
        #expect(m.activeOperations == 0)
        #expect(m.isEmpty)
    }
}
