// Small pieces of the cluster store: the monotonic clock, a bounded wait for an async call from a plain thread,
// what `status` reads, and the widening of the local configuration to what the whole cluster declares.
//
// Trusts the database's declarations no more than a manifest: a signature that does not decode widens nothing.

import ClusterStore
import ControlPlane
import Foundation
import JobModel
import OperationEngine

#if canImport(Glibc)
import Glibc
#endif

/// The database did not answer in time, or refused: what was being done and why.
public struct ClusterUnavailable: Error, CustomStringConvertible, Sendable {
    public let description: String
    /// What went wrong without what was being done (see `ClusterStoreError.cause`).
    public let cause: String
    public init(_ description: String, cause: String? = nil) {
        self.description = description
        self.cause = cause ?? description
    }
}

/// Runs `body` on `executor` and waits for it at most `seconds` from a thread that is not one of the executor's
/// (the shell's `work` queue, the store's own threads). On time-out the call is cancelled and abandoned.
func waitBounded<T: Sendable>(_ seconds: Double, on executor: ClusterExecutor, doing: String,
                              _ body: @escaping @Sendable () async throws -> T) throws -> T {
    let box = ResultBox<T>()
    let done = DispatchSemaphore(value: 0)
    let task = Task(executorPreference: executor) {
        do { box.set(.success(try await body())) } catch { box.set(.failure(error)) }
        done.signal()
    }
    guard done.wait(timeout: .now() + seconds) == .success else {
        task.cancel()
        throw ClusterUnavailable("\(doing): no answer from the database within \(formatSeconds(seconds)) s", cause: "no answer")
    }
    guard let result = box.get() else { throw ClusterUnavailable("\(doing): no answer", cause: "no answer") }
    return try result.get()
}

final class ResultBox<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Result<T, any Error>?
    func set(_ v: Result<T, any Error>) { lock.withLock { value = v } }
    func get() -> Result<T, any Error>? { lock.withLock { value } }
}

/// What `opqueuectl status` shows of the cluster (SPEC §8), refreshed on each beat; read without waiting.
public struct ClusterSnapshot: Sendable, Equatable {
    /// A node as `status` shows it: the control answer's own type.
    public typealias Node = StatusAnswer.Node

    public struct Waiting: Sendable, Equatable {
        public var job: String
        /// e.g. "no live node declares queue gpu"; names what is missing.
        public var reason: String
    }

    public struct QueueCounts: Sendable, Equatable {
        public var waiting: Int
        public var running: Int
    }

    /// This node's name and whether it reaches the database now.
    public var node: String
    public var connected: Bool
    /// Why not, when not connected (never holds a password).
    public var lastError: String?
    public var nodes: [Node]
    /// Waiting jobs that no live node can run, with why (at most 100).
    public var unrunnable: [Waiting]
    /// Per queue, the cluster's jobs waiting and running.
    public var queues: [String: QueueCounts]
    /// Monotonic seconds of the refresh; nil: never refreshed (the database was never reached).
    public var refreshedAt: Double?
    /// Whether the database's wake-ups reach this node (false once its probes went unheard: WakeupProbe).
    public var wakeupsArrive = true
}

extension ClusterSnapshot.Waiting {
    init(_ job: UnrunnableJob) {
        var parts: [String] = []
        if !job.missingQueues.isEmpty {
            parts.append("no live node declares queue\(job.missingQueues.count > 1 ? "s" : "") "
                         + "\(job.missingQueues.joined(separator: ", "))")
        }
        if !job.missingCommands.isEmpty {
            parts.append("no live node declares command\(job.missingCommands.count > 1 ? "s" : "") "
                         + "\(job.missingCommands.joined(separator: ", "))")
        }
        if parts.isEmpty { parts.append("no single live node declares all of its queues and commands") }
        self.init(job: job.id, reason: parts.joined(separator: "; "))
    }
}

// MARK: signatures and widening

/// A command's signature as nodes record it in the database: its queue and its parameters' types, as JSON
/// (`{"queue": "io", "parameters": {"level": "integer", "codec": ["h264", "vp9"]}}`). Never argv or environment.
enum CommandSignature {
    static func encode(_ spec: CommandSpec) -> String {
        var parameters: [String: Any] = [:]
        for (name, type) in spec.parameters {
            switch type {
            case .string: parameters[name] = "string"
            case .integer: parameters[name] = "integer"
            case .real: parameters[name] = "real"
            case .bool: parameters[name] = "bool"
            case .oneOf(let allowed): parameters[name] = allowed
            }
        }
        var object: [String: Any] = ["parameters": parameters]
        if let queue = spec.queue { object["queue"] = queue }
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }

    /// A stand-in spec that checks a manifest's arguments as the declaring node would; nil when it does not decode.
    /// Its argv is never run: a node claims only jobs whose commands its own configuration declares.
    static func decode(_ name: String, _ text: String) -> CommandSpec? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
              let parameters = object["parameters"] as? [String: Any] else { return nil }
        var types: [String: CommandSpec.ParameterType] = [:]
        for (parameter, value) in parameters {
            switch value {
            case let s as String where s == "string": types[parameter] = .string
            case let s as String where s == "integer": types[parameter] = .integer
            case let s as String where s == "real": types[parameter] = .real
            case let s as String where s == "bool": types[parameter] = .bool
            case let list as [String]: types[parameter] = .oneOf(list)
            default: return nil
            }
        }
        let queue = object["queue"] as? String
        if let queue, !isValidIdentifier(queue) { return nil }
        return CommandSpec(name: name, argv: [[.literal("/bin/false")]], parameters: types, output: .none, timeoutSeconds: 1,
                           maxOutputBytes: 0, environment: [:], queue: queue, tempFailExitCodes: [])
    }
}

extension Configuration {
    /// SPEC §8: the local configuration widened to every queue and command some node declares, for validating
    /// manifests from this node's inbox. A queue only others declare gets default settings (its settings do not
    /// matter here: it never runs here); a command only others declare checks its arguments by its signature.
    /// This configuration with the queues and commands (by their signatures) it lacks of `queues` and `commands`:
    /// what a submission is validated against in a cluster, and by `opqueuectl submit` beside a running daemon.
    public func widened(queues: Set<String>, commands: Set<String>, signatures: [String: String]) -> Configuration {
        var config = self
        for queue in queues.sorted() where config.queues[queue] == nil && isValidIdentifier(queue) {
            config.queueNames.append(queue)
            config.queues[queue] = QueueSettings(maxConcurrentOperationCount: -1, qualityOfService: .default, suspended: false)
        }
        for command in commands.sorted() where config.commands[command] == nil {
            guard let text = signatures[command], let spec = CommandSignature.decode(command, text) else { continue }
            if let queue = spec.queue, config.queues[queue] == nil { continue }
            config.commands[command] = spec
        }
        return config
    }

    /// What this node declares to the cluster.
    func declaration(node: String, jobSlots: Int) -> NodeDeclaration {
        var limits: [String: Int] = [:]
        for (name, settings) in queues { if let n = settings.clusterMaxConcurrentOperationCount { limits[name] = n } }
        let hooks = Set(commands.values.filter(\.isHookOnly).map(\.name))
        let runnable = commands.keys.filter { !hooks.contains($0) }.sorted()
        var signatures: [String: String] = [:]
        for name in runnable { if let spec = commands[name] { signatures[name] = CommandSignature.encode(spec) } }
        return NodeDeclaration(node: node, queues: queueNames, commands: runnable, jobSlots: jobSlots, clusterLimits: limits,
                               info: NodeProcess.info, commandSignatures: signatures)
    }
}

extension JobPlan {
    /// The ranks the database orders claims by, and the queues and commands a node must declare to run it.
    func clusterPlacement(_ configuration: Configuration) -> (qos: Int, priority: Int, queues: [String], commands: [String]) {
        var qos: OperationEngine.QualityOfService?
        var queues: Set<String> = []
        var commands: Set<String> = []
        for operation in operations {
            queues.insert(operation.queue)
            if case .command(let name, _) = operation.parameters { commands.insert(name) }
            let effective = operation.qualityOfService ?? qualityOfService
                ?? configuration.queues[operation.queue]?.qualityOfService ?? .default
            qos = max(qos ?? effective, effective)
        }
        // The photo list's graph is added once the list has arrived: its queues are known already.
        if photosURL != nil {
            for family in ["download", "image", "write"] { if let q = configuration.defaultQueues[family] { queues.insert(q) } }
        }
        return (Int((qos ?? qualityOfService ?? .default).rawValue), Int((queuePriority ?? .normal).rawValue),
                queues.sorted(), commands.sorted())
    }
}

/// A store thread's wake-up: `signal` ends the thread's current `wait` early, or makes its next one return at once.
final class ThreadSignal: @unchecked Sendable {
    private let condition = NSCondition()
    private var signalled = false

    func signal() {
        condition.lock()
        signalled = true
        condition.signal()
        condition.unlock()
    }

    /// Waits until signalled or `seconds` passed; the signal is consumed either way.
    /// Returns whether it was signalled (rather than timed out).
    @discardableResult
    func wait(upTo seconds: Double) -> Bool {
        condition.lock()
        if !signalled { _ = condition.wait(until: Date(timeIntervalSinceNow: max(0, seconds))) }
        let was = signalled
        signalled = false
        condition.unlock()
        return was
    }
}

/// Which process holds a node's name. SPEC §8 names are unique in the cluster; two processes started under one name
/// by mistake (a configuration copied to a second machine) must not both run as it — each would take the other's
/// jobs for orphans and hand them back, and every job would run several times. A node registers with this `info`,
/// beats only while the row is still its own, and waits while another running process holds the name.
enum NodeProcess {
    /// `opqueued pid P on HOST boot B pidns N run R`: B the kernel's boot id, N the pid namespace (a pid means
    /// something only within one), R drawn at random for this run (a container restarted may reuse the pid).
    static let info: String = {
        let host = defaultNodeName()
        let namespace = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/ns/pid")) ?? ""
        return "opqueued pid \(getpid()) on \(word(host)) boot \(word(bootID)) pidns \(word(namespace)) "
            + "run \(String(UInt64.random(in: 1...UInt64.max), radix: 16))"
    }()

    private static let bootID: String = {
        ((try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)) ?? "")
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }()

    /// One word of `info`: never empty, never a space.
    private static func word(_ text: String) -> String {
        let clean = text.filter { !$0.isWhitespace }
        return clean.isEmpty ? "unknown" : clean
    }

    /// Whether `other` (a registered info) names a process of this machine, since this boot and in this pid
    /// namespace, that is gone: an earlier run of this node (killed, crashed), whose name this process takes at once
    /// rather than after its lease. Anything else — another machine or container, an older format, a live pid —
    /// is a process that may still run.
    static func isGoneFromThisMachine(_ other: String) -> Bool {
        let words = other.split(separator: " ", omittingEmptySubsequences: false)
        let mine = info.split(separator: " ", omittingEmptySubsequences: false)
        guard words.count == 11, mine.count == 11, words[0] == "opqueued", words[1] == "pid", words[3] == "on", words[5] == "boot",
              words[7] == "pidns", words[9] == "run", words[4] == mine[4], words[6] == mine[6], words[8] == mine[8],
              words[6] != "unknown", words[8] != "unknown", let pid = pid_t(words[2]), pid > 0 else { return false }
        // Our own pid in our namespace: another run's, which cannot be alive (or this very run: not gone).
        if pid == getpid() { return words[10] != mine[10] }
        if kill(pid, 0) != 0 { return errno == ESRCH }
        // The pid lives: gone only if it is no longer an opqueued (the number was given to another program).
        let comm = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        return comm != nil && comm != "opqueued"
    }
}
