// The configuration as the daemon reads it (SPEC §6): from its file, and with `cluster.database` checked by the
// cluster store's own URL parser. The rest of the parsing is JobModel's, which links neither the store nor the
// spool's file reading.

import ClusterStore
import Foundation
import JobModel
import SpoolFiles

extension Configuration {
    /// The largest configuration file read (a handful of kilobytes is usual).
    static let maxBytes = 16 << 20

    /// Reads a configuration file; settings it does not give keep their defaults. At start a pipe or FIFO is read
    /// too (`--config <(…)`); at a reload (`regularOnly`) only a regular file is, opened without blocking: a FIFO
    /// with no writer would hold the reload, and with it every signal after it (SIGTERM included), for good.
    public static func load(path: String, regularOnly: Bool = false) throws -> Configuration {
        let data: Data
        if regularOnly {
            // A configuration that is a symbolic link (/etc/alternatives, stow, a ConfigMap) is read where it leads:
            // what must be a regular file is the target.
            guard let resolved = realpath(path, nil) else {
                throw Invalid(path: path, problems: ["cannot be read: \(String(cString: strerror(errno)))"])
            }
            let target = String(cString: resolved)
            free(resolved)
            switch readRegularFile(target, limit: maxBytes + 1) {
            case .success(let d): data = d
            case .failure(let e) where e.errno == EINVAL:
                throw Invalid(path: path,
                              problems: ["cannot be read at a reload: not a regular file (a pipe or FIFO is read only at start)"])
            case .failure(let e):
                throw Invalid(path: path, problems: ["cannot be read: \(String(cString: strerror(e.errno)))"])
            }
        } else {
            do {
                // Read to its end rather than by its size: a pipe or FIFO (`--config <(…)`, /dev/stdin) works too;
                // bounded: `--config /dev/zero` is refused, not read until memory runs out.
                let file = try FileHandle(forReadingFrom: URL(fileURLWithPath: path))
                defer { try? file.close() }
                var read = Data()
                while read.count <= maxBytes, let chunk = try file.read(upToCount: 1 << 20), !chunk.isEmpty { read.append(chunk) }
                data = read
            } catch {
                throw Invalid(path: path, problems: ["cannot be read: \(describe(error))"])
            }
        }
        guard data.count <= maxBytes else { throw Invalid(path: path, problems: ["larger than \(maxBytes) bytes"]) }
        return try parse(data, path: path)
    }

    /// `Configuration.parse(_:path:checkDatabase:)` with the cluster store's check of `cluster.database`.
    public static func parse(_ data: Data, path: String = "configuration") throws -> Configuration {
        try parse(data, path: path, checkDatabase: databaseProblem)
    }

    /// Why `url` is no usable `cluster.database`, naming that key; nil when it is one.
    static func databaseProblem(_ url: String) -> String? {
        do {
            _ = try DatabaseURL(url)
            return nil
        } catch let error as ClusterStoreError {
            return error.description  // names cluster.database itself
        } catch {
            return "cluster.database: \(error)"
        }
    }
}

/// A Foundation error in words: the underlying error's, when a CocoaError wraps one.
func describe(_ error: any Error) -> String {
    if let e = error as? CocoaError, let underlying = e.userInfo[NSUnderlyingErrorKey] as? NSError {
        return "\(underlying.localizedDescription)"
    }
    return (error as NSError).localizedDescription
}
