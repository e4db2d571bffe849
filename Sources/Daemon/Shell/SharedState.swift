// The node's state, grouped by what guards it: `SharedState` under the node's one mutex (`Daemon.shared`), read and
// changed by every thread that touches a job; `SpoolSide` confined to the spool's serial queue (`Daemon.work`, WorkBound),
// which makes claims and publications in order. Nothing else in the node changes after `init` but the queue table.

import JobModel
import OperationEngine

/// Under `Daemon.shared`: the job machine and everything that must change in the same step with it.
struct SharedState {
    /// The configuration in force; only a reload replaces it, and reloads come one at a time.
    var configuration: Configuration
    /// The jobs' lifecycle: phases, cancels, operation counts, admission.
    var lifecycle: JobLifecycle<GroupID>
    /// The shell's side of each job in the lifecycle's table.
    var runs: [String: RunningJob] = [:]
    /// The engine's queue for each configured queue name (a reload adds queues).
    var queueIDs: [String: QueueID]
    /// Schedules (§3.7) and their next occurrences.
    var schedules = ScheduleBook()
    /// Publication batches handed to the committer and not yet announced (or stalled): a stop waits for them.
    var publishing = 0
    /// Jobs whose ends wait for the store to record them (a cluster's recorder): they hold no place in the room
    /// offered to the store, up to maxActiveJobs of them.
    var recording = 0
    /// Names inotify reported since the last `scan` round began (InboxIntake.swift).
    var reports = InboxReports()
    /// Names inotify reported closed or moved in, claimable at once without settling.
    var closedHints: Set<String> = []
    /// Inbox names already found unclaimable (a folder, a link, a FIFO named *.plist): logged once.
    var strangersLogged: Set<String> = []
    /// Manifests waiting in the inbox at the last scan, less those claimed since (for status).
    var waiting = 0
    /// `suspend`/`resume` acted on here: on the file spool, which keeps none, for as long as the daemon runs or until
    /// a reload changes that queue's `suspended`; on a cluster node while the store could not record them, each
    /// going once the store's set agrees with it.
    var localSuspensions: [String: Bool] = [:]
    /// The queues the store says are suspended cluster-wide.
    var storeSuspended: Set<String> = []
    /// True until a store that keeps suspensions has said which queues are suspended.
    var awaitingStoreSuspensions: Bool
    /// The ids the daemon gave the manifests it took from its inbox lately, by inbox name: what
    /// `opqueuectl submit` asks for, to print the id a job got when the one its manifest asks for was taken.
    var recentSubmissions = RecentNames(capacity: 4096)
    /// `--once`: called when the last job has ended.
    var finishedWaiters: [@Sendable () -> Void] = []
}

extension SharedState {
    /// Queues held only until the store has said which are suspended (see Daemon.Status.held).
    var heldQueues: Set<String> {
        guard awaitingStoreSuspensions else { return [] }
        return Set((["default"] + configuration.queueNames).filter { name in
            configuration.queues[name]?.suspended != true && localSuspensions[name] != true
        })
    }
}

/// On `Daemon.work` only: the spool's side of intake and publication.
struct SpoolSide {
    /// When memory freed by ended jobs goes back to the system (MemoryTrim.swift).
    var trim = MemoryTrim()
    /// Which inbox names to try next and when to read the inbox again (InboxIntake.swift).
    var intake = InboxIntake()
    /// Jobs whose outbox entries are to be published together.
    var publications: [Daemon.Publication] = []
    /// A spool fault (file system full, no descriptors left, read-only folder, I/O error) or the job store
    /// unavailable, the publications it keeps waiting and its retries (SpoolFault.swift). The lifecycle holds its
    /// reason for admission and status.
    var fault = SpoolFault<Daemon.Publication>()
    /// Whether the 1 s `store.want(room:)` timer is scheduled.
    var wantScheduled = false
    /// Jobs waiting for their `notBefore` (§3.7), earliest first, and the wake-up scheduled.
    var delayed = DelayedJobs()
    /// Whether a claim round waits for the store to accept submissions.
    var submissionRetryScheduled = false
    /// Whether the next submission round is queued on `work`.
    var submissionRoundPosted = false
    /// Whether the spool's fallback from read leases to settling has been logged.
    var leaseFallbackLogged = false
    /// `--once`: inbox names found open for writing, and since when (Daemon+Intake's `waitOnceForWriter`).
    var onceBusySince: [String: Double] = [:]
}
