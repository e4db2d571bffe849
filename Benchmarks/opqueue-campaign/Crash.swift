// The crash campaign (issue 5.1): thousands of mixed jobs — sleeps and spins, fan-outs, failures with
// retries, downloads from a loopback server, file:// and HTTP image chains writing files — while the
// daemon is killed with SIGKILL over and over: half the time at a random moment, half the time at a named
// crash point inside a claim, a progress append, a `write`, a publication or a progress-log rewrite
// (OPQUEUED_CRASH_POINTS). Then one last run to the end, and every outbox entry is checked:
//   lost          a submitted job with no outbox entry
//   duplicated    an entry for no submitted job (`job.1`: a manifest claimed twice)
//   inconsistent  result.plist not what the job must give (status, operations, states, attempts), the
//                 manifest not byte for byte the one submitted, an output missing, not decodable, of the
//                 wrong size, a half-written (.part) or unexpected file in the entry; anything left in
//                 active/, tmp/ or the inbox

import Daemon
import Foundation
import OperationKinds
import SpoolFiles
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

struct CrashCampaign {
    var jobs: Int
    var kills: Int
    var parent: String
    var seed: UInt64

    /// The kinds of job, and what each must end as.
    enum Shape: Int, CaseIterable {
        case chain, failing, httpImage, fileImage, notFound, fanOut

        var status: String {
            switch self {
            case .failing, .notFound: "failed"
            default: "succeeded"
            }
        }
        var operationCount: Int {
            switch self {
            case .chain: 3
            case .failing: 2
            case .httpImage: 5
            case .fileImage: 4
            case .notFound: 3
            case .fanOut: 17
            }
        }
        /// Output file → the largest side it may have.
        var outputs: [String: Int] {
            switch self {
            case .httpImage: ["out/sepia.jpg": 320, "thumb.png": 64]
            case .fileImage: ["small.jpg": 100]
            default: [:]
            }
        }
    }

    func manifest(_ i: Int, shape: Shape, base: String, images: String, rng: inout SplitMix) -> [String: Any] {
        let image = "photo\(i % 8).jpg"
        var ops: [[String: Any]]
        switch shape {
        case .chain:
            ops = [["id": "s", "kind": "sleep", "seconds": Double(rng.next() % 40) / 1000],
                   ["id": "c", "kind": "spin", "seconds": 0.002, "dependencies": ["s"]],
                   ["id": "end", "kind": "sleep", "seconds": 0, "dependencies": ["c"]]]
        case .failing:
            ops = [["id": "s", "kind": "sleep", "seconds": 0.01],
                   ["id": "f", "kind": "fail", "message": "planned", "dependencies": ["s"], "retries": 2, "retryDelaySeconds": 0.01]]
        case .httpImage:
            ops = [["id": "get", "kind": "download", "url": "\(base)/file/\(image)"],
                   ["id": "sepia", "kind": "sepia", "dependencies": ["get"]],
                   ["id": "save", "kind": "write", "path": "out/sepia.jpg", "quality": 80, "dependencies": ["sepia"]],
                   ["id": "thumb", "kind": "thumbnail", "size": 64, "dependencies": ["get"]],
                   ["id": "savethumb", "kind": "write", "path": "thumb.png", "dependencies": ["thumb"]]]
        case .fileImage:
            ops = [["id": "get", "kind": "download", "url": "file://\(images)/\(image)"],
                   ["id": "grey", "kind": "grayscale", "dependencies": ["get"]],
                   ["id": "small", "kind": "resize", "width": 100, "height": 100, "mode": "fit", "dependencies": ["grey"]],
                   ["id": "save", "kind": "write", "path": "small.jpg", "dependencies": ["small"]]]
        case .notFound:
            ops = [["id": "get", "kind": "download", "url": "\(base)/status/404", "retries": 1, "retryDelaySeconds": 0.01],
                   ["id": "sepia", "kind": "sepia", "dependencies": ["get"]],
                   ["id": "save", "kind": "write", "path": "never.jpg", "dependencies": ["sepia"]]]
        case .fanOut:
            ops = (0..<15).map { ["id": "w\($0)", "kind": "sleep", "seconds": Double(rng.next() % 10) / 1000] }
            ops.append(["id": "join", "kind": "spin", "seconds": 0.001, "dependencies": (0..<15).map { "w\($0)" }])
            ops.append(["id": "end", "kind": "sleep", "seconds": 0, "dependencies": ["join"]])
        }
        return ["job": "j\(i)", "metadata": ["n": i], "operations": ops]
    }

    /// What the kill cycles did.
    struct Kills {
        var pointKills: [String: Int] = [:]
        var randomKills = 0
        var missedPoints = 0
        var peakRSS = 0.0
        var unexpectedExits: [String] = []
    }

    func run() throws -> Bool {
        var rng = SplitMix(state: seed)
        let images = parent + "/opq-crash-images-\(getpid())"
        try FileManager.default.createDirectory(atPath: images, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: images) }
        for i in 0..<8 { try sampleJPEG(width: 320, height: 240, seed: i).write(to: URL(fileURLWithPath: "\(images)/photo\(i).jpg")) }
        let server = try LoopbackServer(folder: images)
        let spool = try CampaignSpool("crash", parent: parent, settings: [
            "maxActiveJobs": 48, "shutdownGraceSeconds": 5,
            "download": ["fileRoots": [images], "timeoutSeconds": 10, "allowNetworks": ["127.0.0.0/8"]],
        ])
        let log = spool.root + ".log"
        var manifests: [String: Data] = [:]
        var shapes: [String: Shape] = [:]
        for i in 0..<jobs {
            let shape = Shape(rawValue: i % Shape.allCases.count) ?? .chain
            let data = plistData(manifest(i, shape: shape, base: server.base, images: images, rng: &rng), binary: i % 2 == 0)
            manifests["j\(i)"] = data
            shapes["j\(i)"] = shape
        }
        // Half of the manifests wait in the inbox from the start; the rest arrive while the daemon runs and dies.
        let names = (0..<jobs).map { "j\($0)" }
        let early = jobs / 2
        for name in names.prefix(early) { drop(spool.inbox, name + ".plist", manifests[name] ?? Data()) }
        var pending = Array(names.dropFirst(early))

        let started = now()
        var cycles = try killCycles(spool: spool, log: log, manifests: manifests, pending: &pending, &rng)
        for name in pending { drop(spool.inbox, name + ".plist", manifests[name] ?? Data()) }
        try lastRun(spool: spool, log: log, &cycles)
        let seconds = now() - started
        return verdict(spool: spool, log: log, names: names, manifests: manifests, shapes: shapes, cycles: cycles, seconds: seconds)
    }

    /// Starts and kills the daemon `kills` times, dropping a share of the pending manifests each time: at a named crash
    /// point every other time, else with SIGKILL at a random moment.
    func killCycles(spool: CampaignSpool, log: String, manifests: [String: Data], pending: inout [String],
                    _ rng: inout SplitMix) throws -> Kills {
        let perKill = max(1, (pending.count + kills - 1) / max(1, kills))
        var cycles = Kills()
        for k in 0..<kills {
            var environment: [String: String] = [:]
            var point: CrashPoint?
            if k % 2 == 1 {
                let (chosen, hit) = crashPoint(&rng)
                environment["OPQUEUED_CRASH_POINTS"] = "\(chosen.rawValue):\(hit)"
                point = chosen
            }
            let daemon = try DaemonProcess(spool: spool, log: log, environment: environment)
            for name in pending.prefix(perKill) { drop(spool.inbox, name + ".plist", manifests[name] ?? Data()) }
            pending.removeFirst(min(perKill, pending.count))
            if let point {
                // The daemon kills itself at the point; a point it does not reach in time gets a plain kill.
                if let status = daemon.wait(timeout: 2) {
                    if status == 128 + SIGKILL {
                        cycles.pointKills[point.rawValue, default: 0] += 1
                    } else {
                        cycles.unexpectedExits.append("exit \(status) at cycle \(k)")
                    }
                    continue
                }
                cycles.missedPoints += 1
            } else {
                usleep(UInt32(10_000 + rng.next() % 600_000))
            }
            cycles.peakRSS = max(cycles.peakRSS, daemon.peakRSS)
            guard daemon.isRunning else {
                cycles.unexpectedExits.append("exit \(daemon.wait(timeout: 1) ?? -1) before the kill at cycle \(k)")
                continue
            }
            daemon.signal(SIGKILL)
            daemon.wait()
            cycles.randomKills += 1
        }
        return cycles
    }

    /// A crash point, and at which of its hits the daemon dies there.
    func crashPoint(_ rng: inout SplitMix) -> (CrashPoint, Int) {
        let chosen = CrashPoint.allCases[Int(rng.next() % UInt64(CrashPoint.allCases.count))]
        // Hits that a short run reaches: a claim or two, a few writes and publications, many progress lines;
        // the progress log is rewritten once per start.
        let most: UInt64 = switch chosen {
        case .claimRecorded, .claimRenamed: 4
        case .writePart: 3
        case .publishStaged, .publishPlaced: 8
        case .progressAppended: 100
        case .progressRewritten: 1
        }
        return (chosen, 1 + Int(rng.next() % most))
    }

    /// The last run, to the end.
    func lastRun(spool: CampaignSpool, log: String, _ cycles: inout Kills) throws {
        let daemon = try DaemonProcess(spool: spool, log: log)
        if !daemon.waitUntilReady(spool) { cycles.unexpectedExits.append("the last run did not become ready") }
        let deadline = now() + max(120, Double(jobs) / 20)
        while list(spool.outbox).count < jobs && now() < deadline && daemon.isRunning { usleep(50_000) }
        cycles.peakRSS = max(cycles.peakRSS, daemon.peakRSS)
        daemon.signal(SIGTERM)
        let lastExit = daemon.wait(timeout: 30)
        if lastExit != 0 { cycles.unexpectedExits.append("the last run ended with \(lastExit.map(String.init) ?? "a hang")") }
    }

    /// The verdict: every job in the outbox once and as it must be, nothing left over, no unexpected exit or crash.
    func verdict(spool: CampaignSpool, log: String, names: [String], manifests: [String: Data], shapes: [String: Shape],
                 cycles: Kills, seconds: Double) -> Bool {
        let entries = Set(list(spool.outbox))
        let lost = names.filter { !entries.contains($0) }
        let duplicated = entries.subtracting(names).sorted()
        var inconsistent: [String] = []
        for name in names where entries.contains(name) {
            let problems = check(spool.outbox + "/" + name, shape: shapes[name] ?? .chain, manifest: manifests[name] ?? Data(),
                                 index: Int(name.dropFirst()) ?? -1)
            if !problems.isEmpty { inconsistent.append("\(name): " + problems.joined(separator: "; ")) }
        }
        let leftovers = list(spool.root + "/active").map { "active/\($0)" } + list(spool.root + "/tmp").map { "tmp/\($0)" }
            + list(spool.inbox).map { "inbox/\($0)" }
        let crashes = crashReports(log)
        let unexpectedExits = cycles.unexpectedExits

        let pointKills = cycles.pointKills.values.reduce(0, +)
        let pointSummary = cycles.pointKills.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",")
        say("campaign=crash jobs=\(jobs) kills=\(cycles.randomKills + pointKills) random_kills=\(cycles.randomKills) "
            + "point_kills=\(pointKills) [\(pointSummary)] points_not_reached=\(cycles.missedPoints)")
        say("campaign=crash outbox=\(entries.count) lost=\(lost.count) duplicated=\(duplicated.count) inconsistent=\(inconsistent.count) "
            + "leftovers=\(leftovers.count) unexpected_exits=\(unexpectedExits.count) crashes=\(crashes.count) "
            + "peak_rss_mb=\(Int(cycles.peakRSS)) seconds=\(Int(seconds))")
        for line in (lost.map { "lost \($0)" } + duplicated.map { "duplicated \($0)" } + inconsistent + leftovers.map { "left \($0)" }
                     + unexpectedExits + crashes).prefix(20) {
            say("  \(line)")
        }
        let ok = lost.isEmpty && duplicated.isEmpty && inconsistent.isEmpty && leftovers.isEmpty && unexpectedExits.isEmpty &&
            crashes.isEmpty
        if ok {
            spool.remove(); try? FileManager.default.removeItem(atPath: log)
        } else {
            say("  kept for inspection: \(spool.root) and \(log)")
        }
        return ok
    }

    /// What is wrong with one outbox entry (nothing: an empty list).
    func check(_ folder: String, shape: Shape, manifest: Data, index: Int) -> [String] {
        var problems: [String] = []
        guard let result = readPlist(folder + "/result.plist") else { return ["result.plist missing or not a property list"] }
        if FileManager.default.contents(atPath: folder + "/manifest.plist") != manifest {
            problems.append("manifest.plist differs from the submitted bytes")
        }
        if result["status"] as? String != shape.status { problems.append("status \(result["status"] ?? "none"), expected \(shape.status)") }
        if (result["metadata"] as? [String: Any])?["n"] as? Int != index { problems.append("metadata not copied") }
        let operations = result["operations"] as? [[String: Any]] ?? []
        if operations.count != shape.operationCount { problems.append("\(operations.count) operations, expected \(shape.operationCount)") }
        var listed: Set<String> = []
        for op in operations {
            let id = op["id"] as? String ?? "?"
            guard let state = op["state"] as? String, let attempts = op["attempts"] as? Int else {
                problems.append("\(id): no state or attempts"); continue
            }
            if shape.status == "succeeded" && state != "succeeded" { problems.append("\(id) \(state) in a succeeded job") }
            if state == "succeeded" && (attempts < 1 || op["startedAt"] == nil || op["finishedAt"] == nil) {
                problems.append("\(id) succeeded without attempts or times")
            }
            if state == "failed" && (op["error"] as? String ?? "").isEmpty { problems.append("\(id) failed without an error") }
            for output in op["outputs"] as? [String] ?? [] { listed.insert(output) }
        }
        if shape == .failing, let f = operations.last, f["attempts"] as? Int != 3 {
            problems.append("fail made \(f["attempts"] ?? 0) attempts, expected 3")
        }
        if Set(shape.outputs.keys) != listed { problems.append("outputs \(listed.sorted()), expected \(shape.outputs.keys.sorted())") }
        for (path, side) in shape.outputs {
            guard let data = FileManager.default.contents(atPath: folder + "/" + path) else { problems.append("\(path) missing"); continue }
            do {
                let image = try Codecs.decode(data, maxPixels: 1 << 24)
                if max(image.width, image.height) != side {
                    problems.append("\(path) is \(image.width)×\(image.height), expected a largest side of \(side)")
                }
            } catch {
                problems.append("\(path) does not decode: \(error)")
            }
        }
        // Nothing else in the entry: no half-written .part file, no stray record.
        var expected: Set<String> = ["manifest.plist", "result.plist", "job.plist"]
        for path in shape.outputs.keys {
            expected.insert(path)
            if path.contains("/") { expected.insert(String(path.split(separator: "/")[0])) }
        }
        if let walker = FileManager.default.enumerator(atPath: folder) {
            for case let path as String in walker where !expected.contains(path) { problems.append("unexpected file \(path)") }
        }
        return problems
    }
}

/// Lines of a daemon log that tell of a crash (a Swift runtime trap, a fatal error, a sanitizer report).
func crashReports(_ log: String) -> [String] {
    // grep, not a String of the whole log: a fuzz campaign's log runs to gigabytes.
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/grep")
    p.arguments = ["-a", "-m", "100", "-E", "Fatal error|fatal error:|Crash|AddressSanitizer|💣", log]
    let pipe = Pipe()
    p.standardOutput = pipe
    p.standardError = FileHandle.nullDevice
    guard (try? p.run()) != nil else { return [] }
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
}

