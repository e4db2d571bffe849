// Reading a file the daemon does not trust to be what it is named: no link followed, no FIFO blocked on, a bound on
// what is read. Used by the spool (manifests, claim records, results) and by the configuration at a reload; a file of
// its own so that the manifest fuzzer (Makefile: fuzz-manifest), which builds Configuration.swift without the rest
// of the daemon, has it too.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

public struct SpoolError: Error, CustomStringConvertible {
    public let operation: String
    public let path: String
    public let errno: Int32
    public var description: String { "\(operation) \(path): \(String(cString: strerror(errno)))" }
}

/// Reads a regular file, never following a symlink nor blocking on a FIFO. `singleLink` refuses a file
/// with other hard links (an inbox entry linked to a file elsewhere is not the submitter's to hand over).
func readRegularFile(_ path: String, limit: Int = ManifestLimits.maxBytes + 1, singleLink: Bool = false) -> Result<Data, SpoolError> {
    let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
    guard fd >= 0 else { return .failure(SpoolError(operation: "open", path: path, errno: errno)) }
    defer { close(fd) }
    return readRegularFile(fd, path: path, limit: limit, singleLink: singleLink)
}

/// `readRegularFile` of a descriptor open on `path` (read from its current offset); with `check`, only
/// the checks are made (nothing is read).
func readRegularFile(_ fd: Int32, path: String, limit: Int = ManifestLimits.maxBytes + 1, singleLink: Bool = false, check: Bool = false) -> Result<Data, SpoolError> {
    var st = stat()
    guard fstat(fd, &st) == 0 else { return .failure(SpoolError(operation: "fstat", path: path, errno: errno)) }
    guard (st.st_mode & S_IFMT) == S_IFREG else { return .failure(SpoolError(operation: "open (not a regular file)", path: path, errno: EINVAL)) }
    guard !singleLink || st.st_nlink == 1 else {
        return .failure(SpoolError(operation: "open (the file has \(st.st_nlink) hard links)", path: path, errno: EPERM))
    }
    if check { return .success(Data()) }
    var data = Data()
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while data.count < limit {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            return .failure(SpoolError(operation: "read", path: path, errno: errno))
        }
        if n == 0 { break }
        data.append(contentsOf: buffer[0..<n])
    }
    return .success(data)
}
