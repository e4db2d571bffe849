// PostgresClusterStore's cluster-wide queue slots (clusterMaxConcurrentOperationCount, SPEC §8) and the control
// plane's rows: suspensions and cancel requests.

import Logging
import NIOCore
import PostgresNIO
import Synchronization

extension PostgresClusterStore {
    // MARK: cluster slots

    public func acquireSlots(queue: String, limit: Int, node: String, count: Int, priority: Int,
                             leaseSeconds: Double) async throws -> [SlotLease] {
        guard count > 0 else { return [] }
        var binds = PostgresBindings()
        binds.append(queue)
        binds.append(limit)
        binds.append(node)
        binds.append(count)
        binds.append(leaseSeconds)
        binds.append(Int16(clamping: priority))
        return try await query(Queries.acquireSlots, binds, doing: "acquiring cluster slots of queue \(queue)").map { row in
            let c = row.makeRandomAccess()
            return SlotLease(queue: queue, slot: try decode(c[0], Int.self), fence: try decode(c[1], Int64.self),
                             holder: node, job: "", operation: "")
        }
    }

    public func keepSlots(_ leases: [SlotLease], priority: Int, leaseSeconds: Double) async throws -> [SlotLease] {
        guard let first = leases.first else { return [] }
        var binds = PostgresBindings()
        binds.append(first.queue)
        binds.append(leaseSeconds)
        binds.append(first.holder)
        binds.append(leases.map { Int32(clamping: $0.slot) })
        binds.append(leases.map(\.fence))
        binds.append(Int16(clamping: priority))
        let freed = try await query(Queries.keepSlots, binds, doing: "keeping cluster slots of queue \(first.queue)").map {
            try decode($0.makeRandomAccess()[0], Int.self)
        }
        return leases.filter { freed.contains($0.slot) }
    }

    public func waitForSlot(queue: String, node: String, priority: Int) async throws {
        var binds = PostgresBindings()
        binds.append(queue)
        binds.append(node)
        binds.append(Int16(clamping: priority))
        _ = try await query(Queries.waitForSlot, binds, doing: "recording a wait for a cluster slot of queue \(queue)")
    }

    public func stopWaitingForSlot(queue: String, node: String) async throws {
        var binds = PostgresBindings()
        binds.append(queue)
        binds.append(node)
        _ = try await query(Queries.stopWaitingForSlot, binds, doing: "withdrawing a wait for a cluster slot of queue \(queue)")
    }

    public func releaseSlot(_ lease: SlotLease) async throws -> Bool {
        var binds = PostgresBindings()
        binds.append(lease.queue)
        binds.append(Int32(clamping: lease.slot))
        binds.append(lease.fence)
        return try await !query(Queries.releaseSlot, binds, doing: "releasing a cluster slot of queue \(lease.queue)").isEmpty
    }

    public func freeNodeSlots(node: String) async throws -> [String] {
        var binds = PostgresBindings()
        binds.append(node)
        return try await query(Queries.freeNodeSlots, binds, doing: "freeing the cluster slots node \(node) held before").map {
            try decode($0.makeRandomAccess()[0], String.self)
        }
    }

    public func slotHolders(queue: String) async throws -> [SlotLease] {
        var binds = PostgresBindings()
        binds.append(queue)
        return try await query(Queries.slotHolders, binds, doing: "listing the cluster slots of queue \(queue)").map { row in
            let c = row.makeRandomAccess()
            return SlotLease(queue: queue, slot: try decode(c[0], Int.self), fence: try decode(c[4], Int64.self),
                             holder: try decode(c[1], String.self), job: try decode(c[2], String?.self) ?? "",
                             operation: try decode(c[3], String?.self) ?? "")
        }
    }

    // MARK: control

    public func setSuspended(_ queue: String, _ suspended: Bool) async throws {
        var binds = PostgresBindings()
        binds.append(queue)
        _ = try await query(suspended ? Queries.suspend : Queries.resume, binds,
                            doing: "\(suspended ? "suspending" : "resuming") queue \(queue)")
    }

    public func suspendedQueues() async throws -> Set<String> {
        Set(try await query(Queries.suspendedQueues, doing: "reading the suspended queues").map {
            try decode($0.makeRandomAccess()[0], String.self)
        })
    }

    public func requestCancel(job: String, operation: String?, notAfter: Double) async throws -> CancelOutcome {
        var binds = PostgresBindings()
        binds.append(job)
        binds.append(operation)
        binds.append(notAfter)
        guard let row = try await query(Queries.requestCancel, binds, doing: "cancelling job \(job)").first else {
            return .unknownJob
        }
        let c = row.makeRandomAccess()
        let state = try decode(c[0], String.self)
        if state == "late" { return .late }
        if state.isEmpty { return .unknownJob }
        return try decode(c[1], Int.self) > 0 ? .requested : .alreadyEnded
    }

    public func pendingCancels(node: String) async throws -> [CancelRequest] {
        var binds = PostgresBindings()
        binds.append(node)
        return try await query(Queries.pendingCancels, binds, doing: "reading the cancels for node \(node)").map { row in
            let c = row.makeRandomAccess()
            return CancelRequest(job: try decode(c[0], String.self), operation: try decode(c[1], String?.self),
                                 fence: try decode(c[2], Int64?.self))
        }
    }
}
