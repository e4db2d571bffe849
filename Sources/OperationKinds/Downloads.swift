// Downloads: libcurl's multi interface on one thread for every transfer (an asynchronous operation holds a
// queue slot, not a thread), connections reused across transfers; and file:// URLs under configured roots.
//
// Every download is streamed into a file, never collected in memory: active/.downloads/<job>/.<op>.part
// while it arrives, fsynced and renamed active/.downloads/<job>/<op> once complete (before its success
// is recorded). Its output is a `DownloadedFile` (the path and a read-only mapping), so a big body is
// never in the heap, and a download that succeeded before a crash is restored from its file instead of
// being fetched again. Spool.recover removes partial files and the folders of jobs no longer active;
// publication removes the job's folder (it is outside active/<job>/, so never in the outbox).
// What it trusts: nothing a URL names; http(s) connections only to addresses the network policy allows
// (Networks+Curl.swift, over JobModel's IPNetwork), file:// only under the configured roots.

import CCurl
import CShims
import Foundation
import JobModel
import OperationEngine
import SpoolFiles
import SystemCalls

public struct DownloadLimits: Sendable {
    public var maxBytes: Int
    public var connectTimeoutSeconds: Double
    public var timeoutSeconds: Double
    public var fileRoots: [String]
    /// Networks opened for downloads (`download.allowNetworks`): everything else in the refused ranges is refused.
    public var allowNetworks: [IPNetwork] = []
    public static let maxRedirects = 5

    package init(maxBytes: Int, connectTimeoutSeconds: Double, timeoutSeconds: Double, fileRoots: [String],
                 allowNetworks: [IPNetwork] = []) {
        self.maxBytes = maxBytes
        self.connectTimeoutSeconds = connectTimeoutSeconds
        self.timeoutSeconds = timeoutSeconds
        self.fileRoots = fileRoots
        self.allowNetworks = allowNetworks
    }
}

/// A completed download: its file under active/.downloads/<job>/ and a read-only, private mapping of it
/// (`bytes`, a `Data` over the mapping that unmaps when the last copy is released; pages are read from the
/// file as they are touched, so a big body does not count against the heap). Consumers that can read a
/// file (a streaming decoder, `write`) should use `path` and leave the mapping untouched.
public final class DownloadedFile: Sendable {
    public let path: String
    public let count: Int
    public let bytes: Data

    /// Maps the file at `path` (a complete download).
    public convenience init(path: String) throws {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw SpoolError(operation: "open the downloaded file", path: path, errno: errno) }
        defer { close(fd) }
        try self.init(fd: fd, path: path)
    }

    /// Maps the file open for reading as `fd` (kept by the caller) at `path`.
    init(fd: Int32, path: String) throws {
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw SpoolError(operation: "fstat", path: path, errno: errno) }
        guard (st.st_mode & S_IFMT) == S_IFREG else { throw SpoolError(operation: "open the downloaded file", path: path, errno: EINVAL) }
        let size = Int(st.st_size)
        self.path = path
        count = size
        if size == 0 {
            bytes = Data() // mmap refuses a length of 0
            return
        }
        guard let base = mmap(nil, size, PROT_READ, MAP_PRIVATE, fd, 0), base != UnsafeMutableRawPointer(bitPattern: -1) else {
            throw SpoolError(operation: "mmap", path: path, errno: errno)
        }
        bytes = Data(bytesNoCopy: base, count: size, deallocator: .custom { pointer, length in munmap(pointer, length) })
    }
}

/// Where one download is written: the hidden partial file, made durable and renamed at `complete`.
final class DownloadTarget: @unchecked Sendable {
    let folder: String
    let name: String
    let fd: Int32
    /// `complete` and `discard` may race (a cancel while the transfer completes): the first one wins,
    /// and the descriptor is closed once.
    private let lock = NSLock()
    private var ended = false
    var partPath: String { folder + "/." + name + ".part" }
    var path: String { folder + "/" + name }

    init(folder: String, name: String) throws {
        // active/.downloads/<job>/: made on the first download (a job without downloads costs no inode).
        let parent = (folder as NSString).deletingLastPathComponent
        for directory in [parent, folder] where mkdir(directory, 0o750) != 0 && errno != EEXIST {
            throw SpoolError(operation: "mkdir", path: directory, errno: errno)
        }
        self.folder = folder
        self.name = name
        // Read and write: `complete` maps it through this descriptor (no other open, which could fail
        // for want of descriptors once the body is in).
        fd = open(folder + "/." + name + ".part", O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0o640)
        guard fd >= 0 else { throw SpoolError(operation: "create", path: folder + "/." + name + ".part", errno: errno) }
    }

    /// A second descriptor of the file, for a transfer to write through: after a cancel, `discard` closes
    /// this one at once, while the transfer thread may write until it frees the transfer; the number it
    /// writes to stays its own till then.
    func duplicate() throws -> Int32 {
        let fd = fcntl(self.fd, F_DUPFD_CLOEXEC, 0)
        guard fd >= 0 else { throw SpoolError(operation: "dup", path: partPath, errno: errno) }
        return fd
    }

    /// Runs what fills the file, then completes it; discards it if that fails (or was cancelled).
    func complete(after fill: () throws -> Void) throws -> DownloadedFile {
        do {
            try fill()
        } catch {
            discard()
            throw error
        }
        return try complete()
    }

    /// Makes the download durable (fsync, rename; the folder entry is covered by the spool's next commit,
    /// which comes before the success it records) and maps it.
    func complete() throws -> DownloadedFile {
        guard end() else { throw OperationCancelled() }
        defer { close(fd) }
        guard fsync(fd) == 0 else {
            let e = errno
            unlink(partPath)
            throw SpoolError(operation: "fsync", path: partPath, errno: e)
        }
        guard rename(partPath, path) == 0 else {
            let e = errno
            unlink(partPath)
            throw SpoolError(operation: "rename", path: partPath, errno: e)
        }
        return try DownloadedFile(fd: fd, path: path)
    }

    private func end() -> Bool {
        lock.withLock {
            defer { ended = true }
            return !ended
        }
    }

    /// A failed or cancelled download: its partial file goes.
    func discard() {
        guard end() else { return }
        close(fd)
        unlink(partPath)
    }
}

public final class Downloader: @unchecked Sendable {
    private struct Request {
        let tag: UInt64
        let url: String
        let fd: Int32
        let maxBytes: Int
        let limits: DownloadLimits
        let completion: @Sendable (Result<Void, any Error>) -> Void
    }

    private let lock = NSLock()
    private var pending: [Request] = []
    private var cancelled: Set<UInt64> = []
    private var running: [UInt64: (transfer: OpaquePointer, completion: @Sendable (Result<Void, any Error>) -> Void)] = [:]
    private var nextTag: UInt64 = 1
    private let multi: OpaquePointer?
    private var started = false

    public static let shared = Downloader()

    private init() {
        _ = opq_curl_global_init()
        multi = opq_multi_new()
    }

    /// Starts a transfer whose body is written to `fd`, which the transfer owns from now on (it closes it
    /// when it ends: pass a duplicate, `DownloadTarget.duplicate`); `completion` is called once, from the
    /// transfer thread. Returns a cancel function that aborts the transfer at once (its completion is then
    /// not called).
    func fetch(_ url: String, into duplicate: Int32, maxBytes: Int, limits: DownloadLimits,
               completion: @escaping @Sendable (Result<Void, any Error>) -> Void) -> @Sendable () -> Void {
        guard let multi else {
            close(duplicate)
            completion(.failure(KindFailure(description: "libcurl could not be started")))
            return {}
        }
        lock.lock()
        let tag = nextTag
        nextTag += 1
        pending.append(Request(tag: tag, url: url, fd: duplicate, maxBytes: maxBytes, limits: limits, completion: completion))
        if !started {
            started = true
            let thread = Thread { [self] in loop() }
            thread.name = "downloads"
            thread.start()
        }
        lock.unlock()
        opq_multi_wakeup(multi)
        return { [self] in cancel(tag) }
    }

    private func cancel(_ tag: UInt64) {
        lock.withLock { _ = cancelled.insert(tag) }
        if let multi { opq_multi_wakeup(multi) }
    }

    private func loop() {
        guard let multi else { return }
        while true {
            lock.lock()
            let adding = pending
            pending = []
            let stopping = cancelled
            cancelled = []
            lock.unlock()
            for request in adding {
                if stopping.contains(request.tag) {
                    close(request.fd)
                    continue
                }
                let networks = request.limits.allowNetworks.map(\.cNetwork)
                let made = networks.withUnsafeBufferPointer {
                    opq_transfer_new(request.url, request.fd, Int64(request.maxBytes), Int(request.limits.connectTimeoutSeconds * 1000),
                                     Int(request.limits.timeoutSeconds * 1000), DownloadLimits.maxRedirects, $0.baseAddress, $0.count,
                                     request.tag)
                }
                guard let transfer = made else {
                    close(request.fd)
                    request.completion(.failure(KindFailure(description: "libcurl could not make a transfer")))
                    continue
                }
                opq_multi_add(multi, transfer)
                running[request.tag] = (transfer, request.completion)
            }
            for tag in stopping {
                guard let entry = running.removeValue(forKey: tag) else { continue }
                opq_multi_remove(multi, entry.transfer)
                opq_transfer_free(entry.transfer)
            }
            _ = opq_multi_run(multi, running.isEmpty ? 1000 : 100)
            var code: Int32 = 0
            while let transfer = opq_multi_next_done(multi, &code) {
                let tag = opq_transfer_tag(transfer)
                opq_multi_remove(multi, transfer)
                let entry = running.removeValue(forKey: tag)
                var message = [CChar](repeating: 0, count: 512)
                let result: Result<Void, any Error>
                if opq_transfer_result(transfer, code, &message, message.count) == 0 {
                    result = .success(())
                } else {
                    result = .failure(KindFailure(description: String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) },
                                                                      as: UTF8.self)))
                }
                opq_transfer_free(transfer)
                entry?.completion(result)
            }
        }
    }

    /// file:// URLs: only a regular file whose real path (after `..` and symlinks) is inside a root, no
    /// larger than `maxBytes`; returns it open for reading.
    static func openFile(_ url: String, maxBytes: Int, roots: [String]) throws -> Int32 {
        guard let components = URLComponents(string: url),
              components.host == nil || components.host == "" || components.host == "localhost" else {
            throw KindFailure(description: "file URL \(url) names a host")
        }
        let path = components.percentEncodedPath.removingPercentEncoding ?? components.path
        let notUnder = KindFailure(description: "\(path) is not under a configured file root (download.fileRoots"
                                       + (roots.isEmpty ? " is empty)" : ")"))
        let realRoots = roots.compactMap(realPath)
        func isInside(_ p: String, _ roots: [String]) -> Bool {
            roots.contains { root in p == root || p.hasPrefix(root.hasSuffix("/") ? root : root + "/") }
        }
        guard let real = realPath(path) else {
            // Only a path inside a root says why it cannot be read: outside, whether it exists is not the submitter's
            // to learn.
            let e = errno
            guard isInside((path as NSString).standardizingPath, realRoots + roots) else { throw notUnder }
            throw KindFailure(description: "\(path): \(String(cString: strerror(e)))")
        }
        guard isInside(real, realRoots) else { throw notUnder }
        let source = open(real, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard source >= 0 else { throw SpoolError(operation: "open", path: real, errno: errno) }
        var st = stat()
        guard fstat(source, &st) == 0 else {
            let e = errno
            close(source)
            throw SpoolError(operation: "fstat", path: real, errno: e)
        }
        guard (st.st_mode & S_IFMT) == S_IFREG else {
            close(source)
            throw SpoolError.notRegular(real, mode: st.st_mode)
        }
        if Int(st.st_size) > maxBytes {
            close(source)
            throw KindFailure(description: "the file is larger than maxBytes (\(maxBytes) bytes)")
        }
        return source
    }

    /// Copies an open file (from `openFile`) into a download's file, at most `maxBytes` (the size can
    /// change while it is copied: the bound is kept on what is copied).
    static func copy(_ source: Int32, into fd: Int32, maxBytes: Int, url: String) throws {
        let copied = opq_copy_file(source, fd, Int64(maxBytes) + 1)
        if copied < 0 { throw SpoolError(operation: "copy", path: url, errno: Int32(-copied)) }
        if copied > maxBytes { throw KindFailure(description: "the file is larger than maxBytes (\(maxBytes) bytes)") }
    }

    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }
}
