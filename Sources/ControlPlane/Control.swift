// The control socket <spool>/opqueued.sock: one JSON request line, one JSON response line, then the daemon closes.
// (The protocol, for scripts, is in docs: request and response shapes, errors, exit codes, limits.)
//
// Strategy: served event-driven on SwiftNIO, one event-loop thread for every connection. A connection that is
// silent or slow costs a file descriptor and a few hundred bytes, never a thread: reading its request line and
// writing its answer are events on the loop, each with a deadline. Answers are computed (JSON parsing, the
// handler, which may wait for the engine's lock) on a small thread pool of the server's own: never on the loop,
// and never on libdispatch's global pool, which the spool queue and the engine's timers use.
// At most `maxConnections` are open; when a new one comes at the limit, the oldest connection still waiting for
// its request is closed (with an error line) to make room, so idle connections cannot lock out real clients.
// Out of file descriptors (EMFILE, ENFILE), the listening socket stays readable while accept fails, and NIO
// retries at once: the server keeps one descriptor in reserve (/dev/null), gives it up so that the waiting client
// is accepted and answered (`status` says what is wrong), and takes it again when a connection closes. While a
// client holds the reserve's place, the next one waits and the loop spins (at most `requestSeconds`, until the
// silent one is closed): NIO gives no way to pause a pending accept.
// What it trusts: the socket's file mode (owner and group only) decides who may talk to it; nothing a client
// sends or fails to send: requests are size-limited, time-limited and every field is checked by the handler.

import Foundation
import NIOCore
import NIOPosix
import JobModel
import SpoolFiles
import Synchronization
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

/// What the control socket allows one client (defaults as documented for scripts).
public struct ControlLimits: Sendable {
    /// Open connections at most; beyond it the oldest idle one is closed, or the new one gets a busy answer.
    public var maxConnections = 256
    /// The request line's bytes at most (without its newline).
    public var maxRequestBytes = 65_536
    /// Seconds a client has from connecting to send its whole request line.
    public var requestSeconds = 5.0
    /// Seconds a client has to take the whole answer once it is ready.
    public var answerSeconds = 10.0
    /// Threads that compute answers.
    public var handlerThreads = 2

    public init() {}
}

public final class ControlServer: Sendable {
    /// The daemon's answer to a request (a refused one is answered by the server: exit 64).
    public typealias Handler = @Sendable (ControlRequest) -> ControlAnswer
    public let path: String
    let handler: Handler
    let limits: ControlLimits
    let admission: Mutex<ControlAdmission<any Channel>>
    let reserve = DescriptorReserve.shared
    private let running = Mutex<(group: MultiThreadedEventLoopGroup, pool: NIOThreadPool, channel: Channel)?>(nil)

    public init(path: String, limits: ControlLimits = ControlLimits(), handler: @escaping Handler) {
        self.path = path
        self.handler = handler
        self.limits = limits
        admission = Mutex(ControlAdmission(limit: limits.maxConnections))
    }

    public func start() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let pool = NIOThreadPool(numberOfThreads: limits.handlerThreads)
        pool.start()
        reserve.use()
        do {
            let channel = try await listen(group: group, pool: pool)
            running.withLock { $0 = (group, pool, channel) }
        } catch {
            try? await pool.shutdownGracefully()
            try? await group.shutdownGracefully()
            reserve.close()
            throw error
        }
    }

    /// The socket file the listener was renamed to (its inode), to see whether someone removed or replaced it.
    private let placed = Mutex<ino_t>(0)

    /// Binds a listener under a temporary name, restricted to owner and group, listening, and only then renamed into
    /// place: the socket is never reachable with a wider mode, and answers as soon as it is seen.
    private func listen(group: MultiThreadedEventLoopGroup, pool: NIOThreadPool) async throws -> Channel {
        let fresh = path + ".new"
        let channel: Channel
        do {
            channel = try await ServerBootstrap(group: group)
                .serverChannelOption(ChannelOptions.backlog, value: 256)
                .serverChannelInitializer { [reserve] channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(DescriptorShortage(reserve))
                    }
                }
                .childChannelOption(ChannelOptions.allowRemoteHalfClosure, value: true)
                .childChannelInitializer { [self] channel in
                    channel.eventLoop.makeCompletedFuture { try admit(channel, pool: pool) }
                }
                .bind(unixDomainSocketPath: fresh, cleanupExistingSocketFile: true).get()
        } catch {
            throw ControlError("cannot listen on \(fresh): \(error)")
        }
        var failure: SpoolError?
        var st = stat()
        if chmod(fresh, 0o660) != 0 {
            failure = SpoolError(operation: "chmod", path: fresh, errno: errno)
        } else if stat(fresh, &st) != 0 {
            failure = SpoolError(operation: "stat", path: fresh, errno: errno)
        } else if rename(fresh, path) != 0 {
            failure = SpoolError(operation: "rename", path: fresh, errno: errno)
        }
        if let failure {
            unlink(fresh)
            try? await channel.close()
            throw failure
        }
        placed.withLock { $0 = st.st_ino }
        return channel
    }

    /// When the socket file is gone or is no longer this listener's (someone removed or replaced it while the daemon
    /// ran — the spool's lock says no other daemon runs here): listens again on a new one and closes the old
    /// listener (connections under way go on). Returns whether it did.
    public func restoreIfMissing() async -> Bool {
        guard let current = running.withLock({ $0 }) else { return false }
        var st = stat()
        if stat(path, &st) == 0 && st.st_ino == placed.withLock({ $0 }) { return false }
        guard let channel = try? await listen(group: current.group, pool: current.pool) else { return false }
        let old: Channel? = running.withLock { r in
            guard let r0 = r else { return nil }
            r = (r0.group, r0.pool, channel)
            return r0.channel
        }
        guard let old else {
            // Stopped meanwhile.
            try? await channel.close()
            return false
        }
        try? await old.close()
        return true
    }

    /// Removes the socket, closes every connection and ends the loop and the handler threads; nothing to do if
    /// it was never started.
    public func stop() async {
        guard running.withLock({ $0 != nil }) else { return }
        // Only this listener's socket file: one put in its place since (another daemon's, on a spool made again
        // under the same path) stays.
        var st = stat()
        if stat(path, &st) == 0 && st.st_ino == placed.withLock({ $0 }) { unlink(path) }
        await shutdown()
    }

    private func shutdown() async {
        guard let running = running.withLock({ r in defer { r = nil }; return r }) else { return }
        try? await running.channel.close()
        try? await running.pool.shutdownGracefully()
        try? await running.group.shutdownGracefully()
        reserve.close()
    }

    /// A new connection, on the loop: its handler, a busy answer, or room made by closing the oldest idle one.
    private func admit(_ channel: Channel, pool: NIOThreadPool) throws {
        let (id, decision) = admission.withLock { $0.admit(channel) }
        switch decision {
        case .admitted(let evicted):
            if let evicted {
                evicted.pipeline.fireUserInboundEventTriggered(ControlConnection.Evicted())
            }
            channel.closeFuture.whenComplete { [self] _ in
                admission.withLock { $0.closed(id) }
                reserve.retake()
            }
            try channel.pipeline.syncOperations.addHandler(ControlConnection(server: self, pool: pool, id: id))
        case .busy:
            let answer = ControlServer.line(.refused(3, "busy: \(limits.maxConnections) connections are open and answering; try again"))
            channel.writeAndFlush(answer).whenComplete { _ in channel.close(promise: nil) }
        }
    }

    /// On a handler thread: the answer to one request line, as the bytes to send.
    func answer(_ line: [UInt8]) -> ByteBuffer {
        guard let request = (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any] else {
            return ControlServer.line(.refused(64, "malformed request: not a JSON object on one line"))
        }
        do {
            return ControlServer.line(handler(try ControlRequest(wire: request)))
        } catch {
            return ControlServer.line(.refused(64, error.message))
        }
    }

    /// One response line. Should the answer not encode (a time that is not a number), the client still gets a line.
    static func line(_ answer: ControlAnswer) -> ByteBuffer {
        guard let data = try? ControlJSON.data(answer) else {
            return ByteBuffer(string: "{\"error\":\"the answer could not be encoded\",\"exit\":1}\n")
        }
        // Built here, on the handler thread, in one allocation: a big `show` is not copied again on the loop.
        var buffer = ByteBufferAllocator().buffer(capacity: data.count + 1)
        buffer.writeBytes(data)
        buffer.writeInteger(UInt8(ascii: "\n"))
        return buffer
    }
}

public struct ControlError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// Which connections are open and which of them still wait for their request line (those may be closed to make
/// room). A plain state machine: the server runs it under a lock on its one loop thread; tests run it alone.
struct ControlAdmission<Connection> {
    enum Decision {
        /// Served; `evicted` (the oldest connection still waiting for its request) must be closed to make room.
        case admitted(evicted: Connection?)
        /// Every open connection is being answered: this one gets a busy answer and is closed.
        case busy
    }

    /// A connection's number, in order of arrival (never reused, unlike an object's address).
    typealias Ticket = UInt64

    let limit: Int
    private var next: Ticket = 0
    /// Waiting for their request line.
    private var idle: [Ticket: Connection] = [:]
    private var answering: Set<Ticket> = []

    init(limit: Int) { self.limit = max(1, limit) }

    var open: Int { idle.count + answering.count }
    var idleCount: Int { idle.count }

    mutating func admit(_ connection: Connection) -> (Ticket, Decision) {
        let ticket = next
        next += 1
        var evicted: Connection?
        if open >= limit {
            // The oldest has the lowest ticket. The scan is over at most `limit` entries, and only at the limit.
            guard let oldest = idle.keys.min() else { return (ticket, .busy) }
            evicted = idle.removeValue(forKey: oldest)
        }
        idle[ticket] = connection
        return (ticket, .admitted(evicted: evicted))
    }

    /// The request line came: the connection can no longer be evicted. False when it was already evicted.
    mutating func startAnswering(_ id: Ticket) -> Bool {
        guard idle.removeValue(forKey: id) != nil else { return false }
        answering.insert(id)
        return true
    }

    mutating func closed(_ id: Ticket) {
        idle[id] = nil
        answering.remove(id)
    }
}

/// One client, on the event loop: reads the request line (deadline, size limit), has the answer computed on the
/// handler threads, writes it (deadline) and closes.
final class ControlConnection: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Sent by the server to a connection it closes to make room for a new one.
    struct Evicted: Sendable {}

    private enum State { case reading, answering, closing }
    private var state = State.reading
    private var request: ByteBuffer?
    private var deadline: Scheduled<Void>?
    private let server: ControlServer
    private let pool: NIOThreadPool
    private let id: ControlAdmission<any Channel>.Ticket

    init(server: ControlServer, pool: NIOThreadPool, id: ControlAdmission<any Channel>.Ticket) {
        self.server = server
        self.pool = pool
        self.id = id
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let channel = context.channel
        let seconds = server.limits.requestSeconds
        deadline = context.eventLoop.scheduleTask(in: Self.amount(seconds)) {
            handler.value.refuse(channel, exit: 64, "no request line within \(seconds) s")
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard state == .reading else { return }  // bytes after the request line are not read
        var bytes = unwrapInboundIn(data)
        let newline = bytes.readableBytesView.firstIndex(of: 0x0A).map { $0 - bytes.readableBytesView.startIndex }
        let taken = newline ?? bytes.readableBytes
        if (request?.readableBytes ?? 0) + taken > server.limits.maxRequestBytes {
            refuse(context.channel, exit: 64, "request longer than \(server.limits.maxRequestBytes) bytes")
            return
        }
        if var slice = bytes.readSlice(length: taken) {
            if request == nil { request = slice } else { request?.writeBuffer(&slice) }
        }
        if newline != nil { answer(context) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is Evicted {
            refuse(context.channel, exit: 3,
                   "closed to make room: \(server.limits.maxConnections) connections were open and this one had sent no request")
        } else if case .inputClosed = event as? ChannelEvent {
            // The client shut its side down: what it sent is the request (a last line need not end with a newline);
            // nothing at all is a probe, closed without an answer.
            guard state == .reading else { return }
            if request.map({ $0.readableBytes > 0 }) == true { answer(context) } else { context.close(promise: nil) }
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // A client that went away (ECONNRESET, EPIPE): nothing to tell it.
        context.close(promise: nil)
    }

    private func answer(_ context: ChannelHandlerContext) {
        deadline?.cancel()
        guard server.admission.withLock({ $0.startAnswering(id) }) else { return }
        state = .answering
        let line = Array((request ?? ByteBuffer()).readableBytesView)
        request = nil
        let server = self.server
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let channel = context.channel
        pool.runIfActive(eventLoop: context.eventLoop) { server.answer(line) }.whenComplete { result in
            switch result {
            case .success(let bytes): handler.value.send(channel, bytes)
            case .failure: handler.value.send(channel, ControlServer.line(.refused(3, "the daemon is stopping")))
            }
        }
    }

    /// An error line instead of an answer, while the request is still being read.
    private func refuse(_ channel: Channel, exit: Int, _ error: String) {
        guard state == .reading else { return }
        deadline?.cancel()
        state = .answering
        send(channel, ControlServer.line(.refused(exit, error)))
    }

    private func send(_ channel: Channel, _ bytes: ByteBuffer) {
        guard state == .answering, channel.isActive else { return }
        state = .closing
        let limit = channel.eventLoop.scheduleTask(in: Self.amount(server.limits.answerSeconds)) { channel.close(promise: nil) }
        channel.writeAndFlush(bytes).whenComplete { _ in
            limit.cancel()
            channel.close(promise: nil)
        }
    }

    private static func amount(_ seconds: Double) -> TimeAmount { .nanoseconds(Int64(seconds * 1e9)) }
}

/// What reading one line from a socket found.
enum LineRead: Equatable {
    /// The line, without its newline.
    case line(Data)
    /// The peer closed the connection after this many bytes and no newline.
    case closed(partial: Int)
    /// The deadline passed after this many bytes and no newline.
    case timedOut(partial: Int)
    /// More than the limit's bytes came and no newline.
    case tooLong
    /// A read failed (errno).
    case failed(Int32)
}

/// Reads one line from a connected socket before `deadline` (monotonic seconds), whatever the peer does: a line
/// of up to `limit` bytes, never more read than that and a chunk, each chunk looked at once (a peer that sends
/// megabytes without a newline costs their reading, not a search of all of them per chunk), and no later than
/// the deadline (a peer that trickles a byte at a time does not hold the reader past it).
func readLine(_ fd: Int32, limit: Int, deadline: Double) -> LineRead {
    var data = Data()
    var chunk = [UInt8](repeating: 0, count: 65_536)
    while true {
        let remaining = deadline - monotonicSeconds()
        guard remaining > 0 else { return .timedOut(partial: data.count) }
        var watched = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ready = poll(&watched, 1, Int32(min(remaining * 1000, 3_600_000).rounded(.up)))
        if ready < 0 {
            if errno == EINTR { continue } // not retryingInterrupts: the time left is taken again
            return .failed(errno)
        }
        if ready == 0 { continue }
        let n = retryingInterrupts { chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } }
        if n < 0 {
            if errno == EAGAIN { continue }
            // A peer that closes with our request unread resets the connection: a hang-up all the same.
            if errno == ECONNRESET { return .closed(partial: data.count) }
            return .failed(errno)
        }
        if n == 0 { return .closed(partial: data.count) }
        // memchr: a generic search costs a debug build's client seconds over an impostor's 64 MiB.
        let end: Int? = chunk.withUnsafeBytes { raw in
            guard let base = raw.baseAddress else { return nil }
            let found = memchr(base, 0x0A, n).map { $0 - UnsafeMutableRawPointer(mutating: base) }
            data.append(base.assumingMemoryBound(to: UInt8.self), count: found ?? n)
            return found
        }
        if end != nil { return data.count <= limit ? .line(data) : .tooLong }
        if data.count > limit { return .tooLong }
    }
}

/// Writes all of `bytes` to a connected socket with MSG_NOSIGNAL: a peer that has gone away is an error (EPIPE)
/// for this call, never a SIGPIPE for the process.
public func sendAll(_ fd: Int32, _ bytes: [UInt8], path: String) throws {
    var offset = 0
    while offset < bytes.count {
        let n = retryingInterrupts {
            bytes.withUnsafeBytes { raw in raw.baseAddress.map { send(fd, $0 + offset, raw.count - offset, Int32(MSG_NOSIGNAL)) } ?? 0 }
        }
        if n < 0 {
            throw SpoolError(operation: "send", path: path, errno: errno)
        }
        offset += n
    }
}

public enum ControlClient {
    public struct NoDaemon: Error, CustomStringConvertible {
        public enum Kind: Sendable {
            /// Nothing listens on the socket.
            case absent
            /// Something listens but did not answer in time (a stopped or hung daemon).
            case silent
            /// Something listens but closed the connection or failed before answering.
            case hungUp
            /// Something answered, but not as a daemon does (not one JSON object on one line).
            case foreign
        }
        public let path: String
        public let reason: String
        public var kind: Kind = .absent
        /// Something listens but did not answer in time, rather than nothing listening.
        public var silent: Bool { kind == .silent }
        public var description: String {
            switch kind {
            case .absent: "no daemon is running on \(path) (\(reason))"
            case .silent, .hungUp: "no daemon answers on \(path) (\(reason))"
            case .foreign: "what answers on \(path) is not an opqueued daemon (\(reason))"
            }
        }
    }

    /// Connects to the control socket; throws `NoDaemon` when nothing listens on it.
    public static func connect(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw NoDaemon(path: path, reason: String(cString: strerror(errno))) }
        let connected = try withUnixAddress(path) { Glibc.connect(fd, $0, $1) }
        guard connected == 0 else {
            let failure = errno
            close(fd)
            let reason = failure == ENOENT || failure == ENOTDIR ? missingSocket(path)
                : failure == ECONNREFUSED ? "stale socket" : String(cString: strerror(failure))
            throw NoDaemon(path: path, reason: reason)
        }
        return fd
    }

    /// Why there is no socket at `path`, for a mistyped `--spool`: its folder is missing, or is no spool.
    static func missingSocket(_ path: String) -> String {
        let folder = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? "."
        var st = stat()
        if stat(folder.isEmpty ? "/" : folder, &st) != 0 || (st.st_mode & S_IFMT) != S_IFDIR {
            return "no socket: there is no folder \(folder); is --spool right?"
        }
        if stat(folder + "/inbox", &st) != 0 {
            return "no socket, and \(folder) is not a spool: it has no inbox/; is --spool right?"
        }
        return "no socket"
    }

    /// An answer whose exit is 0 that is not what the request's answer is (a daemon of another version).
    public struct Unreadable: Error, CustomStringConvertible {
        public let path: String
        public let reason: String
        public var description: String { "the answer of the daemon on \(path) could not be read: \(reason)" }
    }

    /// Sends one request and reads its answer: `.failure` with the daemon's refusal when its exit is not 0. Throws
    /// `NoDaemon` when nothing listens on the socket or does not answer as a daemon does, `Unreadable` when the
    /// answer is not an `Answer`.
    public static func request<Answer: Decodable>(_ path: String, _ request: ControlRequest, as type: Answer.Type,
                                                  timeout: Double = 30) throws -> Result<Answer, ExitAnswer> {
        let line = try exchange(path, JSONSerialization.data(withJSONObject: request.wire), timeout: timeout)
        guard let envelope = try? ControlJSON.decode(ExitAnswer.self, from: line) else { throw foreign(path, line) }
        guard envelope.exit == 0 else { return .failure(envelope) }
        do {
            return .success(try ControlJSON.decode(type, from: line))
        } catch {
            throw Unreadable(path: path, reason: "\(error)")
        }
    }

    static func foreign(_ path: String, _ line: Data) -> NoDaemon {
        let start = String(decoding: line.prefix(40), as: UTF8.self).debugDescription
        return NoDaemon(path: path, reason: "its answer is not a JSON object: \(start)", kind: .foreign)
    }

    /// Sends one request line (`data`, without its newline) and returns the answer's line, once it is a JSON object;
    /// throws `NoDaemon` when nothing listens on the socket or it does not answer as a daemon does.
    public static func exchange(_ path: String, _ data: Data, timeout: Double = 30) throws -> Data {
        let deadline = monotonicSeconds() + max(0, timeout)
        let fd = try connect(path)
        defer { close(fd) }
        var unsent: (any Error)?
        do {
            try sendAll(fd, Array(data) + [0x0A], path: path)
        } catch {
            // What the peer said before it hung up is still read: it tells a daemon from something else.
            unsent = error
        }
        let seconds = formatSeconds(timeout)
        let read = readLine(fd, limit: maxAnswerBytes, deadline: deadline)
        if let unsent, read == .closed(partial: 0) || read == .timedOut(partial: 0) {
            throw NoDaemon(path: path, reason: "connected, but the connection ended before the request was sent: \(unsent)", kind: .hungUp)
        }
        switch read {
        case .line(let line):
            guard (try? ControlJSON.decode(ExitAnswer.self, from: line)) != nil else { throw foreign(path, line) }
            return line
        case .timedOut(0):
            throw NoDaemon(path: path, reason: "connected, but no answer within \(seconds) s: is it stopped (SIGSTOP) or hung?",
                           kind: .silent)
        case .timedOut(let partial):
            throw NoDaemon(path: path,
                           reason: "its answer did not end within \(seconds) s (\(partial) bytes came): is it stopped (SIGSTOP) or hung?",
                           kind: .silent)
        case .closed(0):
            throw NoDaemon(path: path, reason: "connected, but the connection was closed without an answer", kind: .hungUp)
        case .closed(let partial):
            throw NoDaemon(path: path, reason: "the connection was closed after \(partial) bytes of an answer that did not end",
                           kind: .hungUp)
        case .tooLong:
            throw NoDaemon(path: path, reason: "its answer goes on past \(maxAnswerBytes >> 20) MiB without ending", kind: .foreign)
        case .failed(let error):
            throw NoDaemon(path: path, reason: "reading the answer: \(String(cString: strerror(error)))", kind: .hungUp)
        }
    }

    /// The longest answer line taken (a `show` of the largest job a daemon takes is far shorter).
    static let maxAnswerBytes = 64 << 20
}
