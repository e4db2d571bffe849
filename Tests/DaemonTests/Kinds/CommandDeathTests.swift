// A command's processes die with the daemon that started them (issue 17, SPEC §8): the command watchdog
// (CommandWatchdog.swift, Sources/CShims/watchdog.c) with real processes and real signals — kill -9 of a
// real daemon while a command's shell has a grandchild, a normal stop, the watchdog's kill deadline (set,
// passed, renewed, cleared) on a watchdog of the test's own — and OPQ_NODE on both journal targets.

import CShims
import Foundation
import Logging
import Testing
import TestSupport
@testable import Daemon
@testable import OperationKinds
@testable import SystemdJournal
import SystemCalls
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// Live (not zombie) processes whose process group is `pgid`.
func liveProcesses(inGroup pgid: Int32) -> [Int32] {
    ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { entry in
        guard let pid = Int32(entry), let stat = statFields(pid), stat.fields.count > 2 else { return nil }
        return Int32(stat.fields[2]) == pgid && stat.fields[0] != "Z" ? pid : nil
    }
}

/// The command watchdogs a daemon started (its children named opq-watchdog), zombies left out.
func watchdogs(of daemon: Int32) -> [Int32] {
    ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { entry in
        guard let pid = Int32(entry), let stat = statFields(pid), stat.comm == "opq-watchdog", stat.fields.count > 1 else { return nil }
        return Int32(stat.fields[1]) == daemon && stat.fields[0] != "Z" ? pid : nil
    }
}

/// A process's group and parent; nil when it is gone.
func processGroup(of pid: Int32) -> Int32? {
    statFields(pid).flatMap { $0.fields.count > 2 ? Int32($0.fields[2]) : nil }
}

func parent(of pid: Int32) -> Int32? {
    statFields(pid).flatMap { $0.fields.count > 1 ? Int32($0.fields[1]) : nil }
}

/// Whether `pid` is gone or a zombie.
func ended(_ pid: Int32) -> Bool {
    guard let stat = statFields(pid) else { return true }
    return stat.fields.first == "Z"
}

/// Polls `condition` every 20 ms for up to `seconds`; whether it came true.
func waitUntil(_ seconds: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(20_000)
    }
    return condition()
}

/// `sh -c 'sleep 300 & sleep 300'` in a process group of its own (as the daemon starts commands); returns
/// the group (its leader's pid) and the leader's pidfd.
private func shellWithGrandchild() throws -> (pgid: pid_t, pidfd: Int32) {
    var pid: pid_t = -1, pidfd: Int32 = -1
    let rc = withCStrings(["/bin/sh", "-c", "sleep 300 & sleep 300"]) { argv in
        withCStrings(["PATH=/usr/bin:/bin"]) { env in opq_spawn("/bin/sh", argv, env, nil, -1, -1, &pid, &pidfd) }
    }
    guard rc == 0 else { throw SupportFailure("cannot start sh: \(String(cString: strerror(-rc)))") }
    // Both sleeps started (the shell and its two children in the group).
    _ = waitUntil(5) { liveProcesses(inGroup: pid).count >= 3 }
    return (pid, pidfd)
}

/// Kills what is left of the group and reaps its leader.
private func reap(_ group: (pgid: pid_t, pidfd: Int32)) {
    kill(-group.pgid, SIGKILL)
    close(group.pidfd)
    var status: Int32 = 0
    _ = waitpid(group.pgid, &status, 0)
}

/// Waits for a watchdog of the test's own to exit (it is the test's child).
private func exited(_ watchdog: CommandWatchdog, within seconds: Double) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    var status: Int32 = 0
    while Date() < deadline {
        if waitpid(watchdog.pid, &status, WNOHANG) == watchdog.pid { return true }
        usleep(20_000)
    }
    return false
}

/// A command whose shell writes its pid to `${mark}`, then waits on a sleep with another beside it.
private func forever() -> [String: Any] {
    ["argv": ["/bin/sh", "-c", "echo $$ > \"$1\"; sleep 300 & sleep 300", "sh", "${mark}"], "parameters": ["mark": "string"]]
}

/// Runs `forever` as job f in the running daemon of `spool`; its process group once its shell has written `mark`.
private func runForever(_ spool: TestSpool, mark: String) throws -> Int32 {
    try spool.drop("f.plist",
                   ["job": "f", "operations": [["id": "f", "kind": "command", "command": "forever", "arguments": ["mark": mark]]]])
    #expect(waitUntil(10) { (try? String(contentsOfFile: mark, encoding: .utf8))?.hasSuffix("\n") == true })
    let shell = try #require(
        Int32((try? String(contentsOfFile: mark, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""))
    return try #require(processGroup(of: shell))
}

@Suite(.serialized, .onItsOwnExecutor) struct CommandDeathTests {
    @Test func killNineOfTheDaemonKillsTheCommandsWholeGroupWithinTwoSeconds() throws {
        let spool = TestSpool()
        let mark = spool.root + ".pgid"
        defer { unlink(mark) }
        let config = try spool.configure(["commands": [
            "forever": forever(),
        ]])
        try spool.start(config)
        let daemon = try #require(spool.daemon?.processIdentifier)
        #expect(watchdogs(of: daemon).count == 1, "one watchdog per daemon")
        let pgid = try runForever(spool, mark: mark)
        #expect(waitUntil(5) { liveProcesses(inGroup: pgid).count >= 4 },
                "the supervisor, the shell and both sleeps: \(liveProcesses(inGroup: pgid))")
        let watchdog = try #require(watchdogs(of: daemon).first)
        // A daemon frozen by SIGSTOP does not freeze its watchdog (a process, session and group of its own).
        #expect(spool.freeze())
        #expect(statFields(watchdog)?.fields.first == "S",
                "the watchdog still runs: \(String(describing: statFields(watchdog)?.fields.first))")
        spool.signal(SIGCONT)
        spool.signal(SIGKILL)
        _ = spool.waitForExit()
        #expect(waitUntil(2) { liveProcesses(inGroup: pgid).isEmpty },
                "nothing of the group outlives the daemon: \(liveProcesses(inGroup: pgid))")
        #expect(waitUntil(2) { ended(watchdog) }, "the watchdog exits once it has killed")
        // The next start finds nothing to kill and runs the operation again.
        kill(-pgid, SIGKILL)
    }

    /// A supervisor that serves one command after another stays known to the watchdog: with the daemon frozen and the
    /// reused supervisor killed (neither can end the command), kill -9 of the daemon still ends the command's group, by
    /// the watchdog alone.
    @Test func aReusedSupervisorsGroupIsKilledByTheWatchdogWhenTheDaemonDies() throws {
        let spool = TestSpool()
        let mark = spool.root + ".shell"
        defer { unlink(mark) }
        let config = try spool.configure(["commands": [
            "parent": ["argv": ["/bin/sh", "-c", "echo $PPID"], "output": "stdout"],
            "forever": forever(),
        ]])
        try spool.start(config)
        // The first command starts directly and has spares made; the next four, one after another, use every spare.
        var operations: [[String: Any]] = [["id": "w0", "kind": "command", "command": "parent"], sleepOp("pause", 1, deps: ["w0"])]
        for i in 1...4 {
            operations.append(["id": "w\(i)", "kind": "command", "command": "parent", "dependencies": [i == 1 ? "pause" : "w\(i - 1)"]])
        }
        try spool.drop("w.plist", ["job": "w", "operations": operations])
        #expect(spool.result("w")?["status"] as? String == "succeeded")
        let served = Set((1...4).compactMap { i in
            (try? String(contentsOfFile: spool.root + "/outbox/w/logs/w\(i).stdout", encoding: .utf8)).flatMap {
                Int32($0.trimmingCharacters(in: .whitespacesAndNewlines))
            }
        })
        let pgid = try runForever(spool, mark: mark)
        #expect(served.contains(pgid), "f runs on a supervisor that served an earlier command: \(pgid) in \(served)")
        #expect(waitUntil(5) { liveProcesses(inGroup: pgid).count >= 4 }, "\(liveProcesses(inGroup: pgid))")
        #expect(spool.freeze())
        kill(pgid, SIGKILL)
        #expect(waitUntil(2) { ended(pgid) }, "the supervisor is gone")
        #expect(liveProcesses(inGroup: pgid).count >= 3, "what it ran is not: \(liveProcesses(inGroup: pgid))")
        spool.signal(SIGKILL)
        _ = spool.waitForExit()
        #expect(waitUntil(2) { liveProcesses(inGroup: pgid).isEmpty }, "the watchdog ended the group: \(liveProcesses(inGroup: pgid))")
        kill(-pgid, SIGKILL)
    }

    /// A command that double-forks into a session of its own (as a daemonising script does) leaves no process behind
    /// when its operation ends — it exits, is cancelled or times out — nor when its daemon is killed with -9, outside
    /// systemd: its supervisor is the escaped process's reaper and ends it (SPEC §3.6, §8).
    @Test(arguments: ["exits", "cancelled", "timed out", "kill -9"])
    func aProcessThatLeftTheCommandsSessionEndsWithIt(ending: String) throws {
        let spool = TestSpool()
        let mark = spool.root + ".escaped"
        defer { unlink(mark) }
        // The escaped sleep's pid in the mark; then the command waits (or exits at once, for "exits").
        let script = "(setsid sh -c 'sleep 300 & echo $! > \"$1\"' sh \"$1\" &); while [ ! -s \"$1\" ]; do sleep 0.05; done; "
            + (ending == "exits" ? "exit 0" : "sleep 300")
        let config = try spool.configure(["commands": [
            "escape": ["argv": ["/bin/sh", "-c", script, "sh", "${mark}"], "parameters": ["mark": "string"],
                       "timeoutSeconds": ending == "timed out" ? 1 : 600],
        ]])
        try spool.start(config)
        try spool.drop("e.plist",
                       ["job": "e", "operations": [["id": "e", "kind": "command", "command": "escape", "arguments": ["mark": mark]]]])
        #expect(waitUntil(10) { (try? String(contentsOfFile: mark, encoding: .utf8))?.hasSuffix("\n") == true })
        let escaped = try #require(
            Int32((try? String(contentsOfFile: mark, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""))
        defer { kill(escaped, SIGKILL) }
        let daemon = try #require(spool.daemon?.processIdentifier)
        if ending != "exits" {
            #expect(!ended(escaped), "running")
            let session = { (pid: Int32) in statFields(pid).flatMap { $0.fields.count > 3 ? Int32($0.fields[3]) : nil } }
            #expect(session(escaped) != nil && session(escaped) != session(daemon), "in a session of its own, out of the command's group")
        }
        switch ending {
        case "cancelled": #expect(try spool.ctl(["cancel", "e"]).status == 0)
        case "kill -9":
            spool.signal(SIGKILL)
            _ = spool.waitForExit()
        default: break
        }
        #expect(waitUntil(ChildProcess.killGrace + 2) { ended(escaped) }, "\(ending): the escaped process \(escaped) is gone")
        if ending != "kill -9" {
            let result = try #require(spool.result("e"))
            let state = ["exits": "succeeded", "cancelled": "cancelled", "timed out": "failed"][ending]
            #expect((result["operations"] as? [[String: Any]])?.first?["state"] as? String == state, "\(result)")
        }
    }

    @Test func aNormalStopEndsTheWatchdogAndCommandsThatEndAreForgotten() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": ["quick": ["argv": ["/bin/sh", "-c", "echo hi"], "output": "stdout"]]])
        try spool.start(config)
        let daemon = try #require(spool.daemon?.processIdentifier)
        for i in 0..<5 {
            try spool.drop("q\(i).plist", ["job": "q\(i)", "operations": [["id": "q", "kind": "command", "command": "quick"]]])
        }
        for i in 0..<5 { #expect(spool.result("q\(i)")?["status"] as? String == "succeeded") }
        let found = watchdogs(of: daemon)
        #expect(found.count == 1, "still one watchdog after commands came and went: \(found)")
        let watchdog = try #require(found.first)
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        #expect(waitUntil(2) { ended(watchdog) }, "the watchdog does not outlive a daemon that stopped")
    }

    /// What a stop kills when its grace ends is not an outcome: the operation's job is not published and runs again at
    /// the next start, and a jobFinished hook killed so runs again too (opqueued(8), SIGTERM).
    @Test func whatAStopKillsAfterItsGraceRunsAgainAtTheNextStart() throws {
        let spool = TestSpool()
        let mark = spool.root + ".mark"
        defer { for suffix in ["", ".hook", ".hook.done"] { unlink(mark + suffix) } }
        // Each sleeps past the grace the first time, and ends at once the next.
        let once = "[ -e \"$1\" ] && { echo \"$2\" >> \"$1.done\"; exit 0; }; touch \"$1\"; exec sleep 30"
        let config = try spool.configure(["shutdownGraceSeconds": 0.5, "jobFinished": "hook", "commands": [
            "slow": ["argv": ["/bin/sh", "-c", once, "sh", mark, "slow"]],
            "hook": ["argv": ["/bin/sh", "-c", once, "sh", mark + ".hook", "${job}"]],
        ]])
        try spool.start(config)
        try spool.drop("h.plist", ["job": "h", "operations": [["id": "quick", "kind": "sleep", "seconds": 0]]])
        #expect(spool.result("h")?["status"] as? String == "succeeded")
        try spool.drop("s.plist", ["job": "s", "operations": [["id": "slow", "kind": "command", "command": "slow"]]])
        #expect(waitUntil(10) { access(mark, F_OK) == 0 && access(mark + ".hook", F_OK) == 0 }, "both started")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
        #expect(!FileManager.default.fileExists(atPath: spool.root + "/outbox/s"), "not published as it was killed")
        #expect(FileManager.default.fileExists(atPath: spool.root + "/active/s"), "kept to run again")
        try spool.start(config)
        let result = try #require(spool.result("s"))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        let hooks = { String(decoding: FileManager.default.contents(atPath: mark + ".hook.done") ?? Data(), as: UTF8.self) }
        #expect(waitUntil(10) { hooks().split(separator: "\n").contains("h") }, "h's hook ran again: \(hooks())")
    }

    @Test func anEndedGroupIsNotKilledWhenThePipeCloses() throws {
        let watchdog = try CommandWatchdog.spawn().get()
        let group = try shellWithGrandchild()
        defer { reap(group) }
        watchdog.groupStarted(group.pgid)
        watchdog.groupEnded(group.pgid)
        watchdog.close()
        #expect(exited(watchdog, within: 2))
        #expect(liveProcesses(inGroup: group.pgid).count >= 3, "forgotten, so left alone")
    }

    @Test func closingThePipeKillsEveryRecordedGroup() throws {
        let watchdog = try CommandWatchdog.spawn().get()
        let first = try shellWithGrandchild(), second = try shellWithGrandchild()
        defer { reap(first); reap(second) }
        watchdog.groupStarted(first.pgid)
        watchdog.groupStarted(second.pgid)
        // SIGTERM, SIGINT, SIGHUP and SIGTSTP (a terminal's, a service manager's) do not end or stop it.
        for sig in [SIGTERM, SIGINT, SIGHUP, SIGTSTP] { kill(watchdog.pid, sig) }
        usleep(200_000)
        #expect(!ended(watchdog.pid))
        #expect(statFields(watchdog.pid)?.fields.first != "T", "not stopped")
        #expect(liveProcesses(inGroup: first.pgid).count >= 3 && liveProcesses(inGroup: second.pgid).count >= 3)
        watchdog.close()
        #expect(waitUntil(2) { liveProcesses(inGroup: first.pgid).isEmpty && liveProcesses(inGroup: second.pgid).isEmpty })
        #expect(exited(watchdog, within: 2))
    }

    @Test func anUnrenewedDeadlineKillsTheGroupsAndARenewedOneDoesNot() throws {
        let watchdog = try CommandWatchdog.spawn().get()
        defer { watchdog.close(); _ = exited(watchdog, within: 2) }
        let group = try shellWithGrandchild()
        defer { reap(group) }
        watchdog.groupStarted(group.pgid)
        // Renewed every 0.25 s, one second ahead each time, for 2.5 s: alive.
        let renewUntil = Date().addingTimeInterval(2.5)
        while Date() < renewUntil {
            watchdog.setKillDeadline(monotonicSeconds: CommandWatchdog.monotonicSeconds() + 1)
            usleep(250_000)
        }
        #expect(liveProcesses(inGroup: group.pgid).count >= 3, "renewed in time")
        // Cleared: no deadline, however long.
        watchdog.setKillDeadline(monotonicSeconds: nil)
        usleep(1_500_000)
        #expect(liveProcesses(inGroup: group.pgid).count >= 3, "no deadline")
        // One second ahead, not renewed: killed, the shell's grandchild too.
        let set = CommandWatchdog.monotonicSeconds()
        watchdog.setKillDeadline(monotonicSeconds: set + 1)
        #expect(waitUntil(4) { liveProcesses(inGroup: group.pgid).isEmpty },
                "killed at the deadline: \(liveProcesses(inGroup: group.pgid))")
        #expect(CommandWatchdog.monotonicSeconds() - set >= 0.95, "not before it")
        #expect(!ended(watchdog.pid), "the watchdog goes on after a deadline")
    }

    @Test func aGroupStartedAfterAPassedDeadlineIsKilledUntilANewDeadlineComes() throws {
        let watchdog = try CommandWatchdog.spawn().get()
        defer { watchdog.close(); _ = exited(watchdog, within: 2) }
        watchdog.setKillDeadline(monotonicSeconds: CommandWatchdog.monotonicSeconds() - 1)
        usleep(200_000)
        let late = try shellWithGrandchild()
        defer { reap(late) }
        watchdog.groupStarted(late.pgid)
        #expect(waitUntil(2) { liveProcesses(inGroup: late.pgid).isEmpty }, "not covered by a lease")
        watchdog.setKillDeadline(monotonicSeconds: CommandWatchdog.monotonicSeconds() + 60)
        let renewed = try shellWithGrandchild()
        defer { reap(renewed) }
        watchdog.groupStarted(renewed.pgid)
        usleep(500_000)
        #expect(liveProcesses(inGroup: renewed.pgid).count >= 3, "a new deadline covers it")
    }

    @Test func theNewEventsHaveMessageIDsTheCatalogTestCovers() {
        let pairs = MessageIDs.pairs.map { "\($0.event)/\($0.state)" }
        for pair in ["job/claimed", "job/lost", "cluster/connected", "cluster/disconnected"] {
            #expect(pairs.contains(pair), "\(pair)")
        }
    }

    @Test func consoleLinesQuoteWhatWouldSplitThem() {
        let metadata: Logger.Metadata = ["OPQ_JOB": "a\"b", "OPQ_STATE": "finished", "OPQ_EVENT": "job", "opq_path": "/tmp/x y",
                                         "bad key": "z", "OPQ_EMPTY": ""]
        let line = ConsoleLogHandler.line(level: .warning, message: "tab\there\nnew \\ é", metadata: metadata)
        #expect(line == "PRIORITY=4 MESSAGE_ID=\(MessageIDs.id(event: "job", state: "finished")) OPQ_EMPTY=\"\" OPQ_EVENT=job"
                    + " OPQ_JOB=\"a\\\"b\" OPQ_STATE=finished OPQ_PATH=\"/tmp/x y\" MESSAGE=\"tab\\there\\nnew \\\\ é\"\n", "\(line)")
    }

    @Test func everyEntryCarriesTheNodeOnBothTargets() throws {
        // Console: the line of an event, with and without a node.
        let metadata: Logger.Metadata = ["OPQ_EVENT": "job", "OPQ_STATE": "claimed", "OPQ_JOB": "j", "OPQ_FROM_NODE": "worker-2"]
        #expect(!ConsoleLogHandler.line(level: .info, message: "m", metadata: Journal.fields([:], metadata)).contains("OPQ_NODE"))
        Journal.node = "worker-1"
        defer { Journal.node = nil }
        let line = ConsoleLogHandler.line(level: .info, message: "m", metadata: Journal.fields([:], metadata))
        #expect(line.contains(" OPQ_NODE=worker-1 "), "\(line)")
        #expect(line.contains(" OPQ_FROM_NODE=worker-2 "), "\(line)")
        #expect(line.contains(" MESSAGE_ID=\(MessageIDs.id(event: "job", state: "claimed")) "), "\(line)")

        // journald: an entry logged through the handler, read back by its unique job id.
        try ensureJournald()
        let job = "node-test-" + UUID().uuidString.prefix(8)
        var logger = Logger(label: "t", factory: { _ in JournalLogHandler(identifier: "opqueued-test") })
        logger.logLevel = .info
        logger.info("a job was claimed", metadata: ["OPQ_EVENT": "job", "OPQ_STATE": "claimed", "OPQ_JOB": .string(job)])
        var found = ""
        _ = waitUntil(10) {
            found = (try? run("/usr/bin/journalctl", ["--no-pager", "-o", "json", "OPQ_JOB=\(job)"]))?.stdout ?? ""
            return found.contains(job)
        }
        #expect(found.contains("\"OPQ_NODE\":\"worker-1\""), "\(found)")
        #expect(found.contains("\"MESSAGE_ID\":\"\(MessageIDs.id(event: "job", state: "claimed"))\""), "\(found)")
    }
}
