// opqueue-bench corpus FOLDER [--count N]: a deterministic photo-like corpus (N 1920×1080 JPEGs at q90,
// the same as PNGs, RGBA PNGs, one 12000×8000 JPEG and the same as a PNG).
// opqueue-bench images [--count N]: the same files through opqueued and through the anchors, in one run,
// each using both cores, printing images per second, ratios and peak RSS:
//   opqueued   one manifest of N chains file:// → sepia → write JPEG q90 (and thumbnail 256)
//   ImageMagick  convert -color-matrix (the same matrix as our sepia at 0.8), two processes at a time
//   libvips    vips recomb per file, two at a time; in one process through pyvips (if it imports), two
//              threads; vipsthumbnail once over all files
//   floor      djpeg | cjpeg -quality 90, no filter, two at a time
// and a "large" section (issue 15): sepia → JPEG q90 and a 256-pixel thumbnail of the 12000×8000 JPEG and PNG,
// one at a time, with the daemon's peak RSS (VmHWM) and its idle VmHWM before the job, beside djpeg | cjpeg,
// vips recomb, vipsthumbnail and ImageMagick on the same files (peak RSS of the child, getrusage); then eight
// 12000×8000 sepia chains in one job. `--large` runs only that section.

import Daemon
import Foundation
import OperationKinds

#if canImport(Glibc)
import Glibc
#endif

enum ImageBench {
    /// A photo-like picture: smooth gradients, soft blobs and grain, from a seed.
    static func photo(width: Int, height: Int, seed: UInt64, alpha: Bool = false) throws -> Image {
        let channels = alpha ? 4 : 3
        let image = try Image(width: width, height: height, channels: channels)
        var state = seed &* 0x9E37_79B9_7F4A_7C15 | 1
        func next() -> UInt64 { state ^= state << 13; state ^= state >> 7; state ^= state << 17; return state }
        let blobs = (0..<6).map { _ in (x: Double(next() % UInt64(width)), y: Double(next() % UInt64(height)), r: Double(80 + next() % 400),
                                        c: (Double(next() % 256), Double(next() % 256), Double(next() % 256))) }
        let base = (Double(next() % 200), Double(next() % 200), Double(next() % 200))
        for y in 0..<height {
            let fy = Double(y) / Double(height)
            for x in 0..<width {
                let fx = Double(x) / Double(width)
                var r = base.0 * (1 - fy) + 40 * fx, g = base.1 * (0.5 + 0.5 * fx), b = base.2 * (1 - 0.5 * fy) + 30
                for blob in blobs {
                    let dx = Double(x) - blob.x, dy = Double(y) - blob.y
                    let d = (dx * dx + dy * dy) / (blob.r * blob.r)
                    if d < 1 {
                        let w = (1 - d) * (1 - d)
                        r = r * (1 - w) + blob.c.0 * w
                        g = g * (1 - w) + blob.c.1 * w
                        b = b * (1 - w) + blob.c.2 * w
                    }
                }
                let grain = Double(Int(next() % 17) - 8)
                let p = (y * width + x) * channels
                image.pixels[p] = UInt8(max(0, min(255, r + grain)))
                image.pixels[p + 1] = UInt8(max(0, min(255, g + grain)))
                image.pixels[p + 2] = UInt8(max(0, min(255, b + grain)))
                if alpha { image.pixels[p + 3] = UInt8(255 - (x * 255 / max(1, width - 1)) / 2) }
            }
        }
        return image
    }

    static func corpus(_ folder: String, count: Int) throws {
        for sub in ["jpeg", "png", "rgba", "large"] {
            try FileManager.default.createDirectory(atPath: folder + "/" + sub, withIntermediateDirectories: true)
        }
        for i in 0..<count {
            let name = String(format: "photo-%03d", i)
            let path = folder + "/jpeg/\(name).jpg"
            if FileManager.default.fileExists(atPath: path) { continue }
            let image = try photo(width: 1920, height: 1080, seed: UInt64(i + 1))
            try Codecs.encode(image, format: "jpeg", quality: 90).write(to: URL(fileURLWithPath: path))
            if i < 20 {
                try Codecs.encode(image, format: "png", quality: 90).write(to: URL(fileURLWithPath: folder + "/png/\(name).png"))
                try Codecs.encode(try photo(width: 1920, height: 1080, seed: UInt64(i + 1), alpha: true), format: "png", quality: 90)
                    .write(to: URL(fileURLWithPath: folder + "/rgba/\(name).png"))
            }
        }
        let large = folder + "/large/large.jpg", largePNG = folder + "/large/large.png"
        if !FileManager.default.fileExists(atPath: large) || !FileManager.default.fileExists(atPath: largePNG) {
            let image = try photo(width: 12000, height: 8000, seed: 99)
            try Codecs.encode(image, format: "jpeg", quality: 90).write(to: URL(fileURLWithPath: large))
            try Codecs.encode(image, format: "png", quality: 90).write(to: URL(fileURLWithPath: largePNG))
        }
    }

    /// Runs a shell command; returns wall seconds and the peak RSS (MB) of its largest process. A fresh
    /// python3 parent per command reads RUSAGE_CHILDREN, so earlier commands do not count.
    static func shell(_ command: String) -> (seconds: Double, rss: Double, ok: Bool) {
        let start = now()
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", """
            import resource, subprocess, sys
            code = subprocess.run(sys.argv[1], shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
            sys.exit(code)
            """, command]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch { return (0, 0, false) }
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let kb = Double(text.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        return (now() - start, kb / 1024, process.terminationStatus == 0)
    }

    static func have(_ tool: String) -> Bool { shell("command -v \(tool)").ok }

    /// One opqueued job of `count` chains over the corpus; seconds from the drop to the result, peak RSS.
    static func opqueued(_ corpus: String, files: [String],
                         chain: (String, String) -> [[String: Any]]) -> (seconds: Double, rss: Double, ok: Bool) {
        let r = opqueuedWithIdle(corpus, files: files, chain: chain)
        return (r.seconds, r.rss, r.ok)
    }

    /// As `opqueued`, also returning the daemon's VmHWM once it is listening, before the job (its idle peak).
    static func opqueuedWithIdle(_ corpus: String, files: [String],
                                 chain: (String, String) -> [[String: Any]]) -> (seconds: Double, rss: Double, idle: Double, ok: Bool) {
        let spool = NSTemporaryDirectory() + "opq-images-\(getpid())-\(Int(now() * 1000))"
        try? FileManager.default.createDirectory(atPath: spool + "/inbox", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: spool) }
        let config = spool + ".plist"
        let settings: [String: Any] = ["download": ["fileRoots": [corpus], "maxBytes": 2_000_000_000],
                                       "queues": ["io": ["maxConcurrentOperationCount": -1]]]
        _ = FileManager.default.createFile(atPath: config, contents: try? PropertyListSerialization.data(fromPropertyList: settings,
                                                                                                       format: .xml, options: 0))
        defer { try? FileManager.default.removeItem(atPath: config) }
        var operations: [[String: Any]] = []
        for (i, file) in files.enumerated() { operations += chain("p\(i)", "file://" + corpus + "/" + file) }
        let manifest = try? PropertyListSerialization.data(fromPropertyList: ["job": "bench", "qualityOfService": "userInitiated",
                                                                              "operations": operations],
                                                           format: .binary, options: 0)
        let process = SpoolBench.daemon(spool, ["--config", config, "--log-target", "console"])
        SpoolBench.waitForSocket(spool)
        let idle = SpoolBench.peakRSS(process.processIdentifier)
        let start = now()
        _ = FileManager.default.createFile(atPath: spool + "/inbox/.bench.plist", contents: manifest)
        rename(spool + "/inbox/.bench.plist", spool + "/inbox/bench.plist")
        while !FileManager.default.fileExists(atPath: spool + "/outbox/bench/result.plist") && process.isRunning { usleep(5_000) }
        let seconds = now() - start
        let rss = SpoolBench.peakRSS(process.processIdentifier)
        let result = (try? Data(contentsOf: URL(fileURLWithPath: spool + "/outbox/bench/result.plist")))
            .flatMap { try? PropertyListSerialization.propertyList(from: $0, format: nil) as? [String: Any] }
        process.terminate()
        process.waitUntilExit()
        return (seconds, rss, idle, result?["status"] as? String == "succeeded")
    }

    static func run(_ arguments: [String]) throws {
        var count = 200
        if let i = arguments.firstIndex(of: "--count"), i + 1 < arguments.count, let n = Int(arguments[i + 1]) { count = n }
        if arguments.contains("--large") { count = 0 }
        let corpus = NSTemporaryDirectory() + "opq-corpus"
        let t0 = now()
        try self.corpus(corpus, count: count)
        emit(String(format: "corpus files=%d folder=%@ seconds=%.1f", count, corpus, now() - t0))
        let files = (0..<count).map { String(format: "jpeg/photo-%03d.jpg", $0) }
        let out = NSTemporaryDirectory() + "opq-anchor-out"
        try? FileManager.default.removeItem(atPath: out)
        try FileManager.default.createDirectory(atPath: out, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: out) }
        let list = files.map { corpus + "/" + $0 }.joined(separator: "\n")
        let listFile = out + "/files.txt"
        try list.write(toFile: listFile, atomically: true, encoding: .utf8)

        // Sepia at 0.8 as one matrix: 0.2·I + 0.8·M (SPEC §3.3).
        let m = [0.393, 0.769, 0.189, 0.349, 0.686, 0.168, 0.272, 0.534, 0.131]
        let matrix = (0..<9).map { (($0 % 4 == 0) ? 0.2 : 0) + 0.8 * m[$0] }
        if count > 0 { try batch(corpus, files: files, out: out, listFile: listFile, matrix: matrix) }
        try self.large(corpus, out: out, matrix: matrix)
    }

    /// The batch section: sepia and thumbnails of every corpus file, by opqueued and by the tools found installed.
    static func batch(_ corpus: String, files: [String], out: String, listFile: String, matrix: [Double]) throws {
        let count = files.count
        var rows: [(String, Double, Double, Bool)] = []
        func report(_ name: String, _ r: (seconds: Double, rss: Double, ok: Bool), images: Int) {
            rows.append((name, r.seconds, r.rss, r.ok))
            emit(String(format: "images tool=%@ files=%d seconds=%.2f images_per_second=%.1f peak_rss_mb=%.0f%@", name, images, r.seconds,
                        Double(images) / r.seconds, r.rss, r.ok ? "" : " FAILED"))
        }
        let ours = opqueued(corpus, files: files) { id, url in
            [["id": id, "kind": "download", "url": url], ["id": id + "s", "kind": "sepia", "dependencies": [id]],
             ["id": id + "w", "kind": "write", "path": id + ".jpg", "quality": 90, "dependencies": [id + "s"]]]
        }
        report("opqueued-sepia", ours, images: count)
        if have("convert") {
            let color = matrix.map { String(format: "%.4f", $0) }.joined(separator: " ")
            report("imagemagick-color-matrix",
                   shell("xargs -P2 -I{} sh -c 'convert \"{}\" -color-matrix \"\(color)\" -quality 90 \(out)/im-$(basename \"{}\")' "
                         + "< \(listFile)"),
                   images: count)
        }
        if have("vips") {
            let mat = out + "/sepia.mat"
            var text = "3 3\n"
            for row in 0..<3 {
                let values: [String] = (0..<3).map { String(format: "%.4f", matrix[row * 3 + $0]) }
                text += values.joined(separator: " ") + "\n"
            }
            try text.write(toFile: mat, atomically: true, encoding: .utf8)
            report("vips-recomb",
                   shell("xargs -P2 -I{} sh -c 'vips recomb \"{}\" \(out)/vips-$(basename \"{}\")[Q=90] \(mat)' < \(listFile)"),
                   images: count)
        }
        if shell("python3 -c 'import pyvips'").ok {
            let script = (CommandLine.arguments[0] as NSString).deletingLastPathComponent
                + "/../../../Benchmarks/anchors/pyvips_sepia.py"
            let path = FileManager.default.fileExists(atPath: script) ? script : "Benchmarks/anchors/pyvips_sepia.py"
            report("pyvips-recomb-in-process", shell("python3 \(path) \(out) \(listFile)"), images: count)
        }
        if have("djpeg") && have("cjpeg") {
            report("djpeg-cjpeg-floor",
                   shell("xargs -P2 -I{} sh -c 'djpeg \"{}\" | cjpeg -quality 90 > \(out)/floor-$(basename \"{}\")' < \(listFile)"),
                   images: count)
        }
        let thumbs = opqueued(corpus, files: files) { id, url in
            [["id": id, "kind": "download", "url": url], ["id": id + "t", "kind": "thumbnail", "size": 256, "dependencies": [id]],
             ["id": id + "w", "kind": "write", "path": id + ".jpg", "quality": 90, "dependencies": [id + "t"]]]
        }
        report("opqueued-thumbnail-256", thumbs, images: count)
        if have("vipsthumbnail") {
            try? FileManager.default.createDirectory(atPath: out + "/thumbs", withIntermediateDirectories: true)
            report("vipsthumbnail-256", shell("cd \(corpus)/jpeg && vipsthumbnail -s 256 -o \(out)/thumbs/%s.jpg[Q=90] *.jpg"),
                   images: count)
        }
        let anchor = rows.first { $0.0 == "opqueued-sepia" }?.1 ?? 0
        for (name, seconds, _, ok) in rows where ok && name != "opqueued-sepia" && !name.contains("thumbnail") && anchor > 0 {
            emit(String(format: "ratio %@_seconds_over_opqueued=%.2f", name, seconds / anchor))
        }
        if let a = rows.first(where: { $0.0 == "opqueued-thumbnail-256" }), let b = rows.first(where: { $0.0 == "vipsthumbnail-256" }) {
            emit(String(format: "ratio vipsthumbnail_seconds_over_opqueued_thumbnail=%.2f", b.1 / a.1))
        }
    }

    /// The "large" section: one 12000×8000 image at a time, then eight at once.
    static func large(_ corpus: String, out: String, matrix: [Double]) throws {
        let mat = out + "/sepia.mat"
        try ("3 3\n"
             + (0..<3).map { row in (0..<3).map { String(format: "%.4f", matrix[row * 3 + $0]) }.joined(separator: " ") }
                 .joined(separator: "\n")
             + "\n")
            .write(toFile: mat, atomically: true, encoding: .utf8)
        let color = matrix.map { String(format: "%.4f", $0) }.joined(separator: " ")
        var seconds: [String: Double] = [:], rss: [String: Double] = [:]
        func note(_ name: String, _ r: (seconds: Double, rss: Double, ok: Bool), idle: Double? = nil) {
            if r.ok { seconds[name] = r.seconds; rss[name] = r.rss - (idle ?? 0) }
            emit(String(format: "large tool=%@ seconds=%.2f peak_rss_mb=%.0f%@%@", name, r.seconds, r.rss,
                        idle.map { String(format: " idle_rss_mb=%.0f above_idle_mb=%.0f", $0, r.rss - $0) } ?? "", r.ok ? "" : " FAILED"))
        }
        func ours(_ name: String, _ files: [String], _ op: [String: Any]) {
            let r = opqueuedWithIdle(corpus, files: files) { id, url in
                var filter = op
                filter["id"] = id + "f"
                filter["dependencies"] = [id]
                return [["id": id, "kind": "download", "url": url, "maxBytes": 2_000_000_000], filter,
                        ["id": id + "w", "kind": "write", "path": id + ".jpg", "quality": 90, "dependencies": [id + "f"]]]
            }
            note(name, (r.seconds, r.rss, r.ok), idle: r.idle)
        }
        for (format, file) in [("jpeg", "large/large.jpg"), ("png", "large/large.png")] {
            let path = corpus + "/" + file
            ours("opqueued-sepia-\(format)", [file], ["kind": "sepia"])
            ours("opqueued-thumbnail-256-\(format)", [file], ["kind": "thumbnail", "size": 256])
            if format == "jpeg" && have("djpeg") && have("cjpeg") {
                note("djpeg-cjpeg-floor-jpeg", shell("djpeg \(path) | cjpeg -quality 90 > \(out)/floor.jpg"))
            }
            if have("vips") { note("vips-recomb-\(format)", shell("vips recomb \(path) \(out)/vips.jpg[Q=90] \(mat)")) }
            if have("vipsthumbnail") { note("vipsthumbnail-256-\(format)", shell("vipsthumbnail -s 256 -o \(out)/vt.jpg[Q=90] \(path)")) }
            if have("convert") {
                note("imagemagick-color-matrix-\(format)", shell("convert \(path) -color-matrix \"\(color)\" -quality 90 \(out)/im.jpg"))
                note("imagemagick-thumbnail-256-\(format)", shell("convert \(path) -thumbnail 256x256 -quality 90 \(out)/imt.jpg"))
            }
        }
        ours("opqueued-sepia-jpeg-x8", Array(repeating: "large/large.jpg", count: 8), ["kind": "sepia"])
        func ratio(_ name: String, _ a: String, _ b: String, _ table: [String: Double]) {
            if let x = table[a], let y = table[b], y > 0 { emit(String(format: "large ratio %@=%.2f", name, x / y)) }
        }
        ratio("sepia_jpeg_seconds_over_djpeg_cjpeg", "opqueued-sepia-jpeg", "djpeg-cjpeg-floor-jpeg", seconds)
        ratio("sepia_jpeg_seconds_over_vips_recomb", "opqueued-sepia-jpeg", "vips-recomb-jpeg", seconds)
        ratio("sepia_png_seconds_over_vips_recomb", "opqueued-sepia-png", "vips-recomb-png", seconds)
        for format in ["jpeg", "png"] {
            ratio("thumbnail_\(format)_seconds_over_vipsthumbnail", "opqueued-thumbnail-256-\(format)", "vipsthumbnail-256-\(format)",
                  seconds)
            ratio("thumbnail_\(format)_rss_over_vipsthumbnail", "opqueued-thumbnail-256-\(format)", "vipsthumbnail-256-\(format)", rss)
        }
        ratio("sepia_x8_rss_over_single", "opqueued-sepia-jpeg-x8", "opqueued-sepia-jpeg", rss)
    }
}
