// The node's fixed parts, grouped by concern; each is made once in `Daemon.init` and never replaced. What changes is
// in SharedState.swift.

import JobTracing
import JobModel
import OperationEngine

/// How the daemon was started.
struct DaemonOptions: Sendable {
    /// The configuration file a reload reads again (nil: the built-in configuration).
    let configPath: String?
    /// `--once`: only what is in the inbox at start, then the daemon ends.
    let once: Bool
}

/// What the node reports besides the journal.
struct Telemetry: Sendable {
    /// Counters and histograms (SPEC §6); the gauges are read from `status()` when scraped.
    let metrics: DaemonMetrics
    /// Ready and executing times per operation, for the wait and run histograms (delivery thread only).
    let clock = OperationClock()
    /// `tracing.otlp` (SPEC §6): the exporter; nil: no traces. Its service runs beside the daemon's.
    let tracing: TraceExport?
    /// Each operation's ready time and attempts as the delivery thread saw them, for the job's trace.
    let timelines = TraceTimelines()
    /// What a cluster node's heartbeats say of its running jobs (`clusterProgress`), never holding a beat up.
    let progress = ProgressSampler()
}

/// The spool's durable steps. Claims made together, progress lines of one event batch and publications waiting
/// together each cost one commit, made off `work` on the committer's thread, before anything is announced.
struct Durability: Sendable {
    /// Every commit of the spool (see GroupCommit): claims, progress, publications.
    let commits: GroupCommit
    /// Progress lines written / known committed, and whether a commit is scheduled.
    let progress: ProgressMarks
    /// How long the spool has kept a step waiting (a cluster store stops renewing its lease past a bound).
    let watch: SpoolWatch
    /// Where a store that records ends elsewhere (a cluster's database) is asked to, between a publication's two
    /// commits: one round trip at a time for every batch that waits (so that `work` stages the next batches
    /// meanwhile); the placing of each batch comes back to `work`.
    let recorder: BatchingStage<Daemon.Recording>
}

/// A cluster's queue-wide limits, each with the task that renews it (both nil without a cluster).
struct ClusterLimits: Sendable {
    /// Slots of queues with clusterMaxConcurrentOperationCount.
    let permits: ClusterPermits?
    /// Start grants of queues with clusterRateLimit.
    let rates: ClusterRates?
    let tasks: [Task<Void, Never>]

    /// Ends the renewing tasks (at stop).
    func stop() async {
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
    }
}
