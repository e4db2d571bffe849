// The control socket <spool>/opqueued.sock: one JSON request line, one JSON response line.
// What it trusts: the socket's file mode (owner and group only) decides who may talk to it;
// requests are size-limited and every field is checked.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

public final class ControlServer: @unchecked Sendable {
    public typealias Handler = @Sendable ([String: Any]) -> [String: Any]
    let path: String
    let handler: Handler
    private var fd: Int32 = -1

    public init(path: String, handler: @escaping Handler) {
        self.path = path
        self.handler = handler
    }

    public func start() throws {
        unlink(path)
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SpoolError(operation: "socket", path: path, errno: errno) }
        // Bound under a temporary name, restricted to owner and group, listening, and only then renamed
        // into place: the socket is never reachable with a wider mode, and answers as soon as it is seen.
        let fresh = path + ".new"
        unlink(fresh)
        let bound = try withUnixAddress(fresh) { bind(fd, $0, $1) }
        guard bound == 0 else { throw SpoolError(operation: "bind", path: fresh, errno: errno) }
        guard chmod(fresh, 0o660) == 0 else { throw SpoolError(operation: "chmod", path: fresh, errno: errno) }
        guard listen(fd, 64) == 0 else { throw SpoolError(operation: "listen", path: fresh, errno: errno) }
        guard rename(fresh, path) == 0 else { throw SpoolError(operation: "rename", path: fresh, errno: errno) }
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "control"
        thread.start()
    }

    /// Removes the socket and ends the accept loop; nothing to do if it was never started.
    public func stop() {
        guard fd >= 0 else { return }
        unlink(path)
        shutdown(fd, Int32(SHUT_RDWR))
    }

    private func acceptLoop() {
        while true {
            let client = accept(fd, nil, nil)
            if client < 0 {
                if errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE {
                    if errno == EMFILE || errno == ENFILE { usleep(50_000) }
                    continue
                }
                return
            }
            DispatchQueue.global().async { [self] in serve(client) }
        }
    }

    private func serve(_ client: Int32) {
        defer { close(client) }
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        guard let line = readLine(client, limit: 65_536),
              let request = (try? JSONSerialization.jsonObject(with: line)) as? [String: Any] else {
            respond(client, ["exit": 64, "error": "malformed request"])
            return
        }
        respond(client, handler(request))
    }

    private func respond(_ client: Int32, _ response: [String: Any]) {
        guard var data = try? JSONSerialization.data(withJSONObject: response, options: [.sortedKeys]) else { return }
        data.append(0x0A)
        try? writeAll(client, data, path: path)
    }
}

/// `bind` or `connect` on a Unix socket path; the call's result (0 or -1 with errno set).
func withUnixAddress(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Int32) throws -> Int32 {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { throw SpoolError(operation: "socket path too long", path: path, errno: ENAMETOOLONG) }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in raw.copyBytes(from: bytes) }
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
}

func readLine(_ fd: Int32, limit: Int) -> Data? {
    var data = Data()
    var byte = [UInt8](repeating: 0, count: 4096)
    while data.count < limit {
        let n = byte.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { break }
        data.append(contentsOf: byte[0..<n])
        if let newline = data.firstIndex(of: 0x0A) { return data[..<newline] }
    }
    return data.isEmpty ? nil : data
}

public enum ControlClient {
    public struct NoDaemon: Error, CustomStringConvertible {
        public let path: String
        public let reason: String
        public var description: String { "no daemon is running on \(path) (\(reason))" }
    }

    /// Sends one request; throws `NoDaemon` when nothing listens on the socket.
    public static func request(_ path: String, _ request: [String: Any], timeout: Int = 30) throws -> [String: Any] {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw NoDaemon(path: path, reason: String(cString: strerror(errno))) }
        defer { close(fd) }
        let connected = try withUnixAddress(path) { connect(fd, $0, $1) }
        guard connected == 0 else {
            throw NoDaemon(path: path, reason: errno == ENOENT ? "no socket" : errno == ECONNREFUSED ? "stale socket" : String(cString: strerror(errno)))
        }
        var tv = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var data = try JSONSerialization.data(withJSONObject: request)
        data.append(0x0A)
        try writeAll(fd, data, path: path)
        guard let line = readLine(fd, limit: 64 << 20),
              let response = (try? JSONSerialization.jsonObject(with: line)) as? [String: Any] else {
            throw NoDaemon(path: path, reason: "no answer")
        }
        return response
    }
}
