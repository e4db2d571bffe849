// The JobStore contract, continued: the publication gate (`complete`). Without `recordsEnds` every end is this
// node's to publish at once; with it, an end is let through only if the store recorded it under the job's fence,
// and one this node no longer holds is refused (and, if it was taken from it, handed to `delegate.lost`).

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel

extension JobStoreConformanceTests {
    /// An empty batch lets nothing through and loses nothing.
    @Test(arguments: StoreKind.allCases) func anEmptyBatchLetsNothingThrough(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        #expect(try node.store.complete([]).isEmpty)
        #expect(node.shell.lostJobs.isEmpty)
    }

    /// Many ends in one batch, of every status, are all let through at once (one statement for a store that
    /// records them).
    @Test(arguments: StoreKind.allCases) func manyEndsPassInOneBatch(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let statuses = ["succeeded", "failed", "cancelled", "rejected"]
        let run = try node.submitAndCollect(statuses.map { (name: "b-\($0)", manifest: sleepManifest("batch-\($0)")) }, expect: 4)
        #expect(run.count == 4, "\(kind): \(run.map(\.id))")
        let ends = try statuses.map { try node.end("batch-\($0)", $0) }
        #expect(try node.store.complete(ends) == Set(statuses.map { "batch-\($0)" }))
        #expect(node.shell.lostJobs.isEmpty)
    }

    /// An end of a job this node never held: a store that records ends refuses it (it has no fence to record it
    /// under); without `recordsEnds` every end is the node's to publish.
    @Test(arguments: StoreKind.allCases) func anEndNotHeldIsRefusedWhereEndsAreRecorded(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        let passed = try node.store.complete([node.end("never-held")])
        if node.store.capabilities.contains(.recordsEnds) {
            #expect(passed.isEmpty, "\(kind): \(passed)")
        } else {
            #expect(passed == ["never-held"])
        }
    }

    /// Fencing: a job taken over by another node (a newer fence) while this one ran it. Where the store leases jobs,
    /// this node's end is refused and the job handed to `delegate.lost`, while the other ends of the batch pass;
    /// without leases nothing can take a job away, and every end passes.
    @Test(arguments: StoreKind.allCases) func aStaleFenceIsRefusedAndLost(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let run = try node.submitAndCollect([("f1", sleepManifest("fenced")), ("f2", sleepManifest("kept"))], expect: 2)
        #expect(run.count == 2)
        let leases = node.store.capabilities.contains(.leasesJobs)
        if leases { try node.takeOver("fenced") }
        let passed = try node.store.complete([node.end("fenced"), node.end("kept")])
        if leases {
            #expect(passed == ["kept"], "\(kind): \(passed)")
            #expect(node.shell.lostJobs.map(\.job) == ["fenced"], "\(kind): \(node.shell.lostJobs)")
        } else {
            #expect(passed == ["fenced", "kept"])
            #expect(node.shell.lostJobs.isEmpty)
        }
    }

    /// A store that records ends keeps each result it let through (`job(_:)`: finished here, with its status and
    /// the result's bytes, for `show` on every node); the file spool keeps nothing beyond the outbox.
    @Test(arguments: StoreKind.allCases) func theStoreKeepsTheResultsItRecords(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        _ = try node.submitAndCollect([("k", sleepManifest("kept-result"))], expect: 1)
        let end = try node.end("kept-result", "failed")
        #expect(try node.store.complete([end]) == ["kept-result"])
        let record = try node.store.job("kept-result")
        if node.store.capabilities.contains(.recordsEnds) {
            #expect(record?.state == .finished && record?.status == "failed" && record?.node == node.store.node,
                    "\(kind): \(String(describing: record))")
            #expect(try record?.result.map { Data($0) } == Data(contentsOf: URL(fileURLWithPath: end.resultFile)))
        } else {
            #expect(record == nil)
        }
    }

    /// The bytes the shell kept as it wrote result.plist (`JobEnd.result`) are what a store that records ends keeps:
    /// the file is not read back.
    @Test(arguments: StoreKind.allCases) func theResultBytesHandedOverAreTheOnesKept(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        _ = try node.submitAndCollect([("h", sleepManifest("handed-bytes"))], expect: 1)
        var end = try node.end("handed-bytes")
        let bytes = Array(plist(["job": "handed-bytes", "status": "succeeded", "kept": true]))
        end.result = bytes
        #expect(try node.store.complete([end]) == ["handed-bytes"])
        if node.store.capabilities.contains(.recordsEnds) {
            #expect(try node.store.job("handed-bytes")?.result == bytes)
        } else {
            #expect(try node.store.job("handed-bytes") == nil)
        }
    }

    /// A crash between the gate and the publication (the end let through, the folder still in active/): the next
    /// process gets the job back and lets its end through again, once — never lost, never run again.
    @Test(arguments: StoreKind.allCases) func aCrashBetweenGateAndPublicationPublishesOnce(_ kind: StoreKind) throws {
        let first = try JobStoreNode.make(kind)
        _ = try first.submitAndCollect([("p", sleepManifest("gated-once"))], expect: 1)
        #expect(try first.store.complete([first.end("gated-once")]) == ["gated-once"])
        let next = try first.restarted()
        defer { next.close() }
        let (found, _) = try next.recover()
        let resumed = next.store.recovered(found)
        #expect(resumed.map(\.id) == ["gated-once"], "\(kind): \(resumed.map(\.id))")
        #expect(try next.store.complete([next.end("gated-once")]) == ["gated-once"])
        try next.publish("gated-once")
        next.store.want(room: 4, manifestBytes: .max)
        #expect(holdsThroughout(1) { next.shell.ran.isEmpty && next.shell.lostJobs.isEmpty }, "\(kind): \(next.ranIDs)")
    }
}
