// The cluster's history for `opqueuectl list` (SPEC §1): finished jobs a page at a time, newest first, so that a
// long history is listed in bounded memory per page and each page is one short statement.

import NIOCore
import PostgresNIO

/// A finished job as the database keeps it: its result.plist, whichever node ran it.
public struct FinishedJob: Sendable, Equatable {
    public var id: String
    public var status: String
    public var node: String?
    public var finishedAt: Double
    public var result: [UInt8]?
}

/// Where the next page of the history starts: after this job (finished_at in microseconds, exact).
public struct HistoryCursor: Sendable, Equatable {
    public var finishedMicros: Int64
    public var id: String
}

extension PostgresClusterStore {
    public func finishedJobs(before cursor: HistoryCursor?, since: Double?, limit: Int) async throws
        -> (jobs: [FinishedJob], next: HistoryCursor?) {
        var binds = PostgresBindings()
        binds.append(cursor?.finishedMicros)
        binds.append(cursor?.id)
        binds.append(since)
        binds.append(limit)
        var next: HistoryCursor?
        let jobs = try await query(Queries.finishedJobs, binds, doing: "reading the finished jobs").map { row in
            let c = row.makeRandomAccess()
            let job = FinishedJob(id: try decode(c[0], String.self), status: try decode(c[1], String?.self) ?? "",
                                  node: try decode(c[2], String?.self), finishedAt: try decode(c[3], Double.self),
                                  result: try decode(c[4], ByteBuffer?.self).map { Array($0.readableBytesView) })
            next = HistoryCursor(finishedMicros: try decode(c[5], Int64.self), id: job.id)
            return job
        }
        return (jobs, jobs.count < limit ? nil : next)
    }
}
