// A serial executor of the node's own for everything that talks to the database.

import Dispatch

/// The cluster store's own executor: its async work (the database driver's continuations, the wake-up stream) runs
/// on a serial queue of its own rather than on the shared cooperative pool, so that threads blocked elsewhere in the
/// process (the pool has one thread per core) can never starve the lease's heartbeats. Every job it runs is short:
/// nothing here blocks. The store runs its statements on it too (`InFlightStatements`), and the daemon waits for
/// the store on it (`waitBounded`): one queue per node.
public final class ClusterExecutor: TaskExecutor, @unchecked Sendable {
    private let queue: DispatchQueue

    public init(label: String) {
        queue = DispatchQueue(label: label)
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
