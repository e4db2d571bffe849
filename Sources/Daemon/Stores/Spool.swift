// The spool protocol (SPEC §2): work moves between folders by rename, and every step that matters
// is on disk before the next one depends on it, so a crash at any point loses nothing.
//
//   claim     mkdir active/<job>/ (the id is taken) → record the inbox name and time on it (an extended
//             attribute, or job.plist where the file system has none) → rename inbox/<name> →
//             active/<job>/manifest.plist
//   progress  active/.progress.log: one line per operation that succeeded (job, operation, times, attempts)
//             or was cancelled by request (job, operation, `cancelled`, time), and per job cancelled whole by
//             request (job, `*`, `cancelled-job`, time), shared by all jobs; rewritten with only the active jobs'
//             lines at start and when it grows large
//   publish   active/<job>/ is assembled into the outbox entry: result.plist is written beside the manifest
//             and the outputs → commit → rename active/<job> → outbox/<job> → commit
//   recover   active/<job>/ without a manifest: never claimed, removed (the inbox file is still there) when it
//             holds nothing but its record, else left with an error (someone's files), as is anything in active/
//             that is not a folder; otherwise resumed, skipping the operations the progress log lists as
//             succeeded and cancelling again those it lists as cancelled (all of them, for a job cancelled
//             whole: it ends cancelled, delayed or not, without running anything). tmp/ is emptied.
//   downloads active/.downloads/<job>/<operation>, written by the operations (Downloads.swift); removed
//             after publication, and at recovery for jobs no longer active (partial files too).
//   delayed   active/.delayed: a line per delayed job parked out of memory (DelayedRecord.swift); emptied at
//             start, where recovery finds every delayed job from its manifest again.
//
// Group commit: `commit()` makes everything written so far durable at once — one syncfs(2) of the spool's file
// system, or on ext4 the spool's own files written out and one journal commit (SpoolSync.swift) — made once
// per batch of claims, of progress lines or of publications rather than one fsync per file and folder. On this
// kind of machine an fsync costs ~290 µs and a syncfs over 1,000 new files ~28 ms. Every write names what it
// wrote to `sync` before asking for a commit. Nothing is announced (journal, outbox) before the commit that
// makes it durable.
//
// Few inodes: a job costs two new inodes (its folder and result.plist) and frees none. ext4 skips
// inodes freed in the last ~30 s when it allocates, scanning past each one, so per-job files created
// and deleted (a done.log, a staging folder, a copy of the manifest) made allocation the bottleneck.
//
// What it trusts: nothing in the inbox. Only regular files named *.plist (not starting with '.') are
// claimed, opened without following symlinks, and only once no one has them open for writing (a read
// lease; see `claim`).

import CShims
import Foundation
import JobModel
import SpoolFiles
import Synchronization
import HeapModule
import PropertyList

#if canImport(Glibc)
import Glibc
import SystemCalls
#endif

/// A job claimed into active/.
public struct ClaimedJob: Sendable {
    public var id: String
    /// The id it asked for, when a collision renamed it.
    public var requestedJob: String?
    /// The inbox file name.
    public var manifestName: String
    public var receivedAt: Double
    public var manifest: Data
    /// The manifest as read at claim, until the job is accepted (not kept with the running job: a big
    /// manifest's tree is several times the plan made of it). Nil for jobs recovered from active/.
    public var tree: ManifestTree?
    /// The plan made of `tree` when the shell read it for a store that places jobs itself (the store reads the
    /// job's placement from it rather than parse the manifest again).
    public var plan: JobPlan? = nil
    /// Operations that succeeded before a restart: id → (startedAt, finishedAt, attempts).
    public var done: [String: DoneRecord]
    /// Cancels asked before the job came here (in a cluster, while it waited), in order: nil for the whole job,
    /// else an operation's id. Made before any of its operations starts.
    public var cancels: [String?] = []
    /// The inbox file's inode, for a job claimed from the inbox: with its name, which file it was (a name is used
    /// again; `opqueuectl submit` asks which id the file it placed got).
    public var inboxInode: UInt64? = nil
}

public struct DoneRecord: Sendable, Equatable {
    public var startedAt: Double
    public var finishedAt: Double
    public var attempts: Int
}

/// An operation's success, for the progress log.
public struct OperationSuccess: Sendable {
    public var job: String
    public var operation: String
    public var record: DoneRecord
}

public final class Spool: @unchecked Sendable {
    public let root: String
    public let inbox: String
    public let active: String
    public let outbox: String
    public let tmp: String
    public var folders: SpoolFolders { SpoolFolders(root: root, inbox: inbox, active: active, outbox: outbox, tmp: tmp) }
    private var lockFD: Int32 = -1
    private var rootFD: Int32 = -1
    /// What the next commit writes out, and how it commits.
    let sync: SpoolSync
    /// active/.progress.log, open for appending; its lock also orders compaction against appends.
    var progressFD: Int32 = -1
    var progressBytes = 0
    let progressLock = NSLock()
    var progressPath: String { active + "/.progress.log" }
    /// The progress log is rewritten (keeping only active jobs' lines) once it is this large.
    static let progressCompactionBytes = 32 << 20
    /// The format active/.format named when it was newer than this build's and active/ held no job (taken over; 0
    /// when it named none), for the journal.
    public private(set) var formatTakenOver: Int?
    /// How many times the inbox was read whole (`scanInbox`), for tests.
    let inboxReads = Mutex(0)

    public init(root: String) throws {
        self.root = root
        sync = SpoolSync(root: root)
        inbox = root + "/inbox"
        active = root + "/active"
        outbox = root + "/outbox"
        tmp = root + "/tmp"
        _ = try makeFolders()
        // Claims take read leases (released within the claim); a writer opening a file mid-claim breaks
        // the lease, and the kernel tells the holder with SIGIO, whose default action ends the process.
        opq_ignore_lease_breaks()
        // One daemon per spool: two would race for the same claims.
        lockFD = open(root + "/opqueued.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o640)
        guard lockFD >= 0 else { throw SpoolError(operation: "open", path: root + "/opqueued.lock", errno: errno) }
        guard flock(lockFD, LOCK_EX | LOCK_NB) == 0 else {
            close(lockFD)
            throw SpoolError(operation: "another opqueued holds the lock on", path: root + "/opqueued.lock", errno: EWOULDBLOCK)
        }
        rootFD = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard rootFD >= 0 else { throw SpoolError(operation: "open", path: root, errno: errno) }
        // The spool folder itself is locked too: a lock file removed by a careless clean-up would otherwise let a
        // second daemon in.
        guard flock(rootFD, LOCK_EX | LOCK_NB) == 0 else {
            close(lockFD)
            close(rootFD)
            throw SpoolError(operation: "another opqueued holds the lock on", path: root, errno: EWOULDBLOCK)
        }
        try checkOneMount()
        formatTakenOver = try adoptFormat()
    }

    /// Claims and publications rename between inbox/, active/, outbox/ and tmp/: one of them on another mount (a
    /// symbolic link to another file system, a bind mount) would fail each claim or publication with EXDEV, again
    /// and again. A hidden file is renamed through them once at start; the daemon refuses to start if that fails.
    private func checkOneMount() throws {
        let name = "/.opqueued-mount-check-\(getpid())"
        let path = [inbox, active, outbox, tmp].map { $0 + name }
        try writeFile(Data(), to: path[0])
        defer { for p in path { unlink(p) } }
        for (from, to) in zip(path, path.dropFirst()) where rename(from, to) != 0 {
            let e = errno
            let folder = { (p: String) in String(p.dropFirst(self.root.count + 1).prefix { $0 != "/" }) + "/" }
            if e == EXDEV {
                throw SpoolMountError(description: "\(folder(from)) and \(folder(to)) are on different mounts "
                    + "(a rename between them fails: \(String(cString: strerror(e)))); the whole spool must be on one mount")
            }
            throw SpoolError(operation: "rename to \(to)", path: from, errno: e)
        }
    }

    /// The names in `folder` that are not hidden (job ids in active/, submissions in active/.submissions), sorted;
    /// none if it cannot be read.
    func visibleNames(in folder: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).filter { !$0.hasPrefix(".") }.sorted()
    }

    /// Where a claimed job's inbox name and reception time are kept: an extended attribute of active/<job>/.
    static let jobAttribute = "user.opqueued.job"

    /// Makes everything written to the spool so far durable (SpoolSync.swift says how).
    public func commit() throws { try sync.commit(rootFD: rootFD, markerFD: lockFD) }

    /// Commits by ext4's journal where the spool's file system allows it (a spool opened by itself keeps syncfs):
    /// the daemon's node asks it for its spool, whichever store uses it.
    @discardableResult
    func preferJournalCommits(environment: [String: String] = ProcessInfo.processInfo.environment) -> SpoolSync.Method {
        sync.preferJournal(rootFD: rootFD, environment: environment)
    }

    // MARK: Inbox

    public struct InboxScan {
        /// Names that may be claimed (`*.plist`, not starting with '.'), in name order, at most the limit asked.
        public var manifests: [String]
        /// How many such names there were in all.
        public var waiting: Int
        /// Names that are not manifests (the daemon logs each once).
        public var strangers: [String]
        /// Manifests whose names were not UTF-8, renamed in the inbox to a name that is (shown lossily → new name).
        public var renamed: [(from: String, to: String)]
    }

    /// What the inbox offers as a manifest: a visible name ending in `.plist`.
    public static func isManifestName(_ name: String) -> Bool {
        name.hasSuffix(".plist") && !name.hasPrefix(".")
    }

    /// One pass over the inbox. A `*.plist` name that is not UTF-8 cannot be named in a result or a journal
    /// field: it is renamed in the inbox (never replacing a file) to its bytes with every invalid sequence
    /// as `_`, and claimed under that name.
    public func scanInbox(limit: Int) throws -> InboxScan {
        inboxReads.withLock { $0 += 1 }
        var scan = InboxScan(manifests: [], waiting: 0, strangers: [], renamed: [])
        let fd = open(inbox, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw SpoolError(operation: "open", path: inbox, errno: errno) }
        guard let dir = fdopendir(fd) else {
            close(fd)
            throw SpoolError(operation: "read", path: inbox, errno: errno)
        }
        defer { closedir(dir) }
        let suffix = Array(".plist".utf8)
        while let entry = readdir(dir) {
            let bytes = direntName(entry)
            guard let first = bytes.first, first != UInt8(ascii: ".") else { continue }
            guard let name = String(validating: bytes, as: UTF8.self) else {
                let shown = String(decoding: bytes, as: UTF8.self)
                guard bytes.count > suffix.count, bytes.suffix(suffix.count).elementsEqual(suffix) else {
                    scan.strangers.append(shown)
                    continue
                }
                if let renamed = renameToUTF8(bytes, shown: shown, folder: dirfd(dir)) {
                    scan.renamed.append((shown, renamed))
                    scan.manifests.append(renamed)
                }
                continue
            }
            if Self.isManifestName(name) {
                scan.manifests.append(name)
            } else {
                scan.strangers.append(name)
            }
        }
        scan.waiting = scan.manifests.count
        if scan.manifests.count > limit {
            // The oldest names, without sorting them all.
            var heap = Heap<String>()
            for name in scan.manifests {
                heap.insert(name)
                if heap.count > limit { _ = heap.popMax() }
            }
            scan.manifests = heap.unordered
        }
        scan.manifests.sort()
        return scan
    }

    /// Renames an inbox entry whose name is not UTF-8; returns the new name, or nil if it could not be.
    private func renameToUTF8(_ bytes: [UInt8], shown: String, folder: Int32) -> String? {
        let stem = String(shown.dropLast(".plist".count).map { $0 == "\u{FFFD}" ? "_" : $0 })
        for n in 0..<100 {
            let candidate = (n == 0 ? stem : "\(stem).\(n)") + ".plist"
            let result = (bytes + [0]).withUnsafeBufferPointer { from in
                from.withMemoryRebound(to: CChar.self) { opq_rename_noreplace(folder, $0.baseAddress, candidate) }
            }
            if result == 0 { return candidate }
            if result != -EEXIST { return nil }
        }
        return nil
    }

    /// Makes the spool's folders that are missing (at start, and when someone removed one while the daemon ran);
    /// returns the names of those it made. A name taken by something that is not a folder is an error.
    func makeFolders() throws -> [String] {
        var made: [String] = []
        for dir in [root, inbox, active, outbox, tmp] {
            if mkdir(dir, 0o755) == 0 {
                made.append(dir == root ? dir : String(dir.dropFirst(root.count + 1)) + "/")
            } else if errno != EEXIST {
                throw SpoolError(operation: "mkdir", path: dir, errno: errno)
            }
            var st = stat()
            guard stat(dir, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else {
                throw SpoolError(operation: "stat", path: dir, errno: ENOTDIR)
            }
        }
        return made
    }

    /// Checks that the spool can be written (a file created, filled and removed in tmp/): the daemon's way to learn
    /// that a fault (full file system, no descriptors left, read-only mount, a folder removed) is over. Its folders
    /// are made again where missing first; returns those it made.
    @discardableResult
    public func probe() throws -> [String] {
        let made = try makeFolders()
        let path = tmp + "/.probe"
        try writeFile(Data(count: 4096), to: path)
        unlink(path)
        return made
    }

    /// Seconds since the file was last modified, or nil if it is not a regular file.
    public func age(of name: String, now: Double) -> Double? {
        var st = stat()
        guard lstat(inbox + "/" + name, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { return nil }
        return now - (Double(st.st_mtim.tv_sec) + Double(st.st_mtim.tv_nsec) / 1e9)
    }

    /// When an inbox file last changed (its ctime: written and closed, or renamed in), in seconds since the
    /// epoch; nil if it is gone. The pickup latency is measured from here to the claim.
    public func changeTime(of name: String) -> Double? {
        var st = stat()
        guard lstat(inbox + "/" + name, &st) == 0 else { return nil }
        return Double(st.st_ctim.tv_sec) + Double(st.st_ctim.tv_nsec) / 1e9
    }

    public enum ClaimOutcome {
        case claimed(ClaimedJob)
        /// Gone before it could be claimed (another process, or a rename under way).
        case vanished
        /// Still open for writing somewhere (the kernel refused a read lease): tried again when inotify
        /// says it was closed, or at the next rescan.
        case busy
        /// No lease could be taken (`leaseRefused` says why), and the caller did not say the file had
        /// settled: tried again later.
        case unsettled
        /// Not a regular file of its own (a symlink, FIFO, folder, device, or a file with other hard
        /// links), or unreadable: left alone.
        case skipped(String)
        /// `ifJobExists = skip` and its id is held (§3.7): the manifest is removed, no job made. `held`: a descriptor of
        /// the removed file (or -1), for the caller to close a little later: its inode is not reused meanwhile by the
        /// next file of that name, which `opqueuectl submit` tells apart by inode.
        case exists(job: String, inode: UInt64?, held: Int32)
    }

    /// Errors that say the daemon (not the file) is in trouble: out of descriptors, memory, or I/O.
    static let resourceErrors: Set<Int32> = [EMFILE, ENFILE, ENOMEM, EIO, ENOSPC, EDQUOT, EROFS]

    /// Why the last lease refused for a reason other than a writer was refused (not the file's owner and
    /// no CAP_LEASE, a file system without leases); set by `claim`, for the daemon to log once.
    public private(set) var leaseRefused: String?

    /// Claims one inbox file: its job id is its `job` key if valid, else its file name; a collision
    /// with active/ or outbox/ appends `.1`, `.2`, … Durable at the next `commit()`. The manifest is read
    /// here, once: the claimed job carries the tree to validation.
    ///
    /// A file still open for writing is never claimed: a read lease (F_SETLEASE) is refused while anyone
    /// has it open for writing, and is held from before the read to after the rename, so a writer cannot
    /// open it in between (its open waits for the lease to be released). Where no lease can be had,
    /// `settled` (the caller's guess: inotify saw it closed, or it has not changed for a while) decides.
    /// The id a manifest asks for: its `job` key if valid, else its file name made an identifier (never hidden).
    static func wantedID(name: String, tree: ManifestTree) -> String {
        if let asked = tree.requestedJob, isValidIdentifier(asked) { return asked }
        return jobID(ofManifestFile: name)
    }

    /// `inUse` says which ids the caller still holds though their folders have left active/: a job whose folder
    /// is already in outbox/ (and may be taken away from there at once) but whose end is not yet announced.
    public func claim(_ name: String, now: Double, settled: Bool = true, inUse: (String) -> Bool = { _ in false }) throws -> ClaimOutcome {
        try take(name, settled: settled) { _, source, data, tree in
            try placeClaim(name, source: source, data: data, tree: tree, now: now, inUse: inUse)
        }
    }

    /// The checked read every claim starts with: opens inbox/<name> without following links or blocking, refuses
    /// what is not a regular file of its own, takes the read lease (or trusts `settled`), reads the manifest, and
    /// calls `place` with the descriptor, the path, the bytes and their tree while the lease is held. A file bigger
    /// than a manifest may be is not read: its bytes are empty and its tree says its size. A job claimed carries the
    /// file's inode (`inboxInode`).
    func take(_ name: String, settled: Bool, _ place: (Int32, String, Data, ManifestTree) throws -> ClaimOutcome) throws -> ClaimOutcome {
        let source = inbox + "/" + name
        let fd = open(source, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let e = SpoolError.opening(source, errno: errno)
            if e.errno == ENOENT { return .vanished }
            // Someone holds a write lease on it (and is writing, or about to): like a writer.
            if e.errno == EWOULDBLOCK { return .busy }
            if Self.resourceErrors.contains(e.errno) { throw e }
            return .skipped(e.description)
        }
        // Closing the descriptor also releases the lease, whatever way this returns.
        defer { close(fd) }
        var leased = false
        switch readRegularFile(fd, path: source, singleLink: true, check: true) {
        case .failure(let e):
            if Self.resourceErrors.contains(e.errno) { throw e }
            return .skipped(e.description)
        case .success:
            let lease = opq_lease(fd, 0)
            if lease == -EAGAIN { return .busy }
            if lease != 0 {
                let reason = String(cString: strerror(-lease))
                    + (lease == -EACCES || lease == -EPERM ? " (the file is not the daemon's user's and the daemon lacks CAP_LEASE)" : "")
                leaseRefused = "inbox/\(name): \(reason)"
                if !settled { return .unsettled }
            }
            leased = lease == 0
        }
        defer { if leased { _ = opq_lease(fd, 1) } }
        func placed(_ data: Data, _ tree: ManifestTree) throws -> ClaimOutcome {
            let outcome = try place(fd, source, data, tree)
            var st = stat()
            if case .exists(let job, _, _) = outcome, fstat(fd, &st) == 0 {
                return .exists(job: job, inode: UInt64(st.st_ino), held: dup(fd))
            }
            guard case .claimed(var job) = outcome, fstat(fd, &st) == 0 else { return outcome }
            job.inboxInode = UInt64(st.st_ino)
            return .claimed(job)
        }
        // Bigger than a manifest may be: claimed (to be rejected, saying its size) without reading a byte of it.
        if let tooLarge = Self.tooLargeToRead(fd) { return try placed(Data(), tooLarge) }
        let data: Data
        switch readRegularFile(fd, path: source, singleLink: true) {
        case .success(let d): data = d
        case .failure(let e):
            if Self.resourceErrors.contains(e.errno) { throw e }
            return .skipped(e.description)
        }
        return try placed(data, ManifestTree(data))
    }

    /// A claim's second half: active/<id>/ made (the id unique in active/ and outbox/, and not `inUse`), the record
    /// written, the manifest renamed in. `tree`: the manifest's, when the caller has it (for a file too large to
    /// read, the only word on it); else made from `data`.
    func placeClaim(_ name: String, source: String, data: Data, tree known: ManifestTree? = nil, now: Double,
                    inUse: (String) -> Bool) throws -> ClaimOutcome {
        let tree = known ?? ManifestTree(data)
        let wanted = Self.wantedID(name: name, tree: tree)
        if tree.skipsIfExists, inUse(wanted) || access(outbox + "/" + wanted, F_OK) == 0 || access(active + "/" + wanted, F_OK) == 0 {
            guard unlink(source) == 0 else {
                if errno == ENOENT { return .vanished }
                throw SpoolError(operation: "unlink", path: source, errno: errno)
            }
            return .exists(job: wanted, inode: nil, held: -1)
        }
        var id = wanted
        for candidate in Self.claimIDs(wanted) where !inUse(candidate) && access(outbox + "/" + candidate, F_OK) != 0 {
            id = candidate
            if mkdir(active + "/" + id, 0o750) == 0 { break }
            if errno != EEXIST { throw SpoolError(operation: "mkdir", path: active + "/" + id, errno: errno) }
        }
        let dir = active + "/" + id
        do {
            try writeClaimRecord(ClaimRecord(manifest: name, receivedAt: now, requestedJob: id != wanted ? wanted : nil), on: dir)
        } catch {
            removeTree(dir)
            throw error
        }
        CrashPoint.claimRecorded.reached()
        if rename(source, dir + "/manifest.plist") != 0 {
            let e = errno
            removeTree(dir)
            if e == ENOENT { return .vanished }
            throw SpoolError(operation: "rename", path: source, errno: e)
        }
        sync.tree(dir)
        CrashPoint.claimRenamed.reached()
        return .claimed(ClaimedJob(id: id, requestedJob: id != wanted ? wanted : nil, manifestName: name, receivedAt: now, manifest: data,
                                   tree: tree, done: [:]))
    }

    // MARK: Progress

    /// Records that operations succeeded (they will not run again after a restart, once committed): one append for
    /// all of them, as the engine delivers its events in batches.
    public func recordSuccesses(_ successes: [OperationSuccess]) throws {
        guard !successes.isEmpty else { return }
        var text = ""
        for s in successes { text += Self.progressLine(job: s.job, operation: s.operation, record: s.record) }
        // What the operations wrote must be as durable as the lines that say they succeeded.
        for job in Set(successes.map(\.job)) { sync.tree(outputFolder(job: job)) }
        try appendProgress(text)
        CrashPoint.progressAppended.reached()
    }

    /// Appends one line to the progress log (a success's or a cancel's; durable at the next commit).
    func appendProgress(_ text: String) throws {
        let line = Data(text.utf8)
        try progressLock.withLock {
            guard progressFD >= 0 else { throw SpoolError(operation: "append to", path: progressPath, errno: EBADF) }
            try writeAll(progressFD, line, path: progressPath)
            progressBytes += line.count
        }
        sync.file(progressPath)
    }

    /// The folder where a job's `write` operations put their files: the future outbox entry.
    public func outputFolder(job: String) -> String { active + "/" + job }

    /// active/.downloads: downloads, one folder per job; hidden (never a job id) and outside the job's
    /// folder, so publication never carries them into the outbox.
    var downloadsRoot: String { active + "/.downloads" }

    /// The folder a job's downloads are streamed into (made on the first one).
    public func downloadsFolder(job: String) -> String { downloadsRoot + "/" + job }

    /// After publication: a job's downloads go (best effort; recovery removes what is left).
    public func discardDownloads(job: String) { removeTree(downloadsFolder(job: job)) }

    /// Where `stage` writes a job's result.plist (in active/<job>/, until `place` moves the folder).
    public func stagedResult(job: String) -> String { active + "/" + job + "/result.plist" }

    /// A job this node no longer holds (lost): its folder in active/ and its downloads go, nothing is published.
    /// Its progress lines are dropped with the next rewrite of the log (they name a job no longer active).
    public func discard(job: String) {
        removeTree(outputFolder(job: job))
        discardDownloads(job: job)
    }

    // MARK: Job records

    /// Writes a job folder's claim record (inbox name, reception time, …; ClaimRecord.swift): compact, as the
    /// folder's `user.opqueued.job` attribute, or as job.plist where the file system takes no attributes. An
    /// attribute costs no inode: creating and deleting many small files is what ext4 does slowest.
    func writeClaimRecord(_ record: ClaimRecord, on dir: String) throws {
        if !setJobAttribute(record.encoded, on: dir) { try writeFile(Data(record.propertyList), to: dir + "/job.plist") }
    }

    /// Sets `path`'s job attribute to `bytes`; whether the file system took it.
    func setJobAttribute(_ bytes: [UInt8], on path: String) -> Bool {
        bytes.withUnsafeBytes { setxattr(path, Self.jobAttribute, $0.baseAddress, $0.count, 0) } == 0
    }

    /// When a job folder without a record was claimed, as near as the folder says: its modification time (its last
    /// change is the manifest's arrival; the folder keeps it when it moves), else now. The same answer at every
    /// start, so that such a folder submitted to a cluster keeps one submission key across a crash.
    static func claimTime(_ dir: String) -> Double {
        var st = stat()
        guard lstat(dir, &st) == 0 else { return Date().timeIntervalSince1970 }
        return Double(st.st_mtim.tv_sec) + Double(st.st_mtim.tv_nsec) / 1e9
    }

    /// A job folder's (or a held submission's) record, or nil if it has none that decodes (ClaimRecord.swift).
    func readClaimRecord(_ path: String) -> ClaimRecord? {
        guard let data = readAttribute(path, Self.jobAttribute) ?? (try? readRegularFile(path + "/job.plist").get()) else { return nil }
        return ClaimRecord(decoding: [UInt8](data))
    }

    // MARK: Publication

    /// Publication, step 1: writes result.plist into active/<job>/, beside the manifest and the outputs;
    /// `produce` hands its bytes to the sink piece by piece.
    public func stage(job: String, produce: ((UnsafeRawBufferPointer) throws -> Void) throws -> Void) throws {
        let path = stagedResult(job: job)
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o644)
        guard fd >= 0 else { throw SpoolError(operation: "create", path: path, errno: errno) }
        defer { close(fd) }
        try produce { bytes in try writeAll(fd, bytes, path: path) }
        sync.tree(active + "/" + job)
        CrashPoint.publishStaged.reached()
    }

    /// Whether active/<job>/ is there.
    public func hasFolder(job: String) -> Bool { access(active + "/" + job, F_OK) == 0 }

    /// Makes active/<job>/ again with the manifest's bytes (someone removed the folder while the job ran); durable at
    /// the next `commit()`.
    public func restoreFolder(job: String, manifest: Data) throws {
        let dir = active + "/" + job
        if mkdir(dir, 0o750) != 0 && errno != EEXIST { throw SpoolError(operation: "mkdir", path: dir, errno: errno) }
        try writeFile(manifest, to: dir + "/manifest.plist")
        sync.tree(dir)
    }

    /// Publication, step 2 (after a commit made result.plist durable): the whole folder moves to the outbox, as
    /// outbox/<job>/. Returns the entry's name: `job`, unless something not the daemon's took outbox/<job> after
    /// the claim (a folder a user made, or in a cluster another entry of that name); then the first of <job>.1,
    /// <job>.2, … free in outbox/ and active/ and not `inUse` (the claim's rule), never replacing what is there.
    public func place(job: String, inUse: (String) -> Bool = { _ in false }) throws -> String {
        let source = active + "/" + job
        for name in Self.entryNames(job) {
            if name != job && (access(active + "/" + name, F_OK) == 0 || inUse(name)) { continue }
            if rename(source, outbox + "/" + name) == 0 {
                CrashPoint.publishPlaced.reached()
                return name
            }
            let e = errno
            guard Self.nameTaken.contains(e) else { throw SpoolError(operation: "rename to outbox/\(name)", path: source, errno: e) }
        }
        throw SpoolError(operation: "rename to outbox/\(job).N (every name taken)", path: source, errno: EEXIST)
    }

    /// The folder of a job's outbox entry in `outbox` (the spool's outbox, or sharedOutbox), once it has ended:
    /// <job>, unless something else had that name as the job ended; then the first <job>.N whose result.plist names
    /// the job (see `place(job:)`); else a folder an operator renamed, found by its result (`Outbox.find`). Nil while
    /// there is none, when its result cannot be read, or when several renamed folders claim the job.
    public static func entry(of job: String, in outbox: String) -> String? {
        guard case .entry(let entry)? = Outbox.find(job, in: outbox) else { return nil }
        return outbox + "/" + entry.name
    }

    /// What rename(2) of a folder says when its target is taken by something not empty or not a folder.
    static let nameTaken: Set<Int32> = [EEXIST, ENOTEMPTY, ENOTDIR, EISDIR]

    /// The names an outbox entry for `job` may take, in order: `job`, then `job`.1 … `job`.9999.
    static func entryNames(_ job: String) -> some Sequence<String> {
        (0..<10_000).lazy.map { $0 == 0 ? job : "\(job).\($0)" }
    }

}

// MARK: File helpers (each error says what was done to which path)

/// The spool's folders are not all on one mount.
struct SpoolMountError: Error, CustomStringConvertible {
    let description: String
}
