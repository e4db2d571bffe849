// Downloads at the edges (issue 12): a download that succeeded is not fetched again after kill -9 (it was
// streamed into active/.downloads/), a big body never sits in the daemon's memory, and downloads refuse
// loopback and other inward destinations unless download.allowNetworks opens them — checked on the
// address connected to, at every redirect hop. Every address used is a loopback one.

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import OperationKinds
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// Bytes that are the same at every run and compress badly.
func noise(_ count: Int, seed: UInt64) -> Data {
    var rng = SplitMix(state: seed)
    var data = Data(capacity: count)
    while data.count < count { withUnsafeBytes(of: rng.next()) { data.append(contentsOf: $0.prefix(count - data.count)) } }
    return data
}

func occurrences(of needle: String, in text: String) -> Int { text.components(separatedBy: needle).count - 1 }

@Suite(.serialized, .onItsOwnExecutor) struct DownloadDurabilityTests {
    @Test func aSucceededDownloadIsNotFetchedAgainAfterKill9() throws {
        let s = try ImageSpool()
        let server = try LoopbackServer(folder: s.images)
        let body = noise(300_000, seed: 12)
        try s.put("body.bin", body)
        try s.put("photo.jpg", Codecs.encode(try makeImage(width: 40, height: 30), format: "jpeg", quality: 90))
        try s.spool.start(["--config", s.spool.configPath])
        let ops: [[String: Any]] = [
            ["id": "get", "kind": "download", "url": server.url("/file/body.bin")],
            ["id": "img", "kind": "download", "url": server.url("/file/photo.jpg")],
            ["id": "sepia", "kind": "sepia", "input": "img"],
            sleepOp("nap", 3, deps: ["get", "sepia"]),
            ["id": "raw", "kind": "write", "path": "body.bin", "format": "png", "input": "get", "dependencies": ["nap"]],
            ["id": "out", "kind": "write", "path": "photo.png", "input": "sepia", "dependencies": ["nap"]],
        ]
        try s.spool.drop("dl.plist", ["job": "dl", "operations": ops])
        // Killed once the downloads and the filter are recorded as succeeded, while `nap` runs.
        let progress = s.spool.root + "/active/.progress.log"
        var recorded = false
        for _ in 0..<250 where !recorded {
            usleep(20_000)
            let text = (try? String(contentsOfFile: progress, encoding: .utf8)) ?? ""
            recorded = ["get", "img", "sepia"].allSatisfy { text.contains("dl\t\($0)\t") }
        }
        #expect(recorded, "the downloads and the filter succeeded")
        s.spool.signal(SIGKILL)
        _ = s.spool.waitForExit()
        #expect(FileManager.default.fileExists(atPath: s.spool.root + "/active/.downloads/dl/get"),
                "the download's file survived the crash")
        try s.spool.start(["--config", s.spool.configPath])
        let result = try #require(s.spool.result("dl"))
        var byID: [String: [String: Any]] = [:]
        for op in result["operations"] as? [[String: Any]] ?? [] { byID[op["id"] as? String ?? ""] = op }
        #expect(result["status"] as? String == "succeeded", "\(result)")
        #expect(server.requests.filter { $0 == "/file/body.bin" }.count == 1, "requests: \(server.requests)")
        #expect(server.requests.filter { $0 == "/file/photo.jpg" }.count == 1, "requests: \(server.requests)")
        for id in ["get", "img", "sepia"] { #expect(byID[id]?["attempts"] as? Int == 1, "\(id): \(byID[id] ?? [:])") }
        #expect(FileManager.default.contents(atPath: s.spool.root + "/outbox/dl/body.bin") == body,
                "write copies the downloaded bytes unchanged")
        let written = try s.output("dl", "photo.png")
        #expect(written.width == 40 && written.height == 30)
        // Each operation that succeeded before the crash is logged once (the filter, computed again from
        // the restored download, is not logged again).
        let log = (try? String(contentsOfFile: s.spool.logPath, encoding: .utf8)) ?? ""
        for id in ["get", "img", "sepia"] {
            #expect(occurrences(of: "operation dl/\(id) succeeded", in: log) == 1, "\(id) logged once as succeeded")
            #expect(occurrences(of: "operation dl/\(id) executing", in: log) == 1, "\(id) logged once as executing")
        }
        // Downloads are never published, and go once the job is.
        #expect(!FileManager.default.fileExists(atPath: s.spool.root + "/outbox/dl/.downloads"))
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: s.spool.root + "/outbox/dl")) ?? [])
                    .sorted() == ["body.bin", "manifest.plist", "photo.png", "result.plist"])
        // (Removed just after the entry is placed and committed: a moment after result.plist shows.)
        var gone = false
        for _ in 0..<250 where !gone {
            gone = !FileManager.default.fileExists(atPath: s.spool.root + "/active/.downloads/dl")
            if !gone { usleep(20_000) }
        }
        #expect(gone, "the job's downloads are removed once it is published")
    }

    @Test func aBigDownloadDoesNotRaiseTheDaemonsPeakMemoryByItsSize() throws {
        let s = try ImageSpool()
        let server = try LoopbackServer(folder: s.images)
        let size = 40 << 20
        let body = noise(size, seed: 40)
        try s.put("big.bin", body)
        try s.spool.start(["--config", s.spool.configPath])
        // A small download first: the daemon's threads and libcurl are up when the baseline is taken.
        try s.put("small.bin", Data("small".utf8))
        try s.spool.drop("warm.plist", ["job": "warm", "operations": [
            ["id": "get", "kind": "download", "url": server.url("/file/small.bin")],
            ["id": "put", "kind": "write", "path": "small.bin", "format": "png", "dependencies": ["get"]],
        ]])
        #expect(s.spool.result("warm")?["status"] as? String == "succeeded")
        let pid = try #require(s.spool.daemon?.processIdentifier)
        let before = processMemoryMB(pid)
        try s.spool.drop("big.plist", ["job": "big", "operations": [
            ["id": "get", "kind": "download", "url": server.url("/file/big.bin")],
            ["id": "put", "kind": "write", "path": "big.bin", "format": "png", "dependencies": ["get"]],
        ]])
        let result = try #require(s.spool.result("big", timeout: 60))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        let after = processMemoryMB(pid)
        #expect(after - before < 10, "peak RSS rose by \(after - before) MB (\(before) → \(after)) for a 40 MB download")
        #expect(FileManager.default.contents(atPath: s.spool.root + "/outbox/big/big.bin") == body)
    }
}

@Suite(.serialized, .onItsOwnExecutor) struct DownloadDestinationTests {
    @Test func loopbackIsRefusedByDefaultWithTheAddressInTheError() throws {
        let s = try ImageSpool()
        let server = try LoopbackServer(folder: s.images)
        try s.put("x.bin", Data("x".utf8))
        // The default: no allowNetworks (fileRoots only).
        try s.spool.configure(["download": ["fileRoots": [s.images]]])
        // A refused address never gets a connection: nothing need listen on [::1].
        let ops: [[String: Any]] = [
            ["id": "v4", "kind": "download", "url": "http://127.0.0.1:\(server.port)/file/x.bin"],
            ["id": "name", "kind": "download", "url": "http://localhost:\(server.port)/file/x.bin"],
            ["id": "v6", "kind": "download", "url": "http://[::1]:\(server.port)/file/x.bin"],
            ["id": "mapped", "kind": "download", "url": "http://[::ffff:127.0.0.1]:\(server.port)/file/x.bin"],
        ]
        let (result, byID) = try s.run(["job": "inward", "operations": ops])
        #expect(result["status"] as? String == "failed")
        func error(_ id: String) -> String { byID[id]?["error"] as? String ?? "" }
        for id in ["v4", "name", "v6", "mapped"] {
            #expect(byID[id]?["state"] as? String == "failed", "\(id)")
            #expect(error(id).contains("download.allowNetworks") && error(id).contains("(loopback)"), "\(id): \(error(id))")
        }
        #expect(error("v4").contains("refused to connect to 127.0.0.1 (loopback)"), "\(error("v4"))")
        #expect(error("name").contains("127.0.0.1") || error("name").contains("::1"), "\(error("name"))")
        #expect(error("v6").contains("::1 (loopback)"), "\(error("v6"))")
        #expect(error("mapped").contains("127.0.0.1 (loopback)"), "\(error("mapped"))")
        #expect(server.requests.isEmpty, "the server saw no request: \(server.requests)")
    }

    @Test func aRedirectToAClosedAddressIsRefusedAtTheHop() throws {
        let s = try ImageSpool()
        let target = try LoopbackServer(folder: s.images)
        let hopFolder = s.images + "/hop"
        try FileManager.default.createDirectory(atPath: hopFolder, withIntermediateDirectories: true)
        let hop = try LoopbackServer(folder: hopFolder, address: "127.0.0.2")
        let body = noise(1000, seed: 5)
        try s.put("x.bin", body)
        let ops: [[String: Any]] = [
            ["id": "get", "kind": "download", "url": hop.url("/redirect?" + target.url("/file/x.bin"))],
            ["id": "put", "kind": "write", "path": "x.bin", "format": "png", "dependencies": ["get"]],
        ]
        // Only 127.0.0.2 opened: the first hop connects, the redirect to 127.0.0.1 does not.
        try s.spool.configure(["download": ["fileRoots": [s.images], "allowNetworks": ["127.0.0.2/32"]]])
        let (closed, closedOps) = try s.run(["job": "closed", "operations": ops])
        #expect(closed["status"] as? String == "failed")
        let error = closedOps["get"]?["error"] as? String ?? ""
        #expect(error.contains("refused to connect to 127.0.0.1 (loopback)") && error.contains("download.allowNetworks"), "\(error)")
        #expect(hop.requests.count == 1, "the first hop was fetched: \(hop.requests)")
        #expect(target.requests.isEmpty, "the redirect's target saw no request: \(target.requests)")

        // The range opened: the same download works.
        try s.spool.configure(["download": ["fileRoots": [s.images], "allowNetworks": ["127.0.0.0/8"]]])
        let (open, openOps) = try s.run(["job": "open", "operations": ops])
        #expect(open["status"] as? String == "succeeded", "\(openOps)")
        #expect(target.requests == ["/file/x.bin"])
        #expect(FileManager.default.contents(atPath: s.spool.root + "/outbox/open/x.bin") == body)
    }
}
