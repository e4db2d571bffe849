// The thin part: a finished job's span descriptions emitted through swift-distributed-tracing's Tracer, backed by
// swift-otel's batch processor and OTLP/HTTP exporter (not bootstrapped: the daemon's logging and metrics stay its
// own). Emitting only queues finished spans in memory; a collector that is slow, hangs or refuses delays nothing
// but the export, and what cannot be exported is dropped and counted (DropCounter).

import Dispatch
import Logging
import OTel
import ServiceLifecycle
import Synchronization
import Tracing

public final class TraceExport: Sendable {
    private let tracer: any Tracer
    /// Spans are made here, one job after another, never on the caller's queue (the daemon's `work`), and the
    /// exporter's service runs here too: all of tracing on one thread below the daemon's priority.
    private let thread: TraceThread
    /// Traces emitted and not yet made into spans, and whether their making is scheduled: made in bursts
    /// (`burst` after the first), so that the thread wakes once for many jobs, not per job. A trace is given as
    /// the closure that describes it, so that the caller only hands over what it has.
    private let pending = Mutex<(traces: [@Sendable () -> JobTrace], scheduled: Bool)>(([], false))
    private let burst: DispatchTimeInterval = .milliseconds(50)
    /// Runs the batch processor and the exporter; give it to the service group (a bounded flush when it stops).
    public let service: any Service
    /// Where spans are posted: the base URL with `/v1/traces`.
    public let endpoint: String

    /// `otlp`: the collector's base URL; `node`: the resource's `opqueued.node`; `onDropped`: spans that will never
    /// reach the collector, as swift-otel reports them; `timeoutSeconds`: how long one export may take.
    public init(otlp: String, node: String, log: Logger, flushSeconds: Double = 2, timeoutSeconds: Int = 5,
                onDropped: @escaping @Sendable (Int) -> Void) throws {
        endpoint = Self.endpoint(otlp)
        thread = TraceThread()
        var config = OTel.Configuration.default
        config.serviceName = "opqueued"
        config.resourceAttributes = ["opqueued.node": node]
        let counter = DropCounter(log: log, onDropped: onDropped)
        config.diagnosticLogger = .custom(Logger(label: "opqueued.tracing", factory: { _ in counter }))
        config.diagnosticLogLevel = .warning
        config.propagators = [.traceContext]
        config.metrics.enabled = false
        config.logs.enabled = false
        config.traces.exporter = .otlp
        config.traces.otlpExporter.endpoint = endpoint
        config.traces.otlpExporter.protocol = .httpProtobuf
        config.traces.otlpExporter.timeout = .seconds(timeoutSeconds)
        // Exported within a second of a job's end; a large job's spans wait in a bounded queue (past it: dropped).
        config.traces.batchSpanProcessor.scheduleDelay = .seconds(1)
        config.traces.batchSpanProcessor.exportTimeout = .seconds(max(10, 2 * timeoutSeconds))
        config.traces.batchSpanProcessor.maxQueueSize = 16_384
        // One batch a second (and one whenever the queue is full): large enough for a busy second's spans (default 512).
        config.traces.batchSpanProcessor.maxExportBatchSize = 4_096
        let backend = try OTel.makeTracingBackend(configuration: config)
        tracer = backend.factory
        service = BoundedFlush(inner: backend.service, seconds: flushSeconds, executor: thread)
    }

    /// `base` with `/v1/traces` appended (one slash between).
    static func endpoint(_ base: String) -> String {
        (base.hasSuffix("/") ? String(base.dropLast()) : base) + "/v1/traces"
    }

    /// Emits a finished job's trace, on the exporter's own thread: the caller goes on at once.
    public func emit(_ trace: JobTrace) {
        emit { trace }
    }

    /// Emits the trace `describe` makes, calling it on the exporter's own thread.
    public func emit(_ describe: @escaping @Sendable () -> JobTrace) {
        let schedule = pending.withLock { pending in
            pending.traces.append(describe)
            defer { pending.scheduled = true }
            return !pending.scheduled
        }
        if schedule {
            DispatchQueue.global().asyncAfter(deadline: .now() + burst) { [self] in thread.async { self.emitPending() } }
        }
    }

    /// Returns once every trace emitted so far is with the batch processor: call it before the service stops.
    public func drain() {
        thread.sync { self.emitPending() }
    }

    /// On the thread: the traces pending, in the order emitted.
    private func emitPending() {
        let traces = pending.withLock { pending in
            pending.scheduled = false
            defer { pending.traces = [] }
            return pending.traces
        }
        for describe in traces { emitNow(describe()) }
    }

    /// Every span of the trace started, linked and ended at its own instants.
    func emitNow(_ trace: JobTrace) {
        let descriptions = trace.spans()
        var root = ServiceContext.topLevel
        if let traceparent = trace.traceparent {
            tracer.extract(["traceparent": traceparent], into: &root, using: HeaderExtractor())
        }
        var spans: [any Span] = []
        spans.reserveCapacity(descriptions.count)
        for d in descriptions {
            let context = d.parent.map { spans[$0].context } ?? root
            let span = tracer.startSpan(d.name, context: context, ofKind: .internal, at: Instant(nanosecondsSinceEpoch: d.start))
            span.attributes = Self.attributes(d.attributes)
            for e in d.events {
                let instant = Instant(nanosecondsSinceEpoch: e.time)
                span.addEvent(SpanEvent(name: e.name, at: instant, attributes: Self.attributes(e.attributes)))
            }
            if let error = d.error { span.setStatus(SpanStatus(code: .error, message: error)) }
            spans.append(span)
        }
        for (d, span) in zip(descriptions, spans) {
            for link in d.links { span.addLink(SpanLink(context: spans[link].context, attributes: [:])) }
        }
        for (d, span) in zip(descriptions, spans).reversed() { span.end(at: Instant(nanosecondsSinceEpoch: d.end)) }
    }

    /// swift-distributed-tracing's attributes for ours.
    static func attributes(_ described: [String: SpanDescription.Attribute]) -> SpanAttributes {
        var attributes = SpanAttributes()
        for (key, value) in described {
            switch value {
            case .string(let s): attributes[key] = SpanAttribute.string(s)
            case .int(let i): attributes[key] = SpanAttribute.int64(Int64(i))
            }
        }
        return attributes
    }
}

/// An instant given in nanoseconds since the epoch.
struct Instant: TracerInstant {
    var nanosecondsSinceEpoch: UInt64
    static func < (lhs: Self, rhs: Self) -> Bool { lhs.nanosecondsSinceEpoch < rhs.nanosecondsSinceEpoch }
}

/// Reads a W3C `traceparent` from a dictionary (the manifest's value).
struct HeaderExtractor: Extractor {
    func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}

/// The exporter's service, stopped within `seconds` of a graceful shutdown: the last spans get one bounded try,
/// a collector that hangs does not hold the daemon's stop.
struct BoundedFlush: Service {
    let inner: any Service
    let seconds: Double
    let executor: TraceThread

    func run() async throws {
        await withTaskExecutorPreference(executor) { await runBounded() }
    }

    private func runBounded() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await inner.run() }
            group.addTask {
                try? await gracefulShutdown()
                try? await Task.sleep(for: .seconds(seconds))
            }
            await group.next()
            group.cancelAll()
        }
    }
}
