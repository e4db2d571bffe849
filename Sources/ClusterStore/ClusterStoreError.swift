// Errors of the cluster store: what was being done and what went wrong, never a password or a bound value.
//
// postgres-nio's PSQLError hides everything behind a generic description on purpose, and its debug
// description prints the query's binds (manifest bytes); so the server's own message and SQLSTATE, or the
// connection failure, are copied out here explicitly and nothing else is.

import PostgresNIO

public struct ClusterStoreError: Error, CustomStringConvertible, Sendable {
    public enum Kind: Sendable, Equatable {
        /// The database URL or the password file is wrong.
        case configuration
        /// The server could not be reached or refused the login.
        case connection
        /// The server refused a statement.
        case server
        /// The database's schema is newer than this code.
        case schemaTooNew
        /// A row did not hold what the schema promises.
        case badRow
    }

    public let kind: Kind
    public let description: String
    /// The server's SQLSTATE when it sent one (e.g. 28P01 for a failed password).
    public let sqlState: String?
    /// What went wrong without what was being done: the SQLSTATE, or the driver's failure (e.g. "cannot connect to
    /// the database"). Two errors with the same cause are the same trouble met by two statements.
    public let cause: String

    public init(_ kind: Kind, _ description: String, sqlState: String? = nil, cause: String? = nil) {
        self.kind = kind
        self.description = description
        self.sqlState = sqlState
        self.cause = sqlState ?? cause ?? description
    }

    /// `error` met while `doing`, as a store error that is safe to log.
    static func wrapping(_ error: any Error, doing: String) -> ClusterStoreError {
        if let error = error as? ClusterStoreError { return error }
        if let error = error as? PSQLError {
            if let info = error.serverInfo, let message = info[.message] {
                // The detail is left out: it may quote a row (a manifest's bytes).
                var text = "\(doing): the server said: \(message)"
                let state = info[.sqlState]
                // 42501 insufficient_privilege, 3F000 invalid_schema_name ("no schema has been selected to create
                // in"): the role lacks a GRANT, which the server's message alone does not say.
                if state == "42501" || state == "3F000" { text += " (\(privilegesHint))" }
                // 25006 read_only_sql_transaction: a standby (a failover that left the URL behind) or
                // default_transaction_read_only; the node waits for writes as for a connection.
                if state == "25006" { text += " (\(readOnlyHint))" }
                // Class 28 is "invalid authorization", 08 "connection exception", 3D "invalid catalog name".
                let kind: Kind = state.map { $0.hasPrefix("28") || $0.hasPrefix("08") || $0 == "3D000" } == true
                    ? .connection : .server
                return ClusterStoreError(kind, text, sqlState: state)
            }
            var text = "\(doing): \(describe(error.code))"
            // An underlying PSQLError would print only its generic description: the server's message (a session
            // ended by a shutdown or pg_terminate_backend says so) or its code says what it was.
            switch error.underlying {
            case let inner as PSQLError:
                if let message = inner.serverInfo?[.message] { text += ": the server said: \(message)" }
                else if inner.code != error.code { text += ": \(describe(inner.code))" }
            case nil: break
            case let underlying?: text += ": \(describe(underlying: underlying))"
            }
            return ClusterStoreError(.connection, text, cause: describe(error.code))
        }
        if let error = error as? PostgresDecodingError {
            return ClusterStoreError(.badRow, "\(doing): column \(error.columnName) is not a \(error.targetType)")
        }
        // postgres-nio's pool errors (its module is not ours to import): the one a node meets is a statement that
        // waited in a pool the node replaced by a fresh one (`reconnect`).
        if "\(error)".contains("poolShutdown") {
            return ClusterStoreError(.connection, "\(doing): its pool of connections was replaced by a fresh one while it waited",
                                     cause: "pool replaced")
        }
        return ClusterStoreError(.connection, "\(doing): \(error)", cause: "\(error)")
    }

    /// What a refused write means (SQLSTATE 25006).
    static let readOnlyHint = "the database takes no writes: is cluster.database a standby, or default_transaction_read_only on?"

    /// What the role must be given, for errors that come from a missing GRANT (README, "The cluster").
    static let privilegesHint = "the role needs CONNECT on the database and USAGE, CREATE on its schema, and every node "
        + "must log in as the role that created the tables or a member of it: README, The cluster"

    /// A failure under the driver's: a TLS handshake's (swift-nio-ssl prints BoringSSL's error stack, with the source
    /// file of each entry) by the reasons BoringSSL gave and what the common ones mean; anything else as it prints.
    static func describe(underlying error: any Error) -> String {
        let text = "\(error)"
        guard text.contains("handshakeFailed") || text.contains("BoringSSL") else { return text }
        // Entries read "error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER at /…/tls_record.cc:127".
        var reasons: [String] = []
        for entry in text.split(separator: "OPENSSL_internal:").dropFirst() {
            let reason = String(entry.prefix { $0.isUppercase || $0.isNumber || $0 == "_" })
            if !reason.isEmpty && !reasons.contains(reason) { reasons.append(reason) }
        }
        var said = "the TLS handshake failed" + (reasons.isEmpty ? "" : ": " + reasons.joined(separator: ", "))
        if reasons.contains("WRONG_VERSION_NUMBER") || reasons.contains("PACKET_LENGTH_TOO_LONG") {
            said += " (what answered does not speak TLS)"
        } else if reasons.contains("CERTIFICATE_VERIFY_FAILED") {
            said += " (the server's certificate is not signed by sslrootcert's authority, or does not name the URL's host)"
        }
        return said
    }

    private static func describe(_ code: PSQLError.Code) -> String {
        switch code {
        case .connectionError: return "cannot connect to the database"
        case .serverClosedConnection: return "the database closed the connection"
        case .clientClosedConnection: return "the connection was closed"
        case .sslUnsupported: return "the server does not support TLS, which sslmode requires"
        case .failedToAddSSLHandler: return "TLS could not be set up"
        case .authMechanismRequiresPassword: return "the server asks for a password and none was given (passwordFile)"
        case .unsupportedAuthMechanism: return "the server asks for an authentication method that is not supported"
        case .saslError: return "SCRAM authentication failed"
        case .queryCancelled: return "the statement was cancelled"
        case .poolClosed: return "the store is closed"
        default: return "database error (\(code))"
        }
    }
}
