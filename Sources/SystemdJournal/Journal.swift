// Logging to journald (its native protocol, from a thread of its own: JournalWriter, JournalSocket) and to the
// console, as swift-log handlers.
//
// Every daemon event is one entry: MESSAGE, PRIORITY, SYSLOG_IDENTIFIER=opqueued, CODE_FILE/LINE/FUNC
// (Swift cannot use libsystemd's location macros, so they are added here), the OPQ_* metadata as fields,
// a MESSAGE_ID per (OPQ_EVENT, OPQ_STATE) pair, documented in systemd/opqueued.catalog, and in a cluster
// OPQ_NODE, the node logging (SPEC §8), set once at start through `Journal.node`.

import CSystemd
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Logging
import SystemCalls

public enum MessageIDs {
    /// Every (event, state) pair the daemon logs (SPEC §4).
    public static let pairs: [(event: String, state: String)] =
        ["pending", "ready", "executing", "retrying", "succeeded", "failed", "cancelled"].map { ("operation", $0) }
        + ["received", "accepted", "delayed", "skipped", "rejected", "claimed", "lost", "finished"].map { ("job", $0) }
        + ["ready", "reloading", "stopping"].map { ("daemon", $0) }
        + ["suspended", "resumed"].map { ("queue", $0) }
        + ["connected", "disconnected"].map { ("cluster", $0) }

    /// 32 lowercase hex digits, stable across builds: two FNV-1a-64 hashes of "opqueued/event/state".
    public static func id(event: String, state: String) -> String {
        let bytes = Array("opqueued/\(event)/\(state)".utf8)
        func fnv(_ basis: UInt64) -> UInt64 {
            var h = basis
            for b in bytes { h = (h ^ UInt64(b)) &* 0x0000_0100_0000_01B3 }
            return h
        }
        let hex = String(fnv(0xCBF2_9CE4_8422_2325), radix: 16) + "|" + String(fnv(0x8422_2325_CBF2_9CE4), radix: 16)
        return hex.split(separator: "|").map { String(repeating: "0", count: 16 - $0.count) + $0 }.joined()
    }

    /// event → state → MESSAGE_ID (two lookups, no key to build per entry).
    static let table: [String: [String: String]] = Dictionary(grouping: pairs, by: \.event).mapValues { pairs in
        Dictionary(uniqueKeysWithValues: pairs.map { ($0.state, id(event: $0.event, state: $0.state)) })
    }

    /// The MESSAGE_ID of an event's (OPQ_EVENT, OPQ_STATE) metadata, if it is one of the pairs: the journal and the
    /// console both take it from here, so the two targets never disagree.
    static func id(for metadata: Logger.Metadata) -> String? {
        guard case .string(let event)? = metadata["OPQ_EVENT"], case .string(let state)? = metadata["OPQ_STATE"] else { return nil }
        return table[event]?[state]
    }
}

/// What every entry carries whatever logged it.
public enum Journal {
    private static let lock = NSLock()
    nonisolated(unsafe) private static var _node: String?

    /// The cluster node's name (SPEC §8): when set, every entry, on both targets, carries `OPQ_NODE=<node>`
    /// (unless the event names one itself). Set once at start, when the configuration has `cluster`;
    /// nil (the default) without a cluster.
    public static var node: String? {
        get { lock.withLock { _node } }
        set { lock.withLock { _node = newValue } }
    }

    /// The event's metadata merged over the handler's, with OPQ_NODE added when a node is set.
    static func fields(_ handler: Logger.Metadata, _ event: Logger.Metadata?) -> Logger.Metadata {
        var (all, node) = parts(handler, event)
        if let node { all["OPQ_NODE"] = .string(node) }
        return all
    }

    /// `fields` in two parts, for the handlers, which write every entry: the merged metadata (the event's own
    /// dictionary when the handler has none, as for every daemon logger: no copy) and the node to add as
    /// `OPQ_NODE`, nil when none is set or the metadata names one (adding it would copy the dictionary).
    static func parts(_ handler: Logger.Metadata, _ event: Logger.Metadata?) -> (metadata: Logger.Metadata, node: String?) {
        var all = event ?? [:]
        if !handler.isEmpty {
            all = handler
            if let event { all.merge(event) { $1 } }
        }
        guard let node, all["OPQ_NODE"] == nil else { return (all, nil) }
        return (all, node)
    }
}

/// journald field name rules: uppercase letters, digits and `_`, not starting with `_` or a digit.
func journalFieldName(_ key: String) -> String? {
    func valid(_ name: String) -> Bool {
        guard let first = name.utf8.first, first != UInt8(ascii: "_"), !(first >= 0x30 && first <= 0x39), name.utf8.count <= 64 else {
            return false
        }
        return name.utf8.allSatisfy { ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == UInt8(ascii: "_") }
    }
    // The daemon's own keys (OPQ_*) are valid as they are: no copy.
    if valid(key) { return key }
    let upper = key.uppercased()
    return valid(upper) ? upper : nil
}

func syslogPriority(_ level: Logger.Level) -> Int {
    switch level {
    case .trace, .debug: 7
    case .info: 6
    case .notice: 5
    case .warning: 4
    case .error: 3
    case .critical: 2
    }
}

/// Where journald listens for native-protocol datagrams.
public let journalSocketPath = "/run/systemd/journal/socket"

/// Whether a journald answers on `path` now: a stale socket file left by a journald that is gone refuses the connect.
public func journalIsListening(at path: String = journalSocketPath) -> Bool {
    let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    return (try? withUnixAddress(path) { connect(fd, $0, $1) }) == 0
}

public struct JournalLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level = .info
    public var metadataProvider: Logger.MetadataProvider?
    let identifier: String

    public init(identifier: String = "opqueued") { self.identifier = identifier }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var entry = JournalEntry()
        entry.add("MESSAGE", event.message.description)
        entry.add("PRIORITY", String(syslogPriority(event.level)))
        entry.add("SYSLOG_IDENTIFIER", identifier)
        entry.add("CODE_FILE", event.file)
        entry.add("CODE_LINE", String(event.line))
        entry.add("CODE_FUNC", event.function)
        let (all, node) = Journal.parts(metadata, event.metadata)
        if let id = MessageIDs.id(for: all) { entry.add("MESSAGE_ID", id) }
        for (key, value) in all {
            guard let name = journalFieldName(key) else { continue }
            if case .string(let s) = value { entry.add(name, s) } else { entry.add(name, value.description) }
        }
        if let node { entry.add("OPQ_NODE", node) }
        // Sent by the journal's own thread (JournalWriter, below); a critical entry, often the last before the
        // process ends, is waited for.
        JournalWriter.shared.enqueue(entry)
        if event.level == .critical { JournalWriter.shared.drain(seconds: JournalWriter.exitWait) }
    }
}

/// One `key=value` line per event on stderr, with the same fields as the journal.
public struct ConsoleLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level = .info
    public var metadataProvider: Logger.MetadataProvider?
    static let lock = NSLock()

    public init() {}

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        let (all, node) = Journal.parts(metadata, event.metadata)
        Self.write(Self.bytes(level: event.level, message: event.message.description, metadata: all, node: node))
    }

    /// The event's line: PRIORITY, MESSAGE_ID, the fields in name order, MESSAGE last.
    static func line(level: Logger.Level, message: String, metadata all: Logger.Metadata) -> String {
        String(decoding: bytes(level: level, message: message, metadata: all), as: UTF8.self)
    }

    /// The line's bytes, built in one buffer (values quoted byte by byte: the line is written as it is built);
    /// `node`, if any, is one more field, `OPQ_NODE` (see `Journal.parts`).
    static func bytes(level: Logger.Level, message: String, metadata all: Logger.Metadata, node: String? = nil) -> [UInt8] {
        var line: [UInt8] = []
        line.reserveCapacity(320)
        line += "PRIORITY=".utf8
        line += String(syslogPriority(level)).utf8
        if let id = MessageIDs.id(for: all) {
            line += " MESSAGE_ID=".utf8
            line += id.utf8
        }
        var fields = all.map { (key: $0.key, value: $0.value) }
        if let node { fields.append((key: "OPQ_NODE", value: .string(node))) }
        fields.sort { $0.key < $1.key }
        for (key, value) in fields {
            guard let name = journalFieldName(key) else { continue }
            line.append(UInt8(ascii: " "))
            line += name.utf8
            line.append(UInt8(ascii: "="))
            if case .string(let s) = value { quote(s, into: &line) } else { quote(value.description, into: &line) }
        }
        line += " MESSAGE=".utf8
        quote(message, into: &line)
        line.append(UInt8(ascii: "\n"))
        return line
    }

    /// One whole line on stderr (fd 2), under a lock so that lines of several threads never interleave. Errors
    /// drop the line, never the daemon: stderr may be a pipe whose reader is gone (EPIPE, SIGPIPE being ignored),
    /// a full disk, a closed descriptor.
    static func write(_ line: [UInt8]) {
        line.withUnsafeBufferPointer { bytes in
            guard var p = bytes.baseAddress else { return }
            var left = bytes.count
            lock.lock()
            defer { lock.unlock() }
            while left > 0 {
                let n = retryingInterrupts { Glibc.write(2, p, left) }
                if n < 0 { return }
                p += n
                left -= n
            }
        }
    }

    /// `s` as it is when it has no space, control character, quote or backslash (and is not empty); else in
    /// double quotes with `"`, `\\`, newline and tab escaped.
    static func quote(_ s: String, into out: inout [UInt8]) {
        var s = s
        s.withUTF8 { bytes in
            if !bytes.isEmpty, bytes.allSatisfy({ $0 > 0x20 && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") && $0 < 0x7F }) {
                out.append(contentsOf: bytes)
                return
            }
            out.append(UInt8(ascii: "\""))
            for byte in bytes {
                switch byte {
                case UInt8(ascii: "\""): out += [UInt8(ascii: "\\"), UInt8(ascii: "\"")]
                case UInt8(ascii: "\\"): out += [UInt8(ascii: "\\"), UInt8(ascii: "\\")]
                case UInt8(ascii: "\n"): out += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
                case UInt8(ascii: "\t"): out += [UInt8(ascii: "\\"), UInt8(ascii: "t")]
                default: out.append(byte)
                }
            }
            out.append(UInt8(ascii: "\""))
        }
    }
}

/// systemd's notification socket (no-op outside a Type=notify service).
public enum SystemdNotifier {
    public static func notify(_ state: String) {
        _ = sd_notify(0, state)
    }

    /// Half the watchdog interval, when the service manager asked for pings.
    public static func watchdogInterval() -> Double? {
        var usec: UInt64 = 0
        guard sd_watchdog_enabled(0, &usec) > 0, usec > 0 else { return nil }
        return Double(usec) / 2e6
    }
}

// MARK: The journal's writer
//
// The threads that log (the engine's delivery thread above all) only build an entry and queue
// it; one thread of its own hands the entries to journald (JournalSocket, many in one system call; what that cannot
// send through sd_journal_sendv), in the order they were queued.
//
// Why: each sendv is a system call that wakes journald, and under load a thread that makes seven of them per job
// spends its time there instead of running jobs. Queued, the writer sends whatever has gathered while it was busy,
// and lets a few entries gather first (at most `gatherSeconds`): journald spends about half as much per entry on a
// burst as on the same entries each with a wake-up of their own.
// Nothing is dropped: the queue is bounded, and a thread that finds it full waits for room. Entries still queued at
// exit are sent before the process ends (an atexit handler waits for the queue to empty, at most a few seconds, in
// case journald is stuck), and a critical entry is waited for before `log` returns.

/// One journal entry: its fields (`NAME=value`) one after another in `bytes`, `ends[i]` where field i ends.
struct JournalEntry: Sendable {
    var bytes: [UInt8] = []
    var ends: [Int] = []

    init() { bytes.reserveCapacity(384); ends.reserveCapacity(16) }

    /// Appends the field `name=value`.
    mutating func add(_ name: String, _ value: String) {
        var name = name, value = value
        name.withUTF8 { bytes.append(contentsOf: $0) }
        bytes.append(UInt8(ascii: "="))
        value.withUTF8 { bytes.append(contentsOf: $0) }
        ends.append(bytes.count)
    }

    /// The fields as strings (for the console line when journald cannot be reached).
    var fields: [String] {
        var start = 0
        return ends.map { end in
            defer { start = end }
            return String(decoding: bytes[start..<end], as: UTF8.self)
        }
    }

    /// sd_journal_sendv over the fields; its result (negative errno on failure).
    func send() -> Int32 {
        bytes.withUnsafeBytes { raw -> Int32 in
            guard let base = raw.baseAddress else { return 0 }
            var start = 0
            var iovecs = [iovec]()
            iovecs.reserveCapacity(ends.count)
            for end in ends {
                iovecs.append(iovec(iov_base: UnsafeMutableRawPointer(mutating: base + start), iov_len: end - start))
                start = end
            }
            return iovecs.withUnsafeBufferPointer { sd_journal_sendv($0.baseAddress, Int32($0.count)) }
        }
    }
}

final class JournalWriter: @unchecked Sendable {
    static let shared = JournalWriter()
    /// Entries queued at most; a thread that finds the queue full waits.
    static let capacity = 8192
    /// How long the exit waits for the queue to empty.
    static let exitWait = 5.0
    /// How long the writer lets entries gather before it sends them, unless `gatherCount` are queued or someone
    /// waits for them (`drain`, a critical entry, the exit). Each batch costs the writer two wake-ups (the first entry,
    /// the end of the wait): at 10 ms, commands one after another (~2 ms each, three entries) share them by five.
    static let gatherSeconds = 0.010
    static let gatherCount = 32

    private let condition = NSCondition()
    private var queue: [JournalEntry] = []
    /// The writer is sending a batch taken from the queue.
    private var sending = false
    /// The writer waits for entries (a producer wakes it).
    private var idle = false
    /// The writer lets entries gather (a producer wakes it once `gatherCount` are queued).
    private var gathering = false
    /// Callers of `drain` waiting: the writer sends at once.
    private var draining = 0

    private init() {
        queue.reserveCapacity(256)
        let thread = Thread { [self] in run() }
        thread.name = "opqueued.journal"
        thread.start()
        atexit { _ = JournalWriter.shared.drain(seconds: JournalWriter.exitWait) }
    }

    /// Queues `entry`, waiting for room when the queue is full.
    func enqueue(_ entry: JournalEntry) {
        condition.lock()
        while queue.count >= Self.capacity { condition.wait() }
        queue.append(entry)
        if idle || (gathering && queue.count >= Self.gatherCount) {
            idle = false
            condition.broadcast()
        }
        condition.unlock()
    }

    /// Waits until every entry queued so far has been handed to journald, at most `seconds`; whether it was.
    @discardableResult
    func drain(seconds: Double) -> Bool {
        let deadline = Date(timeIntervalSinceNow: seconds)
        condition.lock()
        draining += 1
        condition.broadcast()
        defer {
            draining -= 1
            condition.unlock()
        }
        while !queue.isEmpty || sending {
            if !condition.wait(until: deadline) { return queue.isEmpty && !sending }
        }
        return true
    }

    private func run() {
        var socket = JournalSocket()
        var batch: [JournalEntry] = []
        batch.reserveCapacity(256)
        while true {
            condition.lock()
            sending = false
            // Room again, and the queue perhaps empty: for producers waiting on a full queue, and for `drain`.
            condition.broadcast()
            while queue.isEmpty {
                idle = true
                condition.wait()
            }
            idle = false
            if queue.count < Self.gatherCount && draining == 0 {
                gathering = true
                let until = Date(timeIntervalSinceNow: Self.gatherSeconds)
                while queue.count < Self.gatherCount && draining == 0 && condition.wait(until: until) {}
                gathering = false
            }
            swap(&batch, &queue)
            sending = true
            condition.unlock()
            socket.send(batch, otherwise: Self.deliver)
            batch.removeAll(keepingCapacity: true)
        }
    }

    /// Sends one entry; when journald cannot take it, it goes to the console so that a person can still read it.
    static func deliver(_ entry: JournalEntry) {
        let sent = entry.send()
        guard sent < 0 else { return }
        var line = Array("SD_JOURNAL_SENDV_ERRNO=\(-sent)".utf8)
        for field in entry.fields {
            line.append(UInt8(ascii: " "))
            ConsoleLogHandler.quote(field, into: &line)
        }
        line.append(UInt8(ascii: "\n"))
        ConsoleLogHandler.write(line)
    }
}
