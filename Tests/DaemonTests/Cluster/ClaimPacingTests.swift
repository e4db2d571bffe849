// ClaimPacing: a busy node puts small claim rounds off while more jobs wait, for at most its patience; an idle node,
// or one whose last round found fewer jobs than it asked for, claims at once. No I/O.

@testable import Daemon
import Testing
import TestTraits

@Suite(.onItsOwnExecutor) struct ClaimPacingTests {
    @Test func anIdleNodeClaimsAtOnce() {
        var pacing = ClaimPacing()
        #expect(pacing.decide(limit: 1, held: 0, slots: 64, now: 0) == .claim)
        #expect(pacing.decide(limit: 1, held: 60, slots: 64, now: 0) == .claim, "no round came back full yet")
        pacing.claimed(rows: 3, limit: 64)
        #expect(pacing.decide(limit: 1, held: 60, slots: 64, now: 1) == .claim, "the last round found less than it asked")
    }

    @Test func aBusyNodePutsASmallRoundOffWhileMoreWaits() {
        var pacing = ClaimPacing()
        pacing.claimed(rows: 64, limit: 64)
        let patience = ClaimPacing.patience
        #expect(pacing.decide(limit: 3, held: 61, slots: 64, now: 10) == .putOff(until: 10 + patience))
        // Asked again before its time (another slot freed): still put off, to the same time.
        #expect(pacing.decide(limit: 4, held: 60, slots: 64, now: 10 + patience / 2) == .putOff(until: 10 + patience))
        // A round's worth of room: at once.
        #expect(pacing.decide(limit: ClaimPacing.round(slots: 64), held: 48, slots: 64, now: 10 + patience / 2) == .claim)
        pacing.claimed(rows: 16, limit: 16)
        // Put off again, and claimed once its patience has run out, whatever the room.
        #expect(pacing.decide(limit: 2, held: 62, slots: 64, now: 20) == .putOff(until: 20 + patience))
        #expect(pacing.decide(limit: 2, held: 62, slots: 64, now: 20 + patience) == .claim)
    }

    @Test func aNodeAboutToRunDryClaimsAtOnce() {
        var pacing = ClaimPacing()
        pacing.claimed(rows: 8, limit: 8)
        let round = ClaimPacing.round(slots: 64)
        #expect(pacing.decide(limit: round - 1, held: round - 1, slots: 64, now: 0) == .claim)
        #expect(pacing.decide(limit: 1, held: 1, slots: 1, now: 0) == .claim, "one slot: every round is a round's worth")
        pacing.reset()
        #expect(pacing.decide(limit: 1, held: 60, slots: 64, now: 0) == .claim, "after a reset nothing is known to wait")
    }
}
