// How a job ended (SPEC §3.4): result.plist's `status`, the journal's OPQ_STATUS, `opqueued_jobs_total{status}`.

import OperationEngine

public enum JobStatus: String, Sendable, CaseIterable {
    /// Every operation succeeded.
    case succeeded
    /// At least one operation failed.
    case failed
    /// Cancelled by request or deadline, none failed.
    case cancelled
    /// Never ran: its manifest had problems.
    case rejected

    /// The status of a job whose operations ended in `states`.
    public init(ended states: some Sequence<OperationState>) {
        var status = JobStatus.succeeded
        for state in states {
            if state == .failed { self = .failed; return }
            if state == .cancelled { status = .cancelled }
        }
        self = status
    }
}
