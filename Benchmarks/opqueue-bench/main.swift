// opqueue-bench: measures the operation engine against Foundation's OperationQueue, in the same run.
//
//   swift run -c release opqueue-bench engine [--sizes 1000,8000,100000,1000000] [--workloads chain,...]
//
//   [--engines opqueued,observed,foundation]   (observed: with an observer taking every transition, as in the daemon)
//
// Each (engine, workload, size) runs in a child process of its own, so its peak RSS is its own. Our engine's
// lines also give how long `submit` took and the longest a reader of the engine (what `status` asks) waited.
// Foundation runs a size only when the trend of its smaller sizes says it would finish within 60 s.

import Daemon
import Foundation
import OperationEngine
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

enum Workload: String, CaseIterable {
    case independent, serial, chain, fanout, layered
}

/// The dependencies of operation i in each workload (by number).
func dependencies(_ workload: Workload, _ i: Int, _ n: Int, _ rng: inout SplitMix) -> [Int] {
    switch workload {
    case .independent, .serial: return []
    case .chain: return i == 0 ? [] : [i - 1]
    case .fanout:
        if i == 0 { return [] }
        if i == n - 1 { return Array(1..<(n - 1)) }
        return [0]
    case .layered:
        let width = 64
        let layer = i / width
        if layer == 0 { return [] }
        let start = (layer - 1) * width
        let a = start + Int(rng.next() % UInt64(width))
        var b = start + Int(rng.next() % UInt64(width))
        if b == a { b = start + (a - start + 1) % width }
        return [a, b]
    }
}

func peakRSSMegabytes() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_maxrss) / 1024
}

func now() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// Reads the engine the way `opqueuectl status` does, every millisecond, from its own thread, and keeps
/// the longest wait: how long a status request can be held up by a submission or the work after it.
final class LockProbe: @unchecked Sendable {
    private let lock = NSLock()
    private var running = true
    private var longest = 0.0
    private let done = DispatchSemaphore(value: 0)

    init(_ engine: Engine) {
        Thread.detachNewThread { [self] in
            while lock.withLock({ running }) {
                let start = now()
                _ = engine.executingCount
                _ = engine.queues()
                let waited = now() - start
                lock.withLock { longest = max(longest, waited) }
                usleep(1000)
            }
            done.signal()
        }
    }

    /// Stops the probe; the longest wait in milliseconds.
    func stop() -> Double {
        lock.withLock { running = false }
        done.wait()
        return lock.withLock { longest } * 1000
    }
}

struct EngineRun {
    var seconds: Double
    /// How long `submit` took, and the longest a status-like reader waited (ms).
    var submitMilliseconds: Double
    var readerMaxWaitMilliseconds: Double
}

/// `observed`: with an observer taking every transition, as the daemon runs it.
func runOpqueued(_ workload: Workload, _ n: Int, observed: Bool = false) -> EngineRun {
    let engine = observed ? Engine(observer: { _ in }) : Engine()
    let probe = LockProbe(engine)
    let queue = engine.addQueue(named: "bench", maxConcurrentOperationCount: workload == .serial ? 1 : -1)
    var rng = SplitMix(state: 42)
    let start = now()
    var graph = GraphBuilder()
    graph.reserveCapacity(operations: n, dependencies: workload == .layered ? 2 * n : n)
    let body = OperationBody.sync { _ in nil }
    for i in 0..<n {
        graph.add(OperationSpec(name: "", queue: queue, body: body), dependencies: dependencies(workload, i, n, &rng))
    }
    let submitted: Double
    do {
        let submitStart = now()
        let group = try engine.submit(graph)
        submitted = now() - submitStart
        engine.wait(group)
    } catch {
        fatalError("benchmark graph refused: \(error)")
    }
    let seconds = now() - start
    let waited = probe.stop()
    engine.shutdown()
    return EngineRun(seconds: seconds, submitMilliseconds: submitted * 1000, readerMaxWaitMilliseconds: waited)
}

func runFoundation(_ workload: Workload, _ n: Int) -> Double {
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = workload == .serial ? 1 : ProcessInfo.processInfo.activeProcessorCount
    var rng = SplitMix(state: 42)
    let start = now()
    var operations: [BlockOperation] = []
    operations.reserveCapacity(n)
    for i in 0..<n {
        let operation = BlockOperation {}
        for d in dependencies(workload, i, n, &rng) { operation.addDependency(operations[d]) }
        operations.append(operation)
    }
    // As application code does it (the ClassicPhotos seeds among them): one addOperation per operation.
    for operation in operations { queue.addOperation(operation) }
    queue.waitUntilAllOperationsAreFinished()
    return now() - start
}

/// Runs one measurement in a child process and returns its output line.
func child(_ engine: String, _ workload: Workload, _ n: Int) -> String? {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
                                ?? CommandLine.arguments[0])
    process.arguments = ["one", engine, workload.rawValue, String(n)]
    let pipe = Pipe()
    process.standardOutput = pipe
    do { try process.run() } catch { return nil }
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else { return nil }
    return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
}

/// One result line, written at once (stdout may be a file or a pipe).
func emit(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func seconds(of line: String) -> Double? {
    line.split(separator: " ").first { $0.hasPrefix("seconds=") }.flatMap { Double($0.dropFirst(8)) }
}

let arguments = CommandLine.arguments.dropFirst()
switch arguments.first {
case "one":
    let parts = Array(arguments.dropFirst())
    guard parts.count == 3, let workload = Workload(rawValue: parts[1]), let n = Int(parts[2]) else { exit(64) }
    var seconds: Double
    var extra = ""
    if parts[0] == "foundation" {
        seconds = runFoundation(workload, n)
    } else {
        let run = runOpqueued(workload, n, observed: parts[0] == "observed")
        seconds = run.seconds
        extra = String(format: " submit_ms=%.1f reader_max_wait_ms=%.1f", run.submitMilliseconds, run.readerMaxWaitMilliseconds)
    }
    print(String(format: "engine=%@ workload=%@ ops=%d seconds=%.3f ops_per_second=%.0f peak_rss_mb=%.0f",
                 parts[0], workload.rawValue, n, seconds, Double(n) / seconds, peakRSSMegabytes()) + extra)
case "engine":
    var sizes = [1_000, 8_000, 100_000, 1_000_000]
    var workloads = Workload.allCases
    var engines = ["opqueued", "foundation"]
    var rest = Array(arguments.dropFirst())
    while !rest.isEmpty {
        let flag = rest.removeFirst()
        let value = rest.isEmpty ? "" : rest.removeFirst()
        switch flag {
        case "--sizes": sizes = value.split(separator: ",").compactMap { Int($0) }
        case "--workloads": workloads = value.split(separator: ",").compactMap { Workload(rawValue: String($0)) }
        case "--engines": engines = value.split(separator: ",").map(String.init)
        default: FileHandle.standardError.write(Data("unknown flag \(flag)\n".utf8)); exit(64)
        }
    }
    var results: [String: Double] = [:]
    for workload in workloads {
        for engine in engines {
            var previous: (n: Int, seconds: Double)?
            var beforePrevious: (n: Int, seconds: Double)?
            for n in sizes {
                if engine == "foundation", let p = previous {
                    var exponent = 2.0
                    if let b = beforePrevious, b.seconds > 0.01 {
                        exponent = max(1, log(p.seconds / b.seconds) / log(Double(p.n) / Double(b.n)))
                    }
                    let estimate = p.seconds * pow(Double(n) / Double(p.n), exponent)
                    if estimate > 60 {
                        emit(String(format: "engine=foundation workload=%@ ops=%d skipped estimate_seconds=%.0f",
                                    workload.rawValue, n, estimate))
                        continue
                    }
                }
                guard let line = child(engine, workload, n), let s = seconds(of: line) else {
                    emit("engine=\(engine) workload=\(workload.rawValue) ops=\(n) failed (crashed or timed out)")
                    continue
                }
                emit(line)
                results["\(engine)/\(workload.rawValue)/\(n)"] = s
                beforePrevious = previous
                previous = (n, s)
            }
        }
        for n in sizes {
            if let a = results["opqueued/\(workload.rawValue)/\(n)"], let b = results["foundation/\(workload.rawValue)/\(n)"] {
                emit(String(format: "ratio workload=%@ ops=%d foundation_over_opqueued=%.1f", workload.rawValue, n, b / a))
            }
        }
        if let big = results["opqueued/\(workload.rawValue)/1000000"], let small = results["opqueued/\(workload.rawValue)/100000"] {
            emit(String(format: "scaling workload=%@ time_1M_over_100k=%.1f", workload.rawValue, big / small))
        }
    }
case "spool":
    SpoolBench.run(Array(arguments.dropFirst()))
case "outbox":
    OutboxBench.run(Array(arguments.dropFirst()))
case "control":
    ControlBench.run(Array(arguments.dropFirst()))
case "store":
    StoreBench.run(Array(arguments.dropFirst()))
case "commands":
    CommandBench.run(Array(arguments.dropFirst()))
case "images":
    do {
        try ImageBench.run(Array(arguments.dropFirst()))
    } catch {
        FileHandle.standardError.write(Data("images: \(error)\n".utf8)); exit(1)
    }
case "samples":
    // The walk-through's sample photos (spool/examples/images), made once and committed.
    guard let folder = arguments.dropFirst().first else { exit(64) }
    do {
        for (i, name) in ["harbour", "meadow", "dusk"].enumerated() {
            let image = try ImageBench.photo(width: 640, height: 360, seed: UInt64(1000 + i))
            try Codecs.encode(image, format: "jpeg", quality: 85).write(to: URL(fileURLWithPath: "\(folder)/\(name).jpg"))
        }
    } catch { FileHandle.standardError.write(Data("samples: \(error)\n".utf8)); exit(1) }
case "corpus":
    let rest = Array(arguments.dropFirst())
    guard let folder = rest.first else { exit(64) }
    let count = rest.firstIndex(of: "--count").flatMap { $0 + 1 < rest.count ? Int(rest[$0 + 1]) : nil } ?? 200
    do { try ImageBench.corpus(folder, count: count) } catch { FileHandle.standardError.write(Data("corpus: \(error)\n".utf8)); exit(1) }
default:
    print("""
    usage: opqueue-bench engine [--sizes N,…] [--workloads independent,serial,chain,fanout,layered] [--engines opqueued,foundation]
           opqueue-bench spool [N] [--rounds R]
           opqueue-bench outbox [N]
           opqueue-bench control [--samples N]
           opqueue-bench images [--count N]
           opqueue-bench commands [N] [--rounds R]
           opqueue-bench store --database URL [--password-file F] [--jobs N] [--workers W] [--batch B]
           opqueue-bench corpus FOLDER [--count N]
    """)
    exit(64)
}
