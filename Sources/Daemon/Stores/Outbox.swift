// The outbox of ended jobs, read and pruned (SPEC §1 list, retry and clean; §6 outbox.keepDays): what
// `opqueuectl list` and `clean` and the daemon's retention (Shell/Daemon+Retention.swift) do to it, in one place.
//
//   read    the folder is read as a stream (readdir), one entry at a time; of each outbox/<name>/result.plist only
//           the top-level job, status, node, finishedAt and durationSeconds are read (PlistTopLevel: the operations
//           of a big job are skipped through, never held), so memory does not grow with the outbox or its results
//   find    an ended job by its id (show, wait, retry): under its own names first; only when they miss is every
//           folder read, for a result whose `job` is the id (a folder an operator renamed is still its job's)
//   prune   an entry whose finishedAt is older than the cutoff (and of a status asked for) is renamed into tmp/ (the
//           same file system: the spool's tmp/, or a shared outbox's .tmp/), then removed there: whoever reads the
//           outbox sees a job's folder whole or not at all; what a crash leaves in the spool's tmp/ goes at the
//           daemon's next start
//
// What it trusts: nothing in the outbox. A folder without a readable result.plist (someone's own folder) is reported
// and left alone; symbolic links are never followed; a result file that is not a regular file is not opened.

import CShims
import Foundation
import JobModel
import PropertyList
import SpoolFiles
import Synchronization
import SystemCalls

/// What list and clean need of an ended job: a few top-level keys of its result.plist (SPEC §5).
public struct OutboxEntry: Sendable, Equatable {
    /// The folder's name in the outbox: the job's id, or `job`.N when that name was taken as it ended, or whatever
    /// an operator renamed it to.
    public var name: String
    /// The result's `job`.
    public var job: String
    /// The result's `status` (SPEC §3.4; kept as written: a newer daemon's status is still listed).
    public var status: String
    public var node: String?
    public var finishedAt: Double
    public var durationSeconds: Double?
}

/// Something in the outbox that could not be read or removed: what, and why.
public struct OutboxProblem: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ description: String) { self.description = description }
}

public enum Outbox {
    /// The statuses a job ends with (SPEC §3.4), for `--status`.
    public static let statuses: [String] = JobStatus.allCases.map(\.rawValue)

    /// The keys of result.plist read for an entry.
    static let resultKeys: Set<String> = ["job", "status", "node", "finishedAt", "durationSeconds"]

    /// The top-level `keys` of entry `name`'s result.plist, in the outbox open as `folder` (a descriptor, `path` for
    /// messages): nil when it is no folder (a file, a symbolic link) or has gone meanwhile; else the keys, or why its
    /// result cannot be read. Reading stops once every key is seen (result.plist's keys are sorted: `job` comes
    /// before the operations, `status` after them).
    static func readTop(_ name: String, in folder: Int32, path: String, keys: Set<String>) -> Result<PlistDictionary, OutboxProblem>? {
        let job = openat(folder, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard job >= 0 else {
            let e = errno
            if [ENOENT, ENOTDIR, ELOOP].contains(e) { return nil }
            return .failure(OutboxProblem("\(path)/\(name): cannot be opened: \(String(cString: strerror(e)))"))
        }
        defer { close(job) }
        let file = "\(path)/\(name)/result.plist"
        let fd = openat(job, "result.plist", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return .failure(OutboxProblem("\(file): cannot be opened: \(String(cString: strerror(errno)))")) }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { return .failure(OutboxProblem("\(file): not a regular file")) }
        do {
            return .success(try PlistTopLevel.read(keys: keys) { buffer in
                retryingInterrupts { read(fd, buffer.baseAddress, buffer.count) }
            })
        } catch {
            return .failure(OutboxProblem("\(file): \(error)"))
        }
    }

    /// Entry `name` of the outbox open as `folder` (a descriptor, `path` for messages): nil when it is no folder
    /// (a file, a symbolic link) or has gone meanwhile; else its entry, or why its result cannot be read.
    static func readEntry(_ name: String, in folder: Int32, path: String) -> Result<OutboxEntry, OutboxProblem>? {
        let top: PlistDictionary
        switch readTop(name, in: folder, path: path, keys: resultKeys) {
        case nil: return nil
        case .failure(let problem)?: return .failure(problem)
        case .success(let read)?: top = read
        }
        guard let id = top["job"]?.string, let status = top["status"]?.string, let finishedAt = top["finishedAt"]?.real else {
            let missing = ["job", "status", "finishedAt"].filter { top[$0] == nil }
            let why = missing.isEmpty ? "job, status or finishedAt of the wrong type" : "no \(missing.joined(separator: ", "))"
            return .failure(OutboxProblem("\(path)/\(name)/result.plist: \(why)"))
        }
        // The same storage for the name and the id when they are equal (they are, but for a renamed entry).
        return .success(OutboxEntry(name: name, job: id == name ? name : id, status: status, node: top["node"]?.string,
                                    finishedAt: finishedAt, durationSeconds: top["durationSeconds"]?.real))
    }

    /// Entry `name` of `outbox`: nil when there is no such folder.
    public static func entry(_ name: String, in outbox: String) -> Result<OutboxEntry, OutboxProblem>? {
        let folder = open(outbox, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard folder >= 0 else { return nil }
        defer { close(folder) }
        return readEntry(name, in: folder, path: outbox)
    }

    /// The outbox entry of ended job `job` (outbox/<job>, else the first <job>.N whose result names the job: see
    /// `Spool.place(job:)`), read as `list` reads one, whatever the size of its result. Nil while there is none;
    /// a failure when outbox/<job> is there but its result cannot be read — the job has ended, but what it says is
    /// lost to the reader (a reader waiting for it would otherwise wait for ever).
    public static func ended(_ job: String, in outbox: String) -> Result<OutboxEntry, OutboxProblem>? {
        let folder = open(outbox, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard folder >= 0 else { return nil }
        defer { close(folder) }
        var unreadable: OutboxProblem?
        for name in Spool.entryNames(job) {
            switch readEntry(name, in: folder, path: outbox) {
            // No such name: the search ends. A file or link of that name: the job was placed beyond it.
            case nil: if faccessat(folder, name, F_OK, AT_SYMLINK_NOFOLLOW) != 0 { return unreadable.map { .failure($0) } }
            case .success(let entry) where entry.job == job: return .success(entry)
            case .success: continue
            // A folder without result.plist is someone's own, not an entry; one with a result that cannot be read is.
            case .failure(let problem):
                if name == job, faccessat(folder, name + "/result.plist", F_OK, AT_SYMLINK_NOFOLLOW) == 0 { unreadable = problem }
            }
        }
        return unreadable.map { .failure($0) }
    }

    /// What `find` found of an ended job.
    public enum Found: Sendable {
        case entry(OutboxEntry)
        /// Its folder is there, but its result cannot be read.
        case unreadable(OutboxProblem)
        /// Several folders, none under the job's own names, whose results name the job: which is its own cannot be told.
        case several([OutboxEntry])
    }

    /// The outbox entry of ended job `job`, wherever its folder is: `ended`'s names first (outbox/<job>, <job>.N: a
    /// few opens, no scan), and only when they hold none every folder of the outbox, for one whose result's `job` is
    /// the job: an operator renamed it (`mv outbox/J outbox/J.keep`; `list` lists it as J). Only `job` is read of
    /// each result (it comes before the operations). `search` false: the names alone. Nil when nothing holds the job.
    public static func find(_ job: String, in outbox: String, search: Bool = true) -> Found? {
        switch ended(job, in: outbox) {
        case .success(let entry)?: return .entry(entry)
        case .failure(let problem)?: return .unreadable(problem)
        case nil: break
        }
        guard search, let reader = try? OutboxReader(outbox) else { return nil }
        var found: [OutboxEntry] = []
        while let name = reader.nextName() {
            guard case .success(let top)? = readTop(name, in: reader.folder, path: outbox, keys: ["job"]), top["job"]?.string == job,
                  case .success(let entry)? = readEntry(name, in: reader.folder, path: outbox), entry.job == job else { continue }
            found.append(entry)
        }
        switch found.count {
        case 0: return nil
        case 1: return .entry(found[0])
        default: return .several(found.sorted { $0.name < $1.name })
        }
    }

    /// The id the ended job whose folder is `folder` asked for (its result's `requestedJob`, else its `job`): what
    /// `opqueuectl retry` asks for again. Nil when its result cannot be read.
    public static func requestedID(ofEntry folder: String) -> String? {
        let fd = open(folder + "/result.plist", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        let top = try? PlistTopLevel.read(keys: ["job", "requestedJob"]) { buffer in
            retryingInterrupts { read(fd, buffer.baseAddress, buffer.count) }
        }
        return top?["requestedJob"]?.string ?? top?["job"]?.string
    }

    /// Removes entry `name` of `outbox`: renamed into `tmp` (a folder on the same file system), then removed there.
    /// False when it was gone already (someone else removed it); throws when it cannot be moved, or cannot all be removed.
    @discardableResult
    public static func remove(_ name: String, from outbox: String, through tmp: String) throws(OutboxProblem) -> Bool {
        if mkdir(tmp, 0o750) != 0, case let e = errno, e != EEXIST {
            throw OutboxProblem("\(tmp): cannot be made (to remove \(outbox)/\(name) through it): \(String(cString: strerror(e)))")
        }
        // Unique, and within NAME_MAX whatever the folder's name.
        let shortName = String(decoding: name.utf8.prefix(128), as: UTF8.self)
        let hidden = tmp + "/.removing.\(getpid()).\(removals.add(1, ordering: .relaxed).newValue).\(shortName)"
        guard rename(outbox + "/" + name, hidden) == 0 else {
            let e = errno
            if e == ENOENT { return false }
            throw OutboxProblem("\(outbox)/\(name): cannot be moved to \(tmp) to be removed: \(String(cString: strerror(e)))"
                + (e == EXDEV ? " (\(tmp) is on another file system)" : ""))
        }
        removeTree(hidden)
        // Out of the outbox, but something in it would not go (an immutable file, a folder without write permission).
        guard access(hidden, F_OK) != 0 else {
            throw OutboxProblem("\(outbox)/\(name): moved to \(hidden) to be removed, but not all of it could be removed there")
        }
        return true
    }

    /// Removals made by this process, for unique names in tmp/.
    private static let removals = Atomic<Int>(0)
}

/// The outbox's folder read as a stream: one entry at a time, in directory order (not Sendable: one thread).
public final class OutboxReader {
    public let path: String
    /// The outbox's folder, open.
    let folder: Int32
    private let stream: OpaquePointer
    /// Node names, kept once each (a cluster has a handful): an entry's `node` shares their storage.
    private var nodes: [String: String] = [:]

    public init(_ path: String) throws(OutboxProblem) {
        self.path = path
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw OutboxProblem("\(path): cannot be read: \(String(cString: strerror(errno)))") }
        guard let stream = fdopendir(fd) else {
            close(fd)
            throw OutboxProblem("\(path): cannot be read: \(String(cString: strerror(errno)))")
        }
        self.stream = stream
        folder = fd
    }

    deinit { closedir(stream) }

    /// The next name in the folder that is not hidden (a shared outbox's .tmp/), nil at the end: nothing is opened.
    func nextName() -> String? {
        while let dirent = readdir(stream) {
            let bytes = direntName(dirent)
            guard let first = bytes.first, first != UInt8(ascii: "."), let name = String(validating: bytes, as: UTF8.self) else { continue }
            return name
        }
        return nil
    }

    /// The next entry, or why the next folder's result cannot be read; nil at the end. Hidden names (a shared
    /// outbox's .tmp/) and what is not a folder are passed over.
    public func next() -> Result<OutboxEntry, OutboxProblem>? {
        while let name = nextName() {
            guard var read = Outbox.readEntry(name, in: folder, path: path) else { continue }
            if case .success(var entry) = read, let node = entry.node {
                if let known = nodes[node] { entry.node = known } else if nodes.count < 1024 { nodes[node] = node }
                read = .success(entry)
            }
            return read
        }
        return nil
    }
}

/// The removal of ended jobs' folders finished before a cutoff, a batch at a time (`opqueuectl clean`, and the
/// daemon's retention, which yields between batches). Not Sendable: one thread.
public final class OutboxSweep {
    /// What is removed: entries whose finishedAt is before `cutoff` (seconds since the epoch) and, when `statuses`
    /// is given, whose status is one of them.
    public struct Criteria: Sendable {
        public var cutoff: Double
        public var statuses: Set<String>?
        public init(cutoff: Double, statuses: Set<String>? = nil) {
            self.cutoff = cutoff
            self.statuses = statuses
        }

        public func matches(_ entry: OutboxEntry) -> Bool {
            entry.finishedAt < cutoff && statuses.map { $0.contains(entry.status) } != false
        }
    }

    /// What a step did with one entry.
    public enum Event {
        /// Removed (or, in a dry run, would be).
        case removed(OutboxEntry)
        /// Matches, and could not be removed.
        case failed(OutboxEntry, OutboxProblem)
        /// A folder whose result cannot be read: left alone.
        case unreadable(OutboxProblem)
    }

    public let criteria: Criteria
    private let reader: OutboxReader
    private let tmp: String
    private let dryRun: Bool

    /// `tmp`: where entries are moved to be removed, on the outbox's file system.
    public init(outbox: String, tmp: String, criteria: Criteria, dryRun: Bool = false) throws(OutboxProblem) {
        reader = try OutboxReader(outbox)
        self.tmp = tmp
        self.criteria = criteria
        self.dryRun = dryRun
    }

    /// Looks at up to `limit` more entries, removing those that match, each said through `report`; false once the
    /// outbox has been read to its end.
    public func step(limit: Int, report: (Event) -> Void) -> Bool {
        for _ in 0..<limit {
            guard let next = reader.next() else { return false }
            switch next {
            case .failure(let problem):
                report(.unreadable(problem))
            case .success(let entry) where criteria.matches(entry):
                if dryRun {
                    report(.removed(entry))
                    continue
                }
                do {
                    if try Outbox.remove(entry.name, from: reader.path, through: tmp) { report(.removed(entry)) }
                } catch {
                    report(.failed(entry, error))
                }
            case .success:
                break
            }
        }
        return true
    }
}

extension Spool {
    /// The ids a claim tries in turn for a manifest that asks for `wanted` (SPEC §2): `wanted`, `wanted.1`, `wanted.2`, …
    static func claimIDs(_ wanted: String) -> some Sequence<String> {
        (0...).lazy.map { $0 == 0 ? wanted : "\(wanted).\($0)" }
    }

    /// The id a manifest asking for `wanted` would get if the daemon of the spool at `root` claimed it now: the first
    /// of `claimIDs` held neither in active/ nor in outbox/ (what `opqueuectl retry` prints when no daemon answers).
    public static func nextFreeID(_ wanted: String, root: String) -> String {
        claimIDs(wanted).first { access(root + "/active/" + $0, F_OK) != 0 && access(root + "/outbox/" + $0, F_OK) != 0 } ?? wanted
    }
}

extension Manifest {
    /// An ended job's manifest as `opqueuectl retry` submits it again (SPEC §3.7): under the `.1` rule whatever its
    /// `ifJobExists`, so a manifest saying anything but `rename` there is written again without the key (`rename` is
    /// the default) in its own format; any other manifest, or one that cannot be read, is returned as it is.
    public static func forRetry(_ data: Data) -> Data {
        guard case .success(.dictionary(var top)) = ManifestTree(data).value, let policy = top["ifJobExists"],
              policy.string != "rename" else { return data }
        top["ifJobExists"] = nil
        let binary = data.starts(with: Array("bplist".utf8))
        return Data(binary ? PlistBinaryWriter.document(.dictionary(top)) : PlistXMLWriter.document(.dictionary(top)))
    }
}
