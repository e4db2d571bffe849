// Commands the administrator declares (SPEC §3.6, §6 `commands`, `jobFinished`): their argv with
// `${NAME}` placeholders, typed parameters, output, limits and environment, read from the configuration.
//
// What it trusts: the configuration is the administrator's, but it is still checked whole, every problem
// named with its key path (`commands.gz.argv[2]: …`). Manifest arguments are checked against a command's
// parameters in `CommandSpec.checkArguments`; they are never parsed by a shell, only placed inside the
// argument that names them.

import Foundation
import PropertyList

public struct CommandSpec: Sendable, Equatable {
    public enum ParameterType: Sendable, Equatable {
        case string, integer, real, bool
        case oneOf([String])
    }

    public enum Output: String, Sendable, Equatable {
        case stdout, file, none
    }

    /// One piece of an argument: literal text or a placeholder's name.
    package enum Piece: Sendable, Equatable {
        case literal(String)
        case placeholder(String)
    }

    public var name: String
    /// Each argument as pieces; argv[0] is an absolute path without placeholders.
    package var argv: [[Piece]]
    public var parameters: [String: ParameterType]
    public var output: Output
    public var timeoutSeconds: Double
    public var maxOutputBytes: Int
    public var environment: [String: String]
    /// Nil: the default queue of the `other` family.
    public var queue: String?
    public var tempFailExitCodes: Set<Int32>

    package init(name: String, argv: [[Piece]], parameters: [String: ParameterType], output: Output, timeoutSeconds: Double,
                 maxOutputBytes: Int, environment: [String: String], queue: String?, tempFailExitCodes: Set<Int32>) {
        self.name = name
        self.argv = argv
        self.parameters = parameters
        self.output = output
        self.timeoutSeconds = timeoutSeconds
        self.maxOutputBytes = maxOutputBytes
        self.environment = environment
        self.queue = queue
        self.tempFailExitCodes = tempFailExitCodes
    }

    /// Placeholders every operation's command may use, besides its parameters.
    static let operationNames: Set<String> = ["input", "output", "job", "operation", "attempt", "workdir"]
    /// Placeholders of the `jobFinished` command.
    static let hookNames: Set<String> = ["job", "status", "outbox"]
    static let maxStringBytes = 4096

    var path: String { argv.first.map(Self.join) ?? "" }

    /// Placeholders the argv uses.
    package var placeholders: Set<String> {
        var names: Set<String> = []
        for argument in argv { for case .placeholder(let n) in argument { names.insert(n) } }
        return names
    }

    /// Used as a job hook: it names `${status}` or `${outbox}`, which only a hook has.
    package var isHookOnly: Bool { !placeholders.isDisjoint(with: ["status", "outbox"]) }

    /// The argv with every placeholder replaced by its value, each inside its own argument.
    package func expand(_ values: [String: String]) -> [String] {
        argv.map { pieces in
            pieces.map { piece in
                switch piece {
                case .literal(let s): s
                case .placeholder(let n): values[n] ?? ""
                }
            }.joined()
        }
    }

    private static func join(_ pieces: [Piece]) -> String {
        pieces.map { if case .literal(let s) = $0 { s } else { "" } }.joined()
    }

    /// Splits `text` at `${NAME}`; a `$` not followed by `{` is literal. Returns nil and a reason for an
    /// unclosed or empty placeholder.
    static func pieces(_ text: String) -> Result<[Piece], ConfigurationProblem> {
        var pieces: [Piece] = []
        var literal = ""
        var rest = Substring(text)
        while let dollar = rest.range(of: "${") {
            literal += rest[..<dollar.lowerBound]
            let after = rest[dollar.upperBound...]
            guard let close = after.firstIndex(of: "}") else { return .failure(ConfigurationProblem("'${' is not closed")) }
            let name = String(after[..<close])
            guard isValidIdentifier(name) else {
                return .failure(ConfigurationProblem("'${\(clipped(name))}' is not a valid placeholder name"))
            }
            if !literal.isEmpty { pieces.append(.literal(literal)); literal = "" }
            pieces.append(.placeholder(name))
            rest = after[after.index(after: close)...]
        }
        literal += rest
        if !literal.isEmpty || pieces.isEmpty { pieces.append(.literal(literal)) }
        return .success(pieces)
    }

    // MARK: Configuration

    /// `commands = { NAME = { … }; … }`, checked; `queues` are the configured queue names.
    static func parseAll(_ value: PlistValue, queues: Set<String>, problems: inout [String]) -> [String: CommandSpec] {
        guard let dictionary = value.dictionary else {
            problems.append("commands: must be a dictionary")
            return [:]
        }
        var commands: [String: CommandSpec] = [:]
        for name in dictionary.keys.sorted() {
            guard isValidIdentifier(name) else { problems.append("commands: '\(clipped(name))' is not a valid command name"); continue }
            guard let entry = dictionary[name]?.dictionary else { problems.append("commands.\(name): must be a dictionary"); continue }
            if let spec = parse(name: name, entry, queues: queues, problems: &problems) { commands[name] = spec }
        }
        return commands
    }

    private static func parse(name: String, _ d: PlistDictionary, queues: Set<String>, problems: inout [String]) -> CommandSpec? {
        let before = problems.count
        let at = "commands.\(name)"
        var spec = CommandSpec(name: name, argv: [], parameters: [:], output: .none, timeoutSeconds: 600, maxOutputBytes: 10_485_760,
                               environment: [:], queue: nil, tempFailExitCodes: [75])
        let known = Configuration.keys["commands.NAME", default: []]
        for key in d.keys.sorted() where !known.contains(key) { problems.append("\(at): unknown key '\(clipped(key))'") }
        parseParameters(d, at: at, into: &spec, problems: &problems)
        parseArgv(d, at: at, into: &spec, problems: &problems)
        parseLimits(d, at: at, into: &spec, problems: &problems)
        parseEnvironment(d, at: at, into: &spec, problems: &problems)
        if let value = d["queue"] {
            if let q = value.string, queues.contains(q) {
                spec.queue = q
            } else {
                problems.append("\(at).queue: must name a configured queue")
            }
        }
        if let value = d["tempFailExitCodes"] {
            if let codes = value.array, codes.allSatisfy({ ($0.integer).map { (1...255).contains($0) } == true }) {
                spec.tempFailExitCodes = Set(codes.compactMap { $0.integer.map(Int32.init) })
            } else {
                problems.append("\(at).tempFailExitCodes: must be an array of exit statuses from 1 to 255")
            }
        }
        return problems.count == before ? spec : nil
    }

    /// `parameters = { NAME = TYPE; … }`: read before `argv`, whose placeholders must name one of them.
    private static func parseParameters(_ d: PlistDictionary, at: String, into spec: inout CommandSpec, problems: inout [String]) {
        guard let value = d["parameters"] else { return }
        guard let parameters = value.dictionary else { problems.append("\(at).parameters: must be a dictionary"); return }
        for p in parameters.keys.sorted() {
            guard isValidIdentifier(p), !operationNames.contains(p), !hookNames.contains(p) else {
                problems.append("\(at).parameters: '\(clipped(p))' is not a valid parameter name "
                    + "(an identifier, not one of \((operationNames.union(hookNames)).sorted().joined(separator: ", ")))")
                continue
            }
            switch parameters[p] {
            case .string("string"): spec.parameters[p] = .string
            case .string("integer"): spec.parameters[p] = .integer
            case .string("real"): spec.parameters[p] = .real
            case .string("bool"): spec.parameters[p] = .bool
            case .array(let items) where !items.isEmpty && items.allSatisfy({ $0.string.map(isSafeString) == true }):
                spec.parameters[p] = .oneOf(items.compactMap(\.string))
            default:
                problems.append("\(at).parameters.\(p): must be string, integer, real, bool, "
                                + "or a non-empty array of allowed strings (none starting with '-')")
            }
        }
    }

    /// `argv` (required): each argument split into pieces, every placeholder known; argv[0] an absolute path.
    private static func parseArgv(_ d: PlistDictionary, at: String, into spec: inout CommandSpec, problems: inout [String]) {
        guard let value = d["argv"] else { problems.append("\(at).argv: is required"); return }
        guard let items = value.array, !items.isEmpty else {
            problems.append("\(at).argv: must be a non-empty array of strings")
            return
        }
        for (i, item) in items.enumerated() {
            guard let text = item.string, !text.utf8.contains(0) else {
                problems.append("\(at).argv[\(i)]: must be a string without NUL"); continue
            }
            switch pieces(text) {
            case .failure(let problem): problems.append("\(at).argv[\(i)]: \(problem)")
            case .success(let parts):
                for case .placeholder(let n) in parts where spec.parameters[n] == nil && !operationNames.contains(n) &&
                    !hookNames.contains(n) {
                    problems.append("\(at).argv[\(i)]: unknown placeholder '${\(clipped(n))}' "
                        + "(a parameter, or one of \(operationNames.union(hookNames).sorted().joined(separator: ", ")))")
                }
                spec.argv.append(parts)
            }
        }
        if let first = items.first?.string, !first.hasPrefix("/") || first.contains("${") {
            problems.append("\(at).argv[0]: must be an absolute path to the program, "
                            + "without placeholders (no shell and no PATH search)")
        }
    }

    /// `output`, `timeoutSeconds`, `maxOutputBytes`.
    private static func parseLimits(_ d: PlistDictionary, at: String, into spec: inout CommandSpec, problems: inout [String]) {
        if let value = d["output"] {
            if let s = value.string, let o = Output(rawValue: s) {
                spec.output = o
            } else {
                problems.append("\(at).output: must be stdout, file or none")
            }
        }
        if let value = d["timeoutSeconds"] {
            if let t = value.real, t > 0, t < 1e9 {
                spec.timeoutSeconds = t
            } else {
                problems.append("\(at).timeoutSeconds: must be a positive number of seconds, less than 1e9")
            }
        }
        if let value = d["maxOutputBytes"] {
            if let n = value.integer, n >= 0 {
                spec.maxOutputBytes = n
            } else {
                problems.append("\(at).maxOutputBytes: must be 0 or a positive integer")
            }
        }
    }

    /// `environment = { NAME = "value"; … }`: what the command's environment adds.
    private static func parseEnvironment(_ d: PlistDictionary, at: String, into spec: inout CommandSpec, problems: inout [String]) {
        guard let value = d["environment"] else { return }
        guard let env = value.dictionary else { problems.append("\(at).environment: must be a dictionary of strings"); return }
        for key in env.keys.sorted() {
            guard !key.isEmpty, !key.contains("="), !key.utf8.contains(0) else {
                problems.append("\(at).environment: '\(clipped(key))' is not a valid variable name"); continue
            }
            if let v = env[key]?.string, !v.utf8.contains(0) { spec.environment[key] = v }
            else { problems.append("\(at).environment.\(key): must be a string without NUL") }
        }
    }

    /// `jobFinished = NAME`: a declared command without parameters, using only ${job} ${status} ${outbox}.
    static func checkHook(_ value: PlistValue, commands: [String: CommandSpec], problems: inout [String]) -> String? {
        guard let name = value.string else { problems.append("jobFinished: must be the name of a command"); return nil }
        guard let spec = commands[name] else {
            problems.append("jobFinished: '\(clipped(name))' is not a command of 'commands'"); return nil
        }
        var ok = true
        if !spec.parameters.isEmpty {
            problems.append("jobFinished: command '\(name)' has parameters; a job hook is given none"); ok = false
        }
        let extra = spec.placeholders.subtracting(hookNames)
        if !extra.isEmpty {
            problems.append("jobFinished: command '\(name)' uses \(extra.sorted().map { "${\($0)}" }.joined(separator: ", ")); "
                            + "a job hook has only ${job}, ${status}, ${outbox}")
            ok = false
        }
        return ok ? name : nil
    }

    // MARK: Manifest arguments

    /// Checks an operation's `arguments` against the parameters; returns each argument as the text placed
    /// in argv, or appends every problem (prefixed by `label`).
    func checkArguments(_ value: PlistValue?, label: String, problems: inout [String]) -> [String: String]? {
        let before = problems.count
        if isHookOnly {
            problems.append("\(label): command '\(name)' is a job hook (it uses ${status} or ${outbox}), not an operation")
        }
        var given = PlistDictionary()
        if let value {
            if let d = value.dictionary { given = d } else { problems.append("\(label): arguments must be a dictionary"); return nil }
        }
        var out: [String: String] = [:]
        for key in given.keys.sorted() where parameters[key] == nil {
            problems.append("\(label): unknown argument '\(clipped(key))' for command '\(name)'"
                            + (parameters.isEmpty ? " (it takes none)"
                                                  : " (parameters: \(parameters.keys.sorted().joined(separator: ", ")))"))
        }
        for (p, type) in parameters.sorted(by: { $0.key < $1.key }) {
            guard let v = given[p] else { problems.append("\(label): argument '\(p)' is missing for command '\(name)'"); continue }
            switch type {
            case .string:
                if let s = v.string, let reason = Self.unsafeStringReason(s) { problems.append("\(label): argument '\(p)' \(reason)") }
                else if let s = v.string { out[p] = s }
                else { problems.append("\(label): argument '\(p)' must be a string") }
            case .integer:
                if case .integer(let n) = v { out[p] = String(n) } else { problems.append("\(label): argument '\(p)' must be an integer") }
            case .real:
                if let r = v.real { out[p] = formatNumber(r) } else { problems.append("\(label): argument '\(p)' must be a number") }
            case .bool:
                if let b = v.boolean {
                    out[p] = b ? "true" : "false"
                } else {
                    problems.append("\(label): argument '\(p)' must be a boolean")
                }
            case .oneOf(let allowed):
                if let s = v.string, allowed.contains(s) { out[p] = s }
                else { problems.append("\(label): argument '\(p)' must be one of \(allowed.joined(separator: ", "))") }
            }
        }
        return problems.count == before ? out : nil
    }

    /// Why a manifest's string may not reach argv, or nil.
    static func unsafeStringReason(_ s: String) -> String? {
        if s.hasPrefix("-") { return "starts with '-' (it could be taken for an option)" }
        if s.utf8.contains(0) { return "contains a NUL byte" }
        if s.utf8.count > maxStringBytes { return "is longer than \(maxStringBytes) bytes" }
        return nil
    }

    private static func isSafeString(_ s: String) -> Bool { unsafeStringReason(s) == nil }
}

public struct ConfigurationProblem: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
