// ResultWriter: a job's result.plist (SPEC §5), streamed in pieces of ~64 KB so that a job of a million
// operations is never built whole in memory. Keys in sorted order, as Foundation writes them.
//
// Trusts: the engine's records to be the job's operations in plan order (extra records, if any, are not written).

import JobModel
import OperationEngine
import OperationKinds
import PropertyList

enum ResultWriter {
    /// Streams the result of `job` to `sink`; returns when its first operation started (nil if none did).
    /// `origin` and `node` are set with a cluster only (SPEC §8: `submittedOn`, `node`). `dropped`: what was removed
    /// from the job's folder before publication (EntryCheck), as `dropped = ( { path; reason; } )` when any; an
    /// output among it, or below it, is not listed in its operation's `outputs` (which name only what the entry holds).
    static func write(job: RunningJob, status: JobStatus, error: String?, records allRecords: [OperationRecord], now: Double,
                      origin: JobOrigin?, node: String?, dropped: [DroppedPath] = [],
                      to sink: (UnsafeRawBufferPointer) throws -> Void) throws -> Double? {
        let operations = job.plan?.operations ?? []
        let records = allRecords.prefix(operations.count)
        func times(_ i: Int) -> (started: Double?, finished: Double?, attempts: Int) { Self.times(records[i], of: operations[i], in: job) }
        let gone = DroppedOutputs(dropped)
        var firstStart: Double?
        for i in records.indices { if let s = times(i).started { firstStart = min(firstStart ?? s, s) } }

        var w = PlistXMLWriter()
        func drain() throws {
            if w.bytes.count >= 1 << 16 {
                try w.bytes.withUnsafeBytes { try sink($0) }
                w.bytes.removeAll(keepingCapacity: true)
            }
        }
        w.beginDictionary()
        if !dropped.isEmpty {
            w.key("dropped")
            w.beginArray()
            for d in dropped {
                w.beginDictionary()
                w.key("path"); w.string(d.path)
                w.key("reason"); w.string(d.reason)
                w.endDictionary()
            }
            w.endArray()
        }
        if let firstStart { w.key("durationSeconds"); w.real(micro(now - firstStart)) }
        if let error { w.key("error"); w.string(error) }
        w.key("finishedAt"); w.real(micro(now))
        w.key("job"); w.string(job.id)
        w.key("manifest"); w.string(job.claimed.manifestName)
        if let metadata = job.plan?.metadata { w.key("metadata"); w.value(metadata) }
        if origin != nil, let node { w.key("node"); w.string(node) }
        w.key("operations")
        w.beginArray()
        for i in records.indices {
            let op = operations[i], record = records[i]
            let (started, finished, attempts) = times(i)
            w.beginDictionary()
            w.key("attempts"); w.integer(attempts)
            if let s = started, let f = finished { w.key("durationSeconds"); w.real(micro(f - s)) }
            if let error = record.error, record.state != .succeeded { w.key("error"); w.string(error) }
            if let finished { w.key("finishedAt"); w.real(micro(finished)) }
            w.key("id"); w.string(op.id)
            w.key("kind"); w.string(op.kind.rawValue)
            w.key("outputs")
            w.beginArray()
            if record.state == .succeeded, case .write(let path, _, _) = op.parameters, !gone.contains(path) { w.string(path) }
            if case .command = op.parameters, attempts > 0 {
                for path in CommandOperation.logPaths(op.id) where !gone.contains(path) { w.string(path) }
            }
            w.endArray()
            w.key("qualityOfService"); w.string(record.qualityOfService.name)
            w.key("queue"); w.string(op.queue)
            w.key("queuePriority"); w.string(record.queuePriority.name)
            if let started { w.key("startedAt"); w.real(micro(started)) }
            w.key("state"); w.string(record.state.name)
            w.endDictionary()
            try drain()
        }
        w.endArray()
        w.key("receivedAt"); w.real(micro(job.claimed.receivedAt))
        if let requested = job.claimed.requestedJob { w.key("requestedJob"); w.string(requested) }
        if let firstStart { w.key("startedAt"); w.real(micro(firstStart)) }
        w.key("status"); w.string(status.rawValue)
        if let origin { w.key("submittedOn"); w.string(origin.submittedOn) }
        w.endDictionary()
        try w.finish().withUnsafeBytes { try sink($0) }
        return firstStart
    }
}

extension ResultWriter {
    /// When an operation started and ended, and how many attempts it took: from before a restart if it succeeded
    /// then, else from this run.
    static func times(_ record: OperationRecord, of operation: OperationPlan, in job: RunningJob)
        -> (started: Double?, finished: Double?, attempts: Int) {
        if record.state == .succeeded, let done = job.claimed.done[operation.id] {
            return (done.startedAt, done.finishedAt, done.attempts)
        }
        return (record.startedAt, record.finishedAt, record.attempts)
    }
}

/// The paths EntryCheck removed (or found to be something else than what was written), for `outputs`: an output is
/// gone when it, or a folder or link on its way, was dropped. Output paths are canonical (SPEC §3.3: relative, no
/// empty, `.` or `..` component), as are the dropped ones (a folder's with a trailing `/`, taken off here).
struct DroppedOutputs {
    private let paths: Set<Substring>

    init(_ dropped: [DroppedPath]) {
        paths = Set(dropped.lazy.filter { !$0.unchecked }.map { $0.path.hasSuffix("/") ? $0.path.dropLast() : Substring($0.path) })
    }

    func contains(_ output: String) -> Bool {
        guard !paths.isEmpty else { return false }
        if paths.contains(Substring(output)) { return true }
        var from = output.startIndex
        while let slash = output[from...].firstIndex(of: "/") {
            if paths.contains(output[..<slash]) { return true }
            from = output.index(after: slash)
        }
        return false
    }
}

/// Times in results: seconds since the epoch, to the microsecond.
func micro(_ value: Double) -> Double { (value * 1e6).rounded() / 1e6 }
