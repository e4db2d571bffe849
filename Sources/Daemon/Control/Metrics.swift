// The daemon's metrics (SPEC §6), in the Prometheus text format.
//
// Events are recorded through swift-metrics (CoreMetrics' Counter and Timer) into one swift-prometheus
// collector registry per daemon, with a factory that gives every family its HELP text and its histogram
// buckets. Counters and histograms move where events already flow (the engine's transitions, claims,
// publications, downloads); the queue and spool gauges are set on the registry at scrape time from the
// engine's overview and the daemon's status, so they cost nothing between scrapes, and one a scrape no
// longer sets (a queue removed) leaves the exposition.
// What it trusts: label values are queue names (checked identifiers, from the configuration), kinds
// and states (fixed spellings); nothing a manifest says becomes a label.

import CoreMetrics
import Foundation
import JobModel
import OperationEngine
import OperationKinds
import Prometheus
import Synchronization

public final class DaemonMetrics: Sendable, DownloadMetrics {
    public let registry = PrometheusCollectorRegistry()
    private let factory: Factory
    /// Every counter and histogram made so far, by family and labels: an event looks its series up here instead
    /// of asking the registry, which checks the name, the labels, the help text and the buckets each time
    /// (five times per trivial job, about a percent of a node's CPU).
    private let series = Mutex<[SeriesKey: AnyObject]>([:])

    /// The gauges the last scrape set, read from the status at scrape time: one the next scrape no longer sets (a
    /// queue a reload removed, a cluster limit taken away) is unregistered, so that it leaves the exposition instead
    /// of showing its last value for as long as the daemon runs. Held across a whole scrape (scrapes are rare).
    private let scraped = Mutex<[SeriesKey: Prometheus.Gauge]>([:])

    private struct SeriesKey: Hashable {
        let name: String
        let labels: [String]
    }

    /// Every family: name → (help, histogram buckets in seconds). The manual lists the same.
    static let families: [String: (help: String, buckets: [Double]?)] = [
        "opqueued_queue_pending": ("Operations of the queue not yet executing (pending, ready or waiting to retry).", nil),
        "opqueued_queue_executing": ("Operations of the queue executing now.", nil),
        "opqueued_queue_limit": ("The queue's maxConcurrentOperationCount in effect (-1 resolved to the CPU count).", nil),
        "opqueued_queue_suspended": ("1 if the queue is suspended, else 0.", nil),
        "opqueued_operations_total": ("Operations ended, by kind, queue and final state.", nil),
        "opqueued_jobs_total": ("Jobs published to the outbox, by status.", nil),
        "opqueued_inbox_files": ("Manifests waiting in the inbox at the last scan, "
                                 + "with those a cluster node holds until the database takes them.", nil),
        "opqueued_active_jobs": ("Jobs claimed and not yet published.", nil),
        "opqueued_active_operations": ("Operations of the active jobs (claiming pauses at maxActiveOperations).", nil),
        "opqueued_claiming_paused": ("1 while a spool fault (disk full, no descriptors, read-only) pauses claiming.", nil),
        "opqueued_pickup_seconds": ("From a manifest's last change in the inbox (closed after writing, or renamed in) to its claim.",
                                    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]),
        "opqueued_operation_wait_seconds": ("From an operation becoming ready to its executing, per attempt.",
                                            [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600]),
        "opqueued_operation_run_seconds": ("One attempt's run time, from executing to its end.",
                                           [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600]),
        "opqueued_download_bytes_total": ("Bytes downloaded by download operations (http, https and file URLs).", nil),
        "opqueued_download_errors_total": ("Download attempts that failed (not counting cancellations).", nil),
        "opqueued_cluster_connected": ("1 while this cluster node reaches the database, else 0.", nil),
        "opqueued_cluster_nodes_connected": ("Nodes of the cluster that beat within their lease, as of this node's last look.", nil),
        "opqueued_cluster_slots_held": ("Slots of the queue's clusterMaxConcurrentOperationCount this node holds "
                                        + "(as many of its operations may execute here).", nil),
        "opqueued_cluster_slot_waiting": ("1 while this node's wait for more of the queue's cluster slots "
                                          + "is recorded in the database, else 0.", nil),
        "opqueued_cluster_wakeups_arriving": ("1 while the database's wake-ups (LISTEN/NOTIFY) reach this node; "
                                              + "0 once its probes went unheard.", nil),
        "opqueued_trace_spans_dropped_total": ("Spans of jobs' traces (tracing.otlp) that never reached the collector: "
                                               + "refused, timed out or over the exporter's queue.", nil),
    ]

    public init() {
        factory = Factory(registry: registry)
        // Families that must show before their first event (a dashboard's rate() needs the zero).
        for status in JobStatus.allCases.map(\.rawValue) {
            counter("opqueued_jobs_total", [("status", status)]).increment(by: 0)
        }
        counter("opqueued_download_bytes_total").increment(by: 0)
        counter("opqueued_download_errors_total").increment(by: 0)
        counter("opqueued_trace_spans_dropped_total").increment(by: 0)
        _ = CoreMetrics.Timer(label: "opqueued_pickup_seconds", dimensions: [], factory: factory)
    }

    /// The series of family `name` with `labels` (made on first use).
    private func cached<M: AnyObject>(_ name: String, _ labels: [(String, String)], make: () -> M) -> M {
        let key = SeriesKey(name: name, labels: labels.flatMap { [$0.0, $0.1] })
        return series.withLock { series in
            if let made = series[key] as? M { return made }
            let made = make()
            series[key] = made
            return made
        }
    }

    private func counter(_ name: String, _ labels: [(String, String)] = []) -> CoreMetrics.Counter {
        cached(name, labels) { CoreMetrics.Counter(label: name, dimensions: labels, factory: factory) }
    }

    private func observe(_ name: String, _ labels: [(String, String)], seconds: Double) {
        cached(name, labels) { CoreMetrics.Timer(label: name, dimensions: labels, factory: factory) }.recordSeconds(max(0, seconds))
    }

    // MARK: Events

    func operationEnded(kind: String, queue: String, state: String) {
        counter("opqueued_operations_total", [("kind", kind), ("queue", queue), ("state", state)]).increment()
    }

    func jobEnded(status: JobStatus) { counter("opqueued_jobs_total", [("status", status.rawValue)]).increment() }

    func pickedUp(after seconds: Double) { observe("opqueued_pickup_seconds", [], seconds: seconds) }

    func waited(queue: String, seconds: Double) { observe("opqueued_operation_wait_seconds", [("queue", queue)], seconds: seconds) }

    func ran(kind: String, seconds: Double) { observe("opqueued_operation_run_seconds", [("kind", kind)], seconds: seconds) }

    package func downloaded(bytes: Int) { counter("opqueued_download_bytes_total").increment(by: bytes) }

    package func downloadFailed() { counter("opqueued_download_errors_total").increment() }

    func traceSpansDropped(_ count: Int) { counter("opqueued_trace_spans_dropped_total").increment(by: count) }

    // MARK: Scrape

    /// The text exposition (Prometheus 0.0.4), with the gauges read now.
    public func text(_ status: Daemon.Status, cluster: ClusterSnapshot? = nil, processorCount: Int) -> String {
        scraped.withLock { previous in
            var set: [SeriesKey: Prometheus.Gauge] = [:]
            func gauge(_ name: String, _ labels: [(String, String)], _ value: Double) {
                let key = SeriesKey(name: name, labels: labels.flatMap { [$0.0, $0.1] })
                let made = previous[key] ?? registry.makeGauge(
                    descriptor: MetricNameDescriptor(metricName: name, unitName: "", helpText: Self.families[name]?.help ?? ""),
                    labels: labels)
                made.set(value)
                set[key] = made
            }
            for q in status.queues {
                let label = [("queue", q.name)]
                gauge("opqueued_queue_pending", label, Double(q.pending))
                gauge("opqueued_queue_executing", label, Double(q.executing))
                gauge("opqueued_queue_limit", label,
                      Double(q.maxConcurrentOperationCount < 0 ? processorCount : q.maxConcurrentOperationCount))
                gauge("opqueued_queue_suspended", label, q.isSuspended ? 1 : 0)
            }
            gauge("opqueued_inbox_files", [], Double(status.waiting))
            gauge("opqueued_active_jobs", [], Double(status.activeJobs.count + status.parked))
            gauge("opqueued_active_operations", [], Double(status.operations))
            gauge("opqueued_claiming_paused", [], status.fault == nil ? 0 : 1)
            // Only on a cluster node (SPEC §8): what an alert on a node or the database going away needs.
            if let cluster {
                gauge("opqueued_cluster_connected", [], cluster.connected ? 1 : 0)
                gauge("opqueued_cluster_nodes_connected", [], Double(cluster.nodes.filter(\.connected).count))
                gauge("opqueued_cluster_wakeups_arriving", [], cluster.wakeupsArrive ? 1 : 0)
            }
            for (name, slots) in status.clusterSlots {
                gauge("opqueued_cluster_slots_held", [("queue", name)], Double(slots.held))
                gauge("opqueued_cluster_slot_waiting", [("queue", name)], slots.waitingAt == nil ? 0 : 1)
            }
            for (key, gone) in previous where set[key] == nil { registry.unregisterGauge(gone) }
            previous = set
            return registry.emitToString()
        }
    }

    /// CoreMetrics' factory over the registry: every family with its HELP text and buckets.
    struct Factory: CoreMetrics.MetricsFactory {
        let registry: PrometheusCollectorRegistry

        private func descriptor(_ label: String) -> MetricNameDescriptor {
            MetricNameDescriptor(metricName: label, unitName: "", helpText: DaemonMetrics.families[label]?.help ?? "")
        }

        func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
            registry.makeCounter(descriptor: descriptor(label), labels: dimensions)
        }

        func makeFloatingPointCounter(label: String, dimensions: [(String, String)]) -> any FloatingPointCounterHandler {
            registry.makeCounter(descriptor: descriptor(label), labels: dimensions)
        }

        func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
            guard aggregate else { return registry.makeGauge(descriptor: descriptor(label), labels: dimensions) }
            return registry.makeValueHistogram(descriptor: descriptor(label), labels: dimensions,
                                               buckets: DaemonMetrics.families[label]?.buckets ?? [1])
        }

        func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
            registry.makeGauge(descriptor: descriptor(label), labels: dimensions)
        }

        func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
            let buckets = (DaemonMetrics.families[label]?.buckets ?? [1]).map { Duration.nanoseconds(Int64(($0 * 1e9).rounded())) }
            return registry.makeDurationHistogram(descriptor: descriptor(label), labels: dimensions, buckets: buckets)
        }

        // The daemon's series live as long as the daemon: nothing is ever destroyed.
        func destroyCounter(_ handler: any CounterHandler) {}
        func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) {}
        func destroyRecorder(_ handler: any RecorderHandler) {}
        func destroyMeter(_ handler: any MeterHandler) {}
        func destroyTimer(_ handler: any TimerHandler) {}
    }
}

/// When each operation became ready, then started executing (per attempt), for the wait and run
/// histograms. Only the engine's delivery thread touches it (`Daemon.deliver`), so it needs no lock.
/// An entry lives from `ready` to the operation's end: at most the operations ready or executing now.
final class OperationClock: @unchecked Sendable {
    struct Mark { let time: Double; let executing: Bool }
    private struct Key: Hashable { let group: GroupID; let operation: Int }
    private var marks: [Key: Mark] = [:]

    /// Records the operation's new mark and returns its previous one, if any.
    func mark(_ group: GroupID, _ operation: Int, at time: Double, executing: Bool) -> Mark? {
        marks.updateValue(Mark(time: time, executing: executing), forKey: Key(group: group, operation: operation))
    }

    /// Forgets the operation's mark (its attempt ended) and returns it.
    func end(_ group: GroupID, _ operation: Int) -> Mark? {
        marks.removeValue(forKey: Key(group: group, operation: operation))
    }
}
