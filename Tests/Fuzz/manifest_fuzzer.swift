// libFuzzer entry for manifest validation (make fuzz-manifest), built over the JobModel module (Sources/JobModel)
// with the property-list reader beneath: any bytes must give a plan or problems, never a trap. Each problem names
// what was wrong; a plan that passed must hold together (unique operation ids, dependencies that exist and come first
// in some order — no cycle).

import Foundation
import JobModel
import OperationEngine
import PropertyList

private let configuration = Configuration.builtIn

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzManifest(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Data(bytes: data, count: size)
    _ = Manifest.requestedJob(in: bytes)
    switch Manifest.parse(bytes, configuration: configuration) {
    case .failure(let problems):
        if problems.problems.isEmpty { fatalError("rejected without a reason") }
        if problems.problems.contains(where: \.isEmpty) { fatalError("an empty problem: \(problems.problems)") }
    case .success(let plan):
        var index: [String: Int] = [:]
        for (i, op) in plan.operations.enumerated() {
            if index.updateValue(i, forKey: op.id) != nil { fatalError("duplicate id \(op.id) passed") }
        }
        // Kahn's algorithm: every operation must be reachable in dependency order.
        var pending = plan.operations.map { $0.dependencies.count }
        var dependents = Array(repeating: [Int](), count: plan.operations.count)
        for (i, op) in plan.operations.enumerated() {
            for d in op.dependencies {
                guard let j = index[d] else { fatalError("\(op.id) depends on \(d), which does not exist") }
                dependents[j].append(i)
            }
        }
        var ready = pending.indices.filter { pending[$0] == 0 }, done = 0
        while let i = ready.popLast() {
            done += 1
            for k in dependents[i] { pending[k] -= 1; if pending[k] == 0 { ready.append(k) } }
        }
        if done != plan.operations.count { fatalError("a cycle passed validation") }
    }
    return 0
}
