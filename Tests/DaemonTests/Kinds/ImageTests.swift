// Image operations through the real daemon (--once on a temporary spool, file:// under a configured root):
// each filter against a reference computed here, PNG in and PNG out; codec conversions; EXIF orientation;
// corrupt, truncated and oversized inputs failing only their operation.

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import OperationKinds
import TestTraits

/// A test image: RGB or RGBA with values from simple formulas.
func makeImage(width: Int, height: Int, alpha: Bool = false,
               _ value: (Int, Int, Int) -> Int = { x, y, c in
                   [(x * 5 + y * 3) % 256, (x * 2 + y * 7) % 256, (x * x + y) % 256, (x + y * 11) % 256][c]
               }) throws -> Image {
    let channels = alpha ? 4 : 3
    let image = try Image(width: width, height: height, channels: channels)
    for y in 0..<height {
        for x in 0..<width { for c in 0..<channels { image.pixels[(y * width + x) * channels + c] = UInt8(value(x, y, c)) } }
    }
    return image
}

func pixel(_ image: Image, _ x: Int, _ y: Int, _ c: Int) -> Int { Int(image.pixels[(y * image.width + x) * image.channels + c]) }

/// Largest difference between `image` and `reference(x, y, c)` over every sample.
func maxDifference(_ image: Image, _ reference: (Int, Int, Int) -> Double) -> Double {
    var worst = 0.0
    for y in 0..<image.height { for x in 0..<image.width { for c in 0..<image.channels {
        worst = max(worst, abs(Double(pixel(image, x, y, c)) - reference(x, y, c)))
    } } }
    return worst
}

/// A spool with an images/ folder configured as the file root.
final class ImageSpool {
    let spool = TestSpool()
    var images: String { spool.root + "-images" }
    /// The console log of the last `run`.
    var lastLog = ""

    init(extraConfig: [String: Any] = [:]) throws {
        try FileManager.default.createDirectory(atPath: images, withIntermediateDirectories: true)
        // The loopback test server is on 127.0.0.1: downloads refuse loopback unless it is opened.
        var download: [String: Any] = ["fileRoots": [images], "allowNetworks": ["127.0.0.0/8"]]
        for (k, v) in (extraConfig["download"] as? [String: Any]) ?? [:] { download[k] = v }
        var object = extraConfig
        object["download"] = download
        try spool.configure(object)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: images)
    }

    func put(_ name: String, _ data: Data) throws { try data.write(to: URL(fileURLWithPath: images + "/" + name)) }
    func url(_ name: String) -> String { "file://" + images + "/" + name }

    /// Runs the manifest with --once; returns the result and the operations by id.
    func run(_ manifest: [String: Any]) throws -> (result: [String: Any], ops: [String: [String: Any]]) {
        try spool.drop("job.plist", manifest)
        let once = try DaemonTests.run("opqueued",
                                       ["--spool", spool.root, "--once", "--config", spool.configPath, "--log-target", "console"])
        #expect(once.status == 0, "\(once.stderr)")
        lastLog = once.stderr
        let job = manifest["job"] as? String ?? "job"
        let result = try #require(spool.result(job, timeout: 5), "\(once.stderr)")
        var ops: [String: [String: Any]] = [:]
        for op in result["operations"] as? [[String: Any]] ?? [] { ops[op["id"] as? String ?? ""] = op }
        return (result, ops)
    }

    func output(_ job: String, _ path: String) throws -> Image {
        try Codecs.decode(Data(contentsOf: URL(fileURLWithPath: spool.root + "/outbox/\(job)/\(path)")), maxPixels: 1 << 30)
    }
}

func chain(_ id: String, from source: String, _ filter: [String: Any], write path: String) -> [[String: Any]] {
    var f = filter
    f["id"] = id
    f["dependencies"] = [source]
    return [f, ["id": "w-" + id, "kind": "write", "path": path, "dependencies": [id]]]
}

@Suite(.serialized, .onItsOwnExecutor) struct ImageTests {
    @Test func everyFilterMatchesAnIndependentReference() throws {
        let s = try ImageSpool()
        let source = try makeImage(width: 61, height: 37)
        let rgba = try makeImage(width: 20, height: 10, alpha: true)
        try s.put("in.png", Codecs.encode(source, format: "png", quality: 90))
        try s.put("rgba.png", Codecs.encode(rgba, format: "png", quality: 90))
        var operations: [[String: Any]] = [
            ["id": "in", "kind": "download", "url": s.url("in.png")],
            ["id": "rgba", "kind": "download", "url": s.url("rgba.png")],
        ]
        operations += chain("sepia", from: "in", ["kind": "sepia", "intensity": 0.7], write: "sepia.png")
        operations += chain("sepia-rgba", from: "rgba", ["kind": "sepia"], write: "rgba/sepia.png")
        operations += chain("grayscale", from: "in", ["kind": "grayscale"], write: "grayscale.png")
        operations += chain("vignette", from: "in", ["kind": "vignette", "strength": 0.6], write: "vignette.png")
        operations += chain("blur", from: "in", ["kind": "blur", "radius": 2], write: "blur.png")
        operations += chain("fit", from: "in", ["kind": "resize", "width": 30, "height": 30], write: "fit.png")
        operations += chain("fill", from: "in", ["kind": "resize", "width": 30, "height": 30, "mode": "fill"], write: "fill.png")
        operations += chain("stretch", from: "in", ["kind": "resize", "width": 10, "height": 50, "mode": "stretch"], write: "stretch.png")
        operations += chain("thumb", from: "in", ["kind": "thumbnail", "size": 20], write: "thumb.png")
        let (result, ops) = try s.run(["job": "filters", "operations": operations])
        #expect(result["status"] as? String == "succeeded", "\(result["error"] ?? "")")
        #expect(ops["w-sepia"]?["outputs"] as? [String] == ["sepia.png"])
        #expect(ops["w-sepia-rgba"]?["outputs"] as? [String] == ["rgba/sepia.png"])

        func value(_ x: Int, _ y: Int, _ c: Int) -> Double { Double(pixel(source, x, y, c)) }
        let m = [[0.393, 0.769, 0.189], [0.349, 0.686, 0.168], [0.272, 0.534, 0.131]]
        func sepia(_ i: Double, _ img: Image, _ x: Int, _ y: Int, _ c: Int) -> Double {
            if c == 3 { return Double(pixel(img, x, y, 3)) }
            let rgb = (0..<3).map { Double(pixel(img, x, y, $0)) }
            let v = (1 - i) * rgb[c] + i * (m[c][0] * rgb[0] + m[c][1] * rgb[1] + m[c][2] * rgb[2])
            return min(255, max(0, v)).rounded()
        }
        #expect((maxDifference(try s.output("filters", "sepia.png")) { sepia(0.7, source, $0, $1, $2) }) <= 2)
        let sepiaRGBA = try s.output("filters", "rgba/sepia.png")
        #expect(sepiaRGBA.channels == 4, "alpha kept")
        #expect((maxDifference(sepiaRGBA) { sepia(0.8, rgba, $0, $1, $2) }) <= 2)

        #expect((maxDifference(try s.output("filters", "grayscale.png")) { x, y, _ in
            (0.299 * value(x, y, 0) + 0.587 * value(x, y, 1) + 0.114 * value(x, y, 2)).rounded()
        }) <= 2)

        let cx = Double(source.width - 1) / 2, cy = Double(source.height - 1) / 2
        #expect((maxDifference(try s.output("filters", "vignette.png")) { x, y, c in
            let d2 = ((Double(x) - cx) * (Double(x) - cx) + (Double(y) - cy) * (Double(y) - cy)) / (cx * cx + cy * cy)
            return (value(x, y, c) * max(0, 1 - 0.6 * d2)).rounded()
        }) <= 2)

        // A direct 2-D Gaussian (σ = radius), edges clamped.
        let blurred = try s.output("filters", "blur.png")
        let half = 6
        var weights: [Double] = (-half...half).map { exp(-Double($0 * $0) / 8) }
        let total = weights.reduce(0, +)
        weights = weights.map { $0 / total }
        #expect((maxDifference(blurred) { x, y, c in
            var sum = 0.0
            for j in -half...half { for i in -half...half {
                sum += weights[i + half] * weights[j + half] * value(
                    min(source.width - 1, max(0, x + i)), min(source.height - 1, max(0, y + j)), c)
            } }
            return sum
        }) <= 2)

        let fit = try s.output("filters", "fit.png"), fill = try s.output("filters", "fill.png")
        let stretch = try s.output("filters", "stretch.png"), thumb = try s.output("filters", "thumb.png")
        #expect(fit.width == 30 && fit.height == 18)
        #expect(fill.width == 30 && fill.height == 30)
        #expect(stretch.width == 10 && stretch.height == 50)
        #expect(thumb.width == 20 && thumb.height == 12)
    }

    @Test func downscalingAveragesRatherThanPicksPixels() throws {
        let s = try ImageSpool()
        // One-pixel black and white stripes: nearest-neighbour would keep 0s or 255s; averaging gives grey.
        let stripes = try makeImage(width: 64, height: 64) { x, _, _ in x % 2 == 0 ? 0 : 255 }
        try s.put("stripes.png", Codecs.encode(stripes, format: "png", quality: 90))
        let ops: [[String: Any]] = [["id": "in", "kind": "download", "url": s.url("stripes.png")]]
            + chain("half", from: "in", ["kind": "resize", "width": 16, "mode": "fit"], write: "small.png")
        let (result, _) = try s.run(["job": "stripes", "operations": ops])
        #expect(result["status"] as? String == "succeeded")
        let small = try s.output("stripes", "small.png")
        #expect(small.width == 16 && small.height == 16)
        // Away from the edges (a Lanczos-3 window reaches three output pixels in; clamping repeats the outermost stripe), every
        // pixel is mid-grey.
        for y in 0..<16 { for x in 3..<13 { #expect(abs(pixel(small, x, y, 0) - 128) <= 4, "(\(x), \(y))") } }
    }

    @Test func greyPaletteAndSixteenBitPNGsAreConverted() throws {
        let s = try ImageSpool()
        let made = try DaemonTests.run("/usr/bin/env", ["python3", supportFolder + "/make_pngs.py", s.images])
        try #require(made.status == 0, "\(made.stderr)")
        var ops: [[String: Any]] = []
        for name in ["grey8", "grey2", "palette", "rgb16", "huge"] {
            ops.append(["id": name, "kind": "download", "url": s.url(name + ".png")])
            ops += chain("g-" + name, from: name, ["kind": "sepia", "intensity": 0], write: name + ".png")
        }
        let (result, byID) = try s.run(["job": "conversions", "operations": ops])
        #expect(result["status"] as? String == "failed", "only huge fails")
        let palette = [[255, 0, 0], [0, 128, 0], [0, 0, 255], [250, 250, 10]]
        #expect((maxDifference(try s.output("conversions", "grey8.png")) { x, y, _ in Double((7 * x + 3 * y) % 256) }) == 0)
        #expect((maxDifference(try s.output("conversions", "grey2.png")) { x, y, _ in Double(((x + y) % 4) * 85) }) == 0)
        #expect((maxDifference(try s.output("conversions", "palette.png")) { x, y, c in Double(palette[(x + 2 * y) % 4][c]) }) == 0)
        #expect((maxDifference(try s.output("conversions", "rgb16.png")) { x, y, c in
            (Double((x * 4099 + y * 257 + c * 9000) % 65536) * 255 / 65535).rounded()
        }) <= 1, "16-bit samples rounded to 8")
        #expect(byID["g-huge"]?["state"] as? String == "failed")
        #expect((byID["g-huge"]?["error"] as? String)?.contains("100000×100000 pixels is more than maxPixels (100000000)") == true,
                "\(byID["g-huge"]?["error"] ?? "")")
    }

    /// A CMYK JPEG (print work, as Photoshop saves it; libjpeg-turbo gives its four inks and no RGB) is read as
    /// libvips and ImageMagick read one without a colour profile, whether its inks are stored inverted under an Adobe
    /// marker or not, in full and at a reduced DCT scale. It failed with "Unsupported color conversion request".
    @Test func cmykJPEGsAreConvertedToRGB() throws {
        let s = try ImageSpool()
        let tool = s.images + "/make_cmyk_jpegs"
        let built = try DaemonTests.run("/usr/bin/cc", ["-O1", "-o", tool, supportFolder + "/make_cmyk_jpegs.c", "-ljpeg"])
        try #require(built.status == 0, "\(built.stderr)")
        let made = try DaemonTests.run(tool, [s.images])
        try #require(made.status == 0, "\(made.stderr)")
        var ops: [[String: Any]] = []
        for name in ["cmyk", "cmyk-adobe"] {
            ops.append(["id": name, "kind": "download", "url": s.url(name + ".jpg")])
            ops += chain("full-" + name, from: name, ["kind": "sepia", "intensity": 0], write: name + ".png")
            ops += chain("half-" + name, from: name, ["kind": "resize", "width": 32, "height": 24, "mode": "stretch"],
                         write: name + "-half.png")
        }
        let (result, byID) = try s.run(["job": "cmyk", "operations": ops])
        #expect(result["status"] as? String == "succeeded", "\(byID.values.compactMap { $0["error"] })")
        // Bands from the left: cyan ink, magenta and yellow, half black, none.
        let bands: [[Double]] = [[0, 255, 255], [255, 0, 0], [127, 127, 127], [255, 255, 255]]
        for name in ["cmyk", "cmyk-adobe"] {
            for (file, scale) in [(name + ".png", 1), (name + "-half.png", 2)] {
                let image = try s.output("cmyk", file)
                #expect(image.width == 64 / scale && image.height == 48 / scale, "\(file)")
                for (band, rgb) in bands.enumerated() {
                    let x = (band * 16 + 8) / scale
                    for c in 0..<3 {
                        #expect(abs(Double(pixel(image, x, 20 / scale, c)) - rgb[c]) <= 6, "\(file): band \(band), channel \(c)")
                    }
                }
            }
        }
    }

    /// A resize or thumbnail that would make more pixels than image.maxPixels fails as a decoded image that large
    /// does, before a pixel is made: `fit` into 1,000,000×1,000,000 made a 10×10 PNG into 10¹² pixels, streamed into
    /// the outbox for days, or asked for terabytes where the image is held whole.
    @Test func anUpscalePastMaxPixelsFailsBeforeAnyPixel() throws {
        let s = try ImageSpool()
        try s.put("small.png", Codecs.encode(try makeImage(width: 10, height: 10), format: "png", quality: 90))
        let fit: [String: Any] = ["kind": "resize", "width": 1_000_000, "height": 1_000_000]
        var ops: [[String: Any]] = [["id": "small", "kind": "download", "url": s.url("small.png")]]
        ops += chain("streamed", from: "small", fit, write: "streamed.png")
        // Read by two operations, it is held whole.
        ops.append(fit.merging(["id": "held", "dependencies": ["small"]]) { $1 })
        ops.append(["id": "held-a", "kind": "write", "path": "a.png", "dependencies": ["held"]])
        ops.append(["id": "held-b", "kind": "write", "path": "b.png", "dependencies": ["held"]])
        // A fill to 20,000×100 of a square scales it to 20,000×20,000 before its crop.
        ops += chain("filled", from: "small", ["kind": "resize", "width": 20_000, "height": 100, "mode": "fill"], write: "filled.png")
        let started = Date()
        let (result, byID) = try s.run(["job": "upscale", "operations": ops])
        #expect(result["status"] as? String == "failed")
        #expect(Date().timeIntervalSince(started) < 20, "failed at once, not after making pixels")
        let message = "resize to 1000000×1000000 pixels makes an image of more than image.maxPixels (100000000)"
        // Streamed into its write or held whole, the resize is what fails; its write is cancelled.
        #expect(byID["streamed"]?["error"] as? String == message, "\(byID["streamed"] ?? [:])")
        #expect(byID["w-streamed"]?["state"] as? String == "cancelled", "\(byID["w-streamed"] ?? [:])")
        #expect(byID["held"]?["error"] as? String == message, "\(byID["held"] ?? [:])")
        #expect((byID["filled"]?["error"] as? String)?
            .hasPrefix("resize (fill, before its crop) to 20000×20000 pixels makes an image of more than image.maxPixels") == true,
                "\(byID["filled"] ?? [:])")
        #expect(!FileManager.default.fileExists(atPath: s.spool.root + "/outbox/upscale/streamed.png"))
    }

    @Test func exifOrientationIsApplied() throws {
        let s = try ImageSpool()
        // 40×20, left half red, right half blue; EXIF 6 (rotate 90° clockwise to display).
        let source = try makeImage(width: 40, height: 20) { x, _, c in x < 20 ? [255, 0, 0][c] : [0, 0, 255][c] }
        var jpeg = try Codecs.encode(source, format: "jpeg", quality: 95)
        var tiff: [UInt8] = Array("MM".utf8) + [0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0]
        tiff = Array("Exif".utf8) + [0, 0] + tiff
        let length = tiff.count + 2
        jpeg.insert(contentsOf: [0xFF, 0xE1, UInt8(length >> 8), UInt8(length & 0xFF)] + tiff, at: 2)
        try s.put("rotated.jpg", jpeg)
        let ops: [[String: Any]] = [["id": "in", "kind": "download", "url": s.url("rotated.jpg")]]
            + chain("keep", from: "in", ["kind": "sepia", "intensity": 0], write: "upright.png")
        let (result, _) = try s.run(["job": "exif", "operations": ops])
        #expect(result["status"] as? String == "succeeded", "\(result["error"] ?? "")")
        let upright = try s.output("exif", "upright.png")
        #expect(upright.width == 20 && upright.height == 40)
        // Rotated clockwise, the red left half is now the top half.
        #expect(pixel(upright, 10, 5, 0) > 200 && pixel(upright, 10, 5, 2) < 60)
        #expect(pixel(upright, 10, 35, 2) > 200 && pixel(upright, 10, 35, 0) < 60)
    }

    @Test func corruptAndTruncatedImagesFailOnlyTheirOperation() throws {
        let s = try ImageSpool()
        let photo = try makeImage(width: 64, height: 48)
        let jpeg = try Codecs.encode(photo, format: "jpeg", quality: 90)
        let png = try Codecs.encode(photo, format: "png", quality: 90)
        try s.put("good.jpg", jpeg)
        try s.put("truncated.jpg", jpeg.prefix(jpeg.count * 2 / 3))
        var corrupt = png
        corrupt[corrupt.count / 2] ^= 0xFF
        try s.put("corrupt.png", corrupt)
        try s.put("truncated.png", png.prefix(png.count - 30))
        try s.put("text.jpg", Data("not an image at all".utf8))
        var ops: [[String: Any]] = []
        for name in ["good.jpg", "truncated.jpg", "corrupt.png", "truncated.png", "text.jpg"] {
            let id = name.replacingOccurrences(of: ".", with: "-")
            ops.append(["id": id, "kind": "download", "url": s.url(name)])
            ops += chain("f-" + id, from: id, ["kind": "grayscale"], write: id + ".png")
        }
        // The same inputs through a grayscale read by two writes: not fused, the grayscale decodes and fails itself.
        for name in ["truncated.jpg", "corrupt.png", "truncated.png"] {
            let id = "twice-" + name.replacingOccurrences(of: ".", with: "-")
            ops.append(["id": id, "kind": "grayscale", "dependencies": [name.replacingOccurrences(of: ".", with: "-")]])
            ops.append(["id": id + "-a", "kind": "write", "path": id + "-a.png", "dependencies": [id]])
            ops.append(["id": id + "-b", "kind": "write", "path": id + "-b.png", "dependencies": [id]])
        }
        let (result, byID) = try s.run(["job": "corrupt", "operations": ops])
        #expect(result["status"] as? String == "failed")
        #expect(byID["w-f-good-jpg"]?["state"] as? String == "succeeded")
        func error(_ id: String) -> String { byID[id]?["error"] as? String ?? "" }
        // A header that is no image fails the image operation itself, fused or not.
        #expect(byID["f-text-jpg"]?["state"] as? String == "failed")
        #expect(byID["w-f-text-jpg"]?["state"] as? String == "cancelled")
        #expect(error("f-text-jpg").contains("not a PNG or JPEG"))
        // Fused (grayscale → write) or not, the grayscale fails with the codec's message and its write is cancelled:
        // the pixels are decoded in the write when fused, but the stage that fails is the grayscale's.
        for id in ["truncated-jpg", "corrupt-png", "truncated-png"] {
            #expect(byID["f-" + id]?["state"] as? String == "failed", "\(id)")
            #expect(byID["w-f-" + id]?["state"] as? String == "cancelled", "\(id)")
            #expect(error("w-f-" + id) == "dependency 'f-\(id)' failed", "\(error("w-f-" + id))")
            #expect(error("f-" + id) == error("twice-" + id), "\(id): the same message fused or not")
            #expect(byID["twice-" + id]?["state"] as? String == "failed", "\(id)")
            #expect(byID["twice-\(id)-a"]?["state"] as? String == "cancelled", "\(id)")
        }
        #expect(error("f-truncated-jpg").contains("Premature end of JPEG file"), "\(error("f-truncated-jpg"))")
        #expect(error("twice-truncated-jpg").contains("Premature end of JPEG file"), "\(error("twice-truncated-jpg"))")
        #expect(!error("f-corrupt-png").isEmpty && !error("twice-corrupt-png").isEmpty)
        #expect(error("f-truncated-png").contains("truncated"), "\(error("f-truncated-png"))")
        #expect(error("twice-truncated-png").contains("truncated"), "\(error("twice-truncated-png"))")
        // No half-written file is left behind by a failed streamed write.
        let left = (try? FileManager.default.contentsOfDirectory(atPath: s.spool.root + "/outbox/corrupt")) ?? []
        #expect(left.contains("good-jpg.png")
                    && !left.contains { $0.hasPrefix(".") || $0.hasPrefix("truncated") || $0.hasPrefix("corrupt") }, "\(left)")
    }
}

@Suite(.onItsOwnExecutor) struct ShippedExampleTests {
    /// The walk-through's photo example, as `make example` drops it, with the configuration `make run` uses.
    @Test func photoExampleWorksOffline() throws {
        let spool = TestSpool()
        let examples = repositoryRoot + "/spool/examples"
        let template = try String(contentsOfFile: examples + "/photos.plist.in", encoding: .utf8)
        try Data(template.replacingOccurrences(of: "@EXAMPLES@", with: examples).utf8)
            .write(to: URL(fileURLWithPath: spool.root + "/inbox/photos.plist"))
        let config = try spool.configure(["download": ["fileRoots": [examples]]])
        let once = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"] + config)
        #expect(once.status == 0)
        let result = try #require(spool.result("photos", timeout: 5), "\(once.stderr)")
        #expect(result["status"] as? String == "succeeded", "\(result["error"] ?? "")")
        for path in ["harbour.jpg", "thumbnails/harbour.png", "meadow.jpg", "dusk.png"] {
            let image = try Codecs.decode(Data(contentsOf: URL(fileURLWithPath: spool.root + "/outbox/photos/" + path)), maxPixels: 1 << 24)
            #expect(image.width > 0, "\(path)")
        }
        let thumbnail = try Codecs.decode(Data(contentsOf: URL(fileURLWithPath: spool.root + "/outbox/photos/thumbnails/harbour.png")),
                                          maxPixels: 1 << 24)
        #expect(thumbnail.width == 128 && thumbnail.height == 72)
    }
}

@Suite(.onItsOwnExecutor) struct DecompressionBombTests {
    /// maxPixels is checked from the header: the 30 GB the header asks for are never allocated. (A bound on
    /// the daemon's peak RSS three orders of magnitude below that, not a measurement.)
    @Test func aHugeHeaderFailsWithoutTheDaemonAllocatingIt() throws {
        let s = try ImageSpool()
        let made = try run("/usr/bin/env", ["python3", supportFolder + "/make_pngs.py", s.images])
        try #require(made.status == 0)
        try s.spool.start(["--config", s.spool.configPath])
        try s.spool.drop("bomb.plist", ["job": "bomb", "operations": [
            ["id": "get", "kind": "download", "url": s.url("huge.png")],
            ["id": "open", "kind": "grayscale", "dependencies": ["get"]],
        ]])
        let result = try #require(s.spool.result("bomb"))
        #expect(result["status"] as? String == "failed")
        let ops = result["operations"] as? [[String: Any]] ?? []
        #expect((ops.last?["error"] as? String)?.contains("is more than maxPixels") == true)
        let peak = processMemoryMB(try #require(s.spool.daemon?.processIdentifier))
        #expect(peak > 0 && peak < 200, "peak RSS \(peak) MB")
        #expect(s.spool.daemon?.isRunning == true)
    }
}
