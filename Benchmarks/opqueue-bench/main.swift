// opqueue-bench: measures the operation engine (EngineBench.swift: against libdispatch and Foundation's
// OperationQueue, in the same run), the spool, the outbox, the control socket, the cluster store, commands and images.

import Daemon
import Foundation
import OperationEngine
import OperationKinds
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

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

/// One result line, written at once (stdout may be a file or a pipe).
func emit(_ line: String) {
    if Children.isStopping { return }
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

let arguments = CommandLine.arguments.dropFirst()
Children.endWithTheBench()
switch arguments.first {
case "one":
    EngineBench.one(Array(arguments.dropFirst()))
case "engine":
    EngineBench.run(Array(arguments.dropFirst()))
case "spool":
    SpoolBench.run(Array(arguments.dropFirst()))
case "tracing":
    TraceBench.run(Array(arguments.dropFirst()))
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
    usage: opqueue-bench engine [--sizes N,…] [--workloads independent,serial,chain,fanout,layered] [--runs N]
                                [--engines opqueued,observed,dispatch,foundation]
           opqueue-bench spool [N] [--rounds R] [--journald-apart]
           opqueue-bench tracing [N]
           opqueue-bench outbox [N]
           opqueue-bench control [--samples N]
           opqueue-bench images [--count N]
           opqueue-bench commands [N] [--rounds R]
           opqueue-bench store --database URL [--password-file F] [--jobs N] [--workers W] [--batch B]
           opqueue-bench corpus FOLDER [--count N]
    """)
    exit(64)
}
Leftovers.shared.removeAll()
