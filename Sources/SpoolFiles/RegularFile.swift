// Reading a file the daemon does not trust to be what it is named: no link followed, no FIFO blocked on, a bound on
// what is read. Used by the spool (manifests, claim records, results) and by the configuration at a reload
// (Configuration+Loading.swift).

import Foundation
import JobModel

#if canImport(Glibc)
import Glibc
import SystemCalls
#endif

extension SpoolError {
    /// The error of an open(2) with O_NOFOLLOW of `path`: ELOOP there means that the name is a symbolic link.
    package static func opening(_ path: String, errno e: Int32) -> SpoolError {
        var st = stat()
        if e == ELOOP, lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFLNK {
            return SpoolError(operation: "open", path: path, errno: e,
                              reason: "a symbolic link, which is not followed (move or copy the file itself here)")
        }
        return SpoolError(operation: "open", path: path, errno: e)
    }

    /// What a file of this mode is, for one that is not a regular file.
    package static func notRegular(_ path: String, mode: mode_t) -> SpoolError {
        let kind = switch mode & S_IFMT {
        case S_IFDIR: "a folder"
        case S_IFIFO: "a FIFO (named pipe)"
        case S_IFSOCK: "a socket"
        case S_IFCHR: "a character device"
        case S_IFBLK: "a block device"
        default: "not a regular file"
        }
        return SpoolError(operation: "open", path: path, errno: EINVAL,
                          reason: kind == "not a regular file" ? kind : kind + ", not a regular file")
    }
}

/// Reads a regular file, never following a symlink nor blocking on a FIFO. `singleLink` refuses a file
/// with other hard links (an inbox entry linked to a file elsewhere is not the submitter's to hand over).
package func readRegularFile(_ path: String, limit: Int = ManifestLimits.maxBytes + 1,
                             singleLink: Bool = false) -> Result<Data, SpoolError> {
    let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
    guard fd >= 0 else { return .failure(SpoolError.opening(path, errno: errno)) }
    defer { close(fd) }
    return readRegularFile(fd, path: path, limit: limit, singleLink: singleLink)
}

/// `readRegularFile` of a descriptor open on `path` (read from its current offset); with `check`, only
/// the checks are made (nothing is read).
package func readRegularFile(_ fd: Int32, path: String, limit: Int = ManifestLimits.maxBytes + 1, singleLink: Bool = false,
                             check: Bool = false) -> Result<Data, SpoolError> {
    var st = stat()
    guard fstat(fd, &st) == 0 else { return .failure(SpoolError(operation: "fstat", path: path, errno: errno)) }
    guard (st.st_mode & S_IFMT) == S_IFREG else { return .failure(SpoolError.notRegular(path, mode: st.st_mode)) }
    guard !singleLink || st.st_nlink == 1 else {
        return .failure(SpoolError(operation: "open", path: path, errno: EPERM,
                                   reason: "the file has \(st.st_nlink) hard links: "
                                       + "one linked elsewhere is not handed over (move it here, or copy it)"))
    }
    if check { return .success(Data()) }
    return readBounded(fd, limit: limit).mapError { SpoolError(operation: "read", path: path, errno: $0.code) }
}

/// What `fd` holds from its current offset to its end, or its first `limit` bytes and a few more (a read stops
/// at the first buffer that reaches `limit`): whatever the descriptor is, a file, a pipe or /dev/zero, memory is
/// bounded.
public func readBounded(_ fd: Int32, limit: Int) -> Result<Data, ReadFailure> {
    var data = Data()
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while data.count < limit {
        let n = retryingInterrupts { buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } }
        if n < 0 {
            return .failure(ReadFailure(code: errno))
        }
        if n == 0 { break }
        data.append(contentsOf: buffer[0..<n])
    }
    return .success(data)
}

/// A read(2) that failed, with its errno.
public struct ReadFailure: Error, CustomStringConvertible {
    public let code: Int32
    public var description: String { String(cString: strerror(code)) }
}
