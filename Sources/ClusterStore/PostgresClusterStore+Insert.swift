// PostgresClusterStore's inserts: a batch of submissions in one statement, one by one where it cannot (a taken id,
// a repeated key, ifJobExists = skip), and a finished job recorded after the fact.

import Logging
import NIOCore
import PostgresNIO
import Synchronization

extension PostgresClusterStore {
    public func insertJobs(_ jobs: [NewJob]) async throws -> [InsertedJob] {
        if jobs.isEmpty { return [] }
        return try await transaction(doing: "inserting \(jobs.count) job(s)") { connection in
            // The batch in one statement (one round trip, not one per job); the jobs it could not take under their
            // requested ids — an id already in the cluster or twice in the batch, a key already submitted — one
            // by one after it, as before.
            var first: [Int] = []
            var ids = Set<String>(), keys = Set<String>()
            for (i, job) in jobs.enumerated() {
                guard ids.insert(job.requestedID).inserted else { continue }
                if let key = job.submissionKey, !keys.insert(key).inserted { continue }
                first.append(i)
            }
            var answers = [InsertedJob?](repeating: nil, count: jobs.count)
            let taken = try await self.insertAtOnce(first.map { jobs[$0] }, connection)
            for i in first where taken.contains(jobs[i].requestedID) {
                answers[i] = InsertedJob(id: jobs[i].requestedID, requestedID: jobs[i].requestedID)
            }
            for i in jobs.indices where answers[i] == nil {
                if jobs[i].skipIfExists {
                    answers[i] = try await self.skipOrInsert(jobs[i], connection)
                    continue
                }
                answers[i] = InsertedJob(id: try await self.insertOne(jobs[i], connection), requestedID: jobs[i].requestedID)
            }
            // One notification per transaction: NOTIFY serialises committers on a global lock.
            _ = try await self.execute(connection, Queries.notifyJobs)
            return answers.compactMap { $0 }
        }
    }

    /// InsertJobs: returns the ids inserted (each its requested id).
    func insertAtOnce(_ jobs: [NewJob], _ connection: PostgresConnection) async throws -> Set<String> {
        if jobs.isEmpty { return [] }
        var binds = PostgresBindings()
        binds.append(jobs.map(\.requestedID))
        binds.append(jobs.map { ByteBuffer(bytes: $0.manifest) })
        binds.append(jobs.map(\.manifestName))
        binds.append(jobs.map(\.submittedOn))
        binds.append(jobs.map { Int16(clamping: $0.qosRank) })
        binds.append(jobs.map { Int16(clamping: $0.priorityRank) })
        binds.append(jobs.map { jsonArray($0.queues) })
        binds.append(jobs.map { jsonArray($0.commands) })
        binds.append(jobs.map { $0.submissionKey ?? "" })
        binds.append(jobs.map { $0.notBefore ?? 0 })
        return Set(try await execute(connection, Queries.insertJobs, binds).map { try decode($0.makeRandomAccess()[0], String.self) })
    }

    /// InsertJob for one job: its requested id if free, else id.N; or, when its submission key is already there,
    /// the id that submission got.
    func insertOne(_ job: NewJob, _ connection: PostgresConnection) async throws -> String {
        var binds = rowBindings(job)
        binds.append(job.submissionKey)
        binds.append(job.notBefore)
        // No row: a concurrent inserter took the candidate id first (look again with a fresh snapshot), or
        // the submission key is already there (a repeated submission: its row's id is the answer).
        for _ in 0..<64 {
            if let id = try await execute(connection, Queries.insertJob, binds).first.map({
                try decode($0.makeRandomAccess()[0], String.self)
            }) {
                return id
            }
            if let key = job.submissionKey {
                var keyBinds = PostgresBindings()
                keyBinds.append(key)
                if let id = try await execute(connection, Queries.submittedJob, keyBinds).first.map({
                    try decode($0.makeRandomAccess()[0], String.self)
                }) {
                    return id
                }
            }
        }
        throw ClusterStoreError(.server, "inserting job \(job.requestedID): no free id after 64 attempts")
    }

    /// The first eight parameters of InsertJob and InsertFinishedJob: what a row keeps of its manifest.
    func rowBindings(_ job: NewJob) -> PostgresBindings {
        var binds = PostgresBindings()
        binds.append(job.requestedID)
        binds.append(ByteBuffer(bytes: job.manifest))
        binds.append(job.manifestName)
        binds.append(job.submittedOn)
        binds.append(Int16(clamping: job.qosRank))
        binds.append(Int16(clamping: job.priorityRank))
        binds.append(job.queues)
        binds.append(job.commands)
        return binds
    }

    public func recordFinished(_ job: NewJob, id: String, node: String, status: String, result: [UInt8]) async throws -> Bool {
        var binds = rowBindings(job)
        binds.append(id)
        binds.append(node)
        binds.append(status)
        binds.append(ByteBuffer(bytes: result))
        return try await !query(Queries.insertFinishedJob, binds, doing: "recording job \(id) as finished").isEmpty
    }

    /// A `skipIfExists` job its batch did not insert under its id: this submission's own row if its key is there (a
    /// submission repeated after a crash), else skipped: the id is held, by an earlier row or a twin earlier in the
    /// batch (the batch's insert waits for a concurrent one of the same id, so of racing submissions exactly one
    /// makes the job).
    func skipOrInsert(_ job: NewJob, _ connection: PostgresConnection) async throws -> InsertedJob {
        if let key = job.submissionKey {
            var keyBinds = PostgresBindings()
            keyBinds.append(key)
            if let id = try await execute(connection, Queries.submittedJob, keyBinds).first.map({
                try decode($0.makeRandomAccess()[0], String.self)
            }) {
                return InsertedJob(id: id, requestedID: job.requestedID)
            }
        }
        return InsertedJob(id: job.requestedID, requestedID: job.requestedID, skipped: true)
    }
}
