// Shell completion of job ids and queue names (argument-parser's custom completions call these).

import ControlPlane
import Daemon
import Foundation
import JobModel

/// The spool a command line being completed names (`--spool DIR` or `--spool=DIR`), else the default.
func spoolOf(_ words: [String]) -> String {
    for (i, word) in words.enumerated() {
        if word == "--spool", i + 1 < words.count { return words[i + 1] }
        if word.hasPrefix("--spool=") { return String(word.dropFirst("--spool=".count)) }
    }
    return "./spool"
}

/// Job ids for completion: the running daemon's active jobs (asked with a short timeout) and the outbox's.
@Sendable func completeJobs(_ words: [String], _ index: Int, _ prefix: String) -> [String] {
    let spool = spoolOf(words)
    var jobs = Set((try? FileManager.default.contentsOfDirectory(atPath: spool + "/outbox")) ?? []).filter { !$0.hasPrefix(".") }
    if case .success(let status)? = try? ControlClient.request(spool + "/opqueued.sock", .status(memory: false), as: StatusAnswer.self,
                                                              timeout: 1) {
        jobs.formUnion(status.activeJobs)
    }
    return jobs.filter { $0.hasPrefix(prefix) }.sorted()
}

/// Ended jobs' ids for completion (retry): the outbox's folders.
@Sendable func completeEndedJobs(_ words: [String], _ index: Int, _ prefix: String) -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: spoolOf(words) + "/outbox")) ?? [])
        .filter { !$0.hasPrefix(".") && $0.hasPrefix(prefix) }.sorted()
}

/// Queue names for completion: the running daemon's, else the built-in ones.
@Sendable func completeQueues(_ words: [String], _ index: Int, _ prefix: String) -> [String] {
    let status = try? ControlClient.request(spoolOf(words) + "/opqueued.sock", .status(memory: false), as: StatusAnswer.self, timeout: 1)
    let names = (try? status?.get())?.queues.map(\.name) ?? Configuration.builtIn.queueNames
    return names.filter { $0.hasPrefix(prefix) }.sorted()
}
