// SilenceWatch: a node is silent once its beat has not changed for longer than its lease by the watcher's own clock;
// the database's clock is never read as a time (a step of it moves nothing). No I/O.

import ClusterStore
@testable import Daemon
import Testing
import TestTraits

@Suite(.onItsOwnExecutor) struct SilenceWatchTests {
    func beat(_ node: String, _ beat: Int64, lease: Double? = nil) -> NodeBeat {
        NodeBeat(node: node, beat: beat, leaseSeconds: lease)
    }

    @Test func aNodeIsSilentOnceItsBeatHasNotChangedForItsLeaseByTheWatchersClock() {
        var watch = SilenceWatch()
        #expect(watch.silent(in: [beat("a", 100)], now: 10, defaultLease: 5, except: "me").isEmpty, "first seen: never silent yet")
        #expect(watch.silent(in: [beat("a", 100)], now: 14.9, defaultLease: 5, except: "me").isEmpty)
        #expect(watch.silent(in: [beat("a", 100)], now: 15.1, defaultLease: 5, except: "me") == [beat("a", 100)])
        // It beats: counted again from when the new beat was read.
        #expect(watch.silent(in: [beat("a", 101)], now: 16, defaultLease: 5, except: "me").isEmpty)
        #expect(watch.silent(in: [beat("a", 101)], now: 20.9, defaultLease: 5, except: "me").isEmpty)
        #expect(watch.silent(in: [beat("a", 101)], now: 21.1, defaultLease: 5, except: "me") == [beat("a", 101)])
    }

    /// What a step of the database server's clock looks like from here: the token jumps (forward or back) at each
    /// beat. Forward by an hour, a beating node is never silent; back by an hour, a node that stops beating is silent
    /// after its lease all the same.
    @Test func aStepOfTheDatabasesClockChangesNothing() {
        var watch = SilenceWatch()
        let hour: Int64 = 3_600_000_000
        var t = 0.0
        var token: Int64 = 1_000_000
        for step in [hour, 1_000_000, 1_000_000, -hour, 1_000_000] {
            #expect(watch.silent(in: [beat("a", token)], now: t, defaultLease: 5, except: "me").isEmpty)
            token += step
            t += 1.7
        }
        // It stops beating just after the clock went back: silent after its lease, not after the step's hour.
        #expect(watch.silent(in: [beat("a", token)], now: t, defaultLease: 5, except: "me").isEmpty)
        #expect(watch.silent(in: [beat("a", token)], now: t + 5.1, defaultLease: 5, except: "me") == [beat("a", token)])
    }

    @Test func eachNodeByItsOwnLeaseAndNeverTheWatcherItself() {
        var watch = SilenceWatch()
        let beats = [beat("hasty", 1, lease: 0.5), beat("me", 1), beat("patient", 1, lease: 60), beat("plain", 1)]
        #expect(watch.silent(in: beats, now: 0, defaultLease: 5, except: "me").isEmpty)
        #expect(watch.silent(in: beats, now: 1, defaultLease: 5, except: "me").map(\.node) == ["hasty"])
        #expect(watch.silent(in: beats, now: 6, defaultLease: 5, except: "me").map(\.node) == ["hasty", "plain"])
        #expect(watch.silent(in: beats, now: 61, defaultLease: 5, except: "me").map(\.node) == ["hasty", "patient", "plain"])
    }

    /// The holder of this node's own name, watched before the name is taken from it: as any node, by its lease.
    @Test func theHolderOfThisNodesNameIsWatchedAsAnyNode() {
        var watch = SilenceWatch()
        let reads = [(beat("me", 1, lease: 3), 0.0), (beat("me", 1, lease: 3), 2.9), (beat("me", 1, lease: 3), 3.1),
                     (beat("me", 2, lease: 3), 3.2), (beat("me", 2), 8.1), (beat("me", 2), 8.3)]
        let silent = reads.map { watch.isSilent($0.0, now: $0.1, defaultLease: 5) }
        // Silent after its lease (3 s); not once it beat; without a lease recorded, after the watcher's (5 s).
        #expect(silent == [false, false, true, false, false, true])
    }

    /// Taken over at a beat: not reported again (no takeover statement every round for a node that stays dead) until
    /// it beats again; one the takeover skipped (beating at that instant) is reported again.
    @Test func aNodeTakenOverIsReportedAgainOnlyAfterItBeatsAgain() {
        var watch = SilenceWatch()
        _ = watch.silent(in: [beat("a", 1), beat("b", 1)], now: 0, defaultLease: 5, except: "me")
        #expect(watch.silent(in: [beat("a", 1), beat("b", 1)], now: 6, defaultLease: 5, except: "me").map(\.node) == ["a", "b"])
        watch.tookOver(["a"])
        #expect(watch.silent(in: [beat("a", 1), beat("b", 1)], now: 7, defaultLease: 5, except: "me").map(\.node) == ["b"])
        #expect(watch.silent(in: [beat("a", 2), beat("b", 1)], now: 8, defaultLease: 5, except: "me").map(\.node) == ["b"])
        #expect(watch.silent(in: [beat("a", 2), beat("b", 1)], now: 13.1, defaultLease: 5, except: "me").map(\.node) == ["a", "b"])
        // A node gone from the table is forgotten: seen anew if it comes back.
        #expect(watch.silent(in: [beat("b", 1)], now: 14, defaultLease: 5, except: "me").map(\.node) == ["b"])
        #expect(watch.silent(in: [beat("a", 2), beat("b", 1)], now: 15, defaultLease: 5, except: "me").map(\.node) == ["b"])
    }
}
