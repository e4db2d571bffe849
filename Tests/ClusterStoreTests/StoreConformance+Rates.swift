// Conformance checks for clusterRateLimit's start grants (SPEC §3.7 "At a rate"), held to every store: the store
// never grants more than N per window, with requesters racing, grants running out and reports shortening them.

import ClusterStore
import Foundation
import Testing

/// The most of `times` that lie in one window of `seconds`, each time taken as a window's beginning.
func busiestWindow(_ times: [Double], seconds: Double) -> Int {
    let sorted = times.sorted()
    var busiest = 0
    for (i, start) in sorted.enumerated() {
        busiest = max(busiest, sorted[i...].prefix { $0 < start + seconds }.count)
    }
    return busiest
}

extension StoreConformance {
    /// At most N grants are counted at once; an unreported grant counts for its use time and the window, an unused
    /// one no longer once reported, a used one until its report + the window; the next free time says when.
    static func rateGrants(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            func ask(_ node: String, _ wanted: Int, limit: Int = 3, seconds: Double = 2, within: Double = 0.5) async throws -> StartGrants {
                try await store.grantStarts(queue: "api", node: node, wanted: wanted, limit: limit, seconds: seconds, useWithin: within)
            }
            let first = try await ask("a", 5)
            #expect(first.ids.count == 3, "no more than N, however many are asked for")
            let next = try #require(first.nextFree)
            #expect(abs(next - first.databaseNow - 2.5) < 0.01, "counted for the use time and the window: \(next - first.databaseNow)")
            let none = try await ask("b", 1)
            #expect(none.ids.isEmpty)
            #expect(none.nextFree == next)
            #expect(try await store.grantStarts(queue: "other", node: "b", wanted: 2, limit: 3, seconds: 2, useWithin: 0.5).ids.count == 2,
                    "each queue counts its own")

            // One used, two unused: the unused go back at once; the used counts until its report + the window.
            try await store.settleStarts(node: "a", used: [first.ids[0]], unused: Array(first.ids.dropFirst()))
            let second = try await ask("b", 3)
            #expect(second.ids.count == 2, "the two unused ones are free again")
            let freed = try #require(second.nextFree)
            #expect(freed - second.databaseNow < 2.01 && freed - second.databaseNow > 1.8,
                    "the used one frees first, its report + the window: \(freed - second.databaseNow)")
            // A report is no way to lengthen a count, nor to touch another node's grants.
            try await store.settleStarts(node: "a", used: second.ids, unused: [])
            try await store.settleStarts(node: "b", used: [first.ids[0]], unused: [])
            #expect(try await ask("c", 1).nextFree == freed)

            // Grants never reported run out on their own: a node that died holding them holds nothing for long.
            let lone = try await store.grantStarts(queue: "lone", node: "dead", wanted: 1, limit: 1, seconds: 0.3, useWithin: 0.2)
            #expect(lone.ids.count == 1)
            let wait = try #require(lone.nextFree) - lone.databaseNow
            #expect(try await store.grantStarts(queue: "lone", node: "b", wanted: 1, limit: 1, seconds: 0.3, useWithin: 0.2).ids.isEmpty)
            try await Task.sleep(for: .seconds(wait + 0.05))
            #expect(try await store.grantStarts(queue: "lone", node: "b", wanted: 1, limit: 1, seconds: 0.3, useWithin: 0.2).ids.count == 1)
        }
    }

    /// Eight requesters race for 5 starts per second for four seconds, each starting on what it is granted within
    /// the use time (some of it: the rest reported unused) and reporting what it started: no window of a second
    /// holds more than 5 starts, and the rate is used.
    static func racingRateGrants(_ factory: StoreFactory) async throws {
        try await withStore(factory) { store in
            let limit = 5, seconds = 1.0, within = 0.3, length = 4.0
            let end = Date().timeIntervalSince1970 + length
            let starts = try await withThrowingTaskGroup(of: [Double].self) { group in
                for k in 0..<8 {
                    group.addTask {
                        var made: [Double] = []
                        var turn = k
                        while Date().timeIntervalSince1970 < end {
                            turn += 1
                            let asked = ContinuousClock.now
                            let grants = try await store.grantStarts(queue: "api", node: "n\(k)", wanted: 1 + turn % 3, limit: limit,
                                                                     seconds: seconds, useWithin: within)
                            // Used within the use time or not at all; every third requester leaves one of its grants.
                            let inTime = ContinuousClock.now - asked < .seconds(within)
                            let using = inTime ? grants.ids.count - (k % 3 == 0 && grants.ids.count > 1 ? 1 : 0) : 0
                            for _ in 0..<using { made.append(Date().timeIntervalSince1970) }
                            try await store.settleStarts(node: "n\(k)", used: Array(grants.ids.prefix(using)),
                                                         unused: Array(grants.ids.dropFirst(using)))
                            if grants.ids.isEmpty { try await Task.sleep(for: .milliseconds(5)) }
                        }
                        return made
                    }
                }
                return try await group.reduce(into: [Double]()) { $0 += $1 }
            }
            #expect(busiestWindow(starts, seconds: seconds) <= limit, "at most \(limit) starts in any window of \(seconds) s")
            // Each grant used is counted for about its window plus two round trips: most of the rate is used.
            #expect(Double(starts.count) >= 0.7 * Double(limit) * length / seconds, "the rate is used: \(starts.count) starts")
        }
    }
}
