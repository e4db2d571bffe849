// Fused image chains as the user sees them (SPEC §3.3, §3.4). A chain of image operations whose intermediate results
// nobody else reads runs inside the operation that consumes the last of them (Pipeline.swift): the engine sees each
// fused operation succeed at once, handing on a pipeline, and the chain's end do all of the pixel work. Fusion is how
// the daemon runs a chain, not something a user should see: a fused operation stays `executing` until the chain's end
// has run its stage, and the stage that fails is the operation that fails, its dependents cancelled — the states,
// errors and journal entries the chain has when it is not fused.
//
// One ledger per job. It holds a fused operation's success and the transitions of what follows it until the chain's
// end ends, then gives them in the order and with the outcome they would have had unfused; `overlay` makes the
// engine's records say the same (status, show, result.plist).

import OperationEngine
import OperationKinds
import Synchronization

final class FusedChains: Sendable {
    /// A record the engine's is replaced with.
    struct Outcome {
        var state: OperationState
        var attempts: Int
        var startedAt: Double?
        var finishedAt: Double?
        var error: String?
    }

    private struct State {
        /// Each chain member (fused operations and the end) → its chain's end.
        var endOf: [Int: Int] = [:]
        /// A chain's end → its members in order, the end last; and each member's operation id.
        var members: [Int: [Int]] = [:]
        var ids: [Int: String] = [:]
        /// Successes of fused operations, held until their chain ends.
        var held: [Int: Transition] = [:]
        /// What came after a held success, held with it.
        var buffered: [Int: [Transition]] = [:]
        /// A chain's end → the stage that failed in its body (an operation id) and the message.
        var failures: [Int: (operation: String, message: String)] = [:]
        var outcomes: [Int: Outcome] = [:]
    }

    private let state = Mutex(State())

    var isEmpty: Bool { state.withLock { $0.members.isEmpty } }

    /// A chain: its fused operations in order, then its end (indices in the job's group, with their ids).
    func add(_ chain: [(index: Int, id: String)]) {
        guard let end = chain.last?.index, chain.count > 1 else { return }
        state.withLock { s in
            s.members[end] = chain.map(\.index)
            for member in chain {
                s.endOf[member.index] = end
                s.ids[member.index] = member.id
            }
        }
    }

    /// The end's body, noting which stage failed when it throws (cancellation and timeouts are no stage's failure).
    func watching(end: Int, _ body: OperationBody) -> OperationBody {
        guard case .sync(let run) = body else { return body }
        return .sync { [self] context in
            do {
                return try run(context)
            } catch let error as OperationCancelled {
                throw error
            } catch let failure as StageFailure {
                state.withLock { $0.failures[end] = (failure.operation, failure.description) }
                throw failure
            } catch {
                state.withLock { s in s.failures[end] = (s.ids[end] ?? "", "\(error)") }
                throw error
            }
        }
    }

    /// The chain's end whose run holds `operation`'s outcome: a cancel of it is a cancel of that run.
    func endHolding(_ operation: Int) -> Int? {
        state.withLock { $0.held[operation] != nil ? $0.endOf[operation] : nil }
    }

    /// The engine's record of `operation` as the user sees it.
    func overlay(_ operation: Int, _ record: OperationRecord) -> OperationRecord {
        state.withLock { s in
            if let o = s.outcomes[operation] {
                return record.replacing(state: o.state, attempts: o.attempts, startedAt: o.startedAt, finishedAt: o.finishedAt,
                                        error: o.error)
            }
            guard s.held[operation] != nil else { return record }
            return record.replacing(state: .executing, attempts: record.attempts, startedAt: record.startedAt, finishedAt: nil, error: nil)
        }
    }

    /// The engine's `t` as the journal gets it: none while it is held, several when a chain's end resolves the chain.
    /// `record` reads the engine's record of an operation.
    func deliver(_ t: Transition, record: (Int) -> OperationRecord?) -> [Transition] {
        state.withLock { s in
            guard let end = s.endOf[t.operation], let members = s.members[end],
                  let position = members.firstIndex(of: t.operation) else { return [t] }
            let earlierHeld = members[..<position].contains { s.held[$0] != nil }
            switch t.state {
            case .succeeded where t.operation != end:
                s.held[t.operation] = t
                return []
            case .succeeded, .failed, .cancelled:
                return resolve(&s, members: members, upTo: position, t, record: record)
            default:
                guard earlierHeld else { return [t] }
                s.buffered[t.operation, default: []].append(t)
                return []
            }
        }
    }

    /// `t` ends the chain's member at `position`: what is held before it ends as the chain would have unfused.
    private func resolve(_ s: inout State, members: [Int], upTo position: Int, _ t: Transition,
                         record: (Int) -> OperationRecord?) -> [Transition] {
        let end = members[members.count - 1]
        let failure = t.operation == end && t.state == .failed ? s.failures.removeValue(forKey: end) : nil
        // The member whose stage failed, if a fused one did; the end's own stage (its encoder, the disk) is the end's.
        let failed = failure.flatMap { f in members[..<position].firstIndex { s.ids[$0] == f.operation } }
        var out: [Transition] = []
        for (i, member) in members[...position].enumerated() {
            let earlier = s.buffered.removeValue(forKey: member) ?? []
            let held = s.held.removeValue(forKey: member)
            guard member == t.operation || held != nil || failed.map({ i > $0 }) == true else { out += earlier; continue }
            let base = held ?? earlier.last ?? t
            let engine = record(member)
            var outcome = Outcome(state: .succeeded, attempts: engine?.attempts ?? 1, startedAt: engine?.startedAt, finishedAt: t.time)
            switch (failed, member == t.operation) {
            case (let k?, _) where i == k:
                outcome.state = .failed
                outcome.error = failure?.message
            case (let k?, _) where i > k:
                // Unfused, it would never have started: cancelled by its dependency, as the engine words it.
                let dependency = s.ids[members[i - 1]] ?? ""
                outcome = Outcome(state: .cancelled, attempts: 0, startedAt: nil, finishedAt: t.time,
                                  error: "dependency '\(dependency)' \(i - 1 == k ? "failed" : "was cancelled")")
            case (nil, false) where t.state != .succeeded && !(t.state == .failed && failure != nil):
                // The end stopped before its stages were through (cancelled, timed out): so did this one.
                outcome.state = .cancelled
                outcome.error = t.error
            case (nil, true):
                out += earlier
                out.append(t)
                continue
            default:
                break
            }
            s.outcomes[member] = outcome
            if outcome.attempts > 0 { out += earlier }
            out.append(base.replacing(operation: member, state: outcome.state, attempt: outcome.attempts > 0 ? base.attempt : 0,
                                      time: t.time, error: outcome.error))
        }
        return out
    }
}
