// System calls as Swift code wants them: an interrupted call (EINTR, a signal arrived) is made again in this one place
// rather than in a loop at each call site, a failure says what was done to which path with its errno, and a Unix
// socket's path becomes its address here. swift-nio's System.swift is the model.

#if canImport(Glibc)
import Glibc
#endif

/// Calls `body` again while it fails with EINTR. Any other failure (a negative result) is returned as it is, with
/// `errno` as the call left it.
@inlinable
public func retryingInterrupts<T: SignedInteger>(_ body: () -> T) -> T {
    while true {
        let result = body()
        if result < 0 && errno == EINTR { continue }
        return result
    }
}

/// A system call's failure on a path: what was done, to which path, and its errno (the spool's files, the sockets).
public struct SpoolError: Error, CustomStringConvertible {
    public let operation: String
    public let path: String
    public let errno: Int32
    /// What was wrong, in words, where the errno's own (strerror) would mislead: "Too many levels of symbolic
    /// links" for a link O_NOFOLLOW refused, "Invalid argument" for a FIFO.
    public var reason: String?

    public init(operation: String, path: String, errno: Int32, reason: String? = nil) {
        self.operation = operation
        self.path = path
        self.errno = errno
        self.reason = reason
    }

    public var description: String {
        if let reason { return "\(path): \(reason)" }
        return "\(operation) \(path): \(String(cString: strerror(errno)))"
    }
}

/// `bind` or `connect` on a Unix socket path; the call's result (0 or -1 with errno set).
public func withUnixAddress(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Int32) throws -> Int32 {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
        throw SpoolError(operation: "socket path too long", path: path, errno: ENAMETOOLONG)
    }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in raw.copyBytes(from: bytes) }
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
}

/// Seconds on CLOCK_MONOTONIC (not stopped by SIGSTOP; the clock the watchdog's deadline is read on).
public func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}
