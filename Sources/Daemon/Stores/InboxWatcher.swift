// InboxWatcher: inotify on the inbox, as a hint only (SPEC §2, "a missed event never loses a file").
// Names reported as closed after writing or moved in are passed on as claimable at once; a queue overflow, the
// start and a periodic timer (rescanInterval without events) ask for the folder to be read whole. Every event
// batch also leads to a whole read within the daemon's rescan interval.
//
// A watch follows a folder, not its name. An inbox removed (and made again, by a user or by the daemon) or moved
// away (`mv inbox inbox.old; mkdir inbox`) would leave the new one unwatched, its files found only by the timer
// (up to rescanInterval late, every one of them, for as long as the daemon runs). So the spool root is watched too,
// for a folder named like the inbox appearing, and the inbox watch for its folder going (IN_DELETE_SELF,
// IN_MOVE_SELF); each tick also checks that the folder watched is still the one at the inbox's path. The watch is
// moved to the new folder at once, and the folder read whole (what arrived before the watch is not missed). Events
// of a folder no longer the inbox are dropped: its files are not the inbox's.

import Foundation
import SpoolFiles
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

public final class InboxWatcher: @unchecked Sendable {
    private let path: String
    private let root: String
    private let name: String
    private let rescanInterval: Double
    /// Names reported, and whether they are all that arrived (false: read the folder whole).
    private let onChange: @Sendable (_ names: [String], _ complete: Bool) -> Void
    private var fd: Int32 = -1
    private let stopLock = NSLock()
    private var stopped = false
    /// The watch on the inbox folder (-1: none), and that folder's identity. Only the watcher's thread changes them
    /// once `start` returned.
    private var inboxWatch: Int32 = -1
    private var watched: Identity?
    /// The watch on the spool root, for the inbox's name appearing there (-1: none; the timer then checks alone).
    private var rootWatch: Int32 = -1

    public init(path: String, rescanInterval: Double = 2, onChange: @escaping @Sendable (_ names: [String], _ complete: Bool) -> Void) {
        self.path = path
        root = (path as NSString).deletingLastPathComponent
        name = (path as NSString).lastPathComponent
        self.rescanInterval = rescanInterval
        self.onChange = onChange
    }

    /// Adds the watches, then reports one rescan (what arrived before the watch is not missed).
    public func start() throws {
        fd = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        guard fd >= 0 else { throw SpoolError(operation: "inotify_init1", path: path, errno: errno) }
        let e = watchInbox()
        guard e == 0 else { throw SpoolError(operation: "inotify_add_watch", path: path, errno: e) }
        rootWatch = inotify_add_watch(fd, root.isEmpty ? "." : root, Self.rootEvents)
        onChange([], false)
        let thread = Thread { [self] in run() }
        thread.name = "inbox-watcher"
        thread.start()
    }

    private static let events = UInt32(IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVE_SELF | IN_DELETE_SELF)
    private static let rootEvents = UInt32(IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)

    public func stop() {
        stopLock.withLock { stopped = true }
    }

    private struct Identity: Equatable {
        let device: UInt64
        let inode: UInt64
        init(_ st: stat) { (device, inode) = (UInt64(st.st_dev), UInt64(st.st_ino)) }
    }

    /// Whether the folder at the inbox's path now is another than the one watched (false when there is none: the
    /// watch, if any, is then left until one is there).
    private func replaced() -> Bool {
        var st = stat()
        guard stat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else { return false }
        return Identity(st) != watched
    }

    /// Puts the inbox watch on the folder at the inbox's path now (the old watch, if any, removed). The folder is
    /// opened first and watched through its descriptor, so that the identity recorded is that of the folder watched
    /// even if the path changes meanwhile. Returns 0, or the errno.
    private func watchInbox() -> Int32 {
        if inboxWatch >= 0 {
            inotify_rm_watch(fd, inboxWatch)
            inboxWatch = -1
            watched = nil
        }
        let folder = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard folder >= 0 else { return errno }
        defer { close(folder) }
        var st = stat()
        guard fstat(folder, &st) == 0 else { return errno }
        var wd = inotify_add_watch(fd, "/proc/self/fd/\(folder)", Self.events)
        if wd < 0 && errno == ENOENT {
            // No /proc: by the path (a swap between the open and here is then found at the next tick).
            wd = inotify_add_watch(fd, path, Self.events)
        }
        guard wd >= 0 else { return errno }
        inboxWatch = wd
        watched = Identity(st)
        return 0
    }

    private func run() {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        var lastScan = Date()
        while !stopLock.withLock({ stopped }) {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&pfd, 1, 200)
            var names: [String] = []
            var changed = false
            var overflowed = false
            // The inbox folder went, or one named like it appeared in the root: watch what is there now.
            var rewatch = false
            if ready > 0 {
                let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if n > 0 {
                    var offset = 0
                    while offset + MemoryLayout<inotify_event>.size <= n {
                        let (wd, mask, length) = buffer.withUnsafeBytes { raw -> (Int32, UInt32, Int) in
                            let wd = raw.load(fromByteOffset: offset, as: Int32.self)
                            let mask = raw.load(fromByteOffset: offset + 4, as: UInt32.self)
                            let length = raw.load(fromByteOffset: offset + 12, as: UInt32.self)
                            return (wd, mask, Int(length))
                        }
                        let nameStart = offset + MemoryLayout<inotify_event>.size
                        offset = nameStart + length
                        let entry = length > 0 && nameStart + length <= n
                            ? String(decoding: buffer[nameStart ..< nameStart + length].prefix { $0 != 0 }, as: UTF8.self) : nil
                        if mask & UInt32(IN_Q_OVERFLOW) != 0 {
                            // Events were lost, the root's among them perhaps: read the folder whole, check the watch.
                            changed = true
                            overflowed = true
                            rewatch = rewatch || replaced()
                        } else if wd == rootWatch && wd >= 0 {
                            // The root's other entries (the socket made again, a user's files) are not the inbox.
                            if mask & UInt32(IN_IGNORED) != 0 { rootWatch = -1 }
                            if entry == name { rewatch = true }
                        } else if wd == inboxWatch && wd >= 0 {
                            changed = true
                            if mask & UInt32(IN_MOVE_SELF | IN_DELETE_SELF | IN_IGNORED) != 0 {
                                rewatch = true
                            } else if let entry {
                                names.append(entry)
                            }
                        }
                        // Anything else is of a folder that is no longer the inbox (moved away): not the inbox's.
                    }
                }
            }
            let tick = Date().timeIntervalSince(lastScan) >= rescanInterval
            if tick, rootWatch < 0 {
                rootWatch = inotify_add_watch(fd, root.isEmpty ? "." : root, Self.rootEvents)
            }
            if rewatch || (tick && (inboxWatch < 0 || replaced())) {
                // Watched again: the new folder is read whole. None there yet (a user's `mv inbox inbox.old; mkdir
                // inbox` half done): its appearance in the root brings the watch back; failing that, the next tick's
                // whole read finds it missing, and the daemon makes it again.
                if watchInbox() == 0 {
                    changed = true
                    overflowed = true
                }
            }
            if changed || tick {
                lastScan = Date()
                onChange(names, changed && !overflowed)
            }
        }
        close(fd)
    }
}
