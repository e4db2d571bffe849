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
    let value: Result<PlistValue, ManifestProblems>

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

    /// Validates a manifest already read; returns the plan or every problem found.
    public static func parse(_ tree: ManifestTree, configuration: Configuration) -> Result<JobPlan, ManifestProblems> {
        var problems: [String] = []
        let object: PlistValue
        switch tree.value {
        case .success(let value): object = value
        case .failure(let error): return .failure(error)
        }
        guard case .dictionary(let top) = object else {
            return .failure(ManifestProblems(["the top level must be a dictionary, not \(object.typeName)"]))
        }
        let jobKeys: Set<String> = ["job", "operations", "qualityOfService", "queuePriority", "timeoutSeconds", "metadata",
                                    "notBefore", "delaySeconds", "ifJobExists", "traceparent"]
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
        if let value = top["photosURL"] {
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
        if let value = top["job"] {
            if let job = value.string, isValidIdentifier(job) { plan.job = job }
            else { problems.append("job: must be a string of 1 to 128 characters from [A-Za-z0-9._-], not starting with '.'") }
        }
        if let value = top["qualityOfService"] {
            if let s = value.string, let q = OperationEngine.QualityOfService(name: s) { plan.qualityOfService = q }
            else { problems.append("qualityOfService: must be one of \(qosNames)") }
        }
        if let value = top["queuePriority"] {
            if let s = value.string, let p = QueuePriority(name: s) { plan.queuePriority = p }
            else { problems.append("queuePriority: must be one of \(priorityNames)") }
        }
        if let value = top["timeoutSeconds"] {
            if let t = value.real, t > 0, t < 1e9 { plan.timeoutSeconds = t }
            else { problems.append("timeoutSeconds: must be a positive number of seconds, less than 1e9") }
        }
        if let value = top["metadata"] {
            if case .dictionary = value {
                plan.metadata = value
            } else {
                problems.append("metadata: must be a dictionary")
            }
        }
        parseFlowControl(top, into: &plan, problems: &problems)
        if top["photosURL"] != nil { return validateGraph(plan, problems: problems, configuration: configuration) }
        guard let operationsValue = top["operations"] else {
            problems.append("operations: missing (an array of operations is required)")
            return .failure(ManifestProblems(problems))
        }
        guard case .array(let operations) = operationsValue else {
            problems.append("operations: must be an array")
            return .failure(ManifestProblems(problems))
        }
        if operations.isEmpty { problems.append("operations: must not be empty") }
        if operations.count > ManifestLimits.maxOperations {
            problems.append("operations: \(operations.count) operations; the limit is \(ManifestLimits.maxOperations)")
            return .failure(ManifestProblems(problems))
        }
        for (index, element) in operations.enumerated() {
            if let operation = parseOperation(element, index: index, configuration: configuration, problems: &problems) {
                plan.operations.append(operation)
            }
        }
        return validateGraph(plan, problems: problems, configuration: configuration)
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

    static func photoListOperations(_ photos: [String: String], configuration: Configuration) -> [OperationPlan] {
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

    private static func parseOperation(_ element: PlistValue, index: Int, configuration: Configuration,
                                       problems: inout [String]) -> OperationPlan? {
        guard case .dictionary(let dict) = element else {
            problems.append("operations[\(index)]: must be a dictionary")
            return nil
        }
        var label = "operations[\(index)]"
        var id: String?
        if let value = dict["id"] {
            if let s = value.string, isValidIdentifier(s) { id = s; label = "operation '\(s)'" }
            else { problems.append("\(label): id must be a string of 1 to 128 characters from [A-Za-z0-9._-], not starting with '.'") }
        } else {
            problems.append("\(label): id is missing")
        }
        var kind: Kind?
        if let value = dict["kind"] {
            if let s = value.string, let k = Kind(rawValue: s) {
                kind = k
            } else {
                problems.append("\(label): unknown kind \(quoted(value)) (one of \(Kind.allCases.map(\.rawValue).joined(separator: ", ")))")
            }
        } else {
            problems.append("\(label): kind is missing")
        }
        let common: Set<String> = ["id", "kind", "queue", "dependencies", "input", "qualityOfService", "queuePriority",
                                   "timeoutSeconds", "retries", "retryDelaySeconds", "runsAfterFailure"]
        for key in dict.keys.sorted() where !common.contains(key) && !(kind?.parameters.contains(key) ?? true) {
            problems.append("\(label): unknown key '\(clipped(key))'" + (kind.map { " for kind '\($0.rawValue)'" } ?? ""))
        }
        var queue = kind.map { configuration.defaultQueues[$0.family] ?? "default" } ?? "default"
        if let value = dict["queue"] {
            if let s = value.string, configuration.queues[s] != nil { queue = s }
            else {
                problems.append("\(label): unknown queue \(quoted(value)) "
                    + "(configured: \(configuration.queueNames.joined(separator: ", ")))")
            }
        }
        var dependencies: [String] = []
        if let value = dict["dependencies"] {
            if let array = value.array, array.allSatisfy({ $0.string != nil }) { dependencies = array.compactMap(\.string) }
            else { problems.append("\(label): dependencies must be an array of operation ids") }
        }
        var input: String?
        if let value = dict["input"] {
            if let s = value.string { input = s; if !dependencies.contains(s) { dependencies.append(s) } }
            else { problems.append("\(label): input must be an operation id") }
        }
        var qos: OperationEngine.QualityOfService?
        if let value = dict["qualityOfService"] {
            if let s = value.string, let q = OperationEngine.QualityOfService(name: s) { qos = q }
            else { problems.append("\(label): qualityOfService must be one of \(qosNames)") }
        }
        var priority: QueuePriority?
        if let value = dict["queuePriority"] {
            if let s = value.string, let p = QueuePriority(name: s) { priority = p }
            else { problems.append("\(label): queuePriority must be one of \(priorityNames)") }
        }
        var timeout: Double?
        if let value = dict["timeoutSeconds"] {
            if let t = value.real, t > 0, t < 1e9 { timeout = t }
            else { problems.append("\(label): timeoutSeconds must be a positive number of seconds, less than 1e9") }
        }
        var retries = 0
        if let value = dict["retries"] {
            if let n = value.integer, (0...1000).contains(n) { retries = n }
            else { problems.append("\(label): retries must be an integer from 0 to 1000") }
        }
        var retryDelay = 1.0
        if let value = dict["retryDelaySeconds"] {
            if let d = value.real, d >= 0, d < 1e9 { retryDelay = d }
            else { problems.append("\(label): retryDelaySeconds must be 0 or more seconds, less than 1e9") }
        }
        var runsAfterFailure = false
        if let value = dict["runsAfterFailure"] {
            if let b = value.boolean { runsAfterFailure = b } else { problems.append("\(label): runsAfterFailure must be a boolean") }
        }
        guard let id, let kind else { return nil }
        guard let parameters = parseParameters(kind, dict, label: label, configuration: configuration, problems: &problems) else {
            return nil
        }
        // A command's own queue, unless the operation names one.
        if case .command(let name, _) = parameters, dict["queue"] == nil, let own = configuration.commands[name]?.queue { queue = own }
        return OperationPlan(id: id, kind: kind, queue: queue, dependencies: dependencies, input: input, qualityOfService: qos,
                             queuePriority: priority, timeoutSeconds: timeout, retries: retries, retryDelaySeconds: retryDelay,
                             runsAfterFailure: runsAfterFailure, parameters: parameters)
    }

    private static func parseParameters(_ kind: Kind, _ d: PlistDictionary, label: String, configuration: Configuration,
                                        problems: inout [String]) -> Parameters? {
        let before = problems.count
        func real(_ key: String, default value: Double?, range: ClosedRange<Double>) -> Double? {
            guard let raw = d[key] else {
                if value == nil { problems.append("\(label): \(key) is required") }
                return value
            }
            guard let v = raw.real, range.contains(v) else {
                problems.append("\(label): \(key) must be a number from \(formatNumber(range.lowerBound)) "
                    + "to \(formatNumber(range.upperBound))")
                return nil
            }
            return v
        }
        func integer(_ key: String, required: Bool, range: ClosedRange<Int>) -> Int? {
            guard let raw = d[key] else {
                if required { problems.append("\(label): \(key) is required") }
                return nil
            }
            guard let v = raw.integer, range.contains(v) else {
                problems.append("\(label): \(key) must be an integer from \(range.lowerBound) to \(range.upperBound)")
                return nil
            }
            return v
        }
        func string(_ key: String) -> String? {
            guard let raw = d[key] else { return nil }
            guard let s = raw.string else { problems.append("\(label): \(key) must be a string"); return nil }
            return s
        }
        let result: Parameters?
        switch kind {
        case .download:
            let url = string("url")
            if url == nil && d["url"] == nil { problems.append("\(label): url is required") }
            if let url, let scheme = URLComponents(string: url)?.scheme?.lowercased() {
                if !["http", "https", "file"].contains(scheme) {
                    problems.append("\(label): url scheme '\(clipped(scheme))' is not allowed (http, https, file)")
                }
            } else if url != nil {
                problems.append("\(label): url is not a valid URL")
            }
            let maxBytes = integer("maxBytes", required: false, range: 1...Int(Int64.max))
            result = url.map { .download(url: $0, maxBytes: maxBytes) }
        case .sepia: result = real("intensity", default: 0.8, range: 0...1).map { .sepia(intensity: $0) }
        case .grayscale: result = .grayscale
        case .blur: result = real("radius", default: 4, range: 0...1000).map { .blur(radius: $0) }
        case .resize:
            let width = integer("width", required: false, range: 1...1_000_000)
            let height = integer("height", required: false, range: 1...1_000_000)
            if d["width"] == nil && d["height"] == nil { problems.append("\(label): width or height is required") }
            let mode = string("mode") ?? "fit"
            if !["fit", "fill", "stretch"].contains(mode) { problems.append("\(label): mode must be fit, fill or stretch") }
            if mode != "fit" && (d["width"] == nil || d["height"] == nil) {
                problems.append("\(label): mode '\(mode)' needs both width and height")
            }
            // stretch and fill make at least width × height pixels whatever the input: more than an image may have is
            // known now (fit's result depends on the input's shape: checked when it runs).
            if mode != "fit", let width, let height, width * height > configuration.maxPixels {
                problems.append("\(label): \(width)×\(height) is more pixels than image.maxPixels (\(configuration.maxPixels))")
            }
            result = .resize(width: width, height: height, mode: mode)
        case .thumbnail: result = integer("size", required: true, range: 1...100_000).map { .thumbnail(size: $0) }
        case .vignette: result = real("strength", default: 0.5, range: 0...1).map { .vignette(strength: $0) }
        case .write:
            let path = string("path")
            if d["path"] == nil { problems.append("\(label): path is required") }
            if let path, let reason = unsafePathReason(path) { problems.append("\(label): path '\(clipped(path))' \(reason)") }
            // Whether a format is needed depends on the input (an image or bytes): checked on the graph.
            let format = string("format") ?? path.flatMap(imageFormat(ofPath:))
            if let f = format, !["png", "jpeg"].contains(f) { problems.append("\(label): format must be png or jpeg") }
            let quality = integer("quality", required: false, range: 1...100) ?? 90
            result = .write(path: path ?? "", format: format, quality: quality)
        case .sleep: result = real("seconds", default: nil, range: 0...31_536_000).map { .sleep(seconds: $0) }
        case .spin: result = real("seconds", default: nil, range: 0...86_400).map { .spin(seconds: $0) }
        case .fail: result = .fail(message: string("message") ?? "failed as asked")
        case .command:
            if let name = string("command") {
                if let spec = configuration.commands[name] {
                    result = spec.checkArguments(d["arguments"], label: label, problems: &problems).map {
                        .command(name: name, arguments: $0)
                    }
                } else {
                    let known = configuration.commands.keys.sorted()
                    problems.append("\(label): unknown command '\(clipped(name))' "
                        + "(\(known.isEmpty ? "the configuration declares none" : "configured: " + known.joined(separator: ", ")))")
                    result = nil
                }
            } else {
                if d["command"] == nil { problems.append("\(label): command is required") }
                result = nil
            }
        }
        return problems.count == before ? result : nil
    }

    /// The image format a path's extension names: png for .png, jpeg for .jpg and .jpeg, else nil.
    static func imageFormat(ofPath path: String) -> String? {
        let ext = (path as NSString).pathExtension.lowercased()
        return ["jpg", "jpeg"].contains(ext) ? "jpeg" : ext == "png" ? "png" : nil
    }

    /// Why a `write` path is unsafe, or nil: relative, no empty, `..` or dot-leading component.
    static func unsafePathReason(_ path: String) -> String? {
        if path.isEmpty { return "is empty" }
        if path.hasPrefix("/") { return "is absolute" }
        if path.utf8.contains(0) { return "contains a NUL byte" }
        if path.utf8.count > 1024 { return "is longer than 1024 bytes" }
        if path == "manifest.plist" || path == "result.plist" { return "is the daemon's own file in the job folder" }
        for component in path.split(separator: "/", omittingEmptySubsequences: false) {
            if component.isEmpty { return "has an empty component" }
            if component == ".." { return "goes up with '..'" }
            if component.hasPrefix(".") { return "has a component starting with '.'" }
            if component.utf8.count > 255 { return "has a component longer than 255 bytes" }
        }
        return nil
    }

    private static func validateGraph(_ plan: JobPlan, problems initial: [String],
                                      configuration: Configuration) -> Result<JobPlan, ManifestProblems> {
        var problems = initial
        var index: [String: Int] = [:]
        for (i, op) in plan.operations.enumerated() {
            if index[op.id] != nil { problems.append("operation '\(op.id)': duplicate id") } else { index[op.id] = i }
        }
        var unknown = false
        for op in plan.operations {
            for dep in op.dependencies where index[dep] == nil {
                problems.append("operation '\(op.id)' depends on unknown operation '\(clipped(dep))'")
                unknown = true
            }
            if op.dependencies.contains(op.id) { problems.append("cycle: \(op.id) → \(op.id)") }
        }
        if !unknown {
            problems += cycles(plan.operations, index: index)
            problems += imageWritesWithoutFormat(plan.operations, index: index, configuration: configuration)
        }
        return problems.isEmpty ? .success(plan) : .failure(ManifestProblems(problems))
    }

    /// A `write` of an image needs a format its path does not give; a write of bytes (a download's, a command's or
    /// another write's output) is written unchanged under any name (SPEC §3.3). The input is the one the
    /// operation takes when it runs: `input`, else the first dependency that has an output.
    static func imageWritesWithoutFormat(_ operations: [OperationPlan], index: [String: Int], configuration: Configuration) -> [String] {
        func hasOutput(_ op: OperationPlan) -> Bool {
            if case .command(let name, _) = op.parameters { return configuration.commands[name]?.output != CommandSpec.Output.none }
            return op.kind.hasOutput
        }
        var problems: [String] = []
        for op in operations {
            guard case .write(_, nil, _) = op.parameters else { continue }
            let producers = op.input.map { [$0] } ?? op.dependencies
            guard let producer = producers.lazy.compactMap({ index[$0].map { operations[$0] } }).first(where: hasOutput),
                  producer.kind.family == "image" else { continue }
            problems.append("operation '\(op.id)': format is required to write the image of '\(producer.id)' when the path does not "
                + "end in .png, .jpg or .jpeg")
        }
        return problems
    }

    /// Each cycle, with the ids along it in execution order (iterative DFS: deep chains must not overflow).
    static func cycles(_ operations: [OperationPlan], index: [String: Int]) -> [String] {
        let n = operations.count
        var color = [UInt8](repeating: 0, count: n) // 0 new, 1 on stack, 2 done
        var problems: [String] = []
        var stack: [(node: Int, next: Int)] = []
        for root in 0..<n where color[root] == 0 {
            stack.append((root, 0))
            color[root] = 1
            while let top = stack.last {
                let deps = operations[top.node].dependencies
                if top.next < deps.count {
                    stack[stack.count - 1].next += 1
                    guard let d = index[deps[top.next]], d != top.node else { continue }
                    if color[d] == 0 {
                        color[d] = 1
                        stack.append((d, 0))
                    } else if color[d] == 1, problems.count < 16 {
                        // The stack from d to the top is the cycle (each waits for the next).
                        let from = stack.firstIndex { $0.node == d } ?? 0
                        let ids = stack[from...].map { operations[$0.node].id }.reversed()
                        problems.append("cycle: " + (Array(ids) + [ids.first ?? ""]).joined(separator: " → "))
                    }
                } else {
                    color[top.node] = 2
                    stack.removeLast()
                }
            }
        }
        return problems
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
func clipped(_ s: String) -> String {
    s.count <= 80 ? s : s.prefix(80) + "… (\(s.utf8.count) bytes)"
}

func formatNumber(_ value: Double) -> String {
    value == value.rounded() ? String(Int(value)) : String(value)
}
