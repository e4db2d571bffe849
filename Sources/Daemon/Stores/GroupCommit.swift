// GroupCommit: the spool's commits (one syncfs each), made on a thread of their own and shared by everyone who
// asks while one is under way.
//
// `after(_:)` registers a continuation; it runs once a commit that began after the call has ended, with that
// commit's outcome. One commit at a time: whatever is asked while one runs is covered by the next one, so the
// publications of many batches waiting together cost one syncfs — and the thread that asked (the daemon's `work`
// queue) goes on staging and accepting jobs while the disk syncs, instead of waiting for it.
//
// Continuations run on the committer's thread, one after another, before the next commit starts: they must only
// hand work on (dispatch it elsewhere), never wait for a commit themselves.

import Foundation
import Synchronization

/// A stage of a pipeline that takes whatever has accumulated at once: `add` appends; while `process` runs, what is
/// added waits and goes in the next call, so a slow step (a sync, a database round trip) is paid once per round,
/// however many asked meanwhile. One call at a time, on the stage's own queue.
final class BatchingStage<Item: Sendable>: Sendable {
    private struct State {
        var waiting: [Item] = []
        var running = false
    }

    private let state = Mutex(State())
    private let queue: DispatchQueue
    private let process: @Sendable ([Item]) -> Void

    init(label: String, process: @escaping @Sendable ([Item]) -> Void) {
        self.queue = DispatchQueue(label: label)
        self.process = process
    }

    func add(_ item: Item) {
        let start = state.withLock { state -> Bool in
            state.waiting.append(item)
            if state.running { return false }
            state.running = true
            return true
        }
        if start { queue.async { [self] in drain() } }
    }

    private func drain() {
        while true {
            let batch = state.withLock { state -> [Item] in
                let batch = state.waiting
                state.waiting = []
                if batch.isEmpty { state.running = false }
                return batch
            }
            if batch.isEmpty { return }
            process(batch)
        }
    }
}

final class GroupCommit: Sendable {
    typealias Continuation = @Sendable (Result<Void, any Error>) -> Void

    private let stage: BatchingStage<Continuation>

    /// `commit` makes everything written so far durable (Spool.commit, with the daemon's progress accounting).
    init(label: String, commit: @escaping @Sendable () throws -> Void) {
        stage = BatchingStage(label: label) { continuations in
            let outcome = Result { try commit() }
            for continuation in continuations { continuation(outcome) }
        }
    }

    /// Runs `continuation` once a commit that began after this call has ended.
    func after(_ continuation: @escaping Continuation) {
        stage.add(continuation)
    }

    /// Waits for a commit that began after this call, and throws its error. Never from a continuation.
    func now() throws {
        let done = DispatchSemaphore(value: 0)
        let outcome = Mutex<Result<Void, any Error>>(.success(()))
        after { result in
            outcome.withLock { $0 = result }
            done.signal()
        }
        done.wait()
        try outcome.withLock { $0 }.get()
    }
}
