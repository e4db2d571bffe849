// EntryCheck: what a job's folder may hold when it becomes its outbox entry. SPEC §2: manifest.plist, result.plist
// and the files its operations produced (in folders, for a `write` path with sub-folders; logs/ for commands).
// Just before result.plist is written, the folder is walked once and anything else is removed:
//   - a symbolic link, wherever it points: the daemon never makes one, so one there was planted (a command writing
//     outside its scratch folder, someone with access to the spool); a consumer copying outputs would follow it,
//     and telling a link "inside" the folder from one outside means resolving it, which a planter can race;
//   - a named pipe, a socket or a device node (opening a pipe blocks whoever copies the entry);
//   - a folder more than `maxDepth` levels deep (walked no further: one descriptor is held per level).
// Each removal is said with its reason (result.plist `dropped`, and the journal). An operation's output that went
// (a written file replaced by a link, one below a link or a too-deep folder) is left out of its `outputs`
// (ResultWriter): result.plist never names a file the entry does not hold; `dropped` says what went and why.
//
// What it trusts: nothing in the folder. Links are never followed (O_NOFOLLOW, readdir's type, fstatat with
// AT_SYMLINK_NOFOLLOW when the file system gives none). It sees the folder as it is at publication: a process of
// the daemon's user that outlived its command could still write there, or in the outbox, later.
// Cost: one open and one getdents per folder; a regular file nothing more (about one bare readdir for a flat job).

import Foundation
import SpoolFiles
#if canImport(Glibc)
import Glibc
#endif

/// A path removed from a job's folder before publication, relative to the folder, and why.
struct DroppedPath: Sendable, Equatable, CustomStringConvertible {
    let path: String
    let reason: String
    /// A folder that could not be read to be checked, published as it is: what is below it stays an output.
    var unchecked = false
    var description: String { "\(path): \(reason)" }
}

enum EntryCheck {
    /// How many levels of folders are walked below the job's folder; a folder below them is removed whole.
    static let maxDepth = 32

    /// Removes from the job folder `folder` what is not published (see above); what was removed, in walk order.
    /// Nothing when the folder cannot be opened (staging result.plist then says what is wrong with it).
    static func sweep(_ folder: String) -> [DroppedPath] {
        let fd = open(folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { return [] }
        var dropped: [DroppedPath] = []
        sweep(fd, prefix: "", depth: 1, into: &dropped)
        return dropped
    }

    private static let typeOffset = MemoryLayout<dirent>.offset(of: \dirent.d_type)!

    /// Walks the folder open as `fd` (closed on return), whose path in the job folder is `prefix`.
    private static func sweep(_ fd: Int32, prefix: String, depth: Int, into dropped: inout [DroppedPath]) {
        guard let dir = fdopendir(fd) else {
            close(fd)
            return
        }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            // Only the type's byte is read: a whole `struct dirent` may run past readdir's buffer (opq_dirent_name).
            var type = UnsafeRawPointer(entry).load(fromByteOffset: typeOffset, as: UInt8.self)
            // A regular file, the usual entry, costs nothing more.
            if Int(type) == DT_REG { continue }
            let bytes = direntName(entry)
            if bytes == [0x2E] || bytes == [0x2E, 0x2E] { continue }
            let name = bytes.map { CChar(bitPattern: $0) } + [0]
            if Int(type) == DT_UNKNOWN {
                var st = stat()
                guard fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 else { continue }
                type = UInt8((st.st_mode & S_IFMT) >> 12)
            }
            let path = prefix + String(decoding: bytes, as: UTF8.self)
            switch Int(type) {
            case DT_REG:
                continue
            case DT_DIR where depth <= maxDepth:
                let child = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                if child >= 0 {
                    sweep(child, prefix: path + "/", depth: depth + 1, into: &dropped)
                } else if [ELOOP, ENOTDIR].contains(errno) {
                    // Made a link (or a file) since readdir: removed as one.
                    remove(name, in: fd, path: path, "replaced while it was checked: not published", into: &dropped)
                } else {
                    dropped.append(DroppedPath(path: path + "/", reason: "a folder that cannot be read to be checked "
                                               + "(\(String(cString: strerror(errno)))): published as it is", unchecked: true))
                }
            case DT_DIR:
                let removed = removeTree(name, in: fd)
                dropped.append(DroppedPath(path: path + "/", reason: "a folder more than \(maxDepth) levels deep: "
                                           + (removed ? "not published" : "could not all be removed")))
            case DT_LNK:
                var target = [CChar](repeating: 0, count: 1025)
                let n = readlinkat(fd, name, &target, 1024)
                let to = n >= 0 ? " to " + String(decoding: target[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
                remove(name, in: fd, path: path, "a symbolic link\(to): links are not published", into: &dropped)
            default:
                let kinds = [DT_FIFO: "a named pipe", DT_SOCK: "a socket", DT_CHR: "a device", DT_BLK: "a device"]
                let what = kinds[Int(type)] ?? "a special file"
                remove(name, in: fd, path: path, "\(what): only files and folders are published", into: &dropped)
            }
        }
    }

    /// Unlinks `name` (not a folder) in the folder open as `fd`, and says so.
    private static func remove(_ name: [CChar], in fd: Int32, path: String, _ why: String, into dropped: inout [DroppedPath]) {
        if unlinkat(fd, name, 0) == 0 || errno == ENOENT {
            dropped.append(DroppedPath(path: path, reason: why))
        } else {
            dropped.append(DroppedPath(path: path, reason: why + ", but it could not be removed (\(String(cString: strerror(errno))))"))
        }
    }
}
