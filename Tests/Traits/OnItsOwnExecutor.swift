// A suite trait for tests that block or await: each test's body runs on a serial executor of its own, in one of a
// few lanes.
//
// Under a full run the shared cooperative pool has one thread per core (two in CI). A synchronous test that polls
// with usleep or waits for a process holds one of those threads for seconds: two such tests stopped every other
// suite, and the run's length was the sum of its slowest suites' sleeps. A body awaiting on that pool meanwhile saw
// nothing for tens of seconds while what it waited for had long happened. With this trait a body runs on a thread
// of its own (as the code under test does: ClusterExecutor), and the lanes bound how many
// such bodies run at once: enough to overlap their waiting, few enough that two cores still run each on time.
// `OPQ_TEST_LANES` sets the number (default 3 per core, at least 4).

import Dispatch
import Foundation
import Synchronization
import Testing

public struct OnItsOwnExecutor: SuiteTrait, TestTrait, TestScoping {
    public init() {}

    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        // Applied twice (a suite's and a nested suite's), the test still takes one lane.
        if TestLanes.holding { return try await function() }
        await TestLanes.shared.enter()
        defer { TestLanes.shared.leave() }
        try await TestLanes.$holding.withValue(true) {
            try await withTaskExecutorPreference(TestBodyExecutor()) { try await function() }
        }
    }
}

extension Trait where Self == OnItsOwnExecutor {
    /// Each test's body on a serial executor of its own, off the shared cooperative pool, in one of a few lanes.
    public static var onItsOwnExecutor: Self { OnItsOwnExecutor() }
}

/// A counting semaphore whose waiters hold no thread: a test waiting for a lane is a suspended task.
final class TestLanes: Sendable {
    static let shared = TestLanes(lanes: ProcessInfo.processInfo.environment["OPQ_TEST_LANES"].flatMap { Int($0) }
                                    ?? max(4, 3 * ProcessInfo.processInfo.activeProcessorCount))

    /// Whether this task holds a lane.
    @TaskLocal static var holding = false

    private struct State {
        var free: Int
        var waiting: [CheckedContinuation<Void, Never>] = []
    }

    private let state: Mutex<State>

    init(lanes: Int) {
        state = Mutex(State(free: max(1, lanes)))
    }

    func enter() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                if state.free > 0 {
                    state.free -= 1
                    return true
                }
                state.waiting.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    func leave() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiting.isEmpty {
                state.free += 1
                return nil
            }
            return state.waiting.removeFirst()
        }
        next?.resume()
    }
}

/// A serial queue as a task executor: the body's thread is a dispatch worker, not one of the cooperative pool's.
final class TestBodyExecutor: TaskExecutor, Sendable {
    private let queue = DispatchQueue(label: "test-body")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
