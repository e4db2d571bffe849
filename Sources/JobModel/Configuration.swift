// The daemon's configuration (SPEC §6): queues, default queues per kind family, limits.
// Read from a property list; every problem is reported with the key path where it was found.

import Foundation
import OperationEngine
import PropertyList

public struct QueueSettings: Equatable, Sendable {
    public var maxConcurrentOperationCount: Int
    public var qualityOfService: OperationEngine.QualityOfService
    public var suspended: Bool
    /// `clusterMaxConcurrentOperationCount` (SPEC §8): a limit across every node; only with `cluster`.
    public var clusterMaxConcurrentOperationCount: Int? = nil
    /// `rateLimit` (SPEC §3.7): at most N starts in any window of S seconds on this node.
    public var rateLimit: RateLimit? = nil
    /// `clusterRateLimit` (SPEC §3.7, §8): the same across every node; only with `cluster`.
    public var clusterRateLimit: RateLimit? = nil

    package init(maxConcurrentOperationCount: Int, qualityOfService: OperationEngine.QualityOfService, suspended: Bool,
                 clusterMaxConcurrentOperationCount: Int? = nil, rateLimit: RateLimit? = nil, clusterRateLimit: RateLimit? = nil) {
        self.maxConcurrentOperationCount = maxConcurrentOperationCount
        self.qualityOfService = qualityOfService
        self.suspended = suspended
        self.clusterMaxConcurrentOperationCount = clusterMaxConcurrentOperationCount
        self.rateLimit = rateLimit
        self.clusterRateLimit = clusterRateLimit
    }
}

/// `cluster` (SPEC §8): this node shares one queue with others through PostgreSQL.
public struct ClusterSettings: Equatable, Sendable {
    /// The `postgresql://` URL as written (checked by DatabaseURL; its password, if any, is never printed).
    public var database: String
    public var passwordFile: String?
    /// `[A-Za-z0-9._-]{1,64}`; default: the host name.
    public var node: String
    /// Jobs this node runs at once; default: maxActiveJobs.
    public var jobSlots: Int
    public var leaseSeconds: Double
    public var sharedOutbox: String?
    public var keepFinishedDays: Double

    public static let defaultLeaseSeconds = 15.0
    public static let defaultKeepFinishedDays = 7.0

    package init(database: String, passwordFile: String?, node: String, jobSlots: Int, leaseSeconds: Double, sharedOutbox: String?,
                 keepFinishedDays: Double) {
        self.database = database
        self.passwordFile = passwordFile
        self.node = node
        self.jobSlots = jobSlots
        self.leaseSeconds = leaseSeconds
        self.sharedOutbox = sharedOutbox
        self.keepFinishedDays = keepFinishedDays
    }
}

public struct Configuration: Sendable {
    /// Queue names in declaration order: the built-ins first, then the others by name.
    public var queueNames: [String]
    public var queues: [String: QueueSettings]
    /// Kind family (`download`, `image`, `write`, `other`) → queue name.
    public var defaultQueues: [String: String]
    public var maxActiveJobs: Int
    /// Claiming pauses while the active jobs hold this many operations (memory is per operation).
    public var maxActiveOperations: Int
    public var shutdownGraceSeconds: Double
    public var downloadMaxBytes: Int
    public var downloadConnectTimeoutSeconds: Double
    public var downloadTimeoutSeconds: Double
    public var fileRoots: [String]
    /// `download.allowNetworks`: ranges opened to downloads among those refused by default (Networks.swift).
    public var allowNetworks: [IPNetwork] = []
    public var maxPixels: Int
    /// `metrics.listen`: where the HTTP /metrics listener binds (`HOST:PORT`); nil: no listener.
    public var metricsListen: String? = nil
    /// `commands` (SPEC §3.6): what `kind = command` operations may run, by name.
    public var commands: [String: CommandSpec] = [:]
    /// `jobFinished`: the command run once per ended job, after publication.
    public var jobFinished: String?
    /// The `jobFinished` command's definition.
    package var jobFinishedHook: CommandSpec? { jobFinished.flatMap { commands[$0] } }
    /// `cluster` (SPEC §8); nil: one node, the file spool alone.
    public var cluster: ClusterSettings? = nil
    /// `schedules` (SPEC §3.7), by name.
    public var schedules: [String: ScheduleSettings] = [:]
    /// `outbox.keepDays` (SPEC §6): ended jobs' outbox folders are removed this many days after they finished; nil: kept.
    public var outboxKeepDays: Double? = nil
    /// `tracing.otlp` (SPEC §6): the OpenTelemetry collector's base URL (OTLP/HTTP); nil: no traces. Read at start.
    public var tracingOTLP: String? = nil

    public static let builtIn = Configuration(
        queueNames: ["default", "downloads", "filters", "io"],
        queues: [
            "default": QueueSettings(maxConcurrentOperationCount: -1, qualityOfService: .default, suspended: false),
            "downloads": QueueSettings(maxConcurrentOperationCount: 4, qualityOfService: .utility, suspended: false),
            "filters": QueueSettings(maxConcurrentOperationCount: -1, qualityOfService: .userInitiated, suspended: false),
            "io": QueueSettings(maxConcurrentOperationCount: 2, qualityOfService: .utility, suspended: false),
        ],
        defaultQueues: ["download": "downloads", "image": "filters", "write": "io", "other": "default"],
        maxActiveJobs: 64, maxActiveOperations: 1_000_000, shutdownGraceSeconds: 20, downloadMaxBytes: 52_428_800,
        downloadConnectTimeoutSeconds: 10, downloadTimeoutSeconds: 120, fileRoots: [], maxPixels: 100_000_000)

    public struct Invalid: Error, CustomStringConvertible {
        public let path: String
        public let problems: [String]
        public var description: String { problems.map { "\(path): \($0)" }.joined(separator: "\n") }

        package init(path: String, problems: [String]) {
            self.path = path
            self.problems = problems
        }
    }

    /// A reload refused whole: what the running daemon cannot take without a restart.
    public struct ReloadRefused: Error, CustomStringConvertible {
        public let description: String
    }

    /// What a reload (SIGHUP) applies of `new` while `running` is in effect. Whether there is a `cluster` is decided
    /// at start (the job store is the spool's or the cluster's for the process's life): adding or removing it is
    /// refused whole — half of it would, for instance, drop a node's cluster-wide limits while it still runs the
    /// cluster's jobs. The cluster's connection settings keep the values the node started with (returned by name, for
    /// a warning); `sharedOutbox`, read at each publication, takes the new value.
    public static func reloaded(_ new: Configuration, running: Configuration) throws -> (configuration: Configuration, kept: [String]) {
        // The exporter is made at start: `tracing.otlp` keeps the value the daemon started with.
        var new = new, kept: [String] = []
        if new.tracingOTLP != running.tracingOTLP {
            kept.append("tracing.otlp")
            new.tracingOTLP = running.tracingOTLP
        }
        switch (running.cluster, new.cluster) {
        case (nil, nil):
            return (new, kept)
        case (nil, _?):
            throw ReloadRefused(description: "adding 'cluster' takes a restart (systemctl restart opqueued); "
                + "nothing else was applied either")
        case (_?, nil):
            throw ReloadRefused(description: "removing 'cluster' takes a restart (systemctl restart opqueued); "
                + "nothing else was applied either")
        case (let started?, let wanted?):
            if wanted.database != started.database { kept.append("cluster.database") }
            if wanted.passwordFile != started.passwordFile { kept.append("cluster.passwordFile") }
            if wanted.node != started.node { kept.append("cluster.node") }
            if wanted.jobSlots != started.jobSlots { kept.append("cluster.jobSlots") }
            if wanted.leaseSeconds != started.leaseSeconds { kept.append("cluster.leaseSeconds") }
            if wanted.keepFinishedDays != started.keepFinishedDays { kept.append("cluster.keepFinishedDays") }
            var applied = new
            applied.cluster = started
            applied.cluster?.sharedOutbox = wanted.sharedOutbox
            return (applied, kept)
        }
    }

    /// Parses and checks a configuration's bytes; settings they do not give keep their defaults. `checkDatabase` checks
    /// `cluster.database` and returns its problem (naming the key), nil when the URL is usable: it is the cluster store's
    /// own parser, which this module does not link (the daemon's `Configuration.parse(_:path:)` passes it).
    public static func parse(_ data: Data, path: String = "configuration",
                             checkDatabase: (String) -> String?) throws -> Configuration {
        let top = try topLevel(data, path: path)
        var problems: [String] = []
        var config = Configuration.builtIn
        for key in top.keys.sorted() where !Self.keys["", default: []].contains(key) { problems.append("unknown key '\(key)'") }
        parseQueues(top, into: &config, problems: &problems)
        parseDefaultQueues(top, into: &config, problems: &problems)
        parseLimits(top, into: &config, problems: &problems)
        parseDownload(top, into: &config, problems: &problems)
        parseImage(top, into: &config, problems: &problems)
        parseMetrics(top, into: &config, problems: &problems)
        if let value = top["commands"] {
            config.commands = CommandSpec.parseAll(value, queues: Set(config.queueNames), problems: &problems)
        }
        if let value = top["jobFinished"] {
            config.jobFinished = CommandSpec.checkHook(value, commands: config.commands, problems: &problems)
        }
        if let value = top["schedules"] { config.schedules = parseSchedules(value, &problems) }
        if let value = top["cluster"] {
            config.cluster = parseCluster(value, maxActiveJobs: config.maxActiveJobs, checkDatabase: checkDatabase, problems: &problems)
        }
        parseOutbox(top, into: &config, problems: &problems)
        parseTracing(top, into: &config, problems: &problems)
        if !problems.isEmpty { throw Invalid(path: path, problems: problems) }
        return config
    }

    /// The file's top-level dictionary; a file that is not a property list, or not a dictionary, is refused whole.
    static func topLevel(_ data: Data, path: String) throws -> PlistDictionary {
        do {
            guard case .dictionary(let d) = try Manifest.read(data) else {
                throw Invalid(path: path, problems: ["the top level must be a dictionary"])
            }
            return d
        } catch let error as ManifestProblems {
            throw Invalid(path: path, problems: error.problems)
        }
    }

    /// `queues`: each named queue's settings, over the built-in queue of that name if there is one.
    static func parseQueues(_ top: PlistDictionary, into config: inout Configuration, problems: inout [String]) {
        guard let value = top["queues"] else { return }
        guard let queues = value.dictionary else { problems.append("queues: must be a dictionary"); return }
        for name in queues.keys.sorted() {
            guard isValidIdentifier(name) else { problems.append("queues: '\(name)' is not a valid queue name"); continue }
            guard let settings = queues[name]?.dictionary else { problems.append("queues.\(name): must be a dictionary"); continue }
            var queue = config.queues[name] ?? QueueSettings(maxConcurrentOperationCount: -1, qualityOfService: .default,
                                                             suspended: false)
            for key in settings.keys.sorted() {
                guard let v = settings[key], Self.isKnown(key, in: "queues.NAME", at: "queues.\(name)", &problems) else { continue }
                parseQueueSetting(key, v, of: name, into: &queue, clustered: top["cluster"] != nil, problems: &problems)
            }
            if config.queues[name] == nil { config.queueNames.append(name) }
            config.queues[name] = queue
        }
    }

    /// One key of `queues.NAME`; the cluster-wide ones only apply when the file has a `cluster` dictionary.
    static func parseQueueSetting(_ key: String, _ v: PlistValue, of name: String, into queue: inout QueueSettings, clustered: Bool,
                                  problems: inout [String]) {
        switch key {
        case "maxConcurrentOperationCount":
            if let n = v.integer, n == -1 || n >= 1 { queue.maxConcurrentOperationCount = n }
            else { problems.append("queues.\(name).maxConcurrentOperationCount: must be -1 or a positive integer") }
        case "qualityOfService":
            if let s = v.string, let q = OperationEngine.QualityOfService(name: s) { queue.qualityOfService = q }
            else { problems.append("queues.\(name).qualityOfService: must be one of \(qosNames)") }
        case "suspended":
            if let b = v.boolean { queue.suspended = b }
            else { problems.append("queues.\(name).suspended: must be a boolean") }
        case "rateLimit":
            queue.rateLimit = parseRate(v, at: "queues.\(name).rateLimit", &problems)
        case "clusterRateLimit":
            let rate = parseRate(v, at: "queues.\(name).clusterRateLimit", &problems)
            if !clustered {
                problems.append("queues.\(name).clusterRateLimit: only applies with a 'cluster' dictionary (SPEC §8)")
            } else { queue.clusterRateLimit = rate }
        case "clusterMaxConcurrentOperationCount":
            if !clustered {
                problems.append("queues.\(name).clusterMaxConcurrentOperationCount: "
                    + "only applies with a 'cluster' dictionary (SPEC §8)")
            } else if let n = v.integer, n >= 1, n <= 100_000 { queue.clusterMaxConcurrentOperationCount = n }
            else {
                problems.append("queues.\(name).clusterMaxConcurrentOperationCount: "
                    + "must be a positive integer (at most 100000)")
            }
        default:
            break
        }
    }

    /// `defaultQueues`: kind family → a configured queue (the built-ins, and those `queues` added).
    static func parseDefaultQueues(_ top: PlistDictionary, into config: inout Configuration, problems: inout [String]) {
        guard let value = top["defaultQueues"] else { return }
        guard let map = value.dictionary else { problems.append("defaultQueues: must be a dictionary"); return }
        for family in map.keys.sorted() {
            guard ["download", "image", "write", "other"].contains(family) else {
                problems.append("defaultQueues: unknown kind family '\(family)' (download, image, write, other)"); continue
            }
            guard let queue = map[family]?.string, config.queues[queue] != nil else {
                problems.append("defaultQueues.\(family): must name a configured queue"); continue
            }
            config.defaultQueues[family] = queue
        }
    }

    /// The top level's numbers: `maxActiveJobs`, `maxActiveOperations`, `shutdownGraceSeconds`.
    static func parseLimits(_ top: PlistDictionary, into config: inout Configuration, problems: inout [String]) {
        if let value = top["maxActiveJobs"] {
            if let n = value.integer, n >= 1 { config.maxActiveJobs = n }
            else { problems.append("maxActiveJobs: must be a positive integer") }
        }
        if let value = top["maxActiveOperations"] {
            if let n = value.integer, n >= 1 { config.maxActiveOperations = n }
            else { problems.append("maxActiveOperations: must be a positive integer") }
        }
        if let value = top["shutdownGraceSeconds"] {
            if let n = value.real, n >= 0 { config.shutdownGraceSeconds = n }
            else { problems.append("shutdownGraceSeconds: must be 0 or more seconds") }
        }
    }

    /// `download`: its size and time limits, the roots `file://` may read, the networks opened to it.
    static func parseDownload(_ top: PlistDictionary, into config: inout Configuration, problems: inout [String]) {
        guard let value = top["download"] else { return }
        guard let download = value.dictionary else { problems.append("download: must be a dictionary"); return }
        for key in download.keys.sorted() {
            guard let v = download[key], Self.isKnown(key, in: "download", at: "download", &problems) else { continue }
            switch key {
            case "maxBytes":
                if let n = v.integer, n >= 1 { config.downloadMaxBytes = n }
                else { problems.append("download.maxBytes: must be a positive integer") }
            case "connectTimeoutSeconds":
                if let n = v.real, n > 0 { config.downloadConnectTimeoutSeconds = n }
                else { problems.append("download.connectTimeoutSeconds: must be positive") }
            case "timeoutSeconds":
                if let n = v.real, n > 0 { config.downloadTimeoutSeconds = n }
                else { problems.append("download.timeoutSeconds: must be positive") }
            case "fileRoots":
                if let roots = v.array, roots.allSatisfy({ $0.string?.hasPrefix("/") == true }) {
                    config.fileRoots = roots.compactMap(\.string)
                } else {
                    problems.append("download.fileRoots: must be an array of absolute paths")
                }
            case "allowNetworks":
                if let networks = parseAllowNetworks(v, &problems) { config.allowNetworks = networks }
            default:
                break
            }
        }
    }

    /// `download.allowNetworks`: the entries that parse (each one that does not is a problem); nil when it is no array.
    static func parseAllowNetworks(_ v: PlistValue, _ problems: inout [String]) -> [IPNetwork]? {
        guard let entries = v.array else {
            problems.append("download.allowNetworks: must be an array of networks (\"127.0.0.0/8\", \"::1/128\")")
            return nil
        }
        var networks: [IPNetwork] = []
        for entry in entries {
            guard let text = entry.string else {
                problems.append("download.allowNetworks: each entry must be a string such as \"10.1.0.0/16\"")
                continue
            }
            do { networks.append(try IPNetwork(cidr: text)) } catch { problems.append("download.allowNetworks: \(error)") }
        }
        return networks
    }

    /// `image = { maxPixels = N; }`.
    static func parseImage(_ top: PlistDictionary, into config: inout Configuration, problems: inout [String]) {
        guard let value = top["image"] else { return }
        guard let image = value.dictionary else { problems.append("image: must be a dictionary"); return }
        for key in image.keys.sorted() {
            if key == "maxPixels", let n = image[key]?.integer, n >= 1 { config.maxPixels = n }
            else if Self.isKnown(key, in: "image", at: "image", &problems) {
                problems.append("image.maxPixels: must be a positive integer")
            }
        }
    }

    /// `metrics = { listen = "HOST:PORT"; }`.
    static func parseMetrics(_ top: PlistDictionary, into config: inout Configuration, problems: inout [String]) {
        guard let value = top["metrics"] else { return }
        guard let metrics = value.dictionary else { problems.append("metrics: must be a dictionary"); return }
        for key in metrics.keys.sorted() {
            if key == "listen", let listen = metrics[key]?.string, splitListenAddress(listen) != nil {
                config.metricsListen = listen
            } else if Self.isKnown(key, in: "metrics", at: "metrics", &problems) {
                problems.append("metrics.listen: must be \"HOST:PORT\" (e.g. \"127.0.0.1:9464\", \"[::1]:9464\")")
            }
        }
    }

    /// Every key the parser takes, by section (SPEC §6, §8; "" is the top level, NAME a queue's or command's name):
    /// the gate for "unknown key", and what opqueued.plist(5) must name (DocsTests checks it does).
    static let keys: [String: Set<String>] = [
        "": ["queues", "defaultQueues", "maxActiveJobs", "maxActiveOperations", "shutdownGraceSeconds", "download", "image", "metrics",
             "commands", "jobFinished", "cluster", "schedules", "outbox", "tracing"],
        "queues.NAME": ["maxConcurrentOperationCount", "qualityOfService", "suspended", "clusterMaxConcurrentOperationCount", "rateLimit",
                        "clusterRateLimit"],
        "download": ["maxBytes", "connectTimeoutSeconds", "timeoutSeconds", "fileRoots", "allowNetworks"],
        "image": ["maxPixels"],
        "metrics": ["listen"],
        "commands.NAME": ["argv", "parameters", "output", "timeoutSeconds", "maxOutputBytes", "environment", "queue", "tempFailExitCodes"],
        "schedules.NAME": ["cron", "manifest", "catchUp", "timeZone"],
        "cluster": ["database", "passwordFile", "node", "jobSlots", "leaseSeconds", "sharedOutbox", "keepFinishedDays"],
        "outbox": ["keepDays"],
        "tracing": ["otlp"],
    ]

    /// Whether `key` is one of `section`'s; if not, says so (at `path`, the section as the file spells it).
    static func isKnown(_ key: String, in section: String, at path: String, _ problems: inout [String]) -> Bool {
        if keys[section, default: []].contains(key) { return true }
        problems.append("\(path): unknown key '\(key)'")
        return false
    }

    /// The `cluster` dictionary; nil (with problems) when it is not usable.
    static func parseCluster(_ value: PlistValue, maxActiveJobs: Int, checkDatabase: (String) -> String?,
                             problems: inout [String]) -> ClusterSettings? {
        guard let cluster = value.dictionary else { problems.append("cluster: must be a dictionary"); return nil }
        let before = problems.count
        var settings = ClusterSettings(database: "", passwordFile: nil, node: defaultNodeName(), jobSlots: maxActiveJobs,
                                       leaseSeconds: ClusterSettings.defaultLeaseSeconds, sharedOutbox: nil,
                                       keepFinishedDays: ClusterSettings.defaultKeepFinishedDays)
        for key in cluster.keys.sorted() {
            guard let v = cluster[key], isKnown(key, in: "cluster", at: "cluster", &problems) else { continue }
            switch key {
            case "database":
                guard let url = v.string else { problems.append("cluster.database: must be a postgresql:// URL string"); break }
                // Checked now so that a typo names this key; the password file is read when the node connects.
                if let problem = checkDatabase(url) { problems.append(problem) } else { settings.database = url }
            case "passwordFile":
                if let p = v.string, p.hasPrefix("/") { settings.passwordFile = p }
                else { problems.append("cluster.passwordFile: must be an absolute path") }
            case "node":
                if let n = v.string, isValidNodeName(n) { settings.node = n }
                else { problems.append("cluster.node: must be 1 to 64 characters from [A-Za-z0-9._-]") }
            case "jobSlots":
                if let n = v.integer, n >= 1, n <= 1_000_000 { settings.jobSlots = n }
                else { problems.append("cluster.jobSlots: must be a positive integer") }
            case "leaseSeconds":
                if let n = v.real, n >= 2, n <= 86_400 { settings.leaseSeconds = n }
                else { problems.append("cluster.leaseSeconds: must be at least 2 seconds (and at most 86400)") }
            case "sharedOutbox":
                if let p = v.string, p.hasPrefix("/") { settings.sharedOutbox = p }
                else { problems.append("cluster.sharedOutbox: must be an absolute path") }
            case "keepFinishedDays":
                if let n = v.real, n >= 0, n <= 36_500 { settings.keepFinishedDays = n }
                else { problems.append("cluster.keepFinishedDays: must be 0 or more days") }
            default:
                break
            }
        }
        if cluster["database"] == nil { problems.append("cluster.database: missing (the postgresql:// URL of the cluster's database)") }
        if cluster["node"] == nil, !isValidNodeName(settings.node) {
            problems.append("cluster.node: missing, and the host name '\(settings.node)' is not a valid node name ([A-Za-z0-9._-]{1,64})")
        }
        return problems.count == before ? settings : nil
    }
}

extension Configuration {
    /// `outbox = { keepDays = N; }` (SPEC §6): more than 0 days, fractional allowed. In a cluster it also bounds the
    /// database's history (`cluster.keepFinishedDays`) when that is not given.
    static func parseOutbox(_ top: PlistDictionary, into config: inout Configuration, problems: inout [String]) {
        guard let value = top["outbox"] else { return }
        guard let outbox = value.dictionary else { problems.append("outbox: must be a dictionary"); return }
        for key in outbox.keys.sorted() {
            guard let v = outbox[key], isKnown(key, in: "outbox", at: "outbox", &problems) else { continue }
            if let days = v.real, days > 0, days <= 36_500 { config.outboxKeepDays = days } else {
                let given = v.real.map { String($0) } ?? v.typeName
                problems.append("outbox.keepDays: must be more than 0 days (at most 36500; fractional allowed), not \(given)")
            }
        }
        if top["cluster"]?.dictionary?["keepFinishedDays"] == nil, let days = config.outboxKeepDays {
            config.cluster?.keepFinishedDays = days
        }
    }
}

extension Configuration {
    /// `tracing = { otlp = "http://HOST:PORT"; }` (SPEC §6): an http or https URL with a host, no query or fragment
    /// (`/v1/traces` is appended to it).
    static func parseTracing(_ top: PlistDictionary, into config: inout Configuration, problems: inout [String]) {
        guard let value = top["tracing"] else { return }
        guard let tracing = value.dictionary else { problems.append("tracing: must be a dictionary"); return }
        for key in tracing.keys.sorted() {
            guard let v = tracing[key], isKnown(key, in: "tracing", at: "tracing", &problems) else { continue }
            if let s = v.string, let url = URLComponents(string: s), ["http", "https"].contains(url.scheme?.lowercased() ?? ""),
               let host = url.host, !host.isEmpty, url.query == nil, url.fragment == nil, url.user == nil {
                config.tracingOTLP = s
            } else {
                let given = v.string.map { "'\($0)'" } ?? v.typeName
                problems.append("tracing.otlp: must be the collector's http:// or https:// base URL "
                    + "(e.g. \"http://127.0.0.1:4318\"), not \(given)")
            }
        }
    }
}

/// A node name (SPEC §8): `[A-Za-z0-9._-]{1,64}`.
package func isValidNodeName(_ s: String) -> Bool {
    (1...64).contains(s.utf8.count) && s.utf8.allSatisfy(isIdentifierByte)
}

/// The host name, the default node name.
package func defaultNodeName() -> String {
    var buffer = [CChar](repeating: 0, count: 256)
    guard gethostname(&buffer, buffer.count - 1) == 0 else { return "" }
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// `HOST:PORT` or `[IPV6]:PORT` (port 0: any free port) → (host, port); nil when it is neither.
package func splitListenAddress(_ listen: String) -> (host: String, port: Int)? {
    guard let colon = listen.lastIndex(of: ":"), let port = Int(listen[listen.index(after: colon)...]), (0...65535).contains(port) else {
        return nil
    }
    var host = String(listen[..<colon])
    if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
    guard !host.isEmpty, !host.contains(where: { $0 == "/" || $0 == " " }) else { return nil }
    return (host, port)
}

let qosNames = OperationEngine.QualityOfService.allCases.reversed().map(\.name).joined(separator: ", ")
let priorityNames = QueuePriority.allCases.map(\.name).joined(separator: ", ")

/// `[A-Za-z0-9._-]{1,128}`, not starting with `.`: a job's id, an operation's.
public func isValidIdentifier(_ s: String) -> Bool {
    let utf8 = s.utf8
    guard (1...128).contains(utf8.count), utf8.first != UInt8(ascii: ".") else { return false }
    return utf8.allSatisfy(isIdentifierByte)
}

func isIdentifierByte(_ b: UInt8) -> Bool {
    (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2E || b == 0x5F || b == 0x2D
}

/// The id a manifest file named `fileName` gets when its manifest has no valid `job` key (SPEC §2): the name without
/// `.plist`, each character outside `[A-Za-z0-9._-]` made `_`, cut to 128, a leading `.` made `_`. The daemon's
/// rule, and opqueuectl's for what submit prints and what wait hints.
public func jobID(ofManifestFile fileName: String) -> String {
    var id = sanitizedIdentifier(fileName.hasSuffix(".plist") ? String(fileName.dropLast(".plist".count)) : fileName)
    if id.hasPrefix(".") { id = "_" + id.dropFirst() }
    return id
}

/// Replaces each character outside `[A-Za-z0-9._-]` by `_` and cuts to 128 characters.
public func sanitizedIdentifier(_ s: String) -> String {
    var out = ""
    for scalar in s.unicodeScalars.prefix(128) {
        out.unicodeScalars.append(scalar.isASCII && isIdentifierByte(UInt8(scalar.value)) ? scalar : "_")
    }
    return out.isEmpty ? "_" : out
}
