// The JobStore contract, continued: a node's next process on the same spool (`recovered`), at the crash points
// that matter to a store — after a claim before its submission, after a submission's insert before its local copy
// went, after publication. A manifest claimed from the inbox becomes exactly one job, whatever the crash.

import Foundation
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel

#if canImport(Glibc)
import Glibc
#endif

extension JobStoreConformanceTests {
    /// A restart after publication resumes nothing, loses nothing and runs nothing again.
    @Test(arguments: StoreKind.allCases) func aRestartAfterPublicationResumesNothing(_ kind: StoreKind) throws {
        let first = try JobStoreNode.make(kind)
        _ = try first.submitAndCollect([("d", sleepManifest("done"))], expect: 1)
        #expect(try first.store.complete([first.end("done")]) == ["done"])
        try first.publish("done")
        let next = try first.restarted()
        defer { next.close() }
        let (found, problems) = try next.recover()
        #expect(found.isEmpty && problems.isEmpty)
        #expect(next.store.recovered(found).isEmpty)
        next.store.want(room: 4, manifestBytes: .max)
        #expect(holdsThroughout(1) { next.shell.ran.isEmpty && next.shell.lostJobs.isEmpty }, "\(kind): \(next.ranIDs)")
        #expect(next.store.requestCancel(job: "done", operation: nil) == .alreadyEnded)
    }

    /// Crash point: killed between the claim from the inbox and `submit`. The next process makes one job of the
    /// claim: resumed at once where the claim is the job (no `placesJobs`), else submitted again by the store and
    /// run through `delegate.run`.
    @Test(arguments: StoreKind.allCases) func aClaimNotYetSubmittedRunsOnceAfterARestart(_ kind: StoreKind) throws {
        let first = try JobStoreNode.make(kind)
        #expect(eventually(20) { first.store.acceptsSubmissions })
        _ = try first.claim([("c", sleepManifest("claimed-only"))])
        let next = try first.restarted()
        defer { next.close() }
        let (found, _) = try next.recover()
        let resumed = next.store.recovered(found).map(\.id)
        next.store.want(room: 4, manifestBytes: .max)
        #expect(eventually(20) { resumed.count + next.shell.ran.count >= 1 })
        #expect(holdsThroughout(1) { resumed.count + next.shell.ran.count == 1 }, "\(kind): \(resumed) and \(next.ranIDs)")
        if next.store.capabilities.contains(.placesJobs) {
            #expect(resumed.isEmpty && next.ranIDs == ["claimed-only"], "\(kind): \(resumed) and \(next.ranIDs)")
        } else {
            #expect(resumed == ["claimed-only"], "\(kind): \(resumed)")
        }
        #expect(!FileManager.default.fileExists(atPath: next.spool.inbox + "/c.plist"))
    }

    /// Crash point: killed after the submission was made a job but before its local copy went (the copy is put
    /// back as the crash left it). The next process submits the copy again under the same submission key, which
    /// makes no second job; it resumes the job it held. Without `placesJobs` the claim is the job: resumed once,
    /// under its id.
    @Test(arguments: StoreKind.allCases) func aSubmissionFoundAgainMakesNoSecondJob(_ kind: StoreKind) throws {
        let first = try JobStoreNode.make(kind)
        #expect(eventually(20) { first.store.acceptsSubmissions })
        let claimed = try first.claim([("twice", sleepManifest("submitted-once"))])
        let places = first.store.capabilities.contains(.placesJobs)
        // Where the store set the manifest aside, a copy of it as it lay before the insert.
        let aside = places ? first.spool.active + "/.submissions/" + claimed[0].id.dropFirst() : nil
        let copy = try aside.map { try Data(contentsOf: URL(fileURLWithPath: $0)) }
        let runHere = first.store.submit(claimed)
        first.store.want(room: 4, manifestBytes: .max)
        #expect(eventually(20) { runHere.count + first.shell.ran.count == 1 })
        #expect(eventually(20) { first.store.awaitingSubmission == 0 })
        if let aside, let copy {
            #expect(eventually(20) { !FileManager.default.fileExists(atPath: aside) }, "the local copy never went")
            try copy.write(to: URL(fileURLWithPath: aside))
        }
        let next = try first.restarted()
        defer { next.close() }
        let (found, _) = try next.recover()
        let resumed = next.store.recovered(found).map(\.id)
        next.store.want(room: 4, manifestBytes: .max)
        #expect(resumed == ["submitted-once"], "\(kind): \(resumed)")
        #expect(eventually(20) { next.store.awaitingSubmission == 0 })
        if places { #expect(eventually(20) { aside.map { !FileManager.default.fileExists(atPath: $0) } ?? true }) }
        #expect(try next.store.job("submitted-once.1") == nil)
        #expect(holdsThroughout(1) { next.shell.ran.isEmpty }, "\(kind): ran again \(next.ranIDs)")
    }

    /// `recovered` of jobs this node held and had not ended gives each back once, under its id, with what its
    /// operations' progress said (an operation recorded done stays done).
    @Test(arguments: StoreKind.allCases) func aRestartKeepsWhatTheJobsHadDone(_ kind: StoreKind) throws {
        let first = try JobStoreNode.make(kind)
        _ = try first.submitAndCollect([("p", sleepManifest("progressed"))], expect: 1)
        // The progress log opens at recovery (at start, in the shell).
        _ = try first.recover()
        try first.store.recordSuccess(job: "progressed", operation: "s", record: DoneRecord(startedAt: 1, finishedAt: 2, attempts: 1))
        try first.spool.commit()
        let next = try first.restarted()
        defer { next.close() }
        let (found, _) = try next.recover()
        let resumed = next.store.recovered(found)
        #expect(resumed.map(\.id) == ["progressed"], "\(kind): \(resumed.map(\.id))")
        #expect(resumed.first?.done["s"] == DoneRecord(startedAt: 1, finishedAt: 2, attempts: 1))
        #expect(next.shell.lostJobs.isEmpty)
    }

    /// A cancel of one operation recorded before a restart comes back with its job, to be made again before anything
    /// starts, through every rewrite of the progress log; not one older than the job's claim (an earlier job of the
    /// same id), nor one of an operation that succeeded all the same.
    @Test(arguments: StoreKind.allCases) func aRestartKeepsTheCancelsOfOperations(_ kind: StoreKind) throws {
        let first = try JobStoreNode.make(kind)
        _ = try first.submitAndCollect([("k", sleepManifest("cancelling"))], expect: 1)
        _ = try first.recover()
        let now = Date().timeIntervalSince1970
        try first.store.recordCancel(job: "cancelling", operation: "older", at: 1)
        try first.store.recordCancel(job: "cancelling", operation: "x", at: now)
        try first.store.recordCancel(job: "cancelling", operation: "s", at: now)
        try first.store.recordSuccess(job: "cancelling", operation: "s", record: DoneRecord(startedAt: now, finishedAt: now, attempts: 1))
        try first.spool.commit()
        let next = try first.restarted()
        defer { next.close() }
        let (found, _) = try next.recover()
        let resumed = next.store.recovered(found)
        #expect(resumed.map(\.id) == ["cancelling"], "\(kind): \(resumed.map(\.id))")
        #expect(resumed.first?.cancels == ["x"], "\(kind): \(resumed.first?.cancels ?? [])")
        let (again, _) = try next.recover()
        #expect(again.first?.cancels == ["x"], "the rewritten log keeps them: \(again.first?.cancels ?? [])")
    }

    /// A cancel of a whole job recorded before a restart comes back with it as a cancel of every operation (`[nil]`),
    /// through every rewrite of the progress log; not one older than the job's claim. Its line is one a build that
    /// knows only successes and cancels of operations skips: four fields, neither a time nor `cancelled` third.
    @Test(arguments: StoreKind.allCases) func aRestartKeepsTheCancelOfAWholeJob(_ kind: StoreKind) throws {
        let first = try JobStoreNode.make(kind)
        _ = try first.submitAndCollect([("w", sleepManifest("whole")), ("o", sleepManifest("older"))], expect: 2)
        _ = try first.recover()
        let now = Date().timeIntervalSince1970
        try first.store.recordCancel(job: "whole", operation: "x", at: now)
        try first.store.recordCancel(job: "whole", operation: nil, at: now)
        try first.store.recordCancel(job: "older", operation: nil, at: 1)
        try first.spool.commit()
        let log = try String(contentsOfFile: first.spool.active + "/.progress.log", encoding: .utf8)
        let line = try #require(log.split(separator: "\n").first { $0.hasPrefix("whole\t*") })
        let fields = line.split(separator: "\t", omittingEmptySubsequences: false)
        #expect(fields.count == 4 && fields[2] != "cancelled" && Double(fields[2]) == nil, "\(line)")
        let next = try first.restarted()
        defer { next.close() }
        let (found, _) = try next.recover()
        let resumed = next.store.recovered(found)
        #expect(Set(resumed.map(\.id)) == ["whole", "older"], "\(kind): \(resumed.map(\.id))")
        #expect(resumed.first { $0.id == "whole" }?.cancels == [nil], "\(kind): \(resumed.map(\.cancels))")
        #expect(resumed.first { $0.id == "older" }?.cancels == [], "\(kind): \(resumed.map(\.cancels))")
        let (again, _) = try next.recover()
        #expect(again.first { $0.id == "whole" }?.cancels == [nil], "the rewritten log keeps it: \(again.map(\.cancels))")
    }
}
