// What a job's folder may hold when it is published (EntryCheck, SPEC §2): a symbolic link, a named pipe, a socket or
// a device is removed first and said in result.plist's `dropped` and the log; regular files and folders stay, and an
// operation's `outputs` names only what the entry holds.

import Foundation
import Testing
@testable import Daemon
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// lstat's file type of `path`, or nil when there is nothing there.
private func fileType(_ path: String) -> mode_t? {
    var st = stat()
    return lstat(path, &st) == 0 ? st.st_mode & S_IFMT : nil
}

@Suite(.serialized, .onItsOwnExecutor) struct EntryCheckTests {
    /// A command writes outside its scratch folder, into the job's: a link to /etc/passwd, a link in a sub-folder, a
    /// named pipe, a regular file, and its manifest.plist replaced by a link. The entry keeps the file and the
    /// folder, holds no link or pipe, keeps the manifest's own bytes, and result.plist and the log say what went.
    @Test func linksACommandPlantsAreNotPublishedAndTheResultSaysWhy() throws {
        let spool = TestSpool()
        let script = "cd ../.. && ln -s /etc/passwd passwd && mkdir sub && ln -s /etc sub/etc && mkfifo pipe"
            + " && echo kept > plain.txt && echo deeper > sub/file.txt && rm manifest.plist && ln -s /etc/passwd manifest.plist"
        let config = try spool.configure(["commands": ["plant": ["argv": ["/bin/sh", "-c", script]]]])
        let manifest: [String: Any] = ["job": "p", "operations": [["id": "c", "kind": "command", "command": "plant"]]]
        try spool.drop("p.plist", manifest)
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"] + config)
        #expect(r.status == 0, "\(r.stderr)")
        let result = try #require(spool.result("p", timeout: 1))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        let entry = spool.root + "/outbox/p"
        #expect(try String(contentsOfFile: entry + "/plain.txt", encoding: .utf8) == "kept\n")
        #expect(try String(contentsOfFile: entry + "/sub/file.txt", encoding: .utf8) == "deeper\n")
        for gone in ["passwd", "sub/etc", "pipe"] { #expect(fileType(entry + "/" + gone) == nil, "\(gone) was published") }
        #expect(fileType(entry + "/manifest.plist") == S_IFREG)
        #expect(FileManager.default.contents(atPath: entry + "/manifest.plist") == plist(manifest), "the manifest's own bytes")
        let dropped = try #require(result["dropped"] as? [[String: String]], "\(result)")
        let reasons = Dictionary(uniqueKeysWithValues: dropped.map { ($0["path"] ?? "", $0["reason"] ?? "") })
        #expect(reasons == ["passwd": "a symbolic link to /etc/passwd: links are not published",
                            "manifest.plist": "a symbolic link to /etc/passwd: links are not published",
                            "sub/etc": "a symbolic link to /etc: links are not published",
                            "pipe": "a named pipe: only files and folders are published"])
        #expect(r.stderr.contains("job p: removed from active/p before publication: "), "\(r.stderr)")
        #expect(r.stderr.contains("passwd (a symbolic link to /etc/passwd: links are not published)"), "\(r.stderr)")
    }

    /// Outputs that went at publication are not listed: a racing command replaces a written file by a link, the
    /// folder of another by a link, and its own stderr log by a link; a write deeper than the walk's bound goes with
    /// its folder. Each operation's `outputs` then names only regular files the entry holds, and `dropped` says why.
    @Test func outputsRemovedAtPublicationAreNotListedAsOutputs() throws {
        let spool = TestSpool()
        let script = "cd ../.. && rm out.txt && ln -s /etc/passwd out.txt && rm -r sub && ln -s /etc sub"
            + " && rm logs/plant.stderr && ln -s /etc/passwd logs/plant.stderr"
        let config = try spool.configure(["commands": [
            "emit": ["argv": ["/bin/echo", "bytes"], "output": "stdout"],
            "plant": ["argv": ["/bin/sh", "-c", script]],
        ]])
        let deepFolder = Array(repeating: "d", count: EntryCheck.maxDepth + 1).joined(separator: "/")
        let writes = ["out": "out.txt", "below": "sub/below.txt", "deep": deepFolder + "/deep.txt", "kept": "kept.txt"]
        let manifest: [String: Any] = ["job": "o", "operations": [["id": "src", "kind": "command", "command": "emit"]]
            + writes.keys.sorted().map { ["id": $0, "kind": "write", "path": writes[$0]!, "input": "src"] }
            + [["id": "plant", "kind": "command", "command": "plant", "dependencies": writes.keys.sorted()]]]
        try spool.drop("o.plist", manifest)
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"] + config)
        #expect(r.status == 0, "\(r.stderr)")
        let result = try #require(spool.result("o", timeout: 1))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        let operations = try #require(result["operations"] as? [[String: Any]], "\(result)")
        let outputs = Dictionary(uniqueKeysWithValues: operations.map { ($0["id"] as? String ?? "", $0["outputs"] as? [String] ?? ["?"]) })
        #expect(outputs == ["src": ["logs/src.stdout", "logs/src.stderr"], "out": [], "below": [], "deep": [], "kept": ["kept.txt"],
                            "plant": ["logs/plant.stdout"]], "\(operations)")
        for path in outputs.values.joined() {
            #expect(fileType(spool.root + "/outbox/o/" + path) == S_IFREG, "\(path) is listed as an output but is no file of the entry")
        }
        let dropped = Set((result["dropped"] as? [[String: String]] ?? []).compactMap { $0["path"] })
        #expect(dropped == ["out.txt", "sub", "logs/plant.stderr", deepFolder + "/"], "\(result)")
    }

    /// The walk on its own: links are removed wherever they point (inside the folder too, or nowhere) and never
    /// followed (what a link to a folder leads to is left alone); a folder deeper than the bound goes whole.
    @Test func theWalkRemovesLinksUnfollowedAndGoesNoDeeperThanItsBound() throws {
        let root = NSTemporaryDirectory() + "opq-entry-" + UUID().uuidString.prefix(8)
        let job = root + "/job", elsewhere = root + "/elsewhere"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let fm = FileManager.default
        try fm.createDirectory(atPath: job + "/a/b", withIntermediateDirectories: true)
        try fm.createDirectory(atPath: elsewhere, withIntermediateDirectories: true)
        _ = fm.createFile(atPath: elsewhere + "/keep", contents: Data("x".utf8))
        _ = fm.createFile(atPath: job + "/a/b/out.png", contents: Data("png".utf8))
        #expect(symlink("b/out.png", job + "/a/inside") == 0)
        #expect(symlink("/nowhere/at/all", job + "/dangling") == 0)
        #expect(symlink(elsewhere, job + "/a/b/folder") == 0)
        let deep = job + "/" + Array(repeating: "d", count: EntryCheck.maxDepth + 1).joined(separator: "/")
        try fm.createDirectory(atPath: deep, withIntermediateDirectories: true)
        #expect(symlink("/etc/passwd", deep + "/hidden") == 0)
        let dropped = EntryCheck.sweep(job)
        let paths = Set(dropped.map(\.path))
        let tooDeep = Array(repeating: "d", count: EntryCheck.maxDepth + 1).joined(separator: "/") + "/"
        #expect(paths == ["a/inside", "dangling", "a/b/folder", tooDeep], "\(dropped)")
        #expect(dropped.first { $0.path == tooDeep }?.reason == "a folder more than 32 levels deep: not published")
        #expect(dropped.first { $0.path == "dangling" }?.reason == "a symbolic link to /nowhere/at/all: links are not published")
        #expect(fm.contents(atPath: job + "/a/b/out.png") == Data("png".utf8))
        #expect(fm.contents(atPath: elsewhere + "/keep") == Data("x".utf8), "a link to a folder is removed, not followed")
        #expect(fileType(job + "/" + Array(repeating: "d", count: EntryCheck.maxDepth).joined(separator: "/")) == S_IFDIR)
        #expect(fileType(job + "/" + tooDeep) == nil)
        #expect(EntryCheck.sweep(job).isEmpty, "nothing is left to remove")
    }
}
