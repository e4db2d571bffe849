// PostgresClusterStore's start grants for clusterRateLimit (SPEC §3.7 "At a rate", schema 9): how many of a queue's
// operations may start now across the cluster, and the reports of which grants were used.

import PostgresNIO

/// Start grants of a queue (`ClusterStore.grantStarts`).
public struct StartGrants: Sendable, Equatable {
    /// One per start granted.
    public var ids: [Int64]
    /// When the next grant frees, in seconds since the epoch on the database's clock; nil when one is free now.
    public var nextFree: Double?
    /// The database's clock when it granted (to read `nextFree` on another clock).
    public var databaseNow: Double

    public init(ids: [Int64], nextFree: Double?, databaseNow: Double) {
        self.ids = ids
        self.nextFree = nextFree
        self.databaseNow = databaseNow
    }
}

extension PostgresClusterStore {
    public func grantStarts(queue: String, node: String, wanted: Int, limit: Int, seconds: Double,
                            useWithin: Double) async throws -> StartGrants {
        var binds = PostgresBindings()
        binds.append(queue)
        binds.append(node)
        binds.append(Int32(clamping: max(0, wanted)))
        binds.append(Int32(clamping: limit))
        binds.append(seconds)
        binds.append(useWithin)
        let rows = try await query(Queries.grantStarts, binds, doing: "asking for start grants of queue \(queue)")
        guard let row = rows.first else {
            throw ClusterStoreError(.badRow, "asking for start grants of queue \(queue): no answer")
        }
        let c = row.makeRandomAccess()
        return StartGrants(ids: try decode(c[0], [Int64].self), nextFree: try decode(c[1], Double?.self),
                           databaseNow: try decode(c[2], Double.self))
    }

    public func settleStarts(node: String, used: [Int64], unused: [Int64]) async throws {
        guard !used.isEmpty || !unused.isEmpty else { return }
        var binds = PostgresBindings()
        binds.append(node)
        binds.append(used)
        binds.append(unused)
        _ = try await query(Queries.settleStarts, binds, doing: "reporting the start grants node \(node) used")
    }
}
