// The hostile-input campaign through the real daemon (issue 5.3). Manifests made from valid ones by
// mutation — bit flips, byte edits, inserted, deleted, repeated and cut ranges, random bytes, XML and
// binary; and by structure — every key given a wrong type, deep nesting, huge arrays, long strings, other
// text encodings — and images mutated the same way (flips, edits, cuts, forged dimensions), each read by
// a job that decodes and thumbnails it. They are dropped in batches into a running daemon. Every input
// must get an answer: one outbox entry whose result names its inbox file, `rejected` with reasons or an
// operation failed with an error. Jobs still running after a batch's time are cancelled (a fuzzed
// manifest may ask to sleep for a year); one that does not end then is a hang. A daemon exit is a crash:
// it is counted and the daemon restarted. Memory growth between the first and the last batch is a leak.

import ControlPlane
import Daemon
import Foundation
import OperationKinds
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

struct FuzzCampaign {
    var manifests: Int
    var images: Int
    var parent: String
    var seed: UInt64
    var batch = 500

    /// What the batches found, and the memory readings between them.
    struct Tally {
        var tried = 0, crashes = 0, hangs = 0, unanswered: [String] = [], statusCounts: [String: Int] = [:]
        var firstRSS = 0.0, peakRSS = 0.0, lastRSS = 0.0, firstHeap = 0.0, lastHeap = 0.0, batches = 0
        var heaps: [Double] = []
    }

    func run() throws -> Bool {
        var rng = SplitMix(state: seed)
        let spool = try CampaignSpool("fuzz", parent: parent, settings: [:])
        let roots = spool.root + ".images"
        try FileManager.default.createDirectory(atPath: roots, withIntermediateDirectories: true)
        let server = try LoopbackServer(folder: roots)
        try plistData(["maxActiveJobs": 64, "image": ["maxPixels": 40_000_000],
                       "download": ["fileRoots": [roots], "connectTimeoutSeconds": 1, "timeoutSeconds": 3, "maxBytes": 4_000_000,
                                                  "allowNetworks": ["127.0.0.0/8"]]], binary: false)
            .write(to: URL(fileURLWithPath: spool.config))
        let log = spool.root + ".log"
        var daemon = try DaemonProcess(spool: spool, log: log)
        guard daemon.waitUntilReady(spool) else { throw CampaignFailure(description: "the daemon did not start; see \(log)") }

        let seeds = seedManifests(base: server.base, roots: roots, &rng)
        let (jpeg, png) = try seedImages(roots)
        var tally = Tally()
        let started = now()
        let total = manifests + images
        var made = 0
        while made < total {
            let inputs = try nextBatch(&made, total: total, seeds: seeds, jpeg: jpeg, png: png, roots: roots, &rng)
            for input in inputs { drop(spool.inbox, input.name, input.data) }
            tally.tried += inputs.count
            try awaitAnswers(Set(inputs.map(\.name)), spool: spool, daemon: &daemon, log: log, &tally)
            tally.lastRSS = processMemoryMB(daemon.pid, "VmRSS")
            let status = try? ControlClient.request(spool.root + "/opqueued.sock", ["command": "status", "memory": true], timeout: 5)
            tally.lastHeap = Double(status?["heapBytes"] as? Int ?? 0) / 1_048_576
            if tally.firstRSS == 0 { tally.firstRSS = tally.lastRSS; tally.firstHeap = tally.lastHeap }
            tally.heaps.append(tally.lastHeap)
            tally.peakRSS = max(tally.peakRSS, daemon.peakRSS)
            tally.batches += 1
            say(String(format: "  batch %d: inputs %d, %.0f s, rss %.0f MB, heap in use %.1f MB",
                       tally.batches, tally.tried, now() - started, tally.lastRSS, tally.lastHeap))
        }
        return finish(tally, daemon: daemon, spool: spool, roots: roots, log: log, started: started)
    }

    /// Valid manifests of every shape, the seeds the manifests are mutated from.
    func seedManifests(base: String, roots: String, _ rng: inout SplitMix) -> [[String: Any]] {
        let crash = CrashCampaign(jobs: 0, kills: 0, parent: parent, seed: seed)
        var seeds: [[String: Any]] = []
        for i in 0..<12 {
            let shape = CrashCampaign.Shape(rawValue: i % CrashCampaign.Shape.allCases.count) ?? .chain
            var m = crash.manifest(i, shape: shape, base: base, images: roots, rng: &rng)
            m["qualityOfService"] = ["userInitiated", "utility", "background"][i % 3]
            m["queuePriority"] = ["high", "low", "normal"][i % 3]
            m["timeoutSeconds"] = 20.0
            seeds.append(m)
        }
        return seeds
    }

    /// Valid images, the seeds the images are mutated from, also written where the seed manifests read them.
    func seedImages(_ roots: String) throws -> (jpeg: Data, png: Data) {
        let jpeg = try sampleJPEG(width: 96, height: 64, seed: 3)
        let png = try Codecs.encode(try Codecs.decode(jpeg, maxPixels: 1 << 20), format: "png", quality: 0)
        for (i, image) in [jpeg, png].enumerated() { try image.write(to: URL(fileURLWithPath: "\(roots)/photo\(i).jpg")) }
        for i in 2..<8 { try jpeg.write(to: URL(fileURLWithPath: "\(roots)/photo\(i).jpg")) }
        return (jpeg, png)
    }

    /// The next batch of inputs: mutated manifests first, then jobs that read a mutated image.
    func nextBatch(_ made: inout Int, total: Int, seeds: [[String: Any]], jpeg: Data, png: Data, roots: String,
                   _ rng: inout SplitMix) throws -> [(name: String, data: Data)] {
        var inputs: [(name: String, data: Data)] = []
        while inputs.count < batch && made < total {
            if made < manifests {
                inputs.append(("m\(made).plist", mutateManifest(seeds[Int(rng.next() % UInt64(seeds.count))], &rng)))
            } else {
                let k = made - manifests
                let bytes = mutateBytes(k % 2 == 0 ? jpeg : png, &rng, image: true)
                let file = "fz\(k)" + (k % 2 == 0 ? ".jpg" : ".png")
                try bytes.write(to: URL(fileURLWithPath: roots + "/" + file))
                let ops: [[String: Any]] = [["id": "get", "kind": "download", "url": "file://\(roots)/\(file)"],
                                            ["id": "small", "kind": "thumbnail", "size": 32, "dependencies": ["get"]],
                                            ["id": "save", "kind": "write", "path": "t.png", "dependencies": ["small"]]]
                inputs.append(("i\(k).plist", plistData(["job": "i\(k)", "operations": ops])))
            }
            made += 1
        }
        return inputs
    }

    /// Waits for an answer to each of a batch's inputs, restarting the daemon when it exits; counts what is not answered.
    func awaitAnswers(_ wanted: Set<String>, spool: CampaignSpool, daemon: inout DaemonProcess, log: String,
                      _ tally: inout Tally) throws {
        // Answers are found by the inbox name each result records.
        var answered: [String: String] = [:]
        // A fuzzed manifest may ask to sleep for a year: when no answer has come for a second, what runs
        // is cancelled (and must then end); 30 s without any answer is a hang.
        var lastCount = 0, lastProgress = now(), lastCancel = 0.0
        while answered.count < wanted.count {
            collect(wanted, spool: spool, &answered, &tally)
            if answered.count != lastCount { lastCount = answered.count; lastProgress = now() }
            if !daemon.isRunning {
                tally.crashes += 1
                say("  crash: the daemon exited (\(daemon.wait(timeout: 1) ?? -1)) during a batch; see \(log)")
                daemon = try DaemonProcess(spool: spool, log: log)
                _ = daemon.waitUntilReady(spool)
                lastProgress = now()
            }
            let idle = now() - lastProgress
            if idle > 30 { break }
            if idle > 1 && now() - lastCancel > 1 {
                let status = try? ControlClient.request(spool.root + "/opqueued.sock", ["command": "status"], timeout: 5)
                for job in status?["activeJobs"] as? [String] ?? [] {
                    _ = try? ControlClient.request(spool.root + "/opqueued.sock", ["command": "cancel", "job": job], timeout: 5)
                }
                lastCancel = now()
            }
            usleep(20_000)
        }
        collect(wanted, spool: spool, &answered, &tally)
        for name in wanted where answered[name] == nil {
            // Still in the inbox (never claimed) or in active/ (never ended).
            tally.hangs += 1
            tally.unanswered.append("\(name): no answer (inbox: \(FileManager.default.fileExists(atPath: spool.inbox + "/" + name)))")
        }
        for status in answered.values { tally.statusCounts[status, default: 0] += 1 }
    }

    /// Takes the batch's answers out of the outbox, noting each one's status.
    func collect(_ wanted: Set<String>, spool: CampaignSpool, _ answered: inout [String: String], _ tally: inout Tally) {
        for entry in list(spool.outbox) {
            guard let result = readPlist(spool.outbox + "/" + entry + "/result.plist"), let name = result["manifest"] as? String,
                  wanted.contains(name), answered[name] == nil else { continue }
            let status = result["status"] as? String ?? "?"
            answered[name] = status
            if status == "rejected" && (result["error"] as? String ?? "").isEmpty {
                tally.unanswered.append("\(name): rejected without reasons")
            }
            // Ended entries are moved away so the outbox stays small.
            try? FileManager.default.removeItem(atPath: spool.outbox + "/" + entry)
        }
    }

    /// Stops the daemon, reports, and judges: no crash, no hang, every input answered, no leak.
    func finish(_ tally: Tally, daemon: DaemonProcess, spool: CampaignSpool, roots: String, log: String, started: Double) -> Bool {
        // Once idle for a while the daemon gives freed memory back: RSS then shows what it still holds.
        Thread.sleep(forTimeInterval: 6)
        let idleRSS = processMemoryMB(daemon.pid, "VmRSS")
        daemon.signal(SIGTERM)
        let exit = daemon.wait(timeout: 30)
        let reports = crashReports(log)
        let counts = tally.statusCounts.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        say(String(format: "campaign=fuzz inputs=%d manifests=%d images=%d crashes=%d hangs=%d unanswered=%d %@ "
                   + "rss_first_batch_mb=%.0f rss_last_batch_mb=%.0f heap_first_batch_mb=%.1f heap_last_batch_mb=%.1f "
                   + "rss_idle_end_mb=%.0f peak_rss_mb=%.0f seconds=%.0f",
                   tally.tried, manifests, images, tally.crashes + reports.count, tally.hangs, tally.unanswered.count, counts,
                   tally.firstRSS, tally.lastRSS, tally.firstHeap, tally.lastHeap, idleRSS, tally.peakRSS, now() - started))
        for line in (tally.unanswered + reports).prefix(15) { say("  \(line)") }
        // A leak shows as memory held growing batch after batch: the heap in use (what the allocator has
        // handed out) after a batch has ended, when nothing runs. RSS also counts freed memory the allocator
        // keeps and is reported, not judged.
        // A batch's big inputs may still be on their way out when it is read, so the judgement compares the
        // lowest of the last readings with the highest of the first ones (up to four each, not overlapping).
        let k = max(1, min(4, tally.heaps.count / 2))
        let early = tally.heaps.prefix(k).max() ?? 0, late = tally.heaps.suffix(k).min() ?? 0
        let leaking = late > early + 16
        if leaking { say(String(format: "  heap in use grew from %.1f MB (first batches) to %.1f MB (last batches)", early, late)) }
        let ok = tally.crashes == 0 && reports.isEmpty && tally.hangs == 0 && tally.unanswered.isEmpty && exit == 0 && !leaking
        if ok {
            spool.remove()
            try? FileManager.default.removeItem(atPath: roots)
            try? FileManager.default.removeItem(atPath: log)
        } else {
            say("  kept for inspection: \(spool.root), \(roots), \(log)")
        }
        return ok
    }

    // MARK: Mutation

    func mutateManifest(_ seed: [String: Any], _ rng: inout SplitMix) -> Data {
        let binary = rng.next() % 2 == 0
        switch rng.next() % 10 {
        case 0...3:
            return mutateBytes(plistData(seed, binary: binary), &rng, image: false)
        case 4:
            // Random bytes, sometimes behind a property list's signature.
            let count = Int(rng.next() % 4096)
            var data = Data((0..<count).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
            switch rng.next() % 3 {
            case 0: data = Data("bplist00".utf8) + data
            case 1: data = Data("<?xml version=\"1.0\"?><plist version=\"1.0\">".utf8) + data
            default: break
            }
            return data
        case 5:
            return plistData(wrongType(seed, &rng), binary: binary)
        case 6:
            // Deep nesting, in a value the parser must walk (metadata) or in the operations themselves.
            let depth = [10, 100, 1_000, 10_000][Int(rng.next() % 4)]
            if binary {
                var nested: Any = "core"
                for _ in 0..<min(depth, 500) { nested = [nested] }
                var m = seed
                m[rng.next() % 2 == 0 ? "metadata" : "operations"] = nested
                return plistData(m, binary: true)
            }
            let open = String(repeating: "<array>", count: depth), close = String(repeating: "</array>", count: depth)
            return Data("<?xml version=\"1.0\"?><plist version=\"1.0\"><dict><key>operations</key>\(open)\(close)</dict></plist>".utf8)
        case 7:
            // Huge arrays: many operations, many dependencies, or a big metadata array.
            var m = seed
            let n = rng.next() % 16 == 0 ? 100_000 : [500, 5_000][Int(rng.next() % 2)]
            switch rng.next() % 3 {
            case 0: m["operations"] = (0..<n).map { ["id": "o\($0)", "kind": "sleep", "seconds": 0] as [String: Any] }
            case 1:
                m["operations"] = [["id": "a", "kind": "sleep", "seconds": 0,
                                    "dependencies": Array(repeating: "a", count: n)] as [String: Any]]
            default: m["metadata"] = ["big": Array(repeating: 1, count: n)]
            }
            return plistData(m, binary: binary)
        case 8:
            // Long strings where ids, paths, URLs and names go.
            var m = seed
            let long = String(repeating: ["x", "é", "/", "..", "%00", "\u{0}"][Int(rng.next() % 6)],
                              count: [200, 5_000, 1_000_000][Int(rng.next() % 3)])
            var ops = m["operations"] as? [[String: Any]] ?? []
            if !ops.isEmpty {
                let key = ["id", "kind", "url", "path", "queue", "dependencies", "message"][Int(rng.next() % 7)]
                ops[0][key] = key == "dependencies" ? [long] : long
            }
            m["operations"] = ops
            if rng.next() % 3 == 0 { m["job"] = long }
            // Foundation's binary writer takes minutes over a million non-ASCII characters: those go as XML.
            return plistData(m, binary: binary && long.utf8.count < 100_000)
        default:
            // Other text encodings of the XML form.
            let xml = String(decoding: plistData(seed, binary: false), as: UTF8.self)
            switch rng.next() % 3 {
            case 0: return Data([0xFF, 0xFE]) + (xml.data(using: .utf16LittleEndian) ?? Data())
            case 1: return Data(xml.replacingOccurrences(of: "UTF-8", with: "ISO-8859-1").utf8) + Data([0xE9, 0xFF])
            default: return Data(xml.replacingOccurrences(of: "<string>j", with: "<string>\u{202E}\u{FEFF}j").utf8)
            }
        }
    }

    /// The seed with one value, anywhere in it, replaced by a value of another type.
    func wrongType(_ object: [String: Any], _ rng: inout SplitMix) -> [String: Any] {
        let values: [Any] = [42, -1, 3.5e300, Double.nan, true, Date(timeIntervalSince1970: 0), Data([1, 2, 3]), ["x"], ["k": "v"],
                             "text", ""]
        var m = object
        let keys = Array(m.keys)
        guard !keys.isEmpty else { return m }
        let key = keys[Int(rng.next() % UInt64(keys.count))]
        if key == "operations", var ops = m[key] as? [[String: Any]], !ops.isEmpty, rng.next() % 4 != 0 {
            let i = Int(rng.next() % UInt64(ops.count))
            let opKeys = Array(ops[i].keys) + ["retries", "timeoutSeconds", "queuePriority", "qualityOfService", "runsAfterFailure",
                                               "input", "retryDelaySeconds"]
            ops[i][opKeys[Int(rng.next() % UInt64(opKeys.count))]] = values[Int(rng.next() % UInt64(values.count))]
            m[key] = ops
        } else {
            m[key] = values[Int(rng.next() % UInt64(values.count))]
        }
        return m
    }

    /// Byte-level mutation; for images also forged dimensions in the header.
    func mutateBytes(_ original: Data, _ rng: inout SplitMix, image: Bool) -> Data {
        var data = [UInt8](original)
        let rounds = 1 + Int(rng.next() % 4)
        for _ in 0..<rounds where !data.isEmpty {
            let at = Int(rng.next() % UInt64(data.count))
            switch rng.next() % (image ? 7 : 6) {
            case 0: data[at] ^= UInt8(1 << (rng.next() % 8))
            case 1: for k in 0..<Int(1 + rng.next() % 16) where at + k < data.count { data[at + k] = UInt8(truncatingIfNeeded: rng.next()) }
            case 2: data.insert(contentsOf: (0..<Int(1 + rng.next() % 64)).map { _ in UInt8(truncatingIfNeeded: rng.next()) }, at: at)
            case 3: data.removeSubrange(at..<min(data.count, at + Int(1 + rng.next() % 256)))
            case 4:
                let length = min(data.count - at, Int(1 + rng.next() % 512))
                let chunk = Array(data[at..<(at + length)])
                data.insert(contentsOf: chunk, at: Int(rng.next() % UInt64(data.count)))
            case 5: data.removeSubrange(at...)
            default:
                // Forged dimensions: a PNG's IHDR width/height, or a JPEG SOF's.
                if data.count > 24, data[1] == 0x50 {
                    for k in 16..<24 { data[k] = UInt8(truncatingIfNeeded: rng.next()) }
                } else if let sof = (0..<max(0, data.count - 9)).first(where: {
                    data[$0] == 0xFF && (data[$0 + 1] == 0xC0 || data[$0 + 1] == 0xC2)
                }) {
                    for k in 5..<9 { data[sof + k] = UInt8(truncatingIfNeeded: rng.next()) }
                }
            }
        }
        return Data(data)
    }
}
