// Which image operations fuse into one strip pipeline (Pipeline.swift), and how a stage of it reports its failure so
// that the operation whose stage failed is the one that fails (the daemon's Shell/FusedChains.swift).

import JobModel
import OperationEngine

/// A stage of a fused chain failed: the operation whose stage it is (the first takes the decoder too) and why. The
/// chain's end reports it as that operation's failure (FusedChains.swift), as the chain would unfused.
package struct StageFailure: Error, CustomStringConvertible {
    package let operation: String
    let underlying: any Error
    package var description: String { "\(underlying)" }

    /// Runs `body`; what it throws, cancellation aside, is the stage of `operation` failing.
    static func of<T>(_ operation: String?, _ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as OperationCancelled {
            throw error
        } catch let error as StageFailure {
            throw error
        } catch {
            guard let operation else { throw error }
            throw StageFailure(operation: operation, underlying: error)
        }
    }
}

package enum ImageFusion {
    /// The image operations whose output becomes an ImagePipeline instead of pixels: those whose one and only
    /// dependent (in `operations`) is an image operation or a `write` that depends on nothing else (so it takes
    /// this output as its input). Everything else materialises its output as today.
    package static func fusedOperations(_ operations: [OperationPlan]) -> Set<String> {
        // Only an image operation is fused: a job without one (commands, sleeps) is not looked at further.
        guard operations.contains(where: { ImageStep($0.parameters) != nil }) else { return [] }
        var dependents: [String: Int] = [:]
        for op in operations { for d in Set(op.dependencies) { dependents[d, default: 0] += 1 } }
        let producers = Dictionary(operations.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        var fused = Set<String>()
        for consumer in operations {
            let consumes: Bool
            switch consumer.parameters {
            case .write: consumes = true
            default: consumes = ImageStep(consumer.parameters) != nil
            }
            guard consumes, Set(consumer.dependencies).count == 1, let id = consumer.dependencies.first,
                  consumer.input == nil || consumer.input == id, consumer.retries == 0, !consumer.runsAfterFailure,
                  let producer = producers[id], ImageStep(producer.parameters) != nil, dependents[id] == 1,
                  producer.retries == 0, producer.timeoutSeconds == nil, !producer.runsAfterFailure else { continue }
            fused.insert(id)
        }
        return fused
    }

    /// Each chain by the id of its end (the operation that consumes its last fused operation): its fused operations in
    /// order, then the end, as indices in `index` with their ids. (Retries, a fused operation's own timeout or
    /// `runsAfterFailure` would make a chain behave otherwise than unfused: such operations do not fuse.)
    package static func chains(_ operations: [OperationPlan], fused: Set<String>,
                               index: [String: Int]) -> [String: [(index: Int, id: String)]] {
        guard !fused.isEmpty else { return [:] }
        let byID = Dictionary(operations.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        var chains: [String: [(index: Int, id: String)]] = [:]
        for end in operations where !fused.contains(end.id) {
            guard let last = end.dependencies.first, fused.contains(last), let endIndex = index[end.id] else { continue }
            var chain: [String] = [last]
            while let first = byID[chain[0]]?.dependencies.first, fused.contains(first), !chain.contains(first) {
                chain.insert(first, at: 0)
            }
            chains[end.id] = chain.compactMap { id in index[id].map { (index: $0, id: id) } } + [(endIndex, end.id)]
        }
        return chains
    }
}
