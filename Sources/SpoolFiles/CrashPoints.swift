// Crash points: named moments in the spool protocol where the reliability campaign kills the daemon
// with SIGKILL, so that the narrow windows (between a claim's rename and its commit, between a
// result's staging and its rename into the outbox, …) are hit for certain rather than by luck.
//
// Off unless OPQUEUED_CRASH_POINTS is set in the environment, as `name:N[,name:N…]`: the Nth time the
// daemon reaches `name` it sends itself SIGKILL. Off, a point costs one load of a nil constant.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

public enum CrashPoint: String, CaseIterable, Sendable {
    /// active/<job>/ made and its record set, the manifest not yet moved out of the inbox.
    case claimRecorded = "claim.recorded"
    /// The manifest renamed into active/<job>/, the claim not yet committed.
    case claimRenamed = "claim.renamed"
    /// A progress line appended, not yet committed.
    case progressAppended = "progress.appended"
    /// A `write` operation's hidden .part file written, not yet renamed.
    case writePart = "write.part"
    /// result.plist written into active/<job>/, not yet committed.
    case publishStaged = "publish.staged"
    /// active/<job>/ renamed to outbox/<job>/, not yet committed.
    case publishPlaced = "publish.placed"
    /// The progress log's compacted copy written, not yet renamed over the log.
    case progressRewritten = "progress.rewritten"

    private static let plan: [String: Int]? = {
        guard let text = ProcessInfo.processInfo.environment["OPQUEUED_CRASH_POINTS"], !text.isEmpty else { return nil }
        var plan: [String: Int] = [:]
        for item in text.split(separator: ",") {
            let parts = item.split(separator: ":")
            if parts.count == 2, let n = Int(parts[1]), n > 0 { plan[String(parts[0])] = n }
        }
        return plan
    }()
    private static let counts = CrashCounts()

    /// Marks that the daemon is at this point; kills it if the campaign asked for this hit.
    @inline(__always)
    public func reached() {
        guard let plan = Self.plan, let target = plan[rawValue] else { return }
        if Self.counts.increment(rawValue) == target { kill(getpid(), SIGKILL) }
    }
}

private final class CrashCounts: @unchecked Sendable {
    private let lock = NSLock()
    private var counts: [String: Int] = [:]
    func increment(_ name: String) -> Int {
        lock.withLock {
            counts[name, default: 0] += 1
            return counts[name] ?? 0
        }
    }
}
