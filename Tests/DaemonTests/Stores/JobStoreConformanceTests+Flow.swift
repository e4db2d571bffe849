// The JobStore contract, continued: how jobs reach this node and how a stop lets go of them — `submit`'s answer,
// `want(room:)`, `stopClaiming`, `handBack`, `shutdown`. A store that places jobs claims only for the room offered
// and only until told to stop; the file spool runs what it is given at once and gives nothing back.

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel

extension JobStoreConformanceTests {
    /// `submit` returns the jobs that run here now: all of them, in order, without `placesJobs`; none with it
    /// (they come back through `delegate.run`, each once).
    @Test(arguments: StoreKind.allCases) func submitReturnsWhatRunsHereNow(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        let claimed = try node.claim([("s1", sleepManifest("now-1")), ("s2", sleepManifest("now-2"))])
        let runHere = node.store.submit(claimed).map(\.id)
        if node.store.capabilities.contains(.placesJobs) {
            #expect(runHere.isEmpty)
            node.store.want(room: 4, manifestBytes: .max)
            #expect(eventually(20) { node.shell.ran.count == 2 })
            #expect(Set(node.ranIDs) == ["now-1", "now-2"] && node.ranIDs.count == 2, "\(kind): \(node.ranIDs)")
        } else {
            #expect(runHere == ["now-1", "now-2"])
            #expect(node.shell.ran.isEmpty)
        }
    }

    /// `want(room: 0)` claims nothing: a store that places jobs holds the job until room is offered, then runs
    /// it; the file spool runs what it is given whatever the room (the shell reads the inbox only with room).
    @Test(arguments: StoreKind.allCases) func noRoomClaimsNothing(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        node.store.want(room: 0, manifestBytes: .max)
        let runHere = node.store.submit(try node.claim([("r", sleepManifest("roomless"))])).map(\.id)
        if node.store.capabilities.contains(.placesJobs) {
            #expect(node.known("roomless"))
            #expect(holdsThroughout(2) { node.shell.ran.isEmpty }, "\(kind): \(node.ranIDs)")
            node.store.want(room: 1, manifestBytes: .max)
            #expect(eventually(20) { node.ranIDs == ["roomless"] }, "\(kind): \(node.ranIDs)")
        } else {
            #expect(runHere == ["roomless"])
            #expect(holdsThroughout(0.5) { node.shell.ran.isEmpty })
        }
    }

    /// After `stopClaiming`, room offered claims nothing: a job waiting in the store stays there for other nodes.
    @Test(arguments: StoreKind.allCases) func afterStopClaimingRoomClaimsNothing(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        node.store.stopClaiming()
        _ = node.store.submit(try node.claim([("w", sleepManifest("unclaimed"))]))
        #expect(node.known("unclaimed"))
        node.store.want(room: 4, manifestBytes: .max)
        #expect(holdsThroughout(2) { node.shell.ran.isEmpty }, "\(kind): \(node.ranIDs)")
        if node.store.capabilities.contains(.placesJobs) {
            #expect(try node.store.job("unclaimed")?.state == .waiting)
        }
    }

    /// `handBack` at a graceful stop: where jobs are leased, the unstarted jobs go back to waiting (returned, and
    /// no longer this node's: their ends are refused); the file spool gives back nothing (they resume here).
    @Test(arguments: StoreKind.allCases) func handBackGivesBackOnlyLeasedJobs(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        _ = try node.submitAndCollect([("h1", sleepManifest("back-1")), ("h2", sleepManifest("back-2"))], expect: 2)
        node.store.stopClaiming()
        let back = node.store.handBack(["back-1", "back-2"])
        if node.store.capabilities.contains(.leasesJobs) {
            #expect(back == ["back-1", "back-2"], "\(kind): \(back)")
            #expect(try node.store.job("back-1")?.state == .waiting)
            #expect(try node.store.complete([node.end("back-1")]).isEmpty)
        } else {
            #expect(back.isEmpty)
            #expect(try node.store.complete([node.end("back-1")]) == ["back-1"])
        }
    }

    /// `handBack` never gives back what this node does not hold, nor a job whose end was let through.
    @Test(arguments: StoreKind.allCases) func handBackGivesNothingNotHeld(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        _ = try node.submitAndCollect([("n", sleepManifest("ended-before-stop"))], expect: 1)
        #expect(try node.store.complete([node.end("ended-before-stop")]) == ["ended-before-stop"])
        node.store.stopClaiming()
        #expect(node.store.handBack(["ended-before-stop", "nobody-submitted-this"]).isEmpty)
        if node.store.capabilities.contains(.recordsEnds) {
            #expect(try node.store.job("ended-before-stop")?.state == .finished)
        }
    }

    /// After `shutdown` the store calls its delegate no more: a job waiting in it is not claimed for room offered
    /// later, and a second `shutdown` is harmless.
    @Test(arguments: StoreKind.allCases) func afterShutdownTheDelegateHearsNothing(_ kind: StoreKind) throws {
        let node = try JobStoreNode.make(kind)
        defer { node.close() }
        #expect(eventually(20) { node.store.acceptsSubmissions })
        node.store.want(room: 0, manifestBytes: .max)
        _ = node.store.submit(try node.claim([("z", sleepManifest("after-shutdown"))]))
        #expect(node.known("after-shutdown"))
        node.store.shutdown()
        let calls = node.recorder.calls
        node.store.want(room: 4, manifestBytes: .max)
        #expect(holdsThroughout(2) { node.recorder.calls == calls && node.shell.ran.isEmpty }, "\(kind): \(node.ranIDs)")
        node.store.shutdown()
    }
}
