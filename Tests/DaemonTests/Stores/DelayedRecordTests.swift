// active/.delayed (Stores/DelayedRecord.swift): lines appended, read back across buffers, written again with a few.

import Foundation
import Testing
@testable import Daemon
import TestTraits

@Suite(.onItsOwnExecutor) struct DelayedRecordTests {
    @Test func linesAreReadBackInOrderAcrossBuffersAndWrittenAgainWithOnlyThoseKept() throws {
        let path = NSTemporaryDirectory() + "opq-delayed-" + UUID().uuidString.prefix(8)
        defer { unlink(path) }
        let record = DelayedRecord(path: path)
        try record.reset()
        // Enough lines to cross the 64 KiB read buffer several times, times that are no round numbers.
        let jobs = (0..<10_000).map { (until: 1_764_295_200.123_456 + Double($0) / 3, job: "job-\($0)") }
        for (until, job) in jobs { try record.append(until: until, job: job) }
        #expect(record.lines == 10_000)
        var read: [(Double, String)] = []
        try record.forEach { read.append(($0, $1)) }
        #expect(read.count == jobs.count)
        #expect(zip(read, jobs).allSatisfy { $0.0 == $1.until && $0.1 == $1.job }, "every time read back exactly")

        let kept = try record.rewrite { _, job in job.hasSuffix("7") }
        #expect(kept == 1_000 && record.lines == 1_000)
        try record.append(until: 5, job: "late")
        var after: [String] = []
        try record.forEach { after.append($1) }
        #expect(after.count == 1_001 && after.last == "late" && after.dropLast().allSatisfy { $0.hasSuffix("7") })

        // A torn last line (a crash mid-append) is skipped; a reset empties the file.
        let handle = try #require(FileHandle(forWritingAtPath: path))
        handle.seekToEndOfFile()
        handle.write(Data("12.5\tto".utf8))
        try handle.close()
        var count = 0
        try record.forEach { _, _ in count += 1 }
        #expect(count == 1_001)
        try record.reset()
        try record.forEach { _, _ in count += 1 }
        #expect(count == 1_001 && record.lines == 0)
    }
}
