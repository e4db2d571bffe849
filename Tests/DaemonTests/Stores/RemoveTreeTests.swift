// SpoolFiles' removeTree against hostile depth (what a command can leave in its scratch folder): a folder tree
// deeper than the descriptor limit goes whole, with few folders open at once and a small stack, and the links in it
// are removed, never followed.

import Foundation
import SpoolFiles
import Testing
import TestSupport
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

/// The size of this process's descriptor table (/proc/self/status, FDSize): the kernel grows it to cover the highest
/// descriptor ever open and never shrinks it, so it keeps a peak however brief, whatever else the process does later.
private func descriptorTableSize() -> Int {
    let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
    let line = status.split(separator: "\n").first { $0.hasPrefix("FDSize:") }
    return line.flatMap { Int($0.dropFirst("FDSize:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
}

/// Makes `levels` folders named `name`, each in the one before, under the folder open as `fd`; `each` is given each
/// folder's depth (0: `fd`'s own) and descriptor before the next is made. Two descriptors open at most.
private func makeChain(in fd: Int32, _ name: String, levels: Int, _ each: (Int, Int32) throws -> Void = { _, _ in }) throws {
    var folder = dup(fd)
    defer { close(folder) }
    for depth in 0..<levels {
        try each(depth, folder)
        let next = mkdirat(folder, name, 0o755) == 0 ? openat(folder, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1
        guard next >= 0 else { throw TestFailure("making level \(depth + 1): \(String(cString: strerror(errno)))") }
        close(folder)
        folder = next
    }
    try each(levels, folder)
}

/// A file `name` holding `text` in the folder open as `fd`.
private func makeFile(in fd: Int32, _ name: String, _ text: String = "x") throws {
    let file = openat(fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
    guard file >= 0 else { throw TestFailure("creating \(name): \(String(cString: strerror(errno)))") }
    defer { close(file) }
    guard write(file, text, text.utf8.count) == text.utf8.count else { throw TestFailure("writing \(name)") }
}

@Suite(.onItsOwnExecutor) struct RemoveTreeTests {
    /// 25,000 levels (more than CI's descriptor limits, and than a 256 KB stack can recurse), with a file, a link to a
    /// file outside and a link to a folder outside at several depths, a side branch of 40 levels at some, and at the
    /// top the names the removal gives the folders it moves up, taken. All goes on a thread with a 256 KB stack;
    /// what the links lead to stays; the descriptor table never grew past what the process had had (or 8,192, what
    /// the control tests' thousands of connections can make it meanwhile); no descriptor is left on the tree.
    @Test func aTreeDeeperThanTheDescriptorLimitGoesWholeOnASmallStack() throws {
        let root = NSTemporaryDirectory() + "opq-rmtree-" + UUID().uuidString.prefix(8)
        let tree = root + "/tree", outside = root + "/outside"
        defer { removeTree(root) }
        try FileManager.default.createDirectory(atPath: outside + "/folder", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: tree + "/.removing-0/inside", withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: outside + "/file", contents: Data("kept".utf8))
        _ = FileManager.default.createFile(atPath: outside + "/folder/file", contents: Data("kept".utf8))
        _ = FileManager.default.createFile(atPath: tree + "/.removing-1", contents: Data("taken".utf8))
        let top = open(tree, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        try #require(top >= 0)
        let levels = 25_000, marked: Set = [0, 1, 30, 31, 32, 33, 63, 64, 1_000, 12_345, levels]
        try makeChain(in: top, "d", levels: levels) { depth, fd in
            guard marked.contains(depth) else { return }
            try makeFile(in: fd, "file")
            guard symlinkat(outside + "/file", fd, "link") == 0, symlinkat(outside + "/folder", fd, "folder") == 0 else {
                throw TestFailure("linking at \(depth): \(String(cString: strerror(errno)))")
            }
            try makeChain(in: fd, "s", levels: 40) { level, side in if level == 40 { try makeFile(in: side, "bottom") } }
        }
        close(top)

        let tableBefore = descriptorTableSize()
        let done = DispatchSemaphore(value: 0)
        let thread = Thread {
            removeTree(tree)
            done.signal()
        }
        thread.stackSize = 256 << 10
        thread.start()
        #expect(done.wait(timeout: .now() + 120) == .success, "the removal did not end")
        #expect(access(tree, F_OK) != 0 && errno == ENOENT, "the tree is gone")
        #expect(FileManager.default.contents(atPath: outside + "/file") == Data("kept".utf8))
        #expect(FileManager.default.contents(atPath: outside + "/folder/file") == Data("kept".utf8))
        let tableAfter = descriptorTableSize()
        #expect(tableAfter <= max(tableBefore, 8_192), "descriptor table \(tableBefore) -> \(tableAfter) entries")
        let left = descriptorTable(getpid()).filter { $0.value.hasPrefix(root) }
        #expect(left.isEmpty, "descriptors left on the tree: \(left)")
    }

    /// removeTree(name, in:) says whether the name is gone: a deep folder, a file, a link and a name not there.
    @Test func removingANameInAFolderSaysWhetherItIsGone() throws {
        let root = NSTemporaryDirectory() + "opq-rmname-" + UUID().uuidString.prefix(8)
        defer { removeTree(root) }
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        let fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        try #require(fd >= 0)
        defer { close(fd) }
        try makeChain(in: fd, "deep", levels: 3_000) { depth, level in if depth % 500 == 1 { try makeFile(in: level, "f") } }
        try makeFile(in: fd, "file")
        #expect(symlinkat(root + "/file", fd, "link") == 0)
        for name in ["deep", "link", "file", "absent"] {
            #expect(removeTree(Array(name.utf8CString), in: fd), "\(name)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: root).isEmpty)
    }
}
