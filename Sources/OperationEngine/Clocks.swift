// The engine's two clocks: the wall clock for what is reported (start and end times), the monotonic one for timers,
// deadlines and rates (a step of the wall clock moves neither).

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Seconds since the Unix epoch, to the microsecond or better.
func wallClock() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// Seconds on the monotonic clock, for timers.
func monotonicClock() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}
