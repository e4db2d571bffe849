// opqueue-bench commands [N]: configured commands (issue 13) through the release daemon, in one run:
//   rate      N `/bin/true` commands in one manifest, queue limit 1, 2 and 8: from the manifest's rename into
//             the inbox to its outbox entry (claim, N spawns + pidfd exits + log files, publication)
//   anchors   the same N `/bin/true` from a shell loop (`sh -c 'while …; do /bin/true; done'`) and from
//             `xargs -P 1|2|8`: the process spawn is the floor; each limit's ratio (daemon rate over xargs'),
//             median over `--rounds R`
//   cpu       CPU per command: the daemon's own (/proc/PID/stat), and the whole machine's busy time over the run
//             (/proc/stat: the daemon, its supervisors and commands, journald, the kernel's threads) beside the same for
//             xargs and its /bin/true (supervisors serve many commands and outlive the run, so their CPU is not in the
//             daemon's children's)
//   threads   the daemon's threads (/proc/PID/status Threads) idle, and at most while 500 `sleep 2` commands
//             run at once (limit 500): one epoll thread watches them all, so this must not grow with them

import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

enum CommandBench {
    static func configuration(limit: Int, argv: [String]) -> Data {
        let object: [String: Any] = [
            "queues": ["procs": ["maxConcurrentOperationCount": limit]],
            "commands": ["c": ["argv": argv, "queue": "procs"]],
        ]
        return (try? PropertyListSerialization.data(fromPropertyList: object, format: .xml, options: 0)) ?? Data()
    }

    static func manifest(_ job: String, count: Int, sleep: Bool = false) -> Data {
        let object: [String: Any] = ["job": job, "operations": (0..<count).map {
            sleep ? ["id": "c\($0)", "kind": "sleep", "seconds": 2, "queue": "procs"] : ["id": "c\($0)", "kind": "command", "command": "c"]
        }]
        return (try? PropertyListSerialization.data(fromPropertyList: object, format: .binary, options: 0)) ?? Data()
    }

    /// A temporary spool with the daemon running on `config`; returns (root, daemon).
    static func start(_ config: Data) -> (String, Process) {
        let root = NSTemporaryDirectory() + "opq-cmdbench-" + UUID().uuidString.prefix(8)
        try? FileManager.default.createDirectory(atPath: root + "/inbox", withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: root + ".plist", contents: config)
        let daemon = SpoolBench.daemon(root, ["--config", root + ".plist"])
        SpoolBench.waitForSocket(root)
        return (root, daemon)
    }

    static func stop(_ root: String, _ daemon: Process) {
        kill(daemon.processIdentifier, SIGKILL)
        daemon.waitUntilExit()
        Leftovers.shared.removeLater(root)
        Leftovers.shared.removeLater(root + ".plist")
    }

    /// Seconds from the manifest's arrival to its outbox entry; CPU seconds of the daemon itself, and of the whole
    /// machine, over that time.
    static func throughDaemon(count: Int, limit: Int) -> (seconds: Double, daemonCPU: Double, machineCPU: Double) {
        let (root, daemon) = start(configuration(limit: limit, argv: ["/bin/true"]))
        defer { stop(root, daemon) }
        let hidden = root + "/inbox/.m.plist"
        _ = FileManager.default.createFile(atPath: hidden, contents: manifest("m", count: count))
        let own = processCPU(daemon.processIdentifier).own, busy = machineBusy()
        let t0 = now()
        rename(hidden, root + "/inbox/m.plist")
        while !FileManager.default.fileExists(atPath: root + "/outbox/m/result.plist") { usleep(2_000) }
        let seconds = now() - t0
        return (seconds, processCPU(daemon.processIdentifier).own - own, machineBusy() - busy)
    }

    /// Seconds every CPU of the machine spent busy since boot (/proc/stat: all but idle and iowait).
    static func machineBusy() -> Double {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
              let line = text.split(separator: "\n").first else { return 0 }
        let ticks = line.split(separator: " ").dropFirst().map { Double($0) ?? 0 }
        guard ticks.count > 4 else { return 0 }
        return (ticks.reduce(0, +) - ticks[3] - ticks[4]) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// utime + stime, and cutime + cstime (the processes it waited for, theirs included), of `pid`, in seconds.
    static func processCPU(_ pid: Int32) -> (own: Double, children: Double) {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return (0, 0) }
        // After "pid (comm) ": field 3 (the state) at index 0, so utime (field 14) to cstime (17) at 11 to 14.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        let tick = Double(sysconf(Int32(_SC_CLK_TCK)))
        guard fields.count > 14 else { return (0, 0) }
        let ticks = (11...14).map { Double(fields[$0]) ?? 0 }
        return ((ticks[0] + ticks[1]) / tick, (ticks[2] + ticks[3]) / tick)
    }

    /// Seconds the program took, and the CPU seconds the whole machine was busy meanwhile.
    static func timed(_ argv: [String]) -> (seconds: Double, cpu: Double) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: argv[0])
        process.arguments = Array(argv.dropFirst())
        process.standardOutput = FileHandle.nullDevice
        let before = machineBusy()
        let t0 = now()
        try? process.run()
        process.waitUntilExit()
        return (now() - t0, machineBusy() - before)
    }

    static func threads(_ pid: Int32) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("Threads:") }) else { return 0 }
        return Int(line.split(separator: "\t").last ?? "") ?? 0
    }

    /// `commands [N] [--rounds R]`: R rounds (default 1) of the rate part, each limit's daemon run beside its
    /// `xargs -P` run; the ratios' medians over the rounds close it.
    static func run(_ arguments: [String]) {
        let n = arguments.first.flatMap(Int.init) ?? 2000
        let rounds = arguments.firstIndex(of: "--rounds").flatMap { $0 + 1 < arguments.count ? Int(arguments[$0 + 1]) : nil } ?? 1
        func line(_ what: String, _ seconds: Double) {
            print(String(format: "commands %@ n=%d seconds=%.3f per_second=%.0f", what, n, seconds, Double(n) / seconds))
        }
        var ratios: [Int: [Double]] = [:]
        for _ in 0..<rounds {
            let loop = timed(["/bin/sh", "-c", "i=0; while [ $i -lt \(n) ]; do /bin/true; i=$((i+1)); done"]).seconds
            line("shell-loop", loop)
            for limit in [1, 2, 8] {
                let daemon = throughDaemon(count: n, limit: limit)
                line("opqueued limit=\(limit)", daemon.seconds)
                let xargs = timed(["/bin/sh", "-c", "seq \(n) | xargs -P \(limit) -n 1 /bin/true"])
                line("xargs -P\(limit)", xargs.seconds)
                let ms = { (seconds: Double) in seconds * 1000 / Double(n) }
                print(String(format: "commands cpu limit=%d ms_per_command daemon=%.3f machine=%.3f machine_with_xargs=%.3f",
                             limit, ms(daemon.daemonCPU), ms(daemon.machineCPU), ms(xargs.cpu)))
                ratios[limit, default: []].append(xargs.seconds / daemon.seconds)
            }
        }
        for limit in [1, 2, 8] {
            let sorted = (ratios[limit] ?? []).sorted()
            guard !sorted.isEmpty else { continue }
            print(String(format: "commands ratio limit=%d opqueued_over_xargs median=%.2f min=%.2f max=%.2f rounds=%d", limit,
                         sorted[sorted.count / 2], sorted[0], sorted[sorted.count - 1], sorted.count))
        }
        // Threads while 500 commands run at once, beside 500 `sleep 2` operations (asynchronous, no process).
        for sleep in [false, true] {
            let (root, daemon) = start(configuration(limit: 500, argv: ["/bin/sleep", "2"]))
            defer { stop(root, daemon) }
            let idle = threads(daemon.processIdentifier)
            let hidden = root + "/inbox/.t.plist"
            _ = FileManager.default.createFile(atPath: hidden, contents: manifest("t", count: 500, sleep: sleep))
            rename(hidden, root + "/inbox/t.plist")
            var most = 0, children = 0
            let deadline = now() + 30
            while !FileManager.default.fileExists(atPath: root + "/outbox/t/result.plist") && now() < deadline {
                most = max(most, threads(daemon.processIdentifier))
                // Children are listed per thread that spawned them.
                let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(daemon.processIdentifier)/task")) ?? []
                let kids = tasks.reduce(0) { sum, task in
                    sum + ((try? String(contentsOfFile: "/proc/\(daemon.processIdentifier)/task/\(task)/children", encoding: .utf8)) ?? "")
                        .split(separator: " ").count
                }
                children = max(children, kids)
                usleep(20_000)
            }
            print("commands threads kind=\(sleep ? "sleep" : "command") operations=500 idle=\(idle) "
                  + "max_while_running=\(most) max_children_at_once=\(children)")
        }
    }
}
