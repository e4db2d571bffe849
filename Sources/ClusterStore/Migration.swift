// A numbered schema migration, embedded from SQL/NNNN_name.up.sql and .down.sql by SQL/generate.py.

public struct Migration: Sendable {
    public let version: Int
    public let name: String
    public let up: [String]
    public let down: [String]
}

extension Migrations {
    /// The newest schema version this code knows.
    public static var newest: Int { all.last?.version ?? 0 }
}
