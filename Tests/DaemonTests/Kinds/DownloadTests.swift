// Downloads through the real daemon and real libcurl against a loopback HTTP server (Tests/Support/http_server.py).

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import OperationKinds
import TestTraits

@Suite(.serialized, .onItsOwnExecutor) struct DownloadTests {
    @Test func httpFailuresSayWhatWentWrong() throws {
        let s = try ImageSpool(extraConfig: ["download": ["timeoutSeconds": 2, "maxBytes": 1_000_000]])
        let server = try LoopbackServer(folder: s.images)
        let photo = try makeImage(width: 32, height: 24)
        try s.put("photo.jpg", Codecs.encode(photo, format: "jpeg", quality: 90))
        let ops: [[String: Any]] = [
            ["id": "ok", "kind": "download", "url": server.url("/file/photo.jpg")],
            ["id": "sepia", "kind": "sepia", "dependencies": ["ok"]],
            ["id": "write", "kind": "write", "path": "photo.jpg", "quality": 80, "dependencies": ["sepia"]],
            ["id": "missing", "kind": "download", "url": server.url("/status/404")],
            ["id": "slow", "kind": "download", "url": server.url("/slow")],
            ["id": "big", "kind": "download", "url": server.url("/big")],
            ["id": "big-chunked", "kind": "download", "url": server.url("/big-chunked")],
            ["id": "small-limit", "kind": "download", "url": server.url("/file/photo.jpg"), "maxBytes": 100],
            ["id": "loop", "kind": "download", "url": server.url("/loop")],
            ["id": "to-ftp", "kind": "download", "url": server.url("/to-ftp")],
            ["id": "refused", "kind": "download", "url": "http://127.0.0.1:1/nothing"],
        ]
        let started = Date()
        let (result, byID) = try s.run(["job": "http", "operations": ops])
        #expect(Date().timeIntervalSince(started) < 15)
        #expect(result["status"] as? String == "failed")
        #expect(byID["write"]?["state"] as? String == "succeeded")
        let written = try s.output("http", "photo.jpg")
        #expect(written.width == 32 && written.height == 24)
        func error(_ id: String) -> String { byID[id]?["error"] as? String ?? "" }
        #expect(error("missing") == "HTTP status 404")
        #expect(error("slow").contains("imed out"), "\(error("slow"))")
        #expect(error("big") == "the response is larger than maxBytes (1000000 bytes)")
        #expect(error("big-chunked") == "the response is larger than maxBytes (1000000 bytes)")
        #expect(error("small-limit") == "the response is larger than maxBytes (100 bytes)")
        #expect(error("loop").contains("Maximum (5) redirects followed"), "\(error("loop"))")
        #expect(error("to-ftp").lowercased().contains("protocol"), "\(error("to-ftp"))")
        #expect(!error("refused").isEmpty)
    }

    /// Issue 5.4: a server that stalls, trickles, lies about Content-Length, never ends its headers or
    /// redirects to a file: each transfer ends by its timeout or its bound, with an error that says which,
    /// and the daemon's memory stays small (an endless header stream is not kept).
    @Test func hostileServersHoldNoSlotPastTheTimeoutNorGrowMemory() throws {
        let s = try ImageSpool(extraConfig: ["download": ["timeoutSeconds": 2, "maxBytes": 1_000_000]])
        let server = try LoopbackServer(folder: s.images)
        let paths = ["/hang", "/trickle", "/trickle-headers", "/endless-headers", "/short", "/long", "/to-file"]
        let ops: [[String: Any]] = paths.map { ["id": String($0.dropFirst()), "kind": "download", "url": server.url($0)] }
        try s.spool.start(["--config", s.spool.configPath])
        let started = Date()
        try s.spool.drop("hostile.plist", ["job": "hostile", "operations": ops])
        let result = try #require(s.spool.result("hostile", timeout: 20))
        let seconds = Date().timeIntervalSince(started)
        var byID: [String: [String: Any]] = [:]
        for op in result["operations"] as? [[String: Any]] ?? [] { byID[op["id"] as? String ?? ""] = op }
        #expect(seconds < 6, "every transfer ended by its 2 s timeout (took \(seconds) s)")
        #expect(result["status"] as? String == "failed")
        func error(_ id: String) -> String { byID[id]?["error"] as? String ?? "" }
        for id in ["hang", "trickle", "trickle-headers"] {
            #expect(error(id).contains("imed out"), "\(id): \(error(id))")
            #expect((byID[id]?["durationSeconds"] as? Double ?? 99) < 3, "\(id) held its slot \(byID[id]?["durationSeconds"] ?? "?") s")
        }
        #expect(!error("endless-headers").isEmpty, "endless headers fail: \(error("endless-headers"))")
        #expect(error("short").lowercased().contains("transfer closed") || error("short").contains("partial"), "\(error("short"))")
        // HTTP says the body is what Content-Length says: 10 bytes, the rest ignored.
        #expect(byID["long"]?["state"] as? String == "succeeded", "\(error("long"))")
        #expect(error("to-file").lowercased().contains("protocol"), "\(error("to-file"))")
        let peak = processMemoryMB(try #require(s.spool.daemon?.processIdentifier))
        #expect(peak > 0 && peak < 150, "peak RSS \(peak) MB")
        #expect(s.spool.daemon?.isRunning == true)
    }

    @Test func cancellingAbortsTheTransferAtOnce() throws {
        let s = try ImageSpool()
        let server = try LoopbackServer(folder: s.images)
        try s.spool.start(["--config", s.spool.configPath])
        try s.spool.drop("hang.plist", ["job": "hang", "operations": [["id": "get", "kind": "download", "url": server.url("/hang")]]])
        let events = s.images + "/events.log"
        var executing = false
        for _ in 0..<200 where !executing {
            usleep(20_000)
            executing = (try? s.spool.ctl(["show", "hang"]).stdout.contains("executing")) ?? false
        }
        #expect(executing)
        usleep(200_000) // the request has reached the server
        let cancelledAt = Date().timeIntervalSince1970
        #expect(try s.spool.ctl(["cancel", "hang", "get"]).status == 0)
        var closedAt: Double?
        for _ in 0..<100 where closedAt == nil {
            usleep(10_000)
            closedAt = (try? String(contentsOfFile: events, encoding: .utf8))?.split(separator: " ").last
                .flatMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        }
        let closed = try #require(closedAt, "the server saw the connection close")
        // The server never answers and the transfer's own timeout is 120 s: a close within 2 s (opqueuectl's start
        // included, on a loaded 2-core CI machine) can only be the cancel's abort. How fast it is, is the benchmarks' matter.
        #expect(closed - cancelledAt < 2, "aborted at once (took \(closed - cancelledAt) s)")
        let result = try #require(s.spool.result("hang"))
        #expect(result["status"] as? String == "cancelled")
    }

    @Test func fileURLsOnlyUnderTheRoots() throws {
        let s = try ImageSpool()
        try s.put("inside.png", Codecs.encode(try makeImage(width: 8, height: 8), format: "png", quality: 90))
        let outside = s.spool.root + "-outside.png"
        try Data("secret".utf8).write(to: URL(fileURLWithPath: outside))
        defer { try? FileManager.default.removeItem(atPath: outside) }
        try FileManager.default.createSymbolicLink(atPath: s.images + "/link.png", withDestinationPath: outside)
        // Outside every root as written: a manifest problem, the same words whether the path exists or not.
        let (rejected, _) = try s.run(["job": "outside", "operations": [
            ["id": "dotdot", "kind": "download", "url": s.url("../" + (outside as NSString).lastPathComponent)],
            ["id": "absolute", "kind": "download", "url": "file:///etc/passwd"],
            ["id": "absent", "kind": "download", "url": "file:///etc/no-such-file-here"],
        ]])
        #expect(rejected["status"] as? String == "rejected")
        let error = rejected["error"] as? String ?? ""
        for id in ["dotdot", "absolute", "absent"] {
            #expect(error.contains("operation '\(id)': ") && error.contains("is not under a configured file root (download.fileRoots)"),
                    "\(id): \(error)")
        }
        #expect(error.contains("/etc/passwd is not under") && error.contains("/etc/no-such-file-here is not under"), "\(error)")
        // Inside as written, outside where it leads (a symbolic link): refused when it runs.
        let ops: [[String: Any]] = [
            ["id": "inside", "kind": "download", "url": s.url("inside.png")],
            ["id": "symlink", "kind": "download", "url": s.url("link.png")],
            ["id": "fifo", "kind": "download", "url": s.url("pipe.png")],
            ["id": "folder", "kind": "download", "url": s.url("folder.png")],
        ]
        #expect(mkfifo(s.images + "/pipe.png", 0o644) == 0)
        #expect(mkdir(s.images + "/folder.png", 0o755) == 0)
        let (_, byID) = try s.run(["job": "files", "operations": ops])
        #expect(byID["inside"]?["state"] as? String == "succeeded")
        #expect(byID["symlink"]?["state"] as? String == "failed")
        #expect((byID["symlink"]?["error"] as? String)?.contains("is not under a configured file root") == true,
                "\(byID["symlink"]?["error"] ?? "")")
        // Inside a root, what is not a regular file is named for what it is (a FIFO is never waited on).
        #expect((byID["fifo"]?["error"] as? String)?.hasSuffix("/pipe.png: a FIFO (named pipe), not a regular file") == true,
                "\(byID["fifo"] ?? [:])")
        #expect((byID["folder"]?["error"] as? String)?.hasSuffix("/folder.png: a folder, not a regular file") == true,
                "\(byID["folder"] ?? [:])")
    }
}

@Suite(.serialized, .onItsOwnExecutor) struct PhotoListTests {
    @Test func photosURLAddsTheListsGraphToTheRunningJob() throws {
        let s = try ImageSpool()
        let server = try LoopbackServer(folder: s.images)
        let photo = try makeImage(width: 16, height: 12)
        try s.put("a.jpg", Codecs.encode(photo, format: "jpeg", quality: 90))
        try s.put("list.plist", plist(["Beach at dusk": server.url("/file/a.jpg"), "gone": server.url("/status/404")]))
        let (result, byID) = try s.run(["job": "album", "photosURL": server.url("/file/list.plist"), "metadata": ["album": "summer"]])
        #expect(result["status"] as? String == "failed", "the missing photo fails its chain, and so the job")
        #expect((result["metadata"] as? [String: Any])?["album"] as? String == "summer")
        let ids = (result["operations"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        #expect(ids == ["photos", "download-Beach_at_dusk", "sepia-Beach_at_dusk", "write-Beach_at_dusk", "download-gone", "sepia-gone",
                        "write-gone"])
        #expect(byID["photos"]?["state"] as? String == "succeeded")
        #expect(byID["write-Beach_at_dusk"]?["outputs"] as? [String] == ["Beach_at_dusk.png"])
        #expect(byID["download-gone"]?["error"] as? String == "HTTP status 404")
        #expect(byID["write-gone"]?["state"] as? String == "cancelled")
        let written = try s.output("album", "Beach_at_dusk.png")
        #expect(written.width == 16 && written.height == 12)
        #expect(s.lastLog.contains("OPQ_OPERATION=sepia-Beach_at_dusk OPQ_QOS=userInitiated OPQ_QUEUE=filters"
                                   + " OPQ_QUEUE_PRIORITY=normal OPQ_STATE=succeeded"),
                "expanded operations are logged")

        let (missing, missingOps) = try s.run(["job": "nolist", "photosURL": server.url("/status/404")])
        #expect(missing["status"] as? String == "failed")
        #expect(missingOps["photos"]?["error"] as? String == "HTTP status 404")
        try s.put("notalist.plist", plist(["a": 1]))
        let (bad, badOps) = try s.run(["job": "badlist", "photosURL": server.url("/file/notalist.plist")])
        #expect(bad["status"] as? String == "failed")
        #expect((badOps["photos"]?["error"] as? String)?.contains("is not a property list dictionary of name → URL strings") == true)
    }
}
