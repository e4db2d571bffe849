// What every campaign needs: the daemon as a child process, the loopback HTTP server, spool listings,
// property lists, sample images and figures (peak RSS, percentiles).

import ControlPlane
import Daemon
import Foundation
import OperationKinds
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The folder holding this executable and its siblings (opqueued, opqueuectl).
let binaries: String = {
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    return (exe as NSString).deletingLastPathComponent
}()

func now() -> Double { Date().timeIntervalSince1970 }

func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

struct CampaignFailure: Error, CustomStringConvertible {
    let description: String
}

func plistData(_ object: Any, binary: Bool = true) -> Data {
    (try? PropertyListSerialization.data(fromPropertyList: object, format: binary ? .binary : .xml, options: 0)) ?? Data()
}

func readPlist(_ path: String) -> [String: Any]? {
    guard let data = FileManager.default.contents(atPath: path) else { return nil }
    return (try? PropertyListSerialization.propertyList(from: data, format: nil)) as? [String: Any]
}

/// Names in a folder, hidden ones (the daemon's own files) left out.
func list(_ folder: String) -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).filter { !$0.hasPrefix(".") }.sorted()
}

/// Places a manifest in the inbox the way submitters should: written under a hidden name, renamed.
func drop(_ inbox: String, _ name: String, _ data: Data) {
    let hidden = inbox + "/." + name
    _ = FileManager.default.createFile(atPath: hidden, contents: data)
    rename(hidden, inbox + "/" + name)
}

/// A spool folder of its own, with a configuration file beside it.
struct CampaignSpool {
    let root: String
    let config: String
    var inbox: String { root + "/inbox" }
    var outbox: String { root + "/outbox" }

    init(root: String, config: String) {
        self.root = root
        self.config = config
    }

    init(_ name: String, parent: String, settings: [String: Any]) throws {
        root = parent + "/opq-\(name)-\(getpid())"
        try? FileManager.default.removeItem(atPath: root)
        try FileManager.default.createDirectory(atPath: root + "/inbox", withIntermediateDirectories: true)
        config = root + ".config.plist"
        try plistData(settings, binary: false).write(to: URL(fileURLWithPath: config))
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: root)
        try? FileManager.default.removeItem(atPath: config)
    }
}

/// opqueued as a child process, its console log appended to a file.
final class DaemonProcess {
    let process = Process()
    var pid: Int32 { process.processIdentifier }

    init(spool: CampaignSpool, log: String, environment: [String: String] = [:], extra: [String] = [], prefix: [String] = []) throws {
        if prefix.isEmpty {
            process.executableURL = URL(fileURLWithPath: binaries + "/opqueued")
            process.arguments = ["--spool", spool.root, "--config", spool.config, "--log-target", "console"] + extra
        } else {
            // Run through a wrapper (prlimit, setpriv): the wrapper execs the daemon, keeping the pid.
            process.executableURL = URL(fileURLWithPath: prefix[0])
            process.arguments = Array(prefix.dropFirst())
                + [binaries + "/opqueued", "--spool", spool.root, "--config", spool.config, "--log-target", "console"] + extra
        }
        var env = ProcessInfo.processInfo.environment
        env.removeValue(forKey: "JOURNAL_STREAM")
        for (k, v) in environment { env[k] = v }
        process.environment = env
        if !FileManager.default.fileExists(atPath: log) { _ = FileManager.default.createFile(atPath: log, contents: nil) }
        let handle = FileHandle(forWritingAtPath: log)
        handle?.seekToEndOfFile()
        process.standardOutput = handle ?? FileHandle.nullDevice
        process.standardError = handle ?? FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        try process.run()
    }

    var isRunning: Bool { process.isRunning }

    func signal(_ signal: Int32) { kill(pid, signal) }

    /// Waits for the exit; nil if it did not exit in time.
    @discardableResult
    func wait(timeout: Double = 30) -> Int32? {
        let deadline = now() + timeout
        while process.isRunning && now() < deadline { usleep(5_000) }
        guard !process.isRunning else { return nil }
        return process.terminationReason == .uncaughtSignal ? 128 + process.terminationStatus : process.terminationStatus
    }

    /// Peak resident memory so far, MB (0 once the process is gone).
    var peakRSS: Double { processMemoryMB(pid) }

    /// Waits until the control socket accepts connections.
    func waitUntilReady(_ spool: CampaignSpool, timeout: Double = 20) -> Bool {
        let deadline = now() + timeout
        while now() < deadline && process.isRunning {
            if (try? ControlClient.request(spool.root + "/opqueued.sock", ["command": "status"], timeout: 2)) != nil { return true }
            usleep(10_000)
        }
        return false
    }
}

/// A small photo-like JPEG (gradients and a blob), different for each seed.
func sampleJPEG(width: Int, height: Int, seed: Int) throws -> Data {
    let image = try Image(width: width, height: height, channels: 3)
    for y in 0..<height {
        for x in 0..<width {
            let p = (y * width + x) * 3
            let dx = x - width / 2, dy = y - height / 3
            let blob = dx * dx + dy * dy < (width * width) / 16
            image.pixels[p] = UInt8((x * 255 / max(1, width - 1) + seed * 37) & 0xFF)
            image.pixels[p + 1] = UInt8((y * 255 / max(1, height - 1) + seed * 11) & 0xFF)
            image.pixels[p + 2] = blob ? 240 : UInt8((seed * 53) & 0xFF)
        }
    }
    return try Codecs.encode(image, format: "jpeg", quality: 85)
}

func percentile(_ values: [Double], _ p: Double) -> Double {
    guard !values.isEmpty else { return 0 }
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int((Double(sorted.count - 1) * p).rounded()))]
}
