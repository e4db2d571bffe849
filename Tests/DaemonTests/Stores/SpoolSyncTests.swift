// SpoolSync: what a commit promises, checked by cutting the power. The spool is on an ext4 image of its own; while
// the daemon runs, the file system is shut down the way xfstests simulates a power cut (EXT4_IOC_SHUTDOWN without
// flushing the log: what was not committed is gone, page cache and all), then mounted again. Every job the daemon
// had announced must have its whole outbox entry, outputs byte for byte, and after a restart every manifest submitted
// must end exactly once. Both ways of committing are held to it.

@testable import Daemon
import Foundation
import SystemCalls
import Testing
import TestSupport
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite("SpoolSync", .serialized, .onItsOwnExecutor)
struct SpoolSyncTests {
    /// What is wrong with outbox/<job>, if anything: its result, and its outputs against the source's bytes.
    private func problem(_ root: String, _ job: String, source: Data, outputs: Bool) -> String? {
        let entry = root + "/outbox/" + job
        guard let data = FileManager.default.contents(atPath: entry + "/result.plist") else { return "\(job): no result.plist" }
        let result = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any]
        guard result?["status"] as? String == "succeeded" else { return "\(job): result \(data.count) bytes, not succeeded" }
        let index = Int(job.dropFirst()) ?? 0
        for output in !outputs ? [] : index % 3 == 0 ? ["out/data.bin", "copy/again.bin"] : ["out/data.bin"]
        where FileManager.default.contents(atPath: entry + "/" + output) != source {
            return "\(job): \(output) is not the source's bytes"
        }
        return nil
    }

    /// `outputs`: jobs that download and write files (a download is fsynced by itself, which commits ext4's journal
    /// as a side effect), else jobs of sleeps, whose every byte and rename only the commit makes durable. The second
    /// sleep is 10 ms so that a loaded machine still stops the daemon with jobs in flight.
    @Test(arguments: ["journal", "syncfs"], [false, true])
    func whatWasAnnouncedSurvivesAPowerCut(method: String, outputs: Bool) throws {
        let spool = TestSpool(), source = spool.root + ".src"
        var image = spool.root + ".img"
        defer {
            if let daemon = spool.daemon, daemon.isRunning { kill(daemon.processIdentifier, SIGKILL); daemon.waitUntilExit() }
            try? PowerCut.unmount(spool.root, lazily: true)
            unlink(image)
            unlink(source)
        }
        try PowerCut.mountImage(image, on: spool.root)
        let bytes = Data((0..<48_000).map { _ in UInt8.random(in: 0...255) })
        try bytes.write(to: URL(fileURLWithPath: source))
        let config = try spool.configure(["download": ["fileRoots": [NSTemporaryDirectory()]]])
        if method == "syncfs" { spool.environment["OPQUEUED_SPOOL_SYNC"] = "syncfs" }

        // Submitted as a careful client does: written, renamed in, and synced before the daemon starts.
        let count = 360
        try FileManager.default.createDirectory(atPath: spool.root + "/inbox", withIntermediateDirectories: true)
        for i in 0..<count {
            var operations: [[String: Any]] = outputs ? [
                ["id": "get", "kind": "download", "url": "file://" + source],
                ["id": "put", "kind": "write", "path": "out/data.bin", "input": "get", "dependencies": ["get"]],
            ] : [sleepOp("a", 0), sleepOp("b", 0.01, deps: ["a"])]
            if outputs && i % 3 == 0 {
                operations.append(["id": "again", "kind": "write", "path": "copy/again.bin", "input": "get", "dependencies": ["put"]])
            }
            try spool.drop("p\(i).plist", ["job": "p\(i)", "operations": operations])
        }
        try #require(try runProgram("/bin/sync", ["-f", spool.root + "/inbox"]).status == 0)

        // Two cuts, each once a further quarter of what remains was announced, then a run to the end. A job published
        // just before a cut may never be announced (the line follows the commit), so what a cut left in the outbox
        // counts as done too.
        var promised = Set<String>(), ended = Set<String>()
        for cut in 1...2 {
            try spool.launch(config)
            let wanted = min(count, ended.count + max(1, (count - ended.count) / 4))
            func done() -> Set<String> { ended.union(PowerCut.announcedSuccesses(log: spool.logPath)) }
            let reached = pollUntil(60) { done().count >= wanted ? true : nil }
            let log = (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? ""
            try #require(reached != nil, "cut \(cut): \(done().count) of \(wanted) ended; \(log.suffix(1500))")
            // Stopped first, as a power cut stops it.
            try #require(spool.freeze(), "the daemon did not stop")
            promised = PowerCut.announcedSuccesses(log: spool.logPath)
            try PowerCut.cut(spool.root)
            kill(spool.daemon!.processIdentifier, SIGKILL)
            spool.daemon!.waitUntilExit()
            image = try PowerCut.remount(image, on: spool.root)
            let lost = promised.sorted().compactMap { problem(spool.root, $0, source: bytes, outputs: outputs) }
            let cutAt = "cut \(cut) (\(method), outputs \(outputs))"
            #expect(lost.isEmpty, "\(cutAt): \(lost.count) of \(promised.count) announced entries damaged: \(lost.prefix(5))")
            ended = promised.union(spool.list("outbox"))
        }
        try spool.launch(config)
        let done = pollUntil(120) { spool.list("outbox").count >= count ? true : nil }
        #expect(done != nil, "\(spool.list("outbox").count) of \(count) entries after the cuts")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        let entries = spool.list("outbox")
        #expect(entries == (0..<count).map { "p\($0)" }.sorted(), "each job exactly once: \(entries.filter { $0.contains(".") })")
        let damaged = entries.compactMap { problem(spool.root, $0, source: bytes, outputs: outputs) }
        #expect(damaged.isEmpty, "\(damaged.prefix(5))")
        #expect(spool.list("inbox").isEmpty && spool.list("active").isEmpty)
    }

    /// The journal way only where ext4 keeps a journal inside the file system, and never when the environment says
    /// syncfs; a spool opened alone stays with syncfs until asked.
    @Test func theJournalWayIsTakenOnlyOnExt4WithAJournal() throws {
        let base = NSTemporaryDirectory() + "opq-sync-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: base) }
        func method(features: [String]?, environment: [String: String] = [:]) throws -> SpoolSync.Method {
            let folder = base + "/\(UInt32.random(in: 0...UInt32.max))", image = folder + ".img"
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            var mounted = false
            defer {
                if mounted { _ = try? runProgram("/bin/umount", ["-l", folder]) }
                unlink(image)
            }
            if let features {
                try PowerCut.mountImage(image, on: folder, megabytes: 32, features: features)
                mounted = true
            } else {
                let run = try runProgram("/bin/mount", ["-t", "tmpfs", "tmpfs", folder])
                try #require(run.status == 0, "mount: \(run.stderr)")
                mounted = true
            }
            let spool = try Spool(root: folder + "/spool")
            #expect(spool.sync.current == .syncfs, "opened alone")
            return spool.preferJournalCommits(environment: environment)
        }
        #expect(try method(features: []) == .journal)
        #expect(try method(features: [], environment: ["OPQUEUED_SPOOL_SYNC": "syncfs"]) == .syncfs)
        #expect(try method(features: ["-O", "^has_journal"]) == .syncfs)
        #expect(try method(features: nil) == .syncfs, "tmpfs")
    }

    /// A commit the disk refuses throws, naming what failed and where, and the next commit is a whole syncfs (what the
    /// failed one was to write out is no longer listed).
    @Test func aCommitTheDiskRefusesSaysWhereAndTheNextCoversEverything() throws {
        let folder = NSTemporaryDirectory() + "opq-sync-cut-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let image = folder + ".img"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try PowerCut.mountImage(image, on: folder, megabytes: 32)
        defer {
            try? PowerCut.unmount(folder, lazily: true)
            unlink(image)
            try? FileManager.default.removeItem(atPath: folder)
        }
        let spool = try Spool(root: folder + "/spool")
        #expect(spool.preferJournalCommits(environment: [:]) == .journal)
        try spool.commit()
        #expect(!spool.sync.nextIsWhole, "after the first commit, only what is registered")
        try Data("x".utf8).write(to: URL(fileURLWithPath: spool.active + "/file"))
        spool.sync.file(spool.active + "/file")
        try PowerCut.cut(folder)
        let refused = #expect(throws: SpoolError.self) { try spool.commit() }
        #expect(refused.map { "\($0)".contains(folder + "/spool") } == true, "\(String(describing: refused))")
        #expect(spool.sync.nextIsWhole)
    }
}
