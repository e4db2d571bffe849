// InboxIntake: which inbox names to try next, and when to read the inbox whole again, as a pure value: no I/O, the
// clock passed in. The shell keeps one on `work`, reads the folder when it says so and claims the names it gives.
//
// inotify is a hint: a reported name is tried at once, without reading the folder, and the folder is read whole
// within `rescanInterval` all the same (at start, after an overflow and on the watcher's timer, at once). Memory is
// bounded: at most `scanBatch` names are held; past them the rest is read when those are gone.

import DequeModule

struct InboxIntake {
    /// At most this many names are kept from one read of the inbox; the rest is read at the next.
    static let scanBatch = 4096
    /// While jobs keep the daemon busy, the inbox is read again at most this often (seconds).
    static let rescanInterval = 2.0

    /// Names to try, oldest first: the last read's, and names reported since.
    private var names = Deque<String>()
    /// The names in `names`, so that a name both read and reported is tried once.
    private var queued = Set<String>()
    /// Names a read lease found open for writing: tried first again as soon as inotify says closed.
    private var busy = Set<String>()
    /// When the inbox was last read (seconds since the epoch), and how long that took.
    private var lastRead = 0.0
    private var lastReadSeconds = 0.0
    /// The inbox is to be read whole at once (start, overflow, the watcher's timer, a reload).
    private var readNow = true
    /// Names were reported since the last read: read whole again within `rescanInterval`.
    private var readRequested = false
    /// The last read kept only the oldest `scanBatch` names (or reports were left out past it).
    private var leftSome = false

    /// Whether names wait to be tried, here or in the inbox past the last read's batch.
    var hasMore: Bool { !names.isEmpty || leftSome }

    /// Adds a name to try, unless it already waits its turn; `first`, before the others (a name to retry at once).
    /// Past `scanBatch` names a reported name is left to the read that takes the rest.
    mutating func add(_ name: String, first: Bool = false) {
        guard queued.count < Self.scanBatch || first else {
            leftSome = true
            return
        }
        guard queued.insert(name).inserted else { return }
        if first { names.prepend(name) } else { names.append(name) }
    }

    /// The next name to try.
    mutating func next() -> String? {
        guard let name = names.popFirst() else { return nil }
        queued.remove(name)
        return name
    }

    /// Names inotify reported closed or moved in: each is tried (one found busy before, first); `complete` says
    /// they are all that arrived, else the folder is read whole at once.
    mutating func reported(_ reports: [String], complete: Bool) {
        for name in reports {
            if busy.remove(name) != nil { add(name, first: true) } else { add(name) }
        }
        if complete { readRequested = true } else { readNow = true }
    }

    /// Whether the inbox is to be read now. With nothing to take now (`takes` false) it is still read when due, at
    /// most every `rescanInterval` and every twenty times a read's own time (a huge backlog costs at most a
    /// twentieth of a core to count); an empty queue alone is no reason (a folder that once held a flood costs
    /// all its blocks to read, empty or not).
    func readDue(now: Double, takes: Bool) -> Bool {
        let due = readNow || (names.isEmpty && leftSome) || (readRequested && now - lastRead >= Self.rescanInterval)
        return due && (takes || now - lastRead >= max(Self.rescanInterval, 20 * lastReadSeconds))
    }

    /// The inbox was read: its oldest `manifests` (at most `scanBatch`) of `waiting` in all, at `now`, in `seconds`.
    mutating func read(_ manifests: [String], waiting: Int, now: Double, seconds: Double) {
        names = Deque(manifests)
        queued = Set(manifests)
        lastRead = now
        lastReadSeconds = seconds
        readNow = false
        readRequested = false
        leftSome = waiting > manifests.count
    }

    /// A name was found open for writing (tried first once reported closed), or is no longer so.
    mutating func markBusy(_ name: String) { busy.insert(name) }
    mutating func notBusy(_ name: String) { busy.remove(name) }
}

/// inotify's reports waiting for their round on `work` (under the shell's lock: the watcher's thread adds, `work`
/// takes). Reports that come while a round waits join it: a flood's reads queue one round, not one each (each would
/// claim a batch ahead of the jobs a store hands over meanwhile).
struct InboxReports {
    private var names: [String] = []
    private var complete = true
    private var posted = false

    /// Adds reports (`complete`: all that arrived); true when a round must be posted (none waits yet). Too many to
    /// hold, or not all that arrived: the round reads the inbox whole instead.
    mutating func add(_ reports: [String], complete: Bool) -> Bool {
        if complete && names.count + reports.count <= InboxIntake.scanBatch {
            names.append(contentsOf: reports)
        } else {
            names.removeAll()
            self.complete = false
        }
        defer { posted = true }
        return !posted
    }

    /// The round's reports, taken as it begins: later ones post a round of their own.
    mutating func take() -> (names: [String], complete: Bool) {
        defer { (names, complete, posted) = ([], true, false) }
        return (names, complete)
    }
}
