// Manifests (SPEC §3): a property list describing a job's operation graph.
//
// What it trusts: nothing. Every key is checked for its type and range; unknown keys are errors
// (a typo must not pass silently); every problem is reported, each naming the operation involved.
// The result is a `JobPlan`, plain values the daemon turns into an engine graph.

import Foundation
import OperationEngine
import PropertyList

public enum Kind: String, CaseIterable, Sendable {
    case download, sepia, grayscale, blur, resize, thumbnail, vignette, write, sleep, spin, fail, command

    /// The family whose default queue the kind uses (configuration `defaultQueues`).
    public var family: String {
        switch self {
        case .download: "download"
        case .sepia, .grayscale, .blur, .resize, .thumbnail, .vignette: "image"
        case .write: "write"
        case .sleep, .spin, .fail, .command: "other"
        }
    }

    /// Whether an operation of the kind hands an output to its dependents.
    public var hasOutput: Bool {
        switch self {
        case .sleep, .spin, .fail: false
        default: true
        }
    }

    /// The kind's own parameters (keys of the operation dictionary beside the common ones).
    var parameters: Set<String> {
        switch self {
        case .download: ["url", "maxBytes"]
        case .sepia: ["intensity"]
        case .grayscale: []
        case .blur: ["radius"]
        case .resize: ["width", "height", "mode"]
        case .thumbnail: ["size"]
        case .vignette: ["strength"]
        case .write: ["path", "format", "quality"]
        case .sleep: ["seconds"]
        case .spin: ["seconds"]
        case .fail: ["message"]
        case .command: ["command", "arguments"]
        }
    }
}

/// A kind's parameters, checked.
public enum Parameters: Sendable, Equatable {
    case download(url: String, maxBytes: Int?)
    case sepia(intensity: Double)
    case grayscale
    case blur(radius: Double)
    case resize(width: Int?, height: Int?, mode: String)
    case thumbnail(size: Int)
    case vignette(strength: Double)
    /// `format` nil: from the path's extension for an image; bytes are written unchanged (SPEC §3.3).
    case write(path: String, format: String?, quality: Int)
    case sleep(seconds: Double)
    case spin(seconds: Double)
    case fail(message: String)
    /// A configured command (§3.6) and its arguments as they are placed in argv.
    case command(name: String, arguments: [String: String])
}

public struct OperationPlan: Sendable {
    public var id: String
    public var kind: Kind
    public var queue: String
    public var dependencies: [String]
    public var input: String?
    public var qualityOfService: OperationEngine.QualityOfService?
    public var queuePriority: QueuePriority?
    public var timeoutSeconds: Double?
    public var retries: Int
    public var retryDelaySeconds: Double
    public var runsAfterFailure: Bool
    public var parameters: Parameters
}

public struct JobPlan: Sendable {
    public var job: String?
    public var operations: [OperationPlan]
    public var qualityOfService: OperationEngine.QualityOfService?
    public var queuePriority: QueuePriority?
    public var timeoutSeconds: Double?
    /// `metadata`, copied into the result unchanged.
    public var metadata: PlistValue?
    /// The photo-list URL form (§3.5): `operations` holds only the `photos` download; the graph for the
    /// list's entries is added to the running job once the list has arrived.
    public var photosURL: String?
    /// §3.7: `notBefore` (epoch seconds) or `delaySeconds` (from receipt); at most one is set.
    public var notBefore: Double?
    public var delaySeconds: Double?
    /// §3.7: `ifJobExists = skip` (false: the `.1` rule).
    public var skipIfExists = false
    /// A W3C trace context continuing the submitter's trace (§6 `tracing`).
    public var traceparent: String?

    /// When the job may start, for a job received at `receivedAt` (nil: at once).
    public func startsAt(receivedAt: Double) -> Double? { notBefore ?? delaySeconds.map { receivedAt + $0 } }
}

public enum ManifestLimits {
    /// A binary manifest of 1,000,000 operations in chains takes ~125 MB.
    public static let maxBytes = 256 << 20
    public static let maxOperations = 1_000_000
}

/// A manifest's bytes read once: the tree, or why they are not a manifest's property list. The daemon reads
/// it when it claims the file (to name the job) and validates the same tree when it accepts the job.
public struct ManifestTree: Sendable {
    package let value: Result<PlistValue, ManifestProblems>

    public init(_ data: Data) {
        guard data.count <= ManifestLimits.maxBytes else {
            // A reader stops just past the limit: the file's whole size is not known here.
            value = .failure(ManifestProblems(["the manifest is larger than the limit of \(ManifestLimits.maxBytes) bytes (256 MiB)"]))
            return
        }
        value = Result { () throws(ManifestProblems) -> PlistValue in try Manifest.read(data) }
    }

    /// A file whose size alone (from fstat) says it is no manifest: rejected without its bytes ever read, so that
    /// an inbox full of huge files costs no memory.
    public init(tooLarge size: Int) {
        value = .failure(ManifestProblems(["the manifest is \(size) bytes; the limit is \(ManifestLimits.maxBytes) bytes (256 MiB)"]))
    }

    /// The `job` key if present and a string (valid or not), for naming the job before validation.
    public var requestedJob: String? {
        guard case .success(.dictionary(let top)) = value else { return nil }
        return top["job"]?.string
    }

    /// The top-level dictionary, if the bytes are a property list with one.
    public var dictionary: PlistDictionary? { if case .success(.dictionary(let top)) = value { top } else { nil } }

    /// `ifJobExists = skip` (§3.7), read at claim: such a manifest whose id is held makes no job.
    public var skipsIfExists: Bool { dictionary?["ifJobExists"]?.string == "skip" }
}

public struct Manifest {
    /// The `job` key if present and a string (valid or not), for naming the job before validation.
    public static func requestedJob(in data: Data) -> String? { ManifestTree(data).requestedJob }

    /// XML or binary only: the old OpenStep text format is not a manifest format.
    static func read(_ data: Data) throws(ManifestProblems) -> PlistValue {
        let result: Result<PlistValue, PlistError> = data.withUnsafeBytes { buffer in
            guard PropertyList.looksLikePropertyList(buffer) else {
                return .failure(PlistError("the file is neither an XML nor a binary property list"))
            }
            return Result { () throws(PlistError) -> PlistValue in try PropertyList.parse(buffer) }
        }
        switch result {
        case .success(let value): return value
        case .failure(let error): throw ManifestProblems(["not a property list: \(error.description)"])
        }
    }

    /// Parses and validates; returns the plan or every problem found.
    public static func parse(_ data: Data, configuration: Configuration) -> Result<JobPlan, ManifestProblems> {
        parse(ManifestTree(data), configuration: configuration)
    }

    /// The keys of a manifest's top level besides `photosURL` (SPEC §3).
    static let jobKeys: Set<String> = ["job", "operations", "qualityOfService", "queuePriority", "timeoutSeconds", "metadata",
                                       "notBefore", "delaySeconds", "ifJobExists", "traceparent"]

    /// Validates a manifest already read; returns the plan or every problem found. `accepted`: it was accepted before
    /// (a delayed job whose time came, a job resumed at a restart), and runs on with what it was accepted with: a
    /// queue or command the configuration has lost since is no problem (the queue's name is kept; the shell runs it on
    /// that queue while the engine still has it, else on the default one; the command fails when it would run).
    public static func parse(_ tree: ManifestTree, configuration: Configuration,
                             accepted: Bool = false) -> Result<JobPlan, ManifestProblems> {
        var problems: [String] = []
        let object: PlistValue
        switch tree.value {
        case .success(let value): object = value
        case .failure(let error): return .failure(error)
        }
        guard case .dictionary(let top) = object else {
            return .failure(ManifestProblems(["the top level must be a dictionary, not \(object.typeName)"]))
        }
        var plan = JobPlan(job: nil, operations: [], qualityOfService: nil, queuePriority: nil, timeoutSeconds: nil, metadata: nil,
                           photosURL: nil)

        // The photo-list form: name → URL strings only, none of the manifest keys.
        if top["operations"] == nil, top["photosURL"] == nil, top.keys.allSatisfy({ !jobKeys.contains($0) }), let photos = strings(top) {
            plan.operations = photoListOperations(photos, configuration: configuration)
            return validateGraph(plan, problems: [], configuration: configuration)
        }

        for key in top.keys.sorted() where !jobKeys.contains(key) && key != "photosURL" {
            problems.append("unknown key '\(clipped(key))'")
        }
        parsePhotosURL(top, into: &plan, configuration: configuration, problems: &problems)
        parseJobSettings(top, into: &plan, problems: &problems)
        parseFlowControl(top, into: &plan, problems: &problems)
        if top["photosURL"] != nil { return validateGraph(plan, problems: problems, configuration: configuration) }
        switch parseOperations(top, into: &plan, configuration: configuration, accepted: accepted, problems: &problems) {
        case .unchecked: return .failure(ManifestProblems(problems))
        case .plans: return validateGraph(plan, problems: problems, configuration: configuration)
        case .shapes(let shapes): return validateGraph(plan, shapes: shapes, problems: problems, configuration: configuration)
        }
    }

    /// `photosURL` (§3.5): the job is the list's download, its entries' operations added once the list has arrived.
    private static func parsePhotosURL(_ top: PlistDictionary, into plan: inout JobPlan, configuration: Configuration,
                                       problems: inout [String]) {
        guard let value = top["photosURL"] else { return }
        if top["operations"] != nil { problems.append("photosURL: cannot be combined with operations") }
        if let url = value.string, let scheme = URLComponents(string: url)?.scheme?.lowercased(),
           ["http", "https", "file"].contains(scheme) {
            plan.photosURL = url
            plan.operations = [OperationPlan(
                id: "photos", kind: .download, queue: configuration.defaultQueues[Kind.download.family] ?? "default",
                dependencies: [], input: nil, qualityOfService: nil, queuePriority: nil, timeoutSeconds: nil, retries: 0,
                retryDelaySeconds: 1, runsAfterFailure: false, parameters: .download(url: url, maxBytes: nil))]
        } else {
            problems.append("photosURL: must be an http, https or file URL string")
        }
    }

    /// The job's own keys: `job`, `qualityOfService`, `queuePriority`, `timeoutSeconds`, `metadata`.
    private static func parseJobSettings(_ top: PlistDictionary, into plan: inout JobPlan, problems: inout [String]) {
        if let value = top["job"] {
            if let job = value.string, isValidIdentifier(job) { plan.job = job }
            else { problems.append("job: must be a string of 1 to 128 characters from [A-Za-z0-9._-], not starting with '.'") }
        }
        let shared = parseSharedSettings(top, at: .job, problems: &problems)
        plan.qualityOfService = shared.qualityOfService
        plan.queuePriority = shared.queuePriority
        plan.timeoutSeconds = shared.timeoutSeconds
        if let value = top["metadata"] {
            if case .dictionary = value {
                plan.metadata = value
            } else {
                problems.append("metadata: must be a dictionary")
            }
        }
    }

    /// The keys a job and each of its operations both have (the job's are its operations' defaults).
    struct SharedSettings {
        var qualityOfService: OperationEngine.QualityOfService?
        var queuePriority: QueuePriority?
        var timeoutSeconds: Double?
    }

    /// Where a problem was found, which words it: `key: …` at the job's level, `<label>: key …` in an operation.
    enum ProblemPlace {
        case job
        case operation(label: String)

        func problem(_ key: String, _ text: String) -> String {
            switch self {
            case .job: "\(key): \(text)"
            case .operation(let label): "\(label): \(key) \(text)"
            }
        }
    }

    /// The keys of `SharedSettings` in `dict`, checked (a key with a problem stays nil).
    static func parseSharedSettings(_ dict: PlistDictionary, at place: ProblemPlace, problems: inout [String]) -> SharedSettings {
        var shared = SharedSettings()
        if let value = dict["qualityOfService"] {
            if let s = value.string, let q = OperationEngine.QualityOfService(name: s) { shared.qualityOfService = q }
            else { problems.append(place.problem("qualityOfService", "must be one of \(qosNames)")) }
        }
        if let value = dict["queuePriority"] {
            if let s = value.string, let p = QueuePriority(name: s) { shared.queuePriority = p }
            else { problems.append(place.problem("queuePriority", "must be one of \(priorityNames)")) }
        }
        if let value = dict["timeoutSeconds"] {
            if let t = value.real, t > 0, t < 1e9 { shared.timeoutSeconds = t }
            else { problems.append(place.problem("timeoutSeconds", "must be a positive number of seconds, less than 1e9")) }
        }
        return shared
    }

    /// What the graph checks of `operations` are run on.
    enum GraphInput {
        /// None: `operations` is missing, is no array, or holds more operations than a manifest may.
        case unchecked
        /// The plan's operations, each valid.
        case plans
        /// Every operation with an id, as far as it parsed: some have problems (the plan is then not used).
        case shapes([OperationShape])
    }

    /// `operations`: each one checked and added to the plan while none has a problem; from the first one with a
    /// problem on, each one's shape is kept instead, for the graph checks.
    private static func parseOperations(_ top: PlistDictionary, into plan: inout JobPlan, configuration: Configuration,
                                        accepted: Bool, problems: inout [String]) -> GraphInput {
        guard let operationsValue = top["operations"] else {
            problems.append("operations: missing (an array of operations is required)")
            return .unchecked
        }
        guard case .array(let operations) = operationsValue else {
            problems.append("operations: must be an array")
            return .unchecked
        }
        if operations.isEmpty { problems.append("operations: must not be empty") }
        if operations.count > ManifestLimits.maxOperations {
            problems.append("operations: \(operations.count) operations; the limit is \(ManifestLimits.maxOperations)")
            return .unchecked
        }
        // Shapes only once needed: a valid manifest of a million operations is not held twice.
        var shapes: [OperationShape]?
        for (index, element) in operations.enumerated() {
            switch parseOperation(element, index: index, configuration: configuration, accepted: accepted, problems: &problems) {
            case .valid(let operation):
                if shapes == nil { plan.operations.append(operation) }
                else { shapes?.append(OperationShape(operation)) }
            case .shaped(let shape):
                if shapes == nil {
                    shapes = plan.operations.map(OperationShape.init)
                    plan.operations = []
                }
                shapes?.append(shape)
            case .unnamed:
                break
            }
        }
        return shapes.map { .shapes($0) } ?? .plans
    }

    /// A downloaded photo list (§3.5): a non-empty dictionary of name → URL strings.
    public static func photoList(from data: Data, url: String) throws -> [String: String] {
        guard case .dictionary(let dictionary)? = try? read(data), let photos = strings(dictionary) else {
            throw ManifestProblems(["the photo list at \(url) is not a property list dictionary of name → URL strings"])
        }
        return photos
    }

    /// A photo list's shape: a non-empty dictionary whose values are all strings.
    private static func strings(_ dictionary: PlistDictionary) -> [String: String]? {
        var out: [String: String] = [:]
        for entry in dictionary.entries {
            guard let s = entry.value.string else { return nil }
            out[entry.key] = s
        }
        return out.isEmpty ? nil : out
    }

    package static func photoListOperations(_ photos: [String: String], configuration: Configuration) -> [OperationPlan] {
        var operations: [OperationPlan] = []
        var used: Set<String> = []
        for name in photos.keys.sorted() {
            var base = sanitizedIdentifier(name)
            if base.hasPrefix(".") { base = "_" + base.dropFirst() }
            var unique = base
            var n = 1
            while used.contains(unique) { unique = "\(base).\(n)"; n += 1 }
            used.insert(unique)
            func op(_ id: String, _ kind: Kind, _ deps: [String], _ parameters: Parameters) -> OperationPlan {
                OperationPlan(id: id, kind: kind, queue: configuration.defaultQueues[kind.family] ?? "default", dependencies: deps,
                              input: nil, qualityOfService: nil, queuePriority: nil, timeoutSeconds: nil, retries: 0,
                              retryDelaySeconds: 1, runsAfterFailure: false, parameters: parameters)
            }
            operations.append(op("download-\(unique)", .download, [], .download(url: photos[name] ?? "", maxBytes: nil)))
            operations.append(op("sepia-\(unique)", .sepia, ["download-\(unique)"], .sepia(intensity: 0.8)))
            operations.append(op("write-\(unique)", .write, ["sepia-\(unique)"], .write(path: "\(unique).png", format: "png", quality: 90)))
        }
        return operations
    }
}

public struct ManifestProblems: Error, CustomStringConvertible {
    public var problems: [String]
    /// At most this many problems are reported (a manifest of 100,000 bad operations gets a readable
    /// answer, not a 100,000-line journal entry).
    static let reported = 100

    init(_ problems: [String]) {
        self.problems = problems.count <= Self.reported ? problems
            : Array(problems.prefix(Self.reported)) + ["… and \(problems.count - Self.reported) more problems"]
    }
    public var description: String { problems.joined(separator: "\n") }
}

func quoted(_ value: PlistValue) -> String {
    if let s = value.string { return "'\(clipped(s))'" }
    return value.typeName
}

/// A user's string in a message: at most 80 characters.
package func clipped(_ s: String) -> String {
    s.count <= 80 ? s : s.prefix(80) + "… (\(s.utf8.count) bytes)"
}

/// A number as a user wrote it: a whole number without ".0" (when it fits an Int; 1e300 stays "1e+300").
func formatNumber(_ value: Double) -> String {
    guard value == value.rounded(), let whole = Int(exactly: value) else { return String(value) }
    return String(whole)
}
