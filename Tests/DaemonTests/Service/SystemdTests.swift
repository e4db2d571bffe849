// The installed service under a real systemd, booted as PID 1 of its own PID and mount namespace
// (the recipe in the task's notes): make install, start, a job through the inbox, the unit's journal,
// reload, SIGKILL and the restart, watchdog pings, stop, and the exposure score.
//
// The namespace gets its own /run, /tmp and /var/tmp (tmpfs): without them systemd's boot-time clean-up
// would empty the machine's real /tmp. /etc, /usr/local and /var/spool are the machine's: this test
// installs opqueued for real, as `make install` does.

import Daemon
import Foundation
import Testing
import TestSupport
import TestTraits

/// A systemd booted in a namespace; commands run inside it through nsenter.
final class BootedSystemd {
    let pid: Int32
    private let unshare: Process

    init() throws {
        unshare = Process()
        unshare.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
        unshare.arguments = ["--pid", "--fork", "--mount", "--mount-proc", "--propagation", "private", "sh", "-c",
                             "mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /var/tmp; mkdir -p /run/systemd; "
                                 + "exec /lib/systemd/systemd --system --unit=basic.target"]
        unshare.standardInput = FileHandle.nullDevice
        unshare.standardOutput = FileHandle.nullDevice
        unshare.standardError = FileHandle.nullDevice
        try unshare.run()
        // systemd is unshare's only child: PID 1 inside, `pid` outside.
        var found: Int32?
        let deadline = Date().addingTimeInterval(10)
        while found == nil && Date() < deadline {
            usleep(50_000)
            let children = (try? String(contentsOfFile: "/proc/\(unshare.processIdentifier)/task/\(unshare.processIdentifier)/children",
                                        encoding: .utf8)) ?? ""
            found = children.split(separator: " ").first.flatMap { Int32($0) }
        }
        guard let found else { unshare.terminate(); throw TestFailure("systemd did not start under unshare") }
        pid = found
        var state = ""
        let running = Date().addingTimeInterval(30)
        while !["running", "degraded"].contains(state) && Date() < running {
            usleep(200_000)
            state = (try? self.run("systemctl", "is-system-running"))?.stdout.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
        }
        guard ["running", "degraded"].contains(state) else {
            shutdown()
            throw TestFailure("systemd did not boot: is-system-running says '\(state)'")
        }
    }

    /// Runs a command inside the namespaces, from the repository's folder.
    @discardableResult
    func run(_ command: String, _ arguments: String..., timeout: Double = 60) throws -> Run {
        try DaemonTests.run("/usr/bin/nsenter", ["-t", "\(pid)", "-m", "-p", "--wd=\(repositoryRoot)", command] + arguments,
                            timeout: timeout)
    }

    /// Installs opqueued inside with the project's own `make install` (from the debug build the tests already have).
    func installProject() throws {
        let install = try run("make", "install-files", "BINARIES=.build/debug", timeout: 120)
        guard install.status == 0 else { throw TestFailure("make install: \(install.stderr)") }
    }

    func property(_ unit: String, _ name: String) throws -> String {
        try run("systemctl", "show", "-P", name, unit).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// A drop-in `name`.conf for `unit` in the namespace's own /run, then `daemon-reload`.
    func dropIn(_ unit: String, named name: String, _ text: String) throws {
        try run("mkdir", "-p", "/run/systemd/system/\(unit).d")
        try Data(text.utf8).write(to: URL(fileURLWithPath: "/proc/\(pid)/root/run/systemd/system/\(unit).d/\(name).conf"))
        try run("systemctl", "daemon-reload")
    }

    /// The installed `unit` started from now on with `--config /run/NAME.plist` holding `configuration` (the
    /// namespace's own /run): the installed ExecStart with the option added, as a drop-in.
    func configure(_ unit: String, named name: String, _ configuration: [String: Any]) throws {
        let file = "/run/\(name).plist"
        try PropertyListSerialization.data(fromPropertyList: configuration, format: .xml, options: 0)
            .write(to: URL(fileURLWithPath: "/proc/\(pid)/root" + file))
        chmod("/proc/\(pid)/root" + file, 0o644)
        let installed = try String(contentsOfFile: "/etc/systemd/system/\(unit)", encoding: .utf8)
        guard let execStart = installed.split(separator: "\n").first(where: { $0.hasPrefix("ExecStart=") }) else {
            throw TestFailure("no ExecStart in the installed \(unit)")
        }
        try dropIn(unit, named: name, "[Service]\nExecStart=\n\(execStart) --config \(file)\n")
    }

    /// Waits until `condition` holds, polling; false when it never did.
    func eventually(_ seconds: Double = 15, _ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        repeat {
            if try condition() { return true }
            usleep(100_000)
        } while Date() < deadline
        return false
    }

    /// SIGKILL to PID 1 of the namespace ends every process in it.
    func shutdown() {
        kill(pid, SIGKILL)
        unshare.waitUntilExit()
    }
}

@Suite(.serialized, .onItsOwnExecutor) struct SystemdTests {
    static let spool = "/var/spool/opqueued"
    static let unit = "opqueued.service"

    /// `make uninstall` removes every file `make install` put in place (staged under DESTDIR: nothing of the machine's
    /// is touched), so the README's way out leaves nothing behind.
    @Test func uninstallRemovesWhatInstallPut() throws {
        let root = NSTemporaryDirectory() + "opq-install-\(UInt32.random(in: 1...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        func files() -> [String] {
            let all = (try? FileManager.default.subpathsOfDirectory(atPath: root)) ?? []
            return all.filter { var st = stat(); return lstat(root + "/" + $0, &st) == 0 && (st.st_mode & S_IFMT) != S_IFDIR }
        }
        let install = try run("/usr/bin/make", ["-C", repositoryRoot, "install-files", "BINARIES=.build/debug", "DESTDIR=\(root)"],
                              timeout: 120)
        #expect(install.status == 0, "\(install.stderr)")
        let installed = files()
        #expect(installed.contains { $0.hasSuffix("bin/opqueued") } && installed.contains { $0.hasSuffix("opqueued.service") },
                "\(installed)")
        // Three programs, the unit and its three snippets, three man pages, three completions.
        #expect(installed.count == 13, "\(installed)")
        let uninstall = try run("/usr/bin/make", ["-C", repositoryRoot, "uninstall", "DESTDIR=\(root)"], timeout: 60)
        #expect(uninstall.status == 0, "\(uninstall.stderr)")
        #expect(files().isEmpty, "left behind: \(files())")
    }

    @Test func installedServiceBehavesAsAWellMadeDaemon() throws {
        let systemd = try BootedSystemd()
        defer { systemd.shutdown() }
        let unit = Self.unit
        try systemd.installProject()
        #expect(try systemd.run("getent", "passwd", "opqueued").status == 0, "sysusers made the opqueued user")
        #expect(try systemd.run("test", "-x", "/usr/local/lib/opqueued/opqueued-supervise").status == 0,
                "each command's supervisor, where opqueued looks")
        let inbox = try FileManager.default.attributesOfItem(atPath: Self.spool + "/inbox")
        #expect((inbox[.posixPermissions] as? Int) == 0o1770, "tmpfiles made the inbox sticky and group-writable")

        // Start: Type=notify, so `start` returns once READY=1 arrived; STATUS= is live.
        let start = try systemd.run("systemctl", "start", unit)
        let startLog = start.status == 0 ? "" : try systemd.run("journalctl", "-u", unit, "--no-pager").stdout
        try #require(start.status == 0, "systemctl start: \(start.stderr)\n\(startLog)")
        #expect(try systemd.property(unit, "ActiveState") == "active")
        #expect(try systemd.property(unit, "User") == "opqueued")
        #expect(try systemd.eventually { try systemd.property(unit, "StatusText").hasPrefix("jobs active ") })

        try expectAJobThroughTheInbox(systemd)

        // The control socket answers the owner's side (root here) through opqueuectl.
        #expect(try systemd.run("opqueuectl", "--spool", Self.spool, "status").stdout.contains("jobs active: 0"))

        try expectReloadSignalsAndTheWatchdog(systemd)

        // Stop: a clean exit, inactive and not failed.
        #expect(try systemd.run("systemctl", "stop", unit).status == 0)
        #expect(try systemd.property(unit, "ActiveState") == "inactive")
        #expect(try systemd.property(unit, "Result") == "success")

        // Hardening, as loaded, and offline on the shipped file.
        #expect(try exposure(systemd.run("systemd-analyze", "security", unit).stdout).map { $0 <= 1.5 } == true)
        let offline = try systemd.run("systemd-analyze", "security", "--offline=true", "/etc/systemd/system/\(unit)")
        #expect(exposure(offline.stdout).map { $0 <= 1.5 } == true, "\(offline.stdout.suffix(200))")
    }

    /// `systemctl stop` with a command running: the daemon alone gets SIGTERM (KillMode=mixed), gives the command
    /// `shutdownGraceSeconds`, then stops it and keeps its job in active/ for the next start, unpublished. (With the
    /// SIGTERM sent to the whole cgroup, the command died at once and its job was published failed.)
    @Test func aStopKeepsTheJobOfACommandItEnds() throws {
        let systemd = try BootedSystemd()
        defer { systemd.shutdown() }
        let unit = Self.unit
        try systemd.installProject()
        try systemd.configure(unit, named: "opq-stop", ["shutdownGraceSeconds": 1, "commands": ["slow": ["argv": ["/bin/sleep", "30"]]]])
        let job = "stop-" + UUID().uuidString.prefix(8).lowercased()
        // The machine's spool: what the test left goes with it.
        defer {
            for folder in ["active", "outbox"] { try? FileManager.default.removeItem(atPath: "\(Self.spool)/\(folder)/\(job)") }
        }
        let start = try systemd.run("systemctl", "start", unit)
        try #require(start.status == 0, "systemctl start: \(start.stderr)")
        try plist(["job": job, "operations": [["id": "s", "kind": "command", "command": "slow"]]])
            .write(to: URL(fileURLWithPath: "\(Self.spool)/inbox/.\(job).plist"))
        #expect(rename("\(Self.spool)/inbox/.\(job).plist", "\(Self.spool)/inbox/\(job).plist") == 0)
        #expect(try systemd.eventually {
            try systemd.run("journalctl", "-u", unit, "OPQ_JOB=\(job)", "OPQ_STATE=executing", "--no-pager", "-q").stdout
                .contains("executing")
        }, "the command runs")
        #expect(try systemd.run("systemctl", "stop", unit).status == 0)
        #expect(try systemd.property(unit, "Result") == "success")
        #expect(!FileManager.default.fileExists(atPath: "\(Self.spool)/outbox/\(job)"), "not published as failed")
        #expect(FileManager.default.fileExists(atPath: "\(Self.spool)/active/\(job)"), "kept for the next start")
        let failed = try systemd.run("journalctl", "-u", unit, "OPQ_JOB=\(job)", "OPQ_STATE=failed", "--no-pager", "-q")
        #expect(!failed.stdout.contains(job), "\(failed.stdout)")
    }

    /// A job through the inbox, run as opqueued, its operations' stories in the unit's journal.
    private func expectAJobThroughTheInbox(_ systemd: BootedSystemd) throws {
        let unit = Self.unit
        // A job through the inbox, written elsewhere and renamed in, as a submitter does.
        let job = "systemd-" + UUID().uuidString.prefix(8).lowercased()
        // The machine's spool: what the test published goes with it.
        defer { try? FileManager.default.removeItem(atPath: "\(Self.spool)/outbox/\(job)") }
        let manifest = plist(["job": job, "operations": [sleepOp("a", 0), sleepOp("b", 0, deps: ["a"])]])
        try manifest.write(to: URL(fileURLWithPath: "\(Self.spool)/inbox/.\(job).plist"))
        #expect(rename("\(Self.spool)/inbox/.\(job).plist", "\(Self.spool)/inbox/\(job).plist") == 0)
        let resultPath = "\(Self.spool)/outbox/\(job)/result.plist"
        #expect(systemd.eventually { FileManager.default.fileExists(atPath: resultPath) }, "the job reached the outbox")
        let result = try PropertyListSerialization.propertyList(from: Data(contentsOf: URL(fileURLWithPath: resultPath)),
                                                                format: nil) as? [String: Any]
        #expect(result?["status"] as? String == "succeeded")
        let owner = try FileManager.default.attributesOfItem(atPath: "\(Self.spool)/outbox/\(job)")[.ownerAccountName] as? String
        #expect(owner == "opqueued", "the service runs as opqueued")

        // The unit's journal tells each operation's story with the OPQ_* fields.
        var states: [String: [String]] = [:]
        #expect(try systemd.eventually {
            let out = try systemd.run("journalctl", "-u", unit, "OPQ_JOB=\(job)", "-o", "json", "--no-pager").stdout
            states = [:]
            for line in out.split(separator: "\n") {
                guard let entry = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                      let op = entry["OPQ_OPERATION"] as? String, let state = entry["OPQ_STATE"] as? String else { continue }
                states[op, default: []].append(state)
            }
            return states.count == 2
        })
        for op in ["a", "b"] { #expect(states[op] == ["pending", "ready", "executing", "succeeded"], "\(op)") }
    }

    /// Reload, SIGUSR1 and SIGKILL to the running service, and its watchdog pings.
    private func expectReloadSignalsAndTheWatchdog(_ systemd: BootedSystemd) throws {
        let unit = Self.unit
        // Reload: RELOADING=1 … READY=1 around the SIGHUP; the service stays up with the same process.
        let pidBefore = try systemd.property(unit, "MainPID")
        let reload = try systemd.run("systemctl", "reload", unit)
        #expect(reload.status == 0, "systemctl reload: \(reload.stderr)")
        #expect(try systemd.property(unit, "MainPID") == pidBefore)
        #expect(try systemd.eventually {
            try systemd.run("journalctl", "-u", unit, "OPQ_EVENT=daemon", "OPQ_STATE=reloading", "--no-pager", "-q")
                .stdout.contains("reload")
        })

        // `systemctl kill -s USR1` (a log-rotation habit): logged and ignored, the same process goes on.
        #expect(try systemd.run("systemctl", "kill", "-s", "USR1", unit).status == 0)
        #expect(try systemd.eventually {
            try systemd.run("journalctl", "-u", unit, "--no-pager", "-q").stdout.contains(
                "SIGUSR1 means nothing to opqueued and is ignored")
        })
        #expect(try systemd.property(unit, "ActiveState") == "active")
        #expect(try systemd.property(unit, "MainPID") == pidBefore)
        #expect(try systemd.property(unit, "NRestarts") == "0")

        // SIGKILL: Restart=on-failure brings it back as a new process, ready again.
        #expect(try systemd.run("systemctl", "kill", "-s", "KILL", unit).status == 0)
        #expect(try systemd.eventually {
            try systemd.property(unit, "NRestarts") == "1" && systemd.property(unit, "ActiveState") == "active"
        }, "restarted after SIGKILL")
        #expect(try systemd.property(unit, "MainPID") != pidBefore)

        // Watchdog: with a 2 s WatchdogSec the service must keep pinging, or systemd would kill it.
        try systemd.dropIn(unit, named: "watchdog", "[Service]\nWatchdogSec=2\n")
        #expect(try systemd.run("systemctl", "restart", unit).status == 0)
        let restarts = try systemd.property(unit, "NRestarts")
        sleep(5)
        #expect(try systemd.property(unit, "ActiveState") == "active")
        #expect(try systemd.property(unit, "NRestarts") == restarts, "no watchdog timeout in 5 s at WatchdogSec=2")
    }

    /// The README's chapter on installing the service, run as written in the tests' systemd: every `sh` block of it,
    /// in order, with two stand-ins a test must have — `make release` is the debug build the tests already made (a
    /// release build takes minutes), and `sudo` runs its command as the root the test is. Then what the chapter says
    /// happens, happened: the unit is enabled and active, the job went through it, the journal and opqueuectl tell it.
    @Test func theReadmesServiceChapterRunsAsWritten() throws {
        let readme = try String(contentsOfFile: repositoryRoot + "/README.md", encoding: .utf8)
        let chapter = try #require(readme.components(separatedBy: "\n## Installing it as a service\n").dropFirst().first?
            .components(separatedBy: "\n## ").first)
        let blocks = chapter.components(separatedBy: "```sh\n").dropFirst().compactMap { $0.components(separatedBy: "\n```").first }
        #expect(blocks.count >= 2, "\(blocks.count) blocks")
        #expect(blocks.joined().contains("sudo make install") && blocks.joined().contains("journalctl -u opqueued"))
        let systemd = try BootedSystemd()
        defer { systemd.shutdown() }
        let clean = "systemctl disable --now opqueued 2>/dev/null; rm -rf \(Self.spool)/outbox/hello \(Self.spool)/outbox/hello.*"
        try systemd.run("sh", "-c", clean)
        defer { _ = try? systemd.run("sh", "-c", clean) }
        // The stand-ins, in the namespace's own /tmp.
        let shims = "/proc/\(systemd.pid)/root/tmp/readme-shims"
        try FileManager.default.createDirectory(atPath: shims, withIntermediateDirectories: true)
        let make = "#!/bin/sh\n[ \"$*\" = release ] && { echo 'make release: the tests' debug build'; exit 0; }\n"
            + "exec /usr/bin/make BINARIES=.build/debug \"$@\"\n"
        try make.write(toFile: shims + "/make", atomically: true, encoding: .utf8)
        // sudo's own secure_path: usermod is in /usr/sbin.
        try "#!/bin/sh\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin exec \"$@\"\n"
            .write(toFile: shims + "/sudo", atomically: true, encoding: .utf8)
        for shim in ["make", "sudo"] { chmod(shims + "/" + shim, 0o755) }
        let script = "export PATH=/tmp/readme-shims:/usr/local/bin:/usr/bin:/bin USER=root\n" + blocks.joined(separator: "\n")
        let r = try systemd.run("bash", "-c", script, timeout: 180)
        let output = r.stdout + r.stderr
        #expect(try systemd.property(Self.unit, "ActiveState") == "active", "\(output.suffix(2000))")
        #expect(try systemd.property(Self.unit, "UnitFileState") == "enabled")
        #expect(r.stdout.split(separator: "\n").contains("hello"), "submit printed the job id: \(output.suffix(2000))")
        #expect(r.stdout.contains("flaky") && r.stdout.contains("report"), "show told each operation: \(output.suffix(2000))")
        #expect(r.stdout.contains("job hello received") && r.stdout.contains("job hello finished: failed"), "the journal told its story")
        #expect(try systemd.run("id", "-nG", "root").stdout.contains("opqueued"), "usermod put the user in the group")
        _ = try? systemd.run("gpasswd", "-d", "root", "opqueued")
    }

    /// The installed unit as a cluster node (SPEC §8) on a PostgreSQL of the same machine, reached as the README's
    /// Cluster chapter says: through the server's Unix-domain socket, peer authentication for the unit's own
    /// `opqueued` user, no password anywhere — inside the unit's sandbox (ProtectSystem=strict, PrivateTmp, the
    /// address families it keeps). It connects, runs a job whose result names the node, and stops cleanly.
    @Test func installedServiceJoinsAClusterThroughThePostgresSocket() throws {
        let systemd = try BootedSystemd()
        defer { systemd.shutdown() }
        let unit = Self.unit
        try systemd.installProject()

        // The server's socket also in a folder the namespace sees (its /tmp and /run are its own).
        let sockets = "/var/lib/opq-test-pg-\(UInt32.random(in: 1...UInt32.max))"
        try FileManager.default.createDirectory(atPath: sockets, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(atPath: sockets) }
        guard let postgres = getpwnam("postgres") else { throw TestFailure("no postgres user: make deps") }
        chown(sockets, postgres.pointee.pw_uid, postgres.pointee.pw_gid)
        chmod(sockets, 0o755)
        let server = try PostgresServer(extraSocketFolder: sockets)
        let database = "opqueued_sd\(UInt32.random(in: 1...UInt32.max))"
        try server.psql("postgres", "CREATE ROLE opqueued LOGIN NOSUPERUSER")
        try server.psql("postgres", "CREATE DATABASE \(database)")
        for grant in ClusterHarness.grants(database: database, role: "opqueued") { try server.psql(grant.database, grant.sql) }
        let hba = server.folder + "/data/pg_hba.conf"
        try ("local \(database) opqueued peer\n" + String(contentsOfFile: hba, encoding: .utf8)).write(
            toFile: hba, atomically: false, encoding: .utf8)
        try server.psql("postgres", "SELECT pg_reload_conf()")

        // The configuration and the ExecStart naming it, in the namespace's own /run.
        let node = "sd-\(UInt32.random(in: 1...UInt32.max))"
        let configuration: [String: Any] = ["cluster": ["database": "postgresql:///\(database)?host=\(sockets)&port=\(server.port)",
                                                        "node": node, "leaseSeconds": 5]]
        try systemd.configure(unit, named: "opq-cluster", configuration)
        let start = try systemd.run("systemctl", "start", unit)
        let startLog = start.status == 0 ? "" : try systemd.run("journalctl", "-u", unit, "--no-pager").stdout
        try #require(start.status == 0, "systemctl start: \(start.stderr)\n\(startLog)")
        let connected = systemd.eventually(20) {
            (try? systemd.run("journalctl", "-u", unit, "OPQ_EVENT=cluster", "OPQ_STATE=connected", "--no-pager", "-q")
                 .stdout.contains(node)) == true
        }
        let journal = connected ? "" : try systemd.run("journalctl", "-u", unit, "--no-pager", "-n", "30").stdout
        #expect(connected, "\(journal)")

        let job = "sd-cluster-" + UUID().uuidString.prefix(8).lowercased()
        defer { try? FileManager.default.removeItem(atPath: "\(Self.spool)/outbox/\(job)") }
        try plist(["job": job, "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: "\(Self.spool)/inbox/.\(job).plist"))
        #expect(rename("\(Self.spool)/inbox/.\(job).plist", "\(Self.spool)/inbox/\(job).plist") == 0)
        let resultPath = "\(Self.spool)/outbox/\(job)/result.plist"
        #expect(systemd.eventually(30) { FileManager.default.fileExists(atPath: resultPath) }, "the job reached the outbox")
        let result = try? PropertyListSerialization.propertyList(from: Data(contentsOf: URL(fileURLWithPath: resultPath)),
                                                                 format: nil) as? [String: Any]
        #expect(
            result?["status"] as? String == "succeeded" && result?["node"] as? String == node && result?["submittedOn"] as? String == node)
        // The server saw the unit's user come through the socket.
        let sessions = try server.psql(database, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'opqueued' AND client_port = -1")
        #expect((Int(sessions.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) > 0)
        #expect(try systemd.run("systemctl", "stop", unit).status == 0)
        #expect(try systemd.property(unit, "Result") == "success")
    }

    /// "→ Overall exposure level for opqueued.service: 1.2 OK"
    func exposure(_ text: String) -> Double? {
        guard let line = text.split(separator: "\n").last(where: { $0.contains("Overall exposure level") }),
              let value = line.split(separator: ":").last?.split(separator: " ").first else { return nil }
        return Double(value)
    }
}
