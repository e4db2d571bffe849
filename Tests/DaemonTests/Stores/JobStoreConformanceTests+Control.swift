// The JobStore contract, continued: what a client asks through the store (cancel, suspend, resume). A store that
// places jobs records a cancel for the node that runs the job and keeps suspensions for every node; the file spool
// knows only the jobs that ended (its outbox) and acts on suspensions locally.

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel

extension JobStoreConformanceTests {
    /// A cancel of an id nobody submitted is `unknownJob`, for the whole job and for one of its operations.
    @Test(arguments: StoreKind.allCases) func aCancelOfAnUnknownJobIsUnknown(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        #expect(node.store.requestCancel(job: "nobody-submitted-this", operation: nil) == .unknownJob)
        #expect(node.store.requestCancel(job: "nobody-submitted-this", operation: "s") == .unknownJob)
        #expect(node.shell.cancels.isEmpty)
    }

    /// A cancel of one operation of a job that ended (let through the gate and published) is `alreadyEnded`,
    /// whether or not the job has that operation: nothing is left to cancel.
    @Test(arguments: StoreKind.allCases) func aCancelOfAnEndedJobsOperationIsAlreadyEnded(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        _ = try node.submitAndCollect([("e", sleepManifest("ended"))], expect: 1)
        #expect(try node.store.complete([node.end("ended", "failed")]) == ["ended"])
        try node.publish("ended")
        #expect(node.store.requestCancel(job: "ended", operation: "s") == .alreadyEnded)
        #expect(node.store.requestCancel(job: "ended", operation: "no-such-operation") == .alreadyEnded)
    }

    /// A cancel of a job running on this node, asked through the store: where the store places jobs it is
    /// recorded (`requested`) and reaches the node that runs it (`delegate.cancel`, here this node); the file spool
    /// records nothing — a job that has not ended is the shell's own to cancel — and answers `unknownJob`.
    @Test(arguments: StoreKind.allCases) func aCancelOfARunningJobReachesItsNode(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        _ = try node.submitAndCollect([("c", sleepManifest("cancelled", seconds: 60))], expect: 1)
        let outcome = node.store.requestCancel(job: "cancelled", operation: nil)
        if node.store.capabilities.contains(.placesJobs) {
            #expect(outcome == .requested)
            #expect(eventually(30) { node.shell.cancels.contains { $0.job == "cancelled" && $0.operation == nil } },
                    "\(kind): \(node.shell.cancels)")
        } else {
            #expect(outcome == .unknownJob)
            #expect(holdsThroughout(0.5) { node.shell.cancels.isEmpty })
        }
    }

    /// A cancel of an operation the job does not have is refused (`unknownOperation`) where the store can read
    /// the job's manifest, never recorded to be ignored later; the file spool does not know the job at all.
    @Test(arguments: StoreKind.allCases) func aCancelOfAnOperationTheJobLacksIsRefused(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        _ = try node.submitAndCollect([("u", sleepManifest("one-operation", seconds: 60))], expect: 1)
        let outcome = node.store.requestCancel(job: "one-operation", operation: "no-such-operation")
        if node.store.capabilities.contains(.placesJobs) {
            #expect(outcome == .unknownOperation)
        } else {
            #expect(outcome == .unknownJob)
        }
        #expect(holdsThroughout(0.5) { node.shell.cancels.isEmpty })
    }

    /// A suspension kept by the store is recorded (true) and reaches every node, this one included, through
    /// `delegate.suspendedQueuesChanged`; without `keepsSuspensions` the store only says it keeps nothing (false)
    /// and never calls the delegate.
    @Test(arguments: StoreKind.allCases) func aSuspensionIsKeptOnlyWhereTheStoreKeepsThem(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        let kept = node.store.setSuspended("photos", true)
        if node.store.capabilities.contains(.keepsSuspensions) {
            #expect(kept)
            #expect(eventually(30) { node.shell.suspensions.last?.contains("photos") == true }, "\(kind): \(node.shell.suspensions)")
        } else {
            #expect(!kept)
            #expect(holdsThroughout(0.5) { node.shell.suspensions.isEmpty })
        }
    }

    /// A resumption likewise: the queue leaves the suspended set every node is told of, the others stay.
    @Test(arguments: StoreKind.allCases) func aResumptionIsKeptOnlyWhereTheStoreKeepsThem(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        let suspended = [node.store.setSuspended("photos", true), node.store.setSuspended("videos", true)]
        if node.store.capabilities.contains(.keepsSuspensions) {
            #expect(suspended == [true, true])
            #expect(eventually(30) { node.shell.suspensions.last == ["photos", "videos"] }, "\(kind): \(node.shell.suspensions)")
            #expect(node.store.setSuspended("photos", false))
            #expect(eventually(30) { node.shell.suspensions.last == ["videos"] }, "\(kind): \(node.shell.suspensions)")
        } else {
            #expect(suspended == [false, false])
            #expect(!node.store.setSuspended("photos", false))
            #expect(holdsThroughout(0.5) { node.shell.suspensions.isEmpty })
        }
    }
}
