// The spool's format: which build's records active/ holds.
//
// What is in active/ (the claim records on job folders, .progress.log, .submissions, .hooks, .commands) is the daemon's
// own, read back only by the daemon at its next start. When a build changes how it writes them, a build from
// before the change cannot read what the newer one left there: for a cluster claim whose record it cannot read, it
// would submit the job again. active/.format names the format, and a build refuses active/ in a format newer than
// it knows while active/ holds a job:
//
//   1  claim records as binary property lists (builds before the compact record; they wrote no .format)
//   2  compact claim records (ClaimRecord.swift): NUL-separated k=value entries
//
// The file holds the format, and optionally, after a space, the oldest format whose builds read it too ("3 2": a
// change that builds of format 2 read correctly, so that they need not refuse it); as the database's schema keeps
// opq_schema_readers. A build reads every older format, so a start rewrites the file to its own. Formats only concern
// active/: the inbox is the users', the outbox is SPEC's (result.plist, manifest.plist), tmp/ is emptied at every
// start.

#if canImport(Glibc)
import Glibc
#endif
import Foundation
import SpoolFiles

extension Spool {
    /// The format this build writes (and the newest it reads).
    public static let format = 2
    var formatPath: String { active + "/.format" }

    /// Reads active/.format; refuses a newer format while active/ holds a job; writes this build's format.
    /// Returns the format found when it was newer (active/ was empty, and is taken over), for the journal.
    func adoptFormat() throws -> Int? {
        let found = readFormat()
        var tookOver: Int?
        switch found {
        case .some(let found) where found.format == Self.format:
            return nil
        case .some(let found) where found.format < Self.format || found.readFrom <= Self.format:
            break  // older, or newer and said to be read by this build's format
        case nil where !exists(formatPath):
            break  // a new spool, or one of a build that wrote no .format (format 1)
        default:
            // Newer, or not a format at all (which a newer build may have written as well).
            let jobs = jobsInActive()
            guard jobs.isEmpty else {
                let shown = found.map { "format \($0.format)" } ?? "a format this build cannot read"
                throw SpoolFormatError(description: "\(active)/ holds \(jobs.count) job\(jobs.count == 1 ? "" : "s") "
                    + "(\(firstNames(jobs))) written in \(shown) (\(formatPath)), newer than this build's format \(Self.format): "
                    + "let the newer opqueued run them to the end (for instance with --once), then start this one")
            }
            tookOver = found?.format ?? 0
        }
        try replaceDurably(Data("\(Self.format)\n".utf8), at: formatPath)
        return tookOver
    }

    private func exists(_ path: String) -> Bool {
        var st = stat()
        return lstat(path, &st) == 0
    }

    /// What active/.format holds: the format, and the oldest format that reads it (the format itself unless said);
    /// nil if it is missing or not that.
    private func readFormat() -> (format: Int, readFrom: Int)? {
        guard case .success(let data) = readRegularFile(formatPath, limit: 64) else { return nil }
        let fields = String(decoding: data, as: UTF8.self).split(whereSeparator: \.isWhitespace).map { Int($0) }
        guard fields.count == 1 || fields.count == 2, let format = fields[0], format > 0 else { return nil }
        guard fields.count == 2 else { return (format, format) }
        guard let readFrom = fields[1], readFrom > 0, readFrom <= format else { return nil }
        return (format, readFrom)
    }

    /// Names in active/ that hold a job: its visible folders, what waits in active/.submissions, and the hooks due for
    /// published jobs (active/.hooks).
    private func jobsInActive() -> [String] {
        visibleNames(in: active) + visibleNames(in: submissionsFolder).map { ".submissions/" + $0 }
            + visibleNames(in: active + "/.hooks").map { ".hooks/" + $0 }
    }
}

/// active/ in a format newer than this build reads, with jobs in it.
struct SpoolFormatError: Error, CustomStringConvertible {
    let description: String
}

/// The first three names, and "…" when there are more: enough to find the rest in a message.
func firstNames(_ names: [String]) -> String {
    names.prefix(3).joined(separator: ", ") + (names.count > 3 ? ", …" : "")
}
