// opqueue-bench store --database URL [--password-file F] [--jobs N] [--workers W] [--batch B]
//
// opqueued's database part alone: the statements a node sends for jobs already in the database — one ClaimJobs per
// claim round (up to B, a node's jobSlots), one CompleteJobs per batch of ends (fenced, with a result document) —
// from W workers, each its own pool and node row as a node would have, and no work between claim and completion.
// This is what PGQueuer's no-op figure measures (claim -> no-op -> completion); the node's own figure adds the
// spool's file work, the engine and the journal (Benchmarks/cluster/opqueued.py `database`).
//
// The jobs are inserted first (InsertJobs by the thousand), then the program prints `ready` and waits for a line
// on stdin, so that the caller reads pg_stat_database around the drain alone; it ends with one JSON line.

import ControlPlane
import ClusterStore
import Foundation

enum StoreBench {
    struct Options: Sendable {
        var database = ""
        var passwordFile: String?
        var jobs = 10_000
        var workers = 2
        var batch = 64
    }

    static func run(_ arguments: [String]) {
        var options = Options()
        var rest = arguments
        while !rest.isEmpty {
            let flag = rest.removeFirst()
            let value = rest.isEmpty ? "" : rest.removeFirst()
            switch flag {
            case "--database": options.database = value
            case "--password-file": options.passwordFile = value
            case "--jobs": options.jobs = Int(value) ?? options.jobs
            case "--workers": options.workers = Int(value) ?? options.workers
            case "--batch": options.batch = Int(value) ?? options.batch
            default: fail("store: unknown flag \(flag)")
            }
        }
        guard !options.database.isEmpty, options.jobs > 0, options.workers > 0, options.batch > 0 else {
            fail("store: --database URL is needed; --jobs, --workers and --batch must be positive")
        }
        let finished = DispatchSemaphore(value: 0)
        let captured = options
        Task {
            do { try await drain(captured) } catch { fail("store: \(error)") }
            finished.signal()
        }
        finished.wait()
    }

    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data((message + "\n").utf8))
        exit(1)
    }

    /// The manifest Benchmarks/cluster/opqueued.py inserts, and a result document of the size a node records.
    static let manifest = [UInt8]((try? PropertyListSerialization.data(
        fromPropertyList: ["operations": [["id": "a", "kind": "sleep", "seconds": 0]]], format: .binary, options: 0)) ?? Data())
    static let result = [UInt8]((try? PropertyListSerialization.data(
        fromPropertyList: ["job": "j", "status": "succeeded", "node": "bench-w0", "submittedOn": "bench",
                           "operations": [["id": "a", "state": "succeeded", "attempts": 1]]],
        format: .binary, options: 0)) ?? Data())

    static func drain(_ options: Options) async throws {
        let url = try DatabaseURL(options.database, passwordFile: options.passwordFile)
        let stores = try (0..<options.workers).map { _ in try PostgresClusterStore(url: url) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for store in stores { group.addTask { await store.run() } }
            _ = try await stores[0].migrate()
            let tag = UUID().uuidString.prefix(8).lowercased()
            let nodes = (0..<options.workers).map { "bench-\(tag)-w\($0)" }
            for (store, node) in zip(stores, nodes) {
                guard try await store.registerNode(NodeDeclaration(node: node, queues: ["default"], commands: [],
                                                                   jobSlots: options.batch)) else {
                    fail("store: node \(node) is held by another process")
                }
            }
            for start in stride(from: 0, to: options.jobs, by: 1000) {
                let jobs = (start..<min(start + 1000, options.jobs)).map { k in
                    NewJob(requestedID: "s\(tag)-\(k)", manifest: manifest, manifestName: "s\(k).plist", submittedOn: "bench",
                           qosRank: 2, priorityRank: 2, queues: ["default"], commands: [])
                }
                _ = try await stores[0].insertJobs(jobs)
            }
            emit("ready")
            _ = readLine()
            let started = Date()
            let counts = try await withThrowingTaskGroup(of: (jobs: Int, claims: Int).self) { workers in
                for (store, node) in zip(stores, nodes) {
                    workers.addTask { try await work(store, node: node, batch: options.batch) }
                }
                var total = (jobs: 0, claims: 0)
                for try await count in workers { total = (total.jobs + count.jobs, total.claims + count.claims) }
                return total
            }
            let seconds = Date().timeIntervalSince(started)
            emit(String(format: #"{"part": "opqueued-store-only", "workers": %d, "batch": %d, "jobs": %d, "ended": %d, "claimRounds": %d, "#
                        + #""seconds": %.3f, "jobsPerSecond": %.1f, "#
                        + #""includes": "ClaimJobs (up to batch) -> no-op -> CompleteJobs with a result document, fenced; "#
                        + #"no file work, no engine, no journal"}"#,
                        options.workers, options.batch, options.jobs, counts.jobs, counts.claims, seconds, Double(counts.jobs) / seconds))
            group.cancelAll()
        }
    }

    /// One worker: claim rounds until one finds nothing left, each round's jobs completed in one statement.
    static func work(_ store: PostgresClusterStore, node: String, batch: Int) async throws -> (jobs: Int, claims: Int) {
        var ended = 0
        var rounds = 0
        while true {
            let claimed = try await store.claimJobs(node: node, limit: batch, queues: ["default"], commands: [],
                                                    budget: 1 << 30, maxManifestBytes: 1 << 24)
            rounds += 1
            if claimed.isEmpty { return (ended, rounds) }
            let recorded = try await store.completeJobs(claimed.map {
                JobCompletion(job: $0.id, fence: $0.fence, status: "succeeded", result: result)
            })
            ended += recorded.count
        }
    }
}
