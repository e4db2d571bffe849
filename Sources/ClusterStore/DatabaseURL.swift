// The cluster's database address (SPEC §8): `postgresql://user[:password]@host[:port]/db?sslmode=…&sslrootcert=…`
// and the optional passwordFile, turned into postgres-nio configurations.
//
// As libpq reads it, a host that is an absolute path (`%2Frun%2Fpostgresql`, or `host=/run/postgresql` among the
// parameters) is the folder of the server's Unix-domain socket, `<folder>/.s.PGSQL.<port>`: a node on the database's
// own machine, with peer authentication needing no password at all. TLS never applies to such a socket (libpq never
// tries it there either): `sslmode` is ignored. Without a user, the user this process runs as (libpq's default).
//
// The password file is read again for every configuration made, that is for every new connection or pool: a
// password rotated by writing the new one into the file (a secrets agent does that) is used from the next
// connection on, as libpq reads ~/.pgpass at each connection. A file that cannot be read then fails that
// connection with the file's error, which the node reports as the reason it is disconnected.
//
// Trusts nothing in the URL: every part is checked and an error names the part, never the password (the URL is
// only ever described without it).

import NIOSSL
import PostgresNIO

#if canImport(Glibc)
import Glibc
import SystemCalls
#endif

public struct DatabaseURL: Sendable, CustomStringConvertible {
    public enum SSLMode: String, Sendable {
        case disable, prefer, require
        case verifyFull = "verify-full"
    }

    public var user: String
    /// A host name or address, or (an absolute path) the folder of the server's Unix-domain socket.
    public var host: String
    public var port: Int
    public var database: String
    public var sslMode: SSLMode
    public var sslRootCert: String?
    /// From the URL or the password file (as read at start); never printed.
    var password: String?
    /// Read again for each new connection (`currentPassword`).
    var passwordFile: String?

    /// The URL without its password: safe for logs and status.
    public var description: String {
        if let socketPath { return "postgresql://\(user)@:\(port)/\(database)?host=\(host) (the socket \(socketPath))" }
        var text = "postgresql://\(user)@\(host.contains(":") ? "[\(host)]" : host):\(port)/\(database)?sslmode=\(sslMode.rawValue)"
        if let sslRootCert { text += "&sslrootcert=\(sslRootCert)" }
        return text
    }

    /// The server's Unix-domain socket when the host is its folder (an absolute path), else nil.
    public var socketPath: String? {
        host.hasPrefix("/") ? (host.hasSuffix("/") ? host : host + "/") + ".s.PGSQL.\(port)" : nil
    }

    public var hasPassword: Bool { password != nil }

    /// `passwordFile`, when given, wins over a password in the URL; one trailing line ending (\n or \r\n) is ignored.
    public init(_ url: String, passwordFile: String? = nil) throws {
        var rest = Substring(url)
        if rest.hasPrefix("postgresql://") { rest = rest.dropFirst("postgresql://".count) }
        else if rest.hasPrefix("postgres://") { rest = rest.dropFirst("postgres://".count) }
        else { throw Self.bad("the scheme must be postgresql://") }

        var query = Substring("")
        if let q = rest.firstIndex(of: "?") { query = rest[rest.index(after: q)...]; rest = rest[..<q] }
        var path = Substring("")
        if let slash = rest.firstIndex(of: "/") { path = rest[rest.index(after: slash)...]; rest = rest[..<slash] }
        let at = rest.lastIndex(of: "@")
        (user, password) = try Self.userAndPassword(at.map { rest[..<$0] } ?? "")
        var (host, port) = try Self.hostAndPort(at.map { rest[rest.index(after: $0)...] } ?? rest)
        guard let database = Self.percentDecoded(path), !database.isEmpty else { throw Self.bad("no database name") }
        self.database = database
        var ssl: (mode: SSLMode, rootCert: String?) = (.prefer, nil)
        for pair in query.split(separator: "&") where !pair.isEmpty {
            let parts = pair.split(separator: "=", maxSplits: 1)
            let value = parts.count > 1 ? Self.percentDecoded(parts[1]) ?? "" : ""
            try Self.apply(String(parts[0]), value, ssl: &ssl, host: &host, port: &port)
        }
        (sslMode, sslRootCert) = ssl
        if host.isEmpty {
            throw Self.bad("no host (a name, an address, or the folder of the server's socket such as host=/run/postgresql)")
        }
        // A NUL would end the name early in the protocol's startup message (or add parameters of its own there).
        for (part, text) in [("host", host), ("user", user), ("database name", database)]
        where text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            throw Self.bad("the \(part) holds a control character")
        }
        if host.contains("/") && !host.hasPrefix("/") { throw Self.bad("the socket folder \(host) is not an absolute path") }
        self.host = host
        self.port = port
        // A Unix-domain socket's address holds at most 107 bytes of path (sun_path, with its NUL).
        if let socketPath, socketPath.utf8.count > 107 {
            throw Self.bad("the socket path \(socketPath) is longer than the 107 bytes a Unix-domain socket address holds")
        }
        if let passwordFile {
            password = try Self.readPassword(passwordFile)
            self.passwordFile = passwordFile
        }
    }

    static func bad(_ what: String) -> ClusterStoreError {
        ClusterStoreError(.configuration, "cluster.database: \(what) "
                          + "(expected postgresql://user@host:port/database?sslmode=disable|require|verify-full)")
    }

    /// `user[:password]`, percent-decoded; no user: this process's user's name.
    static func userAndPassword(_ userInfo: Substring) throws -> (String, String?) {
        var user: String, password: String?
        if let colon = userInfo.firstIndex(of: ":") {
            guard let u = percentDecoded(userInfo[..<colon]), let p = percentDecoded(userInfo[userInfo.index(after: colon)...]) else {
                throw bad("the user or password is not valid percent-encoding")
            }
            (user, password) = (u, p)
        } else {
            guard let u = percentDecoded(userInfo) else { throw bad("the user is not valid percent-encoding") }
            user = u
        }
        if user.isEmpty {
            guard let me = processUser() else { throw bad("no user (user@host), and this process's user has no name") }
            user = me
        }
        return (user, password)
    }

    /// `host[:port]` or `[address]:port`; the port 5432 when not given.
    static func hostAndPort(_ text: Substring) throws -> (String, Int) {
        var hostPort = text
        if hostPort.contains(",") {
            // libpq's list of hosts tried in turn: one pool has one server here.
            throw bad("several hosts (\(hostPort)) are not supported: name one, such as a name or address that always leads to the primary")
        }
        if hostPort.hasPrefix("[") {
            guard let close = hostPort.firstIndex(of: "]") else { throw bad("unclosed [ in the host") }
            let after = hostPort[hostPort.index(after: close)...]
            let host = String(hostPort[hostPort.index(after: hostPort.startIndex)..<close])
            if after.hasPrefix(":") {
                guard let p = Int(after.dropFirst()), (1...65535).contains(p) else { throw bad("the port is not 1-65535") }
                return (host, p)
            } else if !after.isEmpty { throw bad("unexpected text after the host") }
            return (host, 5432)
        }
        var port = 5432
        if let colon = hostPort.lastIndex(of: ":") {
            guard let p = Int(hostPort[hostPort.index(after: colon)...]), (1...65535).contains(p) else {
                throw bad("the port is not 1-65535")
            }
            port = p
            hostPort = hostPort[..<colon]
        }
        guard let decoded = percentDecoded(hostPort) else { throw bad("the host is not valid percent-encoding") }
        return (decoded, port)
    }

    /// One query parameter (`?key=value`): sslmode, sslrootcert, and libpq's host and port, which win over the ones
    /// before the path.
    private static func apply(_ key: String, _ value: String, ssl: inout (mode: SSLMode, rootCert: String?),
                              host: inout String, port: inout Int) throws {
        switch key {
        case "sslmode":
            guard let mode = SSLMode(rawValue: value) else { throw bad("sslmode \(value) is not disable, prefer, require or verify-full") }
            ssl.mode = mode
        case "sslrootcert":
            ssl.rootCert = value
        case "host":
            if value.contains(",") {
                throw bad("several hosts (\(value)) are not supported: "
                               + "name one, such as a name or address that always leads to the primary")
            }
            host = value
        case "port":
            guard let p = Int(value), (1...65535).contains(p) else { throw bad("the port is not 1-65535") }
            port = p
        default:
            throw bad("unknown parameter \(key)")
        }
    }

    /// What is wrong with how the password file is kept, if anything: readable by the file's group or by everyone
    /// (libpq refuses such a ~/.pgpass; a node warns, and goes on). nil without a password file.
    public func passwordFileExposure() -> String? {
        guard let passwordFile else { return nil }
        var st = stat()
        guard stat(passwordFile, &st) == 0, st.st_mode & 0o077 != 0 else { return nil }
        let mode = String(st.st_mode & 0o777, radix: 8)
        return "cluster.passwordFile \(passwordFile) is readable by "
            + "\(st.st_mode & 0o007 != 0 ? "every user of this machine" : "its group") "
            + "(mode \(mode)): chmod 600 it, or hand it over with systemd's LoadCredential="
    }

    /// The password a new connection uses: the password file's content now, else the URL's.
    func currentPassword() throws -> String? {
        try passwordFile.map(Self.readPassword) ?? password
    }

    /// Opens a file the configuration names for reading: a regular file only (a FIFO, a device or a directory is
    /// refused at once, never blocked on or read without end). Symbolic links are followed: systemd's credentials
    /// and secrets managers hand files over that way.
    static func openRegularFile(_ path: String, what: String) throws -> Int32 {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw ClusterStoreError(.configuration, "\(what) \(path): \(String(cString: strerror(errno)))") }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else {
            close(fd)
            throw ClusterStoreError(.configuration, "\(what) \(path): not a regular file")
        }
        return fd
    }

    static func readPassword(_ path: String) throws -> String {
        let fd = try openRegularFile(path, what: "cluster.passwordFile")
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = retryingInterrupts { read(fd, &buffer, buffer.count) }
            if n < 0 {
                throw ClusterStoreError(.configuration,
                                        "cluster.passwordFile \(path): cannot be read (\(String(cString: strerror(errno))))")
            }
            if n == 0 { break }
            bytes.append(contentsOf: buffer[0..<n])
            if bytes.count > 65536 { throw ClusterStoreError(.configuration, "cluster.passwordFile \(path): larger than 64 KiB") }
        }
        // One line ending: "\n", or "\r\n" from a file written on Windows (libpq's .pgpass strips both too).
        if bytes.last == 0x0A {
            bytes.removeLast()
            if bytes.last == 0x0D { bytes.removeLast() }
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw ClusterStoreError(.configuration, "cluster.passwordFile \(path): not UTF-8 text")
        }
        return text
    }

    static func percentDecoded(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var i = text.utf8.startIndex
        let utf8 = text.utf8
        while i != utf8.endIndex {
            let c = utf8[i]
            if c == UInt8(ascii: "%") {
                let h = utf8.index(after: i)
                guard h != utf8.endIndex, utf8.index(after: h) != utf8.endIndex,
                      let hi = hexValue(utf8[h]), let lo = hexValue(utf8[utf8.index(after: h)]) else { return nil }
                bytes.append(hi << 4 | lo)
                i = utf8.index(h, offsetBy: 2)
            } else {
                bytes.append(c)
                i = utf8.index(after: i)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    private static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    func tlsConfiguration() throws -> TLSConfiguration? {
        switch sslMode {
        case .disable:
            return nil
        case .prefer, .require:
            // libpq's meaning: encrypted, the certificate not checked.
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.certificateVerification = .none
            return tls
        case .verifyFull:
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.certificateVerification = .fullVerification
            if let sslRootCert {
                close(try Self.openRegularFile(sslRootCert, what: "cluster.database: sslrootcert"))
                tls.trustRoots = .file(sslRootCert)
            }
            return tls
        }
    }

    /// The name of the user this process runs as (libpq's default user), nil if it has none.
    static func processUser() -> String? {
        guard let entry = getpwuid(geteuid()), let name = entry.pointee.pw_name else { return nil }
        let text = String(cString: name)
        return text.isEmpty ? nil : text
    }

    /// TLS as `sslmode` asks for it: nil for none, else the configuration and whether the connection must use it.
    /// No tlsServerName is ever set: postgres-nio sends the host name for SNI and certificate checks, and for an IP
    /// address (never valid in SNI; setting it made verify-full fail for every IP host) checks the certificate's IP
    /// entries against the address it connected to.
    private func tlsChoice() throws -> (configuration: TLSConfiguration, required: Bool)? {
        switch (sslMode, try tlsConfiguration()) {
        case (.disable, _), (_, nil): return nil
        case (.prefer, let config?): return (config, false)
        case (_, let config?): return (config, true)
        }
    }

    /// The pool's configuration. `statementTimeout` (milliseconds; nil: none asked): sent as the startup parameter
    /// statement_timeout, so that the server itself ends a statement the node has stopped waiting for.
    func clientConfiguration(statementTimeout: Int? = nil) throws -> PostgresClient.Configuration {
        var configuration: PostgresClient.Configuration
        if let socketPath {
            configuration = .init(unixSocketPath: socketPath, username: user, password: try currentPassword(), database: database)
        } else {
            let tls: PostgresClient.Configuration.TLS = try tlsChoice().map {
                $0.required ? .require($0.configuration) : .prefer($0.configuration)
            } ?? .disable
            configuration = .init(host: host, port: port, username: user, password: try currentPassword(), database: database, tls: tls)
        }
        configuration.options.connectTimeout = .seconds(5)
        if let statementTimeout { configuration.options.additionalStartupParameters = [("statement_timeout", String(statementTimeout))] }
        return configuration
    }

    /// A dedicated connection's configuration (LISTEN's, the migration's), with `statementTimeout` as the pool's.
    func connectionConfiguration(statementTimeout: Int? = nil) throws -> PostgresConnection.Configuration {
        var configuration: PostgresConnection.Configuration
        if let socketPath {
            configuration = .init(unixSocketPath: socketPath, username: user, password: try currentPassword(), database: database)
        } else {
            let tls: PostgresConnection.Configuration.TLS = try tlsChoice().map {
                let context = try NIOSSLContext(configuration: $0.configuration)
                return $0.required ? .require(context) : .prefer(context)
            } ?? .disable
            configuration = .init(host: host, port: port, username: user, password: try currentPassword(), database: database, tls: tls)
        }
        configuration.options.connectTimeout = .seconds(5)
        if let statementTimeout { configuration.options.additionalStartupParameters = [("statement_timeout", String(statementTimeout))] }
        return configuration
    }
}
