// opqueuectl — the command-line tool for users and operators (SPEC §1).
//
// submit and validate work on files; wait, show and graph read the outbox; status, show (running jobs),
// cancel, suspend and resume talk to the daemon over <spool>/opqueued.sock.
// Exit statuses: 0 success; 1 invalid input, unknown job/operation/queue, ended job, unsuccessful job;
// 2 wait timed out; 3 no daemon; 64 usage error.

import ArgumentParser
import CShims
import Daemon
import Foundation

struct Common: ParsableArguments {
    @Option(help: ArgumentHelp("The spool root.", valueName: "dir"), completion: .directory)
    var spool = "./spool"

    @Option(help: ArgumentHelp("The configuration property list (queues for validate).", valueName: "file"),
            completion: .file(extensions: ["plist"]))
    var config: String?

    var socket: String { spool + "/opqueued.sock" }

    func configuration() throws -> Configuration {
        do {
            return try config.map { try Configuration.load(path: $0) } ?? .builtIn
        } catch {
            FileHandle.standardError.write(Data("\(error)\n".utf8))
            throw ExitCode(1)
        }
    }

    /// What a manifest is checked against, by submit and validate alike, as the daemon will check it: besides --config
    /// (or the built-ins), the queues and commands the running daemon takes — its own, and on a cluster node those any
    /// node declares (SPEC §8: a queue only another node has is no typo). Without a daemon answering, --config alone.
    func submissionConfiguration() throws -> Configuration { try submissionContext().configuration }

    /// What a manifest is checked against (see `submissionConfiguration`), and what the daemon is: nil when none
    /// answers, else whether it is a cluster node.
    func submissionContext() throws -> (configuration: Configuration, cluster: Bool?) {
        let config = try configuration()
        guard let answer = try? ControlClient.request(socket, ["command": "declared"], timeout: 2), answer["exit"] as? Int == 0 else {
            return (config, nil)
        }
        let signatures = answer["commands"] as? [String: String] ?? [:]
        return (config.widened(queues: Set(answer["queues"] as? [String] ?? []), commands: Set(signatures.keys), signatures: signatures),
                answer["cluster"] as? Bool ?? false)
    }

    /// Sends a request to the daemon; exits 3 when there is none, and with the answer's `exit` (its `error`
    /// on stderr) when that is not 0.
    func request(_ body: [String: Any]) throws -> [String: Any] {
        let response: [String: Any]
        do {
            response = try ControlClient.request(socket, body)
        } catch {
            FileHandle.standardError.write(Data("opqueuectl: \(error)\n".utf8))
            throw ExitCode(3)
        }
        let code = response["exit"] as? Int ?? (response["error"] == nil ? 0 : 1)
        if code != 0 { throw fail(response["error"] as? String ?? "the daemon answered exit \(code)", Int32(clamping: code)) }
        return response
    }
}

func fail(_ message: String, _ code: Int32 = 1) -> ExitCode {
    FileHandle.standardError.write(Data("opqueuectl: \(message)\n".utf8))
    return ExitCode(code)
}

@main
struct Opqueuectl: ParsableCommand {
    /// Run with standard output closed (`opqueuectl status >&-`), the control socket would take descriptor 1 and
    /// the answer be written back into it: /dev/null first takes any closed one of 0, 1 and 2.
    static func main() {
        Daemon.openStandardDescriptors()
        main(nil)
    }

    static let configuration = CommandConfiguration(
        commandName: "opqueuectl",
        abstract: "Submits, inspects and controls opqueued jobs.",
        discussion: """
            opqueuectl works on the spool of an opqueued daemon (see opqueued(8)): submit and validate read manifest \
            files (see opqueued.plist(5)); wait, show and graph read the outbox; status, show (for running jobs; \
            on a cluster node, for every job the cluster knows), cancel, suspend, resume and metrics talk to the \
            daemon through the Unix socket SPOOL/opqueued.sock, and exit 3 when no daemon answers there. --spool \
            and --config come before the command.

            Exit statuses: 0 success; 1 invalid input, an unknown job, operation or queue, cancelling a job that \
            has already ended, or (wait) a job that did not succeed; 2 wait timed out; 3 no daemon; 64 usage error.

            Files: SPOOL/inbox/ (manifests are placed there under a hidden name, then renamed), \
            SPOOL/outbox/JOB/result.plist (what wait, show and graph read), SPOOL/opqueued.sock.
            """,
        subcommands: [Submit.self, Validate.self, Status.self, Show.self, Wait.self, Cancel.self, Suspend.self, Resume.self,
                      Graph.self, Metrics.self])

    /// `--spool` and `--config` come before the command; each command sees them through its own group.
    @OptionGroup var common: Common

    // Usage errors exit with ArgumentParser's validationFailure, which is 64 (EX_USAGE), as the contract asks.
}

struct Validate: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Exit 0 if every manifest is valid; else print every problem.",
        discussion: """
            Checked as submit checks them: queues and commands against --config (else the built-ins) and, when the \
            daemon answers, against what it takes: its own, and on a cluster node those any node of the cluster declares.
            """)
    @OptionGroup var common: Common
    @Argument(help: "Manifest files (- reads one from standard input).", completion: .file(extensions: ["plist"])) var files: [String]

    func run() throws {
        let config = try common.submissionConfiguration()
        let valid = files.map { validManifest(at: $0, config) != nil }
        if valid.contains(false) { throw ExitCode(1) }
    }
}

/// The bytes of a manifest named on the command line: `-` is standard input (read once: a second `-` finds it
/// taken); a regular file, a pipe or a device (`<(generate)`, /dev/stdin) is read; a folder is not. Reading stops
/// once past the manifest limit, so that /dev/zero ends as a manifest too large, not as a full memory.
func readManifestArgument(_ file: String) -> Result<Data, ManifestArgumentError> {
    var fd: Int32 = 0
    if file == "-" {
        if standardInputRead { return .failure(.init("standard input was read already (- may be named once)")) }
        standardInputRead = true
    } else {
        var st = stat()
        guard stat(file, &st) == 0 else { return .failure(.init(String(cString: strerror(errno)))) }
        if (st.st_mode & S_IFMT) == S_IFDIR { return .failure(.init("a directory, not a manifest file")) }
        fd = open(file, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return .failure(.init(String(cString: strerror(errno)))) }
    }
    defer { if fd != 0 { close(fd) } }
    return readBounded(fd, limit: ManifestLimits.maxBytes + 1).mapError { .init($0.description) }
}

/// Whether a `-` argument took standard input (opqueuectl reads its arguments on one thread).
nonisolated(unsafe) private var standardInputRead = false

/// Why a manifest named on the command line could not be read.
struct ManifestArgumentError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Reads and validates a manifest: the manifest in `file` (`-`: standard input) if it is valid; else nil, each
/// problem (`FILE: problem`) said through `report` (validate's output is its problems; submit's is the job ids, its
/// problems go to stderr).
func validManifest(at file: String, _ config: Configuration, report: (String) -> Void = { print($0) }) -> Data? {
    let data: Data
    switch readManifestArgument(file) {
    case .success(let read): data = read
    case .failure(let error):
        report("\(file): cannot be read: \(error)")
        return nil
    }
    if case .failure(let problems) = Manifest.parse(data, configuration: config) {
        for problem in problems.problems { report("\(file): \(problem)") }
        return nil
    }
    return data
}

struct Submit: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Validate, then place manifests atomically in the inbox; prints each job id.",
        discussion: """
            Queues and commands are checked against --config (else the built-ins) and, when the daemon answers, \
            against what it takes: its own, and on a cluster node those any node of the cluster declares.

            The id printed is the one the job gets: a manifest's job, else the one its file's name gives. When the \
            id a manifest asks for is taken here (in active/ or outbox/), or on a cluster node (where any node may \
            hold it), the daemon gives another (job.1, ...): submit then waits, at most 10 s, for the daemon to take \
            the file and prints the id it gave, else the id asked for with a word on stderr.
            """)
    @OptionGroup var common: Common
    @Argument(help: "Manifest files (- reads one from standard input).", completion: .file(extensions: ["plist"])) var files: [String]

    func run() throws {
        let (config, cluster) = try common.submissionContext()
        var ok = true
        for file in files {
            // Stdout holds the job ids only (`ids=$(opqueuectl submit *.plist)`): a manifest's problems go to stderr.
            guard let data = validManifest(at: file, config, report: { FileHandle.standardError.write(Data("\($0)\n".utf8)) }) else {
                ok = false
                continue
            }
            let requested = Manifest.requestedJob(in: data)
            do {
                // Standard input has no name: a manifest read from it without `job` is placed as stdin.plist.
                let name = file == "-" ? "stdin" : ((file as NSString).lastPathComponent as NSString).deletingPathExtension
                let stem = requested ?? jobID(ofManifestFile: name)
                // Asked for by the manifest and taken here, its id will be another (`job.1`, …); on a cluster node any
                // id may be taken on another node. Then the daemon says which it gave, once it has taken the file.
                let taken = requested.map(heldHere) ?? false
                let placed = try place(data, requested: requested, stem: stem)
                guard let cluster, cluster || taken else {
                    print(placed.id)
                    continue
                }
                print(given(placed))
            } catch let exit as ExitCode {
                throw exit
            } catch {
                throw fail("\(file): \(error)")
            }
        }
        if !ok { throw ExitCode(1) }
    }

    /// Writes the manifest hidden in the inbox, synced, then renames it to `STEM.plist` — or, when that name is taken
    /// in the inbox (never replaced) or, for a manifest without `job`, its id in active/ or outbox/, to
    /// `STEM.XXXXXXXX.plist` — and syncs the inbox. Returns the job's id: its `job`, else the one its file name gives
    /// (what the daemon derives from the name placed, so that `ids=$(opqueuectl submit …)` can be waited for).
    func place(_ data: Data, requested: String?, stem: String) throws -> (id: String, name: String, inode: UInt64?) {
        let inbox = common.spool + "/inbox"
        let unique = UUID().uuidString.prefix(8)
        let hidden = ".\(stem).\(unique).plist"
        try writeDurably(data, to: inbox + "/" + hidden, syncFolder: false)
        var st = stat()
        let inode = stat(inbox + "/" + hidden, &st) == 0 ? UInt64(st.st_ino) : nil
        let folder = open(inbox, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard folder >= 0 else { throw fail("cannot open \(inbox): \(String(cString: strerror(errno)))") }
        defer { close(folder) }
        for name in ["\(stem).plist", "\(stem).\(unique).plist"] {
            let id = requested ?? jobID(ofManifestFile: name)
            if requested == nil, heldHere(id) { continue }
            let renamed = opq_rename_noreplace(folder, hidden, name)
            if renamed == -EEXIST { continue }
            guard renamed == 0 else {
                unlinkat(folder, hidden, 0)
                throw fail("cannot rename into \(inbox): \(String(cString: strerror(-renamed)))")
            }
            // The rename is durable before the id is printed: a crash never leaves the manifest hidden, unclaimed.
            guard fsync(folder) == 0 else { throw fail("fsync \(inbox): \(String(cString: strerror(errno)))") }
            return (id, name, inode)
        }
        unlinkat(folder, hidden, 0)
        throw fail("no free name in \(inbox) for \(stem)")
    }

    /// Whether this spool holds a job of that id (in active/ or outbox/): the daemon gives a manifest asking for it
    /// another (SPEC §2).
    func heldHere(_ id: String) -> Bool {
        access(common.spool + "/active/" + id, F_OK) == 0 || access(common.spool + "/outbox/" + id, F_OK) == 0
    }

    /// The id the running daemon gave the manifest placed as inbox/`placed.name`, once it has taken it (at most
    /// 10 s: a daemon whose claiming is paused, or a cluster node whose database is away, may take longer); else the
    /// id it asks for, said to be a guess.
    func given(_ placed: (id: String, name: String, inode: UInt64?)) -> String {
        var request: [String: Any] = ["command": "submitted", "manifest": placed.name]
        if let inode = placed.inode, let exact = Int(exactly: inode) { request["inode"] = exact }
        let deadline = monotonicSeconds() + 10
        var pause = 0.002
        while monotonicSeconds() < deadline {
            guard let answer = try? ControlClient.request(common.socket, request, timeout: 2), answer["exit"] as? Int == 0 else { break }
            if let job = answer["job"] as? String { return job }
            Thread.sleep(forTimeInterval: pause)
            pause = min(pause * 2, 0.05)
        }
        FileHandle.standardError.write(Data("""
            opqueuectl: inbox/\(placed.name) is not taken by the daemon yet: \
            its job id is printed as it asks for it, '\(placed.id)'; \
            the daemon gives it another if that is taken when it takes the file (its result.plist says which)\n
            """.utf8))
        return placed.id
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Daemon state, queues and jobs.")
    @OptionGroup var common: Common
    @Flag(help: "JSON output.") var json = false
    @Flag(help: "Also the bytes the daemon's allocator has handed out (walks its free lists).") var memory = false

    func run() throws {
        let response = try common.request(["command": "status", "memory": memory])
        if json {
            let data = try JSONSerialization.data(withJSONObject: response, options: [.prettyPrinted, .sortedKeys])
            print(String(decoding: data, as: UTF8.self))
            return
        }
        print(statusReport(response), terminator: "")
    }
}

/// `status` for people: a summary line, the queues and the jobs as aligned tables.
func statusReport(_ response: [String: Any]) -> String {
    let active = response["activeJobs"] as? [String] ?? []
    var out = "state: \(response["state"] as? String ?? "?")  jobs active: \(active.count)  "
        + "waiting in the inbox: \(response["waiting"] as? Int ?? 0)  operations executing: \(response["executing"] as? Int ?? 0)\n"
    if let fault = response["fault"] as? String { out += "claiming paused: \(fault)\n" }
    if let held = response["submissions"] as? Int, held > 0 {
        let oldest = (response["submissionsSince"] as? Double).map { max(0, Date().timeIntervalSince1970 - $0) }
        let since = oldest.map { String(format: " (the oldest for %.0f s)", $0) } ?? ""
        out += "of those, taken from the inbox for the cluster and not yet in the database: \(held)\(since)\n"
    }
    if let operations = response["operations"] as? Int, let budget = response["maxActiveOperations"] as? Int {
        out += "operations in active jobs: \(operations) of \(budget)\(operations >= budget ? " (claiming paused until some end)" : "")\n"
    }
    if let heap = response["heapBytes"] as? Int { out += "heap in use: \(heap / 1024) KiB\n" }
    var queues = [["QUEUE", "LIMIT", "QOS", "EXECUTING", "PENDING", "SUSPENDED"]]
    var held = false
    for q in response["queues"] as? [[String: Any]] ?? [] {
        let limit = q["maxConcurrentOperationCount"] as? Int ?? 0
        let suspended = (q["held"] as? Bool) == true ? "held" : (q["suspended"] as? Bool) == true ? "yes" : "no"
        held = held || suspended == "held"
        queues.append([q["name"] as? String ?? "?", limit < 0 ? "per-core" : String(limit), q["qualityOfService"] as? String ?? "",
                       String(q["executing"] as? Int ?? 0), String(q["pending"] as? Int ?? 0), suspended])
    }
    out += "\n" + table(queues)
    if held {
        out += "held: no operation starts on these queues until this node has read from the database "
            + "which queues are suspended cluster-wide\n"
    }
    // clusterMaxConcurrentOperationCount: an operation executes only while its node holds one of the queue's slots.
    for q in response["queues"] as? [[String: Any]] ?? [] {
        guard let limit = q["clusterMaxConcurrentOperationCount"] as? Int else { continue }
        let heldHere = q["clusterSlotsHeld"] as? Int ?? 0
        out += "\(q["name"] as? String ?? "?"): at most \(limit) executing across the cluster; this node holds \(heldHere) of its slots"
        if let priority = q["clusterSlotWait"] as? String { out += " and waits for more (its wait recorded at priority \(priority))" }
        out += "\n"
    }
    // A cluster node (SPEC §8) speaks for the whole cluster: its nodes, and the jobs none of the live ones can run.
    if let nodes = response["nodes"] as? [[String: Any]] {
        // Read from the database: while this node cannot reach it, the table is the last one it read.
        let state = (response["cluster"] as? [String: Any])?["state"] as? String
        if let state, state != "connected", !nodes.isEmpty {
            out += "\nthe nodes as this node last read them from the database (it is \(state) now: CONNECTED may be out of date):"
        }
        if nodes.isEmpty { out += "\nthe nodes: not read from the database yet\n" }
        var rows = [["NODE", "CONNECTED", "LAST HEARTBEAT", "JOBS", "FREE SLOTS", "SCHEMA"]]
        let now = Date().timeIntervalSince1970
        for n in nodes {
            let beat = (n["lastHeartbeat"] as? Double).map { String(format: "%.1f s ago", max(0, now - $0)) } ?? "never"
            rows.append([n["node"] as? String ?? "?", (n["connected"] as? Bool) == true ? "yes" : "no", beat,
                         String(n["jobs"] as? Int ?? 0), String(n["freeSlots"] as? Int ?? 0),
                         (n["schema"] as? Int).map(String.init) ?? "<6"])
        }
        if !nodes.isEmpty { out += "\n" + table(rows) }
        // Nodes being upgraded one by one: which are left.
        let schemas = Set(nodes.compactMap { $0["schema"] as? Int ?? 5 })
        if schemas.count > 1, let newest = schemas.max() {
            let behind = nodes.filter { ($0["schema"] as? Int ?? 5) < newest }.compactMap { $0["node"] as? String }
            out += "nodes whose opqueued knows an older schema than \(newest) (upgrade them): \(behind.joined(separator: ", "))\n"
        }
    }
    if let cluster = response["cluster"] as? [String: Any] {
        if let state = cluster["state"] as? String { out += "\ncluster: \(state)\(cluster["reason"].map { " (\($0))" } ?? "")\n" }
        if cluster["wakeupsArrive"] as? Bool == false {
            out += "wake-ups do not reach this node (a connection pooler in transaction mode?): jobs start by the 1 s poll\n"
        }
        for stuck in cluster["unrunnable"] as? [[String: Any]] ?? [] {
            out += "waiting: \(stuck["job"] as? String ?? "?"): \(stuck["reason"] as? String ?? "no live node can run it")\n"
        }
        // SPEC §8: each queue's cluster-wide counts, as this node last read them.
        if let read = cluster["queuesReadAt"] as? Double, let counts = cluster["queues"] as? [String: [String: Any]] {
            let ago = String(format: "%.1f", max(0, Date().timeIntervalSince1970 - read))
            if counts.isEmpty {
                out += "the cluster's queues: no job waits or runs (read from the database \(ago) s ago)\n"
            } else {
                var rows = [["QUEUE", "WAITING", "RUNNING"]]
                for (name, count) in counts.sorted(by: { $0.key < $1.key }) {
                    rows.append([name, String(count["waiting"] as? Int ?? 0), String(count["running"] as? Int ?? 0)])
                }
                out += "\nthe cluster's jobs per queue (read from the database \(ago) s ago; a job counts in each of its queues):\n"
                    + table(rows)
            }
        }
    }
    // `jobs` (with progress) comes from daemons that know it; `activeJobs` alone from older ones.
    let progress = response["jobs"] as? [[String: Any]] ?? active.map { ["job": $0] }
    if !progress.isEmpty {
        var rows = [["JOB", "PROGRESS"]]
        for job in progress {
            let total = job["operations"] as? Int ?? 0
            rows.append([job["job"] as? String ?? "?", total == 0 ? "being read" : "\(job["ended"] as? Int ?? 0)/\(total) done"])
        }
        out += "\n" + table(rows)
    }
    return out
}

/// Left-aligned columns two spaces apart, numbers included (headers are words).
func table(_ rows: [[String]]) -> String {
    var widths: [Int] = []
    for row in rows {
        for (i, cell) in row.enumerated() {
            if i < widths.count { widths[i] = max(widths[i], cell.count) } else { widths.append(cell.count) }
        }
    }
    return rows.map { row in
        row.enumerated().map { i, cell in
            i == row.count - 1 ? cell : cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
        }.joined(separator: "  ")
    }.joined(separator: "\n") + "\n"
}

/// A job's outbox entry, once it has ended: its folder and result (outbox/<job>, or the outbox/<job>.N whose
/// result names the job when that name was taken: `Spool.entry`).
func outboxEntry(of job: String, _ common: Common) -> (folder: String, result: [String: Any])? {
    guard let folder = Spool.entry(of: job, in: common.spool + "/outbox"),
          let data = FileManager.default.contents(atPath: folder + "/result.plist"),
          let result = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any] else { return nil }
    return (folder, result)
}

/// A job's operations: from the outbox when it has ended, else from the daemon (which, in a cluster, answers for
/// jobs on every node); `node` is where it runs or ran, when known (SPEC §8).
/// `progressAt`: for a job running on another node, when that node's heartbeat sent the states shown.
func operations(of job: String, _ common: Common) throws
    -> (status: String, operations: [[String: Any]], node: String?, progressAt: Double?) {
    if let plist = outboxEntry(of: job, common)?.result {
        return (plist["status"] as? String ?? "?", plist["operations"] as? [[String: Any]] ?? [], plist["node"] as? String, nil)
    }
    let response = try common.request(["command": "show", "job": job])
    return (response["status"] as? String ?? "running", response["operations"] as? [[String: Any]] ?? [], response["node"] as? String,
            response["progressAt"] as? Double)
}

struct Show: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Each operation's state, queue, attempts, timings, error.")
    @OptionGroup var common: Common
    @Argument(help: "A job id.", completion: .custom(completeJobs)) var job: String
    @Flag(help: "JSON output.") var json = false

    func run() throws {
        let (status, ops, node, progressAt) = try operations(of: job, common)
        if json {
            var object: [String: Any] = ["job": job, "status": status, "operations": ops]
            if let node { object["node"] = node }
            if let progressAt { object["progressAt"] = progressAt }
            let data = try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys])
            print(String(decoding: data, as: UTF8.self))
            return
        }
        // A job running on another node: its operations' states as that node's last heartbeat sent them, or
        // `unknown` for those it did not send (SPEC §8: no protocol between nodes).
        let elsewhere = ops.contains { $0["state"] as? String == "unknown" }
        var place = ""
        if let node {
            if let progressAt {
                let age = max(0, Date().timeIntervalSince1970 - progressAt)
                place = " on node \(node) (states as of its heartbeat \(String(format: "%.1f", age)) s ago)"
            } else if elsewhere {
                place = " on node \(node) (its operations' states are known there: opqueuectl show on that node)"
            } else {
                place = " (node \(node))"
            }
        }
        print("job \(job): \(status)\(place)")
        if ops.isEmpty && status == "running" { print("  (claimed a moment ago: its manifest is being read)") }
        for op in ops {
            var line = "  \(op["id"] ?? "?")  \(op["kind"] ?? "")  queue=\(op["queue"] ?? "")  \(op["state"] ?? "")"
            if let attempts = op["attempts"] { line += "  attempts=\(attempts)" }
            if let s = op["startedAt"] as? Double, let f = op["finishedAt"] as? Double { line += String(format: "  %.3fs", f - s) }
            if let e = op["error"] as? String { line += "  error: \(e)" }
            print(line)
        }
    }
}

struct Wait: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Waits for the job's outbox entry: 0 succeeded, 1 not, 2 timeout.",
        discussion: """
            An id not seen yet is waited for (its manifest may be dropped later). On a terminal, and at a timeout, \
            wait says why such a job is not seen: its manifest waits in the inbox to be claimed, the daemon knows no \
            job of that id (a job's id is its manifest's job key, else its file's name without .plist, each character \
            outside A-Z a-z 0-9 . _ - made _), or no daemon answers; given a manifest's file name, it says the id such \
            a file gets.
            """)
    @OptionGroup var common: Common
    @Argument(help: "A job id.", completion: .custom(completeJobs)) var job: String
    @Option(help: "Give up after this many seconds (exit 2).") var timeout: Double?

    func run() throws {
        // An id no job can have is never seen: waiting for it (for ever, without --timeout) helps no one.
        guard isValidIdentifier(job) else {
            throw fail("'\(job)' cannot be a job's id: an id is 1 to 128 of A-Z a-z 0-9 . _ -, not starting with '.' "
                + "(a manifest's `job`, else its file's name)\(fileHint)")
        }
        let deadline = timeout.map { Date().addingTimeInterval($0) }
        let tty = isatty(STDERR_FILENO) == 1
        var spinner = 0
        var polls = 0
        // What the daemon last said of the job (the loop asks every half second), for the message at the deadline:
        // asking again then could take the daemon's answer time past it.
        var lastLook: Look?
        while true {
            if let plist = outboxEntry(of: job, common)?.result {
                let status = plist["status"] as? String ?? "?"
                if tty { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
                print("\(job): \(status)")
                if status != "succeeded" { throw ExitCode(1) }
                return
            }
            // In a cluster (SPEC §8) the job may end on another node: the daemon answers for it from the database
            // (never waited for past the deadline).
            polls += 1
            if polls % 10 == 1 {
                switch (look(timeout: within(2, deadline)), lastLook) {
                case (.ended(let response), _):
                    let status = response["status"] as? String ?? "?"
                    if tty { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
                    print("\(job): \(status)\(response["node"].map { " (on \($0))" } ?? "")")
                    if status != "succeeded" { throw ExitCode(1) }
                    return
                case (.silent, _?):
                    break  // an answer that did not come in the time left does not hide what the daemon said before
                case (let fresh, _):
                    lastLook = fresh
                }
            }
            if let deadline, Date() >= deadline {
                if tty { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
                let why: String
                switch lastLook ?? look(timeout: 1) {
                case .unseen(let reason), .unknowable(let reason?), .silent(let reason): why = " (\(reason))"
                case .running, .ended, .unknowable(nil): why = ""
                }
                throw fail("\(job): still not ended after \(timeout ?? 0) s\(why)\(fileHint)", 2)
            }
            if tty { progress(&spinner) }
            usleep(50_000)
        }
    }

    /// For an argument that looks like a manifest's file name (`photo 1.plist`, `inbox/hello.plist`): the id such a
    /// file gets when its manifest has no `job` key (the daemon's rule: the name without `.plist`, each character
    /// outside A-Z a-z 0-9 . _ - made `_`), as a hint; "" when that is the argument itself or no id.
    var fileHint: String {
        // A path is a file's only when it names a manifest; a hidden name is never claimed.
        if job.contains("/") && !job.hasSuffix(".plist") { return "" }
        var name = job.split(separator: "/", omittingEmptySubsequences: false).last.map(String.init) ?? job
        if !name.hasSuffix(".plist") { name += ".plist" }
        guard name != ".plist", !name.hasPrefix(".") else { return "" }
        let id = jobID(ofManifestFile: name)
        guard isValidIdentifier(id), id != job else { return "" }
        return "; a manifest file \(name) without `job` gets the id '\(id)'"
    }

    /// What the daemon says of a job not in the outbox yet.
    enum Look {
        /// It knows the job: its operations (on another node of a cluster, as that node's last heartbeat sent them:
        /// the progress bar counts those ended there).
        case running([[String: Any]])
        /// It ended on another node of a cluster: the daemon's answer (`status`, `node`).
        case ended([String: Any])
        /// Not seen: why, as far as can be told from here (a typo in the id waits as long as a job not yet dropped).
        case unseen(String)
        /// The daemon answered something else (a cluster that cannot be asked now: what it said).
        case unknowable(String?)
        /// The daemon did not answer in time.
        case silent(String)
    }

    /// At most `seconds`, and no later than `deadline` (a tenth of a second at least).
    func within(_ seconds: Double, _ deadline: Date?) -> Double {
        deadline.map { max(0.1, min(seconds, $0.timeIntervalSinceNow)) } ?? seconds
    }

    func look(timeout: Double) -> Look {
        let response: [String: Any]
        do {
            response = try ControlClient.request(common.socket, ["command": "show", "job": job], timeout: timeout)
        } catch let error as ControlClient.NoDaemon where error.silent {
            return .silent("the daemon at \(common.socket) did not answer within \(String(format: "%.1f", timeout)) s")
        } catch {
            return .unseen("no daemon answers at \(common.socket)")
        }
        switch response["exit"] as? Int ?? 0 {
        case 0:
            if let status = response["status"] as? String, ["succeeded", "failed", "cancelled", "rejected"].contains(status) {
                return .ended(response)
            }
            return .running(response["operations"] as? [[String: Any]] ?? [])
        case 1:
            if FileManager.default.fileExists(atPath: common.spool + "/inbox/" + job + ".plist") {
                return .unseen("not seen yet: inbox/\(job).plist waits to be claimed")
            }
            return .unseen("not seen yet: the daemon knows no job '\(job)'; a job's id is its manifest's `job`, else its file's name")
        default: return .unknowable(response["error"] as? String)
        }
    }

    private func progress(_ spinner: inout Int) {
        spinner += 1
        guard spinner % 4 == 0 else { return }
        let line: String
        switch look(timeout: 1) {
        case .running(let ops) where !ops.isEmpty:
            let done = ops.filter { ["succeeded", "failed", "cancelled"].contains($0["state"] as? String ?? "") }.count
            let width = 30
            let filled = width * done / ops.count
            line = "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
                + "] \(done)/\(ops.count) \(job)"
        case .unseen(let reason): line = "\(job): \(reason)"
        default: return
        }
        FileHandle.standardError.write(Data("\r\u{1B}[K\(line)".utf8))
    }
}

struct Cancel: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Cancel a whole job, or one operation (its dependents follow).")
    @OptionGroup var common: Common
    @Argument(help: "A job id.", completion: .custom(completeJobs)) var job: String
    @Argument(help: "One operation of the job (default: the whole job).") var operation: String?

    func run() throws {
        var request: [String: Any] = ["command": "cancel", "job": job]
        if let operation { request["operation"] = operation }
        _ = try common.request(request)
    }
}

struct Suspend: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Suspend a queue: executing operations go on, no new ones start.",
        discussion: """
            On a daemon alone it stands until the daemon restarts, or until a reload changes the queue's suspended \
            in the configuration (the newer word wins); a reload for anything else leaves it. On a cluster node it is \
            kept in the database and holds on every node.
            """)
    @OptionGroup var common: Common
    @Argument(help: "A queue name.", completion: .custom(completeQueues)) var queue: String
    func run() throws { try toggle(common, queue, "suspend") }
}

struct Resume: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Resume a suspended queue.")
    @OptionGroup var common: Common
    @Argument(help: "A queue name.", completion: .custom(completeQueues)) var queue: String
    func run() throws { try toggle(common, queue, "resume") }
}

func toggle(_ common: Common, _ queue: String, _ command: String) throws {
    _ = try common.request(["command": command, "queue": queue])
}

struct Graph: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "The operation graph in Graphviz DOT, states as colours.")
    @OptionGroup var common: Common
    @Argument(help: "A job id or a manifest file (- reads one from standard input).") var target: String

    /// What the drawing needs of an operation: from a manifest, or from the daemon's `show` of a running job.
    struct Node {
        var id: String, kind: String, queue: String, dependencies: [String]
    }

    func run() throws {
        var states: [String: String] = [:]
        var nodes: [Node]
        var name = target
        let config = try common.configuration()
        var isFolder: ObjCBool = false
        if target == "-" || (FileManager.default.fileExists(atPath: target, isDirectory: &isFolder) && !isFolder.boolValue) {
            let data: Data
            switch readManifestArgument(target) {
            case .success(let read): data = read
            case .failure(let error): throw fail("\(target): cannot be read: \(error)")
            }
            switch Manifest.parse(data, configuration: config) {
            case .success(let plan):
                nodes = Self.nodes(plan)
                name = plan.job ?? target
            case .failure(let problems): throw fail("\(target): " + problems.problems.joined(separator: "\n"))
            }
        } else {
            // An ended job: its manifest in the outbox, states from its result. A running one: the daemon's
            // `show` gives each operation's kind, queue, dependencies and current state.
            let (_, ops, _, _) = try operations(of: target, common)
            for op in ops { if let id = op["id"] as? String { states[id] = op["state"] as? String } }
            let manifest = (outboxEntry(of: target, common)?.folder ?? common.spool + "/outbox/" + target) + "/manifest.plist"
            if let data = FileManager.default.contents(atPath: manifest),
               case .success(let plan) = Manifest.parse(data, configuration: config) {
                nodes = Self.nodes(plan)
            } else {
                nodes = ops.compactMap { op in
                    guard let id = op["id"] as? String, let dependencies = op["dependencies"] as? [String] else { return nil }
                    return Node(id: id, kind: op["kind"] as? String ?? "", queue: op["queue"] as? String ?? "", dependencies: dependencies)
                }
                if nodes.isEmpty { throw fail("no manifest for job '\(target)'") }
            }
        }
        let colours = ["pending": "gray80", "ready": "lightyellow", "executing": "lightblue", "retrying": "orange",
                       "succeeded": "palegreen", "failed": "salmon", "cancelled": "gray60"]
        // Every name is quoted for DOT: a file's path (the graph's name when the manifest has no `job`) may hold
        // quotes or backslashes.
        func q(_ text: String) -> String {
            "\"" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
                .replacingOccurrences(of: "\n", with: "\\n") + "\""
        }
        var dot = "digraph \(q(name)) {\n  rankdir=LR;\n  node [shape=box, style=filled];\n"
        for node in nodes {
            let state = states[node.id] ?? "pending"
            dot += "  \(q(node.id)) [label=\(q("\(node.id)\n\(node.kind) · \(node.queue)\n\(state)")), "
                + "fillcolor=\(colours[state] ?? "white")];\n"
        }
        for node in nodes {
            for dep in node.dependencies { dot += "  \(q(dep)) -> \(q(node.id));\n" }
        }
        print(dot + "}")
    }

    static func nodes(_ plan: JobPlan) -> [Node] {
        plan.operations.map { Node(id: $0.id, kind: $0.kind.rawValue, queue: $0.queue, dependencies: $0.dependencies) }
    }
}

struct Metrics: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The daemon's metrics in the Prometheus text format (for node_exporter's textfile collector and scripts).")
    @OptionGroup var common: Common

    func run() throws {
        let response = try common.request(["command": "metrics"])
        guard (response["exit"] as? Int) == 0, let text = response["text"] as? String else {
            throw fail(response["error"] as? String ?? "the daemon gave no metrics", Int32(response["exit"] as? Int ?? 1))
        }
        print(text, terminator: text.hasSuffix("\n") ? "" : "\n")
    }
}

// MARK: Completion

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
    if let status = try? ControlClient.request(spool + "/opqueued.sock", ["command": "status"], timeout: 1) {
        jobs.formUnion(status["activeJobs"] as? [String] ?? [])
    }
    return jobs.filter { $0.hasPrefix(prefix) }.sorted()
}

/// Queue names for completion: the running daemon's, else the built-in ones.
@Sendable func completeQueues(_ words: [String], _ index: Int, _ prefix: String) -> [String] {
    let status = try? ControlClient.request(spoolOf(words) + "/opqueued.sock", ["command": "status"], timeout: 1)
    let names = (status?["queues"] as? [[String: Any]])?.compactMap { $0["name"] as? String } ?? Configuration.builtIn.queueNames
    return names.filter { $0.hasPrefix(prefix) }.sorted()
}
