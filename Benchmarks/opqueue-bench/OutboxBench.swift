// opqueue-bench outbox [N]: the operator's verbs on an outbox of N ended jobs (default 100,000; tiny results written
// straight into the outbox, half of them 30 days old), with opqueuectl and opqueued beside this binary.
//
//   list, clean      `opqueuectl list`, `list --json`, `clean --dry-run` and `clean --older-than 7` (removing N/2):
//                    wall time and the child's own peak RSS (wait4)
//   pickup latency   a manifest renamed into the daemon's inbox → its claim (SpoolBench.pickupLatencies), p50 and p99:
//                    idle; while the daemon's own retention (outbox.keepDays = 7) removes N/2 folders; and while
//                    `opqueuectl clean` removes N/2 beside an idle daemon. The issue asks that the last two stay
//                    within the idle figures.

import Daemon
import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

enum OutboxBench {
    static func run(_ arguments: [String]) {
        let n = arguments.first.flatMap(Int.init) ?? 100_000
        let base = NSTemporaryDirectory() + "opq-bench-outbox-\(getpid())"
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let ctl = (exe as NSString).deletingLastPathComponent + "/opqueuectl"
        defer { try? FileManager.default.removeItem(atPath: base) }

        // list and clean.
        let spool = base + "/verbs"
        let began = now()
        fill(spool, n)
        emit(String(format: "outbox write jobs=%d seconds=%.1f", n, now() - began))
        for (what, arguments) in [("list", ["list"]), ("list_json", ["list", "--json"]),
                                  ("clean_dry_run", ["clean", "--older-than", "7", "--dry-run"]),
                                  ("clean", ["clean", "--older-than", "7"])] {
            guard let run = try? runMeasuringMemory(ctl, ["--spool", spool] + arguments), run.status == 0 else {
                emit("outbox \(what) jobs=\(n) failed")
                continue
            }
            emit(String(format: "outbox %@ jobs=%d seconds=%.2f peak_rss_mb=%.1f", what, n, run.seconds, run.peakRSSMegabytes))
        }

        // Pickup latency: idle, during the daemon's retention, during `opqueuectl clean`.
        let config = base + "/keep.plist"
        let keep = try? PropertyListSerialization.data(fromPropertyList: ["outbox": ["keepDays": 7]], format: .xml, options: 0)
        _ = FileManager.default.createFile(atPath: config, contents: keep)
        let idle = base + "/idle"
        try? FileManager.default.createDirectory(atPath: idle + "/inbox", withIntermediateDirectories: true)
        let d1 = SpoolBench.daemon(idle, ["--config", config])
        SpoolBench.waitForSocket(idle)
        report("idle", SpoolBench.pickupLatencies(idle, samples: 200))
        d1.terminate()
        d1.waitUntilExit()

        let retained = base + "/retention"
        fill(retained, n)
        let d2 = SpoolBench.daemon(retained, ["--config", config])
        SpoolBench.waitForSocket(retained)
        let retentionBegan = now()
        report("during_retention", SpoolBench.pickupLatencies(retained, samples: 200, prefix: "r"))
        while SpoolBench.count(retained + "/outbox") > n / 2 + 200 && now() - retentionBegan < 600 { usleep(200_000) }
        emit(String(format: "outbox retention removed=%d seconds=%.1f", n / 2, now() - retentionBegan))
        d2.terminate()
        d2.waitUntilExit()

        let cleaned = base + "/clean"
        fill(cleaned, n)
        let d3 = SpoolBench.daemon(cleaned, [])
        SpoolBench.waitForSocket(cleaned)
        let clean = Process()
        clean.executableURL = URL(fileURLWithPath: ctl)
        clean.arguments = ["--spool", cleaned, "clean", "--older-than", "7"]
        clean.standardOutput = FileHandle.nullDevice
        try? clean.run()
        report("during_clean", SpoolBench.pickupLatencies(cleaned, samples: 200, prefix: "c"))
        emit("outbox clean_still_running_after_samples=\(clean.isRunning)")
        clean.waitUntilExit()
        d3.terminate()
        d3.waitUntilExit()
    }

    /// N ended jobs in `spool`'s outbox, the even ones finished 30 days ago, the odd ones an hour ago.
    static func fill(_ spool: String, _ n: Int) {
        try? FileManager.default.createDirectory(atPath: spool + "/inbox", withIntermediateDirectories: true)
        let now = Date().timeIntervalSince1970
        do {
            try writeEndedJobs(outbox: spool + "/outbox", count: n, finishedAt: { now - ($0 % 2 == 0 ? 30 * 86_400 : 3_600) })
        } catch {
            FileHandle.standardError.write(Data("outbox: \(error)\n".utf8))
            exit(1)
        }
    }

    static func report(_ what: String, _ latencies: [Double]) {
        guard !latencies.isEmpty else { return }
        emit(String(format: "outbox pickup_latency_ms %@ p50=%.2f p99=%.2f samples=%d", what, latencies[latencies.count / 2] * 1e3,
                    latencies[latencies.count * 99 / 100] * 1e3, latencies.count))
    }
}
