// A manifest's graph checks (SPEC §3.2): ids, dependencies, cycles, what each operation takes as input, and the
// files of the job folder two operations would both make.
//
// Every operation with an id takes part, whatever its other problems (a bad parameter, an unknown kind): its own
// duplicate id or unknown dependency is reported, and its dependents are not told it does not exist. What is not
// known of such an operation (its kind, its command, its dependencies) makes no problem of its own: a check that
// would need it is left out for the operations it concerns.

/// What the graph checks read of an operation: a valid operation's plan, or the shape of one with problems.
protocol GraphOperation {
    var id: String { get }
    /// In order, `input` among them.
    var dependencies: [String] { get }
    var input: String? { get }
    /// The kind, when it is known.
    var knownKind: Kind? { get }
    /// False when `dependencies` or `input` did not parse: what the operation takes is not known.
    var edgesKnown: Bool { get }
    /// A write's path, when it is given and safe.
    var writePath: String? { get }
    /// A write with no `format` whose path has no image extension: an image handed to it has no format to be written in.
    var writeHasNoFormat: Bool { get }
    /// Whether it hands an output to its dependents (not a sleep, spin or fail, nor a command declared `output = none`);
    /// nil when that is not known (an unknown kind or command).
    func handsOverOutput(_ configuration: Configuration) -> Bool?
}

extension OperationPlan: GraphOperation {
    var knownKind: Kind? { kind }
    var edgesKnown: Bool { true }
    var writePath: String? {
        if case .write(let path, _, _) = parameters, Manifest.unsafePathReason(path) == nil { path } else { nil }
    }
    var writeHasNoFormat: Bool { if case .write(_, nil, _) = parameters { true } else { false } }

    func handsOverOutput(_ configuration: Configuration) -> Bool? {
        if case .command(let name, _) = parameters { return configuration.commands[name].map { $0.output != CommandSpec.Output.none } }
        return kind.hasOutput
    }
}

/// An operation with problems, as far as it parsed: enough of it to take part in the graph checks.
struct OperationShape: GraphOperation {
    var id: String
    var dependencies: [String]
    var input: String?
    var knownKind: Kind?
    var edgesKnown: Bool
    /// A command operation's command, when it names one.
    var command: String?
    var writePath: String?
    var writeHasNoFormat: Bool

    func handsOverOutput(_ configuration: Configuration) -> Bool? {
        guard let kind = knownKind else { return nil }
        guard kind == .command else { return kind.hasOutput }
        return command.flatMap { configuration.commands[$0] }.map { $0.output != CommandSpec.Output.none }
    }
}

extension OperationShape {
    /// A valid operation's, for checking it beside operations with problems.
    init(_ plan: OperationPlan) {
        self.init(id: plan.id, dependencies: plan.dependencies, input: plan.input, knownKind: plan.kind, edgesKnown: true,
                  command: nil, writePath: plan.writePath, writeHasNoFormat: plan.writeHasNoFormat)
        if case .command(let name, _) = plan.parameters { command = name }
    }
}

/// The operation whose output another takes when it runs; unknown when that depends on what is not known.
enum Producer<Operation: GraphOperation> {
    case found(Operation)
    case nothing
    case unknown
}

extension Manifest {
    /// The graph's problems after `initial`: the plan when there are none. `shapes`, when given, are every operation
    /// with an id, some with problems (the plan's operations are then not used: the result is a failure anyway).
    static func validateGraph(_ plan: JobPlan, shapes: [OperationShape]? = nil, problems initial: [String],
                              configuration: Configuration) -> Result<JobPlan, ManifestProblems> {
        var problems = initial
        if let shapes { problems += graphProblems(shapes, configuration: configuration) }
        else { problems += graphProblems(plan.operations, configuration: configuration) }
        return problems.isEmpty ? .success(plan) : .failure(ManifestProblems(problems))
    }

    static func graphProblems<Operation: GraphOperation>(_ operations: [Operation], configuration: Configuration) -> [String] {
        var problems: [String] = []
        var index: [String: Int] = [:]
        for (i, op) in operations.enumerated() {
            if index[op.id] != nil { problems.append("operation '\(op.id)': duplicate id") } else { index[op.id] = i }
        }
        for op in operations {
            for dep in op.dependencies where index[dep] == nil {
                problems.append("operation '\(op.id)' depends on unknown operation '\(clipped(dep))'")
            }
            if op.dependencies.contains(op.id) { problems.append("cycle: \(op.id) → \(op.id)") }
        }
        problems += pathConflicts(operations)
        problems += cycles(operations, index: index)
        problems += imageWritesWithoutFormat(operations, index: index, configuration: configuration)
        problems += operationsWithoutInput(operations, index: index, configuration: configuration)
        return problems
    }

    /// The operation whose output `op` takes when it runs: its `input`, else its first dependency that hands one over
    /// (not a sleep, spin or fail, nor a command declared `output = none`). Unknown when an operation before it in
    /// that order is missing or not known enough to say, or when `op`'s own dependencies did not parse.
    static func producer<Operation: GraphOperation>(of op: Operation, _ operations: [Operation], index: [String: Int],
                                                    configuration: Configuration) -> Producer<Operation> {
        guard op.edgesKnown else { return .unknown }
        for id in op.input.map({ [$0] }) ?? op.dependencies {
            guard let i = index[id] else { return .unknown }
            switch operations[i].handsOverOutput(configuration) {
            case true?: return .found(operations[i])
            case false?: continue
            case nil: return .unknown
            }
        }
        return .nothing
    }

    /// An image operation or a `write` needs an input: its `input`, else a dependency, that hands one over (not a sleep,
    /// spin or fail, nor a command declared `output = none`). Found here, not when it runs.
    static func operationsWithoutInput<Operation: GraphOperation>(_ operations: [Operation], index: [String: Int],
                                                                  configuration: Configuration) -> [String] {
        var problems: [String] = []
        for op in operations {
            guard let kind = op.knownKind, kind.family == "image" || kind == .write,
                  case .nothing = producer(of: op, operations, index: index, configuration: configuration) else { continue }
            let what = kind == .write ? "something to write" : "an image"
            if let input = op.input {
                problems.append("operation '\(op.id)': its input '\(clipped(input))' hands over no output; "
                    + "\(kind.rawValue) needs \(what)")
            } else {
                problems.append("operation '\(op.id)': \(kind.rawValue) needs \(what): give it a dependency that has an output "
                    + "(a download, an image operation, a write or a command), or `input`")
            }
        }
        return problems
    }

    /// A `write` of an image needs a format its path does not give; a write of bytes (a download's, a command's or
    /// another write's output) is written unchanged under any name (SPEC §3.3). The input is the one the
    /// operation takes when it runs: `input`, else the first dependency that has an output.
    static func imageWritesWithoutFormat<Operation: GraphOperation>(_ operations: [Operation], index: [String: Int],
                                                                    configuration: Configuration) -> [String] {
        var problems: [String] = []
        for op in operations where op.writeHasNoFormat {
            guard case .found(let producer) = producer(of: op, operations, index: index, configuration: configuration),
                  producer.knownKind?.family == "image" else { continue }
            problems.append("operation '\(op.id)': format is required to write the image of '\(producer.id)' when the path does not "
                + "end in .png, .jpg or .jpeg")
        }
        return problems
    }

    /// Each cycle, with the ids along it in execution order (iterative DFS: deep chains must not overflow).
    static func cycles<Operation: GraphOperation>(_ operations: [Operation], index: [String: Int]) -> [String] {
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

    /// Files of the job folder two owners would make: two writes of one path, a write of a command's log
    /// (`logs/<id>.stdout`, `.stderr`), or a file where another needs a folder (`a` and `a/b.png`). One of the outputs
    /// would be lost at run time, which one depending on which ran last.
    static func pathConflicts<Operation: GraphOperation>(_ operations: [Operation]) -> [String] {
        // Who makes each file: the daemon, a command's log, or a write (by id).
        var made: [String: String] = ["manifest.plist": "the daemon's own", "result.plist": "the daemon's own"]
        var writes: [(path: String, id: String)] = []
        var firstCommand: String?
        var problems: [String] = []
        for op in operations {
            if op.knownKind == .command {
                firstCommand = firstCommand ?? op.id
                made["logs/\(op.id).stdout"] = "the standard output log of command operation '\(op.id)'"
                made["logs/\(op.id).stderr"] = "the standard error log of command operation '\(op.id)'"
            } else if let path = op.writePath {
                writes.append((path, op.id))
            }
        }
        var writer: [String: String] = [:]
        for (path, id) in writes {
            if let first = writer[path] {
                problems.append("operations '\(first)' and '\(id)' both write '\(clipped(path))'")
            } else if let log = made[path] {
                problems.append("operation '\(id)' writes '\(clipped(path))', \(log)")
            } else {
                writer[path] = id
                made[path] = "written by operation '\(id)'"
            }
        }
        if let id = writer["logs"], let command = firstCommand {
            problems.append("operation '\(id)' writes 'logs', the folder of command operation '\(command)''s logs")
        }
        for (path, id) in writes {
            var folder = Substring(path)
            while let slash = folder.lastIndex(of: "/") {
                folder = folder[..<slash]
                if let file = made[String(folder)] {
                    let inside = clipped(String(folder))
                    problems.append("operation '\(id)' writes '\(clipped(path))' inside '\(inside)', which is a file (\(file))")
                    break
                }
            }
        }
        return problems
    }
}
