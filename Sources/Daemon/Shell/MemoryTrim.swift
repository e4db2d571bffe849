// MemoryTrim: when memory freed by ended jobs goes back to the system, as a pure value on `work` (the clock passed
// in). glibc keeps freed pages otherwise, and RSS would stay at the high-water mark. Once nothing is active: at most
// every `interval`, or sooner after `operations` operations were released; an idle moment that comes sooner is
// followed by a trim once the interval is up, if still idle then.

struct MemoryTrim {
    static let interval = 5.0
    static let operations = 10_000

    private var released = 0
    private var last = 0.0
    private var scheduled = false

    enum Action: Equatable {
        /// Give memory back now.
        case trim
        /// Ask again after this many seconds (`fired` first), if still idle then.
        case later(Double)
        case none
    }

    /// Operations whose memory was let go, idle or not.
    mutating func released(_ operations: Int) { released += operations }

    /// Nothing is active at `now`: what to do.
    mutating func idle(now: Double) -> Action {
        if released >= Self.operations || now - last >= Self.interval {
            released = 0
            last = now
            return .trim
        }
        guard !scheduled else { return .none }
        scheduled = true
        return .later(max(0.1, Self.interval - (now - last)))
    }

    /// A `later` came due.
    mutating func fired() { scheduled = false }
}
