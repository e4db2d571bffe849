// The spool's cluster side (SPEC §8): where a node keeps what the cluster store needs on disk.
//
//   active/.submissions/<ino>.<sec>.<nsec>-<name>
//                                a manifest claimed from this node's inbox for the cluster, waiting to be inserted
//                                into the database: one rename out of the inbox, nothing else written, no commit
//                                before the insert. Its name says which inbox file it was (inode and change time:
//                                a rename the disk lost leaves the very same file, same two, in the inbox), and is
//                                the submission key: a crash anywhere before its removal (after the insert
//                                committed) never submits it twice. Its claim id is the name with a leading '.',
//                                never a job id. An inbox name too long to fit is kept in the job attribute.
//   active/.submissions/<job>/   the same for a job handed over from active/<job>/ (a claim made before the node
//                                knew it was in a cluster); its claim record moves with it.
//   sharedOutbox/<job>/          (`cluster.sharedOutbox`) a published job, assembled as sharedOutbox/.tmp/<job>/
//                                (a copy: the shared folder is another file system), made durable, then renamed
//                                into place; active/<job>/ goes after that.
//   active/<job>/                a job claimed from the database: its claim record (the attribute, or job.plist
//                                where the file system has none) is marked a cluster claim and holds the
//                                origin: fence, submittedOn, fromNode. One attribute, written before the manifest;
//                                it goes wherever the folder goes (lost: removed; published: into the outbox).
//
// Hidden names in active/ are never job ids: Spool.recover leaves them to the cluster store.
// Trusts nothing read back: an origin that does not decode is treated as absent.

import CShims
import Foundation
import JobModel
import PropertyList
import SpoolFiles
import SystemCalls

#if canImport(Glibc)
import Glibc
#endif

/// What a node remembers about a job it claimed from the cluster.
public struct ClusterOrigin: Sendable, Equatable {
    public var fence: Int64
    public var submittedOn: String
    public var fromNode: String?
}

extension Spool {
    var submissionsFolder: String { active + "/.submissions" }

    /// Claims inbox/<name> for the cluster: renamed to active/.submissions/<key>-<name> (see the top of this file),
    /// the id `.<key>-<name>`, the id it asks for in `requestedJob`.
    func claimForSubmission(_ name: String, now: Double, settled: Bool) throws -> ClaimOutcome {
        try take(name, settled: settled) { fd, source, data, tree in
            var st = stat()
            guard fstat(fd, &st) == 0 else { throw SpoolError(operation: "fstat", path: source, errno: errno) }
            let key = "\(st.st_ino).\(st.st_ctim.tv_sec).\(st.st_ctim.tv_nsec)"
            let fits = key.utf8.count + 1 + name.utf8.count <= 255
            let file = fits ? key + "-" + name : key + "-"
            let target = submissionsFolder + "/" + file
            if rename(source, target) != 0 {
                var e = errno
                if e == ENOENT && access(source, F_OK) == 0 {
                    try makeFolder(submissionsFolder)
                    e = rename(source, target) == 0 ? 0 : errno
                }
                if e == ENOENT { return .vanished }
                if e != 0 { throw SpoolError(operation: "rename to active/.submissions/\(file)", path: source, errno: e) }
            }
            if !fits {
                // Without the attribute the name reads back as <key>.plist: only the result's `manifest` differs.
                _ = setJobAttribute(ClaimRecord(manifest: name).encoded, on: target)
            }
            return .claimed(ClaimedJob(id: "." + file, requestedJob: Self.wantedID(name: name, tree: tree), manifestName: name,
                                       receivedAt: now, manifest: data, tree: tree, done: [:]))
        }
    }

    /// A manifest claimed for the cluster that this node rejects: moved into active/<id>/ as an ordinary claim
    /// (the id unique here), to be published here like any rejected job.
    func promoteSubmission(_ job: ClaimedJob, inUse: (String) -> Bool) throws -> ClaimOutcome {
        let outcome = try placeClaim(job.manifestName, source: submissionsFolder + "/" + job.id.dropFirst(), data: job.manifest,
                                     tree: job.tree, now: job.receivedAt, inUse: inUse)
        guard case .claimed(var local) = outcome else { return outcome }
        local.inboxInode = job.inboxInode
        return .claimed(local)
    }

    /// Moves active/<job>/ (just claimed from the inbox) to active/.submissions/<job>/ (a name not taken there).
    /// Returns the submission's folder.
    func moveToSubmissions(job: String) throws -> String {
        try makeFolder(submissionsFolder)
        var name = job
        var n = 0
        while access(submissionsFolder + "/" + name, F_OK) == 0 {
            n += 1
            name = "\(job).\(n)"
        }
        let target = submissionsFolder + "/" + name
        guard rename(active + "/" + job, target) == 0 else {
            throw SpoolError(operation: "rename to active/.submissions/\(name)", path: active + "/" + job, errno: errno)
        }
        return target
    }

    /// The submissions a previous run left (not yet known inserted), as claimed jobs (a file's: `.<its name>`,
    /// a folder's: the folder's name).
    func pendingSubmissions() -> [(folder: String, job: ClaimedJob)] {
        var found: [(folder: String, job: ClaimedJob)] = []
        for name in visibleNames(in: submissionsFolder) {
            let dir = submissionsFolder + "/" + name
            var st = stat()
            guard lstat(dir, &st) == 0 else { continue }
            if (st.st_mode & S_IFMT) == S_IFREG {
                guard case .success(let manifest) = Self.readHeldManifest(dir) else { continue }
                let key = name.prefix { $0 != "-" }
                var inboxName = String(name.dropFirst(key.count + 1))
                if let recorded = readClaimRecord(dir)?.manifest { inboxName = recorded }
                if inboxName.isEmpty { inboxName = key + ".plist" }
                let tree = manifest.tree ?? ManifestTree(manifest.data)
                found.append((dir, ClaimedJob(id: "." + name, requestedJob: Self.wantedID(name: inboxName, tree: tree),
                                              manifestName: inboxName, receivedAt: Date().timeIntervalSince1970,
                                              manifest: manifest.data, tree: manifest.tree, done: [:])))
                continue
            }
            guard case .success(let manifest) = Self.readHeldManifest(dir + "/manifest.plist") else { removeTree(dir); continue }
            let record = readClaimRecord(dir)
            found.append((dir, ClaimedJob(id: name, requestedJob: record?.requestedJob, manifestName: record?.manifest ?? name + ".plist",
                                          receivedAt: record?.receivedAt ?? Self.claimTime(dir), manifest: manifest.data,
                                          tree: manifest.tree, done: [:])))
        }
        return found
    }

    /// A node started without `cluster` refuses a spool whose active/ holds what it took from a cluster (jobs claimed
    /// from the database) or set aside for one (manifests in active/.submissions, perhaps inserted already): run
    /// alone it would run them beside the cluster, which runs them too — twice. Nothing is touched.
    public func refuseClusterHoldings() throws {
        let claims = visibleNames(in: active).filter { isClusterClaim(job: $0) }
        let submissions = visibleNames(in: submissionsFolder)
        if claims.isEmpty && submissions.isEmpty { return }
        var held: [String] = []
        if !claims.isEmpty {
            held.append("\(claims.count) job\(claims.count == 1 ? "" : "s") claimed from the cluster's database "
                        + "(active/: \(firstNames(claims)))")
        }
        if !submissions.isEmpty {
            held.append("\(submissions.count) manifest\(submissions.count == 1 ? "" : "s") set aside for it "
                        + "(active/.submissions/: \(firstNames(submissions)))")
        }
        throw SpoolClusterHoldingsError(description: "active/ holds \(held.joined(separator: " and ")), "
            + "and the configuration has no cluster: run alone, this node would run them while the cluster runs them too. "
            + "Start it with its cluster configuration until they are gone (a graceful stop hands back jobs not started), "
            + "or take them out of active/ yourself (a manifest moved into the inbox runs here as a new job)")
    }

    /// Whether active/<job>/ was written by `materialise` (a job claimed from the cluster), not by an inbox claim.
    func isClusterClaim(job: String) -> Bool {
        readClaimRecord(active + "/" + job)?.claimedFromCluster == true
    }

    /// Writes a job claimed from the cluster into active/<job>/: its claim record (with the origin), then the
    /// manifest; durable at the next `commit()`. `manifestFile`, a file holding the same bytes, is renamed in
    /// when it can be (and removed when not).
    ///
    /// Never replaces a folder that is there: active/<job>/ may be this node's own inbox claim of a manifest asking
    /// for the same id, on its way to active/.submissions (the cluster's ids are unique, a node's local claim names
    /// are not). Then this throws EEXIST and the caller hands the row back to the cluster, to be claimed again once
    /// the name is free. The claim record is marked a cluster claim (by its fence), so that recovery never takes a
    /// folder this wrote for an inbox claim (and submits it again) when its origin does not decode.
    func materialise(job: String, manifest: [UInt8], manifestName: String, receivedAt: Double, requestedJob: String?,
                     origin: ClusterOrigin, manifestFile: String? = nil) throws {
        let dir = active + "/" + job
        var renamed = false
        defer { if let manifestFile, !renamed { removeTree(manifestFile) } }
        guard mkdir(dir, 0o750) == 0 else { throw SpoolError(operation: "mkdir", path: dir, errno: errno) }
        do {
            try writeClaimRecord(ClaimRecord(manifest: manifestName, receivedAt: receivedAt,
                                         requestedJob: requestedJob == job ? nil : requestedJob,
                                         origin: origin), on: dir)
            renamed = manifestFile.map { rename($0, dir + "/manifest.plist") == 0 } ?? false
            if !renamed { try writeFile(Data(manifest), to: dir + "/manifest.plist") }
            sync.tree(dir)
        } catch {
            removeTree(dir)
            throw error
        }
    }

    /// The origin of a job claimed from the cluster, from its claim record in active/<job>/ (nil for an inbox claim,
    /// or a record that does not decode).
    func readOrigin(job: String) -> ClusterOrigin? {
        readClaimRecord(active + "/" + job)?.origin
    }

    /// Publication under `cluster.sharedOutbox` (SPEC §8), in place of `place(job:)`: active/<job>/ is copied into
    /// `shared`/.tmp/<job>/, that file system synced, then renamed to `shared`/<job>/ and active/<job>/ removed.
    /// Run again after a crash it finishes the work: an entry in place holding this job's manifest is this job's,
    /// and a half-made copy in .tmp is made again. An entry of that name holding another manifest (a manifest
    /// rejected at submission on some node under the same id, a folder a user made) is left alone and the next of
    /// <job>.1, <job>.2, … is taken, as `place(job:)` does. Returns the entry's name.
    public func placeShared(job: String, in shared: String) throws -> String {
        let source = active + "/" + job
        let manifest = readRegularFile(source + "/manifest.plist", limit: Int.max)
        for name in Self.entryNames(job) {
            let target = shared + "/" + name
            if access(target, F_OK) == 0 {
                if case .success(let ours) = manifest,
                   case .success(let theirs) = readRegularFile(target + "/manifest.plist", limit: Int.max),
                   ours == theirs {
                    removeTree(source)
                    return name
                }
                continue
            }
            let staging = shared + "/.tmp"
            try makeFolder(staging)
            let assembled = staging + "/" + job
            removeTree(assembled)
            do {
                try FileManager.default.copyItem(atPath: source, toPath: assembled)
            } catch {
                removeTree(assembled)
                throw SpoolError(operation: "copy to \(assembled) (\(describe(error)))", path: source, errno: EIO)
            }
            let fd = open(shared, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard fd >= 0 else { throw SpoolError(operation: "open", path: shared, errno: errno) }
            defer { close(fd) }
            let synced = opq_syncfs(fd)
            guard synced == 0 else { throw SpoolError(operation: "syncfs", path: shared, errno: -synced) }
            if rename(assembled, target) != 0 {
                let e = errno
                removeTree(assembled)
                // Taken meanwhile (by another node's entry, or a user): looked at again, as above.
                guard Self.nameTaken.contains(e) else { throw SpoolError(operation: "rename to \(target)", path: assembled, errno: e) }
                continue
            }
            try syncDirectory(shared)
            removeTree(source)
            return name
        }
        throw SpoolError(operation: "placing under \(shared) (every name from \(job) to \(job).9999 taken)", path: source, errno: EEXIST)
    }

    private func makeFolder(_ path: String) throws {
        if mkdir(path, 0o750) != 0 && errno != EEXIST { throw SpoolError(operation: "mkdir", path: path, errno: errno) }
    }
}

/// A spool holding a cluster's jobs, opened by a node without `cluster` (`refuseClusterHoldings`).
struct SpoolClusterHoldingsError: Error, CustomStringConvertible {
    let description: String
}
