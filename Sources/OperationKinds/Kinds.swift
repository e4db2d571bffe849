// The operation kinds (SPEC §3.3): what each one runs, given its parameters and the job's folder.
//
// Outputs between operations: `DownloadedFile` (a download, or a written file: a file and a read-only
// mapping of it), `Data` (bytes), `Image` (decoded pixels) or, from a fused image operation, an
// `ImagePipeline` (Pipeline.swift: the source and the steps still to run). Image operations decode bytes
// they receive (PNG or JPEG by signature, from the mapping); `write` copies a file's bytes unchanged (file
// to file, never through the heap), writes bytes, and encodes images and pipelines a strip of rows at a time.

import CShims
import Foundation
import JobModel
import OperationEngine
import SpoolFiles
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

/// A wall-clock timer that fires once, and whose cancellation releases what its handler holds at once
/// (a `DispatchQueue.asyncAfter` block lives until its deadline). Dispatch sources are thread-safe;
/// swift-corelibs-libdispatch does not mark them Sendable.
package final class OneShotTimer: @unchecked Sendable {
    private let source: any DispatchSourceTimer

    package init(after seconds: Double, _ handler: @escaping @Sendable () -> Void) {
        source = DispatchSource.makeTimerSource(queue: .global())
        source.schedule(deadline: .now() + seconds)
        // The handler refers to the timer until the source is cancelled, which releases the handler.
        source.setEventHandler { [self] in
            handler()
            cancel()
        }
        source.resume()
    }

    package func cancel() { source.cancel() }
}

package struct KindFailure: Error, CustomStringConvertible {
    package let description: String

    package init(description: String) { self.description = description }
}

/// Where downloads count their bytes and errors: the daemon's metrics.
package protocol DownloadMetrics: Sendable {
    func downloaded(bytes: Int)
    func downloadFailed()
}

/// What a kind's body needs from the daemon.
package struct KindEnvironment: Sendable {
    /// active/<job>/: where `write` puts files (the future outbox entry).
    package var jobFolder: String
    /// active/.downloads/<job>/: where downloads are streamed to, one file per operation (not published).
    package var downloads: String
    var limits: DownloadLimits
    var maxPixels: Int
    /// Where downloads count their bytes and errors (none in tests of the kinds alone).
    var metrics: (any DownloadMetrics)?
    /// The configuration's commands, for `kind = command`.
    var commands: [String: CommandSpec]

    package init(jobFolder: String, downloads: String, limits: DownloadLimits, maxPixels: Int, metrics: (any DownloadMetrics)? = nil,
                 commands: [String: CommandSpec] = [:]) {
        self.jobFolder = jobFolder
        self.downloads = downloads
        self.limits = limits
        self.maxPixels = maxPixels
        self.metrics = metrics
        self.commands = commands
    }
}

package enum Kinds {
    /// The body of operation `operation` (its id names its download's file). `fused`: an image operation
    /// whose output goes only to the next image operation or `write` of its chain (ImageFusion); it hands on
    /// an ImagePipeline instead of pixels, and the chain runs in the consumer.
    package static func body(for parameters: Parameters, operation: String, environment: KindEnvironment,
                             fused: Bool = false) -> OperationBody {
        switch parameters {
        case .sleep(let seconds) where !(seconds > 0):
            // Nothing to wait for: ends in its body, without a timer and the two thread hops it costs.
            return .sync { _ in nil }
        case .sleep(let seconds):
            // Wall time on a timer: holds a queue slot, no thread. A cancelled sleep ends at once in the
            // engine, and its timer is cancelled too, so a year-long sleep does not keep its context
            // (and the input it holds) for a year.
            return .async { context in
                let timer = OneShotTimer(after: seconds) { context.finish(.success(nil)) }
                context.onCancel { timer.cancel() }
            }
        case .spin(let seconds):
            return .sync { context in
                var start = timespec(), now = timespec()
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start)
                var x: UInt64 = 0x9E37_79B9_7F4A_7C15
                while true {
                    for _ in 0..<20_000 { x = x &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407 }
                    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
                    let used = Double(now.tv_sec - start.tv_sec) + Double(now.tv_nsec - start.tv_nsec) / 1e9
                    if used >= seconds { break }
                    if context.isCancelled { throw OperationCancelled() }
                }
                withExtendedLifetime(x) {} // keeps the arithmetic from being optimised away
                return nil
            }
        case .fail(let message):
            return .sync { _ in throw KindFailure(description: message) }
        case .download(let url, let maxBytes):
            return download(url, maxBytes: maxBytes, name: operation, environment: environment) { $0 }
        case .sepia, .grayscale, .blur, .resize, .vignette, .thumbnail:
            return imageBody(parameters, environment: environment, fused: fused, operation: operation)
        case .command(let name, let arguments):
            guard let spec = environment.commands[name] else {
                // Checked at validation; a reload may have removed it since (a job accepted before runs on without it).
                return .sync { _ in throw FinalFailure("command '\(name)' was removed from the configuration after the job was accepted") }
            }
            return CommandOperation.body(spec, arguments: arguments, environment: environment)
        case .write(let path, let format, let quality):
            return .sync { context in
                let check: CancellationCheck = { if context.isCancelled { throw OperationCancelled() } }
                let pipeline: ImagePipeline
                switch context.input {
                case let file as DownloadedFile:
                    try patiently({ context.isCancelled }) { try writeOutput(copying: file, to: environment.jobFolder, path: path) }
                    return file
                case let bytes as Data:
                    try patiently({ context.isCancelled }) { try writeOutput(bytes, to: environment.jobFolder, path: path) }
                    return bytes
                case let image as Image: pipeline = ImagePipeline(source: .image(image), steps: [], operations: [])
                case let fusedChain as ImagePipeline: pipeline = fusedChain
                default: throw KindFailure(description: "write needs an input: a dependency that produces an image or bytes")
                }
                // Rows go from the chain to the file a strip at a time: no encoded (or decoded) copy in memory.
                let written = try patiently({ context.isCancelled }) {
                    try writeOutput(to: environment.jobFolder, path: path) { fd, _ in
                        // A fused operation's stage that fails throws StageFailure: that operation fails (FusedChains).
                        let format = format ?? Manifest.imageFormat(ofPath: path) ?? "png"
                        try pipeline.encode(to: fd, format: format, quality: quality, maxPixels: environment.maxPixels, check: check)
                    }
                }
                return try DownloadedFile(path: written)
            }
        }
    }

    /// Runs `body`, waiting out a shortage of file descriptors (EMFILE, ENFILE: the daemon's trouble, not
    /// the job's) rather than failing the operation: retried with a growing pause, for up to 30 s.
    static func patiently<T>(_ isCancelled: () -> Bool, _ body: () throws -> T) throws -> T {
        var pause: UInt32 = 5_000
        let deadline = Date().addingTimeInterval(30)
        while true {
            do {
                return try body()
            } catch let error as SpoolError where (error.errno == EMFILE || error.errno == ENFILE) && Date() < deadline {
                if isCancelled() { throw OperationCancelled() }
                usleep(pause)
                pause = min(pause * 2, 200_000)
            }
        }
    }

    /// An asynchronous download (libcurl, or a file under the roots) streamed into the job's downloads
    /// folder as `name`; `then` turns the completed file into the output.
    package static func download(_ url: String, maxBytes: Int?, name: String, environment: KindEnvironment,
                         then: @escaping @Sendable (DownloadedFile) throws -> OperationOutput?) -> OperationBody {
        let limit = min(maxBytes ?? environment.limits.maxBytes, environment.limits.maxBytes)
        // Nothing here runs on libdispatch's global pool: with descriptors exhausted, threads blocked there
        // make libdispatch's pool monitor open /proc files, fail, and abort the process.
        // Descriptors are taken together, and all given back when one is missing (then waited for): an
        // operation holding one while it waits for the next would starve the others once they run out.
        if url.lowercased().hasPrefix("file:") {
            // A local copy: on the engine's thread, like `write`.
            return .sync { context in
                let (source, target) = try patiently({ context.isCancelled }) { () throws -> (Int32, DownloadTarget) in
                    let source = try Downloader.openFile(url, maxBytes: limit, roots: environment.limits.fileRoots)
                    do {
                        return (source, try DownloadTarget(folder: environment.downloads, name: name))
                    } catch {
                        close(source)
                        throw error
                    }
                }
                defer { close(source) }
                let file = try counted(environment.metrics, { context.isCancelled }) {
                    try target.complete {
                        try Downloader.copy(source, into: target.fd, maxBytes: limit, url: url)
                        if context.isCancelled { throw OperationCancelled() }
                    }
                }
                return try then(file)
            }
        }
        return .async { context in
            let target: DownloadTarget, transferFD: Int32
            do {
                (target, transferFD) = try patiently({ context.isCancelled }) { () throws -> (DownloadTarget, Int32) in
                    let target = try DownloadTarget(folder: environment.downloads, name: name)
                    do {
                        return (target, try target.duplicate())
                    } catch {
                        target.discard()
                        throw error
                    }
                }
            } catch {
                context.finish(.failure(error))
                return
            }
            // On the transfer thread: the fsync of a finished body holds up the other transfers that long.
            let done: @Sendable (Result<Void, any Error>) -> Void = { result in
                context.finish(Result {
                    let file = try counted(environment.metrics, { context.isCancelled }) {
                        try target.complete {
                            try result.get()
                            if context.isCancelled { throw OperationCancelled() }
                        }
                    }
                    return try then(file)
                })
            }
            let cancel = Downloader.shared.fetch(url, into: transferFD, maxBytes: limit, limits: environment.limits, completion: done)
            context.onCancel {
                cancel()
                target.discard()
            }
        }
    }

    /// A download's completed file, its bytes counted in the metrics; a failure (not a cancellation) counts
    /// as a download error.
    private static func counted(_ metrics: (any DownloadMetrics)?, _ isCancelled: () -> Bool,
                                _ body: () throws -> DownloadedFile) throws -> DownloadedFile {
        do {
            let file = try body()
            metrics?.downloaded(bytes: file.count)
            return file
        } catch {
            if !isCancelled() && !(error is OperationCancelled) { metrics?.downloadFailed() }
            throw error
        }
    }

    /// A download that succeeded before a restart: its file, as it was then (not fetched again).
    package static func restoredDownload(name: String, environment: KindEnvironment,
                                 then: @escaping @Sendable (DownloadedFile) throws -> OperationOutput?) -> OperationBody {
        .sync { _ in try then(DownloadedFile(path: environment.downloads + "/" + name)) }
    }

    /// A synchronous image operation. Fused, it hands on its step added to the chain (checking a byte input's
    /// header at once, so bytes that are no image, or too large, still fail here); otherwise it runs the chain
    /// so far and its own step into pixels.
    private static func imageBody(_ parameters: Parameters, environment: KindEnvironment, fused: Bool, operation: String) -> OperationBody {
        .sync { context in
            guard let step = ImageStep(parameters) else { throw KindFailure(description: "not an image operation") }
            let pipeline: ImagePipeline
            switch context.input {
            case let chain as ImagePipeline: pipeline = chain.appending(step, operation: operation)
            case let image as Image: pipeline = ImagePipeline(source: .image(image), steps: [step], operations: [operation])
            case let file as DownloadedFile:
                if fused { try ImagePipeline.checkHeader(file.bytes, maxPixels: environment.maxPixels) }
                pipeline = ImagePipeline(source: .bytes(file.bytes), steps: [step], operations: [operation])
            case let bytes as Data:
                if fused { try ImagePipeline.checkHeader(bytes, maxPixels: environment.maxPixels) }
                pipeline = ImagePipeline(source: .bytes(bytes), steps: [step], operations: [operation])
            default: throw KindFailure(description: "needs an input image: a dependency that produces an image or image bytes")
            }
            if fused { return pipeline }
            return try pipeline.materialise(maxPixels: environment.maxPixels) { if context.isCancelled { throw OperationCancelled() } }
        }
    }

    /// Writes `path` inside the job folder: sub-folders made as needed, the file written under a hidden
    /// name, fsynced and renamed, so it is never seen half-written (and its bytes are on disk before the
    /// operation's success is recorded).
    static func writeOutput(_ data: Data, to folder: String, path: String) throws {
        try writeOutput(to: folder, path: path) { fd, file in try writeAll(fd, data, path: file) }
    }

    /// `writeOutput` of a downloaded file's bytes, copied file to file.
    static func writeOutput(copying source: DownloadedFile, to folder: String, path: String) throws {
        try writeOutput(to: folder, path: path) { fd, file in try copy(source, into: fd, path: file) }
    }

    /// Copies a downloaded (or written) file's bytes into `fd` (open as `path`), file to file: never through the heap.
    static func copy(_ source: DownloadedFile, into fd: Int32, path: String) throws {
        let input = open(source.path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard input >= 0 else { throw SpoolError(operation: "open", path: source.path, errno: errno) }
        defer { close(input) }
        let copied = opq_copy_file(input, fd, Int64.max)
        if copied < 0 { throw SpoolError(operation: "copy \(source.path) to", path: path, errno: Int32(-copied)) }
    }

    /// Writes `path` through `fill(fd, hiddenPath)`; returns the final path.
    @discardableResult
    static func writeOutput(to folder: String, path: String, _ fill: (Int32, String) throws -> Void) throws -> String {
        let components = path.split(separator: "/").map(String.init)
        var directory = folder
        for component in components.dropLast() {
            directory += "/" + component
            if mkdir(directory, 0o755) != 0 && errno != EEXIST { throw SpoolError(operation: "mkdir", path: directory, errno: errno) }
            var st = stat()
            // A symlink planted in the job folder must not lead outside it.
            guard lstat(directory, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else {
                throw SpoolError(operation: "write into", path: directory, errno: ENOTDIR)
            }
        }
        let name = components.last ?? path
        let hidden = directory + "/." + name + ".part"
        do {
            try writeDurably(to: hidden, syncFolder: false, fill)
        } catch {
            unlink(hidden)
            throw error
        }
        CrashPoint.writePart.reached()
        let final = directory + "/" + name
        guard rename(hidden, final) == 0 else {
            let e = errno
            unlink(hidden)
            throw SpoolError(operation: "rename", path: hidden, errno: e)
        }
        return final
    }
}
