// A pthread mutex and condition variables on the monotonic clock. The engine's waits need a
// condition bound to its one lock, which the standard library's Mutex does not offer.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

final class Lock: @unchecked Sendable {
    let mutex: UnsafeMutablePointer<pthread_mutex_t>

    init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        // Adaptive: a thread that finds the lock taken spins a little before it sleeps. The engine's holds are short
        // (one operation's end and the next one's start), so two workers mostly meet the lock free again within
        // the spin, instead of each hand-off costing a sleep and a wake-up.
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ADAPTIVE_NP))
        pthread_mutex_init(mutex, &attributes)
        pthread_mutexattr_destroy(&attributes)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    @inline(__always) func lock() { pthread_mutex_lock(mutex) }
    @inline(__always) func unlock() { pthread_mutex_unlock(mutex) }
    /// Takes the lock if it is free; false (not held) if another thread holds it.
    @inline(__always) func tryLock() -> Bool { pthread_mutex_trylock(mutex) == 0 }

    /// Takes the lock if it comes free within `seconds`; false if not (then it is not held).
    func lock(within seconds: Double) -> Bool {
        if pthread_mutex_trylock(mutex) == 0 { return true }
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let nanoseconds = Int(now.tv_nsec) + Int(seconds * 1e9)
        var deadline = timespec(tv_sec: now.tv_sec + nanoseconds / 1_000_000_000, tv_nsec: nanoseconds % 1_000_000_000)
        return pthread_mutex_timedlock(mutex, &deadline) == 0
    }

    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }
}

final class Condition: @unchecked Sendable {
    let condition: UnsafeMutablePointer<pthread_cond_t>

    init() {
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        condition.deallocate()
    }

    func wait(_ lock: Lock) { pthread_cond_wait(condition, lock.mutex) }

    /// Waits until signalled or until the monotonic clock reaches `deadline` (seconds).
    func wait(_ lock: Lock, untilMonotonic deadline: Double) {
        // A deadline decades away (or not a number) waits a day at most: the caller re-checks.
        let seconds = deadline.isFinite ? min(deadline, 4e9).rounded(.down) : 86_400
        var ts = timespec(tv_sec: Int(seconds), tv_nsec: deadline.isFinite && deadline < 4e9 ? Int((deadline - seconds) * 1e9) : 0)
        pthread_cond_timedwait(condition, lock.mutex, &ts)
    }

    func signal() { pthread_cond_signal(condition) }
    func broadcast() { pthread_cond_broadcast(condition) }
}
