// The JobStore contract, continued: the jobs' files in this node's spool, which the shell reaches only through the
// store — publication never replaces a name it did not make, a job discarded leaves nothing behind, a rejected
// submission is kept here to be published, and a removed job folder can be made again.

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel

extension JobStoreConformanceTests {
    /// Something not the daemon's took outbox/<job> after the claim: the entry goes beside it as <job>.1, in the
    /// store's outbox, and what was there is left as it was.
    @Test(arguments: StoreKind.allCases) func publicationNeverReplacesATakenName(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        _ = try node.submitAndCollect([("t", sleepManifest("taken"))], expect: 1)
        let squatter = node.store.outbox.folder + "/taken"
        try FileManager.default.createDirectory(atPath: squatter, withIntermediateDirectories: true)
        try Data("mine".utf8).write(to: URL(fileURLWithPath: squatter + "/note"))
        #expect(try node.store.complete([node.end("taken")]) == ["taken"])
        let (folder, name) = try node.store.place(job: "taken") { _ in false }
        #expect(folder == node.store.outbox.folder && name == "taken.1", "\(kind): \(folder)/\(name)")
        #expect(try String(contentsOfFile: squatter + "/note", encoding: .utf8) == "mine")
        #expect(FileManager.default.fileExists(atPath: folder + "/taken.1/result.plist"))
        #expect(!node.store.hasFolder(job: "taken"))
    }

    /// A job discarded (lost, or cancelled before it ran) leaves neither its folder nor its downloads, and the next
    /// process finds nothing of it.
    @Test(arguments: StoreKind.allCases) func aDiscardedJobLeavesNothing(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        _ = try node.submitAndCollect([("x", sleepManifest("dropped"))], expect: 1)
        let downloads = node.store.folders.downloads("dropped")
        try FileManager.default.createDirectory(atPath: downloads, withIntermediateDirectories: true)
        try Data("partial".utf8).write(to: URL(fileURLWithPath: downloads + "/get"))
        node.store.discard(job: "dropped")
        #expect(!node.store.hasFolder(job: "dropped"))
        #expect(!FileManager.default.fileExists(atPath: downloads))
        let next = try node.restarted()
        defer { next.close() }
        let (found, problems) = try next.recover()
        #expect(!found.contains { $0.id == "dropped" } && problems.isEmpty, "\(kind): \(found.map(\.id)) \(problems)")
    }

    /// A manifest claimed from the inbox and rejected before submission is kept here: a job of this node with its
    /// manifest in its folder, staged and published like any other.
    @Test(arguments: StoreKind.allCases) func aRejectedClaimIsKeptHereAndPublished(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        let manifest = sleepManifest("refused")
        let claimed = try #require(try node.claim([("r", manifest)]).first)
        guard case .claimed(let kept) = try node.store.keepHere(claimed, inUse: { _ in false }) else {
            Issue.record("\(kind): the claim was not kept here")
            return
        }
        #expect(kept.id == "refused" && node.store.hasFolder(job: "refused"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: node.store.folders.job("refused") + "/manifest.plist")) == plist(manifest))
        _ = try node.end("refused", "rejected")
        #expect(try node.store.place(job: "refused") { _ in false }.name == "refused")
    }

    /// A job folder removed under a running job (not by the daemon) is made again with its manifest, so that its end
    /// can still be staged and published.
    @Test(arguments: StoreKind.allCases) func aRemovedJobFolderIsMadeAgain(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let run = try node.submitAndCollect([("f", sleepManifest("folder"))], expect: 1)
        let job = try #require(run.first)
        try FileManager.default.removeItem(atPath: node.store.folders.job("folder"))
        #expect(!node.store.hasFolder(job: "folder"))
        try node.store.restoreFolder(job: "folder", manifest: job.manifest)
        #expect(try Data(contentsOf: URL(fileURLWithPath: node.store.folders.job("folder") + "/manifest.plist")) == job.manifest)
        #expect(try node.store.complete([node.end("folder", "failed")]) == ["folder"])
        #expect(try node.store.place(job: "folder") { _ in false }.name == "folder")
    }
}
