// opqueuectl retry: an ended job's manifest (outbox/<job>/manifest.plist, its original bytes) submitted again as a new
// job, under SPEC §2's `.1` rule whatever its ifJobExists (§3.7): it asks for the id the ended job asked for, which
// that job holds, so the daemon gives it the next free of ID.1, ID.2, … Checked and placed as `submit` does it
// (Submit.swift); the id printed is the one the daemon gave when it answers, else the one the spool gives it now
// (Spool.nextFreeID, the claim's own rule).

import ControlPlane
import ArgumentParser
import Daemon
import Foundation
import JobModel
import SpoolFiles

struct Retry: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Submits an ended job's manifest again, as a new job; prints the new job's id.",
        discussion: """
            The manifest kept in the job's outbox folder is checked as submit checks it and placed in the inbox asking \
            for the id the ended job asked for: as that job holds it, the new one gets the next free of ID.1, ID.2, ... \
            whatever the manifest's ifJobExists. The id printed is the one the daemon gave (asked of it for at most \
            10 s), or, when no daemon answers, the one this spool gives it now. A job that has not ended (in active/, \
            or waiting in the inbox) or that the outbox does not hold exits 1.
            """)
    @OptionGroup var common: Common
    @Argument(help: "An ended job's id.", completion: .custom(completeEndedJobs)) var job: String

    func run() throws {
        guard isValidIdentifier(job) else {
            throw fail("'\(job)' cannot be a job's id: an id is 1 to 128 of A-Z a-z 0-9 . _ -, not starting with '.'")
        }
        guard let entry = try endedEntry(of: job, common) else { throw fail(notEnded()) }
        let folder = common.spool + "/outbox/" + entry.name
        let manifestPath = folder + "/manifest.plist"
        // The daemon wrote it as a plain file: a link or a FIFO put there since is not followed (retry run as root
        // would submit whatever the link names, readable or not by whoever made the link).
        let original: Data
        switch readRegularFile(manifestPath) {
        case .success(let data): original = data
        case .failure(let error): throw fail("job '\(job)': \(manifestPath) cannot be read: \(error)")
        }
        let (config, cluster) = try common.submissionContext()
        let data = Manifest.forRetry(original)
        if case .failure(let problems) = Manifest.parse(data, configuration: config) {
            throw fail("job '\(job)': its manifest (\(manifestPath)) is not valid now:\n"
                + problems.problems.map { "  \($0)" }.joined(separator: "\n"))
        }
        let requested = Manifest.requestedJob(in: data)
        // A manifest without `job` got its id from its file's name: placed under the id its job asked for, it asks again.
        let stem = requested ?? Outbox.requestedID(ofEntry: folder) ?? job
        let placed: Placed
        do {
            placed = try common.place(data, requested: requested, stem: stem)
        } catch let exit as ExitCode {
            throw exit
        } catch {
            throw fail("job '\(job)': \(error)")
        }
        let guess = Spool.nextFreeID(placed.id, root: common.spool)
        print(cluster == nil ? guess : common.given(placed, guess: guess))
    }

    /// Why `job` has no outbox folder to retry: it has not ended, or nothing here knows it.
    func notEnded() -> String {
        if access(common.spool + "/active/" + job, F_OK) == 0 {
            return "job '\(job)' has not ended: it is in active/ (running, or waiting for its time); retry submits an ended job again"
        }
        if access(common.spool + "/inbox/" + job + ".plist", F_OK) == 0 {
            return "job '\(job)' has not ended: inbox/\(job).plist waits to be claimed"
        }
        // In a cluster the job may run, or have ended, on another node (whose outbox holds its manifest).
        if case .success(let answer)? = try? ControlClient.request(common.socket, .show(job: job), as: ShowAnswer.self, timeout: 2) {
            let status = answer.status
            let node = answer.node.map { " on node \($0)" } ?? ""
            return Outbox.statuses.contains(status)
                ? "job '\(job)' ended (\(status))\(node), and this outbox does not hold it: retry it where its outbox folder is"
                : "job '\(job)' has not ended: it is \(status)\(node)"
        }
        return "unknown job '\(job)': no ended job of that id in \(common.spool)/outbox"
    }
}
