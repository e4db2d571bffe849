// A suite trait for tests that await: each test's body runs on a serial executor of its own.
//
// Under a full run the shared cooperative pool has one thread per core (two in CI), and the synchronous tests of
// the suites running beside hold them for seconds at a time (they poll with usleep, wait for processes). A body
// awaiting on that pool — its polls, its deadlines measured while it could not run — then saw nothing for tens of
// seconds while what it waited for had long happened (ClusterPermits waited 20 s for a wait that lasted 8;
// store tests that take 2 s alone took 160). The code under test runs on executors of its own (ClusterExecutor);
// with this, so does the test that watches it.

import ClusterStore
import Testing

public struct OnItsOwnExecutor: SuiteTrait, TestTrait, TestScoping {
    public init() {}

    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        try await withTaskExecutorPreference(ClusterExecutor(label: "test-body")) { try await function() }
    }
}

extension Trait where Self == OnItsOwnExecutor {
    /// Each test's body on a serial executor of its own, off the shared cooperative pool.
    public static var onItsOwnExecutor: Self { OnItsOwnExecutor() }
}
