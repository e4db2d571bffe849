// The configuration's flow control (SPEC §3.7, §6): a queue's `rateLimit`, and `schedules`.

import Cron
import OperationEngine
import PropertyList

/// A schedule (SPEC §3.7): at each occurrence of `cron` in `zone`, `manifest` is submitted as job
/// `NAME-<occurrence in UTC>` with `ifJobExists = skip`.
public struct ScheduleSettings: Equatable, Sendable {
    public var cron: CronSchedule
    public var manifest: String
    /// `latest` (true, the default): after downtime the latest missed occurrence runs once; `none` (false).
    public var catchUpLatest: Bool
}

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
            let given = d["operations"].map(quoted) ?? "missing"
            problems.append("\(path).operations: must be a positive integer (at most 1000000), not \(given)")
            return nil
        }
        guard let seconds, seconds > 0, seconds <= 86_400, let rate = RateLimit(operations: operations, seconds: seconds) else {
            let given = d["seconds"].map(quoted) ?? "missing"
            problems.append("\(path).seconds: must be a positive number of seconds (at most 86400), not \(given)")
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

    /// `schedules = { NAME = { cron; manifest; catchUp; timeZone; }; }`; each problem names the schedule and the value.
    static func parseSchedules(_ value: PlistValue, _ problems: inout [String]) -> [String: ScheduleSettings] {
        guard let all = value.dictionary else {
            problems.append("schedules: must be a dictionary")
            return [:]
        }
        var schedules: [String: ScheduleSettings] = [:]
        for name in all.keys.sorted() {
            let path = "schedules.\(name)"
            // Its jobs are NAME-YYYYMMDDTHHMMZ: the name must leave room for the occurrence in a job id.
            guard isValidIdentifier(name), name.utf8.count <= 100 else {
                problems.append("schedules: '\(name)' is not a valid schedule name (1 to 100 of A-Z a-z 0-9 . _ -, not starting with '.')")
                continue
            }
            guard let d = all[name]?.dictionary else { problems.append("\(path): must be a dictionary"); continue }
            var ok = true
            for key in d.keys.sorted() where !isKnown(key, in: "schedules.NAME", at: path, &problems) { ok = false }
            var zone = TimeZoneRules.utc
            if let z = d["timeZone"] {
                do { zone = try TimeZoneRules(named: z.string ?? "") } catch {
                    problems.append("\(path).timeZone: \(z.string.map { "'\($0)'" } ?? "must be a string"): \(error)")
                    ok = false
                }
            } else {
                do { zone = try TimeZoneRules.local() } catch {
                    problems.append("\(path): the machine's time zone cannot be read (\(error)); give timeZone")
                    ok = false
                }
            }
            var expression: CronExpression?
            do { expression = try CronExpression(d["cron"]?.string ?? "") } catch {
                problems.append("\(path).cron: \(d["cron"].map(quoted) ?? "missing"): \(error)")
            }
            let manifest = d["manifest"]?.string ?? ""
            if !manifest.hasPrefix("/") {
                problems.append("\(path).manifest: must be an absolute path, not \(d["manifest"].map(quoted) ?? "missing")")
            }
            let catchUp = d["catchUp"]?.string ?? "latest"
            if catchUp != "latest" && catchUp != "none" {
                problems.append("\(path).catchUp: must be 'latest' or 'none', not \(d["catchUp"].map(quoted) ?? "")")
            }
            guard ok, let expression, manifest.hasPrefix("/"), catchUp == "latest" || catchUp == "none" else { continue }
            schedules[name] = ScheduleSettings(cron: CronSchedule(expression, zone: zone), manifest: manifest,
                                               catchUpLatest: catchUp == "latest")
        }
        return schedules
    }
}
