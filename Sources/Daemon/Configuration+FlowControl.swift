// The configuration's flow control (SPEC §3.7, §6): a queue's `rateLimit`.

import OperationEngine
import PropertyList

extension Configuration {
    /// `{ operations = N; seconds = S; }`: N a positive integer, S a positive number of seconds (at most a day).
    static func parseRate(_ value: PlistValue, at path: String, _ problems: inout [String]) -> RateLimit? {
        guard let d = value.dictionary else {
            problems.append("\(path): must be a dictionary { operations = N; seconds = S; }")
            return nil
        }
        for key in d.keys.sorted() where key != "operations" && key != "seconds" { problems.append("\(path): unknown key '\(key)'") }
        let operations = d["operations"]?.integer, seconds = d["seconds"]?.real
        guard let operations, operations >= 1, operations <= 1_000_000 else {
            problems.append("\(path).operations: must be a positive integer (at most 1000000), not \(d["operations"].map(quoted) ?? "missing")")
            return nil
        }
        guard let seconds, seconds > 0, seconds <= 86_400, let rate = RateLimit(operations: operations, seconds: seconds) else {
            problems.append("\(path).seconds: must be a positive number of seconds (at most 86400), not \(d["seconds"].map(quoted) ?? "missing")")
            return nil
        }
        return rate
    }

    /// A value as a problem quotes it.
    static func quoted(_ value: PlistValue) -> String {
        switch value {
        case .string(let s): "'\(s)'"
        case .integer(let i): "\(i)"
        case .real(let r): "\(r)"
        default: value.typeName
        }
    }
}
