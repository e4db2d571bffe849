// A throwaway PostgreSQL for the cluster tests and benchmarks: initdb (as the `postgres` user, since initdb
// refuses root) into a fresh folder under /tmp, password (SCRAM) authentication only, listening on 127.0.0.1
// at a free port and on a unix socket in that folder; stopped with `pg_ctl -m fast stop`, then by pid.
//
// Trusts Debian's PostgreSQL 15 binaries in /usr/lib/postgresql/15/bin (`make deps` installs `postgresql`);
// never uses the package's own cluster.

import CShims
import Foundation

#if canImport(Glibc)
import Glibc
#endif

public final class PostgresServer: @unchecked Sendable {
    public static let binaries = "/usr/lib/postgresql/15/bin"
    /// The non-superuser role the stores log in as, with only the GRANTs docs/cluster-store.md lists.
    public static let role = "opqnode"
    /// Gives every row inserted by hand into opq_jobs (schema 11: what a submission gave, no state) its opq_live row,
    /// waiting, and unless delayed its opq_claimable row (schema 13), as the node's insert does: run after such an insert.
    public static let waitingFromHand = """
        WITH live AS (
            INSERT INTO opq_live (id, qos_rank, priority_rank, seq, queues, commands, not_before)
            SELECT id, qos_rank, priority_rank, seq, queues, commands, not_before FROM opq_jobs AS j
            WHERE NOT EXISTS (SELECT 1 FROM opq_live AS l WHERE l.id = j.id) AND NOT EXISTS (SELECT 1 FROM opq_ended AS e WHERE e.id = j.id)
            RETURNING id, qos_rank, priority_rank, seq, queues, commands, not_before
        )
        INSERT INTO opq_claimable (qos_rank, priority_rank, seq, id, queues, commands)
        SELECT qos_rank, priority_rank, seq, id, queues, commands FROM live WHERE not_before IS NULL
        """

    public let folder: String
    public let port: Int
    /// The superuser's password (test-only), and the node role's.
    let superPassword: String
    public let rolePassword: String
    private var running = false
    /// With TLS: the CA that signed the server's certificate (for `sslrootcert`); nil without.
    public let tlsCA: String?

    /// One server for the whole test process (starting one takes a second or two), stopped and removed at exit;
    /// each test makes its own database on it.
    public static let shared: Result<PostgresServer, any Error> = {
        let result = Result { try PostgresServer() }
        atexit {
            if case .success(let server) = PostgresServer.shared {
                server.stop()
                try? FileManager.default.removeItem(atPath: server.folder)
            }
        }
        return result
    }()

    /// `tls`: the server also takes TLS connections, with a certificate for 127.0.0.1 and localhost signed by a
    /// CA of its own (`tlsCA`); plain connections are still accepted (the URL's sslmode decides).
    /// Another folder the server's socket is made in (besides `folder`), e.g. one a namespace with its own /tmp sees.
    public let extraSocketFolder: String?

    public init(tls: Bool = false, extraSocketFolder: String? = nil) throws {
        self.extraSocketFolder = extraSocketFolder
        var template = Array("/tmp/opq-pg-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw SupportFailure("mkdtemp: \(String(cString: strerror(errno)))") }
        folder = String(cString: made)
        superPassword = "super-\(UInt64.random(in: 1...UInt64.max))"
        rolePassword = "node-\(UInt64.random(in: 1...UInt64.max))-secret"
        port = try Self.freePort()
        guard let postgres = getpwnam("postgres") else { throw SupportFailure("no postgres user: install Debian's postgresql (make deps)") }
        chown(folder, postgres.pointee.pw_uid, postgres.pointee.pw_gid)
        chmod(folder, 0o700)
        let passwordFile = folder + "/superuser-password"
        try (superPassword + "\n").write(toFile: passwordFile, atomically: true, encoding: .utf8)
        chown(passwordFile, postgres.pointee.pw_uid, postgres.pointee.pw_gid)
        chmod(passwordFile, 0o600)
        try Self.runAsPostgres([Self.binaries + "/initdb", "-D", folder + "/data", "-U", "postgres",
                                "--auth=scram-sha-256", "--pwfile=" + passwordFile, "--encoding=UTF8",
                                "--locale=C", "--no-instructions"])
        if tls {
            let ca = try Self.makeCA(in: folder, name: "ca")
            let key = folder + "/server.key", certificate = folder + "/server.pem"
            _ = try Self.run(["/usr/bin/openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                              "-keyout", key, "-out", folder + "/server.csr", "-subj", "/CN=127.0.0.1"], quiet: true)
            try "subjectAltName=IP:127.0.0.1,DNS:localhost\n".write(toFile: folder + "/server.ext", atomically: true, encoding: .utf8)
            _ = try Self.run(["/usr/bin/openssl", "x509", "-req", "-in", folder + "/server.csr", "-CA", ca, "-CAkey", folder + "/ca.key",
                              "-CAcreateserial", "-out", certificate, "-days", "2", "-extfile", folder + "/server.ext"], quiet: true)
            for file in [key, certificate] {
                chown(file, postgres.pointee.pw_uid, postgres.pointee.pw_gid)
                chmod(file, 0o600)
            }
            try "ssl = on\nssl_cert_file = '\(certificate)'\nssl_key_file = '\(key)'\n"
                .write(toFile: folder + "/data/conf.d-tls.conf", atomically: true, encoding: .utf8)
            let conf = folder + "/data/postgresql.conf"
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: conf))
            handle.seekToEndOfFile()
            handle.write(Data("include '\(folder)/data/conf.d-tls.conf'\n".utf8))
            try handle.close()
            chown(folder + "/data/conf.d-tls.conf", postgres.pointee.pw_uid, postgres.pointee.pw_gid)
            tlsCA = ca
        } else {
            tlsCA = nil
        }
        try start()
        try psql("postgres", "CREATE ROLE \(Self.role) LOGIN PASSWORD '\(rolePassword)'")
    }

    public func start() throws {
        let sockets = [folder] + (extraSocketFolder.map { [$0] } ?? [])
        let options = "-c listen_addresses=127.0.0.1 -c port=\(port)"
            + " -c unix_socket_directories=\(sockets.joined(separator: ",")) -c max_connections=200"
        // The postmaster inherits pg_ctl's output: pipes there would never reach end of file, so none.
        try Self.runAsPostgres([Self.binaries + "/pg_ctl", "-D", folder + "/data", "-l", folder + "/log", "-w",
                                "-t", "60", "-o", options, "start"], quiet: true)
        running = true
    }

    public func stop() {
        guard running else { return }
        running = false
        if (try? Self.runAsPostgres([Self.binaries + "/pg_ctl", "-D", folder + "/data", "-m", "fast", "-w", "stop"])) == nil,
           let text = try? String(contentsOfFile: folder + "/data/postmaster.pid", encoding: .utf8),
           let pid = Int32(text.split(separator: "\n").first ?? "") {
            kill(pid, SIGKILL)
        }
    }

    /// SIGSTOP to the postmaster and every process it started: the server stops answering and closes nothing, as
    /// when its machine is paused or the network drops every packet (connections stay open; new ones are accepted by
    /// the kernel and never answered). `thaw()` sends SIGCONT.
    public func freeze() { signalServer(SIGSTOP) }
    public func thaw() { signalServer(SIGCONT) }

    private func signalServer(_ signal: Int32) {
        guard let text = try? String(contentsOfFile: folder + "/data/postmaster.pid", encoding: .utf8),
              let postmaster = pid_t(text.split(separator: "\n").first ?? "") else { return }
        if signal == SIGSTOP { kill(postmaster, signal) }
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = pid_t(entry),
                  let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")") else { continue }
            // Fields after the command's closing parenthesis: state, ppid, …
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            if fields.count > 1, pid_t(fields[1]) == postmaster { kill(pid, signal) }
        }
        if signal != SIGSTOP { kill(postmaster, signal) }
    }

    deinit {
        thaw()
        stop()
        try? FileManager.default.removeItem(atPath: folder)
    }

    /// A new, empty database the node role may use: CONNECT and TEMP on it, USAGE and CREATE on its public
    /// schema (PostgreSQL 15 no longer grants CREATE there to everyone). Nothing more.
    public func createDatabase(_ prefix: String = "opq") throws -> String {
        // Random, not counted: suites run tests in parallel.
        let name = "\(prefix)_\(getpid())_\(UInt32.random(in: 1...UInt32.max))"
        try psql("postgres", "CREATE DATABASE \(name)")
        try psql("postgres", "GRANT CONNECT, TEMPORARY ON DATABASE \(name) TO \(Self.role)")
        try psql(name, "GRANT USAGE, CREATE ON SCHEMA public TO \(Self.role)")
        return name
    }

    /// A new login role named `prefix` and a random number, with `password`, allowed to CONNECT to `database`
    /// (and a member of `memberOf`, when given); each test grants what else it needs. Returns its name.
    public func createRole(_ prefix: String, password: String, connectingTo database: String, memberOf: String? = nil) throws -> String {
        let role = "\(prefix)\(UInt32.random(in: 1...UInt32.max))"
        try psql("postgres", "CREATE ROLE \(role) LOGIN PASSWORD '\(password)'" + (memberOf.map { " IN ROLE \($0)" } ?? ""))
        try psql("postgres", "GRANT CONNECT ON DATABASE \(database) TO \(role)")
        return role
    }

    /// The URL a store uses for `database` as the node role (the password goes in a password file).
    public func url(_ database: String, user: String = PostgresServer.role) -> String {
        "postgresql://\(user)@127.0.0.1:\(port)/\(database)?sslmode=disable"
    }

    /// A password file holding `password` (default: the node role's) and a trailing newline.
    public func passwordFile(_ password: String? = nil) throws -> String {
        let path = folder + "/node-password-\(UInt64.random(in: 1...UInt64.max))"
        try ((password ?? rolePassword) + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o600)
        return path
    }

    /// Runs SQL as the superuser over the unix socket; returns psql's unaligned output.
    @discardableResult
    public func psql(_ database: String, _ sql: String) throws -> String {
        try Self.run(["/usr/bin/psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", folder, "-p", "\(port)",
                      "-U", "postgres", "-d", database, "-c", sql], environment: ["PGPASSWORD": superPassword])
    }

    /// Commits the server has counted in `database` (pg_stat_database.xact_commit), read from another database
    /// so that the reading adds nothing. Backends report at most once a second and at exit: close the store first.
    public func commits(_ database: String) throws -> Int {
        let text = try psql("postgres", "SELECT xact_commit FROM pg_stat_database WHERE datname = '\(database)'")
        guard let n = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw SupportFailure("pg_stat_database has no line for \(database): \(text)")
        }
        return n
    }

    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SupportFailure("socket: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Bool in
                bind(fd, pointer, length) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else { throw SupportFailure("bind 127.0.0.1:0: \(String(cString: strerror(errno)))") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// A self-signed CA (`<folder>/<name>.pem`, its key beside it); returns the certificate's path.
    public static func makeCA(in folder: String, name: String) throws -> String {
        let certificate = folder + "/" + name + ".pem"
        _ = try run(["/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                     "-keyout", folder + "/" + name + ".key", "-out", certificate, "-days", "2",
                     "-subj", "/CN=opqueued test \(name)"], quiet: true)
        chmod(certificate, 0o644)
        return certificate
    }

    static func runAsPostgres(_ arguments: [String], quiet: Bool = false) throws {
        _ = try run(["/usr/sbin/runuser", "-u", "postgres", "--"] + arguments, quiet: quiet)
    }

    /// Runs a program to its end with posix_spawn and waitpid: output goes through files, not pipes (a started
    /// postmaster inherits them and would hold a pipe open forever), and no run loop is involved.
    @discardableResult
    static func run(_ arguments: [String], environment: [String: String] = [:], quiet: Bool = false) throws -> String {
        let outPath = "/tmp/opq-pg-run-\(getpid())-\(UInt64.random(in: 1...UInt64.max))"
        let errPath = outPath + ".err"
        defer { unlink(outPath); unlink(errPath) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, quiet ? "/dev/null" : outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, quiet ? "/dev/null" : errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        // Nothing else of this process's: a postmaster started here lives for the whole test run, and a file
        // another test had open for writing at that instant (a manifest being dropped into an inbox) would stay
        // open for writing as long — the daemon rightly leaves such a file alone (seen in CI: a `--once` run left
        // good.plist in its inbox).
        opq_spawn_actions_close_from(&actions, 3)
        let merged = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = merged.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { argv.forEach { free($0) }; envp.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, arguments[0], &actions, nil, argv, envp)
        guard spawned == 0 else { throw SupportFailure("\(arguments[0]): \(String(cString: strerror(spawned)))") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let out = (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
        let exited = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        guard exited == 0 else {
            let err = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
            throw SupportFailure("\(arguments.prefix(2).joined(separator: " ")) … exited \(exited): \(err)")
        }
        return out
    }
}
