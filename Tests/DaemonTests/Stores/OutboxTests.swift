// The outbox's reading and pruning on their own (Stores/Outbox.swift), with no daemon: entries from result.plist's
// top-level keys, the sweep's criteria and its removal through tmp/, the claim's next free id; and the pieces the
// operator's commands stand on: outbox.keepDays in the configuration, times as written (TimeText), retry's manifest.

import Foundation
import PropertyList
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel
import TestTraits

/// A temporary spool's outbox and tmp/, removed at the end.
final class TemporaryOutbox {
    let root = NSTemporaryDirectory() + "opq-outbox-" + UUID().uuidString.prefix(8)
    var outbox: String { root + "/outbox" }
    var tmp: String { root + "/tmp" }

    init() throws {
        try FileManager.default.createDirectory(atPath: outbox, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: root) }

    var names: [String] { ((try? FileManager.default.contentsOfDirectory(atPath: outbox)) ?? []).sorted() }
}

@Suite(.onItsOwnExecutor) struct OutboxTests {
    @Test func readsEntriesAndPassesOverWhatIsNoJob() throws {
        let box = try TemporaryOutbox()
        try writeEndedJob(outbox: box.outbox, job: "a", status: "failed", finishedAt: 100.25, durationSeconds: 2, node: "n1")
        try writeEndedJob(outbox: box.outbox, job: "b", status: "rejected", finishedAt: 50, durationSeconds: nil)
        // outbox/a.1 holds job `a` (outbox/a was taken as it ended).
        try writeEndedJob(outbox: box.outbox, job: "a.1", finishedAt: 60)
        let renamed = box.outbox + "/a.1/result.plist"
        try String(contentsOfFile: renamed, encoding: .utf8).replacingOccurrences(of: "<string>a.1</string>", with: "<string>a</string>")
            .write(toFile: renamed, atomically: true, encoding: .utf8)
        try FileManager.default.createDirectory(atPath: box.outbox + "/someones", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: box.outbox + "/.tmp/x", withIntermediateDirectories: true)
        try Data("x".utf8).write(to: URL(fileURLWithPath: box.outbox + "/stray.txt"))
        try FileManager.default.createSymbolicLink(atPath: box.outbox + "/link", withDestinationPath: box.outbox + "/a")

        let reader = try OutboxReader(box.outbox)
        var entries: [String: OutboxEntry] = [:], problems: [String] = []
        while let next = reader.next() {
            switch next {
            case .success(let entry): entries[entry.name] = entry
            case .failure(let problem): problems.append(problem.description)
            }
        }
        #expect(Set(entries.keys) == ["a", "b", "a.1"])
        #expect(entries["a"] == OutboxEntry(name: "a", job: "a", status: "failed", node: "n1", finishedAt: 100.25, durationSeconds: 2))
        #expect(entries["b"]?.durationSeconds == nil && entries["b"]?.status == "rejected")
        #expect(entries["a.1"]?.job == "a")
        #expect(problems.count == 1 && problems[0].contains("someones/result.plist") && problems[0].contains("No such file"), "\(problems)")
        #expect(Outbox.entry("b", in: box.outbox).flatMap { try? $0.get() }?.finishedAt == 50)
        #expect(Outbox.entry("none", in: box.outbox) == nil)
        #expect(Outbox.requestedID(ofEntry: box.outbox + "/a.1") == "a")
    }

    @Test func sweepRemovesExactlyWhatMatchesThroughTmp() throws {
        let box = try TemporaryOutbox()
        for (job, status, finished) in [("old-ok", "succeeded", 10.0), ("old-failed", "failed", 20), ("new", "succeeded", 1_000)] {
            try writeEndedJob(outbox: box.outbox, job: job, status: status, finishedAt: finished)
        }
        try FileManager.default.createDirectory(atPath: box.outbox + "/someones", withIntermediateDirectories: true)
        func sweep(_ criteria: OutboxSweep.Criteria, dryRun: Bool = false, limit: Int = .max) throws -> [String] {
            let sweep = try OutboxSweep(outbox: box.outbox, tmp: box.tmp, criteria: criteria, dryRun: dryRun)
            var removed: [String] = []
            while sweep.step(limit: limit, report: { if case .removed(let entry) = $0 { removed.append(entry.name) } }) {}
            return removed.sorted()
        }
        #expect(try sweep(.init(cutoff: 500), dryRun: true) == ["old-failed", "old-ok"])
        #expect(box.names == ["new", "old-failed", "old-ok", "someones"], "a dry run removes nothing")
        #expect(try sweep(.init(cutoff: 500, statuses: ["failed"]), limit: 1) == ["old-failed"])
        #expect(try sweep(.init(cutoff: 500)) == ["old-ok"])
        #expect(box.names == ["new", "someones"])
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: box.tmp)) ?? []).isEmpty, "nothing is left in tmp/")
        #expect(try sweep(.init(cutoff: 500)) == [])
        // Gone already (another sweep took it): not counted, no error.
        #expect(try Outbox.remove("old-ok", from: box.outbox, through: box.tmp) == false)
        #expect(throws: OutboxProblem.self) { try OutboxSweep(outbox: box.root + "/nowhere", tmp: box.tmp, criteria: .init(cutoff: 0)) }
    }

    @Test func claimIDsAndTheNextFreeOne() throws {
        let box = try TemporaryOutbox()
        try FileManager.default.createDirectory(atPath: box.root + "/active/r.2", withIntermediateDirectories: true)
        #expect(Array(Spool.claimIDs("r").prefix(3)) == ["r", "r.1", "r.2"])
        #expect(Spool.nextFreeID("r", root: box.root) == "r")
        try writeEndedJob(outbox: box.outbox, job: "r", finishedAt: 1)
        try writeEndedJob(outbox: box.outbox, job: "r.1", finishedAt: 1)
        #expect(Spool.nextFreeID("r", root: box.root) == "r.3", "r.2 is active")
    }

    @Test func keepDaysInTheConfiguration() throws {
        func parse(_ settings: [String: Any]) throws -> Configuration {
            try Configuration.parse(try PropertyListSerialization.data(fromPropertyList: settings, format: .xml, options: 0))
        }
        #expect(try parse([:]).outboxKeepDays == nil)
        #expect(try parse(["outbox": ["keepDays": 14]]).outboxKeepDays == 14)
        #expect(try parse(["outbox": ["keepDays": 0.5]]).outboxKeepDays == 0.5)
        for bad: Any in [0, -1, "x", 40_000] {
            #expect {
                try parse(["outbox": ["keepDays": bad]])
            } throws: { error in
                "\(error)".contains("outbox.keepDays: must be more than 0 days")
            }
        }
        #expect(throws: Configuration.Invalid.self) { try parse(["outbox": ["keep": 1]]) }
        #expect(throws: Configuration.Invalid.self) { try parse(["outbox": 14]) }
        // In a cluster it bounds the database's history too, unless keepFinishedDays says otherwise.
        let database = "postgresql://opqueued@localhost/opqueued"
        let cluster = try parse(["outbox": ["keepDays": 3], "cluster": ["database": database, "node": "n1"]])
        #expect(cluster.cluster?.keepFinishedDays == 3)
        let own = try parse(["outbox": ["keepDays": 3], "cluster": ["database": database, "node": "n1", "keepFinishedDays": 9]])
        #expect(own.cluster?.keepFinishedDays == 9)
        let unset = try parse(["cluster": ["database": database, "node": "n1"]])
        #expect(unset.cluster?.keepFinishedDays == ClusterSettings.defaultKeepFinishedDays)
    }

    @Test func timesAsWritten() {
        let t = 1_795_831_200.0  // 2026-11-28T02:00:00Z
        for (text, expected) in [("2026-11-28T02:00:00Z", t), ("2026-11-28T03:00:00+01:00", t), ("2026-11-27T21:00:00-0500", t),
                                 ("2026-11-28T02:00Z", t), ("2026-11-28T02:00:00.25Z", t + 0.25), ("2026-11-28T04:00+02", t),
                                 ("@1795831200", t), ("@1795831200.5", t + 0.5), ("@0", 0), ("2024-02-29T00:00:00Z", 1_709_164_800)] {
            #expect(TimeText.parse(text) == expected, "\(text)")
        }
        for text in ["2026-11-28T02:00:00", "2026-11-28", "yesterday", "@", "@1e9", "2026-13-01T00:00:00Z", "2025-02-29T00:00:00Z",
                     "2026-11-28T24:00:00Z", "2026-11-28T02:00:00+25:00", "2026-11-28T02:00:00Zjunk", "2026-11-28T02:00:00."] {
            #expect(TimeText.parse(text) == nil, "\(text)")
        }
        let shown = TimeText.local(t)
        #expect(shown.wholeMatch(of: /\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d\d:\d\d/) != nil, "\(shown)")
    }

    @Test func retryTakesTheManifestUnderTheRenameRule() throws {
        let plain = try PropertyListSerialization.data(fromPropertyList: ["job": "a", "operations": []], format: .xml, options: 0)
        #expect(Manifest.forRetry(plain) == plain, "a manifest without ifJobExists is submitted as it is")
        let renames = try PropertyListSerialization.data(fromPropertyList: ["job": "a", "ifJobExists": "rename"], format: .binary,
                                                         options: 0)
        #expect(Manifest.forRetry(renames) == renames)
        for format in [PropertyListSerialization.PropertyListFormat.xml, .binary] {
            let skips = try PropertyListSerialization.data(fromPropertyList: ["job": "a", "ifJobExists": "skip", "metadata": ["k": 1]],
                                                           format: format, options: 0)
            let retried = Manifest.forRetry(skips)
            let object = try PropertyListSerialization.propertyList(from: retried, format: nil) as? [String: Any]
            #expect(object?["ifJobExists"] == nil && object?["job"] as? String == "a" && (object?["metadata"] as? [String: Int])?["k"] == 1)
            #expect(retried.starts(with: Array("bplist".utf8)) == (format == .binary), "kept in its own format")
        }
        #expect(Manifest.forRetry(Data("junk".utf8)) == Data("junk".utf8))
    }
}
