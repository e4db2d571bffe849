// Fused chains as the user sees them (SPEC §3.3, §3.4; Sources/Daemon/Shell/FusedChains.swift): wherever a fused
// chain fails — decoding, a filter, the encoder, the disk — its operations end with the states, errors and journal
// entries of the same chain run unfused. The unfused twin gives each image operation a timeout of an hour, which
// keeps it from fusing and changes nothing else.

import ControlPlane
import Foundation
import TestSupport
import Testing
@testable import Daemon
@testable import OperationKinds
import TestTraits

/// One operation's journal entry, as the console prints it: the fields a user compares.
private struct Entry: Equatable, CustomStringConvertible {
    var operation: String
    var state: String
    var attempt: String?
    var queue: String?
    var error: String?
    var description: String { "\(operation) \(state)\(attempt.map { " #\($0)" } ?? "")\(error.map { ": \($0)" } ?? "")" }
}

/// `KEY=value` pairs of a console line (values quoted when they hold spaces, as ConsoleLogHandler.quote writes them).
private func fields(_ line: Substring) -> [String: String] {
    var out: [String: String] = [:]
    var rest = line[...]
    while let eq = rest.firstIndex(of: "=") {
        let key = rest[..<eq].trimmingCharacters(in: .whitespaces)
        rest = rest[rest.index(after: eq)...]
        var value = ""
        if rest.first == "\"" {
            rest = rest.dropFirst()
            while let c = rest.first, c != "\"" {
                rest = rest.dropFirst()
                if c == "\\", let next = rest.first {
                    value.append(next == "n" ? "\n" : next == "t" ? "\t" : next)
                    rest = rest.dropFirst()
                } else {
                    value.append(c)
                }
            }
            rest = rest.dropFirst()
        } else {
            let end = rest.firstIndex(of: " ") ?? rest.endIndex
            value = String(rest[..<end])
            rest = rest[end...]
        }
        out[key] = value
        rest = rest.drop { $0 == " " }
    }
    return out
}

private func operationEntries(_ log: String, root: String) -> [Entry] {
    log.split(separator: "\n").compactMap { line in
        let f = fields(line)
        guard f["OPQ_EVENT"] == "operation", let operation = f["OPQ_OPERATION"], let state = f["OPQ_STATE"] else { return nil }
        return Entry(operation: operation, state: state, attempt: f["OPQ_ATTEMPT"], queue: f["OPQ_QUEUE"],
                     error: f["OPQ_ERROR"]?.replacingOccurrences(of: root, with: "SPOOL"))
    }
}

/// What result.plist says of each operation, without times.
private func outcomes(_ ops: [String: [String: Any]], root: String) -> [String: String] {
    ops.mapValues { op in
        let error = (op["error"] as? String)?.replacingOccurrences(of: root, with: "SPOOL") ?? "-"
        return "\(op["state"] ?? "?") attempts \(op["attempts"] ?? "?") started \(op["startedAt"] != nil) \(error)"
    }
}

@Suite(.serialized, .onItsOwnExecutor) struct FusedChainTests {
    /// The places a chain can fail; each manifest's image operations fuse unless `unfused`.
    static func manifest(_ place: String, unfused: Bool, _ s: ImageSpool) -> [String: Any] {
        let hold: [String: Any] = unfused ? ["timeoutSeconds": 3600] : [:]
        func op(_ fields: [String: Any]) -> [String: Any] { fields.merging(hold) { a, _ in a } }
        var ops: [[String: Any]] = []
        var source = "photo.jpg", write: [String: Any] = ["path": "out.png"], middle: [String: Any] = ["kind": "grayscale"]
        switch place {
        case "decode": source = "truncated.jpg"
        case "decode-png": source = "truncated.png"
        case "filter": middle = ["kind": "resize", "width": 5000]               // past image.maxPixels
        case "encode": middle = ["kind": "resize", "width": 70_000, "height": 1, "mode": "stretch"]
                       write = ["path": "out.jpg"]                              // wider than JPEG allows
        case "disk":
            // A file named like the folder the write needs, made in the job folder before the chain starts (by a
            // command: a write of it would be a manifest problem).
            ops += [["id": "block", "kind": "command", "command": "block", "arguments": [String: Any]()]]
            write = ["path": "album/out.png"]
        default: break
        }
        ops.append(["id": "in", "kind": "download", "url": s.url(source)]
                       .merging(place == "disk" ? ["dependencies": ["block"]] : [:]) { a, _ in a })
        ops.append(op(["id": "sepia", "kind": "sepia", "dependencies": ["in"]]))
        ops.append(op(middle.merging(["id": "middle", "dependencies": ["sepia"]]) { a, _ in a }))
        ops.append(["id": "write", "kind": "write", "dependencies": ["middle"]].merging(write) { a, _ in a })
        return ["job": "chain", "operations": ops]
    }

    @Test(arguments: ["decode", "decode-png", "filter", "encode", "disk", "none"])
    func aFusedChainFailsAsItWouldUnfused(place: String) throws {
        var seen: [(result: [String: Any], ops: [String: String], journal: [Entry])] = []
        for unfused in [false, true] {
            let block: [String: Any] = ["argv": ["/bin/sh", "-c", "echo x > \"$0/../../album\"", "${workdir}"], "output": "none"]
            let s = try ImageSpool(extraConfig: ["image": ["maxPixels": 10_000_000], "commands": ["block": block]])
            let photo = try makeImage(width: 64, height: 48)
            let jpeg = try Codecs.encode(photo, format: "jpeg", quality: 90)
            let png = try Codecs.encode(photo, format: "png", quality: 90)
            try s.put("photo.jpg", jpeg)
            try s.put("truncated.jpg", jpeg.prefix(jpeg.count * 2 / 3))   // cut inside the scan
            try s.put("truncated.png", png.prefix(png.count - 30))        // cut inside IDAT
            let (result, ops) = try s.run(Self.manifest(place, unfused: unfused, s))
            seen.append((result, outcomes(ops, root: s.spool.root), operationEntries(s.lastLog, root: s.spool.root)))
        }
        let (fused, unfused) = (seen[0], seen[1])
        #expect(fused.result["status"] as? String == unfused.result["status"] as? String)
        #expect(fused.result["status"] as? String == (place == "none" ? "succeeded" : "failed"), "\(fused.result)")
        #expect(fused.ops == unfused.ops, "fused:\n\(fused.ops)\nunfused:\n\(unfused.ops)")
        #expect(fused.journal == unfused.journal, "fused:\n\(fused.journal)\nunfused:\n\(unfused.journal)")
        // Where each place fails, said of the operation whose stage it is.
        let failed = fused.ops.filter { $0.value.hasPrefix("failed") }.keys.sorted()
        let expected = ["decode": ["sepia"], "decode-png": ["sepia"], "filter": ["middle"], "encode": ["write"], "disk": ["write"],
                        "none": []]
        #expect(failed == expected[place], "\(fused.ops)")
        if place == "decode" { #expect(fused.ops["sepia"]?.contains("Premature end of JPEG file") == true, "\(fused.ops)") }
        if place.hasPrefix("decode") || place == "filter" {
            #expect(fused.ops["write"]?.hasPrefix("cancelled attempts 0 started false") == true)
        }
    }

    /// A fused operation is `executing` until its chain's end has run its stage; a cancel of it cancels that run.
    @Test func aFusedOperationIsExecutingUntilItsStageHasRun() throws {
        let s = try ImageSpool()
        let spool = s.spool
        try spool.start(["--config", spool.configPath])
        // A slow chain end: a blur of a big radius on a large image runs for seconds.
        try s.put("big.png", try Codecs.encode(try makeImage(width: 2400, height: 1600), format: "png", quality: 90))
        try spool.drop("slow.plist", ["job": "slow", "operations": [
            ["id": "in", "kind": "download", "url": s.url("big.png")],
            ["id": "sepia", "kind": "sepia", "dependencies": ["in"]],
            ["id": "blur", "kind": "blur", "radius": 100, "dependencies": ["sepia"]],
            ["id": "write", "kind": "write", "path": "out.png", "dependencies": ["blur"]],
        ]])
        var states: [String: String] = [:]
        for _ in 0..<500 {
            if let answer = try? ControlClient.request(spool.socketPath, ["command": "show", "job": "slow"], timeout: 5),
               let ops = answer["operations"] as? [[String: Any]] {
                states = Dictionary(uniqueKeysWithValues: ops.map { ($0["id"] as? String ?? "", $0["state"] as? String ?? "") })
                // Not just the end: with the disk busy, the end may still be writing after its stages have run.
                if ["sepia", "blur", "write"].allSatisfy({ states[$0] == "executing" }) { break }
            }
            usleep(20_000)
        }
        #expect(states["write"] == "executing" && states["sepia"] == "executing" && states["blur"] == "executing", "\(states)")
        let cancel = try spool.ctl(["cancel", "slow", "sepia"])
        #expect(cancel.status == 0, "\(cancel.stderr)")
        let result = try #require(spool.result("slow", timeout: 30))
        #expect(result["status"] as? String == "cancelled", "\(result)")
        let ops = Dictionary(uniqueKeysWithValues: (result["operations"] as? [[String: Any]] ?? []).map { ($0["id"] as? String ?? "", $0) })
        #expect(ops["in"]?["state"] as? String == "succeeded")
        for id in ["sepia", "blur", "write"] { #expect(ops[id]?["state"] as? String == "cancelled", "\(id): \(ops[id] ?? [:])") }
    }
}
