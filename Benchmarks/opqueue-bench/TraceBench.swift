// opqueue-bench tracing: the cost of `tracing.otlp` (SPEC §6), the spool end to end with traces on against the same
// run with them off (the anchor), in alternating rounds of one run: N manifests of three operations (a, then b and c
// after it) placed in the inbox, daemon started, until N outbox entries. With traces on, every job's 4 spans go to
// a loopback collector that answers at once without decoding (Tests/Support/otlp_receiver.py discard). Beside the
// wall-clock ratio, the daemon's own CPU time (user + system, from /proc) per round: on a machine shared with other
// work the CPU ratio is the steadier of the two.

import Daemon
import Foundation
import TestSupport

enum TraceBench {
    static func manifest(_ job: String) -> Data {
        let operations: [[String: Any]] = [["id": "a", "kind": "sleep", "seconds": 0],
                                           ["id": "b", "kind": "sleep", "seconds": 0, "dependencies": ["a"]],
                                           ["id": "c", "kind": "sleep", "seconds": 0, "dependencies": ["a"]]]
        return (try? PropertyListSerialization.data(fromPropertyList: ["job": job, "operations": operations], format: .binary,
                                                    options: 0)) ?? Data()
    }

    /// Seconds from the daemon's start to N outbox entries, and the daemon's CPU seconds meanwhile.
    static func round(_ n: Int, config: [String: Any], base: String) -> (seconds: Double, cpu: Double) {
        let spool = base + "-\(UUID().uuidString.prefix(6))"
        try? FileManager.default.createDirectory(atPath: spool + "/inbox", withIntermediateDirectories: true)
        let configPath = spool + ".plist"
        let configData = try? PropertyListSerialization.data(fromPropertyList: config, format: .xml, options: 0)
        _ = FileManager.default.createFile(atPath: configPath, contents: configData)
        for i in 0..<n {
            let hidden = spool + "/inbox/.j\(i).plist"
            _ = FileManager.default.createFile(atPath: hidden, contents: manifest("j\(i)"))
            rename(hidden, spool + "/inbox/j\(i).plist")
        }
        let start = now()
        let d = SpoolBench.daemon(spool, ["--config", configPath])
        while SpoolBench.count(spool + "/outbox") < n && d.isRunning { usleep(20_000) }
        let seconds = now() - start, cpu = processCPUSeconds(d.processIdentifier)
        d.terminate()
        d.waitUntilExit()
        for path in [spool, configPath] { try? FileManager.default.removeItem(atPath: path) }
        return (seconds, cpu)
    }

    static func run(_ arguments: [String]) {
        let n = arguments.first.flatMap(Int.init) ?? 3_000
        let rounds = 3
        let base = NSTemporaryDirectory() + "opq-bench-trace-\(getpid())"
        guard let collector = try? OTLPReceiver(.discard) else {
            FileHandle.standardError.write(Data("tracing: the loopback collector did not start\n".utf8))
            exit(1)
        }
        var off: [(seconds: Double, cpu: Double)] = [], on: [(seconds: Double, cpu: Double)] = []
        for _ in 0..<rounds {
            off.append(round(n, config: [:], base: base))
            on.append(round(n, config: ["tracing": ["otlp": collector.base]], base: base))
        }
        func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
        let offSeconds = median(off.map(\.seconds)), onSeconds = median(on.map(\.seconds))
        let offCPU = median(off.map(\.cpu)), onCPU = median(on.map(\.cpu))
        emit(String(format: "tracing manifests=%d operations=%d rounds=%d off_seconds=%.2f on_seconds=%.2f on_over_off=%.3f "
                    + "off_cpu_us_per_job=%.0f on_cpu_us_per_job=%.0f cpu_on_over_off=%.3f collector_requests=%d",
                    n, 3 * n, rounds, offSeconds, onSeconds, onSeconds / offSeconds, offCPU / Double(n) * 1e6,
                    onCPU / Double(n) * 1e6, onCPU / offCPU, collector.lines.count))
    }
}
