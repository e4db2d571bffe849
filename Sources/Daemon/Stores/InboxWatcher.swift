// InboxWatcher: inotify on the inbox, as a hint only (SPEC §2, "a missed event never loses a file").
// Names reported as closed after writing or moved in are passed on as claimable at once; a queue overflow, the
// start and a periodic timer (rescanInterval without events) ask for the folder to be read whole. Every event
// batch also leads to a whole read within the daemon's rescan interval.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

public final class InboxWatcher: @unchecked Sendable {
    private let path: String
    private let rescanInterval: Double
    /// Names reported, and whether they are all that arrived (false: read the folder whole).
    private let onChange: @Sendable (_ names: [String], _ complete: Bool) -> Void
    private var fd: Int32 = -1
    private let stopLock = NSLock()
    private var stopped = false

    public init(path: String, rescanInterval: Double = 2, onChange: @escaping @Sendable (_ names: [String], _ complete: Bool) -> Void) {
        self.path = path
        self.rescanInterval = rescanInterval
        self.onChange = onChange
    }

    /// Adds the watch, then reports one rescan (what arrived before the watch is not missed).
    public func start() throws {
        fd = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        guard fd >= 0 else { throw SpoolError(operation: "inotify_init1", path: path, errno: errno) }
        guard inotify_add_watch(fd, path, Self.events) >= 0 else {
            throw SpoolError(operation: "inotify_add_watch", path: path, errno: errno)
        }
        onChange([], false)
        let thread = Thread { [self] in run() }
        thread.name = "inbox-watcher"
        thread.start()
    }

    private static let events = UInt32(IN_CLOSE_WRITE | IN_MOVED_TO)

    public func stop() {
        stopLock.withLock { stopped = true }
    }

    private func run() {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        var lastScan = Date()
        // The inbox folder was removed (IN_IGNORED: the watch went with it): the watch is added again at each
        // timer tick until the folder is back (the daemon makes it again), then a whole read is asked for.
        var watching = true
        while !stopLock.withLock({ stopped }) {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&pfd, 1, 200)
            var names: [String] = []
            var changed = false
            var overflowed = false
            if ready > 0 {
                let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if n > 0 {
                    changed = true
                    var offset = 0
                    while offset + MemoryLayout<inotify_event>.size <= n {
                        let (mask, length) = buffer.withUnsafeBytes { raw -> (UInt32, Int) in
                            let mask = raw.load(fromByteOffset: offset + 4, as: UInt32.self)
                            let length = raw.load(fromByteOffset: offset + 12, as: UInt32.self)
                            return (mask, Int(length))
                        }
                        let nameStart = offset + MemoryLayout<inotify_event>.size
                        if mask & UInt32(IN_Q_OVERFLOW) != 0 { overflowed = true }
                        if mask & UInt32(IN_IGNORED) != 0 { watching = false }
                        if length > 0, nameStart + length <= n, mask & UInt32(IN_Q_OVERFLOW) == 0 {
                            let bytes = buffer[nameStart ..< nameStart + length].prefix { $0 != 0 }
                            names.append(String(decoding: bytes, as: UTF8.self))
                        }
                        offset = nameStart + length
                    }
                }
            }
            if changed || Date().timeIntervalSince(lastScan) >= rescanInterval {
                lastScan = Date()
                if !watching, inotify_add_watch(fd, path, Self.events) >= 0 {
                    watching = true
                    overflowed = true
                }
                onChange(names, changed && !overflowed)
            }
        }
        close(fd)
    }
}
