// opqueue-bench spool: the daemon end to end (release build of opqueued beside this binary).
//
//   pickup latency   a manifest renamed into an idle daemon's inbox → its claim (the rename out of the inbox,
//                    seen with inotify; the `received` event is logged right after), p50 and p99 over 300
//   throughput       N single-`sleep 0` manifests placed in the inbox, daemon started, until N outbox entries
//                    (full durability; journald logging when a journal socket exists, else console to /dev/null)
//   waiting RSS      the daemon's peak RSS with N manifests waiting in the inbox (its queue suspended)

import Daemon
import Foundation
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

    static func daemon(_ spool: String, _ extra: [String]) -> Process {
        let process = Process()
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        process.executableURL = URL(fileURLWithPath: (exe as NSString).deletingLastPathComponent + "/opqueued")
        let target = journalIsListening() ? "journal" : "console"
        process.arguments = ["--spool", spool, "--log-target", target] + extra
        process.standardError = FileHandle.nullDevice
        try? process.run()
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

    static func run(_ arguments: [String]) {
        let n = arguments.first.flatMap(Int.init) ?? 10_000
        let base = NSTemporaryDirectory() + "opq-bench-\(getpid())"

        // Pickup latency on an idle daemon.
        let spool1 = base + "-pickup"
        try? FileManager.default.createDirectory(atPath: spool1 + "/inbox", withIntermediateDirectories: true)
        let d1 = daemon(spool1, [])
        waitForSocket(spool1)
        let latencies = pickupLatencies(spool1, samples: 300)
        d1.terminate()
        d1.waitUntilExit()
        emit(String(format: "spool pickup_latency_ms p50=%.2f p99=%.2f samples=%d", latencies[latencies.count / 2] * 1e3,
                    latencies[latencies.count * 99 / 100] * 1e3, latencies.count))

        // Throughput.
        let spool2 = base + "-throughput"
        try? FileManager.default.createDirectory(atPath: spool2 + "/inbox", withIntermediateDirectories: true)
        for i in 0..<n { drop(spool2 + "/inbox", "t\(i).plist") }
        let start = now()
        let d2 = daemon(spool2, [])
        while count(spool2 + "/outbox") < n && d2.isRunning { usleep(50_000) }
        let seconds = now() - start
        let rss2 = peakRSS(d2.processIdentifier)
        d2.terminate()
        d2.waitUntilExit()
        emit(String(format: "spool throughput manifests=%d seconds=%.2f manifests_per_second=%.0f peak_rss_mb=%.0f",
                    n, seconds, Double(n) / seconds, rss2))

        // RSS with N waiting.
        let spool3 = base + "-waiting"
        try? FileManager.default.createDirectory(atPath: spool3 + "/inbox", withIntermediateDirectories: true)
        let config = base + "-config.plist"
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
        for path in [spool1, spool2, spool3, config] { try? FileManager.default.removeItem(atPath: path) }
    }
}
