// The control socket's edges (issue 12), through the real binaries outside systemd: clients that hang up, idle
// connections by the thousand, more connections than the cap, garbage, `graph` of a running job, and the console's
// MESSAGE_IDs. Also the admission state machine on its own.

@testable import ControlPlane
import Foundation
import SystemdJournal
import Testing
import TestSupport
@testable import Daemon
import SystemCalls
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// Raises this process's open-file limit to at least `wanted` (children inherit it); false when the hard limit is lower.
func raiseOwnFileLimit(to wanted: rlim_t) -> Bool {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_max >= wanted else { return false }
    if limit.rlim_cur < wanted {
        limit.rlim_cur = wanted
        guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return false }
    }
    return true
}

/// Waits at most `seconds` for one line on a connected socket.
func readAnswer(_ fd: Int32, seconds: Int = 5) -> [String: Any]? {
    guard case .line(let line) = readLine(fd, limit: 1 << 20, deadline: monotonicSeconds() + Double(seconds)) else { return nil }
    return (try? JSONSerialization.jsonObject(with: line)) as? [String: Any]
}

extension TestSpool {
    var socketPath: String { root + "/opqueued.sock" }

    /// The daemon answers `status` (in-process client) and `opqueuectl status` exits 0.
    func expectServing(_ comment: Comment) throws {
        #expect(daemon?.isRunning == true, "the daemon died: \(comment)")
        let answer = try? ControlClient.request(socketPath, ["command": "status"], timeout: 5)
        #expect(answer?["exit"] as? Int == 0, "status: \(comment)")
        #expect(try ctl(["status"]).status == 0, "opqueuectl status: \(comment)")
    }

    /// Drops a job of one `sleep` and waits for it; the seconds it took from the drop to the outbox.
    func runSleep(_ job: String, _ seconds: Double, timeout: Double = 10) throws -> Double? {
        let start = Date()
        try drop(job + ".plist", ["job": job, "operations": [sleepOp("s", seconds)]])
        guard let result = result(job, timeout: timeout) else { return nil }
        #expect(result["status"] as? String == "succeeded")
        return Date().timeIntervalSince(start)
    }
}

@Suite(.serialized, .onItsOwnExecutor) struct ControlTests {
    @Test func clientsThatHangUpDoNotStopTheDaemon() throws {
        let spool = TestSpool()
        try spool.start()
        for round in 0..<20 {
            // Connect and close without a word (a readiness probe).
            close(try ControlClient.connect(spool.socketPath))
            // Half a line, then close.
            var fd = try ControlClient.connect(spool.socketPath)
            try sendAll(fd, Array("{\"command\":\"sta".utf8), path: spool.socketPath)
            close(fd)
            // A whole request, then close before the answer is read (its write meets a closed peer).
            fd = try ControlClient.connect(spool.socketPath)
            try sendAll(fd, Array("{\"command\":\"status\"}\n".utf8), path: spool.socketPath)
            close(fd)
            // Garbage and a reset: SO_LINGER 0 makes the close an RST.
            fd = try ControlClient.connect(spool.socketPath)
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
            try sendAll(fd, Array("\u{1}\u{2}garbage\n".utf8), path: spool.socketPath)
            close(fd)
            if round % 5 == 4 { usleep(50_000) }
        }
        usleep(300_000)
        try spool.expectServing("after clients that hung up")
        #expect(try spool.runSleep("after-hangups", 0.05) != nil, "a job still runs")
    }

    @Test func onceSurvivesAStderrWhoseReaderIsGone() throws {
        // `opqueued --once … 2>&1 | head -1`: the console's writes meet a pipe nobody reads. SIGPIPE is ignored in
        // --once too, so the lines are lost, not the run.
        let spool = TestSpool()
        try spool.drop("p.plist", ["job": "piped", "operations": [sleepOp("a", 0), sleepOp("b", 0, deps: ["a"])]])
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binaries + "/opqueued")
        process.arguments = ["--spool", spool.root, "--once", "--log-target", "console"]
        let pipe = Pipe()
        process.standardError = pipe
        process.standardOutput = pipe
        try process.run()
        try pipe.fileHandleForReading.close()
        process.waitUntilExit()
        #expect(process.terminationReason == .exit && process.terminationStatus == 0,
                "ended by \(process.terminationReason == .exit ? "exit" : "signal") \(process.terminationStatus)")
        #expect(spool.result("piped", timeout: 1)?["status"] as? String == "succeeded")
    }

    @Test func aThousandIdleConnectionsStallNeitherStatusNorJobs() throws {
        try #require(raiseOwnFileLimit(to: 4096), "the hard limit of open files is below 4096")
        let spool = TestSpool()
        try spool.start()
        var idle: [Int32] = []
        defer { for fd in idle { close(fd) } }
        for _ in 0..<1000 { idle.append(try ControlClient.connect(spool.socketPath)) }
        // Every one of them is connected and silent now; status answers at once all the same.
        var slowest = 0.0
        for _ in 0..<10 {
            let start = Date()
            let answer = try ControlClient.request(spool.socketPath, ["command": "status"], timeout: 5)
            slowest = max(slowest, Date().timeIntervalSince(start))
            #expect(answer["exit"] as? Int == 0)
        }
        #expect(slowest < 1, "status took \(slowest) s with 1,000 idle connections")
        #expect(try spool.ctl(["status"]).status == 0)
        let took = try #require(try spool.runSleep("idle-1000", 0.2))
        #expect(took < 3, "a 0.2 s sleep took \(took) s with 1,000 idle connections")
        #expect(spool.daemon?.isRunning == true)
    }

    @Test func connectionsBeyondTheCapMakeRoomByClosingTheOldestIdleOnes() throws {
        try #require(raiseOwnFileLimit(to: 4096), "the hard limit of open files is below 4096")
        let spool = TestSpool()
        try spool.start()
        var idle: [Int32] = []
        defer { for fd in idle { close(fd) } }
        for _ in 0..<300 { idle.append(try ControlClient.connect(spool.socketPath)) }
        // 300 > 256: the 44 oldest were closed with an answer saying why, the newest are still open.
        for fd in idle.prefix(44) {
            let answer = readAnswer(fd, seconds: 3)
            #expect(answer?["exit"] as? Int == 3, "an evicted connection's answer: \(String(describing: answer))")
            #expect((answer?["error"] as? String)?.contains("256 connections") == true)
        }
        var pollfd = Glibc.pollfd(fd: idle[299], events: Int16(POLLIN), revents: 0)
        #expect(poll(&pollfd, 1, 200) == 0, "the newest idle connection is still open and unanswered")
        try spool.expectServing("with 300 connections opened")
        // The request deadline then closes the silent ones with an error.
        let late = readAnswer(idle[299], seconds: 10)
        #expect(late?["exit"] as? Int == 64 && (late?["error"] as? String)?.contains("no request line") == true,
                "\(String(describing: late))")
    }

    @Test func garbageGetsAnErrorAnswerAndOpqueuectlMapsTheExitCode() throws {
        let spool = TestSpool()
        try spool.start()
        func ask(_ bytes: [UInt8]) throws -> [String: Any]? {
            let fd = try ControlClient.connect(spool.socketPath)
            defer { close(fd) }
            try? sendAll(fd, bytes, path: spool.socketPath)
            return readAnswer(fd)
        }
        for garbage in ["hello\n", "[1,2]\n", "{\"command\":\n", "\u{0}\u{FF}\n"] {
            let answer = try ask(Array(garbage.utf8))
            #expect(answer?["exit"] as? Int == 64, "\(garbage.debugDescription): \(String(describing: answer))")
            #expect((answer?["error"] as? String)?.contains("malformed request") == true)
        }
        let unknown = try ask(Array("{\"command\":\"frobnicate\"}\n".utf8))
        #expect(unknown?["exit"] as? Int == 64 && unknown?["error"] as? String == "unknown command 'frobnicate'")
        let long = try ask([UInt8](repeating: UInt8(ascii: "x"), count: 70_000))
        #expect(long?["exit"] as? Int == 64 && (long?["error"] as? String)?.contains("longer than 65536 bytes") == true,
                "\(String(describing: long))")
        // The last line of a client that shuts its side down need not end with a newline.
        let fd = try ControlClient.connect(spool.socketPath)
        try sendAll(fd, Array("{\"command\":\"status\"}".utf8), path: spool.socketPath)
        shutdown(fd, Int32(SHUT_WR))
        #expect(readAnswer(fd)?["exit"] as? Int == 0)
        close(fd)
        // opqueuectl exits with the answer's code: 1 for an unknown job or queue.
        let show = try spool.ctl(["show", "nosuchjob"])
        #expect(show.status == 1 && show.stderr.contains("unknown job 'nosuchjob'"), "\(show)")
        #expect(try spool.ctl(["suspend", "nosuchqueue"]).status == 1)
        try spool.expectServing("after garbage")
    }

    /// A TCP connection to `address` (IPv4 HOST:PORT), sending `request`.
    static func connectTCP(_ address: String, sending request: String) throws -> Int32 {
        let parts = address.split(separator: ":")
        guard parts.count == 2, let port = UInt16(parts[1]) else { throw POSIXError(.EINVAL) }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        var sin = sockaddr_in()
        sin.sin_family = sa_family_t(AF_INET)
        sin.sin_port = port.bigEndian
        inet_pton(AF_INET, String(parts[0]), &sin.sin_addr)
        let connected = withUnsafePointer(to: &sin) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { close(fd); throw POSIXError(.ECONNREFUSED) }
        _ = request.withCString { send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
        return fd
    }

    @Test func withNoDescriptorLeftStatusAndMetricsAreStillAnswered() throws {
        let spool = TestSpool()
        try spool.start(spool.configure(["metrics": ["listen": "127.0.0.1:0"]]))
        let metrics = try #require(metricsAddress(spool))
        let pid = try #require(spool.daemon?.processIdentifier)
        // libdispatch's timer descriptors, one per clock it has, are open from the start: none opened later can take
        // the place a reserve gives up for a client (nor fail for want of one, leaving that clock's timers unarmed).
        #expect(timerClocks(pid).isSuperset(of: [0, 1, 7]), "timerfd clocks of the ready daemon: \(timerClocks(pid).sorted())")
        // The soft limit set to the daemon's lowest free descriptor number: no descriptor is left.
        let held = steadyLowestFreeDescriptor(pid)
        let table = descriptorTable(pid)
        // util-linux's prlimit (Glibc's prlimit(2) wrapper is a GNU extension Swift does not see); the soft limit only.
        let original = try run("/usr/bin/prlimit", ["--pid", "\(pid)", "--nofile", "--raw", "--noheadings", "--output=SOFT"])
        let soft = try #require(Int(original.stdout.trimmingCharacters(in: .whitespacesAndNewlines)), "prlimit: \(original)")
        func setSoft(_ limit: Int) throws -> Int32 { try run("/usr/bin/prlimit", ["--pid", "\(pid)", "--nofile=\(limit):"]).status }
        try #require(try setSoft(held) == 0)
        defer { _ = try? setSoft(soft) }

        // The descriptor the server keeps in reserve takes the client; again once that one has closed. Without it
        // the loop retried accept at once for as long as the client waited (NIO keeps the read pending on EMFILE).
        let before = processCPUSeconds(pid)
        for round in 0..<3 {
            let answer = try? ControlClient.request(spool.socketPath, ["command": "status"], timeout: 5)
            #expect(answer?["exit"] as? Int == 0, "status with no descriptor left, round \(round): \(String(describing: answer))")
        }
        // And a scrape of the metrics listener at once, while the last status connection may still be closing: the
        // reserve is one for both listeners, so the slot the control socket takes back is one the scrape can free.
        let scrape = try Self.connectTCP(metrics, sending: "GET /metrics HTTP/1.0\r\n\r\n")
        defer { close(scrape) }
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(scrape, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var head = [UInt8](repeating: 0, count: 64)
        let got = recv(scrape, &head, head.count, 0)
        let status = String(decoding: head.prefix(max(0, got)), as: UTF8.self)
        #expect(status.hasPrefix("HTTP/1.1 200") || status.hasPrefix("HTTP/1.0 200"),
                """
                a scrape with no descriptor left: \(status.debugDescription); \
                descriptors since the limit was set: \(descriptorChanges(from: table, to: descriptorTable(pid)))
                """)
        let spent = processCPUSeconds(pid) - before
        #expect(spent < 0.5, "the daemon used \(spent) s of CPU answering with no descriptor left")
        #expect(try setSoft(soft) == 0)
        try spool.expectServing("after running out of descriptors")
    }

    /// A daemon with no room left claims nothing more, but what piles up in its inbox is what an operator watches
    /// (status's `waiting`, `opqueued_inbox_files`): it is counted within the rescan interval, not left at what the
    /// inbox held when the daemon filled up.
    @Test func aFullDaemonCountsWhatPilesUpInItsInbox() throws {
        let spool = TestSpool()
        try spool.start(spool.configure(["maxActiveJobs": 1]))
        func waiting() -> Int? { (try? ControlClient.request(spool.socketPath, ["command": "status"], timeout: 5))?["waiting"] as? Int }
        func inboxFiles() -> Double? { try? Scrape.parse(spool.ctl(["metrics"]).stdout).value("opqueued_inbox_files") }
        try spool.drop("first.plist", ["job": "first", "operations": [sleepOp("a", 60)]])
        var active = false
        for _ in 0..<200 where !active {
            let answer = try? ControlClient.request(spool.socketPath, ["command": "status"], timeout: 5)
            active = answer?["activeJobs"] as? [String] == ["first"]
            if !active { usleep(25_000) }
        }
        try #require(active, "the first job runs")
        for i in 0..<3 { try spool.drop("later\(i).plist", ["job": "later\(i)", "operations": [sleepOp("a", 0)]]) }
        var counted: (Int?, Double?) = (nil, nil)
        for _ in 0..<100 {
            counted = (waiting(), inboxFiles())
            if counted.0 == 3 && counted.1 == 3 { break }
            usleep(50_000)
        }
        #expect(counted.0 == 3 && counted.1 == 3,
                "status waiting \(String(describing: counted.0)), opqueued_inbox_files \(String(describing: counted.1)); 3 in the inbox")
        #expect(Set(spool.list("inbox")) == ["later0.plist", "later1.plist", "later2.plist"],
                "nothing more is claimed: \(spool.list("inbox"))")
        #expect(try spool.ctl(["cancel", "first"]).status == 0)
        for i in 0..<3 { #expect(spool.result("later\(i)")?["status"] as? String == "succeeded") }
        #expect(waiting() == 0)
    }

    @Test func graphOfARunningJobDrawsItsLiveStates() throws {
        let spool = TestSpool()
        try spool.start()
        try spool.drop("live.plist", ["job": "live", "operations": [sleepOp("first", 30), sleepOp("second", 0, deps: ["first"])]])
        var states: [String] = []
        let deadline = Date().addingTimeInterval(10)
        repeat {
            let answer = try? ControlClient.request(spool.socketPath, ["command": "show", "job": "live"], timeout: 5)
            states = (answer?["operations"] as? [[String: Any]] ?? []).compactMap { $0["state"] as? String }
            if states.first == "executing" { break }
            usleep(20_000)
        } while Date() < deadline
        #expect(states.first == "executing")
        let graph = try spool.ctl(["graph", "live"])
        #expect(graph.status == 0, "\(graph)")
        #expect(graph.stdout.hasPrefix("digraph \"live\" {"), "\(graph.stdout)")
        let node = "\"first\" [label=\"first\\nsleep · default\\nexecuting\", fillcolor=lightblue];"
        #expect(graph.stdout.contains(node), "\(graph.stdout)")
        #expect(graph.stdout.contains("\"second\" [label=\"second\\nsleep · default\\npending\", fillcolor=gray80];"), "\(graph.stdout)")
        #expect(graph.stdout.contains("\"first\" -> \"second\";"), "\(graph.stdout)")
        #expect(try spool.ctl(["cancel", "live"]).status == 0)
        #expect(spool.result("live")?["status"] as? String == "cancelled")
        // Ended: from the outbox, with the final states.
        let ended = try spool.ctl(["graph", "live"])
        #expect(ended.stdout.contains("\"first\" [label=\"first\\nsleep · default\\ncancelled\", fillcolor=gray60];"), "\(ended.stdout)")
        let unknown = try spool.ctl(["graph", "nosuchjob"])
        #expect(unknown.status == 1 && unknown.stderr.contains("unknown job 'nosuchjob'"), "\(unknown)")
    }

    /// An ended job's graph is drawn without --config when its manifest uses a command only the daemon's
    /// configuration declares: opqueuectl checks it as submit does, with what the running daemon takes.
    @Test func graphOfAnEndedJobKnowsTheDaemonsCommands() throws {
        let spool = TestSpool()
        try spool.start(try spool.configure(["commands": ["hi": ["argv": ["/bin/echo", "hi"]]]]))
        try spool.drop("q.plist", ["job": "q", "operations": [["id": "c", "kind": "command", "command": "hi"]]])
        #expect(spool.result("q")?["status"] as? String == "succeeded")
        let graph = try spool.ctl(["graph", "q"])
        #expect(graph.status == 0, "\(graph)")
        #expect(graph.stdout.contains("\"c\" [label=\"c\\ncommand · default\\nsucceeded\""), "\(graph.stdout)")
    }

    /// validate and submit without --config check a file URL against the running daemon's download.fileRoots (they
    /// were checked against none, so a URL the daemon takes was refused): under a root it passes and the job reads
    /// it; outside every root it is refused, exit 1, naming the path, and nothing is placed in the inbox.
    @Test func validateAndSubmitKnowTheDaemonsFileRoots() throws {
        let spool = TestSpool()
        let roots = spool.root + "/files"
        #expect(mkdir(roots, 0o755) == 0)
        try Data("hello".utf8).write(to: URL(fileURLWithPath: roots + "/a.txt"))
        try spool.start(try spool.configure(["download": ["fileRoots": [roots]]]))
        let manifest = spool.root + "/m.plist"
        func write(_ job: String, _ path: String) throws {
            try plist(["job": job, "operations": [["id": "d", "kind": "download", "url": "file://" + path],
                                                  ["id": "w", "kind": "write", "path": "a.txt", "dependencies": ["d"]]]])
                .write(to: URL(fileURLWithPath: manifest))
        }
        try write("inside", roots + "/a.txt")
        let valid = try spool.ctl(["validate", manifest])
        #expect(valid.status == 0, "\(valid)")
        let submitted = try spool.ctl(["submit", manifest])
        #expect(submitted.status == 0 && submitted.stdout == "inside\n", "\(submitted)")
        #expect(spool.result("inside")?["status"] as? String == "succeeded")
        #expect(try String(contentsOfFile: spool.root + "/outbox/inside/a.txt", encoding: .utf8) == "hello")
        try write("outside", "/etc/hostname")
        // validate prints the problems on standard output, submit on standard error (its output is job ids).
        for verb in ["validate", "submit"] {
            let refused = try spool.ctl([verb, manifest])
            let said = verb == "validate" ? refused.stdout : refused.stderr
            #expect(refused.status == 1 && (verb == "validate" || refused.stdout.isEmpty), "\(verb): \(refused)")
            #expect(said.contains("operation 'd': /etc/hostname is not under a configured file root (download.fileRoots)"),
                    "\(verb): \(refused)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: spool.root + "/inbox").isEmpty, "nothing submitted")
        spool.signal(SIGTERM)
        #expect(spool.waitForExit() == 0)
    }

    @Test func consoleLinesCarryTheJournalsMessageIDs() throws {
        try ensureJournald()
        let job = "console-" + UUID().uuidString.prefix(8)
        let manifest: [String: Any] = ["job": job,
                                       "operations": [sleepOp("a", 0), ["id": "b", "kind": "fail", "message": "no", "dependencies": ["a"]],
                                                                  sleepOp("c", 0, deps: ["b"])]]
        // The same job, once to the console and once to the journal.
        let console = TestSpool()
        try console.drop("j.plist", manifest)
        let r = try run("opqueued", ["--spool", console.root, "--once", "--log-target", "console"])
        #expect(r.status == 0)
        var fromConsole: [String: String] = [:]
        for line in r.stderr.split(separator: "\n") {
            let fields = Dictionary(line.split(separator: " ").compactMap { field -> (String, String)? in
                guard let eq = field.firstIndex(of: "=") else { return nil }
                return (String(field[..<eq]), String(field[field.index(after: eq)...]))
            }, uniquingKeysWith: { first, _ in first })
            guard let event = fields["OPQ_EVENT"], let state = fields["OPQ_STATE"] else { continue }
            #expect(fields["MESSAGE_ID"] != nil, "no MESSAGE_ID in: \(line)")
            fromConsole["\(event)/\(state)"] = fields["MESSAGE_ID"]
        }
        let journal = TestSpool()
        try journal.drop("j.plist", manifest)
        #expect(try run("opqueued", ["--spool", journal.root, "--once", "--log-target", "journal"]).status == 0)
        var fromJournal: [String: String] = [:]
        let deadline = Date().addingTimeInterval(10)
        repeat {
            usleep(100_000)
            let out = try run("/usr/bin/journalctl", ["-t", "opqueued", "OPQ_JOB=\(job)", "-o", "json", "--no-pager"]).stdout
            let entries = out.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            for entry in entries {
                if let event = entry["OPQ_EVENT"] as? String,
                   let state = entry["OPQ_STATE"] as? String { fromJournal["\(event)/\(state)"] = entry["MESSAGE_ID"] as? String }
            }
        } while fromJournal["job/finished"] == nil && Date() < deadline
        // Every (event, state) of the job: the same MESSAGE_ID on both targets, and the catalog's.
        let catalog = try String(contentsOfFile: repositoryRoot + "/systemd/opqueued.catalog", encoding: .utf8)
        let pairs = ["job/received", "job/accepted", "job/finished", "operation/pending", "operation/ready", "operation/executing",
                     "operation/succeeded", "operation/failed", "operation/cancelled"]
        for pair in pairs {
            let id = try #require(fromConsole[pair], "the console logged no \(pair)")
            #expect(fromJournal[pair] == id, "\(pair): journal \(fromJournal[pair] ?? "none"), console \(id)")
            let parts = pair.split(separator: "/")
            #expect(catalog.contains("-- \(id)\nSubject: opqueued \(parts[0]) \(parts[1])\n"), "\(pair)")
        }
        #expect(
            fromConsole["daemon/stopping"] == nil || fromConsole["daemon/stopping"] == MessageIDs.id(event: "daemon", state: "stopping"))
    }
}

@Suite(.onItsOwnExecutor) struct ControlAdmissionTests {
    @Test func theOldestIdleConnectionMakesRoomAndAnsweringOnesAreNeverEvicted() {
        var admission = ControlAdmission<String>(limit: 3)
        var ticket: [String: UInt64] = [:]
        func admit(_ name: String) -> ControlAdmission<String>.Decision {
            let (t, decision) = admission.admit(name)
            ticket[name] = t
            return decision
        }
        for name in ["a", "b", "c"] {
            guard case .admitted(nil) = admit(name) else { Issue.record("\(name) not admitted"); return }
        }
        // a is being answered: b (the oldest idle) makes room for d.
        let answering = admission.startAnswering(ticket["a"] ?? 0)
        #expect(answering)
        guard case .admitted(let evicted?) = admit("d") else { Issue.record("no room made"); return }
        #expect(evicted == "b")
        let evictedAnswered = admission.startAnswering(ticket["b"] ?? 0)
        #expect(!evictedAnswered, "an evicted connection is not answered")
        admission.closed(ticket["b"] ?? 0)
        #expect(admission.open == 3 && admission.idleCount == 2)
        // All three being answered: the next is busy until one closes.
        let both = admission.startAnswering(ticket["c"] ?? 0) && admission.startAnswering(ticket["d"] ?? 0)
        #expect(both)
        guard case .busy = admit("e") else { Issue.record("admitted beyond the limit"); return }
        admission.closed(ticket["a"] ?? 0)
        guard case .admitted(nil) = admit("f") else { Issue.record("no room after a close"); return }
        #expect(admission.open == 3)
    }
}

/// What `submitted` answers from: the last names recorded, each with its latest id, the oldest name going first.
@Suite(.onItsOwnExecutor) struct RecentNamesTests {
    @Test func theOldestNameGoesFirstAndANameRecordedAgainKeepsItsPlace() {
        var names = RecentNames(capacity: 2)
        names.record("a.plist", (1, "a"))
        names.record("b.plist", (2, "b"))
        names.record("a.plist", (3, "a.1"))
        #expect(names["a.plist"]?.job == "a.1" && names["a.plist"]?.inode == 3)
        names.record("c.plist", (4, "c"))
        #expect(names["a.plist"] == nil, "the oldest name went")
        #expect(names["b.plist"]?.job == "b" && names["c.plist"]?.job == "c")
        names.record("d.plist", (nil, "d"))
        #expect(names["b.plist"] == nil && names["c.plist"]?.job == "c" && names["d.plist"]?.job == "d")
    }
}
