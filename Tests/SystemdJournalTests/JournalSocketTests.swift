// JournalSocket (journald's native protocol, many entries per system call) against a socket of the test's own that
// stands for journald — a full queue, a restart, no journald at all — and the whole writer against the real journald.

import Foundation
import Logging
import Synchronization
import SystemCalls
import Testing
import TestSupport
@testable import SystemdJournal

/// A datagram socket bound where journald's would be: what arrives, decoded as journald decodes it.
private final class FakeJournald {
    let path: String
    private(set) var fd: Int32 = -1

    init(path: String) throws {
        self.path = path
        try bind()
    }

    func bind() throws {
        unlink(path)
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0, (try withUnixAddress(path) { Glibc.bind(fd, $0, $1) }) == 0 else {
            throw SupportFailure("cannot bind \(path): errno \(errno)")
        }
    }

    /// Gone, as a stopped journald: the socket closed and its file removed.
    func stop() {
        close(fd)
        fd = -1
        unlink(path)
    }

    /// Every entry that arrives until none has for `quiet` seconds, each as its fields.
    func receive(quiet: Double = 0.3) -> [[String: String]] {
        var entries: [[String: String]] = []
        var buffer = [UInt8](repeating: 0, count: 256 * 1024)
        while true {
            var ready = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&ready, 1, Int32(quiet * 1000)) == 1 else { return entries }
            let n = recv(fd, &buffer, buffer.count, 0)
            if n > 0 { entries.append(Self.decode(buffer[..<n])) }
        }
    }

    /// journald's reading of a native datagram: `NAME=value\n`, or `NAME\n`, a 64-bit length, the value, `\n`.
    static func decode(_ bytes: ArraySlice<UInt8>) -> [String: String] {
        var fields: [String: String] = [:]
        var i = bytes.startIndex
        while i < bytes.endIndex {
            let lineEnd = bytes[i...].firstIndex(of: 10) ?? bytes.endIndex
            if let equals = bytes[i..<lineEnd].firstIndex(of: UInt8(ascii: "=")) {
                fields[String(decoding: bytes[i..<equals], as: UTF8.self)] = String(decoding: bytes[(equals + 1)..<lineEnd], as: UTF8.self)
                i = lineEnd + 1
                continue
            }
            let name = String(decoding: bytes[i..<lineEnd], as: UTF8.self)
            var length: UInt64 = 0
            for k in 0..<8 { length |= UInt64(bytes[lineEnd + 1 + k]) << (8 * UInt64(k)) }
            let start = lineEnd + 9
            fields[name] = String(decoding: bytes[start..<(start + Int(length))], as: UTF8.self)
            i = start + Int(length) + 1
        }
        return fields
    }
}

private func entry(_ message: String, _ more: [(String, String)] = []) -> JournalEntry {
    var e = JournalEntry()
    e.add("MESSAGE", message)
    e.add("PRIORITY", "6")
    for (name, value) in more { e.add(name, value) }
    return e
}

private func temporarySocketPath() -> String {
    let folder = NSTemporaryDirectory() + "opq-journal-socket-\(UUID().uuidString.prefix(8))"
    try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    return folder + "/socket"
}

@Suite struct JournalSocketTests {
    @Test func entriesArriveWholeAndInOrderAndTheLargeOnesGoTheOtherWay() throws {
        let journald = try FakeJournald(path: temporarySocketPath())
        defer { journald.stop() }
        var entries = (0..<300).map { entry("m\($0)", [("OPQ_JOB", "job=\($0)")]) }
        entries[7] = entry("two\nlines\n", [("OPQ_ERROR", "a\nb")])
        entries[150] = entry(String(repeating: "x", count: JournalSocket.largest + 1))
        // Sent beside the reading: whether 299 entries fit the socket's buffers unread depends on the kernel's
        // accounting (each datagram is charged more than its bytes), and a sender that does not fit waits for a reader.
        let otherwise = Mutex<[String]>([])
        let done = DispatchSemaphore(value: 0)
        let path = journald.path, sent = entries
        Thread.detachNewThread {
            var socket = JournalSocket(path: path)
            socket.send(sent, otherwise: { entry in otherwise.withLock { $0.append(entry.fields[0]) } })
            done.signal()
        }
        let received = journald.receive()
        #expect(done.wait(timeout: .now() + 10) == .success)
        let other = otherwise.withLock { $0 }
        #expect(other.count == 1 && other.first?.count == "MESSAGE=".count + JournalSocket.largest + 1)
        #expect(received.count == 299)
        #expect(received.map { $0["MESSAGE"] ?? "" } == entries.indices.filter { $0 != 150 }.map { $0 == 7 ? "two\nlines\n" : "m\($0)" })
        #expect(received[7]["OPQ_ERROR"] == "a\nb")
        #expect(received[8]["OPQ_JOB"] == "job=8", "a value may hold '='")
    }

    @Test func aFullQueueIsWaitedOutNotDropped() throws {
        let journald = try FakeJournald(path: temporarySocketPath())
        defer { journald.stop() }
        // More than a datagram socket's queue holds (net.unix.max_dgram_qlen, 512 by default), sent while nothing reads.
        let entries = (0..<3000).map { entry("m\($0)") }
        let done = DispatchSemaphore(value: 0)
        let wentOtherwise = Mutex(0)
        let path = journald.path
        Thread.detachNewThread {
            var socket = JournalSocket(path: path)
            socket.send(entries, otherwise: { _ in wentOtherwise.withLock { $0 += 1 } })
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 0.5) == .timedOut, "the sender waits while the queue is full")
        let received = journald.receive()
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(wentOtherwise.withLock { $0 } == 0)
        #expect(received.map { $0["MESSAGE"] ?? "" } == (0..<3000).map { "m\($0)" })
    }

    @Test func aRestartedJournaldIsFoundAgainAndWithoutOneEntriesGoTheOtherWay() throws {
        let journald = try FakeJournald(path: temporarySocketPath())
        var socket = JournalSocket(path: journald.path)
        var otherwise: [String] = []
        socket.send((0..<10).map { entry("a\($0)") }, otherwise: { otherwise.append($0.fields[0]) })
        #expect(journald.receive().count == 10)
        // journald restarted: a new socket at the same path; the connected one is refused.
        journald.stop()
        try journald.bind()
        socket.send((0..<10).map { entry("b\($0)") }, otherwise: { otherwise.append($0.fields[0]) })
        #expect(journald.receive().map { $0["MESSAGE"] ?? "" } == (0..<10).map { "b\($0)" })
        #expect(otherwise.isEmpty)
        journald.stop()
        socket.send((0..<5).map { entry("c\($0)") }, otherwise: { otherwise.append($0.fields[0]) })
        #expect(otherwise == (0..<5).map { "MESSAGE=c\($0)" })
    }

    /// The writer end to end: what the handler logs reaches the real journald whole and in order.
    @Test func theRealJournaldStoresEveryEntryInOrder() throws {
        try ensureJournald()
        let identifier = "opq-journal-test-\(UUID().uuidString.prefix(8))"
        let since = Int(Date().timeIntervalSince1970) - 1
        let logger = Logger(label: "test") { _ in JournalLogHandler(identifier: identifier) }
        for i in 0..<2000 {
            logger.info(i == 1000 ? "line one\nline two" : "entry \(i)", metadata: ["OPQ_JOB": .string("n\(i)")])
        }
        #expect(JournalWriter.shared.drain(seconds: 10))
        var entries: [[String: Any]] = []
        let arguments = ["-t", identifier, "--since", "@\(since)", "-o", "json", "--no-pager", "-q"]
        _ = pollUntil(10) { () -> Bool? in
            let out = (try? runProgram("/usr/bin/journalctl", arguments))?.stdout ?? ""
            entries = out.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            return entries.count >= 2000 ? true : nil
        }
        #expect(entries.count == 2000)
        #expect(entries.map { $0["OPQ_JOB"] as? String ?? "" } == (0..<2000).map { "n\($0)" })
        #expect(entries.count > 1000 && entries[1000]["MESSAGE"] as? String == "line one\nline two")
        #expect(entries.first?["CODE_FUNC"] as? String == "theRealJournaldStoresEveryEntryInOrder()")
    }
}
