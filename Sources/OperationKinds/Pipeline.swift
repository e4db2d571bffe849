// Fused image operations (issue 15): a chain of image operations whose intermediate results nobody else reads
// runs as one pipeline over strips of rows. The decoder (CCodecs' incremental libjpeg-turbo / libpng readers)
// produces rows as the next stage asks for them, each filter works on a strip (blur and resize keep a ring of
// the rows their kernel spans), and the encoder writes rows to the output file as they come. No full-size
// buffer exists unless the codec needs one (EXIF orientation other than 1, interlaced PNG: see CCodecs.h) or the
// chain ends in an operation whose output must be pixels (ImagePipeline.materialise).
//
// The row kernels are the ones of Images.swift (Filters), so a fused chain gives the same pixels as the
// whole-image functions, which the tests keep as the reference. Trusts: a source's bytes stay valid while
// the pipeline runs (they are borrowed with withUnsafeBytes for the whole run).

import CCodecs
import Foundation
import JobModel
import OperationEngine

/// An image operation as a value (SPEC §3.3 parameters).
enum ImageStep: Sendable {
    case sepia(intensity: Double)
    case grayscale
    case vignette(strength: Double)
    case blur(radius: Double)
    case resize(width: Int?, height: Int?, mode: String)
    case thumbnail(size: Int)

    /// The step of an image operation's parameters; nil for other kinds.
    init?(_ parameters: Parameters) {
        switch parameters {
        case .sepia(let intensity): self = .sepia(intensity: intensity)
        case .grayscale: self = .grayscale
        case .vignette(let strength): self = .vignette(strength: strength)
        case .blur(let radius): self = .blur(radius: radius)
        case .resize(let width, let height, let mode): self = .resize(width: width, height: height, mode: mode)
        case .thumbnail(let size): self = .thumbnail(size: size)
        default: return nil
        }
    }
}

/// A fused image operation's output: where the pixels come from and the steps still to apply. Nothing is
/// decoded until the consumer (the chain's `write`, or an operation that needs pixels) runs it.
struct ImagePipeline: Sendable {
    enum Source: Sendable {
        case bytes(Data)
        case image(Image)
    }

    let source: Source
    let steps: [ImageStep]
    /// The ids of the operations fused so far, for messages.
    let operations: [String]

    func appending(_ step: ImageStep, operation: String) -> ImagePipeline {
        ImagePipeline(source: source, steps: steps + [step], operations: operations + [operation])
    }

    /// Checks what can be checked from the header alone (signature, a readable header, maxPixels), so a fused
    /// operation still fails at once on bytes that are not an image it may open.
    static func checkHeader(_ data: Data, maxPixels: Int) throws {
        try data.withUnsafeBytes { raw in
            let reader = try DecoderRows(raw, maxPixels: maxPixels)
            withExtendedLifetime(reader) {}
        }
    }

    /// The pipeline's pixels as one image (for a consumer that needs them whole).
    func materialise(maxPixels: Int, check: @escaping CancellationCheck) throws -> Image {
        try run(maxPixels: maxPixels, check: check) { rows in
            let image = try Image(width: rows.width, height: rows.height, channels: rows.channels)
            var y = 0
            let strip = stripRows(rows.stride)
            while y < rows.height {
                try check()
                let n = min(strip, rows.height - y)
                try rows.read(n, into: image.pixels + y * image.stride)
                y += n
            }
            try rows.drain()
            return image
        }
    }

    /// Encodes the pipeline's rows to `fd` as PNG or JPEG, a strip at a time.
    func encode(to fd: Int32, format: String, quality: Int, maxPixels: Int, check: @escaping CancellationCheck) throws {
        try run(maxPixels: maxPixels, check: check) { rows in
            let writer = try RowWriter(fd: fd, png: format == "png", width: rows.width, height: rows.height, channels: rows.channels,
                                       quality: quality)
            if rows.width * rows.height >= StripHandoff.threshold {
                try StripHandoff(rows, check: check).run { pixels, n in try writer.write(pixels, rows: n) }
            } else {
                let stripHeight = stripRows(rows.stride)
                let strip = try RowBuffer(rows: stripHeight, of: rows)
                var y = 0
                while y < rows.height {
                    try check()
                    let n = min(stripHeight, rows.height - y)
                    try rows.read(n, into: strip.pixels)
                    try writer.write(strip.pixels, rows: n)
                    y += n
                }
                // Corrupt data past the last row needed fails the write before the file is finished.
                try rows.drain()
            }
            try writer.finish()
        }
    }

    /// Builds the stages over the source and hands the last one to `consume`, with the source's bytes borrowed.
    private func run<T>(maxPixels: Int, check: @escaping CancellationCheck, _ consume: (any RowSource) throws -> T) throws -> T {
        switch source {
        case .image(let image):
            let first = ImageRows(image)
            return try consume(stages(over: first, logical: (first.width, first.height), maxPixels: maxPixels, check: check))
        case .bytes(let data):
            return try data.withUnsafeBytes { raw in
                // Decoding is the first operation's stage (it took the bytes), at any row.
                let decoder = try StageFailure.of(operations.first) { try DecoderRows(raw, maxPixels: maxPixels) }
                decoder.stage = operations.first
                let logical = (decoder.width, decoder.height)
                try StageFailure.of(operations.first) { try decoder.start(shrinkOnLoad(width: logical.0, height: logical.1)) }
                return try consume(stages(over: decoder, logical: logical, maxPixels: maxPixels, check: check))
            }
        }
    }

    /// Shrink-on-load (JPEG DCT scaling): the minimums the decoded image must keep, set by the first step that
    /// changes the size when only per-pixel steps come before it (a blur's radius is in source pixels, so a
    /// blur first keeps the full size). `thumbnail` keeps its longest side, as it always has; `resize` keeps
    /// the size it scales to (before a `fill` crop).
    func shrinkOnLoad(width: Int, height: Int) -> (width: Int, height: Int, side: Int) {
        for step in steps {
            switch step {
            case .sepia, .grayscale, .vignette: continue
            case .blur: return (0, 0, 0)
            case .thumbnail(let size): return (0, 0, size)
            case .resize(let w, let h, let mode):
                guard let plan = Filters.resizePlan(width: width, height: height, to: w, h, mode: mode) else { continue }
                return (plan.scaled.width, plan.scaled.height, 0)
            }
        }
        return (0, 0, 0)
    }

    /// The stages of the steps over `first`. `logical` is the size the image would have had without
    /// shrink-on-load: `resize` computes its target from it (so the output size does not depend on the
    /// DCT scale); `thumbnail` from the rows it gets, as the whole-image thumbnail always did. An image a step would
    /// make is held to `maxPixels` as a decoded one is: `resize` to 1,000,000×1,000,000 of a 10×10 PNG would stream
    /// 10¹² pixels into the outbox for days, or ask for terabytes where it is held whole.
    private func stages(over first: any RowSource, logical: (Int, Int), maxPixels: Int,
                        check: @escaping CancellationCheck) throws -> any RowSource {
        var current = first
        var logical = logical
        for (step, operation) in zip(steps, operations) {
            try StageFailure.of(operation) { try stage(step, &current, &logical, maxPixels: maxPixels, check: check) }
        }
        return current
    }

    /// Adds `step`'s stage over `current`.
    private func stage(_ step: ImageStep, _ current: inout any RowSource, _ logical: inout (Int, Int), maxPixels: Int,
                       check: @escaping CancellationCheck) throws {
        switch step {
        case .sepia(let intensity):
            current = MatrixRows(current, Filters.sepiaMatrix(intensity: intensity))
        case .grayscale:
            current = MatrixRows(current, Filters.grayscaleMatrix)
        case .vignette(let strength):
            current = VignetteRows(current, strength: strength)
        case .blur(let radius):
            guard radius > 0 else { return }
            current = try SeparableRows(current, width: current.width, height: current.height,
                                        horizontal: Filters.gaussianKernel(size: current.width, sigma: radius),
                                        vertical: Filters.gaussianKernel(size: current.height, sigma: radius), check: check)
        case .resize(let w, let h, let mode):
            guard let plan = Filters.resizePlan(width: logical.0, height: logical.1, to: w, h, mode: mode) else { return }
            // A fill scales past its target, then crops: what it scales to is made (row by row) all the same.
            try Self.limit(plan.scaled.width, plan.scaled.height, maxPixels, plan.crop == nil ? "resize" : "resize (fill, before its crop)")
            current = try Self.scaled(current, plan.scaled.width, plan.scaled.height, check: check)
            if let c = plan.crop { current = try CropRows(current, x: c.x, y: c.y, width: c.width, height: c.height) }
            logical = (current.width, current.height)
        case .thumbnail(let size):
            guard let t = Filters.thumbnailSize(width: current.width, height: current.height, size: size) else { return }
            try Self.limit(t.width, t.height, maxPixels, "thumbnail")
            current = try Self.scaled(current, t.width, t.height, check: check)
            logical = (current.width, current.height)
        }
    }

    private static func limit(_ width: Int, _ height: Int, _ maxPixels: Int, _ step: String) throws {
        let (pixels, overflow) = width.multipliedReportingOverflow(by: height)
        guard overflow || pixels > maxPixels else { return }
        throw KindFailure(description: "\(step) to \(width)×\(height) pixels makes an image of more than image.maxPixels (\(maxPixels))")
    }

    private static func scaled(_ rows: any RowSource, _ width: Int, _ height: Int,
                               check: @escaping CancellationCheck) throws -> any RowSource {
        if width == rows.width && height == rows.height { return rows }
        return try SeparableRows(rows, width: width, height: height,
                                 horizontal: Filters.lanczosKernel(source: rows.width, target: width),
                                 vertical: Filters.lanczosKernel(source: rows.height, target: height), check: check)
    }
}

// MARK: Stages

/// Rows pulled top to bottom.
protocol RowSource: AnyObject {
    var width: Int { get }
    var height: Int { get }
    var channels: Int { get }
    /// The next `count` rows into `out` (`width × channels` bytes each, no padding).
    func read(_ count: Int, into out: UnsafeMutablePointer<UInt8>) throws
    /// Reads and drops the rows nobody asked for, down to the decoder, which then checks the file's end:
    /// a truncated or corrupt image fails even when the output did not need its last rows.
    func drain() throws
}

extension RowSource {
    var stride: Int { width * channels }
}

/// Rows per strip for rows of `stride` bytes: up to `Filters.band`, and about 256 kB, so a strip stays in
/// cache between the stages that touch it in turn (a 12000-pixel RGB row is 36 kB).
func stripRows(_ stride: Int) -> Int { max(1, min(Filters.band, (256 << 10) / max(1, stride))) }

/// A malloc'd strip of rows.
final class RowBuffer {
    let pixels: UnsafeMutablePointer<UInt8>

    init(rows: Int, of source: any RowSource) throws {
        guard let memory = malloc(max(1, rows * source.stride)) else { throw ImageError("out of memory for a strip of \(rows) rows") }
        pixels = memory.assumingMemoryBound(to: UInt8.self)
    }

    deinit { free(pixels) }
}

/// Calls a CCodecs function with a message buffer; a code other than OK throws the codec's message.
func codecCall(_ what: String, _ body: (UnsafeMutablePointer<CChar>, Int) -> Int32) throws {
    var message = [CChar](repeating: 0, count: 512)
    let code = message.withUnsafeMutableBufferPointer { body($0.baseAddress!, $0.count) }
    guard code == Int32(OPQ_CODEC_OK) else {
        let text = String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        throw ImageError(text.isEmpty ? what : text)
    }
}

/// Rows from the decoder. Opening reads the header only (maxPixels is checked there, before any pixel buffer
/// exists); `start` picks the DCT scale and begins.
final class DecoderRows: RowSource {
    /// The fused operation whose stage decoding is: its errors are that operation's (StageFailure).
    var stage: String?
    private var reader: OpaquePointer?
    private(set) var width = 0, height = 0, channels = 0
    private var next = 0, finished = false

    init(_ raw: UnsafeRawBufferPointer, maxPixels: Int) throws {
        var w: Int32 = 0, h: Int32 = 0
        try codecCall("the image cannot be decoded") { m, n in
            opq_reader_open(raw.baseAddress?.assumingMemoryBound(to: UInt8.self), raw.count, UInt64(max(0, maxPixels)), &reader, &w, &h,
                            m, n)
        }
        width = Int(w)
        height = Int(h)
    }

    func start(_ minimum: (width: Int, height: Int, side: Int)) throws {
        var w: Int32 = 0, h: Int32 = 0, c: Int32 = 0
        try codecCall("the image cannot be decoded") { m, n in
            opq_reader_start(reader, Int32(clamping: minimum.width), Int32(clamping: minimum.height), Int32(clamping: minimum.side),
                             &w, &h, &c, m, n)
        }
        (width, height, channels) = (Int(w), Int(h), Int(c))
    }

    deinit { opq_reader_close(reader) }

    func read(_ count: Int, into out: UnsafeMutablePointer<UInt8>) throws {
        try StageFailure.of(stage) {
            try codecCall("the image cannot be decoded") { m, n in opq_reader_read(reader, out, Int32(count), m, n) }
            next += count
            if next == height { try finish() }
        }
    }

    func drain() throws {
        if next < height {
            let rows = stripRows(stride)
            let strip = try RowBuffer(rows: rows, of: self)
            while next < height { try read(min(rows, height - next), into: strip.pixels) }
        }
        try finish()
    }

    private func finish() throws {
        guard !finished else { return }
        try StageFailure.of(stage) { try codecCall("the image cannot be decoded") { m, n in opq_reader_finish(reader, m, n) } }
        finished = true
    }
}

/// Rows of an image already in memory (a materialised input).
final class ImageRows: RowSource {
    let image: Image
    private var next = 0
    var width: Int { image.width }
    var height: Int { image.height }
    var channels: Int { image.channels }

    init(_ image: Image) { self.image = image }

    func read(_ count: Int, into out: UnsafeMutablePointer<UInt8>) throws {
        memcpy(out, image.pixels + next * image.stride, count * image.stride)
        next += count
    }

    func drain() throws {}
}

/// Sepia, grayscale: a colour matrix, in place on the strip.
final class MatrixRows: RowSource {
    private let upstream: any RowSource
    private let tables: [Int32]
    var width: Int { upstream.width }
    var height: Int { upstream.height }
    var channels: Int { upstream.channels }

    init(_ upstream: any RowSource, _ matrix: [Float]) {
        self.upstream = upstream
        tables = Filters.matrixTables(matrix)
    }

    func read(_ count: Int, into out: UnsafeMutablePointer<UInt8>) throws {
        try upstream.read(count, into: out)
        let (n, c) = (count * width, channels)
        tables.withUnsafeBufferPointer { Filters.applyMatrix($0.baseAddress!, out, out, count: n, channels: c) }
    }

    func drain() throws { try upstream.drain() }
}

/// Vignette, in place on the strip: each row knows its position in the whole image.
final class VignetteRows: RowSource {
    private let upstream: any RowSource
    private let shape: Filters.Vignette
    private var next = 0
    var width: Int { upstream.width }
    var height: Int { upstream.height }
    var channels: Int { upstream.channels }

    init(_ upstream: any RowSource, strength: Double) {
        self.upstream = upstream
        shape = Filters.Vignette(width: upstream.width, height: upstream.height, strength: strength)
    }

    func read(_ count: Int, into out: UnsafeMutablePointer<UInt8>) throws {
        try upstream.read(count, into: out)
        for i in 0..<count {
            let row = out + i * stride
            shape.apply(row: next + i, row, row, width: width, channels: channels)
        }
        next += count
    }

    func drain() throws { try upstream.drain() }
}

/// Blur and resize: the horizontal pass of each source row goes into a ring of Float rows, as many as a vertical
/// window spans (its taps, or the source's height when that is less: edge rows are clamped, never held twice;
/// windows only move down), and each output row is the vertical pass over the ring.
final class SeparableRows: RowSource {
    private let upstream: any RowSource
    let width: Int, height: Int
    var channels: Int { upstream.channels }
    private let horizontal: Filters.Kernel, vertical: Filters.Kernel
    private let check: CancellationCheck
    private let ring: UnsafeMutablePointer<Float>
    /// Rows the ring holds: source row r is in slot r % ringRows.
    private let ringRows: Int
    private let accumulator: UnsafeMutablePointer<Float>
    private let strip: RowBuffer
    private let stripHeight: Int
    private var stripFilled = 0, stripNext = 0
    /// Source rows pulled from upstream, horizontally filtered into the ring; output rows handed out.
    private var pulled = 0, produced = 0, next = 0

    init(_ upstream: any RowSource, width: Int, height: Int, horizontal: Filters.Kernel, vertical: Filters.Kernel,
         check: @escaping CancellationCheck) throws {
        self.upstream = upstream
        self.width = width
        self.height = height
        self.horizontal = horizontal
        self.vertical = vertical
        self.check = check
        let rowLength = width * upstream.channels
        ringRows = max(1, min(vertical.taps, upstream.height))
        ring = .allocate(capacity: max(1, ringRows * rowLength))
        accumulator = .allocate(capacity: max(1, rowLength))
        stripHeight = stripRows(upstream.stride)
        strip = try RowBuffer(rows: stripHeight, of: upstream)
    }

    deinit {
        ring.deallocate()
        accumulator.deallocate()
    }

    /// Filters source rows into the ring until row `last` is there.
    private func produce(through last: Int) throws {
        let rowLength = width * channels, sourceStride = upstream.stride
        while produced <= last {
            if stripNext == stripFilled {
                try check()
                let n = min(stripHeight, upstream.height - pulled)
                try upstream.read(n, into: strip.pixels)
                pulled += n
                (stripFilled, stripNext) = (n, 0)
            }
            let target = ring + (produced % ringRows) * rowLength
            let source = strip.pixels + stripNext * sourceStride
            let sourceWidth = upstream.width, w = width, c = channels
            horizontal.starts.withUnsafeBufferPointer { hs in
                horizontal.weights.withUnsafeBufferPointer { hw in
                    Filters.horizontalRow(source, sourceWidth: sourceWidth, target, width: w, channels: c,
                                          starts: hs.baseAddress!, weights: hw.baseAddress!, taps: horizontal.taps,
                                          weightStride: horizontal.weightStride)
                }
            }
            stripNext += 1
            produced += 1
        }
    }

    func read(_ count: Int, into out: UnsafeMutablePointer<UInt8>) throws {
        let rowLength = width * channels, lastY = upstream.height - 1, taps = vertical.taps, ringRows = self.ringRows
        for i in 0..<count {
            let y = next + i
            try produce(through: min(lastY, max(0, Int(vertical.starts[y]) + taps - 1)))
            let ring = self.ring
            vertical.starts.withUnsafeBufferPointer { vs in
                vertical.weights.withUnsafeBufferPointer { vw in
                    Filters.verticalRow(y, out + i * rowLength, rowLength: rowLength, accumulator: accumulator, lastY: lastY,
                                        starts: vs.baseAddress!, weights: vw.baseAddress!, taps: taps,
                                        weightStride: vertical.weightStride) { UnsafePointer(ring + ($0 % ringRows) * rowLength) }
                }
            }
        }
        next += count
    }

    func drain() throws {
        while pulled < upstream.height {
            let n = min(stripHeight, upstream.height - pulled)
            try upstream.read(n, into: strip.pixels)
            pulled += n
        }
        try upstream.drain()
    }
}

/// The middle of a `fill` resize.
final class CropRows: RowSource {
    private let upstream: any RowSource
    private let x: Int, y: Int
    let width: Int, height: Int
    var channels: Int { upstream.channels }
    private let strip: RowBuffer
    private let stripHeight: Int
    private var pulled = 0

    init(_ upstream: any RowSource, x: Int, y: Int, width: Int, height: Int) throws {
        self.upstream = upstream
        (self.x, self.y, self.width, self.height) = (x, y, width, height)
        stripHeight = stripRows(upstream.stride)
        strip = try RowBuffer(rows: stripHeight, of: upstream)
    }

    private func skip(to row: Int) throws {
        while pulled < row {
            let n = min(stripHeight, row - pulled)
            try upstream.read(n, into: strip.pixels)
            pulled += n
        }
    }

    func read(_ count: Int, into out: UnsafeMutablePointer<UInt8>) throws {
        try skip(to: y)
        var done = 0
        while done < count {
            let n = min(stripHeight, count - done)
            try upstream.read(n, into: strip.pixels)
            pulled += n
            for r in 0..<n { memcpy(out + (done + r) * stride, strip.pixels + r * upstream.stride + x * channels, stride) }
            done += n
        }
    }

    func drain() throws {
        try skip(to: upstream.height)
        try upstream.drain()
    }
}
