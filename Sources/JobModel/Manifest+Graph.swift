// A manifest's graph checks (SPEC §3.2): ids, dependencies, cycles, what each operation takes as input, and the
// files of the job folder two operations would both make.

extension Manifest {
    static func validateGraph(_ plan: JobPlan, problems initial: [String],
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
        problems += pathConflicts(plan.operations)
        if !unknown {
            problems += cycles(plan.operations, index: index)
            problems += imageWritesWithoutFormat(plan.operations, index: index, configuration: configuration)
            problems += operationsWithoutInput(plan.operations, index: index, configuration: configuration)
        }
        return problems.isEmpty ? .success(plan) : .failure(ManifestProblems(problems))
    }

    /// The operation whose output `op` takes when it runs: its `input`, else its first dependency that hands one over
    /// (not a sleep, spin or fail, nor a command declared `output = none`); nil when none does.
    static func producer(of op: OperationPlan, _ operations: [OperationPlan], index: [String: Int],
                         configuration: Configuration) -> OperationPlan? {
        func hasOutput(_ op: OperationPlan) -> Bool {
            if case .command(let name, _) = op.parameters { return configuration.commands[name]?.output != CommandSpec.Output.none }
            return op.kind.hasOutput
        }
        return (op.input.map { [$0] } ?? op.dependencies).lazy.compactMap { index[$0].map { operations[$0] } }.first(where: hasOutput)
    }

    /// An image operation or a `write` needs an input: its `input`, else a dependency, that hands one over (not a sleep,
    /// spin or fail, nor a command declared `output = none`). Found here, not when it runs.
    static func operationsWithoutInput(_ operations: [OperationPlan], index: [String: Int], configuration: Configuration) -> [String] {
        var problems: [String] = []
        for op in operations where op.kind.family == "image" || op.kind == .write {
            guard producer(of: op, operations, index: index, configuration: configuration) == nil else { continue }
            let what = op.kind == .write ? "something to write" : "an image"
            if let input = op.input {
                problems.append("operation '\(op.id)': its input '\(clipped(input))' hands over no output; "
                    + "\(op.kind.rawValue) needs \(what)")
            } else {
                problems.append("operation '\(op.id)': \(op.kind.rawValue) needs \(what): give it a dependency that has an output "
                    + "(a download, an image operation, a write or a command), or `input`")
            }
        }
        return problems
    }

    /// A `write` of an image needs a format its path does not give; a write of bytes (a download's, a command's or
    /// another write's output) is written unchanged under any name (SPEC §3.3). The input is the one the
    /// operation takes when it runs: `input`, else the first dependency that has an output.
    static func imageWritesWithoutFormat(_ operations: [OperationPlan], index: [String: Int], configuration: Configuration) -> [String] {
        var problems: [String] = []
        for op in operations {
            guard case .write(_, nil, _) = op.parameters,
                  let producer = producer(of: op, operations, index: index, configuration: configuration),
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

    /// Files of the job folder two owners would make: two writes of one path, a write of a command's log
    /// (`logs/<id>.stdout`, `.stderr`), or a file where another needs a folder (`a` and `a/b.png`). One of the outputs
    /// would be lost at run time, which one depending on which ran last.
    static func pathConflicts(_ operations: [OperationPlan]) -> [String] {
        // Who makes each file: the daemon, a command's log, or a write (by id).
        var made: [String: String] = ["manifest.plist": "the daemon's own", "result.plist": "the daemon's own"]
        var writes: [(path: String, id: String)] = []
        var firstCommand: String?
        var problems: [String] = []
        for op in operations {
            if case .command = op.parameters {
                firstCommand = firstCommand ?? op.id
                made["logs/\(op.id).stdout"] = "the standard output log of command operation '\(op.id)'"
                made["logs/\(op.id).stderr"] = "the standard error log of command operation '\(op.id)'"
            } else if case .write(let path, _, _) = op.parameters, unsafePathReason(path) == nil {
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
