// The worker governor: keeps a class's brief operations on one worker while one runs them faster than several.
//
// Operations that do almost nothing (well under a microsecond each) make the engine's lock the bottleneck: two workers
// then spend their time waiting for it and moving its data between caches, and run the work slower than one worker
// alone (a million no-op operations: 0.37 s on 0.6 s of CPU with two workers, 0.27 s on 0.27 s with one, on two
// cores). So a worker that keeps finding the lock taken, while another worker of its class is busy, sheds: it leaves
// what it could start to the run list and waits. The class is then governed: what becomes ready goes to the run list,
// which its busy worker takes in order, and no other worker is woken while one is busy.
//
// A governed class is checked every `interval` on the timer thread. It is released (every worker it needs is woken)
// when its busy worker made no step since the last check (a long operation: nothing may wait behind it longer than
// that), or when it did not run clearly faster than the class did before it shed; then it does not shed again for a
// while, a while that doubles each time the comparison is lost. Rates are operations ended a second, on the wall
// clock each worker reads at an operation's end anyway.

struct Governor {
    /// How often a governed class is checked (seconds): the longest an operation waits behind a long one.
    static let interval = 0.000_5
    /// The shortest stretch of several workers whose rate counts (seconds).
    static let shortestWindow = 0.000_2
    /// How much faster than before the governed class must run to stay governed.
    static let margin = 1.1
    /// The longest a lost comparison keeps a class from shedding again (seconds).
    static let longestBackoff = 0.1

    struct Class {
        var governed = false
        /// Operations its workers ended (synchronous ones, whose end reads the clock).
        var steps = 0
        /// Where the current stretch began (`markTime` NaN: at the next step).
        var markSteps = 0
        var markTime = Double.nan
        /// Its rate with several workers, measured over the stretch before it shed.
        var rateBefore = 0.0
        var noShedBefore = -Double.infinity
        var backoff = 0.0
    }

    var classes: [Class]
    /// Consecutive lock acquisitions that found the lock taken before a worker sheds.
    var streakToShed = 8
    /// When the timer thread checks the governed classes next (monotonic seconds; infinity: none is governed).
    var checkAt = Double.infinity
    /// How many times a worker shed, and a class was released (for tests and benchmarks).
    var sheds = 0
    var releases = 0

    init(classes count: Int) { classes = [Class](repeating: Class(), count: count) }

    func isGoverned(_ c: Int) -> Bool { classes[c].governed }

    /// A worker of class `c` ended a synchronous operation at `time`; `streak`: its acquisitions in a row that found
    /// the lock taken; `busy`: the class's workers neither idle nor starting, this one included. True: it sheds.
    mutating func workerStep(_ c: Int, time: Double, streak: Int, busy: Int) -> Bool {
        var k = classes[c]
        defer { classes[c] = k }
        k.steps += 1
        if k.markTime.isNaN { (k.markTime, k.markSteps) = (time, k.steps) }
        guard !k.governed, streak >= streakToShed, busy > 1, time >= k.noShedBefore,
              time - k.markTime >= Self.shortestWindow else { return false }
        k.rateBefore = Double(k.steps - k.markSteps) / (time - k.markTime)
        k.governed = true
        (k.markTime, k.markSteps) = (time, k.steps)
        sheds += 1
        return true
    }

    /// The timer thread's check of class `c` at wall time `now`; `idle`: nothing waits in its run list and none of its
    /// workers is busy. True: the class was released.
    mutating func check(_ c: Int, now: Double, idle: Bool) -> Bool {
        var k = classes[c]
        defer { classes[c] = k }
        guard k.governed else { return false }
        let made = k.steps - k.markSteps
        let elapsed = now - k.markTime
        let faster = made > 0 && elapsed > 0 && Double(made) / elapsed >= k.rateBefore * Self.margin
        if faster && !idle {
            (k.markTime, k.markSteps) = (now, k.steps)
            return false
        }
        k.governed = false
        k.markTime = .nan
        if made > 0 && !faster && !idle {
            // Lost the comparison: several workers did as well; stay with them for a while.
            k.backoff = min(max(2 * k.backoff, Self.interval * 2), Self.longestBackoff)
            k.noShedBefore = now + k.backoff
        }
        releases += 1
        return true
    }

    var anyGoverned: Bool { classes.contains { $0.governed } }
}

extension Engine {
    /// Workers of class `c` neither idle nor starting: running an operation, or waiting for the lock to end one.
    func busyWorkers(_ c: Int) -> Int { workers[c] - idle[c] - spawning[c] }

    /// Under the lock, after a worker shed: has the timer thread check the governed classes in `interval`.
    func armGovernorCheck() {
        guard governor.checkAt == .infinity else { return }
        governor.checkAt = monotonicClock() + Governor.interval
        wakeTimerThread()
    }

    /// Under the lock, on the timer thread when `checkAt` came: checks every governed class, and arms the next check
    /// while any is still governed. A class released has its workers woken by the step that follows.
    func checkGovernor(monotonic: Double) {
        let now = wallClock()
        for c in governor.classes.indices where governor.isGoverned(c) {
            _ = governor.check(c, now: now, idle: runLists[c].isEmpty && busyWorkers(c) == 0)
        }
        governor.checkAt = governor.anyGoverned ? monotonic + Governor.interval : .infinity
    }
}

extension Engine {
    /// Governs class `qos` now, as if one of its workers had shed after running nothing (for tests).
    func governForTesting(_ qos: QualityOfService) {
        lock.withLock {
            let c = Int(qos.rawValue)
            governor.classes[c].governed = true
            (governor.classes[c].markTime, governor.classes[c].markSteps) = (wallClock(), governor.classes[c].steps)
            armGovernorCheck()
        }
    }

    /// Has a worker shed after `streak` acquisitions in a row that found the lock taken (0: whenever another is busy).
    func setGovernorStreakForTesting(_ streak: Int) { lock.withLock { governor.streakToShed = streak } }

    /// How many times a worker shed, and a governed class was released (for tests and benchmarks).
    public var governorCounts: (sheds: Int, releases: Int) { lock.withLock { (governor.sheds, governor.releases) } }
}
