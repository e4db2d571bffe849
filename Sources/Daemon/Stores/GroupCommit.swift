// GroupCommit: the spool's commits (SpoolSync.swift says how each is made), made on a thread of their own and
// shared by everyone who asks while one is under way.
//
// `after(_:)` registers a continuation; it runs once a commit that began after the call has ended, with that
// commit's outcome. One commit at a time: whatever is asked while one runs is covered by the next one, so the
// publications of many batches waiting together cost one commit — and the thread that asked (the daemon's `work`
// queue) goes on staging and accepting jobs while the disk syncs, instead of waiting for it.
//
// Continuations run on the committer's thread, one after another, before the next commit starts: they must only
// hand work on (dispatch it elsewhere), never wait for a commit themselves.

import Foundation
import Synchronization
import SystemCalls

/// A stage of a pipeline that takes whatever has accumulated at once: `add` appends; while `process` runs, what is
/// added waits and goes in the next call, so a slow step (a sync, a database round trip) is paid once per round,
/// however many asked meanwhile. One call at a time, on the stage's own queue.
///
/// With `pacing`, a round also waits until `spacing` seconds have passed since the last one began, unless `cap` (by
/// `weight`) already waits: under a steady flow its rounds grow to what arrives in `spacing`, while the first item
/// after a quiet spell goes at once.
final class BatchingStage<Item: Sendable>: Sendable {
    struct Pacing: Sendable {
        var spacing: Double
        var cap: Int
        var weight: @Sendable (Item) -> Int
    }

    private struct State {
        var waiting: [Item] = []
        var weight = 0
        var running = false
        var lastStart = -Double.infinity
    }

    private let state = Mutex(State())
    private let queue: DispatchQueue
    private let pacing: Pacing?
    /// Signalled when `cap` is reached while a round may be waiting out its spacing.
    private let capReached = DispatchSemaphore(value: 0)
    private let process: @Sendable ([Item]) -> Void

    init(label: String, pacing: Pacing? = nil, process: @escaping @Sendable ([Item]) -> Void) {
        self.queue = DispatchQueue(label: label)
        self.pacing = pacing
        self.process = process
    }

    func add(_ item: Item) {
        let added = pacing?.weight(item) ?? 1
        let (start, full) = state.withLock { state -> (Bool, Bool) in
            state.waiting.append(item)
            let before = state.weight
            state.weight += added
            let full = pacing.map { before < $0.cap && state.weight >= $0.cap } ?? false
            if state.running { return (false, full) }
            state.running = true
            return (true, false)
        }
        if start { queue.async { [self] in drain() } }
        if full { capReached.signal() }
    }

    private func drain() {
        while true {
            pace()
            let batch = state.withLock { state -> [Item] in
                let batch = state.waiting
                state.waiting = []
                state.weight = 0
                if batch.isEmpty { state.running = false } else { state.lastStart = monotonicSeconds() }
                return batch
            }
            if batch.isEmpty { return }
            process(batch)
        }
    }

    /// Waits out the spacing since the last round began, unless `cap` waits (or nothing does: the drain ends).
    private func pace() {
        guard let pacing else { return }
        while true {
            let (weight, due) = state.withLock { ($0.weight, $0.lastStart + pacing.spacing) }
            let now = monotonicSeconds()
            if weight == 0 || weight >= pacing.cap || now >= due { return }
            _ = capReached.wait(timeout: .now() + (due - now))
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
