// The outbox's retention (SPEC §6 outbox.keepDays): ended jobs' folders whose finishedAt is more than keepDays ago
// are removed at start and then at least once a minute, on a thread of its own at utility priority, a batch of
// `retentionBatch` at a time with a pause between batches. Claims and publications (on `work`) never wait for it,
// and removing a large outbox does not take the disk from them for long at a stretch. The removal is
// Stores/Outbox.swift's (through tmp/: a reader sees a folder whole or not at all), the same as `opqueuectl clean`'s.
// A reload's keepDays applies from the next pass; without keepDays the thread only looks again each minute.

import JobModel
import CShims
import Foundation
import Logging
import SystemCalls

extension Daemon {
    /// Entries looked at per batch, and the pause after each batch: small, so that the group commit has
    /// little of the retention's to flush (100 and 20 ms raised pickup's p99 during a prune of 50,000 folders to
    /// 12 ms; these keep it within the idle figures, docs/benchmarks.md).
    static let retentionBatch = 25
    static let retentionPause = 0.01
    /// The longest wait between two passes.
    static let retentionInterval = 60.0

    /// Starts the retention's thread (called once recovery is done); it ends when the daemon stops.
    func startRetention() {
        let thread = Thread { [weak self] in
            // Utility's nice value (QualityOfService): behind the jobs' own work, never starved of the CPU.
            _ = opq_set_thread_priority(10, 0)
            while let delay = self?.retentionPass() {
                let until = monotonicSeconds() + delay
                while monotonicSeconds() < until {
                    guard let daemon = self, !daemon.isStopping else { return }
                    Thread.sleep(forTimeInterval: min(1, until - monotonicSeconds()))
                }
            }
        }
        thread.name = "opqueued.retention"
        thread.start()
    }

    /// Whether the daemon is stopping (SIGTERM): the retention ends.
    var isStopping: Bool { shared.withLock { s in s.lifecycle.admission == .stopping } }

    /// One pass over the outbox; the seconds until the next, or nil when the daemon is stopping.
    func retentionPass() -> Double? {
        let keepDays = shared.withLock { s in s.configuration.outboxKeepDays }
        guard !isStopping else { return nil }
        guard let keepDays else { return Self.retentionInterval }
        let keepSeconds = keepDays * 86_400
        let (outbox, tmp) = (store.outbox.folder, store.outbox.tmp)
        let sweep: OutboxSweep
        do {
            sweep = try OutboxSweep(outbox: outbox, tmp: tmp, criteria: .init(cutoff: Date().timeIntervalSince1970 - keepSeconds))
        } catch {
            logger.error("outbox.keepDays: \(error); nothing was removed", metadata: ["OPQ_EVENT": "daemon"])
            return Self.retentionInterval
        }
        var removed = 0, failed = 0, firstFailure: String?
        while sweep.step(limit: Self.retentionBatch, report: { event in
            switch event {
            case .removed: removed += 1
            case .failed(_, let problem):
                failed += 1
                firstFailure = firstFailure ?? problem.description
            case .unreadable: break  // someone's own folder: left alone, as `opqueuectl clean` leaves it
            }
        }) {
            if isStopping { break }
            Thread.sleep(forTimeInterval: Self.retentionPause)
        }
        // As given: 0.0001 is not "0.0".
        let days = String(format: "%g", keepDays)
        if removed > 0 {
            event(.info, "outbox: removed \(removed) ended job folder(s) finished more than \(days) day(s) ago (outbox.keepDays)",
                  ["OPQ_EVENT": "daemon"])
        }
        if let firstFailure {
            let problem = "\(failed) ended job folder(s) older than \(days) day(s) could not be removed, the first: \(firstFailure)"
            logger.warning("outbox: \(problem)", metadata: ["OPQ_EVENT": "daemon"])
        }
        // Within a tenth of keepDays of its time, and at least once a minute.
        return min(Self.retentionInterval, max(1, keepSeconds / 10))
    }
}
