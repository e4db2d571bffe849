// The occurrences of a cron expression in a time zone, as UTC instants (seconds since the epoch).
//
// Daylight saving time is handled as Vixie cron (ISC cron 4.1, and cronie after it) handles it. cron(8): "Only
// jobs that run at a particular time (not specified as @hourly, nor with '*' in the hour or minute specifier) are
// affected. Jobs which are specified with wildcards are run based on the new time immediately." So a job is a
// "wildcard" job when its minute or hour field begins with `*` (`*`, `*/15`, `@hourly`), and a "fixed-time" job
// otherwise (`0 2 * * *`, `0,30 1-3 * * *`, `@daily`).
// - Wildcard jobs follow elapsed time: they match the wall clock as it reads, so they do not run at the times a
//   spring-forward gap skips, and run at both instants of a time that a fall-back overlap repeats. In Paris on
//   2026-10-25, `30 * * * *` runs at 02:30+02:00 and again at 02:30+01:00, an hour later.
// - Fixed-time jobs run once per matching wall-clock time. In an overlap they run at the first of its two instants
//   only (`0 2 * * *` at 02:00+02:00 that day, not at 02:00+01:00). A time skipped by a gap runs at the first
//   instant after the gap, the instant the clock jumps (cron(8): "those jobs which would have run in the time
//   that was skipped will be run soon after the change"): on 2026-03-29, when Paris goes from 02:00 to 03:00,
//   `0 2 * * *` and `30 2 * * *` run at 03:00+02:00 (01:00Z). However many times the gap skipped, that is one
//   occurrence, and the same one as a match at the gap's end.
// Unlike Vixie cron, which takes a jump of three hours or more for a clock being set, a gap of any length (a zone
// skipping a whole day) is a gap. Every occurrence is a whole wall-clock minute; UTC minutes too, for zones whose
// offsets are whole minutes (all of them since 1972).

/// A cron expression read in a time zone.
public struct CronSchedule: Sendable, Equatable {
    public let expression: CronExpression
    public let zone: TimeZoneRules

    /// How far `next` and `latest` look: eight years, so that a February 29 is found across a century year
    /// (2096 to 2104) and an expression that never matches (`0 0 30 2 *`) ends the search.
    static let searchSpan: Int64 = 8 * 366 * 86_400

    public init(_ expression: CronExpression, zone: TimeZoneRules) {
        self.expression = expression
        self.zone = zone
    }

    /// The first occurrence strictly after `utc`, or nil when there is none within eight years.
    public func next(after utc: Int64) -> Int64? {
        guard TimeZoneRules.searchable.contains(utc) else { return nil }
        let limit = utc + CronSchedule.searchSpan
        let fixedTime = !expression.followsElapsedTime
        var p = zone.period(containing: utc + 1)
        while true {
            if fixedTime && p.start > utc && gapMatches(p) { return p.start }
            var low = max(utc + 1, p.start) + p.offset
            if fixedTime && p.previousOffset > p.offset { low = max(low, p.start + p.previousOffset) }   // not twice
            let high = min(p.end, limit) + p.offset
            if let wall = expression.firstMatch(from: low, before: high) { return wall - p.offset }
            if p.end >= limit { return nil }
            p = zone.period(containing: p.end)
        }
    }

    /// The latest occurrence in (`notBefore`, `atOrBefore`], or nil when there is none (looking back at most eight
    /// years): the one occurrence a schedule catches up after downtime.
    public func latest(atOrBefore utc: Int64, notBefore: Int64) -> Int64? {
        guard TimeZoneRules.searchable.contains(utc), notBefore < utc else { return nil }
        let floor = max(notBefore, utc - CronSchedule.searchSpan)
        let fixedTime = !expression.followsElapsedTime
        var p = zone.period(containing: utc)
        while true {
            var low = max(floor + 1, p.start) + p.offset
            if fixedTime && p.previousOffset > p.offset { low = max(low, p.start + p.previousOffset) }
            let high = min(utc, p.end - 1) + p.offset
            if let wall = expression.lastMatch(from: low, through: high) { return wall - p.offset }
            if p.start <= floor { return nil }
            if fixedTime && gapMatches(p) { return p.start }
            p = zone.period(containing: p.start - 1)
        }
    }

    /// Whether a fixed-time job matches a wall-clock time that the gap at the start of `p` skipped.
    private func gapMatches(_ p: Period) -> Bool {
        p.previousOffset < p.offset && expression.firstMatch(from: p.start + p.previousOffset, before: p.start + p.offset) != nil
    }

    /// An occurrence as the suffix of its job id (SPEC §3.7): the UTC minute as `YYYYMMDDTHHMMZ`, `20261128T0200Z`.
    public static func jobIDSuffix(_ utc: Int64) -> String {
        let t = LocalDateTime(wallSeconds: TimeZoneRules.clamped(utc))
        return "\(padded(t.year, 4))\(padded(t.month, 2))\(padded(t.day, 2))T\(padded(t.hour, 2))\(padded(t.minute, 2))Z"
    }
}
