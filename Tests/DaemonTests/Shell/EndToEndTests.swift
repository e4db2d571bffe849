// End-to-end tests: the real opqueued and opqueuectl binaries on temporary spools, real files, real
// signals (SIGTERM, SIGHUP, SIGKILL), and a real journald for the journal test.

import Foundation
import Testing
import TestSupport
@testable import Daemon

/// The clone's root: two folders above Tests/Support (TestSupport's own file says where it is).
let repositoryRoot = URL(fileURLWithPath: supportFolder).deletingLastPathComponent().deletingLastPathComponent().path
let binaries = repositoryRoot + "/.build/debug"

struct Run {
    let status: Int32
    let stdout: String
    let stderr: String
}

/// Runs a program to its end (at most `timeout` seconds); `input`, when given, is its standard input.
@discardableResult
func run(_ program: String, _ arguments: [String], input: Data? = nil, timeout: Double = 30) throws -> Run {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: program.hasPrefix("/") ? program : binaries + "/" + program)
    process.arguments = arguments
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    let stdin = input.map { _ in Pipe() }
    if let stdin { process.standardInput = stdin }
    try process.run()
    if let input, let stdin {
        // From another thread: a program that answers before it has read everything must not block this one.
        Thread.detachNewThread {
            stdin.fileHandleForWriting.write(input)
            try? stdin.fileHandleForWriting.close()
        }
    }
    // Both pipes are drained on threads of their own, so that a program that hangs is killed at the deadline
    // (reading to the end first waited for it, and its test, for good).
    let outData = DrainedPipe(out), errData = DrainedPipe(err)
    let deadline = Date().addingTimeInterval(timeout)
    while process.isRunning && Date() < deadline { usleep(10_000) }
    if process.isRunning {
        process.terminate()
        usleep(200_000)
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
    process.waitUntilExit()
    // Children it left holding the pipes are not waited for past 5 s.
    return Run(status: process.terminationStatus, stdout: String(decoding: outData.data(waiting: 5), as: UTF8.self),
               stderr: String(decoding: errData.data(waiting: 5), as: UTF8.self))
}

/// A pipe read to its end on a thread of its own.
final class DrainedPipe: @unchecked Sendable {
    private let lock = NSLock()
    private var read = Data()
    private let done = DispatchSemaphore(value: 0)

    init(_ pipe: Pipe) {
        Thread.detachNewThread { [self] in
            let data = pipe.fileHandleForReading.readDataToEndOfFile()
            lock.withLock { read = data }
            done.signal()
        }
    }

    /// What was read, once the pipe ended or after `seconds` (then what was read by then: nothing).
    func data(waiting seconds: Double) -> Data {
        _ = done.wait(timeout: .now() + seconds)
        return lock.withLock { read }
    }
}

/// A temporary spool and, when started, a daemon on it.
final class TestSpool: @unchecked Sendable {
    let root: String
    var daemon: Process?
    var logPath: String { root + ".log" }
    /// The configuration `configure` writes (removed with the spool).
    var configPath: String { root + ".config.plist" }
    /// Variables added to the daemon's environment (internal settings, such as a smaller delayed window).
    var environment: [String: String] = [:]

    init() {
        root = NSTemporaryDirectory() + "opq-test-" + UUID().uuidString.prefix(8)
        try? FileManager.default.createDirectory(atPath: root + "/inbox", withIntermediateDirectories: true)
    }

    deinit {
        if let daemon, daemon.isRunning { kill(daemon.processIdentifier, SIGKILL); daemon.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: root)
        try? FileManager.default.removeItem(atPath: logPath)
        try? FileManager.default.removeItem(atPath: configPath)
    }

    /// Writes the daemon's configuration; returns the arguments that use it.
    @discardableResult
    func configure(_ settings: [String: Any]) throws -> [String] {
        try plist(settings).write(to: URL(fileURLWithPath: configPath))
        return ["--config", configPath]
    }

    /// Writes a manifest the way users should: a hidden name, then a rename into the inbox.
    func drop(_ name: String, _ manifest: Any) throws {
        let hidden = root + "/inbox/." + name
        try plist(manifest).write(to: URL(fileURLWithPath: hidden))
        guard rename(hidden, root + "/inbox/" + name) == 0 else { throw POSIXError(.EIO) }
    }

    /// Starts the daemon and waits until its control socket answers.
    func start(_ extra: [String] = [], target: String = "console") throws {
        try launch(extra, target: target)
        // Ready when the socket accepts connections.
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            if (try? ControlClient.request(root + "/opqueued.sock", ["command": "status"], timeout: 1)) != nil { return }
            usleep(20_000)
        }
        Issue.record("the daemon did not become ready")
    }

    /// Starts the daemon, its output appended to `logPath`, without waiting for it.
    func launch(_ extra: [String] = [], target: String = "console") throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binaries + "/opqueued")
        process.arguments = ["--spool", root, "--log-target", target] + extra
        if !environment.isEmpty { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        if !FileManager.default.fileExists(atPath: logPath) { _ = FileManager.default.createFile(atPath: logPath, contents: nil) }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        process.standardError = log
        process.standardOutput = log
        try process.run()
        daemon = process
    }

    func signal(_ sig: Int32) {
        if let daemon { kill(daemon.processIdentifier, sig) }
    }

    /// Waits for the daemon to exit; returns its status.
    func waitForExit(timeout: Double = 30) -> Int32? {
        guard let daemon else { return nil }
        let deadline = Date().addingTimeInterval(timeout)
        while daemon.isRunning && Date() < deadline { usleep(10_000) }
        if daemon.isRunning { return nil }
        return daemon.terminationStatus
    }

    func result(_ job: String, timeout: Double = 20) -> [String: Any]? {
        let path = root + "/outbox/" + job + "/result.plist"
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let data = FileManager.default.contents(atPath: path) {
                return try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any]
            }
            usleep(20_000)
        }
        return nil
    }

    func ctl(_ arguments: [String], input: Data? = nil) throws -> Run { try run("opqueuectl", ["--spool", root] + arguments, input: input) }

    func list(_ folder: String) -> [String] { ((try? FileManager.default.contentsOfDirectory(atPath: root + "/" + folder)) ?? []).filter { !$0.hasPrefix(".") }.sorted() }
}

func sleepOp(_ id: String, _ seconds: Double, deps: [String] = []) -> [String: Any] {
    ["id": id, "kind": "sleep", "seconds": seconds, "dependencies": deps]
}

@Suite(.serialized) struct EndToEndTests {
    @Test func onceRunsTheInboxAndEveryManifestEndsInTheOutbox() throws {
        let spool = TestSpool()
        try spool.drop("good.plist", ["job": "good", "metadata": ["owner": "ana", "n": 3],
                                      "operations": [sleepOp("a", 0.05), ["id": "b", "kind": "spin", "seconds": 0.05, "dependencies": ["a"]]]])
        try spool.drop("bad.plist", ["operations": [["id": "x", "kind": "teleport"]], "extra": 1])
        try Data("not a plist".utf8).write(to: URL(fileURLWithPath: spool.root + "/inbox/junk.plist"))
        try Data("notes".utf8).write(to: URL(fileURLWithPath: spool.root + "/inbox/README.txt"))
        try spool.drop("zdup.plist", ["job": "good", "operations": [sleepOp("a", 0)]])
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(spool.list("outbox") == ["bad", "good", "good.1", "junk"])
        #expect(spool.list("inbox") == ["README.txt"], "other files are left alone")
        #expect(spool.list("active").isEmpty)
        #expect(spool.list("tmp").isEmpty)

        let good = try #require(spool.result("good"))
        #expect(good["status"] as? String == "succeeded")
        #expect(good["manifest"] as? String == "good.plist")
        #expect((good["metadata"] as? [String: Any])?["owner"] as? String == "ana")
        let ops = try #require(good["operations"] as? [[String: Any]])
        #expect(ops.map { $0["id"] as? String } == ["a", "b"])
        #expect(ops.allSatisfy { $0["state"] as? String == "succeeded" && $0["attempts"] as? Int == 1 && $0["startedAt"] is Double })
        for key in ["receivedAt", "startedAt", "finishedAt", "durationSeconds"] { #expect(good[key] is Double, "\(key)") }
        #expect(good["requestedJob"] == nil)
        let original = try Data(contentsOf: URL(fileURLWithPath: spool.root + "/outbox/good/manifest.plist"))
        #expect(Manifest.requestedJob(in: original) == "good", "the original bytes are kept")

        let dup = try #require(spool.result("good.1"))
        #expect(dup["requestedJob"] as? String == "good")

        let bad = try #require(spool.result("bad"))
        #expect(bad["status"] as? String == "rejected")
        let error = bad["error"] as? String ?? ""
        #expect(error.contains("unknown key 'extra'") && error.contains("operation 'x': unknown kind 'teleport'"), "\(error)")
        #expect(spool.result("junk")?["status"] as? String == "rejected")
        #expect(r.stderr.contains("inbox/README.txt is not a manifest"))
    }

    @Test func failureCancellationAndRetriesInResults() throws {
        let spool = TestSpool()
        try spool.drop("f.plist", ["job": "f", "operations": [
            ["id": "flaky", "kind": "fail", "message": "disk on fire", "retries": 2, "retryDelaySeconds": 0.05],
            sleepOp("after", 0, deps: ["flaky"]),
            ["id": "cleanup", "kind": "sleep", "seconds": 0, "dependencies": ["flaky"], "runsAfterFailure": true],
            ["id": "slow", "kind": "spin", "seconds": 5, "timeoutSeconds": 0.2],
        ]])
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(r.status == 0)
        let result = try #require(spool.result("f"))
        #expect(result["status"] as? String == "failed")
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops[0]["state"] as? String == "failed")
        #expect(ops[0]["attempts"] as? Int == 3)
        #expect(ops[0]["error"] as? String == "disk on fire")
        #expect((ops[0]["durationSeconds"] as? Double ?? 0) >= 0.15, "includes the retry delays 0.05 + 0.1")
        #expect(ops[1]["state"] as? String == "cancelled")
        #expect(ops[1]["attempts"] as? Int == 0)
        #expect(ops[1]["startedAt"] == nil)
        #expect(ops[2]["state"] as? String == "succeeded")
        #expect(ops[3]["error"] as? String == "timed out after 0.2 s")
        #expect(r.stderr.contains("OPQ_STATE=retrying"))
    }

    @Test func aJobCancelledWhileItIsBeingAcceptedEndsCancelled() throws {
        // A job is known from its claim on, but reading and submitting 100,000 operations takes a while:
        // a cancel in that window must be kept and applied, not answered "already ended" and forgotten.
        let spool = TestSpool()
        try spool.start()
        let operations = [sleepOp("gate", 60)] + (0..<100_000).map { sleepOp("s\($0)", 0, deps: ["gate"]) }
        try spool.drop("big.plist", ["job": "big", "operations": operations])
        var answer: [String: Any] = [:]
        let deadline = Date().addingTimeInterval(30)
        repeat {
            answer = (try? ControlClient.request(spool.root + "/opqueued.sock", ["command": "cancel", "job": "big"], timeout: 5)) ?? [:]
        } while (answer["error"] as? String)?.hasPrefix("unknown job") != false && answer["exit"] as? Int != 0 && Date() < deadline
        let acceptedBefore = (try? String(contentsOfFile: spool.logPath, encoding: .utf8))?.contains("job big accepted") ?? true
        #expect(answer["exit"] as? Int == 0, "answered \(answer)")
        #expect(!acceptedBefore, "the cancel was meant to arrive while the job was being accepted")
        let result = try #require(spool.result("big", timeout: 60))
        #expect(result["status"] as? String == "cancelled")
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops.count == 100_001)
        #expect(ops.allSatisfy { $0["state"] as? String == "cancelled" })
    }

    /// `opqueuectl submit` validates as the daemon will: a queue of the daemon's configuration is no typo though the
    /// command names no --config (it was refused as unknown); without a daemon, --config or the built-ins alone.
    @Test func submitValidatesAgainstWhatTheRunningDaemonTakes() throws {
        let spool = TestSpool()
        try spool.start(try spool.configure(["queues": ["procs": ["maxConcurrentOperationCount": 2]]]))
        let manifest = spool.root + "/m.plist"
        func write(_ job: String, queue: String) throws {
            try plist(["job": job, "operations": [["id": "a", "kind": "sleep", "seconds": 0, "queue": queue]]]).write(to: URL(fileURLWithPath: manifest))
        }
        try write("mine", queue: "procs")
        let submitted = try spool.ctl(["submit", manifest])
        #expect(submitted.status == 0 && submitted.stdout == "mine\n", "\(submitted.stdout)\(submitted.stderr)")
        #expect(try spool.ctl(["wait", "mine", "--timeout", "10"]).status == 0)
        try write("typo", queue: "prcs")
        let typo = try spool.ctl(["submit", manifest])
        #expect(typo.status == 1 && typo.stderr.contains("unknown queue 'prcs'") && typo.stdout.isEmpty, "\(typo)")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        try write("alone", queue: "procs")
        let alone = try spool.ctl(["submit", manifest])
        #expect(alone.status == 1 && alone.stderr.contains("unknown queue 'procs'"), "no daemon, no --config: the built-ins: \(alone)")
    }

    @Test func daemonControlAndExitCodes() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("long.plist", ["job": "long", "operations": [sleepOp("a", 30), sleepOp("b", 0, deps: ["a"])]])
        // Claimed first: a look while the manifest is still in the inbox would say so at the timeout.
        #expect(eventually(10) { (try? ControlClient.request(spool.socketPath, ["command": "show", "job": "long"], timeout: 5))?["exit"] as? Int == 0 })
        let running = try spool.ctl(["wait", "long", "--timeout", "0.3"])
        #expect(running.status == 2)
        #expect(running.stderr == "opqueuectl: long: still not ended after 0.3 s\n")
        // An id nobody has seen is waited for too (it may be dropped later), but the timeout says it was never seen.
        let typo = try spool.ctl(["wait", "lnog", "--timeout", "0.3"])
        #expect(typo.status == 2)
        #expect(typo.stderr.contains("lnog: still not ended after 0.3 s (not seen yet: the daemon knows no job 'lnog'"), "\(typo.stderr)")
        // A manifest still being written is not claimed: the wait names the file it waits for.
        let writing = open(spool.root + "/inbox/later.plist", O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
        #expect(writing >= 0)
        let later = try spool.ctl(["wait", "later", "--timeout", "0.3"])
        #expect(later.stderr.contains("(not seen yet: inbox/later.plist waits to be claimed)"), "\(later.stderr)")
        close(writing)
        unlink(spool.root + "/inbox/later.plist")
        let status = try spool.ctl(["status", "--json"])
        #expect(status.status == 0)
        #expect(status.stdout.contains("\"long\""))
        #expect(try spool.ctl(["show", "long"]).stdout.contains("a  sleep  queue=default  executing"))
        #expect(try spool.ctl(["cancel", "long", "nosuch"]).status == 1)
        #expect(try spool.ctl(["cancel", "nosuch"]).status == 1)
        #expect(try spool.ctl(["suspend", "nosuch"]).status == 1)
        #expect(try spool.ctl(["frobnicate"]).status == 64)
        #expect(try spool.ctl(["cancel", "long"]).status == 0)
        let waited = try spool.ctl(["wait", "long", "--timeout", "10"])
        #expect(waited.status == 1)
        #expect(waited.stdout.contains("long: cancelled"))
        #expect(try spool.ctl(["cancel", "long"]).status == 1, "cancelling a job that has ended")
        #expect(try spool.ctl(["show", "long"]).stdout.contains("a  sleep  queue=default  cancelled"))
        #expect(try spool.ctl(["graph", "long"]).stdout.contains("\"a\" -> \"b\""))

        try spool.drop("ok.plist", ["job": "ok", "operations": [sleepOp("a", 0)]])
        #expect(try spool.ctl(["wait", "ok", "--timeout", "10"]).status == 0)
        // submit validates, then places atomically.
        let manifest = spool.root + "/m.plist"
        try plist(["job": "viactl", "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: manifest))
        let submitted = try spool.ctl(["submit", manifest])
        #expect(submitted.stdout == "viactl\n")
        #expect(try spool.ctl(["wait", "viactl", "--timeout", "10"]).status == 0)
        // Submitted again, the id it asks for is taken (outbox/viactl): submit prints the one the daemon gave, not the
        // one asked for (`wait viactl` answered at once, for the first job, while the second still ran).
        let resubmitted = try spool.ctl(["submit", manifest])
        #expect(resubmitted.status == 0 && resubmitted.stdout == "viactl.1\n", "\(resubmitted)")
        #expect(try spool.ctl(["wait", "viactl.1", "--timeout", "10"]).status == 0)
        try plist(["operations": [["id": "x"]]]).write(to: URL(fileURLWithPath: manifest))
        let invalid = try spool.ctl(["validate", manifest])
        #expect(invalid.status == 1)
        #expect(invalid.stdout == "\(manifest): operation 'x': kind is missing\n")
        // A file that cannot be a manifest says why, on stderr: stdout holds only the ids of what was submitted.
        let good = spool.root + "/good.plist"
        try plist(["job": "amidstrays", "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: good))
        let strays = try spool.ctl(["submit", spool.root + "/inbox", good, spool.root + "/nosuch.plist"])
        #expect(strays.status == 1)
        #expect(strays.stdout == "amidstrays\n", "\(strays.stdout)")
        #expect(strays.stderr == "\(spool.root)/inbox: cannot be read: a directory, not a manifest file\n\(spool.root)/nosuch.plist: cannot be read: No such file or directory\n",
                "\(strays.stderr)")
        #expect(try spool.ctl(["wait", "amidstrays", "--timeout", "10"]).status == 0)
        // A manifest without `job` gets the id its file's name gives, and submit prints that id (it printed the name
        // while the daemon, given `NAME.XXXXXXXX.plist`, made the id `NAME.XXXXXXXX`): wait finds each. Submitted
        // again while the first is still known, it gets a name of its own.
        let keyless = spool.root + "-no key.plist"
        try plist(["operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: keyless))
        defer { unlink(keyless) }
        let keylessID = (keyless as NSString).lastPathComponent.replacingOccurrences(of: " ", with: "_").replacingOccurrences(of: ".plist", with: "")
        let first = try spool.ctl(["submit", keyless])
        #expect(first.status == 0 && first.stdout == keylessID + "\n", "\(first)")
        #expect(try spool.ctl(["wait", keylessID, "--timeout", "10"]).status == 0)
        let second = try spool.ctl(["submit", keyless])
        let again = second.stdout.trimmingCharacters(in: .newlines)
        #expect(second.status == 0 && again.hasPrefix(keylessID + ".") && again != keylessID, "\(second)")
        #expect(try spool.ctl(["wait", again, "--timeout", "10"]).status == 0, "\(again)")
        // `-` is standard input (`generate | opqueuectl submit -`): read once; a manifest from it without `job` is
        // placed as stdin.plist. A pipe or device named by path is read too, never past the manifest limit.
        let piped = try spool.ctl(["submit", "-"], input: plist(["job": "piped", "operations": [sleepOp("a", 0)]]))
        #expect(piped.status == 0 && piped.stdout == "piped\n", "\(piped)")
        #expect(try spool.ctl(["wait", "piped", "--timeout", "10"]).status == 0)
        let unnamed = try spool.ctl(["submit", "-", "-"], input: plist(["operations": [sleepOp("a", 0)]]))
        #expect(unnamed.status == 1 && unnamed.stdout == "stdin\n", "\(unnamed)")
        #expect(unnamed.stderr == "-: cannot be read: standard input was read already (- may be named once)\n", "\(unnamed)")
        #expect(try spool.ctl(["wait", "stdin", "--timeout", "10"]).status == 0)
        let checked = try spool.ctl(["validate", "-"], input: plist(["operations": [["id": "x"]]]))
        #expect(checked.status == 1 && checked.stdout == "-: operation 'x': kind is missing\n", "\(checked)")
        let endless = try spool.ctl(["validate", "/dev/zero"])
        #expect(endless.status == 1 && endless.stdout.hasPrefix("/dev/zero: the manifest is larger than the limit"), "\(endless)")
        let drawn = try spool.ctl(["graph", "-"], input: plist(["job": "drawn", "operations": [sleepOp("a", 0), sleepOp("b", 0, deps: ["a"])]]))
        #expect(drawn.status == 0 && drawn.stdout.hasPrefix("digraph \"drawn\" {") && drawn.stdout.contains("\"a\" -> \"b\";"), "\(drawn)")
        // A keyless manifest's graph is named by its path, quoted for DOT whatever the path holds.
        let quoted = spool.root + "/say \"hi\".plist"
        try plist(["operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: quoted))
        let quotedGraph = try spool.ctl(["graph", quoted])
        #expect(quotedGraph.status == 0 && quotedGraph.stdout.hasPrefix("digraph \"\(spool.root)/say \\\"hi\\\".plist\" {"), "\(quotedGraph)")

        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        let stopped = try spool.ctl(["status"])
        #expect(stopped.status == 3 && stopped.stderr == "opqueuectl: no daemon is running on \(spool.root)/opqueued.sock (no socket)\n",
                "no daemon: \(stopped)")
        // A mistyped --spool says so, with the same exit status.
        for (wrong, why) in [(spool.root + "-typo", "there is no folder \(spool.root)-typo"), ("/etc/passwd", "there is no folder /etc/passwd"),
                             (spool.root + "/inbox", "\(spool.root)/inbox is not a spool: it has no inbox/")] {
            let mistyped = try run("opqueuectl", ["--spool", wrong, "status"])
            #expect(mistyped.status == 3 && mistyped.stderr.contains("(no socket\(why.hasPrefix("there") ? ": " : ", and ")\(why); is --spool right?)"),
                    "\(wrong): \(mistyped)")
        }
        #expect(try spool.ctl(["frobnicate"]).status == 64, "usage errors whether or not a daemon runs")
        let alone = try spool.ctl(["wait", "lnog", "--timeout", "0.3"])
        #expect(alone.status == 2, "wait reads the outbox, with or without a daemon")
        #expect(alone.stderr.contains("(no daemon answers at \(spool.root)/opqueued.sock)"), "\(alone.stderr)")
        // An id no job can have is refused at once (without --timeout it was waited for for ever).
        for impossible in ["", "../../etc", "a b", ".hidden", String(repeating: "x", count: 129)] {
            let never = try spool.ctl(["wait", impossible])
            #expect(never.status == 1 && never.stderr.contains("cannot be a job's id"), "\(impossible.debugDescription): \(never)")
            #expect(never.stderr.contains("gets the id") == (impossible == "a b" || impossible.count == 129), "\(impossible.debugDescription): \(never)")
        }
        // A manifest's file name given for its id: what id such a file gets, from the daemon's own rule.
        let named = try spool.ctl(["wait", "photo 1.plist"])
        #expect(named.status == 1 && named.stderr.hasSuffix("; a manifest file photo 1.plist without `job` gets the id 'photo_1'\n"), "\(named)")
        let plain = try spool.ctl(["wait", "inbox.plist", "--timeout", "0.2"])
        #expect(plain.status == 2 && plain.stderr.hasSuffix("; a manifest file inbox.plist without `job` gets the id 'inbox'\n"), "\(plain)")
    }

    @Test func killNineResumesWithoutRerunningWhatSucceeded() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("crash.plist", ["job": "crash", "operations": [sleepOp("first", 0.05), sleepOp("second", 2, deps: ["first"])]])
        // Wait until "first" has been recorded as succeeded.
        let progress = spool.root + "/active/.progress.log"
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline, !((try? String(contentsOfFile: progress, encoding: .utf8))?.hasPrefix("crash\tfirst\t") ?? false) { usleep(10_000) }
        let firstRecord = try String(contentsOfFile: progress, encoding: .utf8)
        spool.signal(SIGKILL)
        _ = spool.waitForExit()
        #expect(spool.list("active") == ["crash"])
        try spool.start()
        let result = try #require(spool.result("crash"))
        #expect(result["status"] as? String == "succeeded")
        let ops = try #require(result["operations"] as? [[String: Any]])
        let started = firstRecord.split(separator: "\t")[2]
        #expect(ops[0]["startedAt"] as? Double == micro(Double(started) ?? 0), "'first' kept its original run")
        #expect(ops[0]["attempts"] as? Int == 1)
        #expect(ops[1]["state"] as? String == "succeeded")
        #expect(spool.list("outbox") == ["crash"])
        #expect(spool.list("active").isEmpty)
        let log = try String(contentsOfFile: spool.logPath, encoding: .utf8)
        #expect(log.components(separatedBy: "OPQ_OPERATION=first OPQ_QOS=default OPQ_QUEUE=default OPQ_QUEUE_PRIORITY=normal OPQ_STATE=executing").count == 2,
                "'first' ran once, before the crash")
    }

    @Test func killNineAtRandomMomentsLosesAndDuplicatesNothing() throws {
        let spool = TestSpool()
        let jobs = 200
        for i in 0..<jobs {
            var ops: [[String: Any]] = [sleepOp("s", Double.random(in: 0...0.05))]
            ops.append(["id": "c", "kind": "spin", "seconds": 0.002, "dependencies": ["s"]])
            if i % 7 == 0 { ops.append(["id": "f", "kind": "fail", "dependencies": ["s"], "retries": 1, "retryDelaySeconds": 0.01]) }
            ops.append(["id": "end", "kind": "sleep", "seconds": 0, "dependencies": ["c"]])
            try spool.drop("job\(i).plist", ["job": "job\(i)", "operations": ops])
        }
        var kills = 0
        for _ in 0..<6 {
            try spool.start()
            usleep(UInt32.random(in: 50_000...400_000))
            spool.signal(SIGKILL)
            _ = spool.waitForExit()
            kills += 1
        }
        try spool.start()
        let deadline = Date().addingTimeInterval(120)
        while spool.list("outbox").count < jobs && Date() < deadline { usleep(50_000) }
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        let outbox = spool.list("outbox")
        #expect(outbox.count == jobs, "lost or duplicated: \(outbox.count) entries for \(jobs) jobs after \(kills) kills")
        #expect(Set(outbox) == Set((0..<jobs).map { "job\($0)" }), "no job renamed: each ended exactly once")
        #expect(spool.list("active").isEmpty)
        #expect(spool.list("tmp").isEmpty)
        #expect(spool.list("inbox").isEmpty)
        for i in 0..<jobs {
            let result = try #require(spool.result("job\(i)", timeout: 1))
            let ops = result["operations"] as? [[String: Any]] ?? []
            #expect(result["status"] as? String == (i % 7 == 0 ? "failed" : "succeeded"), "job\(i)")
            #expect(ops.count == (i % 7 == 0 ? 4 : 3))
            #expect(ops.allSatisfy { $0["state"] is String && $0["attempts"] is Int }, "job\(i)")
        }
    }

    /// Issue 5.3/5.6: what a submitter can put in the inbox besides a manifest — a symlink to a file
    /// elsewhere, a hard link to one, a FIFO, a folder, a name that is not UTF-8, a very long name —
    /// gets an answer and leads nowhere outside the spool; the control socket answers owner and group only.
    @Test func hostileInboxEntriesAndTheSocketsMode() throws {
        let spool = TestSpool()
        let outside = spool.root + ".outside"
        try Data("secret".utf8).write(to: URL(fileURLWithPath: outside))
        defer { try? FileManager.default.removeItem(atPath: outside) }
        let inbox = spool.root + "/inbox/"
        #expect(symlink(outside, inbox + "link.plist") == 0)
        #expect(link(outside, inbox + "hard.plist") == 0)
        #expect(mkfifo(inbox + "fifo.plist", 0o644) == 0)
        #expect(mkdir(inbox + "folder.plist", 0o755) == 0)
        let raw: [UInt8] = Array("bad".utf8) + [0xFF, 0xFE] + Array(".plist".utf8)
        let manifest = plist(["operations": [sleepOp("a", 0)]])
        // The name with invalid bytes is made from the raw bytes (a Swift String cannot hold them).
        let rawPath = (Array(inbox.utf8) + raw + [0]).map { CChar(bitPattern: $0) }
        try manifest.write(to: URL(fileURLWithPath: spool.root + "/inbox/.raw"))
        #expect(rename(spool.root + "/inbox/.raw", rawPath) == 0)
        let long = String(repeating: "L", count: 240) + ".plist"
        try spool.drop(long, ["operations": [sleepOp("a", 0)]])
        try spool.start()
        try spool.drop("after.plist", ["job": "after", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("after", timeout: 10)?["status"] as? String == "succeeded", "a FIFO or a folder in the inbox blocks nothing")
        let renamed = try #require(spool.result("bad__", timeout: 10), "the non-UTF-8 name was renamed and claimed")
        #expect(renamed["manifest"] as? String == "bad__.plist")
        let longID = String(repeating: "L", count: 128)
        #expect(spool.result(longID, timeout: 10)?["status"] as? String == "succeeded", "a long name gives a job id cut to 128")
        usleep(300_000)
        let inboxNow = spool.list("inbox")
        #expect(inboxNow == ["fifo.plist", "folder.plist", "hard.plist", "link.plist"], "left alone: \(inboxNow)")
        #expect(try String(contentsOfFile: outside, encoding: .utf8) == "secret")
        let log = try String(contentsOfFile: spool.logPath, encoding: .utf8)
        for name in ["link.plist", "hard.plist", "fifo.plist", "folder.plist"] {
            #expect(log.contains("inbox/\(name) cannot be claimed"), "\(name) is logged")
        }
        // Each says what it is, not the errno O_NOFOLLOW or the type check gave ("Too many levels of symbolic links").
        #expect(log.contains("inbox/hard.plist: the file has 2 hard links: one linked elsewhere is not handed over"))
        #expect(log.contains("inbox/link.plist: a symbolic link, which is not followed (move or copy the file itself here)"))
        #expect(log.contains("inbox/fifo.plist: a FIFO (named pipe), not a regular file"))
        #expect(log.contains("inbox/folder.plist: a folder, not a regular file"))
        #expect(!log.contains("symbolic links") && !log.contains("Invalid argument"))
        // None of them waits for anything: status does not count them as waiting.
        let waiting = try ControlClient.request(spool.root + "/opqueued.sock", ["command": "status"], timeout: 2)["waiting"] as? Int
        #expect(waiting == 0, "status counts \(waiting ?? -1) waiting for \(inboxNow)")

        // The socket: mode 0660; another user is refused, a member of its group is answered.
        var st = stat()
        #expect(stat(spool.root + "/opqueued.sock", &st) == 0 && st.st_mode & 0o777 == 0o660)
        chmod(spool.root, 0o755)
        let ctl = binaries + "/opqueuectl"
        let stranger = try run("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", ctl, "--spool", spool.root, "status"])
        #expect(stranger.status == 3, "another user: \(stranger.stderr)")
        #expect(stranger.stderr.contains("Permission denied"))
        let member = try run("/usr/bin/setpriv", ["--reuid=65534", "--regid=\(st.st_gid)", "--clear-groups", ctl, "--spool", spool.root, "status"])
        #expect(member.status == 0, "the socket's group: \(member.stderr)")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
    }

    /// huge0 … huge7 (2 GiB each) rejected by their size, and the daemon's peak memory where it was.
    func expectHugeFilesRejectedUnread(_ spool: TestSpool, pid: Int32) {
        for i in 0..<8 {
            let result = spool.result("huge\(i)", timeout: 20)
            #expect(result?["status"] as? String == "rejected")
            #expect((result?["error"] as? String)?.contains("the manifest is 2147483648 bytes; the limit is 268435456 bytes (256 MiB)") == true,
                    "\(result?["error"] ?? "no result")")
        }
        let peak = processMemoryMB(pid)
        #expect(peak > 0 && peak < 150, "peak RSS \(peak) MB")
    }

    /// Files far bigger than a manifest may be (sparse: 2 GiB each, costing no disk) are rejected by their size,
    /// which the error gives, without being read: eight of them at once leave the daemon's peak memory where it
    /// was (it read 256 MiB of each, and held several at once: 1.6 GB).
    @Test func anInboxOfHugeFilesIsRejectedWithoutReadingThem() throws {
        let spool = TestSpool()
        try spool.start()
        let pid = try #require(spool.daemon?.processIdentifier)
        let inbox = spool.root + "/inbox/"
        for i in 0..<8 {
            let hidden = inbox + ".huge\(i).plist"
            let fd = creat(hidden, 0o644)
            #expect(fd >= 0 && ftruncate(fd, 2 << 30) == 0)
            close(fd)  // a file still open for writing is left for its writer to finish
            #expect(rename(hidden, inbox + "huge\(i).plist") == 0)
        }
        expectHugeFilesRejectedUnread(spool, pid: pid)
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
    }

    /// The same files left in active/ by a crash between their claim and their rejection (what a kill -9 at that
    /// moment leaves: the folder, its record, the file renamed in) are rejected at recovery by their size, unread:
    /// recovery read 256 MiB of each and held them all at once.
    @Test func hugeFilesLeftInActiveByACrashAreRejectedUnreadAtRecovery() throws {
        let spool = TestSpool()
        try spool.start()
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        for i in 0..<8 {
            let dir = spool.root + "/active/huge\(i)"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            let record = try PropertyListSerialization.data(fromPropertyList: ["manifest": "huge\(i).plist", "receivedAt": 1.0e9],
                                                            format: .xml, options: 0)
            try record.write(to: URL(fileURLWithPath: dir + "/job.plist"))
            let fd = creat(dir + "/manifest.plist", 0o644)
            #expect(fd >= 0 && ftruncate(fd, 2 << 30) == 0)
            close(fd)
        }
        try spool.start()
        let pid = try #require(spool.daemon?.processIdentifier)
        expectHugeFilesRejectedUnread(spool, pid: pid)
        #expect(spool.list("active").isEmpty)
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
    }

    @Test func sigtermDrainsAndUnfinishedJobsResume() throws {
        let spool = TestSpool()
        // Both executing when the stop comes (a fixed pause before it lost the race on a loaded machine): `quick`
        // ends within the grace and is published, `slow` does not and stays in active/.
        let config = try spool.configure(["shutdownGraceSeconds": 2.5])
        try spool.start(config)
        try spool.drop("quick.plist", ["job": "quick", "operations": [sleepOp("a", 0.8)]])
        try spool.drop("slow.plist", ["job": "slow", "operations": [sleepOp("a", 4)]])
        #expect(eventually(10) { ["quick", "slow"].allSatisfy { (try? spool.ctl(["show", $0]).stdout.contains("executing")) == true } })
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 10) == 0)
        #expect(spool.list("outbox") == ["quick"])
        #expect(spool.list("active") == ["slow"], "the unfinished job stays in active/")
        try spool.start(config)
        #expect(spool.result("slow", timeout: 15)?["status"] as? String == "succeeded")
        let log = try String(contentsOfFile: spool.logPath, encoding: .utf8)
        #expect(log.contains("OPQ_EVENT=daemon OPQ_STATE=stopping"))
    }

    @Test func sigtermRightAfterReadyIsAGracefulStop() throws {
        // Ready (the socket answers) means SIGTERM is already the service group's: stopped at once, the daemon
        // exits 0, never by the signal's default action (the crash campaign met this as an exit of 143).
        let spool = TestSpool()
        for _ in 0..<8 {
            try spool.start()
            spool.signal(SIGTERM)
            #expect(spool.waitForExit(timeout: 20) == 0)
            #expect(spool.daemon?.terminationReason == .exit)
        }
    }

    /// Starts the daemon held inside its start by a FIFO configuration, sends `signal` then, and lets the start go
    /// on (the FIFO is the configuration path only while starting; removed after).
    private func signalWhileStarting(_ spool: TestSpool, _ signal: Int32) throws {
        let fifo = spool.root + ".config"
        unlink(fifo)
        #expect(mkfifo(fifo, 0o600) == 0)
        defer { unlink(fifo) }
        try spool.launch(["--config", fifo])
        // open(2) for writing returns once the daemon has opened the FIFO for reading: it is starting.
        let writer = open(fifo, O_WRONLY)
        #expect(writer >= 0)
        spool.signal(signal)
        usleep(100_000)
        let config = plist(["shutdownGraceSeconds": 1])
        // (A daemon the signal ended has no reader left: writing would raise SIGPIPE here.)
        if spool.daemon?.isRunning == true { _ = config.withUnsafeBytes { write(writer, $0.baseAddress, $0.count) } }
        close(writer)
    }

    @Test func sigtermWhileStartingIsAGracefulStop() throws {
        // The configuration is a FIFO: the daemon is held inside its start, before the service group exists,
        // until the test writes it. A SIGTERM sent then is noted and honoured once the group has the signal:
        // exit 0 without announcing readiness, never the signal's default action.
        let spool = TestSpool()
        try signalWhileStarting(spool, SIGTERM)
        let status = spool.waitForExit(timeout: 30)
        let log = (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? ""
        #expect(spool.daemon?.terminationReason == .exit, "ended by signal \(status.map(String.init) ?? "?")")
        #expect(status == 0)
        #expect(log.contains("came while starting: stopping without becoming ready"), "\(log)")
        #expect(!log.contains("OPQ_STATE=ready"))
        #expect(log.components(separatedBy: "OPQ_STATE=stopping").count == 2, "one stopping event")
    }

    /// A SIGHUP while the daemon starts (held by a FIFO configuration, as above) is noted, not the end of the
    /// process (its default action, before): the daemon becomes ready and reloads once.
    @Test func sighupWhileStartingIsAReloadNotTheEnd() throws {
        let spool = TestSpool()
        try signalWhileStarting(spool, SIGHUP)
        let log = { (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? "" }
        #expect(eventually(20) { log().contains("OPQ_STATE=ready") && log().contains("OPQ_STATE=reloading") }, "\(log())")
        #expect(spool.daemon?.isRunning == true, "not ended by the signal")
        #expect(log().components(separatedBy: "OPQ_STATE=reloading").count == 2, "one reload")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 20) == 0)
    }

    /// SIGUSR1 and SIGUSR2 (`kill -USR1`, a log-rotation habit from other daemons) mean nothing to opqueued: logged
    /// and ignored, while starting and while work runs. Their default action ended the daemon at once, without a word.
    @Test func sigusr1AndSigusr2AreLoggedAndIgnored() throws {
        let spool = TestSpool()
        try signalWhileStarting(spool, SIGUSR1)
        let log = { (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? "" }
        #expect(eventually(20) { log().contains("OPQ_STATE=ready") && log().contains("SIGUSR1 means nothing to opqueued and is ignored") },
                "\(log())")
        #expect(spool.daemon?.isRunning == true, "not ended by SIGUSR1 while starting")

        try spool.drop("held.plist", ["job": "held", "operations": [sleepOp("a", 30)]])
        #expect(eventually(10) { (try? spool.ctl(["show", "held"]).stdout.contains("executing")) == true })
        for _ in 0..<50 {
            spool.signal(SIGUSR2)
            spool.signal(SIGUSR1)
        }
        #expect(eventually(10) { log().contains("SIGUSR2 means nothing to opqueued and is ignored") }, "\(log())")
        #expect(spool.daemon?.isRunning == true, "not ended by SIGUSR1 or SIGUSR2")
        #expect(try spool.ctl(["show", "held"]).stdout.contains("executing"), "the job runs on")
        #expect(try spool.ctl(["cancel", "held"]).status == 0)
        #expect(spool.result("held")?["status"] as? String == "cancelled")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 20) == 0)
    }

    /// Started with standard input, output and error closed (`opqueued … <&- >&- 2>&-`, a careless supervisor), the
    /// daemon's descriptors 0-2 are /dev/null: before, they were the runtime's epoll, eventfd and timerfd, and what
    /// opened next in their place (the spool lock, the progress log, the control socket) would have received log
    /// lines. The same for opqueuectl, whose control connection would have taken descriptor 1 and had its answer
    /// printed back into it.
    @Test func closedStandardDescriptorsAreDevNullNotTheNextFileOpened() throws {
        let spool = TestSpool()
        let shell = Process()
        shell.executableURL = URL(fileURLWithPath: "/bin/sh")
        shell.arguments = ["-c", "exec \"$0\" --spool \"$1\" --log-target console <&- >&- 2>&-", binaries + "/opqueued", spool.root]
        try shell.run()
        spool.daemon = shell
        #expect(eventually(20) { (try? spool.ctl(["status"]).status) == 0 })
        func standard(_ pid: Int32) -> [String] {
            (0...2).map { fd in
                var buffer = [CChar](repeating: 0, count: 256)
                let n = readlink("/proc/\(pid)/fd/\(fd)", &buffer, 255)
                return n < 0 ? "closed" : String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            }
        }
        #expect(standard(shell.processIdentifier) == ["/dev/null", "/dev/null", "/dev/null"])
        try spool.drop("one.plist", ["job": "one", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("one")?["status"] as? String == "succeeded")
        for file in ["opqueued.lock", "active/.progress.log"] {
            let text = (try? String(contentsOfFile: spool.root + "/" + file, encoding: .utf8)) ?? ""
            #expect(!text.contains("PRIORITY="), "no log line in \(file)")
        }

        let waiting = Process()
        waiting.executableURL = URL(fileURLWithPath: "/bin/sh")
        waiting.arguments = ["-c", "exec \"$0\" --spool \"$1\" wait never --timeout 5 <&- >&- 2>&-", binaries + "/opqueuectl", spool.root]
        try waiting.run()
        var seen: [String] = []
        #expect(eventually(4) {
            seen = standard(waiting.processIdentifier)
            return seen == ["/dev/null", "/dev/null", "/dev/null"]
        }, "opqueuectl's descriptors 0-2: \(seen)")
        waiting.waitUntilExit()
        #expect(waiting.terminationStatus == 2, "wait --timeout ran out, as it says")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 20) == 0)
    }

    @Test func sighupReloadsQueueSettingsForRunningWork() throws {
        let spool = TestSpool()
        try spool.start(try spool.configure(["queues": ["default": ["suspended": true]]]))
        try spool.drop("held.plist", ["job": "held", "operations": [sleepOp("a", 0)]])
        usleep(500_000)
        #expect(try spool.ctl(["show", "held"]).stdout.contains("a  sleep  queue=default  ready"))
        try spool.configure(["queues": ["default": ["suspended": false]]])
        spool.signal(SIGHUP)
        #expect(spool.result("held")?["status"] as? String == "succeeded")
        let log = try String(contentsOfFile: spool.logPath, encoding: .utf8)
        #expect(log.contains("OPQ_EVENT=daemon OPQ_STATE=reloading"))
        #expect(log.contains("OPQ_EVENT=queue OPQ_QUEUE=default OPQ_STATE=resumed"))
    }

    /// An operator's `suspend` (a queue stopped for maintenance) or `resume` stands through a reload made for another
    /// reason — a reload resumed the queue, without a word in the journal — until the configuration changes that
    /// queue's `suspended`, which then wins and is logged.
    @Test func anOperatorsSuspensionStandsThroughAReloadForAnotherReason() throws {
        let spool = TestSpool()
        try spool.start(try spool.configure(["queues": ["io": ["maxConcurrentOperationCount": 2], "default": ["suspended": true]]]))
        let log = { (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? "" }
        let reloads = { log().components(separatedBy: "OPQ_EVENT=daemon OPQ_STATE=ready").count - 1 }
        func reload(_ settings: [String: Any]) throws {
            let before = reloads()
            try spool.configure(settings)
            spool.signal(SIGHUP)
            #expect(eventually(10) { reloads() > before }, "reloaded")
        }
        func suspended(_ queue: String) throws -> Bool? {
            let status = try spool.ctl(["status", "--json"]).stdout
            let queues = (try JSONSerialization.jsonObject(with: Data(status.utf8)) as? [String: Any])?["queues"] as? [[String: Any]]
            return queues?.first { $0["name"] as? String == queue }?["suspended"] as? Bool
        }
        #expect(try spool.ctl(["suspend", "io"]).status == 0)
        #expect(try spool.ctl(["resume", "default"]).status == 0)
        // Another setting changes: both stand, and nothing is logged for either.
        try reload(["queues": ["io": ["maxConcurrentOperationCount": 3], "default": ["suspended": true]]])
        #expect(try suspended("io") == true, "a reload for a limit resumed the queue suspended by hand")
        #expect(try suspended("default") == false, "a reload for a limit suspended again the queue resumed by hand")
        #expect(log().components(separatedBy: "OPQ_QUEUE=io OPQ_STATE=resumed").count == 1)
        // The configuration says otherwise for a queue: it wins, and the change is logged.
        try reload(["queues": ["io": ["maxConcurrentOperationCount": 3, "suspended": true], "default": ["suspended": false]]])
        #expect(try suspended("io") == true && suspended("default") == false)
        try reload(["queues": ["io": ["maxConcurrentOperationCount": 3, "suspended": false], "default": ["suspended": false]]])
        #expect(try suspended("io") == false)
        #expect(eventually(5) { log().contains("OPQ_EVENT=queue OPQ_QUEUE=io OPQ_STATE=resumed") })
        try spool.drop("after.plist", ["job": "after", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("after")?["status"] as? String == "succeeded")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 20) == 0)
    }

    /// A reload of a configuration file replaced by a FIFO no one writes (or by a directory): refused at once, said
    /// why; the next reload and SIGTERM still work (the FIFO's open used to block the reload, and every signal after
    /// it, for good).
    @Test func sighupOfAConfigurationThatIsAFIFOIsRefusedAndSignalsStillWork() throws {
        let spool = TestSpool()
        try spool.start(try spool.configure([:]))
        unlink(spool.configPath)
        #expect(mkfifo(spool.configPath, 0o600) == 0)
        spool.signal(SIGHUP)
        let log = { (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? "" }
        #expect(eventually(10) { log().contains("not a regular file (a pipe or FIFO is read only at start)") })
        unlink(spool.configPath)
        try spool.configure(["queues": ["default": ["suspended": true]]])
        spool.signal(SIGHUP)
        #expect(eventually(10) { log().contains("OPQ_EVENT=queue OPQ_QUEUE=default OPQ_STATE=suspended") })
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 20) == 0)
        // An endless configuration is refused at start, not read until memory runs out.
        let endless = try run("opqueued", ["--spool", spool.root, "--config", "/dev/zero", "--log-target", "console"])
        #expect(endless.status == 1 && (endless.stdout + endless.stderr).contains("/dev/zero: larger than 16777216 bytes"), "\(endless)")
    }

    /// A careless reload: `cluster` added to a running spool-only daemon's configuration (with a sharedOutbox and a
    /// suspension beside it). The whole reload is refused and said so; the daemon goes on as it started: its jobs
    /// run on the unsuspended queue and land in its own outbox, none in the shared one.
    @Test func sighupThatAddsClusterIsRefusedWhole() throws {
        let spool = TestSpool()
        try spool.start(try spool.configure([:]))
        let shared = spool.root + "-shared"
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: shared) }
        try spool.configure([
            "cluster": ["database": "postgresql://opq@127.0.0.1:1/jobs?sslmode=disable", "node": "n1", "sharedOutbox": shared],
            "queues": ["default": ["suspended": true]],
        ])
        spool.signal(SIGHUP)
        // The reload is over (refused or applied) once a second `ready` follows it: only then is the job dropped.
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline,
              ((try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? "").components(separatedBy: "OPQ_STATE=ready").count < 3 {
            usleep(20_000)
        }
        try spool.drop("after.plist", ["job": "after", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("after")?["status"] as? String == "succeeded", "the queue was not suspended: nothing was applied")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: shared))?.isEmpty == true)
        let log = try String(contentsOfFile: spool.logPath, encoding: .utf8)
        #expect(log.contains("the configuration was not reloaded: adding 'cluster' takes a restart"), "\(log)")
        #expect(!log.contains("OPQ_STATE=suspended"))
        #expect(spool.daemon?.isRunning == true)
    }

    @Test func claimingPausesWhileTheActiveJobsHoldTheOperationBudget() throws {
        let spool = TestSpool()
        try spool.start(try spool.configure(["maxActiveOperations": 2]))
        for k in 0..<3 {
            try spool.drop("b\(k).plist", ["job": "b\(k)", "operations": [sleepOp("a", 0.3), sleepOp("b", 0.3, deps: ["a"])]])
        }
        usleep(300_000)
        let status = try ControlClient.request(spool.root + "/opqueued.sock", ["command": "status"], timeout: 5)
        #expect(status["operations"] as? Int == 2 && status["maxActiveOperations"] as? Int == 2, "\(status)")
        #expect((status["activeJobs"] as? [String])?.count == 1, "one job holds the whole budget")
        #expect(try spool.ctl(["status"]).stdout.contains("operations in active jobs: 2 of 2 (claiming paused until some end)"))
        // One after the other: each job is claimed only once the one before it has ended.
        let results = (0..<3).compactMap { spool.result("b\($0)") }
        #expect(results.count == 3 && results.allSatisfy { $0["status"] as? String == "succeeded" })
        let spans = results.compactMap { r -> (Double, Double)? in
            guard let received = r["receivedAt"] as? Double, let finished = r["finishedAt"] as? Double else { return nil }
            return (received, finished)
        }.sorted { $0.0 < $1.0 }
        #expect(spans.count == 3)
        for k in 1..<spans.count { #expect(spans[k].0 >= spans[k - 1].1, "job \(k) was claimed before the one before it ended") }
    }

    /// A manifest asking for the id of a job that is ending (its folder already renamed into outbox/ and taken away
    /// from there by the user, its end not yet announced) gets an id of its own and runs: it is never taken for the
    /// job that is ending (it was, and got no answer at all).
    @Test func aJobAskingForTheIdOfOneEndingRunsUnderItsOwnId() throws {
        let spool = TestSpool()
        try spool.start()
        let count = 400
        // A user who takes every answer away as soon as it is complete, as the fuzz campaign does.
        final class Answers: @unchecked Sendable { var manifests: [String] = []; var done = false; let lock = NSLock() }
        let answers = Answers()
        let outbox = spool.root + "/outbox"
        let reader = Thread {
            while !answers.lock.withLock({ answers.done }) {
                for entry in (try? FileManager.default.contentsOfDirectory(atPath: outbox)) ?? [] where !entry.hasPrefix(".") {
                    guard let data = FileManager.default.contents(atPath: outbox + "/" + entry + "/result.plist"),
                          let result = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any],
                          let manifest = result["manifest"] as? String else { continue }
                    answers.lock.withLock { answers.manifests.append(manifest) }
                    try? FileManager.default.removeItem(atPath: outbox + "/" + entry)
                }
                usleep(200)
            }
        }
        reader.start()
        defer { answers.lock.withLock { answers.done = true } }
        for k in 0..<count {
            let operations: [[String: Any]] = k % 2 == 0 ? [["id": "x", "kind": "teleport"]] : [sleepOp("a", 0)]
            try spool.drop("t\(k).plist", ["job": "twin", "operations": operations])
            usleep(UInt32.random(in: 0...2_000))
        }
        let deadline = Date().addingTimeInterval(60)
        while answers.lock.withLock({ answers.manifests.count }) < count && Date() < deadline { usleep(50_000) }
        usleep(200_000)
        let got = answers.lock.withLock { answers.manifests }
        #expect(got.count == count && Set(got) == Set((0..<count).map { "t\($0).plist" }),
                "\(got.count) answers for \(count) manifests; left in active/: \(spool.list("active"))")
        #expect(spool.list("active").isEmpty && spool.list("inbox").isEmpty)
    }

    /// A user makes outbox/<job> while that job runs: it is left as it is, the job's entry becomes outbox/<job>.1
    /// (said in the log), and the daemon goes on (it used to take the refused rename for a spool fault and pause
    /// claiming for good).
    @Test func anOutboxNameTakenWhileTheJobRunsIsLeftAloneAndTheJobPublishedBesideIt() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("x.plist", ["job": "x", "operations": [sleepOp("a", 0.6)]])
        let deadline = Date().addingTimeInterval(10)
        while !spool.list("active").contains("x") && Date() < deadline { usleep(10_000) }
        try FileManager.default.createDirectory(atPath: spool.root + "/outbox/x", withIntermediateDirectories: true)
        try Data("mine".utf8).write(to: URL(fileURLWithPath: spool.root + "/outbox/x/notes.txt"))
        let result = try #require(spool.result("x.1"))
        #expect(result["job"] as? String == "x" && result["status"] as? String == "succeeded")
        #expect(try String(contentsOfFile: spool.root + "/outbox/x/notes.txt", encoding: .utf8) == "mine")
        #expect(spool.list("outbox/x") == ["notes.txt"])
        let wait = try spool.ctl(["wait", "x", "--timeout", "5"])
        #expect(wait.status == 0 && wait.stdout == "x: succeeded\n", "\(wait)")
        #expect(try spool.ctl(["show", "x"]).stdout.hasPrefix("job x: succeeded"))
        try spool.drop("y.plist", ["job": "y", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("y")?["status"] as? String == "succeeded", "claiming goes on")
        let status = try spool.ctl(["status"]).stdout
        #expect(!status.contains("paused"), "\(status)")
        let log = (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? ""
        #expect(log.contains("outbox/x was taken by something else") && log.contains("the job's entry is \(spool.root)/outbox/x.1"))
    }

    /// A user removes active/<job> while the job runs: the job ends `failed`, saying why, in an outbox entry holding
    /// its manifest (from memory), and the daemon goes on (it used to wait for the folder for good, claiming paused).
    @Test func aJobWhoseFolderIsRemovedWhileItRunsEndsFailedAndTheDaemonGoesOn() throws {
        let spool = TestSpool()
        try spool.start()
        let manifest: [String: Any] = ["job": "gone", "operations": [sleepOp("a", 0.6)]]
        try spool.drop("gone.plist", manifest)
        let deadline = Date().addingTimeInterval(10)
        while !spool.list("active").contains("gone") && Date() < deadline { usleep(10_000) }
        usleep(100_000)
        try FileManager.default.removeItem(atPath: spool.root + "/active/gone")
        let result = try #require(spool.result("gone"))
        #expect(result["status"] as? String == "failed")
        #expect((result["error"] as? String ?? "").contains("active/gone was removed while the job ran"), "\(result)")
        let bytes = plist(manifest)
        #expect(FileManager.default.contents(atPath: spool.root + "/outbox/gone/manifest.plist") == bytes)
        try spool.drop("next.plist", ["job": "next", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("next")?["status"] as? String == "succeeded", "claiming goes on")
        let status = try spool.ctl(["status"]).stdout
        #expect(!status.contains("paused"), "\(status)")
    }

    /// A user removes the outbox, then the inbox, while the daemon runs: each is made again (a warning says so), the
    /// next manifests end in the outbox, and one dropped into the inbox made again is claimed (its watch added again).
    @Test func spoolFoldersRemovedWhileTheDaemonRunsAreMadeAgain() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("first.plist", ["job": "first", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("first") != nil)
        try FileManager.default.removeItem(atPath: spool.root + "/outbox")
        try spool.drop("second.plist", ["job": "second", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("second", timeout: 30)?["status"] as? String == "succeeded", "published once outbox/ is made again")

        try FileManager.default.removeItem(atPath: spool.root + "/inbox")
        let deadline = Date().addingTimeInterval(30)
        while !FileManager.default.fileExists(atPath: spool.root + "/inbox") && Date() < deadline { usleep(50_000) }
        #expect(FileManager.default.fileExists(atPath: spool.root + "/inbox"), "inbox/ made again")
        usleep(2_500_000)  // past a timer tick of the watcher, which watches the new folder from then on
        let dropped = Date()
        try spool.drop("third.plist", ["job": "third", "operations": [sleepOp("a", 0)]])
        let third = spool.result("third", timeout: 30)
        #expect(third?["status"] as? String == "succeeded")
        let claimedAfter = (third?["receivedAt"] as? Double ?? .infinity) - dropped.timeIntervalSince1970
        #expect(claimedAfter < 0.8, "claimed \(claimedAfter) s after the drop: by the watch, not by the next rescan (2 s)")
        let log = (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? ""
        #expect(log.contains("outbox/ was missing from the spool (removed while the daemon ran): made again"))
        #expect(log.contains("inbox/ was missing from the spool (removed while the daemon ran): made again"))
        let status = try spool.ctl(["status"]).stdout
        #expect(!status.contains("paused"), "\(status)")
    }

    /// A user replaces the inbox while the daemon runs — `mv inbox inbox.old; mkdir inbox`, or `rm -rf inbox; mkdir
    /// inbox` — and the new folder is watched at once: each manifest dropped into it is claimed by its inotify event,
    /// not by the next rescan (the watch stayed on the old folder, or on none, so every pickup waited up to 2 s, for
    /// as long as the daemon ran). What is dropped into the folder moved away is not the inbox's: never claimed.
    @Test func anInboxReplacedWhileTheDaemonRunsIsWatchedAtOnce() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("first.plist", ["job": "first", "operations": [sleepOp("a", 0)]])
        #expect(spool.result("first") != nil)
        let inbox = spool.root + "/inbox"
        // Seconds from each drop to its claim, three drops in turn (a rescan every 2 s could catch one by chance,
        // not three: after a claim by a rescan, the next drop waits for the next).
        func pickups(_ tag: String) throws -> [Double] {
            try (0..<3).map { i in
                let job = "\(tag)\(i)"
                let dropped = Date().timeIntervalSince1970
                try spool.drop(job + ".plist", ["job": job, "operations": [sleepOp("a", 0)]])
                return (spool.result(job, timeout: 10)?["receivedAt"] as? Double ?? .infinity) - dropped
            }
        }
        #expect(rename(inbox, spool.root + "/inbox.old") == 0 && mkdir(inbox, 0o755) == 0)
        let moved = try pickups("moved")
        #expect(moved.allSatisfy { $0 < 0.8 }, "claimed \(moved) s after each drop into the inbox made after the old one was moved away")
        try FileManager.default.removeItem(atPath: inbox)
        #expect(mkdir(inbox, 0o755) == 0)
        let remade = try pickups("remade")
        #expect(remade.allSatisfy { $0 < 0.8 }, "claimed \(remade) s after each drop into the inbox removed and made again")
        try plist(["job": "stray", "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: spool.root + "/inbox.old/stray.plist"))
        usleep(2_500_000)  // past a rescan
        #expect(!FileManager.default.fileExists(atPath: spool.root + "/outbox/stray"))
        #expect(FileManager.default.fileExists(atPath: spool.root + "/inbox.old/stray.plist"))
    }

    /// A careless clean-up removes the control socket, then puts a file in its place: the daemon listens again
    /// within seconds, each time, and says so (it used to go on unreachable: opqueuectl said no daemon ran).
    @Test func aControlSocketRemovedWhileTheDaemonRunsIsMadeAgain() throws {
        let spool = TestSpool()
        try spool.start()
        let socket = spool.root + "/opqueued.sock"
        unlink(socket)
        #expect(try spool.ctl(["status"]).status == 3)
        #expect(eventually(10) { (try? spool.ctl(["status"]).status) == 0 }, "listening again")
        unlink(socket)
        try Data("x".utf8).write(to: URL(fileURLWithPath: socket))
        #expect(eventually(10) { (try? spool.ctl(["status"]).status) == 0 }, "a file in its place is replaced")
        // The line is logged just after the socket is listening again: a status may be answered before it is written.
        let log = { (try? String(contentsOfFile: spool.logPath, encoding: .utf8)) ?? "" }
        #expect(eventually(5) { log().components(separatedBy: "opqueued.sock was removed or replaced while the daemon ran: listening on it again").count == 3 },
                "\(log())")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit(timeout: 20) == 0)
        #expect(!FileManager.default.fileExists(atPath: socket), "removed at stop")
    }

    /// active/ is the daemon's, but what someone put there by hand is not deleted at recovery: a manifest file (it
    /// belongs in inbox/) and a folder of someone's files without a manifest stay, each named in an error; the
    /// leftovers of a claim a crash interrupted (an empty folder, or one holding only its job.plist record) go.
    @Test func whatSomeoneLeftInActiveIsNotDeleted() throws {
        let spool = TestSpool()
        let active = spool.root + "/active"
        try FileManager.default.createDirectory(atPath: active + "/notes", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: active + "/interrupted", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: active + "/recorded", withIntermediateDirectories: true)
        try plist(["job": "misplaced", "operations": [sleepOp("a", 0)]]).write(to: URL(fileURLWithPath: active + "/misplaced.plist"))
        try Data("mine".utf8).write(to: URL(fileURLWithPath: active + "/notes/todo.txt"))
        try plist(["manifest": "recorded.plist", "receivedAt": 1.7e9]).write(to: URL(fileURLWithPath: active + "/recorded/job.plist"))
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"])
        #expect(r.status == 0, "\(r)")
        #expect(r.stderr.contains("active/misplaced.plist is not a job folder (the daemon's are folders); left in place — manifests go into inbox/"), "\(r.stderr)")
        #expect(r.stderr.contains("active/notes/ has no manifest.plist but holds todo.txt: not a job the daemon claimed; left in place"), "\(r.stderr)")
        #expect(FileManager.default.fileExists(atPath: active + "/misplaced.plist"))
        #expect((try? String(contentsOfFile: active + "/notes/todo.txt", encoding: .utf8)) == "mine")
        #expect(!FileManager.default.fileExists(atPath: active + "/interrupted") && !FileManager.default.fileExists(atPath: active + "/recorded"))
        #expect(spool.list("outbox").isEmpty, "none of them was taken for a job")
    }

    /// One daemon per spool: a second one exits 1 saying so — also after a careless clean-up removed the lock file.
    @Test func aSecondDaemonOnTheSameSpoolIsRefusedEvenWithoutTheLockFile() throws {
        let spool = TestSpool()
        try spool.start()
        let second = try run("opqueued", ["--spool", spool.root, "--log-target", "console"], timeout: 20)
        #expect(second.status == 1 && (second.stdout + second.stderr).contains("another opqueued holds the lock on"), "\(second)")
        unlink(spool.root + "/opqueued.lock")
        let third = try run("opqueued", ["--spool", spool.root, "--log-target", "console"], timeout: 20)
        #expect(third.status == 1 && (third.stdout + third.stderr).contains("another opqueued holds the lock on \(spool.root)"), "\(third)")
        #expect(try spool.ctl(["status"]).status == 0, "the first one goes on")
    }

    /// An inbox that is a link to another file system: refused at start, saying which folders and why (every claim
    /// used to fail with EXDEV, pausing and resuming claims every few seconds for good).
    @Test func aSpoolSpreadOverTwoMountsIsRefusedAtStart() throws {
        let spool = TestSpool()
        let elsewhere = "/dev/shm/opq-test-inbox-\(UInt64.random(in: 1...UInt64.max))"
        try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: elsewhere) }
        try FileManager.default.removeItem(atPath: spool.root + "/inbox")
        #expect(symlink(elsewhere, spool.root + "/inbox") == 0)
        var a = stat(), b = stat()
        #expect(stat(elsewhere, &a) == 0 && stat(spool.root, &b) == 0 && a.st_dev != b.st_dev, "/dev/shm is another file system here")
        let r = try run("opqueued", ["--spool", spool.root, "--log-target", "console"], timeout: 20)
        #expect(r.status == 1)
        #expect((r.stdout + r.stderr).contains("inbox/ and active/ are on different mounts (a rename between them fails: Invalid cross-device link); the whole spool must be on one mount"),
                "\(r)")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: elsewhere)) ?? ["?"]).isEmpty, "the check leaves nothing behind")
    }

    /// A stopped daemon is told apart from none: the client says no daemon answers (connected, no answer), not that
    /// none runs; once continued it answers.
    @Test func aStoppedDaemonIsNotCalledAbsent() throws {
        let spool = TestSpool()
        try spool.start()
        spool.signal(SIGSTOP)
        defer { spool.signal(SIGCONT) }
        // Stopped once /proc says so (every thread stops as the kernel next runs it: on a busy machine, not at once).
        let pid = spool.daemon?.processIdentifier ?? 0
        #expect(eventually(10) {
            let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
            return stat.split(separator: ")").last?.split(separator: " ").first == "T"
        }, "the daemon is stopped")
        let socket = spool.root + "/opqueued.sock"
        #expect {
            _ = try ControlClient.request(socket, ["command": "status"], timeout: 1)
        } throws: { error in
            "\(error)" == "no daemon answers on \(socket) (connected, but no answer within 1 s: is it stopped (SIGSTOP) or hung?)"
        }
        spool.signal(SIGCONT)
        #expect((try? ControlClient.request(socket, ["command": "status"], timeout: 5)) != nil)
    }

    /// From the moment its manifest leaves the inbox to its end, `show` knows the job: while the daemon reads a big
    /// manifest (its claim's commit and the reading of its batch come first) it says the job runs and has no
    /// operation yet, never "unknown job" (`wait` right after a drop said "the daemon knows no job").
    @Test func aClaimedJobIsNeverUnknownWhileItsManifestIsRead() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("big.plist", ["job": "big", "operations": (0..<20_000).map { sleepOp("o\($0)", 0) }])
        var unknown: [String] = []
        var starting = false
        let deadline = Date().addingTimeInterval(120)
        while Date() < deadline {
            let inInbox = FileManager.default.fileExists(atPath: spool.root + "/inbox/big.plist")
            let answer = try? ControlClient.request(spool.socketPath, ["command": "show", "job": "big"], timeout: 10)
            let published = FileManager.default.fileExists(atPath: spool.root + "/outbox/big/result.plist")
            if published { break }
            if !inInbox, answer?["exit"] as? Int != 0 { unknown.append("\(String(describing: answer))") }
            if answer?["starting"] as? Bool == true {
                starting = true
                #expect(answer?["status"] as? String == "running" && (answer?["operations"] as? [Any])?.isEmpty == true, "\(String(describing: answer))")
            }
            usleep(2_000)
        }
        #expect(spool.result("big")?["status"] as? String == "succeeded")
        #expect(unknown.count == 0, "after its claim the job was called unknown \(unknown.count) times: \(unknown.prefix(2))")
        #expect(starting, "the manifest's reading was seen (20,000 operations)")
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
            case .silent: expected = "no daemon answers on \(socket) (connected, but no answer within 1 s: is it stopped (SIGSTOP) or hung?)"
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
        #expect(status.status == 3 && status.stderr.contains("is not an opqueued daemon (its answer is not a JSON object: \"not json\")"), "\(status)")
    }

    @Test func journalTellsEveryOperationsStoryInOrder() throws {
        try ensureJournald()
        let spool = TestSpool()
        let job = "journal-" + UUID().uuidString.prefix(8)
        try spool.drop("j.plist", ["job": job, "operations": [sleepOp("a", 0), sleepOp("b", 0, deps: ["a"]), ["id": "c", "kind": "spin", "seconds": 0.01, "dependencies": ["a"]]]])
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

/// A real journald: the machine's, or one started here (root only), as DEVELOPERS' recipe does.
struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}


/// A Unix-socket server that is not opqueued: each connection is handed to `serve` on a thread of its own, then closed.
final class Impostor: @unchecked Sendable {
    private let fd: Int32
    private let lock = NSLock()
    private var stopped = false

    init(path: String, serve: @escaping @Sendable (Int32) -> Void) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        let bound = try withUnixAddress(path) { [fd] in bind(fd, $0, $1) }
        guard bound == 0, listen(fd, 8) == 0 else { close(fd); throw POSIXError(.EADDRINUSE) }
        let listening = fd
        Thread.detachNewThread { [self] in
            while true {
                let client = accept(listening, nil, nil)
                guard client >= 0 else { return }
                if lock.withLock({ stopped }) { close(client); return }
                Thread.detachNewThread {
                    serve(client)
                    close(client)
                }
            }
        }
    }

    func stop() {
        lock.withLock { stopped = true }
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }
}
