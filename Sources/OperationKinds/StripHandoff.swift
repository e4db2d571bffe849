// The image pipeline's two-thread strip hand-off, and the row writer at its end (see Pipeline.swift).

import CCodecs
import Foundation
import OperationEngine

/// A big image's strips made on a second thread (decoder and filters) while the caller's thread encodes the
/// previous ones: the two halves of the work overlap, as in `djpeg | cjpeg`. A few strips are in flight (memory
/// stays a few strips); an error on either side stops both, and the producer is joined before `run` returns
/// (the stages borrow the source's bytes only for the caller's scope).
final class StripHandoff: @unchecked Sendable {
    /// Pixels from which a second thread is used: from about a 1280×800 photo, whose work (tens of ms) dwarfs a
    /// thread's start. Below, the serial loop. (On a shared machine, two runnable threads per operation also
    /// keep the daemon's share of the CPU where separate filter and write operations had it.)
    static let threshold = 1_000_000
    private static let depth = 4

    private let rows: any RowSource
    private let check: CancellationCheck
    private let stripHeight: Int
    private let buffers: [RowBuffer]
    private let condition = NSCondition()
    // Guarded by `condition`.
    private var free: [Int], filled: [(index: Int, rows: Int)] = []
    private var producerDone = false, stop = false, failure: (any Error)?
    private let finished = DispatchSemaphore(value: 0)

    init(_ rows: any RowSource, check: @escaping CancellationCheck) throws {
        self.rows = rows
        self.check = check
        let height = stripRows(rows.stride)
        stripHeight = height
        buffers = try (0..<Self.depth).map { _ in try RowBuffer(rows: height, of: rows) }
        free = Array(0..<Self.depth)
    }

    /// Hands each strip, in order, to `consume` on the calling thread; then checks the producer's end.
    func run(_ consume: (UnsafeMutablePointer<UInt8>, Int) throws -> Void) throws {
        let thread = Thread { [self] in produce() }
        thread.stackSize = 1 << 20
        thread.start()
        defer { finished.wait() }
        while true {
            condition.lock()
            while filled.isEmpty && !producerDone { condition.wait() }
            guard !filled.isEmpty else {
                condition.unlock()
                break
            }
            let strip = filled.removeFirst()
            condition.unlock()
            do {
                try consume(buffers[strip.index].pixels, strip.rows)
            } catch {
                halt()
                throw error
            }
            condition.lock()
            free.append(strip.index)
            condition.signal()
            condition.unlock()
        }
        condition.lock()
        let failure = self.failure
        condition.unlock()
        if let failure { throw failure }
    }

    private func halt() {
        condition.lock()
        stop = true
        condition.broadcast()
        condition.unlock()
    }

    private func produce() {
        defer { finished.signal() }
        var error: (any Error)?
        var y = 0
        do {
            while y < rows.height {
                condition.lock()
                while free.isEmpty && !stop { condition.wait() }
                if stop {
                    condition.unlock()
                    return
                }
                let index = free.removeFirst()
                condition.unlock()
                try check()
                let n = min(stripHeight, rows.height - y)
                try rows.read(n, into: buffers[index].pixels)
                y += n
                condition.lock()
                filled.append((index, n))
                condition.signal()
                condition.unlock()
            }
            // Corrupt data past the last row needed fails the write before the file is finished.
            try rows.drain()
        } catch let e {
            error = e
        }
        condition.lock()
        failure = error
        producerDone = true
        condition.broadcast()
        condition.unlock()
    }
}

/// The encoder end: rows to a file descriptor.
final class RowWriter {
    private var writer: OpaquePointer?

    init(fd: Int32, png: Bool, width: Int, height: Int, channels: Int, quality: Int) throws {
        try codecCall("the image cannot be encoded") { m, n in
            opq_writer_open(fd, png ? 1 : 0, Int32(width), Int32(height), Int32(channels), Int32(quality), &writer, m, n)
        }
    }

    deinit { opq_writer_close(writer) }

    func write(_ pixels: UnsafePointer<UInt8>, rows: Int) throws {
        try codecCall("the image cannot be encoded") { m, n in opq_writer_write(writer, pixels, Int32(rows), m, n) }
    }

    func finish() throws {
        try codecCall("the image cannot be encoded") { m, n in opq_writer_finish(writer, m, n) }
    }
}
