// opqueue-bench control: `status` latency on the control socket with 0 (the anchor), 100 and 1,000 idle
// connections open (release build of opqueued beside this binary).
//
//   swift build -c release --product opqueue-bench --product opqueued
//   .build/release/opqueue-bench control [--samples 500]
//
// For each count: that many connections are opened and left silent, then `samples` status requests are timed one
// after the other (connect, request, answer, close: what `opqueuectl status` does, without its process start;
// `first` is the one sent right after the idle connections, which waits behind the daemon accepting them),
// then a job of one 0.2 s `sleep` is timed from its rename into the inbox to its outbox entry. All of it falls
// within the daemon's 5 s request deadline, so the idle connections are still open (up to the 256 the daemon
// keeps; it closes the oldest idle ones beyond that: `daemon_fds` says how many descriptors it holds).

import ControlPlane
import Daemon
import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

enum ControlBench {
    static func run(_ arguments: [String]) {
        let samples = arguments.firstIndex(of: "--samples").flatMap { $0 + 1 < arguments.count ? Int(arguments[$0 + 1]) : nil } ?? 500
        // 1,000 idle connections and their clients' descriptors in this process.
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        limit.rlim_cur = limit.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)

        let spool = NSTemporaryDirectory() + "opq-bench-control-\(getpid())"
        try? FileManager.default.createDirectory(atPath: spool + "/inbox", withIntermediateDirectories: true)
        let daemon = SpoolBench.daemon(spool, [])
        defer {
            daemon.terminate()
            daemon.waitUntilExit()
            try? FileManager.default.removeItem(atPath: spool)
        }
        SpoolBench.waitForSocket(spool)
        let socket = spool + "/opqueued.sock"
        for (round, idleCount) in [0, 100, 1000].enumerated() {
            var idle: [Int32] = []
            let openStart = now()
            for _ in 0..<idleCount {
                guard let fd = try? ControlClient.connect(socket) else { break }
                idle.append(fd)
            }
            let openSeconds = now() - openStart
            var latencies: [Double] = []
            var first = Double.nan
            var failures = 0
            for _ in 0..<samples {
                let start = now()
                if (try? ControlClient.request(socket, ["command": "status"], timeout: 5))?["exit"] as? Int == 0 {
                    latencies.append(now() - start)
                    if latencies.count == 1 { first = latencies[0] * 1e3 }
                } else {
                    failures += 1
                }
            }
            let daemonFDs = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(daemon.processIdentifier)/fd").count) ?? -1
            let job = "bench\(round)"
            let jobStart = now()
            SpoolBench.drop(spool + "/inbox", job + ".plist", seconds: 0.2)
            while !FileManager.default.fileExists(atPath: spool + "/outbox/" + job) && now() - jobStart < 30 { usleep(2_000) }
            let jobSeconds = now() - jobStart
            for fd in idle { close(fd) }
            latencies.sort()
            func at(_ q: Double) -> Double {
                latencies.isEmpty ? .nan : latencies[min(latencies.count - 1, Int(Double(latencies.count) * q))] * 1e3
            }
            emit(String(format: "control idle=%d opened=%d open_seconds=%.2f daemon_fds=%d status_ms p50=%.3f p99=%.3f max=%.3f first=%.3f "
                        + "samples=%d failures=%d sleep_0.2s_job_seconds=%.3f",
                        idleCount, idle.count, openSeconds, daemonFDs, at(0.5), at(0.99), latencies.last.map { $0 * 1e3 } ?? .nan, first,
                        latencies.count, failures, jobSeconds))
            usleep(300_000)
        }
    }
}
