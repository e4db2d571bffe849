// The operation kinds (SPEC §3.3): what each one runs, given its parameters and the job's folder.
//
// Outputs between operations: `Data` (downloaded or written bytes) or `Image` (decoded pixels). Image
// operations decode bytes they receive (PNG or JPEG by signature); `write` writes bytes unchanged and
// encodes images.

import Foundation
import OperationEngine

#if canImport(Glibc)
import Glibc
#endif

/// A wall-clock timer that fires once, and whose cancellation releases what its handler holds at once
/// (a `DispatchQueue.asyncAfter` block lives until its deadline). Dispatch sources are thread-safe;
/// swift-corelibs-libdispatch does not mark them Sendable.
final class OneShotTimer: @unchecked Sendable {
    private let source: any DispatchSourceTimer

    init(after seconds: Double, _ handler: @escaping @Sendable () -> Void) {
        source = DispatchSource.makeTimerSource(queue: .global())
        source.schedule(deadline: .now() + seconds)
        // The handler refers to the timer until the source is cancelled, which releases the handler.
        source.setEventHandler { [self] in
            handler()
            cancel()
        }
        source.resume()
    }

    func cancel() { source.cancel() }
}

struct KindFailure: Error, CustomStringConvertible {
    let description: String
}

/// What a kind's body needs from the daemon.
struct KindEnvironment: Sendable {
    /// active/<job>/: where `write` puts files (the future outbox entry).
    var jobFolder: String
    var limits: DownloadLimits
    var maxPixels: Int
    /// The configuration's commands, for `kind = command`.
    var commands: [String: CommandSpec] = [:]
}

enum Kinds {
    static func body(for parameters: Parameters, environment: KindEnvironment) -> OperationBody {
        switch parameters {
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
            return download(url, maxBytes: maxBytes, environment: environment) { $0 }
        case .sepia(let intensity):
            return imageBody(environment) { image, check in try Filters.sepia(image, intensity: intensity, check: check) }
        case .grayscale:
            return imageBody(environment) { image, check in try Filters.grayscale(image, check: check) }
        case .blur(let radius):
            return imageBody(environment) { image, check in try Filters.blur(image, radius: radius, check: check) }
        case .resize(let width, let height, let mode):
            return imageBody(environment) { image, check in try Filters.resize(image, width: width, height: height, mode: mode, check: check) }
        case .vignette(let strength):
            return imageBody(environment) { image, check in try Filters.vignette(image, strength: strength, check: check) }
        case .thumbnail(let size):
            // JPEG bytes shrink on load (libjpeg-turbo's scaled decoding), as vipsthumbnail does.
            return imageBody(environment, minSide: size) { image, check in try Filters.thumbnail(image, size: size, check: check) }
        case .command(let name, let arguments):
            guard let spec = environment.commands[name] else {
                // Checked at validation; a reload may have removed it since.
                return .sync { _ in throw FinalFailure("command '\(name)' is no longer in the configuration") }
            }
            return CommandOperation.body(spec, arguments: arguments, environment: environment)
        case .write(let path, let format, let quality):
            return .sync { context in
                let data: Data
                switch context.input {
                case let bytes as Data: data = bytes
                case let image as Image: data = try Codecs.encode(image, format: format, quality: quality)
                default: throw KindFailure(description: "write needs an input: a dependency that produces an image or bytes")
                }
                if context.isCancelled { throw OperationCancelled() }
                try patiently({ context.isCancelled }) { try writeOutput(data, to: environment.jobFolder, path: path) }
                return data
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

    /// An asynchronous download (libcurl, or a file under the roots); `then` turns the bytes into the output.
    static func download(_ url: String, maxBytes: Int?, environment: KindEnvironment,
                         then: @escaping @Sendable (Data) throws -> OperationOutput?) -> OperationBody {
        let limit = min(maxBytes ?? environment.limits.maxBytes, environment.limits.maxBytes)
        return .async { context in
            let done: @Sendable (Result<Data, any Error>) -> Void = { result in
                context.finish(Result { try then(result.get()) })
            }
            if url.lowercased().hasPrefix("file:") {
                DispatchQueue.global().async {
                    done(Result { try patiently({ context.isCancelled }) { try Downloader.readFile(url, maxBytes: limit, roots: environment.limits.fileRoots).get() } })
                }
            } else {
                context.onCancel(Downloader.shared.fetch(url, maxBytes: limit, limits: environment.limits, completion: done))
            }
        }
    }

    /// A synchronous image operation: decodes its input if it is bytes, then filters.
    private static func imageBody(_ environment: KindEnvironment, minSide: Int = 0,
                                  _ filter: @escaping @Sendable (Image, CancellationCheck) throws -> Image) -> OperationBody {
        .sync { context in
            let image: Image
            switch context.input {
            case let i as Image: image = i
            case let bytes as Data: image = try Codecs.decode(bytes, maxPixels: environment.maxPixels, minSide: minSide)
            default: throw KindFailure(description: "needs an input image: a dependency that produces an image or image bytes")
            }
            return try filter(image) { if context.isCancelled { throw OperationCancelled() } }
        }
    }

    /// Writes `path` inside the job folder: sub-folders made as needed, the file written under a hidden
    /// name, fsynced and renamed, so it is never seen half-written (and its bytes are on disk before the
    /// operation's success is recorded).
    static func writeOutput(_ data: Data, to folder: String, path: String) throws {
        let components = path.split(separator: "/").map(String.init)
        var directory = folder
        for component in components.dropLast() {
            directory += "/" + component
            if mkdir(directory, 0o755) != 0 && errno != EEXIST { throw SpoolError(operation: "mkdir", path: directory, errno: errno) }
            var st = stat()
            // A symlink planted in the job folder must not lead outside it.
            guard lstat(directory, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else { throw SpoolError(operation: "write into", path: directory, errno: ENOTDIR) }
        }
        let name = components.last ?? path
        let hidden = directory + "/." + name + ".part"
        try writeDurably(data, to: hidden, syncFolder: false)
        CrashPoint.writePart.reached()
        guard rename(hidden, directory + "/" + name) == 0 else {
            let e = errno
            unlink(hidden)
            throw SpoolError(operation: "rename", path: hidden, errno: e)
        }
    }
}
