// The spool's file primitives: whole writes, durable writes and renames, folder syncs, and removal of trees.

import CShims
import Foundation
#if canImport(Glibc)
import Glibc
import SystemCalls
#endif

/// Removes hidden `.NAME.part` files (interrupted writes) in a job folder and its sub-folders.
package func removeParts(_ folder: String) {
    guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder) else { return }
    for name in names {
        let path = folder + "/" + name
        var st = stat()
        guard lstat(path, &st) == 0 else { continue }
        if (st.st_mode & S_IFMT) == S_IFDIR {
            removeParts(path)
        } else if name.hasPrefix("."), name.hasSuffix(".part") {
            unlink(path)
        }
    }
}

package func writeAll(_ fd: Int32, _ data: Data, path: String) throws {
    try data.withUnsafeBytes { raw in try writeAll(fd, raw, path: path) }
}

package func writeAll(_ fd: Int32, _ raw: UnsafeRawBufferPointer, path: String) throws {
    guard let base = raw.baseAddress else { return }
    var offset = 0
    while offset < raw.count {
        let n = retryingInterrupts { write(fd, base + offset, raw.count - offset) }
        if n < 0 {
            throw SpoolError(operation: "write", path: path, errno: errno)
        }
        offset += n
    }
}

/// An extended attribute's value, or nil.
package func readAttribute(_ path: String, _ name: String) -> Data? {
    let size = getxattr(path, name, nil, 0)
    guard size > 0, size <= 65_536 else { return nil }
    var data = Data(count: size)
    let got = data.withUnsafeMutableBytes { getxattr(path, name, $0.baseAddress, size) }
    return got == size ? data : nil
}

/// Creates (or truncates) a file with `data`; durable at the next commit.
package func writeFile(_ data: Data, to path: String) throws {
    try writeFile(to: path) { fd, path in try writeAll(fd, data, path: path) }
}

/// Creates (or truncates) a file that `fill` writes (given the descriptor and the path); durable at the next commit.
package func writeFile(to path: String, _ fill: (Int32, String) throws -> Void) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o644)
    guard fd >= 0 else { throw SpoolError(operation: "create", path: path, errno: errno) }
    defer { close(fd) }
    try fill(fd, path)
}

/// Writes a file and fsyncs it (and, by default, its folder).
public func writeDurably(_ data: Data, to path: String, syncFolder: Bool = true) throws {
    try writeDurably(to: path, syncFolder: syncFolder) { fd, path in try writeAll(fd, data, path: path) }
}

/// Replaces the file at `path` whole: `data` is written beside it (`path`.new) and fsynced, renamed over it, and the
/// folder fsynced — a crash leaves the old file or the new one, never half of either.
package func replaceDurably(_ data: Data, at path: String, beforeRename: () -> Void = {}) throws {
    let fresh = path + ".new"
    try writeDurably(data, to: fresh, syncFolder: false)
    beforeRename()
    guard rename(fresh, path) == 0 else { throw SpoolError(operation: "rename to \(path)", path: fresh, errno: errno) }
    try syncDirectory((path as NSString).deletingLastPathComponent)
}

/// Creates a file, has `fill` write it (given the descriptor and the path), and fsyncs it (and, by
/// default, its folder).
package func writeDurably(to path: String, syncFolder: Bool = true, _ fill: (Int32, String) throws -> Void) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o644)
    guard fd >= 0 else { throw SpoolError(operation: "create", path: path, errno: errno) }
    do {
        try fill(fd, path)
        guard fsync(fd) == 0 else { throw SpoolError(operation: "fsync", path: path, errno: errno) }
    } catch {
        close(fd)
        throw error
    }
    close(fd)
    if syncFolder { try syncDirectory((path as NSString).deletingLastPathComponent) }
}

package func syncDirectory(_ path: String) throws {
    let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard fd >= 0 else { throw SpoolError(operation: "open", path: path, errno: errno) }
    defer { close(fd) }
    guard fsync(fd) == 0 else { throw SpoolError(operation: "fsync", path: path, errno: errno) }
}

/// Removes a file or a folder and everything in it; symlinks are removed, never followed.
/// Best effort: what cannot be removed stays (recovery and tmp/ clean-up look again).
package func removeTree(_ path: String) {
    if unlink(path) == 0 || errno == ENOENT { return }
    let fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
    guard fd >= 0 else { return }
    removeContents(fd)
    rmdir(path)
}

/// Removes `name` of the folder open as `folder` (a file, or a folder and everything in it; symlinks removed, never
/// followed); whether it is gone.
package func removeTree(_ name: [CChar], in folder: Int32) -> Bool {
    if unlinkat(folder, name, 0) == 0 || errno == ENOENT { return true }
    let fd = openat(folder, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
    if fd >= 0 { removeContents(fd) }
    return unlinkat(folder, name, AT_REMOVEDIR) == 0
}

/// The bytes of a readdir(3) entry's name, read through its pointer (see opq_dirent_name: never the whole entry).
package func direntName(_ entry: UnsafeMutablePointer<dirent>) -> [UInt8] {
    guard let name = opq_dirent_name(entry) else { return [] }
    return Array(UnsafeRawBufferPointer(start: name, count: strlen(name)))
}

/// How many folders a removal holds open at once: the top one and those below it it is walking.
private let maxOpenFolders = 32

/// Empties the folder open as `fd` (and closes it) with at most `maxOpenFolders` folders open and no recursion,
/// whatever the depth: a folder found below that depth is renamed up into this top folder under a fresh name and
/// emptied from there once the walk is back at the top, so the tree flattens as it goes. Each folder is opened once
/// and moved at most once: the work stays linear. Descriptors are only opened with O_NOFOLLOW | O_DIRECTORY and the
/// walk never uses "..": a folder renamed meanwhile cannot lead it outside, nor can a link.
private func removeContents(_ fd: Int32) {
    guard let top = fdopendir(fd) else { close(fd); return }
    // The folders being emptied, each with its name in the one before it (the top's name is not used).
    var walk: [(dir: OpaquePointer, name: [CChar])] = [(top, [])]
    var moved = 0, visited = 0  // folders renamed into the top one (movedName), and how many were taken up again
    while let (dir, name) = walk.last {
        let folder = dirfd(dir)
        if let entry = readdir(dir) {
            let bytes = direntName(entry)
            if bytes == [0x2E] || bytes == [0x2E, 0x2E] { continue }
            let child = bytes.map { CChar(bitPattern: $0) } + [0]
            if unlinkat(folder, child, 0) == 0 || errno != EISDIR { continue }
            if walk.count < maxOpenFolders {
                if let sub = openFolder(child, in: folder) { walk.append((sub, child)) }
            } else {
                moveUp(child, from: folder, into: fd, moved: &moved)
            }
        } else if walk.count == 1, visited < moved {
            let child = movedName(visited)
            visited += 1
            if let sub = openFolder(child, in: fd) { walk.append((sub, child)) }
        } else {
            closedir(dir)
            walk.removeLast()
            if let parent = walk.last { unlinkat(dirfd(parent.dir), name, AT_REMOVEDIR) }
        }
    }
}

/// The folder `name` of the folder open as `folder`, opened for readdir; nil when it cannot be (or is not a folder).
private func openFolder(_ name: [CChar], in folder: Int32) -> OpaquePointer? {
    let fd = openat(folder, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    guard let dir = fdopendir(fd) else { close(fd); return nil }
    return dir
}

/// The name of the `n`th folder a removal moved up into its top folder.
private func movedName(_ n: Int) -> [CChar] { Array(".removing-\(n)".utf8CString) }

/// Renames the folder `name` of `folder` into the top folder `top` under the next fresh name. A name the tree itself
/// holds there is skipped for good (so this ends); renameat(2) may replace an empty folder of that name, which is as
/// good as removing it.
private func moveUp(_ name: [CChar], from folder: Int32, into top: Int32, moved: inout Int) {
    while true {
        let target = movedName(moved)
        moved += 1
        if renameat(folder, name, top, target) == 0 || ![EEXIST, ENOTEMPTY, ENOTDIR].contains(errno) { return }
    }
}
