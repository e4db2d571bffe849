// The load campaign (issue 5.5): N one-operation manifests dropped into the inbox at once, then one
// manifest of M operations (chains of ten `sleep 0`), into a running daemon logging to journald.
// Throughout, `status` is asked every 10 ms from another thread (latency p99 and max), and the daemon's
// peak RSS is read. Afterwards the journal must hold every transition: four per operation (pending,
// ready, executing, succeeded) and one `finished` per job, counted with journalctl by the daemon's pid and
// since the moment before it started: a pid is reused, and an earlier process with this pid (a test's daemon, on a
// machine that has run thousands of processes) may have logged jobs of its own.

import ControlPlane
import Daemon
import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

struct LoadCampaign {
    var manifests: Int
    var operations: Int
    var parent: String

    /// Asks `status` every 10 ms and times each answer. Beside it, a meter thread sleeps 1 ms at a time and records
    /// how late it wakes: the machine's own stalls (a VM's stolen time, a busy CI host), which hold up any process.
    /// An answer is judged net of the stall the meter saw while it was awaited, so a stall of the daemon's counts in
    /// full and one of the machine's does not.
    final class StatusProbe: @unchecked Sendable {
        struct Result {
            var p99: Double, max: Double, maxNet: Double, machineStall: Double, count: Int, failures: Int
            /// Within 100 ms throughout (issue 5's load), net of the machine's stalls; none unanswered.
            var ok: Bool { maxNet < 100 && failures == 0 }
            var fields: String {
                String(format: "status_p99_ms=%.1f status_max_ms=%.1f status_max_net_ms=%.1f machine_stall_max_ms=%.1f "
                       + "status_asked=%d status_failed=%d", p99, max, maxNet, machineStall, count, failures)
            }
        }
        let socket: String
        private let lock = NSLock()
        private var answers: [(start: Double, ms: Double)] = []
        private var stalls: [(start: Double, ms: Double)] = []
        private var failures = 0
        private var running = true

        init(socket: String) { self.socket = socket }

        func start() {
            Thread.detachNewThread { [self] in
                while lock.withLock({ running }) {
                    let t0 = now()
                    let ok = (try? ControlClient.request(socket, ["command": "status"], timeout: 5)) != nil
                    let ms = (now() - t0) * 1000
                    lock.withLock { if ok { answers.append((t0, ms)) } else { failures += 1 } }
                    usleep(10_000)
                }
            }
            Thread.detachNewThread { [self] in
                while lock.withLock({ running }) {
                    let t0 = now()
                    usleep(1_000)
                    let late = (now() - t0) * 1000 - 1
                    if late > 2 { lock.withLock { stalls.append((t0, late)) } }
                }
            }
        }

        func stop() -> Result {
            lock.withLock {
                running = false
                let net = answers.map { answer in
                    let end = answer.start + answer.ms / 1000
                    let overlapping = stalls.filter { $0.start < end && $0.start + $0.ms / 1000 > answer.start }
                    return answer.ms - overlapping.reduce(0) { $0 + $1.ms }
                }
                let latencies = answers.map(\.ms)
                return Result(p99: percentile(latencies, 0.99), max: latencies.max() ?? 0, maxNet: net.max() ?? 0,
                              machineStall: stalls.map(\.ms).max() ?? 0, count: answers.count, failures: failures)
            }
        }
    }

    func journalCount(_ matches: [String]) -> Int {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/journalctl")
        p.arguments = ["--no-pager", "-q", "-o", "cat"] + matches
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = FileHandle.nullDevice
        guard (try? p.run()) != nil else { return -1 }
        var lines = 0
        let handle = pipe.fileHandleForReading
        while true {
            let chunk = handle.availableData
            if chunk.isEmpty { break }
            lines += chunk.reduce(0) { $0 + ($1 == 0x0A ? 1 : 0) }
        }
        p.waitUntilExit()
        return lines
    }

    func run() throws -> Bool {
        try ensureJournald()
        let spool = try CampaignSpool("load", parent: parent, settings: ["maxActiveJobs": 64])
        let log = spool.root + ".log"
        let since = String(format: "@%.6f", Date().timeIntervalSince1970)
        let daemon = try DaemonProcess(spool: spool, log: log, extra: ["--log-target", "journal"])
        guard daemon.waitUntilReady(spool) else { throw CampaignFailure(description: "the daemon did not start; see \(log)") }
        let probe = StatusProbe(socket: spool.root + "/opqueued.sock")
        probe.start()
        var ok = true

        ok = try massDrop(spool: spool, daemon: daemon, probe: probe) && ok
        if operations > 0 { ok = bigManifest(spool: spool, daemon: daemon) && ok }

        let pid = daemon.pid
        daemon.signal(SIGTERM)
        let exit = daemon.wait(timeout: 60)
        ok = ok && exit == 0
        // 3. The journal: every transition of every operation, every job's end.
        usleep(500_000)
        let transitions = journalCount(["--since", since, "_PID=\(pid)", "OPQ_EVENT=operation"])
        let finished = journalCount(["--since", since, "_PID=\(pid)", "OPQ_EVENT=job", "OPQ_STATE=finished"])
        let expected = 4 * (manifests + operations)
        let expectedJobs = manifests + (operations > 0 ? 1 : 0)
        say("campaign=load part=journal transitions=\(transitions) expected=\(expected) jobs_finished=\(finished) "
            + "expected_jobs=\(expectedJobs) daemon_exit=\(exit.map(String.init) ?? "hang")")
        ok = ok && transitions == expected && finished == expectedJobs
        if ok {
            spool.remove(); try? FileManager.default.removeItem(atPath: log)
        } else {
            say("  kept for inspection: \(spool.root), \(log)")
        }
        return ok
    }

    /// 1. The mass drop: every file written aside, then all renamed in at once.
    func massDrop(spool: CampaignSpool, daemon: DaemonProcess, probe: StatusProbe) throws -> Bool {
        let stage = spool.root + "/staging"
        try FileManager.default.createDirectory(atPath: stage, withIntermediateDirectories: true)
        for i in 0..<manifests {
            let data = plistData(["job": "load\(i)", "operations": [["id": "a", "kind": "sleep", "seconds": 0]]])
            _ = FileManager.default.createFile(atPath: "\(stage)/load\(i).plist", contents: data)
        }
        let dropStart = now()
        for i in 0..<manifests { rename("\(stage)/load\(i).plist", "\(spool.inbox)/load\(i).plist") }
        let deadline = now() + max(120, Double(manifests) / 100)
        while list(spool.outbox).count < manifests && now() < deadline && daemon.isRunning { usleep(100_000) }
        let dropSeconds = now() - dropStart
        let dropRSS = daemon.peakRSS
        let dropDone = list(spool.outbox).count
        let dropStatus = probe.stop()
        say(String(format: "campaign=load part=drop manifests=%d outbox=%d seconds=%.1f manifests_per_second=%.0f peak_rss_mb=%.0f ",
                   manifests, dropDone, dropSeconds, Double(dropDone) / dropSeconds, dropRSS) + dropStatus.fields)
        return dropDone == manifests && dropStatus.ok
    }

    /// 2. One manifest of `operations` operations. (`status` must answer within 100 ms throughout:
    /// the maximum is judged, not a percentile, net of the machine's own stalls.)
    func bigManifest(spool: CampaignSpool, daemon: DaemonProcess) -> Bool {
        var ops: [[String: Any]] = []
        ops.reserveCapacity(operations)
        for i in 0..<operations {
            var op: [String: Any] = ["id": "o\(i)", "kind": "sleep", "seconds": 0]
            if i % 10 != 0 { op["dependencies"] = ["o\(i - 1)"] }
            ops.append(op)
        }
        let big = plistData(["job": "big", "operations": ops])
        ops = []
        let probe2 = StatusProbe(socket: spool.root + "/opqueued.sock")
        probe2.start()
        let bigStart = now()
        drop(spool.inbox, "big.plist", big)
        let deadline = now() + max(300, Double(operations) / 2_000)
        while !FileManager.default.fileExists(atPath: spool.outbox + "/big/result.plist") && now() < deadline && daemon.isRunning {
            usleep(100_000)
        }
        let bigSeconds = now() - bigStart
        let bigStatus = probe2.stop()
        let status = readPlist(spool.outbox + "/big/result.plist")?["status"] as? String ?? "none"
        let peak = daemon.peakRSS
        // Idle again, the daemon gives the big job's memory back.
        usleep(1_000_000)
        let idle = processMemoryMB(daemon.pid, "VmRSS")
        say(String(format: "campaign=load part=big operations=%d manifest_mb=%.1f status=%@ seconds=%.1f operations_per_second=%.0f "
                   + "peak_rss_mb=%.0f rss_idle_after_mb=%.0f ",
                   operations, Double(big.count) / 1e6, status, bigSeconds, Double(operations) / bigSeconds, peak, idle) + bigStatus.fields)
        return status == "succeeded" && bigStatus.ok && idle < max(100, peak / 2)
    }
}
