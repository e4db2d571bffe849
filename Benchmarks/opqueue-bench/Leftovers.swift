// What a measured run leaves behind (its spool, its configuration) is removed once every figure is taken, never
// between two runs: on an ext4 without a journal, each new inode is checked against those deleted in the last
// seconds, so the thousands of files one run removes would be paid by the next run's daemon, not by the bench.

import Foundation

final class Leftovers: @unchecked Sendable {
    static let shared = Leftovers()
    private let lock = NSLock()
    private var paths: [String] = []

    /// `path` goes when `removeAll` is called, at the end of the bench.
    func removeLater(_ path: String) { lock.withLock { paths.append(path) } }

    func removeAll() {
        let all = lock.withLock { () -> [String] in
            defer { paths = [] }
            return paths
        }
        for path in all { try? FileManager.default.removeItem(atPath: path) }
    }
}
