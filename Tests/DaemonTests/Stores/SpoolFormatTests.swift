// active/.format (Stores/SpoolFormat.swift), through the real opqueued: a spool an earlier build left is taken up and
// its jobs run; one a newer build left is refused while it holds jobs, and taken over once it holds none.

import Foundation
import Testing
@testable import Daemon
import CShims
import PropertyList
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite("Spool format", .serialized, .onItsOwnExecutor)
struct SpoolFormatTests {
    func format(_ spool: TestSpool) -> String? {
        try? String(contentsOfFile: spool.root + "/active/.format", encoding: .utf8)
    }

    /// A job folder as a build left it in active/: the manifest, and (optionally) a claim record.
    func leave(_ job: String, in spool: TestSpool, record: [UInt8]? = nil) throws {
        let dir = spool.root + "/active/" + job
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        try plist(["job": job, "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: dir + "/manifest.plist"))
        if let record {
            #expect(record.withUnsafeBytes { setxattr(dir, Spool.jobAttribute, $0.baseAddress, $0.count, 0) } == 0)
        }
    }

    @Test func aNewSpoolIsMarkedWithThisBuildsFormat() throws {
        let spool = TestSpool()
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(r.status == 0, "\(r)")
        #expect(format(spool) == "\(Spool.format)\n")
    }

    /// A spool of a build before .format (binary property-list records): its jobs resume and end, and the spool is
    /// marked as this build's from then on.
    @Test func aSpoolOfAnEarlierBuildIsTakenUp() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.root + "/active", withIntermediateDirectories: true)
        try leave("older", in: spool, record: PlistBinaryWriter.document(.dictionary(PlistDictionary([
            "manifest": .string("older shoot.plist"), "receivedAt": .real(1.7e9),
        ]))))
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(r.status == 0, "\(r)")
        let result = try #require(spool.result("older", timeout: 1))
        #expect(result["status"] as? String == "succeeded")
        #expect(result["manifest"] as? String == "older shoot.plist", "\(result)")
        #expect(format(spool) == "\(Spool.format)\n")
    }

    /// A newer build whose change this build's format reads says so ("3 2"): its jobs run here, and the spool is this
    /// build's again. A second number that makes no sense is a file this build cannot read.
    @Test func aNewerFormatSaidToBeReadByThisBuildIsTakenUp() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.root + "/active", withIntermediateDirectories: true)
        try leave("compatible", in: spool, record: ClaimRecord(manifest: "compatible.plist", receivedAt: 1.8e9).encoded)
        let newer = Spool.format + 1
        try Data("\(newer) 99\n".utf8).write(to: URL(fileURLWithPath: spool.root + "/active/.format"))
        let refused = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(refused.status == 1 && refused.stderr.contains("written in a format this build cannot read"), "\(refused)")
        try Data("\(newer) \(Spool.format)\n".utf8).write(to: URL(fileURLWithPath: spool.root + "/active/.format"))
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(r.status == 0, "\(r)")
        #expect(spool.result("compatible", timeout: 1)?["status"] as? String == "succeeded")
        #expect(format(spool) == "\(Spool.format)\n")
    }

    /// Jobs in a newer format (or one this build cannot read) are not touched: the daemon exits 1 saying which and what
    /// to do. Once the newer build has run them (active/ holds no job), this build takes the spool over, saying so.
    @Test func activeOfANewerBuildIsRefusedWhileItHoldsJobs() throws {
        let spool = TestSpool()
        try FileManager.default.createDirectory(atPath: spool.root + "/active/.submissions", withIntermediateDirectories: true)
        try leave("later", in: spool, record: Array("a record this build cannot read".utf8))
        let manifest = try Data(contentsOf: URL(fileURLWithPath: spool.root + "/active/later/manifest.plist"))
        let newer = Spool.format + 1
        try Data("\(newer)\n".utf8).write(to: URL(fileURLWithPath: spool.root + "/active/.format"))
        let refused = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("active/ holds 1 job (later) written in format \(newer) (\(spool.root)/active/.format),"
                                        + " newer than this build's format \(Spool.format)"), "\(refused)")
        #expect(spool.list("outbox").isEmpty)
        #expect(try Data(contentsOf: URL(fileURLWithPath: spool.root + "/active/later/manifest.plist")) == manifest, "left as it was")
        #expect(format(spool) == "\(newer)\n")

        // A daemon, not only --once; and a submission waiting for the database, or a hook due for a published job,
        // count as jobs too.
        try Data("<plist/>".utf8).write(to: URL(fileURLWithPath: spool.root + "/active/.submissions/0.1.2-waiting.plist"))
        try FileManager.default.createDirectory(atPath: spool.root + "/active/.hooks", withIntermediateDirectories: true)
        try Data("succeeded".utf8).write(to: URL(fileURLWithPath: spool.root + "/active/.hooks/published"))
        try Data("three\n".utf8).write(to: URL(fileURLWithPath: spool.root + "/active/.format"))
        let garbled = try run("opqueued", ["--spool", spool.root, "--log-target", "console"], timeout: 20)
        #expect(garbled.status == 1)
        #expect(garbled.stderr.contains("holds 3 jobs (later, .submissions/0.1.2-waiting.plist, .hooks/published)"
                                        + " written in a format this build cannot read"), "\(garbled)")

        // The newer build ran them to the end.
        try FileManager.default.removeItem(atPath: spool.root + "/active/later")
        try FileManager.default.removeItem(atPath: spool.root + "/active/.submissions/0.1.2-waiting.plist")
        try FileManager.default.removeItem(atPath: spool.root + "/active/.hooks/published")
        try Data("\(newer)\n".utf8).write(to: URL(fileURLWithPath: spool.root + "/active/.format"))
        try spool.drop("now.plist", ["job": "now", "operations": [sleepOp("a", 0)]])
        let taken = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(taken.status == 0, "\(taken)")
        #expect(taken.stderr.contains("active/ was left by a newer opqueued (spool format \(newer)) but holds no job:"
                                      + " this build takes it over in its own format \(Spool.format)"), "\(taken)")
        #expect(spool.result("now", timeout: 1)?["status"] as? String == "succeeded")
        #expect(format(spool) == "\(Spool.format)\n")
    }
}
