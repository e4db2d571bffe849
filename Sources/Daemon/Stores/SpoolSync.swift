// SpoolSync: how `Spool.commit()` makes durable what the spool wrote since the last commit.
//
// Two ways, the same promise (everything written before the commit began survives a power cut once it returns):
//   syncfs    one syncfs(2) of the spool's file system. It also writes out every other program's dirty files
//             there: journald's above all, which the daemon itself keeps busy (each sync rewrote journald's hot
//             pages, halving the spool's rate when both share a file system).
//   journal   ext4 with a journal: the files the spool wrote are written out (sync_file_range, all started before
//             any is waited for), then one fsync of a file just touched commits ext4's running transaction, and
//             with it every earlier one: each rename, mkdir and unlink, and the blocks the write-out allocated.
//             Other programs' data stays in the page cache.
// The journal way needs to know every file with data to write: the spool registers each (`file`), or the folder
// holding them (`tree`: a job's folder, walked at commit, so that what its operations and commands wrote is
// covered without each telling). Anything it cannot vouch for falls back to a syncfs: the first commit after start
// (recovery's writes), a walk over `maxFiles`, an error other than "gone", another file system, or
// OPQUEUED_SPOOL_SYNC=syncfs. A spool opened by itself keeps syncfs until the daemon's node asks for the journal
// way (`Spool.preferJournalCommits`), for either store: a cluster's submissions need no commit (the database makes
// them durable), and every other file its spool writes is registered as the spool alone's are.

import CShims
import Foundation
import SpoolFiles
import Synchronization
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

/// What the spool's next commit must write out, and the way it commits.
final class SpoolSync: Sendable {
    enum Method: String, Sendable {
        case syncfs, journal
    }

    private struct Pending {
        var files: Set<String> = []
        var trees: Set<String> = []
        /// The next commit is a syncfs whatever the method (at start: what recovery wrote is not registered).
        var whole = true
    }

    private let pending = Mutex(Pending())
    private let method = Mutex(Method.syncfs)
    private let root: String
    /// The most files one commit writes out one by one; beyond, a syncfs is cheaper than the walk.
    static let maxFiles = 4096

    init(root: String) { self.root = root }

    var current: Method { method.withLock { $0 } }
    /// Whether the next commit is a whole syncfs (at start, and after a commit failed).
    var nextIsWhole: Bool { pending.withLock { $0.whole } }

    /// Commits by ext4's journal from now on if the file system of `rootFD` (the spool's folder) allows it and the
    /// environment does not say otherwise; returns the method in use.
    func preferJournal(rootFD: Int32, environment: [String: String]) -> Method {
        let chosen: Method = environment["OPQUEUED_SPOOL_SYNC"] == Method.syncfs.rawValue ? .syncfs
            : Self.hasExt4Journal(rootFD) ? .journal : .syncfs
        method.withLock { $0 = chosen }
        return chosen
    }

    /// A file whose data the next commit must write out.
    func file(_ path: String) { pending.withLock { _ = $0.files.insert(path) } }

    /// A folder whose every file (at any depth) the next commit must write out.
    func tree(_ path: String) { pending.withLock { _ = $0.trees.insert(path) } }

    /// `rootFD`: the spool's folder (a syncfs's); `markerFD`: a file of the spool's own (its lock file), touched and
    /// fsynced to commit ext4's transaction.
    func commit(rootFD: Int32, markerFD: Int32) throws {
        let taken = pending.withLock { p -> Pending in
            defer { p = Pending(whole: false) }
            return p
        }
        do {
            try commit(taken, rootFD: rootFD, markerFD: markerFD)
        } catch {
            // What this commit was to write out is no longer listed: the next one covers everything.
            pending.withLock { $0.whole = true }
            throw error
        }
    }

    private func commit(_ taken: Pending, rootFD: Int32, markerFD: Int32) throws {
        guard current == .journal, !taken.whole, let files = Self.regularFiles(taken) else { return try syncAll(rootFD) }
        var started: [String] = []
        for path in files {
            switch try writeOut(path, wait: false) {
            case .done: started.append(path)
            case .gone: continue
            case .unsure: return try syncAll(rootFD)
            }
        }
        for path in started {
            if try writeOut(path, wait: true) == .unsure { return try syncAll(rootFD) }
        }
        // Touching the marker puts it in ext4's running transaction; its fsync commits that one and every one before.
        guard futimens(markerFD, nil) == 0 else { return try syncAll(rootFD) }
        guard fsync(markerFD) == 0 else { throw SpoolError(operation: "fsync", path: root + "/opqueued.lock", errno: errno) }
    }

    private func syncAll(_ rootFD: Int32) throws {
        let result = opq_syncfs(rootFD)
        guard result == 0 else { throw SpoolError(operation: "syncfs", path: root, errno: -result) }
    }

    private enum WriteOut { case done, gone, unsure }

    /// Starts (or with `wait`, finishes) writing out a file's data. Gone: removed or renamed since it was written (a
    /// discarded job; whatever moved it registered it again). An I/O error throws, as a failed sync does.
    private func writeOut(_ path: String, wait: Bool) throws -> WriteOut {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return errno == ENOENT || errno == ENOTDIR ? .gone : .unsure }
        defer { close(fd) }
        let result = opq_write_out(fd, wait ? 1 : 0)
        if result == -EIO || result == -ENOSPC { throw SpoolError(operation: "sync_file_range", path: path, errno: -result) }
        return result == 0 ? .done : .unsure
    }

    /// The registered files and every regular file under the registered folders; nil past `maxFiles` or when a
    /// folder cannot be read for another reason than being gone.
    private static func regularFiles(_ pending: Pending) -> [String]? {
        var found = Array(pending.files)
        for tree in pending.trees.sorted() where !collect(tree, into: &found, depth: 0) { return nil }
        return found.count <= maxFiles ? found : nil
    }

    /// Appends the regular files under `folder` (symbolic links and special files hold no data to write out); false
    /// when the walk must give up.
    private static func collect(_ folder: String, into found: inout [String], depth: Int) -> Bool {
        guard depth < 32 else { return false }
        let fd = open(folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { return errno == ENOENT || errno == ENOTDIR }
        guard let dir = fdopendir(fd) else { close(fd); return false }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            // A name that is not UTF-8 (a command's file) would not open again from a String: give up, syncfs.
            guard let name = String(validating: direntName(entry), as: UTF8.self) else { return false }
            guard name != ".", name != ".." else { continue }
            var type = entry.pointee.d_type
            if type == UInt8(DT_UNKNOWN) {
                var st = stat()
                guard fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 else { continue }
                type = (st.st_mode & S_IFMT) == S_IFDIR ? UInt8(DT_DIR) : (st.st_mode & S_IFMT) == S_IFREG ? UInt8(DT_REG) : 0
            }
            if type == UInt8(DT_REG) {
                found.append(folder + "/" + name)
                if found.count > maxFiles { return false }
            } else if type == UInt8(DT_DIR), !collect(folder + "/" + name, into: &found, depth: depth + 1) {
                return false
            }
        }
        return true
    }

    /// Whether the file system holding `fd` is ext4 with its journal inside (jbd2 lists it as <device>-8).
    static func hasExt4Journal(_ fd: Int32) -> Bool {
        guard opq_fs_type(fd) == 0xEF53 else { return false }
        var st = stat()
        guard fstat(fd, &st) == 0 else { return false }
        let dev = UInt64(st.st_dev)
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & ~0xfff), minor = (dev & 0xff) | ((dev >> 12) & ~0xff)
        let device = "/sys/dev/block/\(major):\(minor)"
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: device) else { return false }
        let name = URL(fileURLWithPath: target).lastPathComponent
        return FileManager.default.fileExists(atPath: "/proc/fs/jbd2/\(name)-8")
    }
}
