// The spool protocol (SPEC §2): work moves between folders by rename, and every step that matters
// is on disk (fsync) before the next one, so a crash at any point loses nothing.
//
//   claim     mkdir active/<job>/ (the id is taken) → write job.plist (inbox name, time; fsync)
//             → rename inbox/<name> → active/<job>/manifest.plist → fsync both folders
//   progress  active/<job>/done.log: one fsynced line per operation that succeeded
//   publish   build tmp/<job>.<n>/ (manifest, result.plist, outputs hard-linked from active/<job>/out/),
//             fsync files and folder → rename to outbox/<job> → fsync outbox/ → remove active/<job>/
//   recover   active/<job>/ without a manifest: never claimed, removed (the inbox file is still there);
//             with an outbox/<job>: already published, removed; otherwise resumed. tmp/ is emptied.
//
// What it trusts: nothing in the inbox. Only regular files named *.plist (not starting with '.') are
// claimed, opened without following symlinks.

import CShims
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

/// A job claimed into active/.
public struct ClaimedJob: Sendable {
    public var id: String
    /// The id it asked for, when a collision renamed it.
    public var requestedJob: String?
    /// The inbox file name.
    public var manifestName: String
    public var receivedAt: Double
    public var manifest: Data
    /// Operations that succeeded before a restart: id → (startedAt, finishedAt, attempts).
    public var done: [String: DoneRecord]
}

public struct DoneRecord: Sendable, Equatable {
    public var startedAt: Double
    public var finishedAt: Double
    public var attempts: Int
}

public final class Spool: @unchecked Sendable {
    public let root: String
    public let inbox: String
    public let active: String
    public let outbox: String
    public let tmp: String
    private var publishCounter = 0
    private var lockFD: Int32 = -1

    public init(root: String) throws {
        self.root = root
        inbox = root + "/inbox"
        active = root + "/active"
        outbox = root + "/outbox"
        tmp = root + "/tmp"
        for dir in [root, inbox, active, outbox, tmp] {
            if mkdir(dir, 0o755) != 0 && errno != EEXIST { throw SpoolError(operation: "mkdir", path: dir, errno: errno) }
            var st = stat()
            guard stat(dir, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else { throw SpoolError(operation: "stat", path: dir, errno: ENOTDIR) }
        }
        // One daemon per spool: two would race for the same claims.
        lockFD = open(root + "/opqueued.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o640)
        guard lockFD >= 0 else { throw SpoolError(operation: "open", path: root + "/opqueued.lock", errno: errno) }
        guard flock(lockFD, LOCK_EX | LOCK_NB) == 0 else {
            close(lockFD)
            throw SpoolError(operation: "another opqueued holds the lock on", path: root + "/opqueued.lock", errno: EWOULDBLOCK)
        }
    }

    // MARK: Inbox

    /// Names in the inbox that may be claimed (`*.plist`, not starting with '.'), oldest name order.
    /// At most `limit` names are returned: a scan stays cheap with thousands waiting.
    public func candidates(limit: Int) -> [String] {
        guard let dir = opendir(inbox) else { return [] }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard !name.hasPrefix("."), name.hasSuffix(".plist") else { continue }
            names.append(name)
        }
        names.sort()
        return Array(names.prefix(limit))
    }

    /// Names in the inbox that are not manifests (logged once by the daemon).
    public func strangers() -> [String] {
        guard let dir = opendir(inbox) else { return [] }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name.hasPrefix(".") || name.hasSuffix(".plist") { continue }
            names.append(name)
        }
        return names
    }

    /// Seconds since the file was last modified, or nil if it is not a regular file.
    public func age(of name: String, now: Double) -> Double? {
        var st = stat()
        guard lstat(inbox + "/" + name, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { return nil }
        return now - (Double(st.st_mtim.tv_sec) + Double(st.st_mtim.tv_nsec) / 1e9)
    }

    public enum ClaimOutcome {
        case claimed(ClaimedJob)
        /// Gone before it could be claimed (another process, or a rename under way).
        case vanished
        /// Not a regular file, or unreadable: left alone.
        case skipped(String)
    }

    /// Claims one inbox file: its job id is its `job` key if valid, else its file name; a collision
    /// with active/ or outbox/ appends `.1`, `.2`, …
    public func claim(_ name: String, requestedJob: (Data) -> String?, now: Double) throws -> ClaimOutcome {
        let source = inbox + "/" + name
        let data: Data
        switch readRegularFile(source) {
        case .success(let d): data = d
        case .failure(let e):
            if e.errno == ENOENT { return .vanished }
            return .skipped(e.description)
        }
        let stem = String(name.dropLast(".plist".count))
        var wanted = sanitizedIdentifier(stem)
        if let asked = requestedJob(data), isValidIdentifier(asked) { wanted = asked }
        if wanted.hasPrefix(".") { wanted = "_" + wanted.dropFirst() }
        var id = wanted
        var n = 0
        while true {
            if access(outbox + "/" + id, F_OK) != 0 {
                if mkdir(active + "/" + id, 0o750) == 0 { break }
                if errno != EEXIST { throw SpoolError(operation: "mkdir", path: active + "/" + id, errno: errno) }
            }
            n += 1
            id = "\(wanted).\(n)"
        }
        let dir = active + "/" + id
        var info: [String: Any] = ["manifest": name, "receivedAt": now]
        if id != wanted { info["requestedJob"] = wanted }
        do {
            try writeDurably(PropertyListSerialization.data(fromPropertyList: info, format: .binary, options: 0), to: dir + "/job.plist")
        } catch {
            removeTree(dir)
            throw error
        }
        if rename(source, dir + "/manifest.plist") != 0 {
            let e = errno
            removeTree(dir)
            if e == ENOENT { return .vanished }
            throw SpoolError(operation: "rename", path: source, errno: e)
        }
        try syncDirectory(dir)
        try syncDirectory(inbox)
        try syncDirectory(active)
        return .claimed(ClaimedJob(id: id, requestedJob: id != wanted ? wanted : nil, manifestName: name, receivedAt: now, manifest: data, done: [:]))
    }

    // MARK: Recovery

    /// Jobs left in active/ by a previous run, ready to resume; cleans what was half done.
    public func recover() -> (jobs: [ClaimedJob], problems: [String]) {
        var problems: [String] = []
        for name in (try? FileManager.default.contentsOfDirectory(atPath: tmp)) ?? [] { removeTree(tmp + "/" + name) }
        var jobs: [ClaimedJob] = []
        for id in ((try? FileManager.default.contentsOfDirectory(atPath: active)) ?? []).sorted() {
            let dir = active + "/" + id
            guard access(dir + "/manifest.plist", F_OK) == 0 else { removeTree(dir); continue }
            if access(outbox + "/" + id, F_OK) == 0 { removeTree(dir); continue }
            guard case .success(let manifest) = readRegularFile(dir + "/manifest.plist") else {
                problems.append("active/\(id)/manifest.plist cannot be read; left in place")
                continue
            }
            var name = id + ".plist"
            var receivedAt = Date().timeIntervalSince1970
            var requested: String?
            if case .success(let data) = readRegularFile(dir + "/job.plist"),
               let info = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any] {
                name = info["manifest"] as? String ?? name
                receivedAt = info["receivedAt"] as? Double ?? receivedAt
                requested = info["requestedJob"] as? String
            }
            jobs.append(ClaimedJob(id: id, requestedJob: requested, manifestName: name, receivedAt: receivedAt, manifest: manifest, done: readDoneLog(dir)))
        }
        return (jobs, problems)
    }

    private func readDoneLog(_ dir: String) -> [String: DoneRecord] {
        guard case .success(let data) = readRegularFile(dir + "/done.log") else { return [:] }
        var done: [String: DoneRecord] = [:]
        // A torn last line (crash mid-append) has no newline and is ignored.
        let text = String(decoding: data, as: UTF8.self)
        for line in text.split(separator: "\n", omittingEmptySubsequences: true) where text.contains(line + "\n") {
            let parts = line.split(separator: "\t")
            guard parts.count == 4, let s = Double(parts[1]), let f = Double(parts[2]), let a = Int(parts[3]) else { continue }
            done[String(parts[0])] = DoneRecord(startedAt: s, finishedAt: f, attempts: a)
        }
        return done
    }

    // MARK: Progress

    /// Records, durably, that an operation succeeded (it will not run again after a restart).
    public func recordSuccess(job: String, operation: String, record: DoneRecord) throws {
        let path = active + "/" + job + "/done.log"
        let line = "\(operation)\t\(record.startedAt)\t\(record.finishedAt)\t\(record.attempts)\n"
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o640)
        guard fd >= 0 else { throw SpoolError(operation: "open", path: path, errno: errno) }
        defer { close(fd) }
        try writeAll(fd, Data(line.utf8), path: path)
        guard fsync(fd) == 0 else { throw SpoolError(operation: "fsync", path: path, errno: errno) }
    }

    /// The folder where a job's `write` operations put their files before publication.
    public func outputFolder(job: String) -> String { active + "/" + job + "/out" }

    // MARK: Publication

    /// Publishes outbox/<job>/ whole: manifest, result.plist and the outputs, then forgets active/<job>/.
    public func publish(job: String, manifest: Data, result: Data) throws {
        publishCounter += 1
        let staging = tmp + "/\(job).\(getpid()).\(publishCounter)"
        removeTree(staging)
        guard mkdir(staging, 0o755) == 0 else { throw SpoolError(operation: "mkdir", path: staging, errno: errno) }
        do {
            try writeDurably(manifest, to: staging + "/manifest.plist", syncFolder: false)
            try writeDurably(result, to: staging + "/result.plist", syncFolder: false)
            let out = outputFolder(job: job)
            if access(out, F_OK) == 0 { try linkTree(from: out, to: staging) }
            try syncDirectory(staging)
            guard rename(staging, outbox + "/" + job) == 0 else { throw SpoolError(operation: "rename", path: staging, errno: errno) }
        } catch {
            removeTree(staging)
            throw error
        }
        try syncDirectory(outbox)
        removeTree(active + "/" + job)
        try syncDirectory(active)
    }

    private func linkTree(from source: String, to destination: String) throws {
        for name in try FileManager.default.contentsOfDirectory(atPath: source) {
            let s = source + "/" + name, d = destination + "/" + name
            var st = stat()
            guard lstat(s, &st) == 0 else { throw SpoolError(operation: "lstat", path: s, errno: errno) }
            if (st.st_mode & S_IFMT) == S_IFDIR {
                if mkdir(d, 0o755) != 0 && errno != EEXIST { throw SpoolError(operation: "mkdir", path: d, errno: errno) }
                try linkTree(from: s, to: d)
                try syncDirectory(d)
            } else if (st.st_mode & S_IFMT) == S_IFREG {
                if link(s, d) != 0 && errno != EEXIST { throw SpoolError(operation: "link", path: s, errno: errno) }
            }
        }
    }
}

// MARK: File helpers (each error says what was done to which path)

func readRegularFile(_ path: String, limit: Int = ManifestLimits.maxBytes + 1) -> Result<Data, SpoolError> {
    let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
    guard fd >= 0 else { return .failure(SpoolError(operation: "open", path: path, errno: errno)) }
    defer { close(fd) }
    var st = stat()
    guard fstat(fd, &st) == 0 else { return .failure(SpoolError(operation: "fstat", path: path, errno: errno)) }
    guard (st.st_mode & S_IFMT) == S_IFREG else { return .failure(SpoolError(operation: "open", path: path, errno: EINVAL)) }
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

func writeAll(_ fd: Int32, _ data: Data, path: String) throws {
    try data.withUnsafeBytes { raw in
        guard let base = raw.baseAddress else { return }
        var offset = 0
        while offset < raw.count {
            let n = write(fd, base + offset, raw.count - offset)
            if n < 0 {
                if errno == EINTR { continue }
                throw SpoolError(operation: "write", path: path, errno: errno)
            }
            offset += n
        }
    }
}

/// Writes a file and fsyncs it (and, by default, its folder).
public func writeDurably(_ data: Data, to path: String, syncFolder: Bool = true) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o644)
    guard fd >= 0 else { throw SpoolError(operation: "create", path: path, errno: errno) }
    do {
        try writeAll(fd, data, path: path)
        guard fsync(fd) == 0 else { throw SpoolError(operation: "fsync", path: path, errno: errno) }
    } catch {
        close(fd)
        throw error
    }
    close(fd)
    if syncFolder { try syncDirectory((path as NSString).deletingLastPathComponent) }
}

func syncDirectory(_ path: String) throws {
    let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard fd >= 0 else { throw SpoolError(operation: "open", path: path, errno: errno) }
    defer { close(fd) }
    guard fsync(fd) == 0 else { throw SpoolError(operation: "fsync", path: path, errno: errno) }
}

func removeTree(_ path: String) {
    try? FileManager.default.removeItem(atPath: path)
}
