// Publication under sharedOutbox (SPEC §8), on a plain folder with no database: a job's entry is assembled in .tmp,
// then renamed into place; run again after a crash it finishes what is left, and leaves another's entry alone.

import Foundation
import Logging
import Synchronization
import Testing
import TestSupport
@testable import Daemon
import CShims
import OperationEngine
import PropertyList
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite(.onItsOwnExecutor) struct SharedOutboxTests {
    /// Publication under sharedOutbox: assembled in .tmp, renamed into place, active/<job> gone; run again (a
    /// crash after the rename) it only removes what is left; a half-made .tmp copy is made again; an entry of that
    /// name holding another manifest (a rejected manifest's on another node, a user's folder) is left alone and the
    /// job takes <job>.1.
    @Test func placeSharedAssemblesThenRenames() throws {
        let root = NSTemporaryDirectory() + "opq-shared-\(UInt64.random(in: 1...UInt64.max))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        let spool = try Spool(root: root + "/spool")
        let shared = root + "/shared"
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        func make(_ job: String, result: String, manifest: String? = nil) throws {
            try FileManager.default.createDirectory(atPath: spool.active + "/\(job)/out", withIntermediateDirectories: true)
            try Data((manifest ?? "m-\(job)").utf8).write(to: URL(fileURLWithPath: spool.active + "/\(job)/manifest.plist"))
            try Data(result.utf8).write(to: URL(fileURLWithPath: spool.active + "/\(job)/result.plist"))
            try Data("x".utf8).write(to: URL(fileURLWithPath: spool.active + "/\(job)/out/a.png"))
        }
        for job in ["one", "two"] { try make(job, result: "r-\(job)") }
        #expect(try spool.placeShared(job: "one", in: shared) == "one")
        #expect(try String(contentsOfFile: shared + "/one/result.plist", encoding: .utf8) == "r-one")
        #expect(FileManager.default.fileExists(atPath: shared + "/one/out/a.png"))
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/one"))
        #expect((try FileManager.default.contentsOfDirectory(atPath: shared + "/.tmp")).isEmpty)

        // A crash left a half copy in .tmp and active/two in place: made again.
        try FileManager.default.createDirectory(atPath: shared + "/.tmp/two", withIntermediateDirectories: true)
        try Data("partial".utf8).write(to: URL(fileURLWithPath: shared + "/.tmp/two/junk"))
        #expect(try spool.placeShared(job: "two", in: shared) == "two")
        #expect(!FileManager.default.fileExists(atPath: shared + "/two/junk"))
        #expect(try String(contentsOfFile: shared + "/two/result.plist", encoding: .utf8) == "r-two")

        // A crash after the rename: active/one is back (as recovery would find it, its result staged again); the
        // placed entry (the same manifest) stays as is.
        try make("one", result: "again")
        #expect(try spool.placeShared(job: "one", in: shared) == "one")
        #expect(try String(contentsOfFile: shared + "/one/result.plist", encoding: .utf8) == "r-one")
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/one"))
        #expect(!FileManager.default.fileExists(atPath: shared + "/one.1"))

        // Another job under the same id (another manifest): shared/one is not its, it becomes shared/one.1.
        try make("one", result: "r-other", manifest: "m-other")
        #expect(try spool.placeShared(job: "one", in: shared) == "one.1")
        #expect(try String(contentsOfFile: shared + "/one/result.plist", encoding: .utf8) == "r-one")
        #expect(try String(contentsOfFile: shared + "/one.1/result.plist", encoding: .utf8) == "r-other")
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/one"))
    }
}
