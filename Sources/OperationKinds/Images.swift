// Images between operations, the codecs (CCodecs: libjpeg-turbo, libpng) and the filters of SPEC §3.3.
//
// Filters work on 8-bit RGB or RGBA rows in one contiguous buffer, keep alpha, allocate nothing per pixel,
// and check cancellation between bands of rows. Colour matrices (sepia, grayscale) use per-channel
// lookup tables in fixed point; blur and resize are separable passes through a Float buffer.

import CCodecs
import Foundation
import OperationEngine

/// An 8-bit image: `channels` 3 (RGB) or 4 (RGBA), rows top to bottom, no padding. Immutable once made.
public final class Image: @unchecked Sendable {
    public let width: Int
    public let height: Int
    public let channels: Int
    public let pixels: UnsafeMutablePointer<UInt8>

    /// Takes ownership of a malloc'd buffer.
    init(width: Int, height: Int, channels: Int, adopting pixels: UnsafeMutablePointer<UInt8>) {
        self.width = width
        self.height = height
        self.channels = channels
        self.pixels = pixels
    }

    /// A new image of the given size; its pixels are to be filled by the caller before it is shared.
    public convenience init(width: Int, height: Int, channels: Int) throws {
        guard let memory = malloc(max(1, width * height * channels)) else {
            throw ImageError("out of memory for a \(width)×\(height) image")
        }
        self.init(width: width, height: height, channels: channels, adopting: memory.assumingMemoryBound(to: UInt8.self))
    }

    deinit { free(pixels) }

    var stride: Int { width * channels }
    var byteCount: Int { width * height * channels }
}

public struct ImageError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// Throws OperationCancelled when the operation was cancelled; filters call it between bands of rows.
typealias CancellationCheck = () throws -> Void

public enum Codecs {
    /// Decodes PNG or JPEG bytes (recognised by signature). `minSide` > 0 lets JPEG shrink on load.
    public static func decode(_ data: Data, maxPixels: Int, minSide: Int = 0) throws -> Image {
        var image = opq_image()
        var message = [CChar](repeating: 0, count: 512)
        let code = data.withUnsafeBytes { raw in
            opq_decode(raw.baseAddress?.assumingMemoryBound(to: UInt8.self), raw.count, UInt64(max(0, maxPixels)), Int32(minSide), &image,
                       &message, message.count)
        }
        guard code == Int32(OPQ_CODEC_OK), let pixels = image.pixels else {
            let text = String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            throw ImageError(text.isEmpty ? "the image cannot be decoded" : text)
        }
        return Image(width: Int(image.width), height: Int(image.height), channels: Int(image.channels), adopting: pixels)
    }

    public static func encode(_ image: Image, format: String, quality: Int) throws -> Data {
        var c = opq_image(pixels: image.pixels, width: Int32(image.width), height: Int32(image.height), channels: Int32(image.channels))
        var out: UnsafeMutablePointer<UInt8>?
        var size = 0
        var message = [CChar](repeating: 0, count: 512)
        let code = format == "png"
            ? opq_encode_png(&c, &out, &size, &message, message.count)
            : opq_encode_jpeg(&c, Int32(quality), &out, &size, &message, message.count)
        guard code == Int32(OPQ_CODEC_OK), let out else {
            throw ImageError("encoding \(format): "
                             + String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        defer { opq_free(out) }
        return Data(bytes: out, count: size)
    }
}

/// The filters of SPEC §3.3. Each is a row kernel (shared by the whole-image functions here and the strip
/// pipeline of Pipeline.swift, so both give the same pixels) and a whole-image function, which the tests use
/// as the reference for the streamed path.
enum Filters {
    /// Rows per band between cancellation checks (and rows per strip in the pipeline).
    static let band = 32

    // MARK: Colour matrices

    /// Nine tables in 1/4096 fixed point: out_r = (T00[r] + T01[g] + T02[b] + 2048) >> 12. M is row-major 3×3.
    static func matrixTables(_ m: [Float]) -> [Int32] {
        var tables = [Int32](repeating: 0, count: 9 * 256)
        for k in 0..<9 {
            for v in 0..<256 { tables[k * 256 + v] = Int32((m[k] * Float(v) * 4096).rounded()) }
        }
        return tables
    }

    /// out = clamp(M · in) for `count` pixels, alpha copied; `s` and `d` may be the same buffer.
    @inline(__always)
    static func applyMatrix(_ t: UnsafePointer<Int32>, _ s: UnsafePointer<UInt8>, _ d: UnsafeMutablePointer<UInt8>, count: Int,
                            channels c: Int) {
        for i in 0..<count {
            let p = i * c
            let r = Int(s[p]), g = Int(s[p + 1]), b = Int(s[p + 2])
            let R = (t[r] &+ t[256 + g] &+ t[512 + b] &+ 2048) >> 12
            let G = (t[768 + r] &+ t[1024 + g] &+ t[1280 + b] &+ 2048) >> 12
            let B = (t[1536 + r] &+ t[1792 + g] &+ t[2048 + b] &+ 2048) >> 12
            d[p] = UInt8(clamping: R)
            d[p + 1] = UInt8(clamping: G)
            d[p + 2] = UInt8(clamping: B)
            if c == 4 { d[p + 3] = s[p + 3] }
        }
    }

    static func colorMatrix(_ source: Image, _ m: [Float], check: CancellationCheck) throws -> Image {
        let out = try Image(width: source.width, height: source.height, channels: source.channels)
        try matrixTables(m).withUnsafeBufferPointer { t in
            let t = t.baseAddress!
            for y0 in Swift.stride(from: 0, to: source.height, by: band) {
                try check()
                let rows = min(band, source.height - y0)
                let start = y0 * source.stride
                applyMatrix(t, source.pixels + start, out.pixels + start, count: rows * source.width, channels: source.channels)
            }
        }
        return out
    }

    /// W3C Filter Effects sepia(intensity) on stored sRGB values (SPEC §3.3).
    static func sepiaMatrix(intensity: Double) -> [Float] {
        let i = Float(min(1, max(0, intensity)))
        let sepia: [Float] = [0.393, 0.769, 0.189, 0.349, 0.686, 0.168, 0.272, 0.534, 0.131]
        let identity: [Float] = [1, 0, 0, 0, 1, 0, 0, 0, 1]
        return (0..<9).map { (1 - i) * identity[$0] + i * sepia[$0] }
    }

    /// Rec. 601 luma (0.299 R + 0.587 G + 0.114 B) into all three channels.
    static let grayscaleMatrix: [Float] = [0.299, 0.587, 0.114, 0.299, 0.587, 0.114, 0.299, 0.587, 0.114]

    static func sepia(_ source: Image, intensity: Double, check: CancellationCheck) throws -> Image {
        try colorMatrix(source, sepiaMatrix(intensity: intensity), check: check)
    }

    static func grayscale(_ source: Image, check: CancellationCheck) throws -> Image {
        try colorMatrix(source, grayscaleMatrix, check: check)
    }

    // MARK: Vignette

    /// Darkens towards the corners: RGB × (1 − strength · d²), d the distance to the centre over the
    /// centre-to-corner distance (so the corners are darkened by exactly `strength`).
    struct Vignette {
        let s: Float, cx: Float, cy: Float, norm: Float
        init(width: Int, height: Int, strength: Double) {
            s = Float(min(1, max(0, strength)))
            cx = Float(width - 1) / 2
            cy = Float(height - 1) / 2
            norm = 1 / max(cx * cx + cy * cy, 1e-6)
        }

        /// Row `y` of `width` pixels from `s` into `d` (which may be the same buffer).
        @inline(__always)
        func apply(row y: Int, _ source: UnsafePointer<UInt8>, _ out: UnsafeMutablePointer<UInt8>, width: Int, channels c: Int) {
            let dy = Float(y) - cy
            for x in 0..<width {
                let dx = Float(x) - cx
                let f = max(0, 1 - s * (dx * dx + dy * dy) * norm)
                let p = x * c
                out[p] = UInt8(Float(source[p]) * f + 0.5)
                out[p + 1] = UInt8(Float(source[p + 1]) * f + 0.5)
                out[p + 2] = UInt8(Float(source[p + 2]) * f + 0.5)
                if c == 4 { out[p + 3] = source[p + 3] }
            }
        }
    }

    static func vignette(_ source: Image, strength: Double, check: CancellationCheck) throws -> Image {
        let out = try Image(width: source.width, height: source.height, channels: source.channels)
        let shape = Vignette(width: source.width, height: source.height, strength: strength)
        for y in 0..<source.height {
            if y % band == 0 { try check() }
            shape.apply(row: y, source.pixels + y * source.stride, out.pixels + y * source.stride, width: source.width,
                        channels: source.channels)
        }
        return out
    }

    // MARK: Separable passes

    /// For each output position: the first source index and the weights (summing to 1) it reads. Position i's
    /// weights start at `weights[i * weightStride]`: a resize's differ at each position (stride `taps`); a blur's are
    /// the same everywhere (stride 0, one row of `taps`), so that a wide image and a large radius never make a table
    /// of width × taps (100,000 × 6,001 Floats, 2.4 GB, for radius 1000 on a 100,000-pixel-wide image).
    struct Kernel {
        var starts: [Int32]
        var taps: Int
        var weights: [Float]
        var weightStride: Int
    }

    /// Gaussian with standard deviation `sigma` (CSS/Core Image `radius` semantics), edges clamped.
    static func gaussianKernel(size: Int, sigma: Double) -> Kernel {
        let half = max(1, Int((3 * sigma).rounded(.up)))
        let taps = 2 * half + 1
        var base = [Float](repeating: 0, count: taps)
        for k in 0..<taps {
            let x = Double(k - half)
            base[k] = Float(exp(-x * x / (2 * sigma * sigma)))
        }
        let total = base.reduce(0, +)
        base = base.map { $0 / total }
        return Kernel(starts: (0..<size).map { Int32($0 - half) }, taps: taps, weights: base, weightStride: 0)
    }

    /// Lanczos-3 resampling from `source` to `target` samples; widened by the reduction when shrinking
    /// (so a downscale averages every source sample, never skips one).
    static func lanczosKernel(source: Int, target: Int) -> Kernel {
        let scale = Double(target) / Double(source)
        let filterScale = min(1, scale)
        let support = 3 / filterScale
        let taps = Int((2 * support).rounded(.up)) + 1
        var starts = [Int32](repeating: 0, count: target)
        var weights = [Float](repeating: 0, count: target * taps)
        func lanczos(_ x: Double) -> Double {
            if x == 0 { return 1 }
            if abs(x) >= 3 { return 0 }
            let px = Double.pi * x
            return 3 * sin(px) * sin(px / 3) / (px * px)
        }
        for i in 0..<target {
            let center = (Double(i) + 0.5) / scale - 0.5
            let first = Int((center - support).rounded(.up))
            starts[i] = Int32(first)
            var total = 0.0
            var row = [Double](repeating: 0, count: taps)
            for k in 0..<taps {
                let w = lanczos((Double(first + k) - center) * filterScale)
                row[k] = w
                total += w
            }
            for k in 0..<taps { weights[i * taps + k] = Float(row[k] / (total == 0 ? 1 : total)) }
        }
        return Kernel(starts: starts, taps: taps, weights: weights, weightStride: taps)
    }

    /// The horizontal pass of one row: `sourceWidth` pixels of `s` into `width` Float pixels of `m`.
    @inline(__always)
    static func horizontalRow(_ s: UnsafePointer<UInt8>, sourceWidth: Int, _ m: UnsafeMutablePointer<Float>, width: Int, channels c: Int,
                              starts: UnsafePointer<Int32>, weights hw: UnsafePointer<Float>, taps: Int, weightStride: Int) {
        let lastX = sourceWidth - 1
        for x in 0..<width {
            let first = Int(starts[x])
            var acc = (Float(0), Float(0), Float(0), Float(0))
            for k in 0..<taps {
                let w = hw[x * weightStride + k]
                let sx = min(lastX, max(0, first + k)) * c
                acc.0 += w * Float(s[sx])
                acc.1 += w * Float(s[sx + 1])
                acc.2 += w * Float(s[sx + 2])
                if c == 4 { acc.3 += w * Float(s[sx + 3]) }
            }
            let p = x * c
            m[p] = acc.0
            m[p + 1] = acc.1
            m[p + 2] = acc.2
            if c == 4 { m[p + 3] = acc.3 }
        }
    }

    /// The vertical pass of output row `y`: `row(i)` gives horizontally filtered source row i (already clamped).
    @inline(__always)
    static func verticalRow(_ y: Int, _ d: UnsafeMutablePointer<UInt8>, rowLength: Int, accumulator acc: UnsafeMutablePointer<Float>,
                            lastY: Int, starts: UnsafePointer<Int32>, weights vw: UnsafePointer<Float>, taps: Int, weightStride: Int,
                            row: (Int) -> UnsafePointer<Float>) {
        let first = Int(starts[y])
        for i in 0..<rowLength { acc[i] = 0 }
        for k in 0..<taps {
            let w = vw[y * weightStride + k]
            if w == 0 { continue }
            let m = row(min(lastY, max(0, first + k)))
            for i in 0..<rowLength { acc[i] += w * m[i] }
        }
        for i in 0..<rowLength { d[i] = UInt8(min(255, max(0, acc[i] + 0.5))) }
    }

    /// Applies a horizontal then a vertical kernel (source indices clamped to the edges).
    static func separable(_ source: Image, width: Int, height: Int, horizontal: Kernel, vertical: Kernel,
                          check: CancellationCheck) throws -> Image {
        let c = source.channels
        let out = try Image(width: width, height: height, channels: c)
        var middle = [Float](repeating: 0, count: width * source.height * c)
        let rowLength = width * c
        try middle.withUnsafeMutableBufferPointer { mid in
            let mid = mid.baseAddress!
            try horizontal.weights.withUnsafeBufferPointer { hw in
                try horizontal.starts.withUnsafeBufferPointer { hs in
                    for y in 0..<source.height {
                        if y % band == 0 { try check() }
                        horizontalRow(source.pixels + y * source.stride, sourceWidth: source.width, mid + y * rowLength, width: width,
                                      channels: c, starts: hs.baseAddress!, weights: hw.baseAddress!, taps: horizontal.taps,
                                      weightStride: horizontal.weightStride)
                    }
                }
            }
            try vertical.weights.withUnsafeBufferPointer { vw in
                try vertical.starts.withUnsafeBufferPointer { vs in
                    var accumulator = [Float](repeating: 0, count: rowLength)
                    try accumulator.withUnsafeMutableBufferPointer { acc in
                        for y in 0..<height {
                            if y % band == 0 { try check() }
                            verticalRow(y, out.pixels + y * rowLength, rowLength: rowLength, accumulator: acc.baseAddress!,
                                        lastY: source.height - 1, starts: vs.baseAddress!, weights: vw.baseAddress!, taps: vertical.taps,
                                        weightStride: vertical.weightStride) { UnsafePointer(mid + $0 * rowLength) }
                        }
                    }
                }
            }
        }
        return out
    }

    static func blur(_ source: Image, radius: Double, check: CancellationCheck) throws -> Image {
        guard radius > 0 else { return source }
        return try separable(source, width: source.width, height: source.height,
                             horizontal: gaussianKernel(size: source.width, sigma: radius),
                             vertical: gaussianKernel(size: source.height, sigma: radius), check: check)
    }

    static func scale(_ source: Image, width: Int, height: Int, check: CancellationCheck) throws -> Image {
        let width = max(1, width), height = max(1, height)
        if width == source.width && height == source.height { return source }
        return try separable(source, width: width, height: height,
                             horizontal: lanczosKernel(source: source.width, target: width),
                             vertical: lanczosKernel(source: source.height, target: height), check: check)
    }

    /// What a resize does to a `width`×`height` image: scale to `scaled`, then keep `crop` (x, y, width,
    /// height) of it, if any; nil when it leaves the image as it is.
    struct ResizePlan {
        var scaled: (width: Int, height: Int)
        var crop: (x: Int, y: Int, width: Int, height: Int)?
    }

    /// `fit` inside width×height keeping the aspect, `fill` it and crop the middle, or `stretch` to it.
    /// A missing side follows from the other and the aspect (or stays, for `stretch`).
    static func resizePlan(width sw: Int, height sh: Int, to width: Int?, _ height: Int?, mode: String) -> ResizePlan? {
        let w = Double(sw), h = Double(sh)
        switch (mode, width, height) {
        case ("stretch", _, _):
            return ResizePlan(scaled: (max(1, width ?? sw), max(1, height ?? sh)))
        case ("fill", let tw?, let th?):
            let s = max(Double(tw) / w, Double(th) / h)
            let scaled = (max(1, max(tw, Int((w * s).rounded()))), max(1, max(th, Int((h * s).rounded()))))
            return ResizePlan(scaled: scaled, crop: ((scaled.0 - tw) / 2, (scaled.1 - th) / 2, tw, th))
        default:
            let s = min(width.map { Double($0) / w } ?? .infinity, height.map { Double($0) / h } ?? .infinity)
            guard s.isFinite else { return nil }
            return ResizePlan(scaled: (max(1, Int((w * s).rounded())), max(1, Int((h * s).rounded()))))
        }
    }

    static func resize(_ source: Image, width: Int?, height: Int?, mode: String, check: CancellationCheck) throws -> Image {
        guard let plan = resizePlan(width: source.width, height: source.height, to: width, height, mode: mode) else { return source }
        let scaled = try scale(source, width: plan.scaled.width, height: plan.scaled.height, check: check)
        guard let c = plan.crop else { return scaled }
        return try crop(scaled, x: c.x, y: c.y, width: c.width, height: c.height)
    }

    static func crop(_ source: Image, x: Int, y: Int, width: Int, height: Int) throws -> Image {
        let out = try Image(width: width, height: height, channels: source.channels)
        for row in 0..<height {
            memcpy(out.pixels + row * out.stride, source.pixels + (y + row) * source.stride + x * source.channels, out.stride)
        }
        return out
    }

    /// A thumbnail's size: longest side `size`; nil when the image is no larger (a thumbnail never enlarges).
    static func thumbnailSize(width: Int, height: Int, size: Int) -> (width: Int, height: Int)? {
        let longest = max(width, height)
        guard longest > size else { return nil }
        let s = Double(size) / Double(longest)
        return (max(1, Int((Double(width) * s).rounded())), max(1, Int((Double(height) * s).rounded())))
    }

    static func thumbnail(_ source: Image, size: Int, check: CancellationCheck) throws -> Image {
        guard let t = thumbnailSize(width: source.width, height: source.height, size: size) else { return source }
        return try scale(source, width: t.width, height: t.height, check: check)
    }
}
