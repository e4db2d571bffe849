// The JobStore contract, continued: what the shell asks a store about itself and its jobs (node, snapshot, origin,
// job records, submission configuration, submissions still awaiting) — each answered as the store's stated
// capabilities say, never as its kind would.

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel

extension JobStoreConformanceTests {
    /// `node` names this node where the store places jobs (a cluster); nil without one (no OPQ_NODE).
    @Test(arguments: StoreKind.allCases) func theNodeIsNamedOnlyInACluster(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        if node.store.capabilities.contains(.placesJobs) {
            #expect(node.store.node.map { !$0.isEmpty } == true, "\(kind): \(String(describing: node.store.node))")
        } else {
            #expect(node.store.node == nil)
        }
    }

    /// `snapshot` is the cluster as this node last read it, naming this node; nil for a store with no cluster.
    @Test(arguments: StoreKind.allCases) func aSnapshotOnlyWhereTheStorePlacesJobs(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let snapshot = node.store.snapshot()
        if node.store.capabilities.contains(.placesJobs) {
            #expect(snapshot?.node == node.store.node)
            #expect(eventually(20) { node.store.snapshot()?.connected == true }, "\(kind): never connected")
        } else {
            #expect(snapshot == nil)
        }
    }

    /// `origin(of:)` of a job submitted here names this node as its submitter (not taken over from any); nil
    /// without a cluster.
    @Test(arguments: StoreKind.allCases) func theOriginNamesTheSubmittingNode(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let run = try node.submitAndCollect([("o", sleepManifest("origin"))], expect: 1)
        #expect(run.map(\.id) == ["origin"])
        let origin = node.store.origin(of: "origin")
        if node.store.capabilities.contains(.placesJobs) {
            #expect(origin == JobOrigin(submittedOn: node.store.node ?? "?", fromNode: nil), "\(kind): \(String(describing: origin))")
        } else {
            #expect(origin == nil)
        }
    }

    /// No store has an origin for an id nobody submitted.
    @Test(arguments: StoreKind.allCases) func anUnknownJobHasNoOrigin(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(node.store.origin(of: "nobody-submitted-this") == nil)
    }

    /// `job(_:)` knows nothing of an id nobody submitted; a store that places jobs knows one submitted here (its
    /// row, under that id, with the manifest's bytes), the file spool keeps no records.
    @Test(arguments: StoreKind.allCases) func aJobLookupKnowsOnlyWhatTheStoreKeeps(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        // Until it has connected once, a store that places jobs cannot be asked (`job` throws).
        #expect(eventually(20) { node.store.acceptsSubmissions })
        #expect(try node.store.job("nobody-submitted-this") == nil)
        let manifest = sleepManifest("looked-up")
        _ = try node.submitAndCollect([("l", manifest)], expect: 1)
        let record = try node.store.job("looked-up")
        if node.store.capabilities.contains(.placesJobs) {
            #expect(record?.id == "looked-up" && record?.submittedOn == node.store.node)
            #expect(record.map { Data($0.manifest) } == plist(manifest))
        } else {
            #expect(record == nil)
        }
    }

    /// What a manifest is validated against, read afresh: nil where the store keeps nothing to read again; where it
    /// places jobs, the local configuration (or wider) once the store can be asked.
    @Test(arguments: StoreKind.allCases) func aFreshConfigurationOnlyWhereTheStorePlacesJobs(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let local = try Configuration.parse(plist(["queues": ["photos": ["maxConcurrentOperationCount": 2]]]))
        if node.store.capabilities.contains(.placesJobs) {
            var fresh: Configuration?
            #expect(eventually(20) {
                fresh = node.store.freshSubmissionConfiguration(local)
                return fresh != nil
            })
            #expect(fresh?.queues["photos"]?.maxConcurrentOperationCount == 2)
        } else {
            #expect(node.store.freshSubmissionConfiguration(local) == nil)
        }
    }

    /// The configuration a manifest is validated against keeps every local queue as it is configured here: a
    /// store may widen it, never narrow it or change a queue's settings.
    @Test(arguments: StoreKind.allCases) func theSubmissionConfigurationIsTheLocalOneOrWider(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        let local = try Configuration.parse(plist(["queues": ["photos": ["maxConcurrentOperationCount": 2],
                                                              "videos": ["maxConcurrentOperationCount": 1]]]))
        let widened = node.store.submissionConfiguration(local)
        for (name, queue) in local.queues {
            #expect(widened.queues[name] == queue, "\(kind): \(name)")
        }
        #expect(Set(local.commands.keys).isSubset(of: Set(widened.commands.keys)))
    }

    /// At rest, a store accepts submissions and holds none awaiting (nothing counted in the inbox twice).
    @Test(arguments: StoreKind.allCases) func nothingAwaitsSubmissionAtRest(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions }, "\(kind) never accepts submissions")
        #expect(node.store.awaitingSubmission == 0)
        #expect(node.store.awaitingSubmissionSince == nil)
    }

    /// Submissions are counted as awaiting only until they are jobs: once the store has made jobs of them (and
    /// they ran here), none awaits and there is no oldest; the oldest, while one waited, was no older than its claim.
    @Test(arguments: StoreKind.allCases) func submissionsAwaitOnlyUntilTheyAreJobs(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        let claimed = try node.claim([("a1", sleepManifest("await-1")), ("a2", sleepManifest("await-2"))])
        let before = Date().timeIntervalSince1970
        let runHere = node.store.submit(claimed)
        let since = node.store.awaitingSubmissionSince
        #expect(node.store.awaitingSubmission <= 2)
        #expect(since.map { $0 >= claimed[0].receivedAt - 1 && $0 <= before + 1 } ?? true, "\(kind): \(String(describing: since))")
        node.store.want(room: 4, manifestBytes: .max)
        #expect(eventually(20) { runHere.count + node.shell.ran.count == 2 }, "\(kind): \(node.ranIDs)")
        #expect(eventually(20) { node.store.awaitingSubmission == 0 && node.store.awaitingSubmissionSince == nil })
    }

    /// `delegate.submitted` gives each inbox manifest the id its job got where the store makes jobs of them later
    /// (once inserted): by its inbox name and inode. Without it the shell knows the id at claim: the store says
    /// nothing.
    @Test(arguments: StoreKind.allCases) func theSubmittedIDsReachTheDelegate(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        let claimed = try node.claim([("named", sleepManifest("named-job"))])
        _ = node.store.submit(claimed)
        node.store.want(room: 4, manifestBytes: .max)
        if node.store.capabilities.contains(.placesJobs) {
            #expect(eventually(20) { !node.recorder.submittedIDs.isEmpty })
            let told = node.recorder.submittedIDs
            #expect(told.count == 1 && told.first?.manifest == "named.plist" && told.first?.job == "named-job", "\(told)")
            #expect(told.first?.inode == claimed[0].inboxInode && claimed[0].inboxInode != nil)
        } else {
            #expect(holdsThroughout(0.5) { node.recorder.submittedIDs.isEmpty })
        }
    }

    /// `reload` (SIGHUP): a store that places jobs declares the node's queues again, so a manifest naming a queue
    /// only the reloaded configuration has is validated against it on every node; the file spool keeps nothing.
    @Test(arguments: StoreKind.allCases) func aReloadDeclaresTheQueuesAgain(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        let local = try Configuration.parse(plist([:] as [String: Any]))
        #expect(node.store.freshSubmissionConfiguration(local)?.queues["reloaded"] == nil)
        node.store.reload(try Configuration.parse(plist(["queues": ["reloaded": ["maxConcurrentOperationCount": 3]]])))
        if node.store.capabilities.contains(.placesJobs) {
            #expect(eventually(20) { node.store.freshSubmissionConfiguration(local)?.queues["reloaded"] != nil },
                    "\(kind): the reloaded queue was never declared")
        } else {
            #expect(node.store.freshSubmissionConfiguration(local) == nil)
            #expect(node.store.submissionConfiguration(local).queues["reloaded"] == nil)
        }
    }
}
