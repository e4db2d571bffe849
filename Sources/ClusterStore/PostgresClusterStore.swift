// The cluster store on PostgreSQL (SPEC §8), through postgres-nio: a pool for statements and one dedicated
// connection for LISTEN (the pool does not LISTEN), which reconnects on its own.
//
// Every statement is a named query of SQL/queries.sql with bound parameters; nothing user-supplied is ever
// spliced into SQL text. Errors go out as ClusterStoreError, which carries the server's message and never the
// password or a bound value. Trusts rows no more than files: a row that does not decode is an error, not a crash.

import Logging
import NIOCore
import PostgresNIO
import Synchronization

public final class PostgresClusterStore: ClusterStore {
    public let url: DatabaseURL
    /// The statements' pool (renewed after an outage: `reconnect`).
    let pool: RenewablePool
    /// Every statement runs under it: none waits forever on a connection that closed (ClosedConnectionGuard.swift).
    let inFlight: InFlightStatements
    /// Where its statements and its connections' work run: never the shared cooperative pool.
    public let executor: ClusterExecutor
    /// The statement_timeout the pool's connections ask of the server (see `init`).
    let serverTimeout: ServerTimeout
    let logger: Logger
    public let wakeups: AsyncStream<Wakeup>
    let wakeupContinuation: AsyncStream<Wakeup>.Continuation

    public static var quietLogger: Logger {
        var logger = Logger(label: "opqueued.cluster")
        logger.logLevel = .warning
        return logger
    }

    /// The notification channel every node listens on; payloads are Wakeup names.
    static let channel = "opqueued"

    /// `logger` also receives postgres-nio's background messages (a failed reconnect is `info` there); the
    /// default keeps only warnings and errors, since the store reports connection changes itself (Wakeup).
    /// `abandonAfter`: the longest the caller waits for a pooled statement, in seconds (nil: not said). The server is
    /// asked (statement_timeout, a startup parameter) to end a statement a little after that, so that what the caller
    /// gave up on — stuck behind a lock an operator holds, say — does not wait on, holding a connection, while the
    /// caller's retries through fresh connections pile more up (behind a long lock, two nodes took four more of the
    /// server's connections every 5 s, until none would be left). A server or pooler that refuses the parameter is connected to without it.
    /// `executor`: where statements run (the node's, so that one queue serves it; else one of the store's own).
    public init(url: DatabaseURL, logger: Logger = PostgresClusterStore.quietLogger, abandonAfter: Double? = nil,
                executor: ClusterExecutor? = nil) throws {
        self.url = url
        self.logger = logger
        let executor = executor ?? ClusterExecutor(label: "opqueued-cluster-store")
        self.executor = executor
        self.inFlight = InFlightStatements(executor: executor)
        let serverTimeout = ServerTimeout(milliseconds: abandonAfter.map { Int(($0 * 1000).rounded(.up)) + 1000 })
        self.serverTimeout = serverTimeout
        self.pool = try RenewablePool(makeConfiguration: { try url.clientConfiguration(statementTimeout: serverTimeout.milliseconds) },
                                      logger: logger)
        (wakeups, wakeupContinuation) = AsyncStream.makeStream(of: Wakeup.self, bufferingPolicy: .bufferingNewest(64))
    }

    /// Runs the pool and the listening connection until the calling task is cancelled, on the store's executor
    /// whatever the caller's.
    public func run() async {
        await withTaskExecutorPreference(executor) {
            await withDiscardingTaskGroup { group in
                group.addTask { await self.pool.run() }
                group.addTask { await self.listen() }
            }
        }
        wakeupContinuation.finish()
    }

    /// Statements go through fresh connections from now on (see RenewablePool).
    public func reconnect() { pool.renew() }

    public var connectionAdvice: String? { serverTimeout.advice }

    // MARK: statements

    func query(_ sql: String, _ binds: PostgresBindings = PostgresBindings(), doing: String) async throws -> [PostgresRow] {
        do {
            return try await onPooledConnection { [logger] connection in
                try await connection.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger).collect()
            }
        } catch {
            throw ClusterStoreError.wrapping(error, doing: doing)
        }
    }

    /// `body` on a connection leased from the pool, watched by its close (`InFlightStatements`).
    private func onPooledConnection<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await pool.client().withConnection { [inFlight] connection in
            try await inFlight.run(on: connection) { try await body(connection) }
        }
    }

    /// One transaction on a pooled connection; retried whole (at most 3 times) when the server aborts it for a
    /// deadlock or a serialization failure, which concurrent inserters of crossing ids can meet.
    func transaction<T: Sendable>(doing: String, _ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try await onPooledConnection { [logger] connection in
                    try await connection.withTransaction(logger: logger) { connection in
                        try await body(connection)
                    }
                }
            } catch {
                let wrapped = ClusterStoreError.wrapping(unwrapTransactionError(error), doing: doing)
                if attempt < 3, wrapped.sqlState == "40P01" || wrapped.sqlState == "40001" { continue }
                throw wrapped
            }
        }
    }

    private func unwrapTransactionError(_ error: any Error) -> any Error {
        if let error = error as? PostgresTransactionError {
            return error.closureError ?? error.beginError ?? error.commitError ?? error.rollbackError ?? error
        }
        return error
    }

    func execute(_ connection: PostgresConnection, _ sql: String,
                 _ binds: PostgresBindings = PostgresBindings()) async throws -> [PostgresRow] {
        try await connection.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger).collect()
    }

    // MARK: schema

    /// Creates or upgrades the schema on a connection of its own (so that a refused login reports the server's
    /// message), in one transaction holding the migration advisory lock: concurrent migrators run one after the
    /// other and the later ones find nothing to do.
    public func migrate() async throws -> Int {
        try await withDedicatedConnection(doing: "migrating the cluster schema", statementTimeout: true) { connection in
            _ = try await self.execute(connection, "BEGIN")
            do {
                // Asked on this connection only to learn whether the server takes it; a migration is never cut short.
                _ = try await self.execute(connection, "SET LOCAL statement_timeout = 0")
                _ = try await self.execute(connection, Queries.advisoryLockMigrations)
                let current = try await self.schemaVersion(connection)
                if current > Migrations.newest {
                    // Newer than this code: it runs only if every newer version says code of this version may.
                    if let needed = try await self.newerSchemaNeeds(connection) {
                        throw ClusterStoreError(.schemaTooNew,
                            "the cluster schema in \(self.url.database) is version \(current), "
                            + "newer than the \(Migrations.newest) this opqueued knows\(needed): upgrade this node")
                    }
                    _ = try await self.execute(connection, "COMMIT")
                    return current
                }
                for migration in Migrations.all where migration.version > current {
                    for statement in migration.up { _ = try await self.execute(connection, statement) }
                    var binds = PostgresBindings()
                    binds.append(Int32(migration.version))
                    _ = try await self.execute(connection, Queries.recordSchemaVersion, binds)
                }
                _ = try await self.execute(connection, "COMMIT")
                return max(current, Migrations.newest)
            } catch {
                _ = try? await self.execute(connection, "ROLLBACK")
                throw error
            }
        }
    }

    /// Why this code may not run against the schema versions applied that are newer than it knows (what they need,
    /// or "" when one of them does not say), or nil when each of them says this code may (opq_schema_readers,
    /// migration 6).
    func newerSchemaNeeds(_ connection: PostgresConnection) async throws -> String? {
        guard try await execute(connection, Queries.schemaReadersExist).first.map({
            try decode($0.makeRandomAccess()[0], Bool.self)
        }) == true else {
            return ""
        }
        var binds = PostgresBindings()
        binds.append(Int32(Migrations.newest))
        guard let row = try await execute(connection, Queries.newerSchemaReaders, binds).first else { return "" }
        let columns = row.makeRandomAccess()
        let silent = try decode(columns[0], Int.self), oldest = try decode(columns[1], Int.self)
        if silent > 0 { return "" }
        return oldest <= Migrations.newest ? nil : " (which needs an opqueued that knows schema \(oldest) at least)"
    }

    /// The applied schema version, 0 for an empty database.
    func schemaVersion(_ connection: PostgresConnection) async throws -> Int {
        guard try await execute(connection, Queries.schemaExists).first.map({
            try decode($0.makeRandomAccess()[0], Bool.self)
        }) == true else {
            return 0
        }
        return try await execute(connection, Queries.schemaVersion).first.map { try decode($0.makeRandomAccess()[0], Int.self) } ?? 0
    }

    /// Undoes migrations down to `version` (0: nothing left). For operators and tests; never run by a node.
    public func migrateDown(to version: Int) async throws {
        try await withDedicatedConnection(doing: "migrating the cluster schema down") { connection in
            _ = try await self.execute(connection, "BEGIN")
            do {
                _ = try await self.execute(connection, Queries.advisoryLockMigrations)
                let current = try await self.schemaVersion(connection)
                for migration in Migrations.all.reversed() where migration.version > version && migration.version <= current {
                    for statement in migration.down { _ = try await self.execute(connection, statement) }
                }
                _ = try await self.execute(connection, "COMMIT")
            } catch {
                _ = try? await self.execute(connection, "ROLLBACK")
                throw error
            }
        }
    }

    /// Opens one connection outside the pool; its errors carry the server's own message.
    public func checkConnection() async throws {
        try await withDedicatedConnection(doing: "connecting to \(url)") { connection in
            _ = try await self.execute(connection, "SELECT 1")
        }
    }

    /// `statementTimeout`: connects asking for the pool's statement_timeout, to learn whether the server (or a pooler
    /// in front of it) takes it; when refused, the pool stops asking (a fresh pool from now on), this says so once,
    /// and connects without it.
    func withDedicatedConnection<T: Sendable>(doing: String, statementTimeout: Bool = false,
                                              _ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        let connection: PostgresConnection
        do {
            let asked = statementTimeout ? serverTimeout.milliseconds : nil
            do {
                connection = try await PostgresConnection.connect(configuration: try url.connectionConfiguration(statementTimeout: asked),
                                                                  id: 0, logger: logger)
            } catch let error as PSQLError where asked != nil && Self.refusesStartupParameter(error) {
                serverTimeout.refused(advice: "\(url) refuses the startup parameter statement_timeout "
                    + "(a connection pooler such as PgBouncer in front of PostgreSQL?): "
                    + "a statement this node stops waiting for (one stuck behind a lock, say) runs on to its end on the server, "
                    + "holding a connection. To bound it, set it for the node's role: "
                    + "ALTER ROLE \(url.user) SET statement_timeout = '\(asked ?? 0)ms'")
                pool.renew(wait: 0)
                connection = try await PostgresConnection.connect(configuration: try url.connectionConfiguration(), id: 0, logger: logger)
            }
        } catch {
            let wrapped = ClusterStoreError.wrapping(error, doing: "connecting to \(url)")
            // No word from a PostgreSQL server (refused, timed out, hung up, or answered in another protocol: a port
            // typo aimed at a web server): the address itself may be wrong.
            if let psql = error as? PSQLError, psql.serverInfo == nil, wrapped.kind == .connection {
                throw ClusterStoreError(.connection, wrapped.description + " (is PostgreSQL listening where cluster.database points?)",
                                        cause: wrapped.cause)
            }
            throw wrapped
        }
        do {
            let result = try await inFlight.run(on: connection) { try await body(connection) }
            try? await connection.close()
            return result
        } catch {
            try? await connection.close()
            throw ClusterStoreError.wrapping(error, doing: doing)
        }
    }

    /// PgBouncer: FATAL 08P01 "unsupported startup parameter: statement_timeout".
    static func refusesStartupParameter(_ error: PSQLError) -> Bool {
        guard let info = error.serverInfo, let message = info[.message] else { return false }
        return message.contains("startup parameter") && message.contains("statement_timeout")
    }

    // MARK: nodes

    @discardableResult
    public func registerNode(_ declaration: NodeDeclaration, leaseSeconds: Double, replacing: String?,
                             silentAt: Int64?) async throws -> Bool {
        try await transaction(doing: "registering node \(declaration.node)") { connection in
            var binds = PostgresBindings()
            binds.append(declaration.node)
            binds.append(declaration.queues)
            binds.append(declaration.commands)
            binds.append(Int32(clamping: declaration.jobSlots))
            binds.append(declaration.info)
            binds.append(declaration.commandSignatures.sorted { $0.key < $1.key }.map { "\($0.key)\t\($0.value)" })
            binds.append(leaseSeconds.isFinite ? leaseSeconds : 0)
            binds.append(replacing ?? "")
            binds.append(Int32(Migrations.newest))
            binds.append(silentAt)
            if try await self.execute(connection, Queries.registerNode, binds).isEmpty { return false }
            for (queue, limit) in declaration.clusterLimits.sorted(by: { $0.key < $1.key }) where limit > 0 {
                var binds = PostgresBindings()
                binds.append(queue)
                binds.append(Int32(clamping: limit))
                _ = try await self.execute(connection, Queries.ensureQueueSlots, binds)
            }
            _ = try await self.execute(connection, Queries.notifyNodes, PostgresBindings())
            return true
        }
    }

    public func nodeOwner(_ node: String) async throws -> NodeOwner? {
        var binds = PostgresBindings()
        binds.append(node)
        return try await query(Queries.nodeOwner, binds, doing: "reading who holds node \(node)").first.map { row in
            let columns = row.makeRandomAccess()
            return NodeOwner(info: try decode(columns[0], String.self), secondsSinceBeat: try decode(columns[1], Double.self),
                             beat: NodeBeat(node: node, beat: try decode(columns[2], Int64.self),
                                            leaseSeconds: try decode(columns[3], Double?.self)))
        }
    }

    public func heartbeat(node: String, info: String?, progress: [UInt8]?, held: [String]?) async throws -> Heartbeat {
        var binds = PostgresBindings()
        binds.append(node)
        binds.append(info ?? "")
        binds.append(progress.map { ByteBuffer(bytes: $0) })
        if let held { binds.append(held) }
        let rows = try await query(held == nil ? Queries.heartbeat : Queries.heartbeatHeld, binds,
                                   doing: "renewing the lease of node \(node)")
        var beat = Heartbeat(at: 0, held: [:], registered: !rows.isEmpty)
        for row in rows {
            let columns = row.makeRandomAccess()
            beat.at = try decode(columns[0], Double.self)
            if let id = try decode(columns[1], String?.self), let fence = try decode(columns[2], Int64?.self) {
                beat.held[id] = fence
            }
        }
        return beat
    }

    public func releaseJobs(node: String, _ jobs: [String: Int64]) async throws -> Set<String> {
        if jobs.isEmpty { return [] }
        let sorted = jobs.sorted { $0.key < $1.key }
        var binds = PostgresBindings()
        binds.append(node)
        binds.append(sorted.map(\.key))
        binds.append(sorted.map(\.value))
        return Set(try await query(Queries.releaseJobs, binds, doing: "handing \(jobs.count) job(s) of node \(node) back").map {
            try decode($0.makeRandomAccess()[0], String.self)
        })
    }

    public func nodeBeats() async throws -> [NodeBeat] {
        try await query(Queries.nodeBeats, PostgresBindings(), doing: "reading the nodes' beats").map { row in
            let c = row.makeRandomAccess()
            return NodeBeat(node: try decode(c[0], String.self), beat: try decode(c[1], Int64.self),
                            leaseSeconds: try decode(c[2], Double?.self))
        }
    }

    public func takeOverSilent(_ silent: [NodeBeat]) async throws -> TakeOver {
        var binds = PostgresBindings()
        binds.append(silent.map(\.node))
        binds.append(silent.map(\.beat))
        let rows = try await query(Queries.takeOverSilent, binds, doing: "taking over the jobs of silent nodes")
        var result = TakeOver(jobs: [], freedSlotQueues: [])
        for row in rows {
            let columns = row.makeRandomAccess()
            let kind = try decode(columns[0], String.self)
            let id = try decode(columns[1], String.self)
            switch kind {
            case "job": result.jobs.append((id: id, fromNode: try decode(columns[2], String?.self) ?? ""))
            case "slot": result.freedSlotQueues.append(id)
            case "node": result.nodes.append(id)
            default: break
            }
        }
        return result
    }

    public func nodes(leaseSeconds: Double, countingJobs: Bool) async throws -> [NodeStatus] {
        var binds = PostgresBindings()
        binds.append(leaseSeconds)
        binds.append(countingJobs)
        return try await query(Queries.nodes, binds, doing: "listing the cluster's nodes").map { row in
            let c = row.makeRandomAccess()
            return NodeStatus(node: try decode(c[0], String.self), queues: try decode(c[1], [String].self),
                              commands: try decode(c[2], [String].self), jobSlots: try decode(c[3], Int.self),
                              lastHeartbeat: try decode(c[4], Double.self), connected: try decode(c[5], Bool.self),
                              jobs: try decode(c[6], Int.self), schema: try decode(c[7], Int?.self))
        }
    }

    public func queueCounts() async throws -> [QueueCount] {
        try await query(Queries.queueCounts, doing: "counting the cluster's jobs per queue").map { row in
            let c = row.makeRandomAccess()
            return QueueCount(queue: try decode(c[0], String.self), waiting: try decode(c[1], Int.self),
                              running: try decode(c[2], Int.self))
        }
    }

    public func liveGroups() async throws -> [LiveGroup] {
        try await query(Queries.liveGroups, doing: "reading the cluster's jobs waiting and running").map { row in
            let c = row.makeRandomAccess()
            let state = try decode(c[0], String.self)
            return LiveGroup(state: JobState(rawValue: state) ?? .waiting, node: try decode(c[1], String?.self),
                             queues: try decode(c[2], [String].self), commands: try decode(c[3], [String].self),
                             jobs: try decode(c[4], Int.self))
        }
    }

    public func declared() async throws -> (queues: Set<String>, commands: Set<String>, commandSignatures: [String: String]) {
        let rows = try await query(Queries.declaredEverywhere, doing: "reading the queues and commands nodes declare")
        guard let c = rows.first?.makeRandomAccess() else { return ([], [], [:]) }
        var signatures: [String: String] = [:]
        for entry in try decode(c[2], [String].self) {
            guard let tab = entry.firstIndex(of: "\t") else { continue }
            let name = String(entry[..<tab])
            if signatures[name] == nil { signatures[name] = String(entry[entry.index(after: tab)...]) }
        }
        return (Set(try decode(c[0], [String].self)), Set(try decode(c[1], [String].self)), signatures)
    }

    // MARK: jobs

    public func claimJobs(node: String, limit: Int, queues: [String], commands: [String], budget: Int,
                          maxManifestBytes: Int) async throws -> [ClaimedJob] {
        if limit <= 0 { return [] }
        var binds = PostgresBindings()
        binds.append(node)
        binds.append(limit)
        binds.append(queues)
        binds.append(commands)
        binds.append(Int64(max(1, budget)))
        binds.append(Int64(max(0, maxManifestBytes)))
        var claimed = try await query(Queries.claimJobs, binds, doing: "claiming jobs for node \(node)").map(claimedJob)
        // RETURNING keeps no order: put them back in claim order.
        claimed.sort { a, b in
            if a.job.qosRank != b.job.qosRank { return a.job.qosRank > b.job.qosRank }
            if a.job.priorityRank != b.job.priorityRank { return a.job.priorityRank > b.job.priorityRank }
            return a.seq < b.seq
        }
        return claimed.map(\.job)
    }

    public func claimCancelled(job: String, node: String, maxManifestBytes: Int) async throws -> ClaimedJob? {
        var binds = PostgresBindings()
        binds.append(job)
        binds.append(node)
        binds.append(Int64(max(0, maxManifestBytes)))
        return try await query(Queries.claimCancelledJob, binds, doing: "claiming the cancelled job \(job) for node \(node)")
            .first.map(claimedJob)?.job
    }

    /// A row of ClaimJobs or ClaimCancelledJob, with its claim-order sequence.
    private func claimedJob(_ row: PostgresRow) throws -> (seq: Int64, job: ClaimedJob) {
        let c = row.makeRandomAccess()
        let job = ClaimedJob(
            id: try decode(c[0], String.self), requestedID: try decode(c[1], String.self),
            manifest: Array(try decode(c[2], ByteBuffer.self).readableBytesView),
            manifestName: try decode(c[3], String.self), submittedOn: try decode(c[4], String.self),
            submittedAt: try decode(c[5], Double.self), qosRank: Int(try decode(c[6], Int16.self)),
            priorityRank: Int(try decode(c[7], Int16.self)), fence: try decode(c[9], Int64.self),
            fromNode: try decode(c[10], String?.self), manifestBytes: Int(try decode(c[11], Int64.self)),
            cancels: try decode(c[12], [String].self).map { $0.isEmpty ? nil : $0 })
        return (try decode(c[8], Int64.self), job)
    }

    public func complete(job: String, fence: Int64, status: String, result: [UInt8]) async throws -> Bool {
        try await completeJobs([JobCompletion(job: job, fence: fence, status: status, result: result)]).contains(job)
    }

    public func completeJobs(_ completions: [JobCompletion]) async throws -> Set<String> {
        if completions.isEmpty { return [] }
        var binds = PostgresBindings()
        binds.append(completions.map(\.job))
        binds.append(completions.map(\.fence))
        binds.append(completions.map(\.status))
        binds.append(completions.map { ByteBuffer(bytes: $0.result) })
        return Set(try await query(Queries.completeJobs, binds, doing: "recording the end of \(completions.count) job(s)").map {
            try decode($0.makeRandomAccess()[0], String.self)
        })
    }

    public func job(_ id: String) async throws -> JobRecord? {
        var binds = PostgresBindings()
        binds.append(id)
        guard let row = try await query(Queries.lookupJob, binds, doing: "looking up job \(id)").first else { return nil }
        let c = row.makeRandomAccess()
        let stateName = try decode(c[6], String.self)
        guard let state = JobState(rawValue: stateName) else {
            throw ClusterStoreError(.badRow, "job \(id) has the unknown state \(stateName)")
        }
        return JobRecord(
            id: try decode(c[0], String.self), requestedID: try decode(c[1], String.self),
            manifest: Array(try decode(c[2], ByteBuffer.self).readableBytesView),
            manifestName: try decode(c[3], String.self), submittedOn: try decode(c[4], String.self),
            submittedAt: try decode(c[5], Double.self), state: state, node: try decode(c[7], String?.self),
            fence: try decode(c[8], Int64?.self), fromNode: try decode(c[9], String?.self),
            status: try decode(c[10], String?.self),
            result: try decode(c[11], ByteBuffer?.self).map { Array($0.readableBytesView) },
            finishedAt: try decode(c[12], Double?.self),
            nodeProgress: try decode(c[13], ByteBuffer?.self).map { Array($0.readableBytesView) },
            nodeProgressAt: try decode(c[14], Double?.self), notBefore: try decode(c[15], Double?.self))
    }

    public func jobsNoLiveNodeCanRun(leaseSeconds: Double, limit: Int) async throws -> [UnrunnableJob] {
        var binds = PostgresBindings()
        binds.append(leaseSeconds)
        binds.append(limit)
        return try await query(Queries.jobsNoLiveNodeCanRun, binds, doing: "finding jobs no live node can run").map { row in
            let c = row.makeRandomAccess()
            return UnrunnableJob(id: try decode(c[0], String.self), missingQueues: try decode(c[1], [String].self),
                                 missingCommands: try decode(c[2], [String].self))
        }
    }

    public func prune(olderThanSeconds: Double, batchSize: Int) async throws -> PruneReport {
        var report = PruneReport(deleted: 0, batches: 0)
        let batchSize = max(1, batchSize)
        while true {
            var binds = PostgresBindings()
            binds.append(olderThanSeconds)
            binds.append(batchSize)
            let deleted = try await query(Queries.pruneFinished, binds, doing: "pruning finished jobs").count
            report.batches += 1
            report.deleted += deleted
            if deleted < batchSize { return report }
        }
    }

    public func forgetNodes(silentForSeconds: Double) async throws -> [String] {
        var binds = PostgresBindings()
        binds.append(silentForSeconds)
        return try await query(Queries.pruneNodes, binds, doing: "forgetting nodes long silent").map { row in
            try decode(row.makeRandomAccess()[0], String.self)
        }
    }

    public func probeWakeups(_ token: String) async throws {
        var binds = PostgresBindings()
        binds.append(token)
        _ = try await query(Queries.notifyProbe, binds, doing: "probing wake-ups")
    }

    // MARK: decoding

    func decode<T: PostgresDecodable>(_ cell: PostgresCell, _ type: T.Type) throws -> T {
        do {
            return try cell.decode(T.self)
        } catch {
            throw ClusterStoreError(.badRow, "column \(cell.columnName) does not hold a \(T.self)")
        }
    }
}

/// A list of strings as a JSON array (InsertJobs passes each row's queues and commands so).
func jsonArray(_ strings: [String]) -> String {
    var out = "["
    for (i, string) in strings.enumerated() {
        if i > 0 { out += "," }
        out += "\""
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
    return out + "]"
}

/// The statement_timeout (milliseconds) the pool asks of the server; none once the server refused it, and then what
/// the operator can do instead.
final class ServerTimeout: Sendable {
    private let value: Mutex<(milliseconds: Int?, advice: String?)>

    init(milliseconds: Int?) { value = Mutex((milliseconds, nil)) }

    var milliseconds: Int? { value.withLock { $0.milliseconds } }
    var advice: String? { value.withLock { $0.advice } }

    func refused(advice: String) { value.withLock { $0 = (nil, advice) } }
}
