// JournalSocket: journald's native protocol (one entry per datagram) over a connected, non-blocking socket, up to
// 64 entries per sendmmsg, for the journal's writer thread.
//
// Why: sd_journal_sendv costs the sender ~15 µs of CPU an entry (a path lookup and a system call each, and a
// sleep and a wake-up whenever journald's queue is full); sent this way ~4 µs, and journald's own cost does not
// grow. When journald's queue is full the writer waits a millisecond and sends again, so it wakes once per
// batch, not once per entry.
// What it does not take: an entry over `largest` bytes, or any entry while journald cannot be reached, goes to
// `otherwise` (sd_journal_sendv: its memfd path for large entries, the console when journald is gone), in order.

import CSystemd
#if canImport(Glibc)
import Glibc
#endif
import SystemCalls

struct JournalSocket {
    let path: String
    private var fd: Int32 = -1
    /// Monotonic time before which no connect is tried again (journald was not listening).
    private var connectAfter = 0.0

    /// Entries sent together at most (opq_send_datagrams' bound).
    static let batch = 64
    /// Bigger entries go to `otherwise`.
    static let largest = 64 * 1024
    /// How long to wait before connecting again after journald could not be reached.
    static let reconnectSeconds = 1.0

    init(path: String = journalSocketPath) { self.path = path }

    /// Sends `entries` in order; those it cannot send are handed to `otherwise`, in their place in the order.
    mutating func send(_ entries: [JournalEntry], otherwise: (JournalEntry) -> Void) {
        var datagrams: [UInt8] = []
        var bounds: [Range<Int>] = []
        var start = 0
        while start < entries.count {
            let end = min(start + Self.batch, entries.count)
            datagrams.removeAll(keepingCapacity: true)
            bounds.removeAll(keepingCapacity: true)
            for entry in entries[start..<end] {
                let first = datagrams.count
                entry.encodeNative(into: &datagrams)
                bounds.append(first..<datagrams.count)
            }
            var next = 0
            while next < bounds.count {
                if bounds[next].count > Self.largest {
                    otherwise(entries[start + next])
                    next += 1
                    continue
                }
                let sent = connected() ? sendBatch(datagrams, bounds[next...]) : -ENOTCONN
                switch sent {
                case 1...: next += Int(sent)
                case -EAGAIN, -EWOULDBLOCK, 0:
                    // journald's queue is full: let it take a few before sending again.
                    usleep(1000)
                case -EINTR: continue
                case -EMSGSIZE, -ENOBUFS:
                    otherwise(entries[start + next])
                    next += 1
                default:
                    // Not listening (stopped, or restarted: a new socket at the same path): connect again once
                    // at once; while that fails, entries go the other way.
                    disconnect()
                    if !connected() {
                        otherwise(entries[start + next])
                        next += 1
                    }
                }
            }
            start = end
        }
    }

    /// `datagrams[range]` for each range, from the first, in one call: how many went, or -errno.
    private func sendBatch(_ datagrams: [UInt8], _ ranges: ArraySlice<Range<Int>>) -> Int32 {
        datagrams.withUnsafeBytes { raw -> Int32 in
            guard let base = raw.baseAddress else { return 0 }
            // Up to the first entry too large to send this way (the caller hands that one over).
            let vectors = ranges.prefix(Self.batch).prefix { $0.count <= Self.largest }.map {
                iovec(iov_base: UnsafeMutableRawPointer(mutating: base + $0.lowerBound), iov_len: $0.count)
            }
            return vectors.withUnsafeBufferPointer { opq_send_datagrams(fd, $0.baseAddress, UInt32($0.count)) }
        }
    }

    /// Whether the socket is connected, connecting it when it is not and the last try is long enough ago.
    private mutating func connected() -> Bool {
        if fd >= 0 { return true }
        let now = monotonicSeconds()
        guard now >= connectAfter else { return false }
        let s = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard s >= 0 else { return false }
        guard (try? withUnixAddress(path) { connect(s, $0, $1) }) == 0 else {
            close(s)
            connectAfter = now + Self.reconnectSeconds
            return false
        }
        // As libsystemd does: room for large entries and for bursts (the forced size needs CAP_NET_ADMIN).
        var size: Int32 = 8 << 20
        if setsockopt(s, SOL_SOCKET, SO_SNDBUFFORCE, &size, socklen_t(MemoryLayout<Int32>.size)) != 0 {
            _ = setsockopt(s, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        fd = s
        return true
    }

    private mutating func disconnect() {
        if fd >= 0 { close(fd) }
        fd = -1
    }
}

extension JournalEntry {
    /// The entry as journald's native protocol has it: `NAME=value\n` per field, or, for a value with a newline,
    /// `NAME\n`, its length as 64-bit little-endian, the value and `\n`.
    func encodeNative(into out: inout [UInt8]) {
        bytes.withUnsafeBufferPointer { b in
            var start = 0
            for end in ends {
                let field = UnsafeBufferPointer(rebasing: b[start..<end])
                let equals = field.firstIndex(of: UInt8(ascii: "=")) ?? field.count
                let value = UnsafeBufferPointer(rebasing: field[min(equals + 1, field.count)...])
                if !value.contains(UInt8(ascii: "\n")) {
                    out.append(contentsOf: field)
                } else {
                    out.append(contentsOf: UnsafeBufferPointer(rebasing: field[..<equals]))
                    out.append(UInt8(ascii: "\n"))
                    withUnsafeBytes(of: UInt64(value.count).littleEndian) { out.append(contentsOf: $0) }
                    out.append(contentsOf: value)
                }
                out.append(UInt8(ascii: "\n"))
                start = end
            }
        }
    }
}
