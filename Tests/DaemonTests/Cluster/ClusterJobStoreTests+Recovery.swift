// ClusterJobStore's recovery at start (SPEC §8): what a node still holds is resumed, claims whose records were lost
// are recognised from the database, rows the database lost are submitted again, and folders without records wait
// for the database to answer without holding up the start.

import Foundation
import Logging
import Synchronization
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel
import CShims
import OperationEngine
import PropertyList
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

extension ClusterJobStoreTests {
    /// A restart: a job the database still gives this node under the same fence resumes; one given to another
    /// node meanwhile is removed from active/ and logged `lost`; one whose end was recorded before the crash (and
    /// not yet placed in the outbox) resumes and is published without recording again.
    @Test func recoveredResumesOnlyWhatTheNodeStillHolds() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-restart-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let first = try nodeThatRan(["keep", "gone", "done"], server: server, database: database, spool: spool)
        let result = spool.active + "/done/result.plist"
        try plist(["job": "done"]).write(to: URL(fileURLWithPath: result))
        #expect(try first.store.complete([JobEnd(job: "done", status: "succeeded", resultFile: result)]) == ["done"])
        #expect(spool.readOrigin(job: "done") != nil, "the origin stays until the job has left active/")
        first.store.shutdown()
        // The crash: `done` was recorded but not placed; `gone` was taken over and claimed by another node.
        try server.psql(database, "UPDATE opq_live SET node = 'other', fence = nextval('opq_fence') WHERE id = 'gone'")

        let recovered = try spool.recover().jobs
        #expect(recovered.map(\.id) == ["done", "gone", "keep"])
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        #expect(second.store.recovered(recovered).map(\.id) == ["done", "keep"])
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/gone"))
        #expect(second.logs.all.contains { $0.metadata["OPQ_STATE"] == "lost" && $0.metadata["OPQ_JOB"] == "gone" })
        #expect(second.store.origin(of: "keep")?.submittedOn == "a")
        #expect(try second.store.complete([JobEnd(job: "done", status: "succeeded", resultFile: result)]) == ["done"],
                "recorded before the crash: published without the database")
        #expect(trimmed(try server.psql(database, "SELECT state FROM opq_live WHERE id = 'keep'")) == "running")
    }

    /// A spool copied without its extended attributes (`cp -r`, `rsync -a` without -X) has lost every claim record.
    /// A job claimed from the cluster is then recognised from the database (same id, same manifest, claimed by this
    /// node): resumed if still this node's, its record written again; removed as lost if another node took it over
    /// meanwhile — never submitted again, which would run it twice. A folder the database knows nothing of stays an
    /// inbox claim and is submitted.
    @Test func claimsWhoseRecordsWereLostAreRecognisedFromTheDatabase() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-unrecorded-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let first = try nodeThatRan(["kept", "taken"], server: server, database: database, spool: spool)
        let fence = try #require(spool.readOrigin(job: "kept")?.fence)
        let submittedAt = try #require(first.store.job("kept")?.submittedAt)
        first.store.shutdown()
        // While the node was down: `taken` taken over by another node (after the lease).
        try server.psql(database, "UPDATE opq_live SET node = 'other', from_node = 'a', fence = nextval('opq_fence') WHERE id = 'taken'")
        // An inbox claim the database does not know, then the copy that loses every record.
        _ = try first.drop("local", sleepManifest("local"))
        for job in ["kept", "taken", "local"] {
            #expect(removexattr(spool.active + "/" + job, Spool.jobAttribute) == 0)
            #expect(spool.readClaimRecord(spool.active + "/" + job) == nil)
        }

        let recovered = try spool.recover().jobs
        #expect(recovered.map(\.id) == ["kept", "local", "taken"])
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        let resumed = second.store.recovered(recovered)
        #expect(resumed.map(\.id) == ["kept"])
        #expect(resumed.first?.receivedAt == submittedAt, "its reception time from the database, not the restart's")
        #expect(spool.readOrigin(job: "kept")?.fence == fence, "its record written again")
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/taken"))
        #expect(second.logs.all.contains { $0.metadata["OPQ_STATE"] == "lost" && $0.metadata["OPQ_JOB"] == "taken" })
        // `local` is submitted; `kept` and `taken` are not submitted again (no kept.1, taken.1).
        #expect(eventually { (try? second.store.job("local")) != nil })
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? []).isEmpty })
        #expect(trimmed(try server.psql(database, "SELECT string_agg(id, ' ' ORDER BY id) FROM opq_jobs")) == "kept local taken")
        #expect(trimmed(try server.psql(database, "SELECT node || ' ' || fence FROM opq_live WHERE id = 'kept'")) == "a \(fence)")
    }

    /// The database restored from a backup older than a job this node holds has no row for it: the job is submitted
    /// again from the node's copy (dropped, it would run nowhere). A folder last written more than keepFinishedDays
    /// ago may have lost its row to pruning after the job ran elsewhere: lost, as before.
    @Test func aClaimWhoseRowTheDatabaseLostIsSubmittedAgain() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-rowless-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let first = try nodeThatRan(["fresh", "old"], server: server, database: database, spool: spool)
        first.store.shutdown()
        try server.psql(database, "DELETE FROM opq_jobs WHERE id IN ('fresh', 'old')")
        let longAgo = Date().timeIntervalSince1970 - (ClusterSettings.defaultKeepFinishedDays + 1) * 86_400
        var times = [timespec(tv_sec: Int(longAgo), tv_nsec: 0), timespec(tv_sec: Int(longAgo), tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, spool.active + "/old", &times, 0) == 0)

        let recovered = try spool.recover().jobs
        #expect(recovered.map(\.id) == ["fresh", "old"])
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        #expect(second.store.recovered(recovered).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: spool.active + "/old"))
        #expect(second.logs.all.contains { $0.metadata["OPQ_STATE"] == "lost" && $0.metadata["OPQ_JOB"] == "old" })
        #expect(
            second.logs.all.contains { $0.message.contains("the database has no row for this job") && $0.metadata["OPQ_JOB"] == "fresh" })
        #expect(eventually { (try? second.store.job("fresh"))?.state == .waiting })
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? []).isEmpty })
        #expect(trimmed(try server.psql(database,
                                        "SELECT string_agg(id || ' ' || state, ',' ORDER BY id) FROM opq_job_states")) == "fresh waiting")
    }

    /// A running node whose database forgets a job it holds (restored from an older backup under it) hears so at its
    /// next beat: that job is given back to the shell to submit again, not dropped; one taken over by another node is
    /// lost as ever.
    @Test func aRunningNodeHearsWhichOfItsJobsTheDatabaseForgot() throws {
        let (node, _, _) = try nodeWhoseDatabaseChanged(forgetting: "forgotten", givingAway: "taken", leaseSeconds: 3)
        defer { node.close() }
        #expect(eventually(10) { node.shell.forgottenJobs == ["forgotten"] && node.shell.lostJobs.map(\.job) == ["taken"] },
                "forgotten \(node.shell.forgottenJobs), lost \(node.shell.lostJobs)")
    }

    /// A job whose row is gone when its end is to be recorded (the database restored under the node between its last
    /// beat and the completion) ran here, and no other node holds it: published here (answered as recorded), not
    /// dropped as lost.
    @Test func aJobTheDatabaseForgotBeforeItsEndIsPublishedWhereItRan() throws {
        let (node, server, database) = try nodeWhoseDatabaseChanged(forgetting: "ended", givingAway: "taken")
        defer { node.close() }
        let spool = node.spool
        let ends = try ["ended", "taken"].map { job in
            let result = spool.active + "/" + job + "/result.plist"
            try plist(["job": job]).write(to: URL(fileURLWithPath: result))
            return JobEnd(job: job, status: "succeeded", resultFile: result)
        }
        #expect(try node.store.complete(ends) == ["ended"])
        #expect(node.shell.lostJobs.map(\.job) == ["taken"])
        #expect(node.logs.all.contains {
            $0.message.contains("published here, where it ran, recorded in the database again as finished here")
                && $0.metadata["OPQ_JOB"] == "ended"
        })
        // Recorded again, as finished here: show and wait on every node know it, and its id stays taken.
        let record = try #require(try node.store.job("ended"))
        #expect(record.state == .finished && record.node == "a" && record.status == "succeeded")
        #expect(try server.psql(database, "SELECT submitted_on || ' ' || manifest_name || ' ' || array_to_string(queues, ',')"
                                    + " FROM opq_jobs WHERE id = 'ended'")
                    .trimmingCharacters(in: .whitespacesAndNewlines) == "a ended.plist default")
    }

    /// The same folders when the database does not answer at start (a server that takes the connection and never
    /// speaks): one lookup waits out its timeout, the others are not tried; the folders wait in active/ for the
    /// database to answer (next test); the node starts rather than waiting a timeout per folder.
    @Test func foldersWithoutRecordsDoNotHoldUpAStartWhileTheDatabaseIsSilent() throws {
        let server = try PostgresServer.shared.get()
        // Never accepted: the kernel completes the handshakes, no one answers.
        let (listener, port) = try loopbackListener()
        defer { close(listener) }
        let folder = NSTemporaryDirectory() + "opq-cluster-silent-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let jobs = ["one", "two", "three", "four", "five"]
        for job in jobs {
            #expect(mkdir(spool.active + "/" + job, 0o750) == 0)
            try plist(sleepManifest(job)).write(to: URL(fileURLWithPath: spool.active + "/" + job + "/manifest.plist"))
        }
        let node = try ClusterNode("a", server: server, database: "silent", spoolFolder: folder, spool: spool,
                                   url: "postgresql://\(PostgresServer.role)@127.0.0.1:\(port)/silent?sslmode=disable")
        defer { node.store.shutdown() }
        let recovered = try spool.recover().jobs
        #expect(recovered.count == 5)
        let started = monotonicSeconds()
        #expect(node.store.recovered(recovered).isEmpty)
        let seconds = monotonicSeconds() - started
        #expect(seconds < ClusterJobStore.statementTimeout * 2, "one lookup's timeout, not one per folder: \(seconds) s")
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: spool.active).filter { !$0.hasPrefix(".") }) == Set(jobs),
                "waiting in active/, none submitted")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? []).isEmpty)
    }

    /// Folders without records met while the database is down at start wait in active/ until it answers, then are
    /// looked up: one whose end this node recorded is published here; one the database holds as this node's is not
    /// run from the copy (the copy goes, `lost`; the row is handed back to run again from the database); one it does
    /// not know is submitted. Nothing is submitted twice.
    @Test func foldersWithoutRecordsWaitForTheDatabaseToAnswer() throws {
        let server = try PostgresServer()
        defer { server.stop(); try? FileManager.default.removeItem(atPath: server.folder) }
        let database = try server.createDatabase()
        let folder = NSTemporaryDirectory() + "opq-cluster-unverified-\(UInt64.random(in: 1...UInt64.max))"
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let first = try nodeThatRan(["held", "done"], server: server, database: database, spool: spool)
        let result = spool.active + "/done/result.plist"
        try plist(["job": "done"]).write(to: URL(fileURLWithPath: result))
        #expect(try first.store.complete([JobEnd(job: "done", status: "succeeded", resultFile: result)]) == ["done"])
        first.store.shutdown()
        _ = try first.drop("local", sleepManifest("local"))
        for job in ["held", "done", "local"] { #expect(removexattr(spool.active + "/" + job, Spool.jobAttribute) == 0) }
        server.stop()

        let recovered = try spool.recover().jobs
        let second = try ClusterNode("a", server: server, database: database, spoolFolder: folder, spool: spool)
        defer { second.store.shutdown() }
        #expect(second.store.recovered(recovered).isEmpty)
        usleep(1_500_000)
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: spool.active)
                        .filter { !$0.hasPrefix(".") }) == ["held", "done", "local"],
                "left where they are while the database is down")

        try server.start()
        #expect(eventually(15) { second.shell.ran.contains { $0.job.id == "done" } }, "its end recorded: published here")
        #expect(try second.store.complete([JobEnd(job: "done", status: "succeeded", resultFile: result)]) == ["done"],
                "without recording again")
        #expect(eventually { !FileManager.default.fileExists(atPath: spool.active + "/held") })
        // Logged once the copy is gone (on the submission thread): waited for, not read at the instant of removal.
        #expect(eventually { second.logs.all.contains { $0.metadata["OPQ_STATE"] == "lost" && $0.metadata["OPQ_JOB"] == "held" } })
        #expect(eventually(10) {
            trimmed((try? server.psql(database, "SELECT state || ' ' || coalesce(node, '-') FROM opq_job_states WHERE id = 'held'")) ?? "")
                == "waiting -"
        },
                "handed back, to run again from the database")
        #expect(eventually { (try? second.store.job("local")) != nil })
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: spool.active + "/.submissions")) ?? []).isEmpty })
        #expect(trimmed(try server.psql(database, "SELECT string_agg(id, ' ' ORDER BY id) FROM opq_jobs")) == "done held local")
        #expect(!second.shell.ran.contains { $0.job.id == "held" })
    }
}
