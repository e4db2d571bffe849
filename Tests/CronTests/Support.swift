// Readable times for the tables: "2026-03-29 03:00+02:00" (a wall time with its offset, so it names one instant
// whatever the zone does) or "2026-03-29 01:00Z", optionally with seconds.

import Testing
@testable import Cron

/// The UTC seconds of "YYYY-MM-DD HH:MM[:SS]" followed by "Z" or "+hh:mm" / "-hh:mm".
func instant(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) -> Int64 {
    let utf8 = Array(text.utf8)
    func number(_ range: Range<Int>) -> Int64 {
        guard range.upperBound <= utf8.count, let n = Int64(String(decoding: utf8[range], as: UTF8.self)) else {
            Issue.record("bad time '\(text)'", sourceLocation: sourceLocation)
            return 0
        }
        return n
    }
    let hasSeconds = utf8.count > 16 && utf8[16] == UInt8(ascii: ":")
    let zoneAt = hasSeconds ? 19 : 16
    let wall = Civil.days(year: number(0..<4), month: Int(number(5..<7)), day: Int(number(8..<10))) * 86_400
        + number(11..<13) * 3600 + number(14..<16) * 60 + (hasSeconds ? number(17..<19) : 0)
    if zoneAt < utf8.count && utf8[zoneAt] == UInt8(ascii: "Z") { return wall }
    let sign: Int64 = zoneAt < utf8.count && utf8[zoneAt] == UInt8(ascii: "-") ? -1 : 1
    return wall - sign * (number(zoneAt + 1..<zoneAt + 3) * 3600 + number(zoneAt + 4..<zoneAt + 6) * 60)
}

/// An instant as its wall time in `zone` with the offset ("Z" when it is zero), or "none".
func show(_ t: Int64?, in zone: TimeZoneRules = .utc) -> String {
    guard let t else { return "none" }
    let local = zone.localDateTime(at: t)
    let offset = Int(zone.offset(at: t))
    let date = "\(padded(local.year, 4))-\(padded(local.month, 2))-\(padded(local.day, 2))"
    let time = "\(padded(local.hour, 2)):\(padded(local.minute, 2))" + (local.second == 0 ? "" : ":\(padded(local.second, 2))")
    let zoneText = offset == 0 ? "Z" : "\(offset < 0 ? "-" : "+")\(padded(abs(offset) / 3600, 2)):\(padded(abs(offset) / 60 % 60, 2))"
    return "\(date) \(time)\(zoneText)"
}

/// A zone every test can rely on being installed (the tests fail, not crash, if it is not).
func zoneNamed(_ name: String, sourceLocation: SourceLocation = #_sourceLocation) -> TimeZoneRules {
    do { return try TimeZoneRules(named: name) } catch {
        Issue.record("\(error)", sourceLocation: sourceLocation)
        return .utc
    }
}

/// A parsed expression, recorded as a failure (and read as `* * * * *`) if it does not parse.
func cron(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) -> CronExpression {
    do { return try CronExpression(text) } catch {
        Issue.record("\(text): \(error)", sourceLocation: sourceLocation)
        return try! CronExpression("* * * * *")
    }
}
