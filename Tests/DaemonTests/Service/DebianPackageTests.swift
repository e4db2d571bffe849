// The Debian package (`make deb`, SPEC §7) in the tests' systemd: dpkg -i with no Swift toolchain anywhere on the
// way, a first job through the packaged unit, an upgrade while twenty jobs run (each ends exactly once, the daemon
// restarts gracefully and resumes what was left), dpkg -r (the spool and the configuration stay), dpkg -P (the
// configuration goes; the spool, holding jobs, stays).
//
// The two packages come from `make test-debs` (run by `make test` before `swift test`, which holds .build's lock:
// a test cannot build there): the debug build relinked with the Swift runtime inside, packed as VERSION+test1 and
// VERSION+test2. /etc, /usr and /var are the machine's (see SystemdTests): the package is purged at the end whatever
// happens, the machine's files it replaced are put back, and what `make install` left there (SystemdTests' unit
// and snippets, which would outrank the package's) is hidden inside the namespace only, never changed. The suite
// is nested in SystemdTests, whose .serialized keeps the two from running at once: both own opqueued.service and
// /var/spool/opqueued.

import Foundation
import Testing
import TestSupport
import TestTraits

extension SystemdTests {
    @Suite(.serialized, .onItsOwnExecutor) struct DebianPackageTests {
        static let spool = SystemdTests.spool
        static let unit = SystemdTests.unit
        /// dpkg and what it runs see no toolchain: the PATH of a machine that never had one.
        static let cleanPath = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

        @Test func installsUpgradesUnderLoadRemovesAndPurges() throws {
            let (first, second) = try Self.packages()
            let state = try Self.dpkgStatus()
            try #require(state == "not-installed", "opqueued is installed here (\(state)): the test needs it gone (dpkg -P opqueued)")
            let machine = try MachineState(package: first)
            let systemd = try BootedSystemd()
            defer { systemd.shutdown() }
            defer {
                Self.purge(systemd)
                machine.restore()
            }
            try Self.hideMachineOverrides(systemd)
            let startedAt = Int(Date().timeIntervalSince1970) - 1

            try Self.install(systemd, first, version: "+test1-")
            try Self.firstJob(systemd, prefix: machine.jobPrefix)
            try Self.upgradeUnderLoad(systemd, to: second, prefix: machine.jobPrefix, since: startedAt)
            try Self.startsWithoutTheConfiguration(systemd)
            try Self.removeThenPurge(systemd, prefix: machine.jobPrefix)
        }

        /// .build/test-debs/opqueued_<version>+test1-<revision>_<arch>.deb and +test2.
        static func packages() throws -> (String, String) {
            let folder = repositoryRoot + "/.build/test-debs"
            let names = (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []
            func find(_ tag: String) throws -> String {
                let found = names.filter { $0.hasPrefix("opqueued_") && $0.contains(tag + "-") && $0.hasSuffix(".deb") }.sorted().last
                let name = try #require(found, "no \(folder)/opqueued_*\(tag)-*.deb: `make test-debs` makes it (make test does)")
                return folder + "/" + name
            }
            return (try find("+test1"), try find("+test2"))
        }

        /// Inside the namespace only: tmpfs over the folders where `make install` put its unit and snippets (they would
        /// outrank the package's), and no policy-rc.d (a container image's "start no service", which would stop
        /// deb-systemd-invoke from starting the unit as it does on a real machine).
        static func hideMachineOverrides(_ systemd: BootedSystemd) throws {
            let script = """
                set -e
                for d in /etc/systemd/system /etc/sysusers.d /etc/tmpfiles.d; do if [ -d "$d" ]; then mount -t tmpfs tmpfs "$d"; fi; done
                if [ -e /usr/sbin/policy-rc.d ]; then mount --bind /dev/null /usr/sbin/policy-rc.d; fi
                systemctl daemon-reload
                """
            let r = try systemd.run("sh", "-c", script)
            try #require(r.status == 0, "hiding the machine's overrides: \(r.stderr)")
        }

        /// The package's state in dpkg's database: not-installed, config-files, installed, …
        static func dpkgStatus(field: String = "${db:Status-Status}") throws -> String {
            let r = try run("/usr/bin/dpkg-query", ["-W", "-f", field, "opqueued"])
            return r.status == 0 ? r.stdout.trimmingCharacters(in: .whitespacesAndNewlines) : "not-installed"
        }

        static func dpkg(_ systemd: BootedSystemd, _ arguments: String...) throws -> Run {
            // A package's path relative to the repository, the namespace's working directory: a clone under /tmp is
            // hidden in there by the booted systemd's own /tmp, but its working directory, opened before, is not.
            let arguments = arguments.map { $0.hasPrefix(repositoryRoot + "/") ? String($0.dropFirst(repositoryRoot.count + 1)) : $0 }
            let r = try systemd.run("env", arguments: ["-i", cleanPath, "DEBIAN_FRONTEND=noninteractive", "dpkg"] + arguments, timeout: 240)
            if r.status != 0 { Issue.record("dpkg \(arguments.joined(separator: " ")): \(r.status)\n\(r.stdout)\n\(r.stderr)") }
            return r
        }

        /// dpkg -i: the user, the spool, the unit enabled and started, reading the packaged configuration; binaries
        /// that need no Swift library.
        static func install(_ systemd: BootedSystemd, _ package: String, version: String) throws {
            try #require(try dpkg(systemd, "-i", package).status == 0)
            #expect(try dpkgStatus(field: "${db:Status-Status} ${Version}").contains(version))
            #expect(try systemd.run("getent", "passwd", "opqueued").status == 0, "sysusers made the opqueued user")
            let inbox = try FileManager.default.attributesOfItem(atPath: spool + "/inbox")
            #expect((inbox[.posixPermissions] as? Int) == 0o1770, "tmpfiles made the inbox")
            let fragment = try systemd.property(unit, "FragmentPath")  // /lib is /usr/lib; systemd may say either
            #expect(["/usr/lib/systemd/system/opqueued.service", "/lib/systemd/system/opqueued.service"].contains(fragment), "\(fragment)")
            #expect(try systemd.property(unit, "DropInPaths").hasSuffix("/systemd/system/opqueued.service.d/config.conf"))
            #expect(try systemd.property(unit, "UnitFileState") == "enabled")
            let active = systemd.eventually { (try? systemd.property(unit, "ActiveState")) == "active" }
            let log = active ? "" : try systemd.run("journalctl", "-u", unit, "--no-pager", "-n", "30").stdout
            try #require(active, "postinst started the unit: \(log)")
            let command = try mainProcess(systemd, "cmdline")
            #expect(command.hasPrefix("/usr/bin/opqueued ") && command.contains("--config /etc/opqueued/opqueued.plist"), "\(command)")
            let environment = try mainProcess(systemd, "environ", separator: "\\n")
            #expect(!environment.contains("swift") && !environment.contains("LD_LIBRARY_PATH"), "\(environment)")
            let ldd = try systemd.run("env", "-i", cleanPath, "ldd", "/usr/bin/opqueued", "/usr/bin/opqueuectl")
            #expect(ldd.status == 0 && !ldd.stdout.contains("libswift") && !ldd.stdout.contains("not found"), "\(ldd.stdout)")
            #expect(try systemd.run("env", "-i", cleanPath, "opqueuectl", "--help").status == 0)
        }

        /// The unit's main process's /proc/PID/`file` (cmdline, environ), NULs made `separator`.
        static func mainProcess(_ systemd: BootedSystemd, _ file: String, separator: String = " ") throws -> String {
            try systemd.run("sh", "-c", "tr '\\0' '\(separator)' < /proc/$(systemctl show -P MainPID \(unit))/\(file)").stdout
        }

        /// Writes a manifest beside the inbox's files and renames it in, as a submitter does.
        static func submit(_ job: String, _ operations: [[String: Any]]) throws {
            try plist(["job": job, "operations": operations]).write(to: URL(fileURLWithPath: "\(spool)/inbox/.\(job).plist"))
            try #require(rename("\(spool)/inbox/.\(job).plist", "\(spool)/inbox/\(job).plist") == 0)
        }

        static func result(_ job: String) -> [String: Any]? {
            guard let data = FileManager.default.contents(atPath: "\(spool)/outbox/\(job)/result.plist") else { return nil }
            return try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any]
        }

        static func firstJob(_ systemd: BootedSystemd, prefix: String) throws {
            let job = prefix + "first"
            try submit(job, [sleepOperation("a", 0), sleepOperation("b", 0, dependencies: ["a"])])
            #expect(systemd.eventually(30) { result(job) != nil }, "the first job reached the outbox")
            #expect(result(job)?["status"] as? String == "succeeded")
            let owner = try FileManager.default.attributesOfItem(atPath: "\(spool)/outbox/\(job)")[.ownerAccountName] as? String
            #expect(owner == "opqueued", "the packaged service runs as opqueued")
        }

        /// Twenty jobs of two 3 s sleeps spread over the built-in queues; the upgrade comes once all are claimed, while
        /// the first are executing. Its postinst restarts the daemon: a graceful stop (executing operations finish,
        /// the rest waits in active/), then the new one resumes them. Every job ends once, succeeded.
        static func upgradeUnderLoad(_ systemd: BootedSystemd, to package: String, prefix: String, since: Int) throws {
            let queues = ["default", "filters", "io", "downloads"]
            let jobs = (0..<20).map { prefix + "load-\($0)" }
            for (n, job) in jobs.enumerated() {
                let queue = queues[n % queues.count]
                try submit(job, [sleepOperation("a", 3, queue: queue), sleepOperation("b", 3, queue: queue, dependencies: ["a"])])
            }
            let inbox = { (job: String) in FileManager.default.fileExists(atPath: "\(spool)/inbox/\(job).plist") }
            let claimed = systemd.eventually(30) { !jobs.contains(where: inbox) }
            try #require(claimed, "the daemon claimed the twenty jobs")
            let oldPID = try systemd.property(unit, "MainPID")
            try #require(try dpkg(systemd, "-i", package).status == 0)
            #expect(try dpkgStatus(field: "${db:Status-Status} ${Version}").contains("+test2-"))
            #expect(try systemd.property(unit, "ActiveState") == "active")
            let newPID = try systemd.property(unit, "MainPID")
            #expect(newPID != oldPID, "postinst restarted the daemon")

            let ended = systemd.eventually(120) { jobs.allSatisfy { result($0) != nil } }
            let outbox = try FileManager.default.contentsOfDirectory(atPath: spool + "/outbox").filter { $0.hasPrefix(prefix + "load-") }
            #expect(ended && outbox.count == jobs.count, "one outbox folder a job: \(outbox.sorted())")
            for job in jobs { #expect(result(job)?["status"] as? String == "succeeded", "\(job)") }
            let active = try FileManager.default.contentsOfDirectory(atPath: spool + "/active").filter { $0.hasPrefix(prefix) }
            #expect(active.isEmpty, "nothing left in active/: \(active)")

            // The journal: the old daemon stopped, the new one was ready, and some job lived in both.
            let entries = try journal(systemd, since: since)
            let daemon = entries.filter { $0["OPQ_EVENT"] == "daemon" }.map { "\($0["OPQ_STATE"] ?? "") \($0["_PID"] ?? "")" }
            #expect(daemon.contains("stopping \(oldPID)") && daemon.contains("ready \(newPID)"), "\(daemon)")
            let spanning = jobs.filter { job in
                let pids = Set(entries.filter { $0["OPQ_JOB"] == job }.compactMap { $0["_PID"] })
                return pids.contains(oldPID) && pids.contains(newPID)
            }
            #expect(!spanning.isEmpty, "a job begun by the old daemon was finished by the new one")
        }

        /// An administrator may delete the conffile: the unit's drop-in then starts the daemon with the built-in defaults.
        static func startsWithoutTheConfiguration(_ systemd: BootedSystemd) throws {
            let config = "/etc/opqueued/opqueued.plist"
            try #require(rename(config, config + ".away") == 0)
            defer { rename(config + ".away", config) }
            let restart = try systemd.run("systemctl", "restart", unit)
            #expect(try restart.status == 0 && systemd.property(unit, "ActiveState") == "active", "\(restart.stderr)")
            let command = try mainProcess(systemd, "cmdline")
            #expect(command.hasPrefix("/usr/bin/opqueued ") && !command.contains("--config"), "\(command)")
        }

        /// The unit's entries since the test began, as field dictionaries.
        static func journal(_ systemd: BootedSystemd, since: Int) throws -> [[String: String]] {
            let out = try systemd.run("journalctl", "-u", unit, "--since", "@\(since)", "-o", "json", "--no-pager").stdout
            return out.split(separator: "\n").compactMap { line in
                (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?.compactMapValues { $0 as? String }
            }
        }

        /// dpkg -r stops the service and keeps the spool and the conffile; dpkg -P removes the configuration and keeps
        /// the spool, which holds jobs.
        static func removeThenPurge(_ systemd: BootedSystemd, prefix: String) throws {
            try #require(try dpkg(systemd, "-r", "opqueued").status == 0)
            #expect(try dpkgStatus() == "config-files")
            #expect(try systemd.property(unit, "ActiveState") == "inactive")
            #expect(!FileManager.default.fileExists(atPath: "/usr/bin/opqueued"))
            #expect(FileManager.default.fileExists(atPath: "/etc/opqueued/opqueued.plist"), "remove keeps the conffile")
            #expect(result(prefix + "first") != nil && result(prefix + "load-0") != nil, "remove keeps the outbox")

            try #require(try dpkg(systemd, "-P", "opqueued").status == 0)
            #expect(try dpkgStatus() == "not-installed")
            #expect(!FileManager.default.fileExists(atPath: "/etc/opqueued"), "purge removes the configuration")
            #expect(result(prefix + "first") != nil && result(prefix + "load-19") != nil, "purge keeps a spool holding jobs")
            let helper = (try? FileManager.default.contentsOfDirectory(atPath: "/var/lib/systemd/deb-systemd-helper-enabled")) ?? []
            #expect(!helper.contains { $0.hasPrefix("opqueued") }, "deb-systemd-helper forgot the unit: \(helper)")
        }

        /// Whatever happened, the package leaves: dpkg -P inside the namespace (its prerm stops the unit).
        static func purge(_ systemd: BootedSystemd) {
            guard (try? dpkgStatus()) != "not-installed" else { return }
            let r = try? systemd.run("env", arguments: ["-i", cleanPath, "DEBIAN_FRONTEND=noninteractive", "dpkg", "-P", "opqueued"],
                                     timeout: 240)
            if r?.status != 0 { Issue.record("the final dpkg -P failed: \(r?.stderr ?? "")") }
        }
    }
}

extension SystemdTests.DebianPackageTests {
    /// What the test changes on the machine, noted before it does, and put back after the package's purge: the files
    /// the package replaced (`make install`'s catalog is at the same path), the test's jobs, and the spool and the user
    /// when they were not there before.
    struct MachineState {
        let jobPrefix = "deb-" + UUID().uuidString.prefix(8).lowercased() + "-"
        private var replaced: [(path: String, data: Data, mode: Int)] = []
        private let hadSpool = FileManager.default.fileExists(atPath: SystemdTests.spool)
        private let hadUser = getpwnam("opqueued") != nil

        init(package: String) throws {
            let listing = try run("/bin/sh", ["-c", "dpkg-deb --fsys-tarfile '\(package)' | tar -t"]).stdout
            for entry in listing.split(separator: "\n") where !entry.hasSuffix("/") {
                let path = String(entry.dropFirst())  // "./usr/…"
                var isFolder: ObjCBool = false
                guard FileManager.default.fileExists(atPath: path, isDirectory: &isFolder), !isFolder.boolValue,
                      let data = FileManager.default.contents(atPath: path) else { continue }
                let mode = (try? FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int) ?? 0o644
                replaced.append((path, data, mode))
            }
        }

        func restore() {
            for file in replaced where !FileManager.default.fileExists(atPath: file.path) {
                _ = FileManager.default.createFile(atPath: file.path, contents: file.data, attributes: [.posixPermissions: file.mode])
            }
            if !replaced.isEmpty { _ = try? run("/usr/bin/journalctl", ["--update-catalog"]) }
            let spool = SystemdTests.spool
            if hadSpool {
                for folder in ["inbox", "active", "outbox"] {
                    let names = (try? FileManager.default.contentsOfDirectory(atPath: spool + "/" + folder)) ?? []
                    for name in names where name.hasPrefix(jobPrefix) || name.hasPrefix("." + jobPrefix) {
                        try? FileManager.default.removeItem(atPath: spool + "/" + folder + "/" + name)
                    }
                }
            } else {
                try? FileManager.default.removeItem(atPath: spool)
            }
            if !hadUser && !hadSpool { _ = try? run("/usr/sbin/userdel", ["opqueued"]) }
        }
    }
}

extension BootedSystemd {
    /// `run` with the arguments as an array.
    @discardableResult
    func run(_ command: String, arguments: [String], timeout: Double = 60) throws -> Run {
        let nsenter = ["-t", "\(pid)", "-m", "-p", "--wd=\(repositoryRoot)", command]
        return try DaemonTests.run("/usr/bin/nsenter", nsenter + arguments, timeout: timeout)
    }
}
