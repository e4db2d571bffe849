// opqueue-bench engine: no-op operations in five shapes, run by our engine, by libdispatch (the floor: the same
// closures with no scheduler on top) and by Foundation's OperationQueue, in the same run.
//
//   opqueue-bench engine [--sizes 1000,8000,100000,1000000] [--workloads chain,...] [--runs 3]
//                        [--engines opqueued,dispatch,foundation]   (observed: our engine with an observer, as in the daemon)
//
// Each (engine, workload, size, run) runs in a child process of its own, so its peak RSS is its own; the engines and
// the sizes take turns within each round, so a load that comes and goes on the machine touches them alike. Lines give
// every run, then the medians, the ratio to the floor and how time grows from 100k to 1M. Each run also gives the CPU time
// its process used (all threads, user and system): on a machine loaded by others, the wall-clock time measures the
// kernel's scheduler as much as the engine, and the CPU ratio is the steadier comparison. Our engine's lines also
// give how long building the graph and `submit` took and the longest a reader of the engine (what `status` asks) waited.
// Foundation runs each size once, and only when the trend of its smaller sizes says it would finish within 60 s.

import Dispatch
import Foundation
import OperationEngine
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

enum Workload: String, CaseIterable {
    case independent, serial, chain, fanout, layered
}

/// The dependencies of operation i in each workload (by number), into `deps` (emptied first): one buffer for the
/// whole graph, so that building it measures the engine, not an array per operation.
func dependencies(_ workload: Workload, _ i: Int, _ n: Int, _ rng: inout SplitMix, into deps: inout [Int]) {
    if !deps.isEmpty { deps.removeAll(keepingCapacity: true) }
    switch workload {
    case .independent, .serial: return
    case .chain: if i > 0 { deps.append(i - 1) }
    case .fanout:
        if i == 0 { return }
        if i == n - 1 { deps.append(contentsOf: 1..<(n - 1)) } else { deps.append(0) }
    case .layered:
        let width = 64
        let layer = i / width
        if layer == 0 { return }
        let start = (layer - 1) * width
        let a = start + Int(rng.next() % UInt64(width))
        var b = start + Int(rng.next() % UInt64(width))
        if b == a { b = start + (a - start + 1) % width }
        deps.append(a)
        deps.append(b)
    }
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
    /// How long building the graph took (ms), before `submit`.
    var buildMilliseconds: Double
    /// How often a worker shed and a governed class was released (Governor.swift).
    var sheds = 0
    var releases = 0
}

/// `observed`: with an observer taking every transition, as the daemon runs it.
func runOpqueued(_ workload: Workload, _ n: Int, observed: Bool = false) -> EngineRun {
    let engine = observed ? Engine(observer: { _ in }) : Engine()
    let probe = LockProbe(engine)
    let queue = engine.addQueue(named: "bench", maxConcurrentOperationCount: workload == .serial ? 1 : -1)
    var rng = SplitMix(state: 42)
    var deps: [Int] = []
    let start = now()
    var graph = GraphBuilder()
    graph.reserveCapacity(operations: n, dependencies: workload == .layered ? 2 * n : n)
    let body = OperationBody.sync { _ in nil }
    for i in 0..<n {
        dependencies(workload, i, n, &rng, into: &deps)
        graph.add(OperationSpec(name: "", queue: queue, body: body), dependencies: deps)
    }
    let submitted: Double
    let built = now() - start
    do {
        let submitStart = now()
        // Handed over (`consume`): a builder the caller still holds would make the engine copy its arrays.
        let group = try engine.submit(consume graph)
        submitted = now() - submitStart
        engine.wait(group)
    } catch {
        fatalError("benchmark graph refused: \(error)")
    }
    let seconds = now() - start
    let waited = probe.stop()
    let governor = engine.governorCounts
    engine.shutdown()
    return EngineRun(seconds: seconds, submitMilliseconds: submitted * 1000, readerMaxWaitMilliseconds: waited,
                     buildMilliseconds: built * 1000, sheds: governor.sheds, releases: governor.releases)
}

func runFoundation(_ workload: Workload, _ n: Int) -> Double {
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = workload == .serial ? 1 : ProcessInfo.processInfo.activeProcessorCount
    var rng = SplitMix(state: 42)
    var deps: [Int] = []
    let start = now()
    var operations: [BlockOperation] = []
    operations.reserveCapacity(n)
    for i in 0..<n {
        let operation = BlockOperation {}
        dependencies(workload, i, n, &rng, into: &deps)
        for d in deps { operation.addDependency(operations[d]) }
        operations.append(operation)
    }
    // As application code does it (the ClassicPhotos seeds among them): one addOperation per operation.
    for operation in operations { queue.addOperation(operation) }
    queue.waitUntilAllOperationsAreFinished()
    return now() - start
}

/// libdispatch running the same no-op closures in the same shape with no scheduler on top: the floor.
/// independent: a concurrent queue and a group; serial: a serial queue and a group; chain: each block schedules the
/// next; fanout: the first block, the middle ones in a group, the last on its notify; layered: a group per layer of
/// 64 whose notify dispatches the next layer (each block waits for its whole previous layer, not just two of it).
func runDispatch(_ workload: Workload, _ n: Int) -> Double {
    let body: @Sendable () -> Void = {}
    let start = now()
    let concurrent = DispatchQueue(label: "bench.concurrent", attributes: .concurrent)
    switch workload {
    case .independent, .serial:
        let queue = workload == .serial ? DispatchQueue(label: "bench.serial") : concurrent
        let group = DispatchGroup()
        for _ in 0..<n { queue.async(group: group, execute: body) }
        group.wait()
    case .chain:
        DispatchChain(queue: concurrent, n: n, body: body).run()
    case .fanout:
        let done = DispatchSemaphore(value: 0)
        concurrent.async {
            body()
            let group = DispatchGroup()
            for _ in 0..<max(0, n - 2) { concurrent.async(group: group, execute: body) }
            group.notify(queue: concurrent) {
                if n > 1 { body() }
                done.signal()
            }
        }
        done.wait()
    case .layered:
        DispatchLayers(queue: concurrent, n: n, width: 64, body: body).run()
    }
    return now() - start
}

/// A chain on libdispatch: each block runs the body, then dispatches the next.
private final class DispatchChain: Sendable {
    let queue: DispatchQueue
    let n: Int
    let body: @Sendable () -> Void
    let done = DispatchSemaphore(value: 0)

    init(queue: DispatchQueue, n: Int, body: @escaping @Sendable () -> Void) {
        (self.queue, self.n, self.body) = (queue, n, body)
    }

    func run() {
        queue.async { self.step(0) }
        done.wait()
    }

    private func step(_ i: Int) {
        body()
        if i + 1 < n { queue.async { self.step(i + 1) } } else { done.signal() }
    }
}

/// Layers on libdispatch: a layer's blocks in a group, whose notify dispatches the next layer.
private final class DispatchLayers: Sendable {
    let queue: DispatchQueue
    let n: Int
    let width: Int
    let body: @Sendable () -> Void
    let done = DispatchSemaphore(value: 0)

    init(queue: DispatchQueue, n: Int, width: Int, body: @escaping @Sendable () -> Void) {
        (self.queue, self.n, self.width, self.body) = (queue, n, width, body)
    }

    func run() {
        layer(from: 0)
        done.wait()
    }

    private func layer(from start: Int) {
        guard start < n else { done.signal(); return }
        let end = min(start + width, n)
        let group = DispatchGroup()
        for _ in start..<end { queue.async(group: group, execute: body) }
        group.notify(queue: queue) { self.layer(from: end) }
    }
}

enum EngineBench {
    /// In a child: one measurement, one line.
    static func one(_ parts: [String]) {
        guard parts.count == 3, let workload = Workload(rawValue: parts[1]), let n = Int(parts[2]), n > 0 else { exit(64) }
        var seconds: Double
        var extra = ""
        let cpuStart = cpuSeconds()
        switch parts[0] {
        case "foundation": seconds = runFoundation(workload, n)
        case "dispatch": seconds = runDispatch(workload, n)
        case "opqueued", "observed":
            let run = runOpqueued(workload, n, observed: parts[0] == "observed")
            seconds = run.seconds
            extra = String(format: " build_ms=%.1f submit_ms=%.1f reader_max_wait_ms=%.1f sheds=%d releases=%d", run.buildMilliseconds,
                           run.submitMilliseconds, run.readerMaxWaitMilliseconds, run.sheds, run.releases)
        default: exit(64)
        }
        let cpu = cpuSeconds() - cpuStart
        print(String(format: "engine=%@ workload=%@ ops=%d seconds=%.3f cpu_seconds=%.3f ops_per_second=%.0f peak_rss_mb=%.0f",
                     parts[0], workload.rawValue, n, seconds, cpu, Double(n) / seconds, peakRSSMegabytes()) + extra)
    }

    struct Options {
        var sizes = [1_000, 8_000, 100_000, 1_000_000]
        var workloads = Workload.allCases
        var engines = ["opqueued", "dispatch", "foundation"]
        var runs = 3
    }

    static func options(_ arguments: [String]) -> Options {
        var options = Options()
        var rest = arguments
        while !rest.isEmpty {
            let flag = rest.removeFirst()
            let value = rest.isEmpty ? "" : rest.removeFirst()
            switch flag {
            case "--sizes": options.sizes = value.split(separator: ",").compactMap { Int($0) }.filter { $0 > 0 }
            case "--workloads": options.workloads = value.split(separator: ",").compactMap { Workload(rawValue: String($0)) }
            case "--engines": options.engines = value.split(separator: ",").map(String.init)
            case "--runs": options.runs = max(1, Int(value) ?? 0)
            default: FileHandle.standardError.write(Data("engine: unknown flag \(flag)\n".utf8)); exit(64)
            }
        }
        if let unknown = options.engines.first(where: { !["opqueued", "observed", "dispatch", "foundation"].contains($0) }) {
            FileHandle.standardError.write(Data("engine: unknown engine \(unknown) (opqueued, observed, dispatch, foundation)\n".utf8))
            exit(64)
        }
        return options
    }

    /// The median of each engine's runs: seconds and peak RSS.
    struct Median {
        var seconds: Double
        var cpuSeconds: Double
        var rssMegabytes: Double
    }

    static func run(_ arguments: [String]) {
        let options = options(arguments)
        var summary: [String] = []
        for workload in options.workloads {
            var medians: [String: [Int: Median]] = [:]
            var lines: [Int: [String: [String]]] = [:]
            // Sizes take turns within each round, as engines do: a load that comes or goes during the benchmark touches
            // every size alike, so the 1M ÷ 100k figure compares runs made at the same times, not two blocks apart.
            for round in 0..<options.runs {
                for n in options.sizes {
                    // Foundation, an anchor far slower than the others (a million operations in layers take it most
                    // of a minute), runs once per size, in the first round, when its smaller sizes say it finishes.
                    let engines = options.engines.filter {
                        $0 != "foundation" || (round == 0 && foundationFinishes(n, medians["foundation"] ?? [:], workload))
                    }
                    for engine in engines {
                        guard let line = child(engine, workload, n), field("seconds", of: line) != nil else {
                            emit("engine=\(engine) workload=\(workload.rawValue) ops=\(n) failed (crashed or timed out)")
                            continue
                        }
                        emit(line)
                        lines[n, default: [:]][engine, default: []].append(line)
                        if engine == "foundation" { medians[engine, default: [:]][n] = summarized([line]) }
                    }
                }
            }
            for n in options.sizes {
                for (engine, runs) in lines[n] ?? [:] { medians[engine, default: [:]][n] = summarized(runs) }
                let engines = options.engines.filter { medians[$0]?[n] != nil }
                emit(medianLine(workload, n, medians, engines: engines, runs: options.runs))
            }
            if let line = summaryLine(workload, medians, sizes: options.sizes, engines: options.engines) { summary.append(line) }
        }
        for line in summary { emit(line) }
    }

    /// The median of runs' result lines: seconds, CPU seconds and peak RSS, each on its own.
    static func summarized(_ runs: [String]) -> Median {
        Median(seconds: median(runs.compactMap { field("seconds", of: $0) }),
               cpuSeconds: median(runs.compactMap { field("cpu_seconds", of: $0) }),
               rssMegabytes: median(runs.compactMap { field("peak_rss_mb", of: $0) }))
    }

    /// Whether Foundation's trend over its smaller sizes says it would finish `n` within 60 s.
    static func foundationFinishes(_ n: Int, _ measured: [Int: Median], _ workload: Workload) -> Bool {
        let done = measured.keys.filter { $0 < n }.sorted()
        guard let p = done.last, let previous = measured[p] else { return true }
        var exponent = 2.0
        if done.count >= 2, let b = measured[done[done.count - 2]], b.seconds > 0.01 {
            exponent = max(1, log(previous.seconds / b.seconds) / log(Double(p) / Double(done[done.count - 2])))
        }
        let estimate = previous.seconds * pow(Double(n) / Double(p), exponent)
        guard estimate <= 60 else {
            emit(String(format: "engine=foundation workload=%@ ops=%d skipped estimate_seconds=%.0f", workload.rawValue, n, estimate))
            return false
        }
        return true
    }

    static func medianLine(_ workload: Workload, _ n: Int, _ medians: [String: [Int: Median]], engines: [String], runs: Int) -> String {
        var line = "median workload=\(workload.rawValue) ops=\(n) runs=\(runs)"
        for engine in engines {
            guard let m = medians[engine]?[n] else { continue }
            line += String(format: " %@_seconds=%.3f %@_cpu_seconds=%.3f %@_rss_mb=%.0f", engine, m.seconds, engine, m.cpuSeconds,
                           engine, m.rssMegabytes)
        }
        if let floor = medians["dispatch"]?[n], floor.seconds > 0, floor.cpuSeconds > 0 {
            for engine in engines where engine != "dispatch" {
                guard let m = medians[engine]?[n] else { continue }
                line += String(format: " %@_over_dispatch=%.2f %@_cpu_over_dispatch=%.2f", engine, m.seconds / floor.seconds,
                               engine, m.cpuSeconds / floor.cpuSeconds)
            }
        }
        return line
    }

    /// At the largest size: each engine's median time and peak RSS, its ratio to the floor, and how its time grew from
    /// 100k to 1M (linear is 10), in wall-clock and in CPU time.
    static func summaryLine(_ workload: Workload, _ medians: [String: [Int: Median]], sizes: [Int], engines: [String]) -> String? {
        guard let n = sizes.max(), engines.contains(where: { medians[$0]?[n] != nil }) else { return nil }
        var line = "summary workload=\(workload.rawValue) ops=\(n)"
        let floor = medians["dispatch"]?[n]
        for engine in engines {
            guard let m = medians[engine]?[n] else { continue }
            line += String(format: " %@_seconds=%.3f %@_cpu_seconds=%.3f", engine, m.seconds, engine, m.cpuSeconds)
            if engine != "dispatch", let floor, floor.seconds > 0, floor.cpuSeconds > 0 {
                line += String(format: " %@_over_dispatch=%.2f %@_cpu_over_dispatch=%.2f", engine, m.seconds / floor.seconds,
                               engine, m.cpuSeconds / floor.cpuSeconds)
            }
            if let big = medians[engine]?[1_000_000], let small = medians[engine]?[100_000], small.seconds > 0, small.cpuSeconds > 0 {
                line += String(format: " %@_1M_over_100k=%.1f %@_cpu_1M_over_100k=%.1f", engine, big.seconds / small.seconds,
                               engine, big.cpuSeconds / small.cpuSeconds)
            }
            line += String(format: " %@_peak_rss_mb=%.0f", engine, m.rssMegabytes)
        }
        return line
    }
}

/// A field `name=value` of a result line, as a number.
func field(_ name: String, of line: String) -> Double? {
    let prefix = name + "="
    return line.split(separator: " ").first { $0.hasPrefix(prefix) }.flatMap { Double($0.dropFirst(prefix.count)) }
}

/// CPU seconds this process has used, user and system, all threads.
func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    guard !sorted.isEmpty else { return .nan }
    let middle = sorted.count / 2
    return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
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
    Children.track(process)
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else { return nil }
    return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
}
