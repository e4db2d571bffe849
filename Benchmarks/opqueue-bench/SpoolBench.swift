// opqueue-bench spool: the daemon end to end (release build of opqueued beside this binary).
//
//   pickup latency   a manifest renamed into an idle daemon's inbox → its claim (the rename out of the inbox,
//                    seen with inotify; the `received` event is logged right after), p50 and p99 over 300
//   throughput       N single-`sleep 0` manifests placed in the inbox, daemon started, until N outbox entries
//                    (full durability), logging to the console (stderr to /dev/null) and, when journald listens, to
//                    the journal, side by side: the journal's rate over the console's is the cost of journald;
//                    with --journald-apart both runs' daemon on CPU 0 and journald on CPU 1, so that the ratio is
//                    the cost of the daemon's own path to the journal, not journald's work on shared cores
//   waiting RSS      the daemon's peak RSS with N manifests waiting in the inbox (its queue suspended)

import Daemon
import Foundation
import SystemdJournal
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

enum SpoolBench {
    static func manifest(_ job: String, seconds: Double = 0) -> Data {
        let object: [String: Any] = ["job": job, "operations": [["id": "a", "kind": "sleep", "seconds": seconds]]]
        return (try? PropertyListSerialization.data(fromPropertyList: object, format: .binary, options: 0)) ?? Data()
    }

    static func drop(_ inbox: String, _ name: String, seconds: Double = 0) {
        let hidden = inbox + "/." + name
        _ = FileManager.default.createFile(atPath: hidden, contents: manifest(String(name.dropLast(6)), seconds: seconds))
        rename(hidden, inbox + "/" + name)
    }

    /// CPUs the daemon is held to (`taskset -c`), nil for any.
    nonisolated(unsafe) static var daemonCPUs: String?

    static func daemon(_ spool: String, _ extra: [String], target: String? = nil) -> Process {
        let process = Process()
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let opqueued = (exe as NSString).deletingLastPathComponent + "/opqueued"
        let target = target ?? (journalIsListening() ? "journal" : "console")
        let arguments = ["--spool", spool, "--log-target", target] + extra
        if let cpus = daemonCPUs {
            // taskset execs the daemon in its own process: the pid is the daemon's.
            process.executableURL = URL(fileURLWithPath: "/usr/bin/taskset")
            process.arguments = ["-c", cpus, opqueued] + arguments
        } else {
            process.executableURL = URL(fileURLWithPath: opqueued)
            process.arguments = arguments
        }
        process.standardError = FileHandle.nullDevice
        try? process.run()
        Children.track(process)
        return process
    }

    static func waitForSocket(_ spool: String) {
        for _ in 0..<500 where !FileManager.default.fileExists(atPath: spool + "/opqueued.sock") { usleep(10_000) }
        usleep(100_000)
    }

    /// Entries in a folder, counted without building names (the throughput loop polls the outbox).
    static func count(_ folder: String) -> Int {
        guard let dir = opendir(folder) else { return 0 }
        defer { closedir(dir) }
        var n = 0
        while let entry = readdir(dir) {
            // Not ".", "..", nor the daemon's own files (active/.progress.log).
            if withUnsafeBytes(of: entry.pointee.d_name, { $0[0] }) != 0x2E { n += 1 }
        }
        return n
    }

    static func peakRSS(_ pid: Int32) -> Double { processMemoryMB(pid) }

    /// Seconds from each of `samples` manifests' rename into the running daemon's inbox to its claim (the rename out
    /// of the inbox, seen with inotify), sorted; `pause` seconds between two.
    static func pickupLatencies(_ spool: String, samples: Int, prefix: String = "p", pause: useconds_t = 5_000) -> [Double] {
        let fd = inotify_init1(Int32(IN_CLOEXEC))
        inotify_add_watch(fd, spool + "/inbox", UInt32(IN_MOVED_FROM))
        var latencies: [Double] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        for i in 0..<samples {
            let name = "\(prefix)\(i).plist"
            let hidden = spool + "/inbox/." + name
            _ = FileManager.default.createFile(atPath: hidden, contents: manifest("\(prefix)\(i)"))
            let start = now()
            rename(hidden, spool + "/inbox/" + name)
            var seen = false
            while !seen {
                let got = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if got <= 0 { break }
                // One read may hold several events: our own rename of the hidden file (MOVED_FROM too)
                // and the daemon's claim, which renames the file out of the inbox.
                var offset = 0
                while offset + 16 <= got {
                    let length = buffer[offset + 12..<offset + 16].reversed().reduce(0) { $0 << 8 | Int($1) }
                    let nameBytes = buffer[offset + 16..<min(got, offset + 16 + length)].prefix { $0 != 0 }
                    if String(decoding: nameBytes, as: UTF8.self) == name { seen = true }
                    offset += 16 + length
                }
            }
            latencies.append(now() - start)
            usleep(pause)
        }
        close(fd)
        return latencies.sorted()
    }

    /// N manifests through a daemon logging to `target`: manifests a second (one line emitted).
    /// With the journal, also counts the run's entries in it (every job's id starts with the spool's name): none may be lost.
    static func throughput(_ spool: String, _ n: Int, target: String) -> Double {
        try? FileManager.default.createDirectory(atPath: spool + "/inbox", withIntermediateDirectories: true)
        Leftovers.shared.removeLater(spool)
        let prefix = (spool as NSString).lastPathComponent
        for i in 0..<n { drop(spool + "/inbox", "\(prefix)-\(i).plist") }
        let wall = Date().timeIntervalSince1970
        let start = now()
        let d = daemon(spool, [], target: target)
        while count(spool + "/outbox") < n && d.isRunning { usleep(50_000) }
        let seconds = now() - start
        let rss = peakRSS(d.processIdentifier)
        d.terminate()
        d.waitUntilExit()
        var entries = ""
        if target == "journal" {
            let counted = journalEntries(since: wall - 1, jobPrefix: prefix + "-")
            entries = String(format: " journal_entries=%d per_manifest=%.2f", counted, Double(counted) / Double(n))
        }
        emit(String(format: "spool throughput log_target=%@ manifests=%d seconds=%.2f manifests_per_second=%.0f peak_rss_mb=%.0f",
                    target, n, seconds, Double(n) / seconds, rss) + entries)
        return Double(n) / seconds
    }

    /// Entries since `since` (seconds since 1970) whose OPQ_JOB starts with `jobPrefix`, as journalctl reads them.
    static func journalEntries(since: Double, jobPrefix: String) -> Int {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/journalctl")
        process.arguments = ["-t", "opqueued", "--since", "@\(Int(since))", "-o", "cat", "--output-fields=OPQ_JOB", "--no-pager"]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return -1 }
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self).split(separator: "\n").filter { $0.hasPrefix(jobPrefix) }.count
    }

    /// The output of a small program, or nil when it cannot be run or fails.
    static func output(_ program: String, _ arguments: [String]) -> String? {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return nil }
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return process.terminationStatus == 0 ? String(decoding: data, as: UTF8.self) : nil
    }

    /// journald held to CPU 1 and the daemons to CPU 0 until `body` returns (journald's own mask given back then).
    static func withJournaldApart(_ body: () -> Void) {
        guard let pid = output("/usr/bin/pgrep", ["-x", "systemd-journal"])?.split(separator: "\n").first.map(String.init),
              let shown = output("/usr/bin/taskset", ["-p", pid]),
              let mask = shown.split(separator: ":").last?.trimmingCharacters(in: .whitespacesAndNewlines),
              output("/usr/bin/taskset", ["-p", "-c", "1", pid]) != nil else {
            emit("spool journald_apart unavailable (journald's pid or taskset): the runs share the cores")
            return body()
        }
        emit("spool journald_apart daemon_cpus=0 journald_cpus=1 journald_pid=\(pid)")
        daemonCPUs = "0"
        body()
        daemonCPUs = nil
        _ = output("/usr/bin/taskset", ["-p", mask, pid])
    }

    /// `spool [N] [--rounds R] [--journald-apart]`: R rounds of the throughput pair (default 1).
    static func run(_ arguments: [String]) {
        let n = arguments.first.flatMap(Int.init) ?? 10_000
        let rounds = arguments.firstIndex(of: "--rounds").flatMap { $0 + 1 < arguments.count ? Int(arguments[$0 + 1]) : nil } ?? 1
        if arguments.contains("--journald-apart") {
            return withJournaldApart { throughputPairs(n, rounds: rounds, base: NSTemporaryDirectory() + "opq-bench-\(getpid())") }
        }
        let base = NSTemporaryDirectory() + "opq-bench-\(getpid())"

        // Pickup latency on an idle daemon.
        let spool1 = base + "-pickup"
        try? FileManager.default.createDirectory(atPath: spool1 + "/inbox", withIntermediateDirectories: true)
        Leftovers.shared.removeLater(spool1)
        let d1 = daemon(spool1, [])
        waitForSocket(spool1)
        let latencies = pickupLatencies(spool1, samples: 300)
        d1.terminate()
        d1.waitUntilExit()
        emit(String(format: "spool pickup_latency_ms p50=%.2f p99=%.2f samples=%d", latencies[latencies.count / 2] * 1e3,
                    latencies[latencies.count * 99 / 100] * 1e3, latencies.count))

        throughputPairs(n, rounds: rounds, base: base)

        // RSS with N waiting.
        let spool3 = base + "-waiting"
        try? FileManager.default.createDirectory(atPath: spool3 + "/inbox", withIntermediateDirectories: true)
        let config = base + "-config.plist"
        Leftovers.shared.removeLater(spool3)
        Leftovers.shared.removeLater(config)
        let configData = try? PropertyListSerialization.data(fromPropertyList: ["queues": ["default": ["suspended": true]]],
                                                             format: .xml, options: 0)
        _ = FileManager.default.createFile(atPath: config, contents: configData)
        for i in 0..<n { drop(spool3 + "/inbox", "w\(i).plist") }
        let d3 = daemon(spool3, ["--config", config])
        waitForSocket(spool3)
        sleep(3)
        let rss3 = peakRSS(d3.processIdentifier)
        d3.terminate()
        d3.waitUntilExit()
        emit(String(format: "spool waiting manifests=%d claimed=%d peak_rss_mb=%.1f", n, count(spool3 + "/active"), rss3))
        for path in [spool1, spool3, config] { try? FileManager.default.removeItem(atPath: path) }
    }

    /// Whether journald's files are on the file system the spools are made on: then every commit of the daemon
    /// (a syncfs) also writes out what journald wrote meanwhile, and the journal target pays for it. The file is the
    /// one journald has open (its system.journal), else /var/log/journal or /run/log/journal.
    static func journalFilesShareFileSystem(with base: String) -> Bool {
        func device(_ path: String) -> UInt? {
            var st = stat()
            return stat(path, &st) == 0 ? UInt(st.st_dev) : nil
        }
        let fm = FileManager.default
        let journald = ((try? fm.contentsOfDirectory(atPath: "/proc")) ?? []).first { pid in
            (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8)) == "systemd-journal\n"
        }
        let open = journald.flatMap { pid in
            ((try? fm.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? [])
                .compactMap { try? fm.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)") }
                .first { $0.hasSuffix("/system.journal") }
        }
        let journal = open.flatMap(device) ?? device("/var/log/journal") ?? device("/run/log/journal")
        return journal != nil && journal == device((base as NSString).deletingLastPathComponent)
    }

    /// Throughput, to the console and to the journal, alternating (so that both meet the same load), the console first
    /// in even rounds and the journal first in odd ones (the second run of a pair finds the first's files on the disk).
    static func throughputPairs(_ n: Int, rounds: Int, base: String) {
        var rates: [String: [Double]] = [:]
        let targets = journalIsListening() ? ["console", "journal"] : ["console"]
        if targets.count == 2 { emit("spool journal_files_on_spool_fs=\(journalFilesShareFileSystem(with: base))") }
        for round in 0..<rounds {
            for target in round % 2 == 0 ? targets : targets.reversed() {
                let rate = throughput(base + "-throughput-\(target)-\(round)", n, target: target)
                rates[target, default: []].append(rate)
            }
        }
        if let console = rates["console"], let journal = rates["journal"] {
            let ratios = zip(journal, console).map { $0 / $1 }.sorted()
            emit(String(format: "spool journal_over_console median=%.2f min=%.2f max=%.2f rounds=%d", median(ratios),
                        ratios[0], ratios[ratios.count - 1], ratios.count))
        }
    }
}
