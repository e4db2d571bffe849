// A manifest's flow-control keys (SPEC §3.7): later (`notBefore`, `delaySeconds`), once (`ifJobExists`), and the
// submitter's trace (`traceparent`, §6 `tracing`).

import PropertyList

extension Manifest {
    /// The latest `notBefore` (epoch seconds, in the year 5138) and the longest `delaySeconds` a manifest may give.
    public static let notBeforeLimit = 1e11
    public static let delayLimit = 1e10

    /// §3.7's keys: `notBefore` (a date, or real epoch seconds), `delaySeconds`, `ifJobExists`, and `traceparent`.
    static func parseFlowControl(_ top: PlistDictionary, into plan: inout JobPlan, problems: inout [String]) {
        if let value = top["notBefore"] {
            // A plist date counts from 2001-01-01 (Apple's reference date); a real from the Unix epoch.
            let seconds: Double? = if case .date(let d) = value { d + 978_307_200 } else { value.real }
            if let seconds, seconds >= 0, seconds < notBeforeLimit { plan.notBefore = seconds }
            else { problems.append("notBefore: must be a date from 1970 to 5138, or 0 to 1e11 seconds since the epoch") }
        }
        if let value = top["delaySeconds"] {
            if let d = value.real, d >= 0, d < delayLimit { plan.delaySeconds = d }
            else { problems.append("delaySeconds: must be a number of seconds from 0 to 1e10") }
        }
        if top["notBefore"] != nil && top["delaySeconds"] != nil {
            problems.append("notBefore and delaySeconds: give one or the other, not both")
        }
        if let value = top["ifJobExists"] {
            switch value.string {
            case "rename": plan.skipIfExists = false
            case "skip": plan.skipIfExists = true
            default: problems.append("ifJobExists: must be 'rename' or 'skip'")
            }
        }
        if let value = top["traceparent"] {
            if let s = value.string, isTraceparent(s) { plan.traceparent = s }
            else { problems.append("traceparent: must be a W3C trace context, 00-<32 hex>-<16 hex>-<2 hex>, ids not all zero") }
        }
    }

    /// `version-traceid-parentid-flags`, lowercase hex, neither id all zeros (W3C Trace Context, level 1).
    static func isTraceparent(_ s: String) -> Bool {
        let parts = s.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0].count == 2, parts[1].count == 32, parts[2].count == 16, parts[3].count == 2,
              parts[0] != "ff" else { return false }
        let hex = Set("0123456789abcdef")
        guard parts.allSatisfy({ $0.allSatisfy(hex.contains) }) else { return false }
        return parts[1].contains { $0 != "0" } && parts[2].contains { $0 != "0" }
    }
}
