// GroupCommit and BatchingStage: every continuation runs after a commit that began after it was asked for (never
// one already under way, whose sync may have missed the caller's writes), one commit at a time, shared by all who
// asked meanwhile; a failed commit reaches exactly those it covered.

@testable import Daemon
import Foundation
import SpoolFiles
import Synchronization
import Testing
import SystemCalls
import TestTraits

@Suite("GroupCommit", .onItsOwnExecutor)
struct GroupCommitTests {
    /// What the fake commit saw: how many began and ended, and whether two ever overlapped.
    final class Disk: Sendable {
        struct State {
            var begun = 0
            var ended = 0
            var inside = 0
            var overlapped = false
            var failOn: Set<Int> = []
        }
        let state = Mutex(State())

        func commit() throws {
            let n = state.withLock { s -> Int in
                s.begun += 1
                s.inside += 1
                if s.inside > 1 { s.overlapped = true }
                return s.begun
            }
            usleep(2_000)
            let fail = state.withLock { s -> Bool in
                s.inside -= 1
                s.ended += 1
                return s.failOn.contains(n)
            }
            if fail { throw SpoolError(operation: "syncfs", path: "/spool", errno: EIO) }
        }
    }

    @Test func everyContinuationFollowsACommitBegunAfterItsCall() async throws {
        let disk = Disk()
        let commits = GroupCommit(label: "test.commit") { try disk.commit() }
        let threads = 8, each = 50
        let violations = Mutex(0), ran = Mutex(0)
        let done = DispatchGroup()
        for _ in 0..<threads {
            // Threads of their own: all eight ask at once (a dispatch pool may run two at a time here).
            done.enter()
            Thread.detachNewThread {
                defer { done.leave() }
                for _ in 0..<each {
                    // Commits begun before the call cannot cover it: the one that does must end after the call.
                    let begunBefore = disk.state.withLock { $0.begun }
                    let finished = DispatchSemaphore(value: 0)
                    commits.after { outcome in
                        let ended = disk.state.withLock { $0.ended }
                        if ended <= begunBefore { violations.withLock { $0 += 1 } }
                        if case .failure = outcome { violations.withLock { $0 += 1 } }
                        ran.withLock { $0 += 1 }
                        finished.signal()
                    }
                    finished.wait()
                }
            }
        }
        done.wait()
        #expect(ran.withLock { $0 } == threads * each)
        #expect(violations.withLock { $0 } == 0)
        #expect(disk.state.withLock { $0.overlapped } == false)
        // Eight callers asking at once share commits: far fewer syncs than requests.
        #expect(disk.state.withLock { $0.begun } < threads * each / 2)
    }

    @Test func aFailedCommitReachesThoseItCoveredAndTheNextOneWorks() throws {
        let disk = Disk()
        disk.state.withLock { $0.failOn = [1] }
        let commits = GroupCommit(label: "test.commit") { try disk.commit() }
        #expect(throws: SpoolError.self) { try commits.now() }
        try commits.now()
        #expect(disk.state.withLock { $0.begun } == 2)
    }

    @Test func aBatchingStageTakesWhatWaitedInOneCall() {
        let calls = Mutex<[[Int]]>([])
        let done = DispatchSemaphore(value: 0)
        let stage = BatchingStage<Int>(label: "test.stage") { items in
            calls.withLock { $0.append(items) }
            if items.contains(0) { usleep(20_000) }  // the first call is slow: the rest wait for it, together
            if items.contains(99) { done.signal() }
        }
        for i in 0..<100 { stage.add(i) }
        done.wait()
        let seen = calls.withLock { $0 }
        #expect(seen.flatMap { $0 } == Array(0..<100))
        #expect(seen.count <= 3)
    }

    /// A paced stage's first round after a quiet spell goes at once; the next waits out the spacing since that one
    /// began, unless its cap (by weight) already waits.
    @Test func aPacedStageWaitsOutItsSpacingUnlessItsCapWaits() {
        let rounds = Mutex<[(items: [Int], at: Double)]>([])
        let release = DispatchSemaphore(value: 0), took = DispatchSemaphore(value: 0)
        let pacing = BatchingStage<Int>.Pacing(spacing: 3, cap: 10, weight: { $0 })
        let stage = BatchingStage<Int>(label: "test.paced", pacing: pacing) { items in
            rounds.withLock { $0.append((items, monotonicSeconds())) }
            took.signal()
            if items == [1] { release.wait() }
        }
        let start = monotonicSeconds()
        stage.add(1)
        took.wait()
        // While the first round runs: 4 + 5 weigh less than the cap and wait for the spacing; 6 more reach it.
        stage.add(4)
        stage.add(5)
        release.signal()
        usleep(100_000)
        #expect(rounds.withLock { $0.count } == 1, "under the cap, the second round waits for the spacing")
        stage.add(6)
        took.wait()
        stage.add(2)
        took.wait()
        let seen = rounds.withLock { $0 }
        #expect(seen.map(\.items) == [[1], [4, 5, 6], [2]])
        #expect(seen[0].at - start < 2.5, "the first round after a quiet spell goes at once")
        #expect(seen[1].at - seen[0].at < 2.5, "the cap reached, the round goes before the spacing has passed")
        #expect(seen[2].at - seen[1].at >= 3, "a round under the cap waits out the spacing since the last began")
    }
}
