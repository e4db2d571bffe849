// ClusterProgress: what a node's heartbeat says of the jobs it runs, for `show` on other nodes: read back as sent,
// bounded whatever the ids, garbage ignored, and a slow sample never holding the beat up.

import Foundation
import Logging
import Synchronization
import Testing
import TestSupport
@testable import Daemon
import CShims
import OperationEngine
import PropertyList
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// What a node's heartbeat says of the jobs it runs (for `show` on other nodes): read back as sent, bounded (a job
/// that does not fit is left out whole, the others still sent), and anything else in its place ignored.
@Suite("Cluster progress", .onItsOwnExecutor)
struct ClusterProgressTests {
    @Test func progressRoundTripsWithinItsBudgetAndGarbageIsIgnored() throws {
        let small = [(id: "a", state: OperationState.succeeded, attempts: 1, queue: "io"),
                     (id: "b", state: .executing, attempts: 2, queue: "default"),
                     (id: "c", state: .pending, attempts: 0, queue: "gpu")]
        let huge = (0..<20_000).map { (id: "op\($0)", state: OperationState.ready, attempts: 0, queue: "default") }
        let bytes = ClusterProgress.encode([("small", small), ("huge", huge),
                                            ("other", [(id: "x", state: .cancelled, attempts: 0, queue: "q")])])
        #expect(bytes.count <= ClusterProgress.budget)
        let read = try #require(ClusterProgress.decode(bytes, job: "small"))
        #expect(read.mapValues { "\($0.state)/\($0.attempts)/\($0.queue)" }
                    == ["a": "succeeded/1/io", "b": "executing/2/default", "c": "pending/0/gpu"])
        #expect(ClusterProgress.decode(bytes, job: "huge") == nil, "left out whole: its operations show unknown")
        #expect(ClusterProgress.decode(bytes, job: "other")?["x"]?.state == "cancelled")
        #expect(ClusterProgress.decode(bytes, job: "nosuch") == nil)
        // The bound holds whatever the ids: jobs just under the estimate, with long operation ids.
        let long = (0..<12).map { j in
            ("job\(j)", (0..<400).map {
                (id: String(repeating: "x", count: 40) + "\($0)", state: OperationState.pending, attempts: 0, queue: "default")
            })
        }
        let full = ClusterProgress.encode(long, budget: 64 * 1024)
        #expect(full.count <= 64 * 1024 && full.count > 32 * 1024, "\(full.count)")
        for garbage: [UInt8] in [[], [0, 1, 2], Array("bplist00".utf8), Array("<plist><string>x</string></plist>".utf8)] {
            #expect(ClusterProgress.decode(garbage, job: "small") == nil)
        }
        // Entries of the wrong shape are dropped one by one, the rest kept.
        let odd = PlistBinaryWriter.document(.dictionary(PlistDictionary(["j": .dictionary(PlistDictionary([
            "ok": .array([.integer(4), .integer(1), .string("io")]), "state99": .array([.integer(99), .integer(1), .string("io")]),
            "negative": .array([.integer(2), .integer(-1), .string("io")]), "short": .array([.integer(2), .integer(1)]),
            "queueless": .array([.integer(2), .integer(1), .integer(3)]), "text": .string("x")]))])))
        #expect(ClusterProgress.decode(odd, job: "j").map { Array($0.keys) } == ["ok"])
    }

    /// A heartbeat never waits for a slow sample (the engine's lock held by a huge submission): it sends the last one
    /// made, and one sample runs at a time.
    @Test func aSlowSampleNeverHoldsTheBeatUp() throws {
        let sampler = ProgressSampler(patience: 0.05)
        let release = DispatchSemaphore(value: 0)
        let made = Mutex(0)
        let slow: @Sendable () -> [UInt8] = {
            made.withLock { $0 += 1 }
            release.wait()
            return [7]
        }
        #expect(sampler.sample(slow) == nil, "nothing made yet: the beat goes without")
        #expect(sampler.sample(slow) == nil, "still sampling: no second sample started")
        #expect(made.withLock { $0 } == 1)
        release.signal()
        #expect(pollUntil(10) { sampler.sample { [8] } == [8] ? true : nil } == true)
        #expect(sampler.sample { [9] } == [9], "a quick sample is sent at once")
    }
}
