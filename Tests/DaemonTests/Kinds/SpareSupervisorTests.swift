// Spare supervisors (Sources/OperationKinds/Commands/SpareSupervisors.swift): a command started on a supervisor made
// ahead of need gets what a direct start gives it (priority, folder, environment, output), the spares are let go when
// commands stop and when the daemon dies, and a spare that is gone or a command too big for one falls back to the
// direct start.

import Foundation
import Testing
@testable import Daemon
@testable import OperationKinds
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// Fields of /proc/PID/stat after the command name (index 0: the state; 1: the parent; 16: nice; 19: start time;
/// 38: the policy), or nil.
private func statFields(_ text: Substring) -> [Substring]? {
    guard let close = text.lastIndex(of: ")") else { return nil }
    return text[text.index(after: close)...].split(separator: " ")
}

/// The daemon's spare supervisors (`--spare`), or their factory (`--factory`): its children, not zombies, or after its
/// death the processes naming it as their PARENT.
private func spares(of daemon: Int32, _ mode: String = "--spare") -> [Int32] {
    ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { entry in
        guard let pid = Int32(entry), let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
              let fields = statFields(Substring(stat)), fields.count > 1, fields[0] != "Z",
              Int32(fields[1]) == daemon || spareArguments(pid).last == String(daemon),
              spareArguments(pid).contains(mode) else { return nil }
        return pid
    }
}

/// Samples, on a thread of its own for 15 s, how many spares (and factories) the daemon has at once that are not among
/// `excluding`: spares are let go `idleSeconds` after the last start, which on a loaded machine can come before the
/// job's result does.
private final class SpareWatch: @unchecked Sendable {
    private let lock = NSLock()
    private var seen = (spares: 0, factories: 0, pids: Set<Int32>())

    init(daemon: Int32, excluding: Set<Int32> = []) {
        Thread.detachNewThread { [self] in
            for _ in 0..<1_500 {
                let found = spares(of: daemon).filter { !excluding.contains($0) }
                let makers = spares(of: daemon, "--factory").filter { !excluding.contains($0) }
                lock.withLock {
                    seen = (max(seen.spares, found.count), max(seen.factories, makers.count), seen.pids.union(found + makers))
                }
                usleep(10_000)
            }
        }
    }

    /// The most spares seen at once so far.
    var most: Int { lock.withLock { seen.spares } }
    /// The most factories seen at once so far.
    var factories: Int { lock.withLock { seen.factories } }
    /// Every spare and factory seen.
    var pids: Set<Int32> { lock.withLock { seen.pids } }
}

private func spareArguments(_ pid: Int32) -> [String] {
    guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return [] }
    return data.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
}

/// The daemon's children that are zombies (exited, never reaped).
private func zombies(of daemon: Int32) -> Int {
    ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).filter { entry in
        guard let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
              let fields = statFields(Substring(stat)), fields.count > 1 else { return false }
        return fields[0] == "Z" && Int32(fields[1]) == daemon
    }.count
}

/// Whether `pid` has exited: a zombie, or gone.
private func hasExited(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let fields = statFields(Substring(stat)), !fields.isEmpty else { return true }
    return fields[0] == "Z"
}

/// A command that writes its supervisor's /proc/PID/stat line, its own, its folder and its environment.
private func probe() -> [String: Any] { [
    "argv": ["/bin/sh", "-c", "cat /proc/$PPID/stat; cat /proc/$$/stat; pwd; env | sort"],
    "environment": ["ONE": "1 and a space"], "output": "stdout",
] }

@Suite(.serialized, .onItsOwnExecutor) struct SpareSupervisorTests {
    /// The first command starts directly and has spares made; two started a second later run under supervisors that
    /// were waiting, each at its operation's priority (background: nice 19, SCHED_IDLE; default: nice 0), in its scratch
    /// folder, with exactly its declared environment.
    @Test func aLaterCommandRunsOnAWaitingSpareAsItWouldHaveDirectly() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": ["probe": probe()]])
        try spool.drop("s.plist", ["job": "s", "operations": [
            ["id": "a", "kind": "command", "command": "probe"],
            sleepOp("pause", 1, deps: ["a"]),
            ["id": "b", "kind": "command", "command": "probe", "dependencies": ["pause"], "qualityOfService": "background"],
            // Beside b, not after it: a dependent of a higher QoS would raise b's while it waits.
            ["id": "c", "kind": "command", "command": "probe", "dependencies": ["pause"]],
        ]])
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"] + config)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(spool.result("s")?["status"] as? String == "succeeded")
        var lines: [String: [Substring]] = [:]
        for op in ["a", "b", "c"] {
            let text = String(decoding: FileManager.default.contents(atPath: spool.root + "/outbox/s/logs/\(op).stdout") ?? Data(),
                              as: UTF8.self)
            lines[op] = text.split(separator: "\n")
        }
        let b = try #require(lines["b"]), c = try #require(lines["c"])
        let supervisor = try #require(b.first.flatMap(statFields)), shell = try #require(b.dropFirst().first.flatMap(statFields))
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        let waited = (Double(shell[19]) ?? 0) / ticks - (Double(supervisor[19]) ?? 0) / ticks
        #expect(waited >= 0.5, "b's supervisor was started \(waited) s before it: a spare made while `pause` slept")
        #expect(shell[16] == "19" && shell[38] == "5", "background: nice 19 and SCHED_IDLE, as a direct start gives: \(b)")
        let cSupervisor = try #require(c.first.flatMap(statFields)), cShell = try #require(c.dropFirst().first.flatMap(statFields))
        #expect((Double(cShell[19]) ?? 0) / ticks - (Double(cSupervisor[19]) ?? 0) / ticks >= 0.5, "c ran on the other spare")
        #expect(cShell[16] == "0" && cShell[38] == "0", "default: nice 0, SCHED_OTHER: \(c)")
        for (op, found) in lines {
            #expect(found.count > 3 && found[2].contains("/active/s/.work/"), "\(op) ran in its scratch folder: \(found)")
            // What the shell adds itself aside.
            let environment = found.dropFirst(3).filter { !["PWD=", "OLDPWD=", "SHLVL=", "_="].contains(where: $0.hasPrefix) }
            #expect(environment == ["ONE=1 and a space", "PATH=/usr/bin:/bin"], "\(op)'s environment is exactly the declared one")
        }
    }

    /// Two spares wait while commands start; they are let go (and reaped) once commands stop, and end with a daemon
    /// killed by SIGKILL.
    @Test func sparesAreLetGoWhenCommandsStopAndWhenTheDaemonDies() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": ["t": ["argv": ["/bin/true"]]]])
        try spool.start(config)
        let daemon = try #require(spool.daemon?.processIdentifier)
        #expect(spares(of: daemon).isEmpty, "none before a command starts")
        let made = SpareWatch(daemon: daemon)
        try spool.drop("a.plist", ["job": "a", "operations": [["id": "t", "kind": "command", "command": "t"]]])
        #expect(spool.result("a")?["status"] as? String == "succeeded")
        #expect(waitUntil(5) { made.most == SpareSupervisors.target }, "at most \(made.most) at once")
        #expect(made.factories == 1, "made by one factory")
        #expect(waitUntil(SpareSupervisors.idleSeconds + 5) { spares(of: daemon).isEmpty }, "let go: \(spares(of: daemon))")
        #expect(spares(of: daemon, "--factory").isEmpty, "the factory too")
        #expect(waitUntil(2) { zombies(of: daemon) == 0 }, "and reaped")
        let again = SpareWatch(daemon: daemon)
        try spool.drop("b.plist", ["job": "b", "operations": [["id": "t", "kind": "command", "command": "t"]]])
        #expect(spool.result("b")?["status"] as? String == "succeeded")
        // The spare b ran on is given back beside those made meanwhile.
        #expect(waitUntil(5) { again.most >= SpareSupervisors.target })
        let waiting = again.pids
        spool.signal(SIGKILL)
        _ = spool.waitForExit()
        #expect(waitUntil(5) { waiting.allSatisfy { kill($0, 0) != 0 || spareArguments($0).isEmpty } },
                "spares and their factory end with the daemon: \(waiting.filter { kill($0, 0) == 0 })")
    }

    /// A supervisor whose command has ended serves the next one: six commands one after another run on at most four
    /// supervisors (without reuse, six). Nothing of the last command carries over: the process it left running is gone,
    /// each runs in its own scratch folder with exactly its environment, and a supervisor whose priority was lowered (by
    /// its command's renice, or by a background command's nice 19 and SCHED_IDLE, which it cannot shed) is not given a
    /// default command: that one runs at nice 0 under another.
    @Test func aSupervisorServesOneCommandAfterAnotherAndKeepsNothingOfTheLast() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": [
            "t": ["argv": ["/bin/true"]],
            "probe": probe(),
            "leave": ["argv": ["/bin/sh", "-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!; cat /proc/$PPID/stat"],
                      "output": "stdout"],
            // Lowers its supervisor's priority for good: the daemon must learn it, and not give it a default command.
            "lower": ["argv": ["/bin/sh", "-c", "renice -n 7 -p $PPID >/dev/null; cat /proc/$PPID/stat"], "output": "stdout"],
        ]])
        try spool.start(config)
        // Spares are made after the first command (which starts directly), while `pause` sleeps. bg is last: a dependent
        // of a higher QoS would raise its own.
        var operations: [[String: Any]] = [["id": "warm", "kind": "command", "command": "t"], sleepOp("pause", 1, deps: ["warm"])]
        var last = "pause"
        for (id, command, qos) in [("x", "leave", "default"), ("lower", "lower", "default"), ("p1", "probe", "default"),
                                   ("p2", "probe", "default"), ("p3", "probe", "default"), ("bg", "probe", "background")] {
            operations.append(["id": id, "kind": "command", "command": command, "dependencies": [last], "qualityOfService": qos])
            last = id
        }
        try spool.drop("s.plist", ["job": "s", "operations": operations])
        #expect(spool.result("s")?["status"] as? String == "succeeded")
        try spool.drop("after.plist", ["job": "after", "operations": [["id": "after", "kind": "command", "command": "probe"]]])
        #expect(spool.result("after")?["status"] as? String == "succeeded")
        let lines = { (job: String, op: String) in
            String(decoding: FileManager.default.contents(atPath: spool.root + "/outbox/\(job)/logs/\(op).stdout") ?? Data(), as: UTF8.self)
                .split(separator: "\n")
        }
        let left = try #require(lines("s", "x").first.flatMap { pid_t($0) })
        #expect(kill(left, 0) != 0, "the process x left running (pid \(left)) ended with x")
        // The supervisor's /proc/PID/stat line: x's second, the probes' first; its first field is the pid.
        let supervisors = try ["x", "lower", "p1", "p2", "p3", "bg"].map { op in
            try #require((op == "x" ? lines("s", op).dropFirst().first : lines("s", op).first)?.split(separator: " ").first)
        }
        #expect(Set(supervisors).count <= 4, "six commands, one after another, on \(Set(supervisors).count) supervisors: \(supervisors)")
        for op in ["p1", "p2", "p3"] {
            let shell = lines("s", op).dropFirst().first.flatMap(statFields)
            #expect(shell?[16] == "0", "\(op) at nice 0, not on the supervisor `lower` reniced: \(lines("s", op).prefix(2))")
        }
        for (job, op) in [("s", "p1"), ("s", "p2"), ("s", "p3"), ("s", "bg"), ("after", "after")] {
            let found = lines(job, op)
            #expect(found.count > 3 && found[2].contains("/active/\(job)/.work/"), "\(op) ran in its scratch folder: \(found)")
            let environment = found.dropFirst(3).filter { !["PWD=", "OLDPWD=", "SHLVL=", "_="].contains(where: $0.hasPrefix) }
            #expect(environment == ["ONE=1 and a space", "PATH=/usr/bin:/bin"], "\(op)'s environment is exactly the declared one")
        }
        let background = try #require(lines("s", "bg").dropFirst().first.flatMap(statFields))
        #expect(background[16] == "19" && background[38] == "5", "bg: nice 19, SCHED_IDLE: \(lines("s", "bg"))")
        let after = try #require(lines("after", "after").dropFirst().first.flatMap(statFields))
        let afterSupervisor = try #require(lines("after", "after").first.flatMap(statFields))
        #expect(after[16] == "0" && after[38] == "0" && afterSupervisor[16] == "0",
                "after: nice 0, SCHED_OTHER: \(lines("after", "after"))")
        #expect(lines("after", "after").first?.split(separator: " ").first != supervisors[5], "not on bg's supervisor")
    }

    /// Spares and their factory killed while they wait are not used (the command starts on the next spare, or
    /// directly), and spares are made again; a command whose arguments do not fit a spare's message starts directly;
    /// both get their whole argv.
    @Test func goneSparesAFactoryAndCommandsTooBigForOneStartDirectly() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": [
            "t": ["argv": ["/bin/true"]],
            // 30 arguments of up to 4,096 bytes each: more than a spare's message takes.
            "count": ["argv": ["/bin/sh", "-c", "printf %s \"$*\" | wc -c", "sh"] + Array(repeating: "${x}", count: 30),
                      "parameters": ["x": "string"],
                      "output": "stdout"],
        ]])
        try spool.start(config)
        let daemon = try #require(spool.daemon?.processIdentifier)
        try spool.drop("a.plist", ["job": "a", "operations": [["id": "t", "kind": "command", "command": "t"]]])
        #expect(spool.result("a")?["status"] as? String == "succeeded")
        #expect(waitUntil(5) { spares(of: daemon).count == SpareSupervisors.target })
        let killed = Set(spares(of: daemon) + spares(of: daemon, "--factory"))
        for pid in killed { kill(pid, SIGKILL) }
        // Dead before the next job comes: a SIGKILL takes effect when the process next runs, which on a loaded machine
        // can come after the daemon handed it a command (then rightly reported as its supervisor killed).
        #expect(waitUntil(5) { killed.allSatisfy(hasExited) }, "the killed spares died: \(killed.filter { !hasExited($0) })")
        let remade = SpareWatch(daemon: daemon, excluding: killed)
        let big = String(repeating: "x", count: 4_000)
        try spool.drop("b.plist", ["job": "b", "operations": [
            ["id": "small", "kind": "command", "command": "count", "arguments": ["x": "yz"]],
            ["id": "big", "kind": "command", "command": "count", "arguments": ["x": big], "dependencies": ["small"]],
        ]])
        let result = try #require(spool.result("b"))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        let read = { (op: String) in
            String(decoding: FileManager.default.contents(atPath: spool.root + "/outbox/b/logs/\(op).stdout") ?? Data(), as: UTF8.self)
        }
        #expect(read("small") == "89\n" && read("big") == "120029\n", "\(read("small")) \(read("big").prefix(100))")
        #expect(waitUntil(5) { zombies(of: daemon) == 0 }, "the killed spares and factory were reaped")
        #expect(waitUntil(5) { remade.most >= SpareSupervisors.target }, "and spares made again: at most \(remade.most) seen")
    }
}
