// The descriptor kept in reserve for the listening sockets (the control socket's and the metrics'): out of file
// descriptors, a listener gives it up so that the waiting client can be accepted and answered.

import NIOCore
import NIOPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// On a listening socket: accept failed for want of a descriptor (EMFILE, ENFILE). NIO tries again at once (the
/// socket stays readable and its read stays pending, so even `AcceptBackoffHandler` does not pause it), so the
/// reserve is given up for the waiting client. Nothing more: accept also fails so when no client waits, right
/// after one was accepted into the reserve's place. Other errors go on down the pipeline.
final class DescriptorShortage: ChannelInboundHandler {
    typealias InboundIn = any Channel
    private let reserve: DescriptorReserve

    init(_ reserve: DescriptorReserve) { self.reserve = reserve }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        if let error = error as? IOError, error.errnoCode == EMFILE || error.errnoCode == ENFILE {
            _ = reserve.giveUp()
        } else {
            context.fireErrorCaught(error)
        }
    }
}

/// One file descriptor (/dev/null, close-on-exec) held so that a listening socket can accept a connection when
/// every other descriptor is taken. One for the process, shared by the control socket and the metrics listener: a
/// listener short of a descriptor can free the slot whichever of them took it back last (with one each, a status
/// connection closing could take back the slot the metrics listener had just freed for a scrape, and accept would
/// spin with nothing left to free). Held while at least one listener uses it.
final class DescriptorReserve: Sendable {
    static let shared = DescriptorReserve()
    private let state = Mutex<(fd: Int32, users: Int)>((-1, 0))

    /// A listener starts using the reserve: it is taken if not held.
    func use() {
        state.withLock { $0.users += 1 }
        retake()
    }

    /// Takes the descriptor again if it was given up (and one is free now) while a listener uses it.
    func retake() {
        state.withLock { state in
            if state.fd < 0 && state.users > 0 { state.fd = open("/dev/null", O_RDONLY | O_CLOEXEC) }
        }
    }

    /// Closes the descriptor, if held; whether it was.
    func giveUp() -> Bool {
        state.withLock { state in
            guard state.fd >= 0 else { return false }
            Glibc.close(state.fd)
            state.fd = -1
            return true
        }
    }

    /// A listener stops using the reserve: the last one closes it.
    func close() {
        let last = state.withLock { state -> Bool in
            state.users = max(0, state.users - 1)
            return state.users == 0
        }
        if last { _ = giveUp() }
    }
}
