// Commands (issue 13, SPEC §3.6): real daemons running real processes — argv reaching the program
// intact, environments, bounded captured output, exit statuses, timeouts and cancellation killing whole
// process groups (checked in /proc), QoS of the child, crash recovery, the jobFinished hook, a fan-out.

import Foundation
import Testing
@testable import Daemon
@testable import OperationKinds
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

private func command(_ argv: [String], _ extra: [String: Any] = [:]) -> [String: Any] {
    var d: [String: Any] = ["argv": argv]
    for (k, v) in extra { d[k] = v }
    return d
}

private func commandOp(_ id: String, _ name: String, _ arguments: [String: Any] = [:], _ extra: [String: Any] = [:]) -> [String: Any] {
    var d: [String: Any] = ["id": id, "kind": "command", "command": name, "arguments": arguments]
    for (k, v) in extra { d[k] = v }
    return d
}

/// (policy, nice) of a process, from /proc/PID/stat (fields 41 and 19).
private func scheduling(_ pid: Int32) -> (policy: Int, nice: Int)? {
    guard let fields = statFields(pid)?.fields, fields.count > 38, let policy = Int(fields[38]), let nice = Int(fields[16]) else {
        return nil
    }
    return (policy, nice)
}

private func waitFor(_ seconds: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(20_000)
    }
    return condition()
}

private func readText(_ path: String) -> String? {
    FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
}

/// Starts the daemon with extra environment variables (a crash point), without waiting for readiness.
private func launch(_ spool: TestSpool, _ arguments: [String], environment: [String: String]) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: binaries + "/opqueued")
    process.arguments = ["--spool", spool.root, "--log-target", "console"] + arguments
    process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    if !FileManager.default.fileExists(atPath: spool.logPath) { _ = FileManager.default.createFile(atPath: spool.logPath, contents: nil) }
    let log = try FileHandle(forWritingTo: URL(fileURLWithPath: spool.logPath))
    log.seekToEndOfFile()
    process.standardError = log
    process.standardOutput = log
    try process.run()
    spool.daemon = process
}

@Suite(.serialized, .onItsOwnExecutor) struct CommandTests {
    /// A scratch folder its command left empty serves the job's next attempt where it is (no rename, no new folder);
    /// one left with a file in it is removed, and the next attempt is given an empty one.
    @Test func emptyScratchFoldersServeLaterAttemptsAndLitteredOnesDoNot() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": [
            "where": command(["/bin/sh", "-c", "pwd; ls -A"], ["output": "stdout"]),
            "litter": command(["/bin/sh", "-c", "pwd; ls -A; touch left"], ["output": "stdout"]),
        ]])
        try spool.drop("s.plist", ["job": "s", "operations": [
            commandOp("a", "where"), commandOp("b", "where", [:], ["dependencies": ["a"]]),
            commandOp("c", "litter", [:], ["dependencies": ["b"]]), commandOp("d", "where", [:], ["dependencies": ["c"]]),
        ]])
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"] + config)
        #expect(r.status == 0, "\(r.stderr)")
        let result = try #require(spool.result("s"))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        // Each log is the folder's path alone: `ls -A` found it empty.
        let seen = ["a", "b", "c", "d"].map { (readText(spool.root + "/outbox/s/logs/\($0).stdout") ?? "").split(separator: "\n") }
        #expect(seen.allSatisfy { $0.count == 1 }, "every attempt began in an empty folder: \(seen)")
        #expect(seen[1] == seen[0] && seen[2] == seen[0], "the empty folder was given again: \(seen)")
        #expect(seen[3] != seen[0], "the littered one was not: \(seen)")
    }

    /// A command leaves 6,000 levels of folders in its scratch folder (a file and a link to /etc/passwd at the
    /// bottom), under a daemon allowed 256 descriptors: the scratch goes whole all the same, the next operation runs,
    /// the job succeeds with nothing left to drop at publication, and the daemon ends its run normally.
    @Test func aScratchFolderThousandsOfLevelsDeepGoesUnderALowDescriptorLimit() throws {
        let spool = TestSpool()
        let deep = "for (1..6000) { mkdir 'a' or die \"mkdir: $!\"; chdir 'a' or die \"chdir: $!\" }"
            + " open(my $f, '>', 'bottom') or die; symlink('/etc/passwd', 'link') or die"
        let config = try spool.configure(["commands": [
            "deep": command(["/usr/bin/perl", "-e", deep]), "look": command(["/bin/ls", "-A"], ["output": "stdout"]),
        ]])
        try spool.drop("deep.plist", ["job": "deep", "operations": [
            commandOp("deep", "deep"), commandOp("look", "look", [:], ["dependencies": ["deep"]]),
        ]])
        // sh's `ulimit -n` lowers the hard limit too: the daemon cannot raise its soft limit past it.
        let r = try run("/bin/sh", ["-c", "ulimit -n 256 && exec \"$0\" \"$@\"", binaries + "/opqueued",
                                    "--spool", spool.root, "--once", "--log-target", "console"] + config, timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
        let result = try #require(spool.result("deep"))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        #expect(result["dropped"] == nil, "nothing was left for publication to remove: \(result)")
        #expect(readText(spool.root + "/outbox/deep/logs/look.stdout") == "", "the next attempt began in an empty folder")
        #expect(!FileManager.default.fileExists(atPath: spool.root + "/outbox/deep/.work"), "the scratch is gone")
        #expect(spool.list("active").isEmpty)
        #expect(FileManager.default.isReadableFile(atPath: "/etc/passwd"))
    }

    @Test func argumentsReachArgvIntactAndTheEnvironmentIsExactlyTheDeclaredOne() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": [
            // Each argument NUL-terminated, so any byte (newlines included) shows.
            "args": command(["/bin/sh", "-c", "printf '%s\\0' \"$@\"", "sh",
                             "${s}", "<${s}>", "${n}", "${r}", "${b}", "${e}", "${job}/${operation}/${attempt}"],
                            ["parameters": ["s": "string", "n": "integer", "r": "real", "b": "bool", "e": ["fast", "slow"]],
                             "output": "stdout"]),
            "env": command(["/usr/bin/env"], ["environment": ["FOO": "bar baz", "LANG": "C"], "output": "stdout"]),
            "envpath": command(["/usr/bin/env"], ["environment": ["PATH": "/nowhere"], "output": "stdout"]),
        ]])
        let nasty = "it's \"quoted\" $HOME; rm -rf / `id` $(id) ünïcödé ✓ *\nsecond line\\"
        try spool.drop("a.plist", ["job": "a", "operations": [
            commandOp("args", "args", ["s": nasty, "n": 42, "r": 2.5, "b": true, "e": "slow"]),
            commandOp("env", "env"), commandOp("envpath", "envpath"),
            ["id": "w", "kind": "write", "path": "env.png", "input": "env"],
        ]])
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"] + config)
        #expect(r.status == 0, "\(r.stderr)")
        let result = try #require(spool.result("a"))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        let out = spool.root + "/outbox/a/"
        let argv = try #require(readText(out + "logs/args.stdout"))
            .split(separator: "\0", omittingEmptySubsequences: false).map(String.init)
        #expect(argv == [nasty, "<\(nasty)>", "42", "2.5", "true", "slow", "a/args/1", ""])
        #expect(readText(out + "logs/env.stdout") == "FOO=bar baz\nLANG=C\nPATH=/usr/bin:/bin\n", "nothing of the daemon's environment")
        #expect(readText(out + "logs/envpath.stdout") == "PATH=/nowhere\n")
        #expect(readText(out + "env.png") == "FOO=bar baz\nLANG=C\nPATH=/usr/bin:/bin\n", "stdout is the output, written by `write`")
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops[0]["outputs"] as? [String] == ["logs/args.stdout", "logs/args.stderr"])
        #expect(!FileManager.default.fileExists(atPath: out + ".work"), "the scratch is not published")
    }

    /// SPEC §3.3: a command's output is written under its own name, byte for byte, with no `format`; a write of an
    /// image to such a name is refused before anything runs.
    @Test func aCommandsOutputIsWrittenUnderItsOwnName() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": [
            "json": command(["/usr/bin/printf", "{\"n\": 1}\n"], ["output": "stdout"]),
            "gz": command(["/usr/bin/gzip", "-c", "${input}"], ["output": "stdout"]),
        ]])
        try spool.drop("bytes.plist", ["job": "bytes", "operations": [
            commandOp("json", "json"),
            ["id": "report", "kind": "write", "path": "report.json", "input": "json"],
            commandOp("gz", "gz", [:], ["dependencies": ["report"]]),
            ["id": "archive", "kind": "write", "path": "out/a.tar.gz", "input": "gz"],
        ]])
        try spool.drop("image.plist", ["job": "image", "operations": [
            ["id": "d", "kind": "download", "url": "https://example.org/a.png"],
            ["id": "s", "kind": "grayscale", "dependencies": ["d"]],
            ["id": "w", "kind": "write", "path": "photo.out", "dependencies": ["s"]],
        ]])
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"] + config)
        #expect(r.status == 0, "\(r.stderr)")
        let result = try #require(spool.result("bytes"))
        #expect(result["status"] as? String == "succeeded", "\(result)")
        #expect(readText(spool.root + "/outbox/bytes/report.json") == "{\"n\": 1}\n")
        let gunzip = try run("/bin/gzip", ["-dc", spool.root + "/outbox/bytes/out/a.tar.gz"])
        #expect(gunzip.stdout == "{\"n\": 1}\n", "the gzip output, unchanged")
        let rejected = try #require(spool.result("image"))
        #expect(rejected["status"] as? String == "rejected")
        #expect((rejected["error"] as? String)?.contains("operation 'w': format is required to write the image of 's'") == true,
                "\(rejected)")
    }

    /// A link planted at the job's logs/ while it runs (by whoever may write the spool) is refused, never written
    /// through: the command fails saying why, and nothing lands where the link points.
    @Test func aLinkPlantedAtTheLogsFolderIsNotFollowed() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": ["hi": command(["/bin/echo", "hi"])]])
        try spool.start(config)
        let elsewhere = NSTemporaryDirectory() + "opq-elsewhere-\(UUID().uuidString.prefix(8))"
        #expect(mkdir(elsewhere, 0o755) == 0)
        try spool.drop("ln.plist", ["job": "ln", "operations": [sleepOp("s", 1), commandOp("c", "hi", [:], ["dependencies": ["s"]])]])
        #expect(waitFor(10) { access(spool.root + "/active/ln", F_OK) == 0 })
        #expect(symlink(elsewhere, spool.root + "/active/ln/logs") == 0)
        let result = try #require(spool.result("ln"))
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops[1]["state"] as? String == "failed", "\(ops[1])")
        #expect((ops[1]["error"] as? String)?.contains("the command logs' folder \(spool.root)/active/ln/logs: Not a directory") == true,
                "\(ops[1])")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: elsewhere)) == [])
    }

    @Test func badArgumentsAndBadCommandsAreRefusedAtValidation() throws {
        let spool = TestSpool()
        let config = try spool.configure(["commands": [
            "gz": command(["/usr/bin/gzip", "-c", "${file}"], ["parameters": ["file": "string", "level": "integer", "mode": ["a", "b"]]]),
        ]])
        let manifest = spool.root + "/m.plist"
        try plist(["job": "v", "operations": [
            commandOp("dash", "gz", ["file": "-rf", "level": 1, "mode": "a"]),
            commandOp("typed", "gz", ["file": "x", "level": "nine", "mode": "c"]),
            commandOp("missing", "gz", ["file": "x", "extra": 1]),
            commandOp("long", "gz", ["file": String(repeating: "x", count: 4097), "level": 1, "mode": "a"]),
            commandOp("nosuch", "rm", [:]),
        ]]).write(to: URL(fileURLWithPath: manifest))
        let r = try spool.ctl(config + ["validate", manifest])
        #expect(r.status == 1)
        for expected in ["operation 'dash': argument 'file' starts with '-'", "operation 'typed': argument 'level' must be an integer",
                         "operation 'typed': argument 'mode' must be one of a, b", "operation 'missing': unknown argument 'extra'",
                         "operation 'missing': argument 'level' is missing", "operation 'long': argument 'file' is longer than 4096 bytes",
                         "operation 'nosuch': unknown command 'rm' (configured: gz)"] {
            #expect(r.stdout.contains(expected) || r.stderr.contains(expected), "\(expected) in \(r.stdout)\(r.stderr)")
        }
        // The configuration's own problems, each with its key path.
        let bad = try spool.configure(["commands": ["x": command(["sh", "${nope}"], ["output": "maybe"])], "jobFinished": "y"])
        let c = try spool.ctl(bad + ["validate", manifest])
        #expect(c.status != 0)
        let text = c.stdout + c.stderr
        for expected in ["commands.x.argv[1]: unknown placeholder '${nope}'", "commands.x.argv[0]: must be an absolute path",
                         "commands.x.output: must be stdout, file or none", "jobFinished: 'y' is not a command"] {
            #expect(text.contains(expected), "\(expected) in \(text)")
        }
    }

    @Test func exitStatusesOutputBoundsRetriesAndSignals() throws {
        let spool = TestSpool()
        let state = spool.root + ".count"
        defer { unlink(state) }
        let config = try spool.configure(["commands": [
            "loud": command(["/bin/sh", "-c", "head -c 100000 /dev/zero; echo first >&2; echo 'last words' >&2; exit 3"],
                            ["maxOutputBytes": 1000]),
            "flaky": command(["/bin/sh", "-c",
                              "c=$(cat \"$1\" 2>/dev/null || echo 0); c=$((c+1)); echo $c > \"$1\"; "
                                  + "[ $c -ge 3 ] && { echo done; exit 0; }; echo \"not yet $c\" >&2; exit 75",
                              "sh", "${state}"],
                             ["parameters": ["state": "string"], "output": "stdout"]),
            "segv": command(["/bin/sh", "-c", "echo dying >&2; kill -SEGV $$"]),
            "file": command(["/bin/sh", "-c", "printf made > \"$1\"", "sh", "${output}"], ["output": "file"]),
            "missing": command(["/nonexistent/program"]),
            "head": command(["/bin/sh", "-c", "head -c 4 \"$1\"", "sh", "${input}"], ["output": "stdout"]),
        ], "download": ["fileRoots": [repositoryRoot + "/spool/examples"]]])
        try spool.drop("x.plist", ["job": "x", "operations": [
            commandOp("loud", "loud", [:], ["retries": 3, "retryDelaySeconds": 0.01]),
            commandOp("flaky", "flaky", ["state": state], ["retries": 3, "retryDelaySeconds": 0.05]),
            commandOp("segv", "segv"),
            commandOp("file", "file"),
            ["id": "w", "kind": "write", "path": "made.png", "input": "file"],
            commandOp("missing", "missing", [:], ["retries": 2]),
            ["id": "photo", "kind": "download", "url": "file://" + repositoryRoot + "/spool/examples/images/dusk.jpg"],
            ["id": "gray", "kind": "grayscale", "dependencies": ["photo"]],
            commandOp("head", "head", [:], ["dependencies": ["gray"]]),
            commandOp("noinput", "head"),
        ]])
        let r = try run("opqueued", ["--spool", spool.root, "--once", "--log-target", "console"] + config)
        #expect(r.status == 0, "\(r.stderr)")
        let result = try #require(spool.result("x"))
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops[0]["state"] as? String == "failed")
        #expect(ops[0]["attempts"] as? Int == 1, "exit 3 is not retried")
        #expect(ops[0]["error"] as? String == "exit status 3: last words (standard output cut at 1000 of 100000 bytes)")
        let out = spool.root + "/outbox/x/"
        #expect((try? FileManager.default.attributesOfItem(atPath: out + "logs/loud.stdout")[.size] as? Int) == 1000)
        #expect(readText(out + "logs/loud.stderr") == "first\nlast words\n")
        #expect(ops[1]["state"] as? String == "succeeded")
        #expect(ops[1]["attempts"] as? Int == 3, "exit 75 retried")
        #expect(readText(out + "logs/flaky.stdout") == "done\n")
        #expect(ops[2]["error"] as? String == "killed by SIGSEGV: dying")
        #expect(readText(out + "made.png") == "made", "the file at ${output} is the output")
        #expect(ops[5]["error"] as? String == "cannot run /nonexistent/program: No such file or directory")
        #expect(ops[5]["attempts"] as? Int == 1)
        #expect(FileManager.default.contents(atPath: out + "logs/head.stdout") == Data([0x89, 0x50, 0x4E, 0x47]),
                "an image input reaches ${input} as PNG")
        #expect((ops[9]["error"] as? String ?? "").contains("uses ${input} but the operation has no input"), "\(ops[9])")
    }

    @Test func aTimeoutKillsTheWholeGroupEvenWhatIgnoresSIGTERM() throws {
        let spool = TestSpool()
        let mark = spool.root + ".pgid"
        defer { unlink(mark) }
        let config = try spool.configure(["commands": [
            "stubborn": command(["/bin/sh", "-c", "trap '' TERM; (trap '' TERM; sleep 300) & (sleep 300) & echo $$ > \"$1\"; wait; wait",
                                 "sh", "${mark}"],
                                ["parameters": ["mark": "string"], "timeoutSeconds": 0.5]),
        ]])
        try spool.start(config)
        try spool.drop("t.plist", ["job": "t", "operations": [commandOp("s", "stubborn", ["mark": mark])]])
        let result = try #require(spool.result("t", timeout: 20))
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops[0]["error"] as? String == "timed out after 0.5 s")
        let shell = try #require(Int32(readText(mark)?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""))
        let pgid = try #require(processGroup(of: shell), "the shell lives through the grace")
        #expect(liveProcesses(inGroup: pgid).count >= 2, "SIGTERM is ignored: the group lives through the grace")
        #expect(waitFor(ChildProcess.killGrace + 3) { liveProcesses(inGroup: pgid).isEmpty },
                "nothing of the group survives: \(liveProcesses(inGroup: pgid))")
    }

    @Test func cancelStopsABackgroundCommandRunningAtSchedIdle() throws {
        let spool = TestSpool()
        let mark = spool.root + ".pid"
        defer { unlink(mark) }
        let config = try spool.configure(["commands": [
            "wait": command(["/bin/sh", "-c", "echo $$ > \"$1\"; sleep 300 & wait", "sh", "${mark}"], ["parameters": ["mark": "string"]]),
        ]])
        try spool.start(config)
        try spool.drop("c.plist", ["job": "c", "operations": [commandOp("w", "wait", ["mark": mark], ["qualityOfService": "background"])]])
        #expect(waitFor(10) { readText(mark)?.hasSuffix("\n") == true })
        let pid = try #require(Int32(readText(mark)?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""))
        let sched = try #require(scheduling(pid))
        #expect(sched.policy == 5, "SCHED_IDLE")
        #expect(sched.nice == 19)
        let pgid = try #require(processGroup(of: pid))
        #expect(liveProcesses(inGroup: pgid).count == 3, "a process group of its own: the supervisor, the shell and its sleep")
        let start = Date()
        let r = try spool.ctl(["cancel", "c"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(waitFor(ChildProcess.killGrace + 1) { liveProcesses(inGroup: pgid).isEmpty })
        let elapsed = Date().timeIntervalSince(start)
        #expect(elapsed < 0.1 + ChildProcess.killGrace, "\(elapsed) s")
        let ops = try #require(spool.result("c")?["operations"] as? [[String: Any]])
        #expect(ops[0]["state"] as? String == "cancelled")
    }

    @Test func aCommandRunningAtACrashRunsAgainAndOneThatSucceededDoesNot() throws {
        let spool = TestSpool()
        let runs = spool.root + ".runs"
        defer { unlink(runs); unlink(runs + ".2") }
        let config = try spool.configure(["commands": [
            // The first run sleeps until it is killed (a loaded machine may take seconds to start the quick one); the
            // second ends at once.
            "slow": command(["/bin/sh", "-c", "echo $$ >> \"$1\"; ls; touch leftover; [ $(wc -l < \"$1\") -gt 1 ] || sleep 60",
                             "sh", "${log}"],
                            ["parameters": ["log": "string"], "output": "stdout"]),
            "quick": command(["/bin/sh", "-c", "echo run >> \"$1\"; echo hello", "sh", "${log}"],
                             ["parameters": ["log": "string"], "output": "stdout"]),
        ]])
        try spool.start(config)
        try spool.drop("k.plist", ["job": "k", "operations": [commandOp("slow", "slow", ["log": runs])]])
        try spool.drop("q.plist", ["job": "q", "operations": [
            commandOp("quick", "quick", ["log": runs + ".2"]), sleepOp("gate", 3),
            ["id": "w", "kind": "write", "path": "hello.png", "input": "quick", "dependencies": ["gate"]],
        ]])
        #expect(waitFor(10) { readText(runs)?.hasSuffix("\n") == true && readText(runs + ".2") == "run\n" })
        let shell = try #require(Int32(readText(runs)?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""))
        let first = try #require(processGroup(of: shell))
        let supervisor = try #require(parent(of: shell))
        usleep(500_000) // the quick one's success committed (progress commits within 50 ms)
        // The daemon frozen (its supervisor's end would be its cue to kill the group), then the supervisor and the
        // watchdog killed, then the daemon: the ledger, the line behind them all, is what is tested here
        // (CommandDeathTests has the others' own kills).
        let daemon = try #require(spool.daemon?.processIdentifier)
        let watchdog = try #require(watchdogs(of: daemon).first)
        #expect(spool.freeze(), "every thread of the daemon stopped before the supervisor is killed")
        kill(supervisor, SIGKILL)
        kill(watchdog, SIGKILL)
        spool.signal(SIGKILL)
        _ = spool.waitForExit()
        #expect(!liveProcesses(inGroup: first).isEmpty,
                "the command outlived the daemon, its watchdog and its supervisor (its sleep goes on)")
        try spool.start(config)
        #expect(liveProcesses(inGroup: first).isEmpty, "killed at start, before its operation runs again")
        let k = try #require(spool.result("k"))
        #expect(k["status"] as? String == "succeeded")
        #expect(readText(runs)?.split(separator: "\n").count == 2, "ran again")
        #expect(readText(spool.root + "/outbox/k/logs/slow.stdout") == "", "in an emptied scratch folder (ls saw nothing)")
        let q = try #require(spool.result("q"))
        #expect(q["status"] as? String == "succeeded")
        #expect(readText(runs + ".2") == "run\n", "not run again")
        #expect(readText(spool.root + "/outbox/q/hello.png") == "hello\n", "its kept output reached its dependent")
    }

    @Test func jobFinishedRunsOncePerJobAcrossACrashBetweenPublicationAndHook() throws {
        let spool = TestSpool()
        let log = spool.root + ".hooks"
        defer { unlink(log) }
        let config = try spool.configure([
            "commands": ["hook": command(["/bin/sh", "-c", "echo \"$1 $2 $3\" >> \"\(log)\"; exit 9", "sh", "${job}", "${status}",
                                          "${outbox}"])],
            "jobFinished": "hook",
        ])
        try launch(spool, config, environment: ["OPQUEUED_CRASH_POINTS": "publish.placed:1"])
        // h1's outbox name is taken while it runs (by a user's folder): its entry is outbox/h1.1, and the hook run
        // after the crash is given that folder.
        try spool.drop("h1.plist", ["job": "h1", "operations": [sleepOp("a", 0.5)]])
        #expect(waitFor(10) { spool.list("active").contains("h1") })
        try FileManager.default.createDirectory(atPath: spool.root + "/outbox/h1", withIntermediateDirectories: true)
        try Data("mine".utf8).write(to: URL(fileURLWithPath: spool.root + "/outbox/h1/notes.txt"))
        #expect(spool.waitForExit(timeout: 20) != nil, "killed at the crash point")
        #expect(spool.list("outbox") == ["h1", "h1.1"])
        #expect(readText(log) == nil, "the hook had not run")
        try spool.start(config)
        try spool.drop("h2.plist", ["job": "h2", "operations": [["id": "f", "kind": "fail"]]])
        let outbox = spool.root + "/outbox"
        #expect(waitFor(10) { readText(log)?.split(separator: "\n").count == 2 })
        usleep(300_000)
        let lines = Set((readText(log) ?? "").split(separator: "\n").map(String.init))
        #expect(lines == ["h1 succeeded \(outbox)/h1.1", "h2 failed \(outbox)/h2"])
        #expect(readText(log)?.split(separator: "\n").count == 2, "once each")
        #expect(waitFor(5) {
            (readText(spool.logPath) ?? "").split(separator: "\n")
                .contains { $0.contains("OPQ_JOB=h2") && $0.contains("jobFinished command 'hook' failed: exit status 9") }
        }, "a hook's failure is logged with its job")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: spool.root + "/active/.hooks")) ?? ["?"]).isEmpty, "markers removed")
    }

    /// A crash between publication and the hook, then the job's folder renamed by an operator before the next start:
    /// the hook still runs for the job, given the folder where it now is.
    @Test func aHookDueAfterACrashFindsItsRenamedFolder() throws {
        let spool = TestSpool()
        let log = spool.root + ".hooks"
        defer { unlink(log) }
        let config = try spool.configure([
            "commands": ["hook": command(["/bin/sh", "-c", "echo \"$1 $2\" >> \"\(log)\"", "sh", "${job}", "${outbox}"])],
            "jobFinished": "hook",
        ])
        try launch(spool, config, environment: ["OPQUEUED_CRASH_POINTS": "publish.placed:1"])
        try spool.drop("h.plist", ["job": "h", "operations": [sleepOp("a", 0)]])
        #expect(spool.waitForExit(timeout: 20) != nil, "killed at the crash point")
        #expect(readText(log) == nil, "the hook had not run")
        #expect(rename(spool.root + "/outbox/h", spool.root + "/outbox/h.keep") == 0)
        try spool.start(config)
        #expect(waitFor(10) { readText(log) != nil })
        #expect(readText(log) == "h \(spool.root)/outbox/h.keep\n")
    }

    /// A slow hook and many ended jobs: at most eight hooks run at once, and every one runs in its turn.
    @Test func jobFinishedHooksRunEightAtATime() throws {
        let spool = TestSpool()
        let log = spool.root + ".turns"
        defer { unlink(log) }
        let config = try spool.configure([
            "commands": ["hook": command(["/bin/sh", "-c", "echo + >> \"$0\"; sleep 0.4; echo - >> \"$0\"", log])],
            "jobFinished": "hook",
        ])
        try spool.start(config)
        for i in 0..<24 { try spool.drop("j\(i).plist", ["job": "j\(i)", "operations": [sleepOp("a", 0)]]) }
        #expect(waitFor(60) { readText(log)?.split(separator: "\n").count == 48 }, "\(readText(log) ?? "")")
        var running = 0, most = 0
        for line in (readText(log) ?? "").split(separator: "\n") {
            running += line == "+" ? 1 : -1
            most = max(most, running)
        }
        #expect(most <= 8 && most >= 4, "hooks running at once: \(most)")
        #expect(waitFor(5) { ((try? FileManager.default.contentsOfDirectory(atPath: spool.root + "/active/.hooks")) ?? ["?"]).isEmpty })
    }

    @Test func aFanOutOfTwoThousandCommandsKeepsTheQueueLimit() throws {
        let spool = TestSpool()
        let config = try spool.configure([
            "queues": ["procs": ["maxConcurrentOperationCount": 3]],
            "commands": ["true": command(["/bin/true"], ["queue": "procs"])],
        ])
        try spool.drop("f.plist", ["job": "f", "operations": (0..<2000).map { commandOp("t\($0)", "true") }])
        // Logged to a file (`run` reads the daemon's stdout before its stderr: 8,000 lines would fill the pipe).
        try spool.start(config)
        let result = try #require(spool.result("f", timeout: 120))
        #expect(result["status"] as? String == "succeeded")
        let ops = try #require(result["operations"] as? [[String: Any]])
        #expect(ops.count == 2000 && ops.allSatisfy { $0["queue"] as? String == "procs" && $0["state"] as? String == "succeeded" })
        // The most commands running at one moment, from their start and end times.
        var edges: [(Double, Int)] = []
        for op in ops {
            if let s = op["startedAt"] as? Double, let f = op["finishedAt"] as? Double { edges += [(s, 1), (f, -1)] }
        }
        edges.sort { $0.0 < $1.0 || ($0.0 == $1.0 && $0.1 < $1.1) }
        var running = 0, most = 0
        for (_, d) in edges { running += d; most = max(most, running) }
        #expect(most <= 3 && most >= 2, "at most the queue's limit at once: \(most)")
    }
}

extension CommandTests {
    @Test func threadsDoNotGrowWithTheCommandsRunning() throws {
        let spool = TestSpool()
        let config = try spool.configure([
            "queues": ["procs": ["maxConcurrentOperationCount": 300]],
            // Long enough that a hundred are running at once on a loaded machine (spawning at ≥ 35 a second).
            "commands": ["nap": command(["/bin/sleep", "3"], ["queue": "procs"])],
        ])
        try spool.start(config)
        let pid = try #require(spool.daemon?.processIdentifier)
        func threads() -> Int {
            let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("Threads:") }
            return line.flatMap { Int($0.split(separator: "\t").last ?? "") } ?? 0
        }
        let idle = threads()
        try spool.drop("n.plist", ["job": "n", "operations": (0..<300).map { commandOp("n\($0)", "nap") }])
        var most = 0, children = 0
        while spool.result("n", timeout: 0.02) == nil {
            most = max(most, threads())
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
            children = max(children, tasks.reduce(0) {
                $0 + ((try? String(contentsOfFile: "/proc/\(pid)/task/\($1)/children", encoding: .utf8)) ?? "").split(separator: " ").count
            })
            if most > 1000 { break }
        }
        #expect(children >= 100, "many commands ran at once: \(children)")
        #expect(most < idle + 20, "threads idle \(idle), at most \(most) with \(children) commands running")
        #expect(spool.result("n")?["status"] as? String == "succeeded")
    }
}
