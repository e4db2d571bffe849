// The resource-fault campaign (issue 5.2), on a spool of its own: a 48 MB ext4 file system on a loop
// device (root only), so that faults are real and hit nothing else. For each fault, jobs are dropped, the
// fault is made while they run, held, and cleared; the daemon must say so in its log, keep answering
// `status`, lose nothing, and finish every job once the fault is gone, without a restart.
//
//   full       the file system filled to the last block (mkfs -m 0: no blocks reserved for root)
//   emfile     once the daemon is ready, `prlimit --pid` leaves it no descriptor above what it holds (soft
//              limit), and jobs open a dozen files at once; the limit is raised again to clear it. `status`
//              is answered all the same: the control server keeps a descriptor in reserve for it
//   readonly   the daemon runs as `nobody` (setpriv) and outbox/ is made read-only (chmod 0555)
//   frozen     the file system frozen (fsfreeze): every write and sync blocks, the slowest disk there is
//
// Figures per fault: jobs, outbox, lost, duplicated, failed because of the fault (an operation's error
// names it: a `write` into a full disk fails like any write), paused (the log says claiming paused),
// recovered (the log says the spool works again), status p99 while the fault lasted.

import ControlPlane
import Daemon
import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

struct FaultCampaign {
    var parent: String
    var jobs: Int
    var only: String?

    @discardableResult
    func sh(_ command: String) -> Int32 {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/sh")
        p.arguments = ["-c", command]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try? p.run()
        p.waitUntilExit()
        return p.terminationStatus
    }

    struct Fault {
        var name: String
        var asNobody = false
        var expectPause = true
        /// Operations per job opening files at once.
        var width = 1
        /// Given the daemon's pid; before the jobs are dropped when `beforeJobs`, else 150 ms after.
        var inject: (Int32) -> Void = { _ in }
        var clear: (Int32) -> Void = { _ in }
        var beforeJobs = false
        var hold = 3.0
        /// Words an operation's error has when the fault made it fail.
        var errorWords: [String] = []
    }

    func run() throws -> Bool {
        guard getuid() == 0 else {
            say("campaign=faults needs root (a loop-mounted file system, setpriv, fsfreeze)")
            return false
        }
        let base = parent + "/opq-faults-\(getpid())"
        let mount = base + "/mnt"
        let image = base + "/disk.img"
        let images = base + "/images"
        try FileManager.default.createDirectory(atPath: mount, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: images, withIntermediateDirectories: true)
        for i in 0..<4 { try sampleJPEG(width: 640, height: 480, seed: i).write(to: URL(fileURLWithPath: "\(images)/photo\(i).jpg")) }
        // Binaries and images where `nobody` can read them.
        sh("chmod 755 \(base) \(images); chmod 644 \(images)/*")
        let loop = "\(base)/loopdev"
        guard sh("truncate -s 48M \(image) && losetup -f --show \(image) > \(loop) && mkfs.ext4 -q -m 0 $(cat \(loop)) "
                 + "&& mount $(cat \(loop)) \(mount)") == 0 else {
            say("campaign=faults could not make a loop-mounted file system")
            sh("[ -s \(loop) ] && losetup -d $(cat \(loop))")
            return false
        }
        defer {
            sh("fsfreeze -u \(mount); umount \(mount); losetup -d $(cat \(loop))")
            try? FileManager.default.removeItem(atPath: base)
        }
        let filler = mount + "/filler"
        var faults: [Fault] = [
            Fault(name: "full", inject: { [self] _ in
                // Everything but a few blocks, then the rest byte by byte.
                sh("dd if=/dev/zero of=\(filler) bs=1M status=none; dd if=/dev/zero bs=4k status=none >> \(filler); sync")
            }, clear: { _ in unlink(filler) }, errorWords: ["No space left"]),
            // No descriptor above what the daemon holds once ready, set on the running daemon: the next inbox
            // scan, claim or copy runs out, whatever the daemon's own count is on this machine. (A margin left
            // room that the engine's copies and the spool did not always fill at once: a pause by chance.)
            // The soft limit only: raising a hard limit again needs CAP_SYS_RESOURCE, which a container's
            // root may not have.
            Fault(name: "emfile", width: 12, inject: { [self] pid in
                let open = steadyLowestFreeDescriptor(pid)
                sh("prlimit --pid \(pid) --nofile=\(open):")
            }, clear: { [self] pid in sh("prlimit --pid \(pid) --nofile=1024:") }, beforeJobs: true, errorWords: ["Too many open files"]),
            Fault(name: "readonly", asNobody: true, inject: { [self] _ in sh("chmod 555 \(mount)/spool/outbox") },
                  clear: { [self] _ in sh("chmod 755 \(mount)/spool/outbox") }),
            Fault(name: "frozen", expectPause: false, inject: { [self] _ in sh("sync; fsfreeze -f \(mount) &") },
                  clear: { [self] _ in sh("fsfreeze -u \(mount)") }, hold: 4),
        ]
        if let only { faults = faults.filter { $0.name == only } }
        var ok = true
        for fault in faults {
            ok = try runFault(fault, mount: mount, images: images, base: base) && ok
        }
        return ok
    }

    func runFault(_ fault: Fault, mount: String, images: String, base: String) throws -> Bool {
        let root = mount + "/spool"
        sh("rm -rf \(root)")
        try FileManager.default.createDirectory(atPath: root + "/inbox", withIntermediateDirectories: true)
        let spool = CampaignSpool(root: root, config: base + "/\(fault.name).config.plist")
        try plistData(["maxActiveJobs": 8, "download": ["fileRoots": [images]], "queues": ["io": ["maxConcurrentOperationCount": 16]]],
                      binary: false)
            .write(to: URL(fileURLWithPath: spool.config))
        var prefix: [String] = []
        if fault.asNobody {
            sh("chown -R 65534:65534 \(root); chmod 644 \(spool.config)")
            prefix = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        }
        let log = base + "/\(fault.name).log"
        let daemon = try DaemonProcess(spool: spool, log: log, prefix: prefix)
        guard daemon.waitUntilReady(spool) else {
            say("campaign=faults fault=\(fault.name) the daemon did not start; see \(log)")
            return false
        }
        if fault.beforeJobs { fault.inject(daemon.pid) }
        let names = dropJobs(fault, spool: spool, images: images)
        usleep(150_000)
        if !fault.beforeJobs { fault.inject(daemon.pid) }
        var latencies: [Double] = []
        var paused = false
        let holdEnd = now() + fault.hold
        while now() < holdEnd && daemon.isRunning {
            let t0 = now()
            let status = try? ControlClient.request(root + "/opqueued.sock", ["command": "status"], timeout: 5)
            latencies.append((now() - t0) * 1000)
            if status?["fault"] != nil { paused = true }
            usleep(20_000)
        }
        fault.clear(daemon.pid)
        let deadline = now() + 90
        while list(spool.outbox).count < jobs && now() < deadline && daemon.isRunning {
            let t0 = now()
            _ = try? ControlClient.request(root + "/opqueued.sock", ["command": "status"], timeout: 5)
            latencies.append((now() - t0) * 1000)
            usleep(50_000)
        }
        let alive = daemon.isRunning
        daemon.signal(SIGTERM)
        let exit = daemon.wait(timeout: 30)
        return judge(fault, spool: spool, log: log, names: names, latencies: latencies, paused: paused, alive: alive, exit: exit)
    }

    /// The jobs run under a fault: a short sleep, then `width` downloads each written to a file.
    func dropJobs(_ fault: Fault, spool: CampaignSpool, images: String) -> [String] {
        var names: [String] = []
        for i in 0..<jobs {
            var ops: [[String: Any]] = [["id": "s", "kind": "sleep", "seconds": 0.05]]
            for w in 0..<fault.width {
                ops.append(["id": "get\(w)", "kind": "download", "url": "file://\(images)/photo\((i + w) % 4).jpg", "dependencies": ["s"]])
                ops.append(["id": "save\(w)", "kind": "write", "path": "copy\(w).jpg", "dependencies": ["get\(w)"]])
            }
            let name = "\(fault.name)\(i)"
            names.append(name)
            drop(spool.inbox, name + ".plist", plistData(["job": name, "operations": ops]))
        }
        return names
    }

    /// Reports a fault's run and judges it: nothing lost or duplicated, every failure the fault's, no crash, nothing left
    /// over, the daemon alive and stopped cleanly, and claiming paused and resumed where the fault must pause it.
    func judge(_ fault: Fault, spool: CampaignSpool, log: String, names: [String], latencies: [Double], paused: Bool,
               alive: Bool, exit: Int32?) -> Bool {
        let root = spool.root
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        let paused = paused || text.contains("claiming is paused")
        let recovered = text.contains("the spool works again")
        let entries = Set(list(spool.outbox))
        let lost = names.filter { !entries.contains($0) }
        let duplicated = entries.subtracting(names)
        var failedByFault = 0, unexplained: [String] = []
        for name in names where entries.contains(name) {
            guard let result = readPlist(spool.outbox + "/" + name + "/result.plist") else {
                unexplained.append("\(name): no result.plist"); continue
            }
            guard result["status"] as? String != "succeeded" else { continue }
            let errors = (result["operations"] as? [[String: Any]] ?? []).compactMap { $0["error"] as? String }
            if errors.contains(where: { e in fault.errorWords.contains { e.contains($0) } }) { failedByFault += 1 } else {
                unexplained.append("\(name): \(result["status"] ?? "?") \(errors.first ?? "")")
            }
        }
        let crashes = crashReports(log)
        let leftovers = list(root + "/active") + list(root + "/tmp")
        say(String(format: "campaign=faults fault=%@ jobs=%d outbox=%d lost=%d duplicated=%d failed_by_fault=%d other_failures=%d "
                   + "paused=%@ recovered=%@ daemon_survived=%@ exit=%@ status_p99_ms=%.1f status_max_ms=%.1f",
                   fault.name, jobs, entries.count, lost.count, duplicated.count, failedByFault, unexplained.count, paused ? "yes" : "no",
                   recovered ? "yes" : "no", alive ? "yes" : "no", exit.map(String.init) ?? "hang", percentile(latencies, 0.99),
                   latencies.max() ?? 0))
        for line in (unexplained + crashes + leftovers.map { "left \($0)" }).prefix(10) { say("  \(line)") }
        let good = lost.isEmpty && duplicated.isEmpty && unexplained.isEmpty && crashes.isEmpty && leftovers.isEmpty && alive && exit == 0
            && (!fault.expectPause || (paused && recovered))
        if !good { say("  log: \(log) (kept)"); sh("cp \(log) \(parent)/") }
        return good
    }
}
