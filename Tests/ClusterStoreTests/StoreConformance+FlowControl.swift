// Conformance checks for flow control (SPEC §3.7): delayed jobs and ifJobExists = skip, held to every store.

import ClusterStore
import Foundation
import Testing

extension StoreConformance {
    /// A delayed job is claimable by no node before its time and by any node after it; the others are not held up.
    static func delayedJobs(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            let now = Date().timeIntervalSince1970
            var later = job("later")
            later.notBefore = now + 1.5
            var past = job("past")
            past.notBefore = now - 10
            _ = try await store.insertJobs([later, past, job("now")])
            func claim(_ node: String) async throws -> [String] {
                try await store.claimJobs(node: node, limit: 10, queues: ["default"], commands: [], budget: .max, maxManifestBytes: .max)
                    .map(\.id).sorted()
            }
            #expect(try await claim("a") == ["now", "past"], "a time already past is no delay")
            #expect(try await store.job("later")?.notBefore.map { abs($0 - (now + 1.5)) < 0.01 } == true)
            #expect(try await claim("a") == [], "not before its time")
            try await Task.sleep(for: .milliseconds(1700))
            #expect(try await claim("b") == ["later"], "any node, from its time on")
            #expect(try await store.job("later")?.state == .running)
        }
    }

    /// `skipIfExists`: a taken id inserts nothing and answers `skipped` with the holder's id; a free id inserts; the same
    /// submission repeated (its key) answers its own row; racing submissions of one id make exactly one job.
    static func skipIfExists(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            func skipping(_ id: String, key: String?) -> NewJob {
                var j = job(id)
                j.skipIfExists = true
                j.submissionKey = key
                return j
            }
            #expect(try await store.insertJobs([job("held")]).map(\.id) == ["held"])
            let answers = try await store.insertJobs([skipping("held", key: "n1/x"), skipping("free", key: "n1/y"),
                                                      skipping("free", key: "n1/z")])
            #expect(answers.map(\.id) == ["held", "free", "free"])
            #expect(answers.map(\.skipped) == [true, false, true], "the twin in the batch is skipped too")
            #expect(try await store.insertJobs([skipping("free", key: "n1/y")]).map(\.skipped) == [false], "its own submission, repeated")
            // Two nodes, 100 submissions of one id each, at once: one job.
            let results = try await withThrowingTaskGroup(of: [InsertedJob].self) { group in
                for k in 0..<100 {
                    group.addTask { try await store.insertJobs([skipping("race", key: "n\(k % 2)/race-\(k)")]) }
                }
                return try await group.reduce(into: [InsertedJob]()) { $0 += $1 }
            }
            #expect(results.count == 100)
            #expect(results.filter { !$0.skipped }.count == 1, "exactly one of the racing submissions made the job")
            #expect(results.allSatisfy { $0.id == "race" })
            let claimed = try await store.claimJobs(node: "a", limit: 100, queues: ["default"], commands: [], budget: .max,
                                                    maxManifestBytes: .max)
            #expect(claimed.map(\.id).sorted() == ["free", "held", "race"])
        }
    }
}
