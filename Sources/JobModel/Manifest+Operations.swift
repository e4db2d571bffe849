// A manifest's operations (SPEC §3): each operation's common keys, and its kind's parameters.

import Foundation
import OperationEngine
import PropertyList

extension Manifest {
    /// One element of `operations`, checked.
    enum ParsedOperation {
        /// It has no problem.
        case valid(OperationPlan)
        /// It has problems (each appended, naming the operation), and an id: what parsed of it, for the graph checks.
        case shaped(OperationShape)
        /// It has problems, and no id: it takes no part in the graph.
        case unnamed
    }

    /// `operations[index]`, checked: every key, whatever the problems of the others (`accepted`: see `parse`).
    static func parseOperation(_ element: PlistValue, index: Int, configuration: Configuration, accepted: Bool,
                               problems: inout [String]) -> ParsedOperation {
        guard case .dictionary(let dict) = element else {
            problems.append("operations[\(index)]: must be a dictionary")
            return .unnamed
        }
        let before = problems.count
        let (id, kind, label) = parseIdentity(dict, index: index, problems: &problems)
        var queue = kind.map { configuration.defaultQueues[$0.family] ?? "default" } ?? "default"
        if let value = dict["queue"] {
            if let s = value.string, accepted || configuration.queues[s] != nil { queue = s }
            else {
                problems.append("\(label): unknown queue \(quoted(value)) "
                    + "(configured: \(configuration.queueNames.joined(separator: ", ")))")
            }
        }
        let edges = parseEdges(dict, label: label, problems: &problems)
        let run = parseRunSettings(dict, label: label, problems: &problems)
        let parameters = kind.flatMap {
            parseParameters($0, dict, label: label, configuration: configuration, accepted: accepted, problems: &problems)
        }
        guard let id else { return .unnamed }
        guard problems.count == before, let kind, let parameters else {
            return .shaped(shape(id: id, kind: kind, dict, edges: edges))
        }
        // A command's own queue, unless the operation names one.
        if case .command(let name, _) = parameters, dict["queue"] == nil, let own = configuration.commands[name]?.queue { queue = own }
        return .valid(OperationPlan(id: id, kind: kind, queue: queue, dependencies: edges.dependencies, input: edges.input,
                                    qualityOfService: run.shared.qualityOfService, queuePriority: run.shared.queuePriority,
                                    timeoutSeconds: run.shared.timeoutSeconds, retries: run.retries,
                                    retryDelaySeconds: run.retryDelaySeconds, runsAfterFailure: run.runsAfterFailure,
                                    parameters: parameters))
    }

    /// An operation's `dependencies` and `input` (named, it is one of the dependencies); `known` is false when either
    /// did not parse.
    private static func parseEdges(_ dict: PlistDictionary, label: String,
                                   problems: inout [String]) -> (dependencies: [String], input: String?, known: Bool) {
        var dependencies: [String] = []
        var input: String?
        var known = true
        if let value = dict["dependencies"] {
            if let array = value.array, array.allSatisfy({ $0.string != nil }) { dependencies = array.compactMap(\.string) }
            else { problems.append("\(label): dependencies must be an array of operation ids"); known = false }
        }
        if let value = dict["input"] {
            if let s = value.string { input = s; if !dependencies.contains(s) { dependencies.append(s) } }
            else { problems.append("\(label): input must be an operation id"); known = false }
        }
        return (dependencies, input, known)
    }

    /// What the graph checks read of an operation with problems, from the keys that parsed: what is not known stays nil
    /// (its kind, a command's name, a write's path when it is missing or unsafe).
    private static func shape(id: String, kind: Kind?, _ dict: PlistDictionary,
                              edges: (dependencies: [String], input: String?, known: Bool)) -> OperationShape {
        let path = kind == .write ? dict["path"]?.string.flatMap { unsafePathReason($0) == nil ? $0 : nil } : nil
        return OperationShape(id: id, dependencies: edges.dependencies, input: edges.input, knownKind: kind, edgesKnown: edges.known,
                              command: kind == .command ? dict["command"]?.string : nil, writePath: path,
                              writeHasNoFormat: path.map { dict["format"] == nil && imageFormat(ofPath: $0) == nil } ?? false)
    }

    /// An operation's `id` and `kind` (nil when missing or invalid), the label its problems go under (its id once
    /// valid), and its keys that neither every operation nor its kind has.
    private static func parseIdentity(_ dict: PlistDictionary, index: Int,
                                      problems: inout [String]) -> (id: String?, kind: Kind?, label: String) {
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
        // Built once per operation, not per key: a manifest of a million operations reads each through here.
        if let kind {
            let own = kind.parameters
            let unknown = dict.keys.filter { !commonKeys.contains($0) && !own.contains($0) }
            for key in unknown.sorted() { problems.append("\(label): unknown key '\(clipped(key))' for kind '\(kind.rawValue)'") }
        }
        return (id, kind, label)
    }

    /// The keys every operation may have, whatever its kind.
    private static let commonKeys: Set<String> = ["id", "kind", "queue", "dependencies", "input", "qualityOfService", "queuePriority",
                                                  "timeoutSeconds", "retries", "retryDelaySeconds", "runsAfterFailure"]

    /// How an operation runs, whatever its kind: what it shares with the job (QoS, priority, timeout), retries and their
    /// delay, after a failure.
    private struct RunSettings {
        var shared: SharedSettings
        var retries = 0
        var retryDelaySeconds = 1.0
        var runsAfterFailure = false
    }

    /// The operation's keys of `RunSettings`, checked (a key with a problem keeps its default).
    private static func parseRunSettings(_ dict: PlistDictionary, label: String, problems: inout [String]) -> RunSettings {
        var run = RunSettings(shared: parseSharedSettings(dict, at: .operation(label: label), problems: &problems))
        if let value = dict["retries"] {
            if let n = value.integer, (0...1000).contains(n) { run.retries = n }
            else { problems.append("\(label): retries must be an integer from 0 to 1000") }
        }
        if let value = dict["retryDelaySeconds"] {
            if let d = value.real, d >= 0, d < 1e9 { run.retryDelaySeconds = d }
            else { problems.append("\(label): retryDelaySeconds must be 0 or more seconds, less than 1e9") }
        }
        if let value = dict["runsAfterFailure"] {
            if let b = value.boolean { run.runsAfterFailure = b } else { problems.append("\(label): runsAfterFailure must be a boolean") }
        }
        return run
    }

    /// The kind's own keys of an operation's dictionary, checked: nil when one has a problem.
    private static func parseParameters(_ kind: Kind, _ d: PlistDictionary, label: String, configuration: Configuration,
                                        accepted: Bool, problems: inout [String]) -> Parameters? {
        var r = ParameterReader(d: d, label: label)
        let result: Parameters?
        switch kind {
        case .download: result = downloadParameters(&r, fileRoots: configuration.fileRoots)
        case .sepia: result = r.real("intensity", default: 0.8, range: 0...1).map { .sepia(intensity: $0) }
        case .grayscale: result = .grayscale
        case .blur: result = r.real("radius", default: 4, range: 0...1000).map { .blur(radius: $0) }
        case .resize: result = resizeParameters(&r, maxPixels: configuration.maxPixels)
        case .thumbnail: result = r.integer("size", required: true, range: 1...100_000).map { .thumbnail(size: $0) }
        case .vignette: result = r.real("strength", default: 0.5, range: 0...1).map { .vignette(strength: $0) }
        case .write: result = writeParameters(&r)
        case .sleep: result = r.real("seconds", default: nil, range: 0...31_536_000).map { .sleep(seconds: $0) }
        case .spin: result = r.real("seconds", default: nil, range: 0...86_400).map { .spin(seconds: $0) }
        case .fail: result = .fail(message: r.string("message") ?? "failed as asked")
        case .command: result = commandParameters(&r, commands: configuration.commands, accepted: accepted)
        }
        problems += r.problems
        return r.problems.isEmpty ? result : nil
    }

    /// Reads an operation's parameter keys by type and range, each problem named with the operation's label.
    private struct ParameterReader {
        let d: PlistDictionary
        let label: String
        var problems: [String] = []

        /// A number in `range`; when absent, `value` (nil: the key is required).
        mutating func real(_ key: String, default value: Double?, range: ClosedRange<Double>) -> Double? {
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

        /// An integer in `range`; nil when absent (a problem if `required`).
        mutating func integer(_ key: String, required: Bool, range: ClosedRange<Int>) -> Int? {
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

        /// A string; nil when absent or not a string (then a problem).
        mutating func string(_ key: String) -> String? {
            guard let raw = d[key] else { return nil }
            guard let s = raw.string else { problems.append("\(label): \(key) must be a string"); return nil }
            return s
        }
    }

    /// `download`: a required http, https or file URL, and an optional `maxBytes`.
    private static func downloadParameters(_ r: inout ParameterReader, fileRoots: [String]) -> Parameters? {
        let url = r.string("url")
        if url == nil && r.d["url"] == nil { r.problems.append("\(r.label): url is required") }
        if let url, let components = URLComponents(string: url), let scheme = components.scheme?.lowercased() {
            if !["http", "https", "file"].contains(scheme) {
                r.problems.append("\(r.label): url scheme '\(clipped(scheme))' is not allowed (http, https, file)")
            } else if scheme == "file", let path = components.percentEncodedPath.removingPercentEncoding,
                      !mayBeUnder(fileRoots, path) {
                r.problems.append("\(r.label): \(clipped(path)) is not under a configured file root (download.fileRoots"
                                  + (fileRoots.isEmpty ? " is empty)" : ")"))
            }
        } else if url != nil {
            r.problems.append("\(r.label): url is not a valid URL")
        }
        let maxBytes = r.integer("maxBytes", required: false, range: 1...Int(Int64.max))
        return url.map { .download(url: $0, maxBytes: maxBytes) }
    }

    /// Whether a file URL's path, as written (`..` taken away, nothing on disk looked at: whether a path outside the
    /// roots exists is not the submitter's to learn), is inside a root or the folder a root leads to. A path that
    /// passes may still be refused when it runs, where symbolic links are followed.
    static func mayBeUnder(_ roots: [String], _ path: String) -> Bool {
        var parts: [Substring] = []
        for part in path.split(separator: "/") where part != "." {
            if part == ".." { _ = parts.popLast() } else { parts.append(part) }
        }
        let standard = "/" + parts.joined(separator: "/")
        let folders = roots + roots.compactMap { root in
            realpath(root, nil).map { resolved in
                defer { free(resolved) }
                return String(cString: resolved)
            }
        }
        return folders.contains { root in standard == root || standard.hasPrefix(root.hasSuffix("/") ? root : root + "/") }
    }

    /// `resize`: width and/or height, and a mode (fill and stretch need both, and at most `maxPixels` pixels).
    private static func resizeParameters(_ r: inout ParameterReader, maxPixels: Int) -> Parameters? {
        let width = r.integer("width", required: false, range: 1...1_000_000)
        let height = r.integer("height", required: false, range: 1...1_000_000)
        if r.d["width"] == nil && r.d["height"] == nil { r.problems.append("\(r.label): width or height is required") }
        let mode = r.string("mode") ?? "fit"
        if !["fit", "fill", "stretch"].contains(mode) { r.problems.append("\(r.label): mode must be fit, fill or stretch") }
        if mode != "fit" && (r.d["width"] == nil || r.d["height"] == nil) {
            r.problems.append("\(r.label): mode '\(mode)' needs both width and height")
        }
        // stretch and fill make at least width × height pixels whatever the input: more than an image may have is
        // known now (fit's result depends on the input's shape: checked when it runs).
        if mode != "fit", let width, let height, width * height > maxPixels {
            r.problems.append("\(r.label): \(width)×\(height) is more pixels than image.maxPixels (\(maxPixels))")
        }
        return .resize(width: width, height: height, mode: mode)
    }

    /// `write`: a safe relative path, a format (png or jpeg, else from the path's extension) and a quality.
    private static func writeParameters(_ r: inout ParameterReader) -> Parameters? {
        let path = r.string("path")
        if r.d["path"] == nil { r.problems.append("\(r.label): path is required") }
        if let path, let reason = unsafePathReason(path) { r.problems.append("\(r.label): path '\(clipped(path))' \(reason)") }
        // Whether a format is needed depends on the input (an image or bytes): checked on the graph.
        let format = r.string("format") ?? path.flatMap(imageFormat(ofPath:))
        if let f = format, !["png", "jpeg"].contains(f) { r.problems.append("\(r.label): format must be png or jpeg") }
        let quality = r.integer("quality", required: false, range: 1...100) ?? 90
        return .write(path: path ?? "", format: format, quality: quality)
    }

    /// `command`: a configured command's name, and its arguments checked against its parameters. `accepted`: a command
    /// removed from the configuration since is kept by name, without arguments (it fails when it would run).
    private static func commandParameters(_ r: inout ParameterReader, commands: [String: CommandSpec], accepted: Bool) -> Parameters? {
        guard let name = r.string("command") else {
            if r.d["command"] == nil { r.problems.append("\(r.label): command is required") }
            return nil
        }
        guard let spec = commands[name] else {
            if accepted { return .command(name: name, arguments: [:]) }
            let known = commands.keys.sorted()
            r.problems.append("\(r.label): unknown command '\(clipped(name))' "
                + "(\(known.isEmpty ? "the configuration declares none" : "configured: " + known.joined(separator: ", ")))")
            return nil
        }
        return spec.checkArguments(r.d["arguments"], label: r.label, problems: &r.problems).map { .command(name: name, arguments: $0) }
    }

    /// The image format a path's extension names: png for .png, jpeg for .jpg and .jpeg, else nil.
    package static func imageFormat(ofPath path: String) -> String? {
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
}
