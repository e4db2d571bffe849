// The real daemon's control socket and journal: a claimed job is never unknown, a client facing something else
// on the socket says what and keeps its deadline, and the journal tells every operation's story in order.

import ControlPlane
import Foundation
import SystemdJournal
import Testing
import TestSupport
@testable import Daemon

extension EndToEndTests {
    /// From the moment its manifest leaves the inbox to its end, `show` knows the job: while the daemon reads a big
    /// manifest (its claim's commit and the reading of its batch come first) it says the job runs and has no
    /// operation yet, never "unknown job" (`wait` right after a drop said "the daemon knows no job").
    @Test func aClaimedJobIsNeverUnknownWhileItsManifestIsRead() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("big.plist", ["job": "big", "operations": (0..<20_000).map { sleepOp("o\($0)", 0) }])
        var unknown: [String] = []
        var starting = false
        // A request that timed out (a loaded 2-core machine reading 20,000 operations in a debug build) is no answer,
        // not "unknown job"; answers must still come.
        var answered = 0
        let deadline = Date().addingTimeInterval(120)
        while Date() < deadline {
            let inInbox = FileManager.default.fileExists(atPath: spool.root + "/inbox/big.plist")
            let answer = try? ControlClient.request(spool.socketPath, ["command": "show", "job": "big"], timeout: 10)
            let published = FileManager.default.fileExists(atPath: spool.root + "/outbox/big/result.plist")
            if published { break }
            if let answer { answered += 1; if !inInbox, answer["exit"] as? Int != 0 { unknown.append("\(answer)") } }
            if answer?["starting"] as? Bool == true {
                starting = true
                #expect(answer?["status"] as? String == "running" && (answer?["operations"] as? [Any])?.isEmpty == true,
                        "\(String(describing: answer))")
            }
            usleep(2_000)
        }
        #expect(spool.result("big")?["status"] as? String == "succeeded")
        #expect(unknown.count == 0, "after its claim the job was called unknown \(unknown.count) times: \(unknown.prefix(2))")
        #expect(starting, "the manifest's reading was seen (20,000 operations)")
        #expect(answered > 0)
        let shown = try spool.ctl(["show", "big"])
        #expect(shown.status == 0 && shown.stdout.hasPrefix("job big: succeeded"), "\(shown.stdout.prefix(200))")
        // A cancel in that moment is not "unknown job": it is applied as the job is received, and none of its
        // operations starts.
        try spool.drop("big2.plist", ["job": "big2", "operations": (0..<20_000).map { sleepOp("o\($0)", 0) }])
        var cancel: [String: Any]?
        while Date() < deadline, spool.result("big2", timeout: 0) == nil {
            let inInbox = FileManager.default.fileExists(atPath: spool.root + "/inbox/big2.plist")
            if !inInbox {
                cancel = try? ControlClient.request(spool.socketPath, ["command": "cancel", "job": "big2"], timeout: 10)
                break
            }
            usleep(1_000)
        }
        #expect(cancel?["exit"] as? Int == 0, "cancel right after the claim: \(String(describing: cancel))")
        let result = spool.result("big2", timeout: 60)
        #expect(result?["status"] as? String == "cancelled", "\(String(describing: result?["status"]))")
        let started = (result?["operations"] as? [[String: Any]] ?? []).filter { $0["startedAt"] != nil }.count
        #expect(started == 0, "\(started) operations started")
    }

    /// Something else on the control socket (a stale path reused by another program, a hung or hostile peer): the
    /// client says what it met, within its deadline, whatever the peer sends or withholds: silence, a trickle of
    /// bytes that never ends a line, 65 MiB without a newline, a line that is not JSON, an immediate hang-up.
    @Test func aClientFacingSomethingElseOnTheSocketSaysWhatAndKeepsItsDeadline() throws {
        let spool = TestSpool()
        let socket = spool.root + "/opqueued.sock"
        enum Peer: CaseIterable { case silent, trickle, endless, garbage, hangUp }
        for peer in Peer.allCases {
            unlink(socket)
            let listener = try Impostor(path: socket) { fd in
                switch peer {
                case .silent: usleep(3_000_000)
                case .trickle: for _ in 0..<30 where send(fd, "x", 1, Int32(MSG_NOSIGNAL)) == 1 { usleep(100_000) }
                case .endless:
                    let block = [UInt8](repeating: UInt8(ascii: "{"), count: 1 << 20)
                    for _ in 0..<65 { try? sendAll(fd, block, path: socket) }
                    usleep(3_000_000)
                case .garbage: try? sendAll(fd, Array("\u{0}\u{FF}HTTP/1.1 400 Bad Request\r\n\n".utf8), path: socket)
                case .hangUp: break
                }
            }
            defer { listener.stop() }
            let asked = Date()
            var said = ""
            do {
                // 64 MiB take a debug build's client longer than a second to read: its limit is checked with more time.
                _ = try ControlClient.request(socket, ["command": "status"], timeout: peer == .endless ? 20 : 1)
                said = "an answer"
            } catch {
                said = "\(error)"
            }
            let seconds = Date().timeIntervalSince(asked)
            #expect(seconds < (peer == .endless ? 21 : 2.5), "\(peer): the client took \(seconds) s, past its deadline")
            let expected: String
            switch peer {
            case .silent:
                expected = "no daemon answers on \(socket) (connected, but no answer within 1 s: is it stopped (SIGSTOP) or hung?)"
            case .trickle: expected = "its answer did not end within 1 s"
            case .endless: expected = "what answers on \(socket) is not an opqueued daemon (its answer goes on past 64 MiB without ending)"
            case .garbage: expected = "what answers on \(socket) is not an opqueued daemon (its answer is not a JSON object: "
            case .hangUp: expected = "no daemon answers on \(socket) (connected, but the connection"
            }
            #expect(said.contains(expected), "\(peer): \(said)")
        }
        // opqueuectl says the same and exits 3.
        unlink(socket)
        let listener = try Impostor(path: socket) { fd in try? sendAll(fd, Array("not json\n".utf8), path: socket) }
        defer { listener.stop() }
        let status = try spool.ctl(["status"])
        #expect(status.status == 3 && status.stderr.contains("is not an opqueued daemon (its answer is not a JSON object: \"not json\")"),
                "\(status)")
    }

    @Test func journalTellsEveryOperationsStoryInOrder() throws {
        try ensureJournald()
        let spool = TestSpool()
        let job = "journal-" + UUID().uuidString.prefix(8)
        try spool.drop("j.plist",
                       ["job": job,
                        "operations": [sleepOp("a", 0), sleepOp("b", 0, deps: ["a"]),
                                       ["id": "c", "kind": "spin", "seconds": 0.01, "dependencies": ["a"]]]])
        #expect(try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "journal"]).status == 0)
        var entries: [[String: Any]] = []
        let deadline = Date().addingTimeInterval(10)
        repeat {
            usleep(100_000)
            let out = try run("/usr/bin/journalctl", ["-t", "opqueued", "OPQ_JOB=\(job)", "-o", "json", "--no-pager"]).stdout
            entries = out.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        } while entries.last?["OPQ_STATE"] as? String != "finished" && Date() < deadline
        for op in ["a", "b", "c"] {
            let story = entries.filter { $0["OPQ_OPERATION"] as? String == op }
            #expect(story.compactMap { $0["OPQ_STATE"] as? String } == ["pending", "ready", "executing", "succeeded"], "\(op)")
            let end = try #require(story.last)
            #expect(end["OPQ_KIND"] as? String == (op == "c" ? "spin" : "sleep"))
            #expect(end["OPQ_QUEUE"] as? String == "default")
            #expect(end["OPQ_QOS"] as? String == "default")
            #expect(end["OPQ_QUEUE_PRIORITY"] as? String == "normal")
            #expect(end["OPQ_ATTEMPT"] as? String == "1")
            #expect(Int(end["OPQ_DURATION_USEC"] as? String ?? "") != nil)
            #expect(end["PRIORITY"] as? String == "6")
            #expect(end["MESSAGE_ID"] as? String == MessageIDs.id(event: "operation", state: "succeeded"))
            #expect(end["CODE_FILE"] as? String != nil && end["CODE_LINE"] as? String != nil && end["CODE_FUNC"] as? String != nil)
        }
        #expect(entries.first?["OPQ_STATE"] as? String == "received")
        #expect(entries.last?["OPQ_STATUS"] as? String == "succeeded")
    }
}
