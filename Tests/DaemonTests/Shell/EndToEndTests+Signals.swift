// The real daemon and its signals: SIGTERM drains and SIGHUP reloads, even while it starts; SIGUSR1 and SIGUSR2
// are logged and ignored; closed standard descriptors; what a reload may and may not change.

import Foundation
import Testing
import TestSupport
@testable import Daemon

extension EndToEndTests {
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
    @Test func sighupOfAConfigurationThatIsAFIFOIsRefusedAndOneThatIsALinkIsRead() throws {
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
        // A configuration that is a symbolic link (to a regular file) is read where it leads.
        let target = spool.configPath + ".real"
        try spool.configure(["queues": ["default": ["suspended": false]]])
        try FileManager.default.moveItem(atPath: spool.configPath, toPath: target)
        #expect(symlink(target, spool.configPath) == 0)
        spool.signal(SIGHUP)
        #expect(eventually(10) { log().contains("OPQ_EVENT=queue OPQ_QUEUE=default OPQ_STATE=resumed") }, "\(log())")
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
}
