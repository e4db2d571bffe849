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

/// The schema as this code knows it, for the store's users.
public enum ClusterSchema {
    /// The newest schema version this code knows (a database may be newer when it says this code may still run).
    public static var newest: Int { Migrations.newest }
}
