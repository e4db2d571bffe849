// ClusterJobStore's leases (SPEC §8): heartbeats go on with the cooperative pool blocked, a node cut off from the
// database or with a hung spool loses its lease to the other, the fenced end refuses a lost job, and cancels and
// suspensions cross nodes.

import Foundation
import Logging
import Synchronization
import Testing
import TestSupport
@testable import Daemon
import CShims
import OperationEngine
import PropertyList
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

extension ClusterJobStoreTests {
    /// The store's async work runs on its own executor: with every thread of the shared cooperative pool blocked
    /// for longer than the lease, the node still beats and keeps its job (on the shared pool it would lose it).
    @Test func heartbeatsGoOnWhileTheCooperativePoolIsBlocked() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        // A lease of 3 s (beats every second, the deadline 2.4 s after the last) blocked for 4 s: a machine busy with
        // the rest of the suite may hold a beat back a second or more, never the 4 s the block lasts. Not longer:
        // the block stops every test running beside this one on the shared pool (ClusterPermitsTests' leases).
        let a = try ClusterNode("a", server: server, database: database, leaseSeconds: 3)
        defer { a.close() }
        _ = a.store.recovered([])
        a.store.want(room: 1, manifestBytes: .max)
        _ = a.store.submit([try a.drop("steady", sleepManifest("steady", seconds: 60))])
        #expect(eventually { a.shell.ran.count == 1 })
        let blockers = ProcessInfo.processInfo.activeProcessorCount + 2
        let blockedUntil = monotonicSeconds() + 4
        for _ in 0..<blockers {
            Task.detached { while monotonicSeconds() < blockedUntil { usleep(10_000) } }
        }
        while monotonicSeconds() < blockedUntil + 0.2 { usleep(20_000) }
        #expect(a.shell.lostJobs.isEmpty, "lost: \(a.shell.lostJobs)")
        #expect(trimmed(try server.psql(database, "SELECT node FROM opq_live WHERE id = 'steady'")) == "a")
    }

    /// A job that ran to its end here (`ending`) gives its slot to a new job at once, though its end is recorded later:
    /// a node of 2 slots claims 2 more while the first 2 are still its own in the database, under their fences; their
    /// ends are then recorded as any, and a lease still covers them meanwhile (beats keep them the node's).
    @Test func jobsThatRanToTheirEndsHoldNoSlotUntilRecorded() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database, jobSlots: 2)
        defer { a.close() }
        _ = a.store.recovered([])
        _ = a.store.submit(try (0..<4).map { try a.drop("j\($0)", sleepManifest("j\($0)")) })
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.ran.count == 2 })
        usleep(300_000)
        #expect(a.shell.ran.count == 2, "two slots: two jobs")
        let first = a.shell.ran.map(\.job.id)
        a.store.ending(first)
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.shell.ran.count == 4 }, "the ended jobs' slots went to the other two")
        let running = {
            trimmed((try? server.psql(database, "SELECT count(*) FROM opq_live WHERE node = 'a' AND state = 'running'")) ?? "")
        }
        #expect(running() == "4", "the first two stay the node's until their ends are recorded")
        let ends = try first.map { job in
            let file = a.folder + "/result-\(job).plist"
            try plist(["job": job, "status": "succeeded"]).write(to: URL(fileURLWithPath: file))
            return JobEnd(job: job, status: "succeeded", resultFile: file)
        }
        #expect(try a.store.complete(ends) == Set(first))
        #expect(running() == "2")
        #expect(a.shell.lostJobs.isEmpty)
    }

    /// Beats ask about the node's own jobs by id: a job the database gives the node behind its back (as a claim
    /// whose answer was lost does) is not seen by them, and goes back to waiting at the full beat after the next
    /// failed statement; the node's own job is kept throughout (the outage is shorter than the lease).
    @Test func aJobGivenToTheNodeBehindItsBackGoesBackAfterAFailedStatement() throws {
        // B claims nothing. Beats every 4 s; a's own lease ends 11 s after its last beat.
        let pair = try CuttablePair("opqghost", leaseSeconds: 12)
        let (server, database, a, b) = (pair.server, pair.database, pair.a, pair.b)
        defer { a.close(); b.close() }
        _ = a.store.recovered([])
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.store.snapshot()?.connected == true })
        _ = a.store.submit([try a.drop("mine", sleepManifest("mine", seconds: 60))])
        #expect(eventually { a.shell.ran.count == 1 })
        a.store.want(room: 0, manifestBytes: .max)
        _ = a.store.submit([try a.drop("ghost", sleepManifest("ghost", seconds: 60))])
        let state = {
            trimmed((try? server.psql(database, "SELECT state || ' ' || coalesce(node, '-') FROM opq_live WHERE id = 'ghost'")) ?? "")
        }
        #expect(eventually { state() == "waiting -" })
        try server.psql(database, """
            DELETE FROM opq_claimable WHERE id = 'ghost';
            UPDATE opq_live SET state = 'running', node = 'a', fence = nextval('opq_fence'), claimed_at = now() WHERE id = 'ghost'
            """)
        // Two beats by id or more: unseen, still the node's there.
        usleep(9_000_000)
        #expect(state() == "running a", "beats by id do not read every job")
        // A statement fails: no new logins for a's role for a moment, its connections ended. Cut just after a beat,
        // so that the outage (found at the next beat, 4 s on) and the reconnection have 11 s on a loaded machine.
        let deadline = a.store.leaseDeadline
        #expect(eventually(6) { a.store.leaseDeadline != deadline }, "a beat")
        try pair.cut()
        #expect(eventually(8) { a.logs.states("cluster").contains("disconnected") })
        try pair.restore()
        #expect(eventually(20) { state() == "waiting -" }, "handed back at the full beat: \(a.logs.states("cluster"))")
        #expect(trimmed(try server.psql(database, "SELECT count(*) FROM opq_claimable WHERE id = 'ghost'")) == "1", "claimable again")
        #expect(a.shell.lostJobs.isEmpty, "lost: \(a.shell.lostJobs)")
        #expect(trimmed(try server.psql(database, "SELECT node FROM opq_live WHERE id = 'mine'")) == "a")
        #expect(!a.shell.ran.contains { $0.job.id == "ghost" } && !b.shell.ran.contains { $0.job.id == "ghost" })
    }

    /// A node cut off from the database stops its job at its own deadline (`lease ran out`) and tells the watchdog
    /// hook; the other node takes the job over after the lease (fromNode set) and runs it; when the first comes back
    /// its end is refused by the fence and nothing of it is recorded.
    @Test func leaseRunsOutOnACutOffNodeAndTheOtherTakesOver() throws {
        let pair = try CuttablePair("opqcut", leaseSeconds: 2)
        let (a, b) = (pair.a, pair.b)
        defer { a.close(); b.close() }
        let leaseChanges = Locked<[Bool]>([])
        a.store.onLeaseChange = { good in leaseChanges.withLock { $0.append(good) } }
        _ = a.store.recovered([])
        a.store.want(room: 4, manifestBytes: .max)
        #expect(eventually { a.store.snapshot()?.connected == true })
        _ = a.store.submit([try a.drop("long", sleepManifest("long", seconds: 60))])
        #expect(eventually { a.shell.ran.count == 1 })
        let firstFence = try #require(a.spool.readOrigin(job: "long")?.fence)
        #expect(a.store.leaseDeadline != nil)
        #expect(a.deadlines.withLock { $0.contains { $0 != nil } }, "the watchdog hook got a deadline")
        b.store.want(room: 4, manifestBytes: .max)

        // Cut A off: no new logins for its role, its connections ended.
        let cutAt = monotonicSeconds()
        try pair.cut()
        #expect(eventually(8) { a.shell.lostJobs.contains { $0.job == "long" } })
        let lostAfter = monotonicSeconds() - cutAt
        #expect(a.shell.lostJobs.first?.reason == "lease ran out")
        #expect(lostAfter < 2.5, "stopped by its own clock before the lease (2 s) ran out after the last beat: \(lostAfter) s")
        #expect(a.deadlines.withLock { $0.last } == .some(nil), "nothing held any more")
        #expect(leaseChanges.withLock { $0 } == [true, false], "the lease hook: good, then ran out")
        #expect(!a.store.leaseIsGood)
        #expect(eventually(8) { a.logs.states("cluster").contains("disconnected") }, "statements time out within 5 s")

        #expect(eventually(10) { b.shell.ran.contains { $0.job.id == "long" } })
        let taken = try #require(b.shell.ran.first { $0.job.id == "long" })
        #expect(b.store.origin(of: "long")?.fromNode == "a")
        #expect((b.spool.readOrigin(job: "long")?.fence ?? 0) > firstFence)
        _ = taken

        // A comes back: its end of the job is refused, B's is recorded.
        try pair.restore()
        #expect(eventually(10) { a.logs.states("cluster").last == "connected" })
        #expect(eventually { leaseChanges.withLock { $0 } == [true, false, true] && a.store.leaseIsGood })
        let aResult = a.folder + "/result-a.plist"
        try plist(["job": "long", "status": "succeeded", "node": "a"]).write(to: URL(fileURLWithPath: aResult))
        #expect(try a.store.complete([JobEnd(job: "long", status: "succeeded", resultFile: aResult)]).isEmpty)
        let bResult = b.spool.active + "/long/result.plist"
        try plist(["job": "long", "status": "cancelled", "node": "b"]).write(to: URL(fileURLWithPath: bResult))
        #expect(try b.store.complete([JobEnd(job: "long", status: "cancelled", resultFile: bResult)]) == ["long"])
        let record = try #require(try b.store.job("long"))
        #expect(record.node == "b" && record.status == "cancelled" && record.fromNode == "a")
    }

    /// A node whose spool hangs (its file system frozen: every write waits, none fails) goes on beating from its own
    /// thread, and its jobs would never run anywhere. Once the spool has kept it waiting for a whole lease (at least
    /// 5 s) it renews nothing more: its job stops there when the lease runs out (`lease ran out`) and the other node
    /// takes it over; when the spool answers again the node renews its lease, and says both.
    @Test func aNodeWhoseSpoolHangsLetsItsLeaseGo() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database, leaseSeconds: 2)
        let b = try ClusterNode("b", server: server, database: database, leaseSeconds: 2)
        defer { a.close(); b.close() }
        _ = a.store.recovered([])
        _ = b.store.recovered([])
        a.store.want(room: 4, manifestBytes: .max)
        _ = a.store.submit([try a.drop("stuck", sleepManifest("stuck", seconds: 60))])
        #expect(eventually { a.shell.ran.count == 1 })
        b.store.want(room: 4, manifestBytes: .max)

        // Kept waiting for less than the bound (a slow sync): the node keeps its lease and its job.
        a.shell.stalled = 3
        usleep(3_000_000)
        #expect(a.shell.lostJobs.isEmpty)
        #expect(b.shell.ran.isEmpty)
        #expect(a.store.leaseIsGood)

        a.shell.stalled = 6
        #expect(eventually(10) { a.shell.lostJobs.contains { $0.job == "stuck" && $0.reason == "lease ran out" } })
        #expect(eventually(10) { b.shell.ran.contains { $0.job.id == "stuck" } })
        #expect(b.store.origin(of: "stuck")?.fromNode == "a")
        // Said as the node leaving the cluster: `disconnected`, with the reason, in the log and in status.
        let left = a.logs.all.first { $0.metadata["OPQ_STATE"] == "disconnected" }
        #expect(left?.message.contains("node a leaves the cluster until its spool answers") == true)
        #expect(left?.metadata["OPQ_ERROR"]?.hasPrefix("the spool has not answered for") == true)
        #expect(a.store.snapshot()?.connected == false)
        #expect(a.store.snapshot()?.lastError?.hasPrefix("the spool has not answered for") == true)

        a.shell.stalled = 0
        #expect(eventually(5) { a.store.leaseIsGood }, "renewed once the spool answers")
        #expect(a.logs.all.contains { $0.message.contains("the spool of node a answers again") })
        #expect(a.logs.states("cluster").suffix(2) == ["disconnected", "connected"], "\(a.logs.states("cluster"))")
        #expect(a.store.snapshot()?.connected == true)
        #expect(trimmed(try server.psql(database, "SELECT node FROM opq_live WHERE id = 'stuck'")) == "b")
    }

    /// Fencing at the store's gate: a job the database gave to another node meanwhile is not recorded, and is
    /// handed to `lost`.
    @Test func fencedCompleteRefusesALostJob() throws {
        let server = try PostgresServer.shared.get()
        let database = try server.createDatabase()
        let a = try ClusterNode("a", server: server, database: database)
        defer { a.close() }
        _ = a.store.recovered([])
        a.store.want(room: 1, manifestBytes: .max)
        _ = a.store.submit([try a.drop("fenced", sleepManifest("fenced"))])
        #expect(eventually { a.shell.ran.count == 1 })
        // Another claim of the same job meanwhile (as after a takeover): a new fence.
        try server.psql(database, "UPDATE opq_live SET node = 'other', fence = nextval('opq_fence') WHERE id = 'fenced'")
        let result = a.folder + "/r.plist"
        try plist(["job": "fenced"]).write(to: URL(fileURLWithPath: result))
        #expect(try a.store.complete([JobEnd(job: "fenced", status: "succeeded", resultFile: result)]).isEmpty)
        #expect(a.shell.lostJobs.map(\.job) == ["fenced"])
        #expect(trimmed(try server.psql(database, "SELECT state FROM opq_live WHERE id = 'fenced'")) == "running")
    }

    /// `cancel` and `suspend` asked on A reach B (which runs the job) within 1 s, each cancel passed on once.
    @Test func cancelAndSuspendFromAReachB() throws {
        let (_, _, a, b) = try startedPair()
        defer { a.close(); b.close() }
        b.store.want(room: 4, manifestBytes: .max)
        _ = a.store.submit([try a.drop("remote", sleepManifest("remote", seconds: 60))])
        #expect(eventually { b.shell.ran.count == 1 })
        #expect(eventually { b.shell.suspensions.count == 1 }, "the first read passes the (empty) set on")

        var start = monotonicSeconds()
        #expect(a.store.requestCancel(job: "remote", operation: "s") == .requested)
        #expect(eventually(3) { b.shell.cancels.count == 1 })
        #expect(monotonicSeconds() - start < 1.0)
        #expect(b.shell.cancels.first?.job == "remote" && b.shell.cancels.first?.operation == "s")
        #expect(a.store.requestCancel(job: "remote", operation: nil) == .requested)
        #expect(eventually(3) { b.shell.cancels.count == 2 })
        usleep(1_500_000)
        #expect(b.shell.cancels.count == 2, "each cancel passed on once, though the database repeats them")
        #expect(a.store.requestCancel(job: "nosuch", operation: nil) == .unknownJob)

        start = monotonicSeconds()
        #expect(a.store.setSuspended("io", true))
        #expect(eventually(3) { b.shell.suspensions.last == ["io"] })
        #expect(monotonicSeconds() - start < 1.0)
        #expect(a.store.setSuspended("io", false))
        #expect(eventually(3) { b.shell.suspensions.last == [] })
    }
}
