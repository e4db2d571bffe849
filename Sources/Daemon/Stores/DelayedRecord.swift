// active/.delayed: the delayed jobs the shell keeps out of memory (parked; Shell/Daemon+Later.swift), one line each,
// "<until>\t<job>\n", appended as each is parked and read back a buffer at a time to refill the window. Only a
// run's index, not a record to trust: recovery reads every job in active/ at start and parks again those that wait,
// so it is emptied at start and never synced. A line outlives its job (started, cancelled, ended): the shell counts
// one only while its job still waits, and the file is written again, with only those, once most of it is such lines.

import Foundation
#if canImport(Glibc)
import Glibc
#endif
import SpoolFiles
import SystemCalls

final class DelayedRecord {
    let path: String
    private var fd: Int32 = -1
    /// Lines in the file (those of jobs gone included).
    private(set) var lines = 0

    init(path: String) { self.path = path }

    deinit { if fd >= 0 { close(fd) } }

    /// Empties the file (at start) and opens it for appending.
    func reset() throws {
        try reopen(flags: O_TRUNC)
        lines = 0
    }

    private func reopen(flags: Int32) throws {
        if fd >= 0 { close(fd) }
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | flags, 0o600)
        guard fd >= 0 else { throw SpoolError(operation: "open", path: path, errno: errno) }
    }

    /// One job parked until `until`.
    func append(until: Double, job: String) throws {
        try write(Array(Self.line(until: until, job: job).utf8), to: fd)
        lines += 1
    }

    static func line(until: Double, job: String) -> String { "\(until)\t\(job)\n" }

    /// Every line, in the order written (a torn or unreadable line is skipped).
    func forEach(_ body: (Double, String) -> Void) throws {
        let reader = open(path, O_RDONLY | O_CLOEXEC)
        guard reader >= 0 else { throw SpoolError(operation: "open", path: path, errno: errno) }
        defer { close(reader) }
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var carry: [UInt8] = []
        while true {
            let count = buffer.withUnsafeMutableBytes { bytes in retryingInterrupts { read(reader, bytes.baseAddress, bytes.count) } }
            guard count >= 0 else { throw SpoolError(operation: "read", path: path, errno: errno) }
            if count == 0 { return }
            var start = 0
            for i in 0..<count where buffer[i] == 0x0A {
                if carry.isEmpty {
                    Self.parse(buffer[start..<i], body)
                } else {
                    carry += buffer[start..<i]
                    Self.parse(carry[...], body)
                    carry.removeAll(keepingCapacity: true)
                }
                start = i + 1
            }
            carry += buffer[start..<count]
        }
    }

    private static func parse(_ line: ArraySlice<UInt8>, _ body: (Double, String) -> Void) {
        guard let tab = line.firstIndex(of: 0x09),
              let until = Double(String(decoding: line[line.startIndex..<tab], as: UTF8.self)), tab + 1 < line.endIndex
        else { return }
        body(until, String(decoding: line[(tab + 1)...], as: UTF8.self))
    }

    /// Writes the file again with only the lines `keep` says yes to (written aside, renamed over it); their number.
    @discardableResult
    func rewrite(keeping keep: (Double, String) -> Bool) throws -> Int {
        let fresh = path + ".new"
        let out = open(fresh, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard out >= 0 else { throw SpoolError(operation: "open", path: fresh, errno: errno) }
        var pending: [UInt8] = []
        var kept = 0
        var failure: (any Error)?
        do {
            try forEach { until, job in
                guard failure == nil, keep(until, job) else { return }
                pending += Array(Self.line(until: until, job: job).utf8)
                kept += 1
                if pending.count >= 1 << 16 {
                    do { try write(pending, to: out) } catch { failure = error }
                    pending.removeAll(keepingCapacity: true)
                }
            }
            if let failure { throw failure }
            try write(pending, to: out)
        } catch {
            close(out)
            unlink(fresh)
            throw error
        }
        close(out)
        guard rename(fresh, path) == 0 else { throw SpoolError(operation: "rename", path: fresh, errno: errno) }
        try reopen(flags: 0)
        lines = kept
        return kept
    }

    private func write(_ bytes: [UInt8], to fd: Int32) throws {
        try bytes.withUnsafeBytes { try writeAll(fd, $0, path: path) }
    }
}
