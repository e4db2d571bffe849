// Downloads: libcurl's multi interface on one thread for every transfer (an asynchronous operation holds a
// queue slot, not a thread), connections reused across transfers; and file:// URLs under configured roots.

import CCurl
import Foundation
import OperationEngine

public struct DownloadLimits: Sendable {
    public var maxBytes: Int
    public var connectTimeoutSeconds: Double
    public var timeoutSeconds: Double
    public var fileRoots: [String]
    public static let maxRedirects = 5
}

public final class Downloader: @unchecked Sendable {
    private struct Request {
        let tag: UInt64
        let url: String
        let maxBytes: Int
        let limits: DownloadLimits
        let completion: @Sendable (Result<Data, any Error>) -> Void
    }

    private let lock = NSLock()
    private var pending: [Request] = []
    private var cancelled: Set<UInt64> = []
    private var running: [UInt64: (transfer: OpaquePointer, completion: @Sendable (Result<Data, any Error>) -> Void)] = [:]
    private var nextTag: UInt64 = 1
    private let multi: OpaquePointer?
    private var started = false

    public static let shared = Downloader()

    private init() {
        _ = opq_curl_global_init()
        multi = opq_multi_new()
    }

    /// Starts a transfer; `completion` is called once, from the transfer thread. Returns a cancel function
    /// that aborts the transfer at once (its completion is then not called).
    func fetch(_ url: String, maxBytes: Int, limits: DownloadLimits, completion: @escaping @Sendable (Result<Data, any Error>) -> Void) -> @Sendable () -> Void {
        guard let multi else {
            completion(.failure(KindFailure(description: "libcurl could not be started")))
            return {}
        }
        lock.lock()
        let tag = nextTag
        nextTag += 1
        pending.append(Request(tag: tag, url: url, maxBytes: maxBytes, limits: limits, completion: completion))
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
            for request in adding where !stopping.contains(request.tag) {
                guard let transfer = opq_transfer_new(request.url, Int64(request.maxBytes), Int(request.limits.connectTimeoutSeconds * 1000),
                                                      Int(request.limits.timeoutSeconds * 1000), DownloadLimits.maxRedirects, request.tag) else {
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
                let result: Result<Data, any Error>
                if opq_transfer_result(transfer, code, &message, message.count) == 0 {
                    var size = 0
                    let body = opq_transfer_body(transfer, &size)
                    result = .success(body.map { Data(bytes: $0, count: size) } ?? Data())
                } else {
                    result = .failure(KindFailure(description: String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)))
                }
                opq_transfer_free(transfer)
                entry?.completion(result)
            }
        }
    }

    /// file:// URLs: only a regular file whose real path (after `..` and symlinks) is inside a root.
    static func readFile(_ url: String, maxBytes: Int, roots: [String]) -> Result<Data, any Error> {
        guard let components = URLComponents(string: url), components.host == nil || components.host == "" || components.host == "localhost" else {
            return .failure(KindFailure(description: "file URL \(url) names a host"))
        }
        let path = components.percentEncodedPath.removingPercentEncoding ?? components.path
        guard let real = realPath(path) else { return .failure(KindFailure(description: "\(path): \(String(cString: strerror(errno)))")) }
        let inside = roots.compactMap(realPath).contains { root in real == root || real.hasPrefix(root.hasSuffix("/") ? root : root + "/") }
        guard inside else {
            return .failure(KindFailure(description: "\(path) is not under a configured file root" + (roots.isEmpty ? " (download.fileRoots is empty)" : "")))
        }
        switch readRegularFile(real, limit: maxBytes + 1) {
        case .success(let data):
            if data.count > maxBytes { return .failure(KindFailure(description: "the file is larger than maxBytes (\(maxBytes) bytes)")) }
            return .success(data)
        case .failure(let error):
            return .failure(error)
        }
    }

    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }
}
