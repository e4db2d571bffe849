// The optional HTTP listener for Prometheus (`metrics = { listen = "HOST:PORT"; }`, SPEC §6), on SwiftNIO.
//
// It answers GET /metrics (and HEAD) with the text exposition and nothing else: every other path is 404,
// every other method 405, and each connection is closed after its one answer.
// What it trusts: nothing a client sends. A request is cut at 16 KiB (a scrape is a few hundred bytes),
// a connection at 10 s whether or not anything comes (a client that connects and stalls, or trickles
// bytes, is dropped), at most 64 connections are served at once (the rest are closed at accept), and
// garbage gets a 400 from NIO's HTTP error handler before the connection is closed. Writes to a client
// that hung up fail on that connection only: on Linux, NIO sets SIGPIPE to ignored, process-wide, the
// first time it makes a socket (so a child process started later inherits SIG_IGN unless it is reset).

import Foundation
import JobModel
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

public final class MetricsServer: Sendable {
    public typealias Render = @Sendable () -> String

    /// Limits against clients that stall, flood or pile up.
    static let maxRequestBytes = 16 * 1024
    static let connectionSeconds: Int64 = 10
    static let maxConnections = 64

    private let group: MultiThreadedEventLoopGroup
    private let channel: any Channel
    private let reserve: DescriptorReserve
    /// The address actually bound (`127.0.0.1:9464`, `[::1]:9464`), with the port chosen when 0 was asked.
    public let boundAddress: String

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Binds `listen` (`HOST:PORT`, `[IPV6]:PORT`) and starts serving.
    public init(listen: String, render: @escaping Render) throws {
        guard let (host, port) = splitListenAddress(listen) else {
            throw Failure(description: "metrics.listen: '\(listen)' is not HOST:PORT")
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let open = Mutex(0)
        let reserve = DescriptorReserve.shared
        reserve.use()
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 64)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { [reserve] channel in
                // Out of descriptors, a scrape takes the one kept in reserve (taken again when a connection closes),
                // rather than leave the loop retrying accept on a socket that stays readable.
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(DescriptorShortage(reserve))
                }
            }
            .childChannelInitializer { channel in
                let admitted = open.withLock { count -> Bool in
                    guard count < MetricsServer.maxConnections else { return false }
                    count += 1
                    return true
                }
                guard admitted else { return channel.close() }
                channel.closeFuture.whenComplete { _ in
                    open.withLock { $0 -= 1 }
                    reserve.retake()
                }
                // Whatever the client does, the connection ends within the limit.
                channel.eventLoop.scheduleTask(in: .seconds(MetricsServer.connectionSeconds)) { channel.close(promise: nil) }
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(RequestSizeLimit(limit: MetricsServer.maxRequestBytes))
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(MetricsHandler(render: render))
                }
            }
            .childChannelOption(.allowRemoteHalfClosure, value: false)
        do {
            channel = try bootstrap.bind(host: host, port: port).wait()
        } catch {
            try? group.syncShutdownGracefully()
            reserve.close()
            throw Failure(description: "metrics.listen: cannot listen on \(listen): \(error)")
        }
        self.group = group
        self.reserve = reserve
        let bound = channel.localAddress
        let boundPort = bound?.port ?? port
        if let ip = bound?.ipAddress {
            boundAddress = ip.contains(":") ? "[\(ip)]:\(boundPort)" : "\(ip):\(boundPort)"
        } else {
            boundAddress = "\(host):\(boundPort)"
        }
    }

    public func stop() {
        try? channel.close().wait()
        try? group.syncShutdownGracefully()
        reserve.close()
    }
}

/// Closes a connection whose request grows past the limit (headers that never end, a body nobody asked for).
private final class RequestSizeLimit: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    private let limit: Int
    private var seen = 0

    init(limit: Int) { self.limit = limit }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        seen += unwrapInboundIn(data).readableBytes
        guard seen <= limit else {
            context.close(promise: nil)
            return
        }
        context.fireChannelRead(data)
    }
}

/// One request, one answer, then close.
private final class MetricsHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart
    private let render: MetricsServer.Render
    private var head: HTTPRequestHead?
    private var answered = false

    init(render: @escaping MetricsServer.Render) { self.render = render }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let h): head = h
        case .body: break
        case .end:
            guard let head, !answered else { return }
            answered = true
            answer(context, head)
        }
    }

    private func answer(_ context: ChannelHandlerContext, _ head: HTTPRequestHead) {
        let path = head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
        guard head.method == .GET || head.method == .HEAD else {
            return respond(context, .methodNotAllowed, "only GET and HEAD\n", extra: [("Allow", "GET, HEAD")], includeBody: true)
        }
        guard path == "/metrics" else {
            return respond(context, .notFound, "opqueued serves its metrics on /metrics\n", includeBody: head.method == .GET)
        }
        // Rendering reads the engine (at most 20 ms); it runs off the event loop.
        let loop = context.eventLoop
        let bound = NIOLoopBound(context, eventLoop: loop)
        let render = self.render
        let includeBody = head.method == .GET
        DispatchQueue.global().async {
            let text = render()
            loop.execute {
                self.respond(bound.value, .ok, text, contentType: "text/plain; version=0.0.4; charset=utf-8", includeBody: includeBody)
            }
        }
    }

    private func respond(_ context: ChannelHandlerContext, _ status: HTTPResponseStatus, _ body: String,
                         contentType: String = "text/plain; charset=utf-8", extra: [(String, String)] = [], includeBody: Bool) {
        let bytes = context.channel.allocator.buffer(string: body)
        var headers = HTTPHeaders([("Content-Type", contentType), ("Content-Length", String(bytes.readableBytes)), ("Connection", "close")])
        headers.add(contentsOf: extra)
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
        if includeBody { context.write(wrapOutboundOut(.body(.byteBuffer(bytes))), promise: nil) }
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
    }
}

// The handler's state lives on its channel's event loop; the only hop off it goes back through `loop.execute`.
extension MetricsHandler: @unchecked Sendable {}
