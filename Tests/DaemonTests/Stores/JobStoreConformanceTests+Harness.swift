// The conformance suite's delegate and waits: a delegate that hands every call on to the FakeShell and records
// what the FakeShell does not (`submitted`), and a bounded check that something does NOT happen.

import Foundation
import Testing
@testable import Daemon
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

/// The store's delegate in the conformance suite: every call reaches `shell`; `submitted` is kept here too.
final class RecordingShell: JobStoreDelegate, @unchecked Sendable {
    let shell: FakeShell
    private let lock = NSLock()
    private var _submitted: [(manifest: String, inode: UInt64?, job: String)] = []
    private var _calls = 0

    init(_ shell: FakeShell) { self.shell = shell }

    /// What `submitted` was told, in order.
    var submittedIDs: [(manifest: String, inode: UInt64?, job: String)] { lock.withLock { _submitted } }
    /// How many calls of any kind reached the delegate (`holds`, `spoolStalledSeconds`, `progress` aside: questions).
    var calls: Int { lock.withLock { _calls } }

    private func count() { lock.withLock { _calls += 1 } }

    func run(_ jobs: [ClaimedJob]) { count(); shell.run(jobs) }
    func lost(_ jobs: [String], reason: String) { count(); shell.lost(jobs, reason: reason) }
    func forgotten(_ jobs: [String], reason: String) { count(); shell.forgotten(jobs, reason: reason) }
    func cancel(job: String, operation: String?) { count(); shell.cancel(job: job, operation: operation) }
    func suspendedQueuesChanged(_ queues: Set<String>) { count(); shell.suspendedQueuesChanged(queues) }
    func spoolFailed(_ what: String, _ error: any Error) { count(); shell.spoolFailed(what, error) }
    func holds(job: String) -> Bool { shell.holds(job: job) }
    func spoolStalledSeconds() -> Double { shell.spoolStalledSeconds() }
    func submitted(_ ids: [(manifest: String, inode: UInt64?, job: String)]) {
        lock.withLock {
            _calls += 1
            _submitted += ids
        }
    }
}

/// Whether `condition` holds throughout `seconds` (polled every 20 ms; false as soon as it does not): for what a
/// store must NOT do, given time to do it.
func holdsThroughout(_ seconds: Double, _ condition: () throws -> Bool) rethrows -> Bool {
    let end = monotonicSeconds() + seconds
    while monotonicSeconds() < end {
        if try !condition() { return false }
        usleep(20_000)
    }
    return try condition()
}

extension JobStoreNode {
    /// The ids `run` has been given so far, in order.
    var ranIDs: [String] { shell.ran.map(\.job.id) }

    /// Waits until the store knows `job` (a store that places jobs: its row inserted); true at once for a store that
    /// keeps no records.
    func known(_ job: String, within seconds: Double = 20) -> Bool {
        guard store.capabilities.contains(.placesJobs) else { return true }
        return eventually(seconds) { ((try? store.job(job)) ?? nil) != nil }
    }
}
