// The fused strip pipeline (issue 15): streamed output equals the whole-image filters (kept as the reference)
// pixel for pixel, for every filter, PNG and JPEG, with alpha; the daemon's write gives the same bytes as
// encoding the reference; JPEG shrink-on-load stays close to a full decode; and the daemon's peak memory
// through a big sepia → write stays far below the decoded size (while the unfused path does not).

import Foundation
import Testing
import OperationEngine
import TestSupport
@testable import Daemon
@testable import JobModel
@testable import OperationKinds
import TestTraits

/// A smooth picture with some texture (JPEG-friendly, so DCT scaling is comparable to a full decode).
func smoothImage(width: Int, height: Int, alpha: Bool = false) throws -> Image {
    let c = alpha ? 4 : 3
    let image = try Image(width: width, height: height, channels: c)
    let p = image.pixels
    for y in 0..<height {
        for x in 0..<width {
            let o = (y * width + x) * c
            p[o] = UInt8((x * 255) / max(1, width - 1))
            p[o + 1] = UInt8((y * 255) / max(1, height - 1))
            p[o + 2] = UInt8(128 + Int(100 * sin(Double(x + y) / 37)))
            if alpha { p[o + 3] = UInt8((x + 2 * y) % 256) }
        }
    }
    return image
}

func samePixels(_ a: Image, _ b: Image) -> Bool {
    a.width == b.width && a.height == b.height && a.channels == b.channels && memcmp(a.pixels, b.pixels, a.byteCount) == 0
}

func noCancel() throws {}

@Suite(.onItsOwnExecutor) struct PipelineTests {
    static var steps: [(String, ImageStep, (Image) throws -> Image)] { [
        ("sepia", .sepia(intensity: 0.8), { try Filters.sepia($0, intensity: 0.8, check: noCancel) }),
        ("grayscale", .grayscale, { try Filters.grayscale($0, check: noCancel) }),
        ("vignette", .vignette(strength: 0.7), { try Filters.vignette($0, strength: 0.7, check: noCancel) }),
        ("blur", .blur(radius: 3), { try Filters.blur($0, radius: 3, check: noCancel) }),
        ("blur-wide", .blur(radius: 20), { try Filters.blur($0, radius: 20, check: noCancel) }),
        // Windows taller than the image (361 and 703 taps over 117 rows): the ring holds the image's rows, not taps.
        ("blur-taller", .blur(radius: 60), { try Filters.blur($0, radius: 60, check: noCancel) }),
        ("squash", .resize(width: 203, height: 1, mode: "stretch"),
         { try Filters.resize($0, width: 203, height: 1, mode: "stretch", check: noCancel) }),
        ("fit-down", .resize(width: 61, height: 61, mode: "fit"),
         { try Filters.resize($0, width: 61, height: 61, mode: "fit", check: noCancel) }),
        ("fill", .resize(width: 50, height: 90, mode: "fill"),
         { try Filters.resize($0, width: 50, height: 90, mode: "fill", check: noCancel) }),
        ("stretch-up", .resize(width: 400, height: 150, mode: "stretch"),
         { try Filters.resize($0, width: 400, height: 150, mode: "stretch", check: noCancel) }),
        ("thumbnail", .thumbnail(size: 40), { try Filters.thumbnail($0, size: 40, check: noCancel) }),
    ] }

    /// A blur's weights are one row of taps, whatever the image's size: radius 1000 on a 100,000-pixel-wide image
    /// made a table of 100,000 × 6,001 Floats (2.4 GB) for a 290 kB PNG.
    @Test func aBlursKernelDoesNotGrowWithTheImage() {
        let kernel = Filters.gaussianKernel(size: 100_000, sigma: 1000)
        #expect(kernel.taps == 6001 && kernel.weights.count == 6001 && kernel.weightStride == 0)
        #expect(abs(kernel.weights.reduce(0, +) - 1) < 1e-4)
        let resize = Filters.lanczosKernel(source: 100, target: 10)
        #expect(resize.weightStride == resize.taps && resize.weights.count == 10 * resize.taps)
    }

    /// Every filter, from PNG (RGB and RGBA) and JPEG bytes and from an image in memory: the strips give the
    /// reference's pixels exactly (203×117: strips of 32 rows do not divide it; blur-wide spans several strips).
    @Test func streamedFiltersEqualTheWholeImageFilters() throws {
        let rgb = try smoothImage(width: 203, height: 117), rgba = try smoothImage(width: 203, height: 117, alpha: true)
        let sources: [(String, Data)] = [
            ("png", try Codecs.encode(rgb, format: "png", quality: 90)),
            ("png-rgba", try Codecs.encode(rgba, format: "png", quality: 90)),
            ("jpeg", try Codecs.encode(rgb, format: "jpeg", quality: 90)),
        ]
        for (format, bytes) in sources {
            let decoded = try Codecs.decode(bytes, maxPixels: 1 << 30)
            for (name, step, reference) in Self.steps {
                let expected = try reference(decoded)
                // Resizing JPEG bytes shrinks on load (compared separately below); from pixels it must be exact.
                let shrinks: Bool
                switch step {
                case .resize, .thumbnail: shrinks = format == "jpeg"
                default: shrinks = false
                }
                if !shrinks {
                    let streamed = try ImagePipeline(source: .bytes(bytes), steps: [step], operations: [name]).materialise(
                        maxPixels: 1 << 30, check: noCancel)
                    #expect(samePixels(streamed, expected), "\(name) from \(format) bytes")
                }
                let fromImage = try ImagePipeline(source: .image(decoded), steps: [step], operations: [name]).materialise(
                    maxPixels: 1 << 30, check: noCancel)
                #expect(samePixels(fromImage, expected), "\(name) from a \(format) image")
            }
        }
    }

    /// A long chain, every stage streamed over the next: the same pixels as the filters one after the other.
    @Test func aChainOfEveryFilterEqualsTheFiltersInTurn() throws {
        for alpha in [false, true] {
            let source = try smoothImage(width: 203, height: 117, alpha: alpha)
            let bytes = try Codecs.encode(source, format: "png", quality: 90)
            var expected = source
            for (_, _, reference) in Self.steps { expected = try reference(expected) }
            let chain = ImagePipeline(source: .bytes(bytes), steps: Self.steps.map(\.1), operations: Self.steps.map(\.0))
            #expect(samePixels(try chain.materialise(maxPixels: 1 << 30, check: noCancel), expected), "alpha \(alpha)")
        }
    }

    /// The daemon's fused download → filters → write gives the bytes of encoding the reference image, PNG and
    /// JPEG (both encoders are deterministic), with alpha.
    @Test func fusedWritesGiveTheReferenceBytes() throws {
        let s = try ImageSpool()
        let source = try smoothImage(width: 150, height: 97, alpha: true)
        try s.put("in.png", Codecs.encode(source, format: "png", quality: 90))
        var ops: [[String: Any]] = [["id": "in", "kind": "download", "url": s.url("in.png")],
                                    ["id": "sepia", "kind": "sepia", "dependencies": ["in"]],
                                    ["id": "blur", "kind": "blur", "radius": 2, "dependencies": ["sepia"]],
                                    ["id": "fill", "kind": "resize", "width": 60, "height": 60, "mode": "fill", "dependencies": ["blur"]],
                                    ["id": "vignette", "kind": "vignette", "dependencies": ["fill"]],
                                    ["id": "png", "kind": "write", "path": "out.png", "dependencies": ["vignette"]]]
        // A second chain ending in JPEG, and one image read twice (materialised, then each write streams it).
        ops += [["id": "gray", "kind": "grayscale", "dependencies": ["in"]],
                ["id": "jpeg", "kind": "write", "path": "out.jpg", "quality": 85, "dependencies": ["gray"]],
                ["id": "shared", "kind": "sepia", "intensity": 0.5, "dependencies": ["in"]],
                ["id": "a", "kind": "write", "path": "a.png", "dependencies": ["shared"]],
                ["id": "b", "kind": "write", "path": "b.jpg", "dependencies": ["shared"]]]
        let (result, _) = try s.run(["job": "fused", "operations": ops])
        #expect(result["status"] as? String == "succeeded", "\(result["error"] ?? "")")
        var expected = try Filters.sepia(source, intensity: 0.8, check: noCancel)
        expected = try Filters.blur(expected, radius: 2, check: noCancel)
        expected = try Filters.resize(expected, width: 60, height: 60, mode: "fill", check: noCancel)
        expected = try Filters.vignette(expected, strength: 0.5, check: noCancel)
        func file(_ name: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: s.spool.root + "/outbox/fused/" + name)) }
        #expect(try file("out.png") == Codecs.encode(expected, format: "png", quality: 90))
        #expect(try file("out.jpg") == Codecs.encode(try Filters.grayscale(source, check: noCancel), format: "jpeg", quality: 85))
        let shared = try Filters.sepia(source, intensity: 0.5, check: noCancel)
        #expect(try file("a.png") == Codecs.encode(shared, format: "png", quality: 90))
        #expect(try file("b.jpg") == Codecs.encode(shared, format: "jpeg", quality: 90))
    }

    /// Which operations fuse: only an image operation whose one dependent takes it as its only dependency.
    @Test func fusionFollowsTheGraph() throws {
        func op(_ id: String, _ parameters: Parameters, _ deps: [String], input: String? = nil) -> OperationPlan {
            OperationPlan(id: id, kind: .sleep, queue: "q", dependencies: deps, input: input, qualityOfService: nil, queuePriority: nil,
                          timeoutSeconds: nil, retries: 0, retryDelaySeconds: 1, runsAfterFailure: false, parameters: parameters)
        }
        let write = Parameters.write(path: "x.png", format: "png", quality: 90)
        let plan = [
            op("d", .download(url: "file:///x", maxBytes: nil), []),
            op("s", .sepia(intensity: 0.8), ["d"]), op("t", .thumbnail(size: 10), ["s"]), op("w", write, ["t"]),   // s, t fuse
            op("g", .grayscale, ["d"]), op("w1", write, ["g"]), op("w2", write, ["g"]),                           // two readers
            op("b", .blur(radius: 1), ["d"]), op("z", .sleep(seconds: 0), []), op("w3", write, ["b", "z"]),       // two dependencies
            op("v", .vignette(strength: 0.5), ["d"]), op("w4", write, ["v"]),                                     // fuses
        ]
        #expect(ImageFusion.fusedOperations(plan) == ["s", "t", "v"])
    }

    /// JPEG shrink-on-load picks the largest DCT reduction that keeps the target, and the result stays within
    /// a small tolerance of resizing a full decode.
    @Test func shrinkOnLoadStaysCloseToAFullDecode() throws {
        let source = try smoothImage(width: 1600, height: 1200)
        let jpeg = try Codecs.encode(source, format: "jpeg", quality: 92)
        let full = try Codecs.decode(jpeg, maxPixels: 1 << 30)
        for (step, reference) in [(ImageStep.thumbnail(size: 150), { try Filters.thumbnail(full, size: 150, check: noCancel) }),
                                  (.resize(width: 300, height: nil, mode: "fit"),
                                   { try Filters.resize(full, width: 300, height: nil, mode: "fit", check: noCancel) }),
                                  (.resize(width: 190, height: 190, mode: "fill"),
                                   { try Filters.resize(full, width: 190, height: 190, mode: "fill", check: noCancel) })] {
            let chain = ImagePipeline(source: .bytes(jpeg), steps: [.sepia(intensity: 0), step], operations: ["s", "r"])
            let shrink = chain.shrinkOnLoad(width: 1600, height: 1200)
            #expect(shrink.side > 0 || shrink.width > 0, "\(step) shrinks on load")
            let streamed = try chain.materialise(maxPixels: 1 << 30, check: noCancel)
            let expected = try reference()
            #expect(streamed.width == expected.width && streamed.height == expected.height, "\(step)")
            var total = 0, worst = 0
            for i in 0..<min(streamed.byteCount, expected.byteCount) {
                let d = abs(Int(streamed.pixels[i]) - Int(expected.pixels[i]))
                total += d
                worst = max(worst, d)
            }
            let mean = Double(total) / Double(max(1, expected.byteCount))
            #expect(mean < 1.5 && worst < 24, "\(step): mean \(mean), worst \(worst)")
        }
        // A blur first keeps the full size (its radius is in source pixels).
        let blurFirst = ImagePipeline(source: .bytes(jpeg), steps: [.blur(radius: 2), .thumbnail(size: 100)], operations: [])
            .shrinkOnLoad(width: 1600, height: 1200)
        #expect(blurFirst.width == 0 && blurFirst.height == 0 && blurFirst.side == 0)
    }

    /// maxPixels is still checked from the header, before anything is allocated, on the streamed path.
    @Test func maxPixelsIsCheckedBeforeDecoding() throws {
        let bytes = try Codecs.encode(try smoothImage(width: 100, height: 100), format: "jpeg", quality: 90)
        #expect(throws: ImageError.self) { try ImagePipeline.checkHeader(bytes, maxPixels: 9_999) }
        let chain = ImagePipeline(source: .bytes(bytes), steps: [.sepia(intensity: 1)], operations: ["s"])
        do {
            _ = try chain.materialise(maxPixels: 9_999, check: noCancel)
            Issue.record("an image over maxPixels decoded")
        } catch {
            #expect("\(error)".contains("100×100 pixels is more than maxPixels (9999)"), "\(error)")
        }
    }

    /// Cancellation is checked between strips: a cancelled check stops the chain.
    @Test func cancellationStopsBetweenStrips() throws {
        let bytes = try Codecs.encode(try smoothImage(width: 64, height: 400), format: "png", quality: 90)
        final class Counter: @unchecked Sendable { var calls = 0 }
        let counter = Counter()
        let check: CancellationCheck = {
            counter.calls += 1
            if counter.calls == 3 { throw OperationCancelled() }
        }
        #expect(throws: OperationCancelled.self) {
            try ImagePipeline(source: .bytes(bytes), steps: [.blur(radius: 2)], operations: ["b"]).materialise(
                maxPixels: 1 << 30, check: check)
        }
        #expect(counter.calls == 3)
    }
}

@Suite(.onItsOwnExecutor) struct StripHandoffTests {
    struct Stop: Error {}

    /// Big images overlap the making of strips (a second thread) with their encoding: every row arrives, in
    /// order; an error on either side ends both, without hanging.
    @Test func stripsArriveInOrderAndErrorsStopBothSides() throws {
        let image = try smoothImage(width: 300, height: 517, alpha: true)
        var received = Data()
        try StripHandoff(ImageRows(image), check: noCancel).run { pixels, n in received.append(pixels, count: n * image.stride) }
        #expect(received == Data(bytes: image.pixels, count: image.byteCount))

        var strips = 0
        #expect(throws: Stop.self) {
            try StripHandoff(ImageRows(image), check: noCancel).run { _, _ in
                strips += 1
                if strips == 2 { throw Stop() }
            }
        }
        #expect(strips == 2)

        final class Counter: @unchecked Sendable { var calls = 0 }
        let counter = Counter()
        let cancelling: CancellationCheck = {
            counter.calls += 1
            if counter.calls == 5 { throw OperationCancelled() }
        }
        var encoded = 0
        #expect(throws: OperationCancelled.self) {
            try StripHandoff(ImageRows(image), check: cancelling).run { _, _ in encoded += 1 }
        }
        #expect(encoded == 4, "the strips made before the cancellation were handed on")
    }
}

@Suite(.onItsOwnExecutor) struct PipelineRecoveryTests {
    /// Killed after a fused chain's write made its .part file (before the rename), the daemon recomputes the
    /// chain on restart (the fused operations are pure and not recovered) and writes the same bytes.
    @Test func aRestartRecomputesAFusedChain() throws {
        let s = try ImageSpool()
        let source = try smoothImage(width: 120, height: 80, alpha: true)
        try s.put("in.png", Codecs.encode(source, format: "png", quality: 90))
        try s.spool.drop("crash.plist", ["job": "crash", "operations": [
            ["id": "in", "kind": "download", "url": s.url("in.png")],
            ["id": "sepia", "kind": "sepia", "dependencies": ["in"]],
            ["id": "thumb", "kind": "thumbnail", "size": 50, "dependencies": ["sepia"]],
            ["id": "out", "kind": "write", "path": "out.png", "dependencies": ["thumb"]],
        ]])
        let arguments = ["--spool", s.spool.root, "--once", "--config", s.spool.configPath, "--log-target", "console"]
        let killed = try DaemonTests.run("/usr/bin/env", ["OPQUEUED_CRASH_POINTS=write.part:1", binaries + "/opqueued"] + arguments)
        #expect(killed.status != 0, "the crash point killed the daemon")
        #expect(s.spool.result("crash", timeout: 0.1) == nil)
        let again = try DaemonTests.run("opqueued", arguments)
        #expect(again.status == 0, "\(again.stderr)")
        let result = try #require(s.spool.result("crash", timeout: 5), "\(again.stderr)")
        #expect(result["status"] as? String == "succeeded", "\(result["error"] ?? "")")
        let expected = try Filters.thumbnail(try Filters.sepia(source, intensity: 0.8, check: noCancel), size: 50, check: noCancel)
        #expect(try Data(contentsOf: URL(fileURLWithPath: s.spool.root + "/outbox/crash/out.png"))
                    == Codecs.encode(expected, format: "png", quality: 90))
        let left = (try? FileManager.default.contentsOfDirectory(atPath: s.spool.root + "/outbox/crash")) ?? []
        #expect(!left.contains { $0.hasPrefix(".") }, "\(left)")
    }
}

@Suite(.serialized, .onItsOwnExecutor) struct PipelineMemoryTests {
    /// A 6000×4000 JPEG (72 MB decoded) through download → sepia → write JPEG: the daemon's peak RSS grows by
    /// far less than the decoded size. The same image read by two writes is materialised (the old path),
    /// which the same bound does not hold for: the bound tells the two apart.
    @Test func bigSepiaToWriteStaysFarBelowTheDecodedSize() throws {
        let s = try ImageSpool()
        let width = 6000, height = 4000
        let big = try Image(width: width, height: height, channels: 3)
        for y in 0..<height {
            let row = big.pixels + y * width * 3
            for x in 0..<width {
                row[x * 3] = UInt8(truncatingIfNeeded: x / 24)
                row[x * 3 + 1] = UInt8(truncatingIfNeeded: y / 16)
                row[x * 3 + 2] = 90
            }
        }
        let jpeg = try Codecs.encode(big, format: "jpeg", quality: 90)
        try s.put("big.jpg", jpeg)
        try s.spool.start(["--config", s.spool.configPath])
        let pid = try #require(s.spool.daemon?.processIdentifier)
        let idle = processMemoryMB(pid)
        try s.spool.drop("streamed.plist", ["job": "streamed", "operations": [
            ["id": "get", "kind": "download", "url": s.url("big.jpg")],
            ["id": "sepia", "kind": "sepia", "dependencies": ["get"]],
            ["id": "put", "kind": "write", "path": "big.jpg", "dependencies": ["sepia"]],
        ]])
        let streamed = try #require(s.spool.result("streamed", timeout: 120))
        #expect(streamed["status"] as? String == "succeeded", "\(streamed["error"] ?? "")")
        let afterStreamed = processMemoryMB(pid)
        let decodedMB = Double(width * height * 3) / 1_048_576
        let bound = decodedMB / 3 + Double(jpeg.count) / 1_048_576 // the download is still held in memory
        #expect(afterStreamed - idle < bound,
                "streamed: peak grew \(afterStreamed - idle) MB (idle \(idle)), bound \(bound) MB, decoded \(decodedMB) MB")
        let out = try Codecs.decode(Data(contentsOf: URL(fileURLWithPath: s.spool.root + "/outbox/streamed/big.jpg")), maxPixels: 1 << 30)
        #expect(out.width == width && out.height == height)

        try s.spool.drop("whole.plist", ["job": "whole", "operations": [
            ["id": "get", "kind": "download", "url": s.url("big.jpg")],
            ["id": "sepia", "kind": "sepia", "dependencies": ["get"]],
            ["id": "a", "kind": "write", "path": "a.jpg", "dependencies": ["sepia"]],
            ["id": "b", "kind": "write", "path": "b.jpg", "dependencies": ["sepia"]],
        ]])
        let whole = try #require(s.spool.result("whole", timeout: 120))
        #expect(whole["status"] as? String == "succeeded", "\(whole["error"] ?? "")")
        let afterWhole = processMemoryMB(pid)
        print("pipeline memory: idle \(idle) MB, streamed +\(afterStreamed - idle) MB, materialised +\(afterWhole - idle) MB,"
              + " bound \(bound) MB, download \(jpeg.count / 1_048_576) MB")
        // Both big writes went through the two-thread handoff; the fused and the materialised path agree byte for byte.
        #expect(try Data(contentsOf: URL(fileURLWithPath: s.spool.root + "/outbox/streamed/big.jpg"))
                == Data(contentsOf: URL(fileURLWithPath: s.spool.root + "/outbox/whole/a.jpg")))
        #expect(afterWhole - idle > bound, "a materialised image must show in the same measure: grew \(afterWhole - idle) MB")
    }
}
