// ClusterJobStore (SPEC §8) against a real throwaway PostgreSQL (Tests/Support/PostgresServer.swift): two nodes,
// each its own spool and a fake shell (ClusterNodeFixtures.swift), on one database. Here submission from one node's
// inbox and its claim on the other with the files written, exactly once across a crash between the insert's commit
// and the removal of the local copy, a full spool, and rows that are garbage or past a claim's budget.

import Foundation
import Logging
import SpoolFiles
import Synchronization
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel
import CShims
import OperationEngine
import PropertyList
import SystemCalls
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite("ClusterJobStore", .serialized, .onItsOwnExecutor)
struct ClusterJobStoreTests {
    /// Submitted on A, claimed by B within a wake-up (LISTEN/NOTIFY, not the 1 s poll), files written on B before
    /// `run`, A's local copy gone; B's fenced end recorded.
    @Test func submitOnAClaimedByB() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database)
        let b = try ClusterNode("b", server: server, database: database)
        defer { a.close(); b.close() }
        #expect(a.store.recovered([]).isEmpty && b.store.recovered([]).isEmpty)
        a.store.want(room: 0, manifestBytes: .max)
        b.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.store.snapshot()?.connected == true && b.store.snapshot()?.connected == true })
        // Let both settle into idleness, so that the claim below is woken, not polled.
        usleep(1_200_000)

        let manifest = sleepManifest("holiday")
        let claimed = try a.drop("holiday", manifest)
        let submittedAt = monotonicSeconds()
        #expect(a.store.submit([claimed]).isEmpty, "the cluster runs nothing at once")
        #expect(eventually { b.shell.ran.count == 1 })
        let (job, at) = try #require(b.shell.ran.first)
        let latency = at - submittedAt
        print("ClusterJobStoreTests: submit on a → run on b in \(Int(latency * 1000)) ms")
        #expect(latency < 0.9, "woken by NOTIFY (poll is 1 s): \(latency) s")
        #expect(job.id == "holiday" && job.manifestName == "holiday.plist")
        #expect(try Data(contentsOf: URL(fileURLWithPath: b.spool.active + "/holiday/manifest.plist")) == plist(manifest))
        #expect(b.spool.readOrigin(job: "holiday")?.submittedOn == "a")
        #expect(b.store.origin(of: "holiday") == JobOrigin(submittedOn: "a", fromNode: nil))
        #expect(!FileManager.default.fileExists(atPath: a.spool.active + "/holiday"), "A's local copy is gone")
        // The handed-over folder goes on the reaper's queue after the insert: soon, not necessarily before B runs.
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: a.spool.active + "/.submissions")) ?? []).isEmpty })
        #expect(a.shell.ran.isEmpty)

        let resultFile = b.spool.active + "/holiday/result.plist"
        try plist(["job": "holiday", "status": "succeeded"]).write(to: URL(fileURLWithPath: resultFile))
        #expect(try b.store.complete([JobEnd(job: "holiday", status: "succeeded", resultFile: resultFile)]) == ["holiday"])
        let record = try #require(try a.store.job("holiday"))
        #expect(record.state == .finished && record.node == "b" && record.status == "succeeded")
        #expect(record.result.map { Data($0) } == plist(["job": "holiday", "status": "succeeded"]))
        #expect(b.spool.readOrigin(job: "holiday") != nil, "the origin record stays while the job is in active/")
        removeTree(b.spool.active + "/holiday")  // what the shell's publication does
        #expect(eventually(3) { b.spool.readOrigin(job: "holiday") == nil }, "and goes once it left")
        #expect(try a.store.job("nosuch") == nil)
    }

    /// A row claimed while this node's own inbox claim of a manifest asking for the same id sits in active/<id>
    /// (on its way to active/.submissions): the inbox claim's folder is left untouched, the row handed back and
    /// claimed again once the name is free; the inbox claim is submitted under an id of its own.
    @Test func aClaimedRowNeverTakesTheFolderOfAnInboxClaim() throws {
        let (_, _, a, b) = try startedPair()
        defer { a.close(); b.close() }
        b.store.want(room: 0, manifestBytes: .max)
        #expect(eventually { a.store.snapshot()?.connected == true && b.store.snapshot()?.connected == true })
        // The row `twin`, submitted on a; b's inbox claim of another manifest asking for `twin` holds active/twin.
        #expect(a.store.submit([try a.drop("twin", sleepManifest("twin", seconds: 0))]).isEmpty)
        #expect(eventually { (try? a.store.job("twin")) != nil })
        let local = sleepManifest("twin", seconds: 1)
        let claimed = try b.drop("twin-local", local)
        #expect(claimed.id == "twin")
        b.store.want(room: 4, manifestBytes: .max)
        #expect(eventually(3) { b.logs.all.contains { $0.message.contains("active/twin is in use here") } })
        #expect(b.shell.ran.isEmpty)
        #expect(try Data(contentsOf: URL(fileURLWithPath: b.spool.active + "/twin/manifest.plist")) == plist(local),
                "the inbox claim's folder is untouched")
        #expect(b.spool.readOrigin(job: "twin") == nil && !b.spool.isClusterClaim(job: "twin"))
        // The inbox claim moves on: the row is claimed (here) under its own id, the local manifest inserted as twin.1.
        #expect(b.store.submit([claimed]).isEmpty)
        #expect(eventually { b.shell.ran.contains { $0.job.id == "twin" } })
        #expect(b.spool.isClusterClaim(job: "twin"))
        #expect(
            try Data(contentsOf: URL(fileURLWithPath: b.spool.active + "/twin/manifest.plist")) == plist(sleepManifest("twin", seconds: 0)))
        #expect(eventually { (try? a.store.job("twin.1")) != nil })
    }

    /// A row whose id the shell still holds (a job of the same id rejected on this node at submission, ending, its
    /// folder already gone from active/) is handed back untouched, and claimed once the shell has let the id go.
    @Test func aRowWhoseIdTheShellHoldsWaitsUntilItIsFree() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { a.store.snapshot()?.connected == true })
        a.shell.held = ["twin"]
        #expect(a.store.submit([try a.drop("twin", sleepManifest("twin", seconds: 0))]).isEmpty)
        #expect(eventually { (try? a.store.job("twin")) != nil })
        a.store.want(room: 4, manifestBytes: .max)
        usleep(500_000)
        #expect(a.shell.ran.isEmpty, "not run while the shell holds its id")
        #expect(access(a.spool.active + "/twin", F_OK) != 0, "nothing written into active/")
        a.shell.held = []
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.ran.contains { $0.job.id == "twin" } })
        #expect(a.spool.isClusterClaim(job: "twin"))
    }

    /// A crash after the insert committed and before the local copy was removed: the next start submits it again
    /// and the database keeps one job. Both places a crash can leave it: active/<job> (before it was set aside) and
    /// active/.submissions/<job>.
    @Test func exactlyOnceAcrossACrashBetweenCommitAndRemoval() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-crash-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let saved = folder + "/saved"

        let first = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        _ = first.store.recovered([])
        let one = try first.drop("once", sleepManifest("once"))
        let two = try first.drop("twice", sleepManifest("twice"))
        // What a crash would leave: copies (attributes too) of the claimed folders.
        try runTool(["/bin/mkdir", "-p", saved])
        try runTool(["/bin/cp", "-a", spool.active + "/once", spool.active + "/twice", saved + "/"])
        _ = first.store.submit([one, two])
        #expect(eventually { (try? first.store.job("once")) != nil && (try? first.store.job("twice")) != nil })
        #expect(eventually { !FileManager.default.fileExists(atPath: spool.active + "/.submissions/once") })
        first.store.shutdown()

        // The crash: `once` was never set aside, `twice` was set aside and not removed.
        try runTool(["/bin/mv", saved + "/once", spool.active + "/once"])
        try runTool(["/bin/mv", saved + "/twice", spool.active + "/.submissions/twice"])
        let recovered = try spool.recover().jobs
        #expect(recovered.map(\.id) == ["once"])
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        #expect(second.store.recovered(recovered).isEmpty, "a job without an origin is a submission: not resumed")
        #expect(eventually {
            !FileManager.default.fileExists(atPath: spool.active + "/.submissions/twice")
                && !FileManager.default.fileExists(atPath: spool.active + "/.submissions/once")
                && !FileManager.default.fileExists(atPath: spool.active + "/once")
        })
        #expect(trimmed(try server.psql(database, "SELECT string_agg(id, ',' ORDER BY id) FROM opq_jobs")) == "once,twice",
                "each submission exactly once")
    }

    /// The claim for the cluster (one rename into active/.submissions, no commit): its name is the submission key.
    /// A crash after the insert committed and before the file's removal (or a disk that lost both the rename and
    /// the removal: the same inbox file, the same name again) submits nothing twice; a file the insert never saw is
    /// inserted at the next start. A name too long to fit beside the key is kept in the attribute.
    @Test func claimsForTheClusterAreSubmittedExactlyOnce() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-file-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        func claim(_ name: String, _ manifest: [String: Any]) throws -> ClaimedJob {
            try plist(manifest).write(to: URL(fileURLWithPath: spool.inbox + "/" + name))
            return try claimForSubmission(spool, name)
        }
        let first = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        _ = first.store.recovered([])
        let once = try claim("once.plist", sleepManifest("once"))
        #expect(once.id.hasPrefix(".") && once.requestedJob == "once" && once.manifestName == "once.plist")
        let file = spool.active + "/.submissions/" + once.id.dropFirst()
        #expect(FileManager.default.fileExists(atPath: file) && !FileManager.default.fileExists(atPath: spool.inbox + "/once.plist"))
        let long = String(repeating: "l", count: 240) + ".plist"
        let later = try claim(long, sleepManifest("later"))
        let saved = try Data(contentsOf: URL(fileURLWithPath: file))
        _ = first.store.submit([once])
        #expect(eventually { (try? first.store.job("once")) != nil })
        #expect(eventually { !FileManager.default.fileExists(atPath: file) })
        first.store.shutdown()

        // The crash: `once` back under the same name (as if its removal was lost), `later` never submitted.
        try saved.write(to: URL(fileURLWithPath: file))
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        _ = second.store.recovered([])
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? ["x"]).isEmpty })
        #expect(trimmed(try server.psql(database, "SELECT string_agg(id || ' ' || manifest_name, ',' ORDER BY id) FROM opq_jobs"))
                == "later \(long),once once.plist", "each submission exactly once, the long name kept")
        #expect(later.manifestName == long)
    }

    /// A node that claims a row of its own submission while it still holds the manifest file it inserted takes that
    /// file into active/<job>/ (renamed: the very inode that came into the inbox, not written again); a row another
    /// node claims gets the bytes from the database there, and the submitting node's file goes `reapDelay` later.
    @Test func aNodeClaimingItsOwnSubmissionTakesTheFileItHolds() throws {
        let (_, _, a, b) = try startedPair()
        defer { a.close(); b.close() }
        #expect(eventually { a.store.snapshot()?.connected == true && b.store.snapshot()?.connected == true })
        func submit(_ node: ClusterNode, _ job: String) throws -> (inode: UInt64, manifest: Data) {
            let manifest = plist(sleepManifest(job))
            let path = node.spool.inbox + "/" + job + ".plist"
            try manifest.write(to: URL(fileURLWithPath: path))
            var st = stat()
            guard stat(path, &st) == 0 else { throw SupportFailure("inbox/\(job).plist: \(String(cString: strerror(errno)))") }
            let claimed = try claimForSubmission(node.spool, job + ".plist")
            #expect(node.store.submit([claimed]).isEmpty)
            return (UInt64(st.st_ino), manifest)
        }
        func inode(_ path: String) -> UInt64? {
            var st = stat()
            return stat(path, &st) == 0 ? UInt64(st.st_ino) : nil
        }
        func submissions(_ node: ClusterNode) -> [String] {
            (try? FileManager.default.contentsOfDirectory(atPath: node.spool.active + "/.submissions")) ?? []
        }

        // Only a has room: its own row, its own file.
        b.store.want(room: 0, manifestBytes: .max)
        a.store.want(room: 4, manifestBytes: .max)
        let own = try submit(a, "own")
        #expect(eventually { a.shell.ran.contains { $0.job.id == "own" } })
        let ownManifest = a.spool.active + "/own/manifest.plist"
        #expect(inode(ownManifest) == own.inode, "the inbox file itself, renamed in")
        #expect(try Data(contentsOf: URL(fileURLWithPath: ownManifest)) == own.manifest)
        #expect(a.spool.readOrigin(job: "own")?.submittedOn == "a")
        #expect(submissions(a).isEmpty)

        // Only b has room: b writes the bytes it claimed; a's copy goes after reapDelay.
        a.store.want(room: 0, manifestBytes: .max)
        b.store.want(room: 4, manifestBytes: .max)
        let other = try submit(a, "other")
        #expect(eventually { b.shell.ran.contains { $0.job.id == "other" } })
        let otherManifest = b.spool.active + "/other/manifest.plist"
        #expect(try Data(contentsOf: URL(fileURLWithPath: otherManifest)) == other.manifest)
        #expect(eventually(ClusterJobStore.reapDelay + 3) { submissions(a).isEmpty }, "a's local copy removed")
        #expect(!a.shell.ran.contains { $0.job.id == "other" })

        // The copy gone before a claims its row (someone cleaning active/.submissions by hand): the claim writes the
        // database's bytes instead, and the job runs.
        b.store.want(room: 0, manifestBytes: .max)
        let gone = try submit(a, "gone")
        #expect(eventually { (try? a.store.job("gone")) != nil })
        for name in submissions(a) { try FileManager.default.removeItem(atPath: a.spool.active + "/.submissions/" + name) }
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.ran.contains { $0.job.id == "gone" } })
        let goneManifest = a.spool.active + "/gone/manifest.plist"
        #expect(try Data(contentsOf: URL(fileURLWithPath: goneManifest)) == gone.manifest)
        #expect(a.shell.spoolFailures.isEmpty && b.shell.spoolFailures.isEmpty)
    }

    /// A node whose spool cannot take a claimed job (its file system out of inodes: a real ENOSPC) hands the row
    /// back and stops claiming, telling the shell (a spool fault), instead of claiming it again at once in a loop
    /// of claims and hand-backs; once the shell offers room again, the job is claimed and runs.
    @Test func aFullSpoolStopsClaimingInsteadOfLooping() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-full-\(UInt64.random(in: 1...UInt64.max))"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try runTool(["/bin/mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=256", "tmpfs", folder])
        defer {
            // Lazily: the nodes' spools (their lock files) are still open when this runs, and a plain umount of a busy
            // file system fails, leaving one mount behind per run.
            try? runTool(["/bin/umount", "-l", folder])
            try? FileManager.default.removeItem(atPath: folder)
        }
        let a = try ClusterNode("a", server: server, database: database, spoolFolder: folder + "/spool")
        let b = try ClusterNode("b", server: server, database: database)
        defer { a.close(); b.close() }
        _ = a.store.recovered([])
        _ = b.store.recovered([])
        a.store.want(room: 0, manifestBytes: .max)
        b.store.want(room: 0, manifestBytes: .max)
        var fillers: [String] = []
        while true {
            let path = folder + "/filler\(fillers.count)"
            let fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
            if fd < 0 { break }
            close(fd)
            fillers.append(path)
        }
        #expect(errno == ENOSPC && !fillers.isEmpty)
        _ = b.store.submit([try b.drop("full", sleepManifest("full"))])
        #expect(eventually { (try? b.store.job("full")) != nil })
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.spoolFailures.count == 1 })
        #expect(a.shell.spoolFailures.first?.contains("No space left") == true, "\(a.shell.spoolFailures)")
        #expect(eventually { (try? b.store.job("full"))?.state == .waiting }, "handed back")
        let fence = trimmed(try server.psql(database, "SELECT last_value FROM opq_fence"))
        usleep(1_500_000)
        #expect(trimmed(try server.psql(database, "SELECT last_value FROM opq_fence")) == fence, "not claimed again meanwhile")
        #expect(a.shell.spoolFailures.count == 1 && a.shell.ran.isEmpty)

        // The spool works again; the shell offers room.
        for path in fillers { unlink(path) }
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.ran.count == 1 })
        #expect(FileManager.default.fileExists(atPath: a.spool.active + "/full/manifest.plist"))
    }

    /// Rows are input: a hand-inserted row with an id that would escape the spool, and one whose manifest is not a
    /// property list, crash nothing; the first is recorded rejected without touching the spool, the second is
    /// handed to the shell (which validates it against its own configuration and rejects it).
    @Test func garbageRowsCrashNothing() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { a.store.snapshot()?.refreshedAt != nil })
        let columns = "(id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)"
        try server.psql(database, """
            INSERT INTO opq_jobs \(columns) VALUES
              ('../escape', '../escape', '\\x00ff', '../../x', 'nowhere node!', 9, -4, '{}', '{}'),
              ('garbage', '', '\\xdeadbeef', '', '', 2, 2, '{default}', '{}'),
              ('strange', 'strange', '\\x3c3f786d6c', 'a/b', 'x', 2, 2, '{}', '{}');
            \(PostgresServer.waitingFromHand)
            """)
        a.store.want(room: 8, manifestBytes: .max)
        #expect(eventually { a.shell.ran.count == 2 })
        #expect(Set(a.shell.ran.map(\.job.id)) == ["garbage", "strange"])
        #expect(a.shell.ran.first { $0.job.id == "strange" }?.job.manifestName == "strange.plist", "a name with '/' is not used")
        #expect(a.store.origin(of: "garbage")?.submittedOn == "unknown")
        #expect(trimmed(try server.psql(database,
                                        "SELECT state || ' ' || status FROM opq_job_states WHERE id = '../escape'")) == "finished rejected")
        #expect(!FileManager.default.fileExists(atPath: a.spool.root + "/escape"))
        #expect(!FileManager.default.fileExists(atPath: a.spool.active + "/../escape"))
        // And the manifests the shell would validate: not property lists.
        for job in a.shell.ran.map(\.job) {
            #expect((try? Manifest.parse(job.manifest, configuration: .builtIn).get()) == nil)
        }
        // The store still works.
        _ = a.store.submit([try a.drop("after", sleepManifest("after"))])
        #expect(eventually { a.shell.ran.contains { $0.job.id == "after" } })
    }

    /// Rows are input, and a node's memory is bounded: a row whose manifest is bigger than a manifest may be is
    /// recorded rejected without being read; rows past the claim's budget (the shell's operations at 16 bytes
    /// each) come back empty and are handed back, then claimed when the shell has room for them.
    @Test func aClaimReadsNoMoreThanItsBudgetNorAnOversizedManifest() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database, jobSlots: 8, maxManifestBytes: 5000)
        defer { a.close() }
        _ = a.store.recovered([])
        #expect(eventually { a.store.snapshot()?.refreshedAt != nil })
        let columns = "(id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands)"
        func row(_ id: String, _ bytes: Int) -> String {
            "('\(id)', '\(id)', convert_to(repeat('x', \(bytes)), 'UTF8'), '\(id).plist', 'elsewhere', 2, 2, '{default}', '{}')"
        }
        try server.psql(database, "INSERT INTO opq_jobs \(columns) VALUES "
                            + "\(row("huge", 6000)), \(row("s1", 400)), \(row("s2", 400)), \(row("s3", 400)); "
                            + PostgresServer.waitingFromHand)
        a.store.want(room: 8, manifestBytes: 500)
        #expect(eventually { a.shell.ran.count == 2 })
        #expect(a.shell.ran.map(\.job.id) == ["s1", "s2"])
        #expect(eventually { (try? server.psql(database, "SELECT state FROM opq_live WHERE id = 's3'")).map(trimmed) == "waiting" },
                "s3 is handed back")
        #expect(trimmed(try server.psql(database, "SELECT state || ' ' || status FROM opq_job_states WHERE id = 'huge'"))
                == "finished rejected")
        let why = trimmed(try server.psql(database, "SELECT convert_from(result, 'UTF8') FROM opq_ended"
                                          + " WHERE id = 'huge'"))
        #expect(why.contains("6000 bytes, more than the 5000"), "\(why)")
        // Room for more: s3 comes.
        a.store.want(room: 6, manifestBytes: 1000)
        #expect(eventually { a.shell.ran.count == 3 })
        #expect(a.shell.ran.last?.job.id == "s3" && a.shell.ran.last?.job.manifest.count == 400)
    }
}
