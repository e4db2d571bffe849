// One thread for all of tracing's work, at a lower scheduling priority than the daemon's own threads: making the
// spans, and (as the task executor the exporter's service runs on) swift-otel's span processing and protobuf
// encoding. A trace is made after its job has ended and nothing waits for it, so it takes what CPU the jobs leave:
// on a busy machine the daemon's own threads go first, and traces catch up when they can.

import CShims
import Foundation

public final class TraceThread: TaskExecutor, @unchecked Sendable {
    private enum Work {
        case job(UnownedJob)
        case block(@Sendable () -> Void)
    }

    private let condition = NSCondition()
    private var queue: [Work] = []

    /// `nice`: the thread's nice value (Linux gives each thread its own), as a `utility` operation's.
    public init(name: String = "opqueued.trace", nice: Int32 = 10) {
        let thread = Thread { [self] in
            _ = opq_set_thread_priority(nice, 0)
            run()
        }
        thread.name = name
        thread.start()
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        put(.job(UnownedJob(job)))
    }

    /// Runs `block` on the thread, after what is queued before it.
    public func async(_ block: @escaping @Sendable () -> Void) {
        put(.block(block))
    }

    /// Runs `block` on the thread and waits for it; never call it from the thread itself.
    public func sync(_ block: @escaping @Sendable () -> Void) {
        let done = DispatchSemaphore(value: 0)
        put(.block { block(); done.signal() })
        done.wait()
    }

    private func put(_ work: Work) {
        condition.lock()
        queue.append(work)
        if queue.count == 1 { condition.signal() }
        condition.unlock()
    }

    /// Takes everything queued at once, runs it in order, and waits for more. The thread lives as long as the process.
    private func run() {
        var batch: [Work] = []
        while true {
            condition.lock()
            while queue.isEmpty { condition.wait() }
            swap(&batch, &queue)
            condition.unlock()
            for work in batch {
                switch work {
                case .job(let job): job.runSynchronously(on: asUnownedTaskExecutor())
                case .block(let block): block()
                }
            }
            batch.removeAll(keepingCapacity: true)
        }
    }
}
