// PgBouncer in front of a test PostgresServer, in transaction pooling mode (its usual production setting, where a
// server connection is a client's only for one transaction: LISTEN succeeds and nothing ever arrives). For one role
// (the node role unless told) and one database; listening on 127.0.0.1 at a free port, SCRAM to the client and to
// the server. Runs as the `postgres` user (PgBouncer refuses root); stopped by pid. Debian's pgbouncer (`make test`
// installs it).

import Foundation

#if canImport(Glibc)
import Glibc
#endif

public final class PgBouncer: @unchecked Sendable {
    public static let binary = "/usr/sbin/pgbouncer"
    public let port: Int
    let folder: String
    private var pid: Int32?

    /// The role the pooler lets in and logs in as (default: the test server's node role).
    public let role: String

    public init(server: PostgresServer, database: String, role: String = PostgresServer.role, password: String? = nil,
                poolMode: String = "transaction") throws {
        self.role = role
        var template = Array("/tmp/opq-pgbouncer-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw SupportFailure("mkdtemp: \(String(cString: strerror(errno)))") }
        folder = String(cString: made)
        port = try PostgresServer.freePort()
        guard let postgres = getpwnam("postgres") else { throw SupportFailure("no postgres user: install Debian's postgresql (make deps)") }
        guard FileManager.default.isExecutableFile(atPath: Self.binary) else {
            throw SupportFailure("no \(Self.binary): install Debian's pgbouncer (make deps)")
        }
        let ini = """
            [databases]
            \(database) = host=127.0.0.1 port=\(server.port) dbname=\(database)
            [pgbouncer]
            listen_addr = 127.0.0.1
            listen_port = \(port)
            unix_socket_dir =
            auth_type = scram-sha-256
            auth_file = \(folder)/userlist.txt
            pool_mode = \(poolMode)
            pidfile = \(folder)/pgbouncer.pid
            logfile = \(folder)/pgbouncer.log
            """
        try ini.write(toFile: folder + "/pgbouncer.ini", atomically: true, encoding: .utf8)
        try "\"\(role)\" \"\(password ?? server.rolePassword)\"\n".write(
            toFile: folder + "/userlist.txt", atomically: true, encoding: .utf8)
        for path in [folder, folder + "/pgbouncer.ini", folder + "/userlist.txt"] {
            chown(path, postgres.pointee.pw_uid, postgres.pointee.pw_gid)
        }
        chmod(folder + "/userlist.txt", 0o600)
        try PostgresServer.runAsPostgres([Self.binary, "-d", "-q", folder + "/pgbouncer.ini"], quiet: true)
        // Started (it forks): its pid file, then its port.
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if let text = try? String(contentsOfFile: folder + "/pgbouncer.pid", encoding: .utf8),
               let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)), Self.accepts(port) {
                self.pid = pid
                return
            }
            usleep(50_000)
        }
        let log = (try? String(contentsOfFile: folder + "/pgbouncer.log", encoding: .utf8)) ?? ""
        stop()
        throw SupportFailure("pgbouncer did not start; its log: \(log.suffix(600))")
    }

    /// The URL a node uses to reach `database` through this pooler, as the node role.
    public func url(_ database: String) -> String {
        "postgresql://\(role)@127.0.0.1:\(port)/\(database)?sslmode=disable"
    }

    public func stop() {
        if let pid {
            kill(pid, SIGTERM)
            for _ in 0..<100 where kill(pid, 0) == 0 { usleep(20_000) }
            if kill(pid, 0) == 0 { kill(pid, SIGKILL) }
            self.pid = nil
        }
        try? FileManager.default.removeItem(atPath: folder)
    }

    deinit { stop() }

    private static func accepts(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }
}
