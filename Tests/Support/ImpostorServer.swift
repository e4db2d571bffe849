// A loopback TCP server that is not PostgreSQL: for each connection it reads what the client sends and answers
// with the next of its replies (an HTTP error, random bytes, "S" then bytes that are not TLS), then hangs up.
// For what a node says when cluster.database points at the wrong service.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

public final class ImpostorServer: @unchecked Sendable {
    public let port: Int
    private let listener: Int32
    private let thread: Thread

    /// `replies`: one per read of the client's, in turn; the connection is closed after the last.
    public init(replies: [[UInt8]]) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SupportFailure("socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Bool in
                bind(fd, pointer, length) == 0 && listen(fd, 16) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else {
            close(fd)
            throw SupportFailure("listen on 127.0.0.1:0: \(String(cString: strerror(errno)))")
        }
        listener = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        thread = Thread {
            while true {
                let client = accept(fd, nil, nil)
                if client < 0 {
                    if errno == EINTR { continue }
                    return  // the listener was shut down
                }
                var buffer = [UInt8](repeating: 0, count: 4096)
                for reply in replies {
                    guard recv(client, &buffer, buffer.count, 0) > 0 else { break }
                    _ = reply.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                }
                close(client)
            }
        }
        thread.start()
    }

    deinit {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }
}
