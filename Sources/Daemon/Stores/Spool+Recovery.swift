// The spool's recovery at start: what a previous run left in active/ read back as jobs to resume, and the progress
// log rewritten to hold only theirs. The progress log also records cancels by request (SPEC §3.4), of one operation
// or of the whole job, so that a cancel asked before a restart is made again, before anything starts, when its job
// resumes: a job cancelled whole ends cancelled without running anything.

import CShims
import Foundation
import JobModel
import SpoolFiles
import SystemCalls
#if canImport(Glibc)
import Glibc
#endif

extension Spool {
    // MARK: Recovery

    /// Jobs left in active/ by a previous run, ready to resume; cleans what was half done and starts a
    /// fresh progress log holding only their lines.
    public func recover() throws -> (jobs: [ClaimedJob], problems: [String]) {
        let (held, found) = try recoverHeld()
        var problems = found
        var jobs: [ClaimedJob] = []
        for (id, done) in held.jobs {
            guard case .success(var job) = heldJob(id) else {
                problems.append("active/\(id)/manifest.plist cannot be read; left in place")
                continue
            }
            job.done = done
            job.cancels = held.cancels(of: job)
            jobs.append(job)
        }
        return (jobs, problems)
    }

    /// The jobs left in active/ by a previous run, as `recover` finds them, their manifests not read yet (each is
    /// read as it resumes: a spool of a hundred thousand delayed jobs is not all in memory at once).
    public struct Held {
        /// Each job's id and the operations that had succeeded.
        public var jobs: [(id: String, done: [String: DoneRecord])]
        /// The cancels by request (of one operation, or of the whole job), by job, in order.
        public var cancelled: [String: [CancelRecord]] = [:]

        public init(jobs: [(id: String, done: [String: DoneRecord])], cancelled: [String: [CancelRecord]] = [:]) {
            self.jobs = jobs
            self.cancelled = cancelled
        }

        /// The cancels a resumed job makes again before any of its operations starts (`ClaimedJob.cancels`): those
        /// asked since its claim (a line of an earlier job of the same id is not its own) of operations that had
        /// not succeeded (an executing one told too late ended as it would have without the cancel). A cancel of the
        /// whole job stands for all of them: `[nil]`.
        public func cancels(of job: ClaimedJob) -> [String?] {
            let own = (cancelled[job.id] ?? []).filter { $0.at >= job.receivedAt }
            if own.contains(where: { $0.operation == nil }) { return [nil] }
            return own.compactMap(\.operation).filter { job.done[$0] == nil }
        }
    }

    /// A cancel by request as the progress log records it.
    public struct CancelRecord: Sendable, Equatable {
        /// The operation cancelled; nil: the whole job.
        public var operation: String?
        /// When it was asked (seconds since the epoch).
        public var at: Double

        public init(operation: String?, at: Double) {
            self.operation = operation
            self.at = at
        }
    }

    /// `recover` less the reading of the manifests: cleans what was half done, starts a fresh progress log holding
    /// only the jobs' lines; the jobs to resume (each to be read with `heldJob`) and the problems found.
    public func recoverHeld() throws -> (held: Held, problems: [String]) {
        var problems: [String] = []
        for name in (try? FileManager.default.contentsOfDirectory(atPath: tmp)) ?? [] { removeTree(tmp + "/" + name) }
        var (progress, cancels) = readProgress()
        var jobs: [(id: String, done: [String: DoneRecord])] = []
        for id in visibleNames(in: active) {
            let dir = active + "/" + id
            var st = stat()
            guard lstat(dir, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else {
                // Not a folder: never the daemon's (a manifest put here by hand belongs in inbox/).
                problems.append("active/\(id) is not a job folder (the daemon's are folders); left in place — manifests go into inbox/")
                continue
            }
            guard access(dir + "/manifest.plist", F_OK) == 0 else {
                // A claim interrupted before its rename leaves the folder empty, or holding its record (job.plist); the
                // inbox file is still there. Anything else in it was put there by someone: left alone.
                let names = ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).sorted()
                if names.allSatisfy({ $0 == "job.plist" }) {
                    removeTree(dir)
                } else {
                    problems.append("active/\(id)/ has no manifest.plist but holds \(firstNames(names)): "
                                    + "not a job the daemon claimed; left in place")
                }
                continue
            }
            // A `write` interrupted before its rename leaves a hidden .part file: it runs again.
            removeParts(dir)
            jobs.append((id, progress.removeValue(forKey: id) ?? [:]))
        }
        // Downloads: those of jobs that resume stay (a download that succeeded is restored from its file),
        // less partial files of interrupted ones; those of jobs published or never claimed go.
        let resuming = Set(jobs.map(\.id))
        for id in (try? FileManager.default.contentsOfDirectory(atPath: downloadsRoot)) ?? [] {
            if resuming.contains(id) { removeParts(downloadsFolder(job: id)) } else { removeTree(downloadsFolder(job: id)) }
        }
        try rewriteProgress(keeping: resuming)
        return (Held(jobs: jobs, cancelled: cancels.filter { resuming.contains($0.key) }), problems)
    }

    /// active/<id>/ read back as a job: its manifest, and what its claim record says (a folder without one is named
    /// after itself and dated by its modification time).
    func heldJob(_ id: String) -> Result<ClaimedJob, SpoolError> {
        let dir = active + "/" + id
        switch Self.readHeldManifest(dir + "/manifest.plist") {
        case .failure(let error): return .failure(error)
        case .success(let manifest):
            let record = readClaimRecord(dir)
            return .success(ClaimedJob(id: id, requestedJob: record?.requestedJob, manifestName: record?.manifest ?? id + ".plist",
                                       receivedAt: record?.receivedAt ?? Self.claimTime(dir), manifest: manifest.data,
                                       tree: manifest.tree, done: [:]))
        }
    }

    /// A manifest the spool already holds (in active/ or active/.submissions/), read again at recovery: its bytes,
    /// or, when its size alone says it is no manifest, none and a tree saying its size. A crash between the claim of
    /// a huge inbox file and its rejection leaves it in active/, and recovery must not read it either.
    static func readHeldManifest(_ path: String) -> Result<(data: Data, tree: ManifestTree?), SpoolError> {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return .failure(SpoolError(operation: "open", path: path, errno: errno)) }
        defer { close(fd) }
        if let tooLarge = tooLargeToRead(fd) { return .success((Data(), tooLarge)) }
        return readRegularFile(fd, path: path).map { ($0, nil) }
    }

    /// The tree of a regular file whose size alone (fstat) says it is no manifest — rejected without a byte of it
    /// read; nil for any other file (read, and judged by its bytes).
    static func tooLargeToRead(_ fd: Int32) -> ManifestTree? {
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG, Int(st.st_size) > ManifestLimits.maxBytes else { return nil }
        return ManifestTree(tooLarge: Int(st.st_size))
    }

    /// The progress log: job → operation → record, and job → its operations' cancels in order. A torn last line (a
    /// crash mid-append) is ignored.
    func readProgress() -> (done: [String: [String: DoneRecord]], cancels: [String: [CancelRecord]]) {
        guard case .success(let data) = readRegularFile(progressPath, limit: Int.max) else { return ([:], [:]) }
        var done: [String: [String: DoneRecord]] = [:]
        var cancels: [String: [CancelRecord]] = [:]
        var lineStart = data.startIndex
        while let newline = data[lineStart...].firstIndex(of: 0x0A) {
            let parts = data[lineStart..<newline].split(separator: 0x09).map { String(decoding: $0, as: UTF8.self) }
            lineStart = newline + 1
            if parts.count == 4, parts[2] == Self.cancelledMark || parts[2] == Self.jobCancelledMark, let at = Double(parts[3]) {
                let operation = parts[2] == Self.cancelledMark ? parts[1] : nil
                cancels[parts[0], default: []].append(CancelRecord(operation: operation, at: at))
                continue
            }
            guard parts.count == 5, let s = Double(parts[2]), let f = Double(parts[3]), let a = Int(parts[4]) else { continue }
            done[parts[0], default: [:]][parts[1]] = DoneRecord(startedAt: s, finishedAt: f, attempts: a)
        }
        return (done, cancels)
    }

    static func progressLine(job: String, operation: String, record: DoneRecord) -> String {
        "\(job)\t\(operation)\t\(record.startedAt)\t\(record.finishedAt)\t\(record.attempts)\n"
    }

    /// A cancel's line: four fields, the third this mark where a success has its start time (a build that knows only
    /// successes skips it, as any line that is not one).
    static let cancelledMark = "cancelled"
    /// A whole job's cancel: four fields, the second `*` (outside an operation id's alphabet, so never read as one)
    /// and the third this mark, neither a time nor `cancelledMark`: a build that knows only successes, or also cancels
    /// of operations, skips the line (it would otherwise read a cancel of an operation named `*`).
    static let jobCancelledMark = "cancelled-job"

    static func cancelLine(job: String, record: CancelRecord) -> String {
        guard let operation = record.operation else { return "\(job)\t*\t\(jobCancelledMark)\t\(record.at)\n" }
        return "\(job)\t\(operation)\t\(cancelledMark)\t\(record.at)\n"
    }

    /// Records that an active job, or one of its operations, was cancelled by request (made again when the job resumes
    /// after a restart; durable at the next commit).
    public func recordCancel(job: String, record: CancelRecord) throws {
        try appendProgress(Self.cancelLine(job: job, record: record))
    }

    /// Replaces the progress log by one holding only `keeping`'s lines (written aside, fsynced, renamed).
    func rewriteProgress(keeping: Set<String>) throws {
        try progressLock.withLock {
            var text = ""
            let (done, cancels) = readProgress()
            for (job, operations) in done where keeping.contains(job) {
                for (operation, record) in operations { text += Self.progressLine(job: job, operation: operation, record: record) }
            }
            for (job, records) in cancels where keeping.contains(job) {
                for record in records { text += Self.cancelLine(job: job, record: record) }
            }
            try replaceDurably(Data(text.utf8), at: progressPath, beforeRename: { CrashPoint.progressRewritten.reached() })
            if progressFD >= 0 { close(progressFD) }
            progressFD = open(progressPath, O_WRONLY | O_APPEND | O_CLOEXEC)
            guard progressFD >= 0 else { throw SpoolError(operation: "open", path: progressPath, errno: errno) }
            progressBytes = text.utf8.count
        }
    }

    /// Rewrites the progress log when it has grown large; `active` are the jobs still running.
    public func compactProgressIfLarge(active jobs: Set<String>) throws {
        guard progressLock.withLock({ progressBytes }) >= Self.progressCompactionBytes else { return }
        try rewriteProgress(keeping: jobs)
    }
}
