// Daylight saving time as CronSchedule.swift promises, in real zones: on the spring-forward day a fixed-time job
// whose time was skipped runs once at the first minute after the gap, a wildcard job just misses the skipped
// times; on the fall-back day a fixed-time job runs once, at the first of the two instants, a wildcard job in both
// repeated hours. Then the search against a minute-by-minute walk of those rules around many transitions.

import Testing
@testable import Cron

@Suite struct DaylightSavingTests {
    /// (zone, expression, after, the occurrences that follow, each as wall time with its offset).
    static let nextTable: [(zone: String, cron: String, after: String, next: [String])] = [
        // Paris, 2026-03-29: 02:00+01:00 becomes 03:00+02:00.
        ("Europe/Paris", "0 2 * * *", "2026-03-28 02:00+01:00", ["2026-03-29 03:00+02:00", "2026-03-30 02:00+02:00"]),
        ("Europe/Paris", "30 2 * * *", "2026-03-28 12:00+01:00", ["2026-03-29 03:00+02:00", "2026-03-30 02:30+02:00"]),
        ("Europe/Paris", "0,30 2 * * *", "2026-03-29 01:00+01:00", ["2026-03-29 03:00+02:00", "2026-03-30 02:00+02:00"]),
        ("Europe/Paris", "0 2,3 * * *", "2026-03-29 01:00+01:00", ["2026-03-29 03:00+02:00", "2026-03-30 02:00+02:00"]),
        ("Europe/Paris", "0 3 * * *", "2026-03-28 03:00+01:00", ["2026-03-29 03:00+02:00", "2026-03-30 03:00+02:00"]),
        ("Europe/Paris", "30 * * * *", "2026-03-29 00:45+01:00", ["2026-03-29 01:30+01:00", "2026-03-29 03:30+02:00"]),
        ("Europe/Paris", "*/15 * * * *", "2026-03-29 01:30+01:00",
         ["2026-03-29 01:45+01:00", "2026-03-29 03:00+02:00", "2026-03-29 03:15+02:00"]),
        ("Europe/Paris", "* 2 * * *", "2026-03-29 01:00+01:00", ["2026-03-30 02:00+02:00"]),
        ("Europe/Paris", "0 */2 * * *", "2026-03-29 00:30+01:00", ["2026-03-29 04:00+02:00"]),
        // Paris, 2026-10-25: 03:00+02:00 becomes 02:00+01:00.
        ("Europe/Paris", "0 2 * * *", "2026-10-24 02:00+02:00", ["2026-10-25 02:00+02:00", "2026-10-26 02:00+01:00"]),
        ("Europe/Paris", "0 2 * * *", "2026-10-25 02:30+02:00", ["2026-10-26 02:00+01:00"]),
        ("Europe/Paris", "30 2 * * *", "2026-10-25 02:00+01:00", ["2026-10-26 02:30+01:00"]),
        ("Europe/Paris", "0,30 2 * * *", "2026-10-25 01:00+02:00",
         ["2026-10-25 02:00+02:00", "2026-10-25 02:30+02:00", "2026-10-26 02:00+01:00"]),
        ("Europe/Paris", "30 * * * *", "2026-10-25 01:45+02:00",
         ["2026-10-25 02:30+02:00", "2026-10-25 02:30+01:00", "2026-10-25 03:30+01:00"]),
        ("Europe/Paris", "*/20 * * * *", "2026-10-25 02:40+02:00", ["2026-10-25 02:00+01:00", "2026-10-25 02:20+01:00"]),
        ("Europe/Paris", "* 2 * * *", "2026-10-25 02:59+02:00", ["2026-10-25 02:00+01:00", "2026-10-25 02:01+01:00"]),
        ("Europe/Paris", "@hourly", "2026-10-25 01:30+02:00",
         ["2026-10-25 02:00+02:00", "2026-10-25 02:00+01:00", "2026-10-25 03:00+01:00"]),
        ("Europe/Paris", "0 3 * * *", "2026-10-24 03:00+02:00", ["2026-10-25 03:00+01:00", "2026-10-26 03:00+01:00"]),
        // Paris in 2040, from the footer's rule.
        ("Europe/Paris", "0 2 * * *", "2040-03-24 02:00+01:00", ["2040-03-25 03:00+02:00", "2040-03-26 02:00+02:00"]),
        ("Europe/Paris", "30 * * * *", "2040-10-28 01:45+02:00", ["2040-10-28 02:30+02:00", "2040-10-28 02:30+01:00"]),
        // New York, 2026-03-08: 02:00-05:00 becomes 03:00-04:00; 2026-11-01: 02:00-04:00 becomes 01:00-05:00.
        ("America/New_York", "0 2 * * *", "2026-03-07 02:00-05:00", ["2026-03-08 03:00-04:00", "2026-03-09 02:00-04:00"]),
        ("America/New_York", "30 * * * *", "2026-03-08 01:00-05:00", ["2026-03-08 01:30-05:00", "2026-03-08 03:30-04:00"]),
        ("America/New_York", "0 3 * * *", "2026-03-07 03:00-05:00", ["2026-03-08 03:00-04:00", "2026-03-09 03:00-04:00"]),
        ("America/New_York", "0 2 * * *", "2026-10-31 02:00-04:00", ["2026-11-01 02:00-05:00", "2026-11-02 02:00-05:00"]),
        ("America/New_York", "0 1 * * *", "2026-10-31 01:00-04:00", ["2026-11-01 01:00-04:00", "2026-11-02 01:00-05:00"]),
        ("America/New_York", "30 1 * * *", "2026-11-01 01:00-05:00", ["2026-11-02 01:30-05:00"]),
        ("America/New_York", "30 * * * *", "2026-11-01 00:45-04:00",
         ["2026-11-01 01:30-04:00", "2026-11-01 01:30-05:00", "2026-11-01 02:30-05:00"]),
        ("America/New_York", "0 3 * * *", "2026-10-31 03:00-04:00", ["2026-11-01 03:00-05:00"]),
        ("America/New_York", "@daily", "2026-03-07 12:00-05:00", ["2026-03-08 00:00-05:00", "2026-03-09 00:00-04:00"]),
        // Lord Howe moves by 30 minutes; Santiago at midnight; Apia skipped 2011-12-30 whole.
        ("Australia/Lord_Howe", "0 2 * * *", "2026-10-03 12:00+10:30", ["2026-10-04 02:30+11:00", "2026-10-05 02:00+11:00"]),
        ("Australia/Lord_Howe", "45 1 * * *", "2026-04-04 12:00+11:00", ["2026-04-05 01:45+11:00", "2026-04-06 01:45+10:30"]),
        ("Australia/Lord_Howe", "*/20 * * * *", "2026-04-05 01:50+11:00", ["2026-04-05 01:40+10:30", "2026-04-05 02:00+10:30"]),
        ("America/Santiago", "@daily", "2026-09-05 12:00-04:00", ["2026-09-06 01:00-03:00", "2026-09-07 00:00-03:00"]),
        ("America/Santiago", "30 23 * * *", "2026-04-04 12:00-03:00", ["2026-04-04 23:30-03:00", "2026-04-05 23:30-04:00"]),
        ("Pacific/Apia", "0 12 * * *", "2011-12-29 12:00-10:00", ["2011-12-31 00:00+14:00", "2011-12-31 12:00+14:00"]),
        ("Pacific/Apia", "0 * * * *", "2011-12-29 23:00-10:00", ["2011-12-31 00:00+14:00", "2011-12-31 01:00+14:00"]),
    ]

    @Test(arguments: nextTable)
    func next(_ row: (zone: String, cron: String, after: String, next: [String])) {
        let zone = zoneNamed(row.zone)
        let schedule = CronSchedule(cron(row.cron), zone: zone)
        var t = instant(row.after)
        var found: [String] = []
        for _ in row.next {
            let next = schedule.next(after: t)
            found.append(show(next, in: zone))
            guard let next else { break }
            t = next
        }
        #expect(found == row.next)
    }

    static let walkedTable = [
        "0 2 * * *", "30 2 * * *", "*/15 * * * *", "30 * * * *", "* 2 * * *", "0,30 1-3 * * *", "45 1 * * *", "0 */2 * * *",
        "15 2,3 * * *", "@daily", "59 1 * * *", "0 12 * * *", "10 23 * * *", "0 0 * * 0",
    ]

    /// (zone, a UTC minute near a transition): the walk covers a day and a half either side.
    static let transitionsTable: [(zone: String, at: String)] = [
        ("Europe/Paris", "2026-03-29 01:00Z"), ("Europe/Paris", "2026-10-25 01:00Z"), ("Europe/Paris", "2040-10-28 01:00Z"),
        ("America/New_York", "2026-03-08 07:00Z"), ("America/New_York", "2026-11-01 06:00Z"),
        ("Australia/Lord_Howe", "2026-04-04 15:00Z"), ("Australia/Lord_Howe", "2026-10-03 15:30Z"),
        ("America/Santiago", "2026-04-05 03:00Z"), ("America/Santiago", "2026-09-06 04:00Z"),
        ("Pacific/Apia", "2011-12-30 10:00Z"), ("Australia/Sydney", "2026-04-04 16:00Z"),
    ]

    /// The search agrees with the documented rules applied minute by minute, using only offsets: a wildcard job at
    /// each matching wall minute; a fixed-time job at each matching wall minute not seen before, and at the
    /// instant of a gap whose skipped wall minutes hold a match. `latest` agrees with the same walk.
    @Test(arguments: transitionsTable)
    func agreesWithAWalk(_ row: (zone: String, at: String)) {
        let zone = zoneNamed(row.zone)
        let start = instant(row.at) - 36 * 3600, end = instant(row.at) + 36 * 3600
        for text in DaylightSavingTests.walkedTable {
            let expression = cron(text)
            let schedule = CronSchedule(expression, zone: zone)
            let walk = stride(from: start + 60, to: end, by: 60).filter { occurs(expression, zone, at: $0) }
            var found: [Int64] = []
            var t = start
            while let next = schedule.next(after: t), next < end {
                found.append(next)
                t = next
            }
            #expect(found.map { show($0, in: zone) } == walk.map { show($0, in: zone) }, "\(row.zone) \(text)")
            for u in stride(from: start + 59, to: end, by: 17 * 60) {
                let latest = schedule.latest(atOrBefore: u, notBefore: start)
                #expect(latest == walk.last(where: { $0 <= u }), "\(row.zone) \(text) latest at \(show(u, in: zone))")
            }
        }
    }

    /// Whether the rules put an occurrence at the UTC minute `t`, from offsets alone.
    func occurs(_ expression: CronExpression, _ zone: TimeZoneRules, at t: Int64) -> Bool {
        let offset = Int64(zone.offset(at: t)), before = Int64(zone.offset(at: t - 1))
        let wall = t + offset
        if expression.followsElapsedTime { return expression.matches(wallSeconds: wall) }
        if before < offset && stride(from: t + before, to: t + offset, by: 60).contains(where: expression.matches) { return true }
        guard expression.matches(wallSeconds: wall) else { return false }
        // Not seen before: no earlier instant, up to a day back, had this wall time.
        return !stride(from: t - 60, through: t - 86_400, by: -60).contains { $0 + Int64(zone.offset(at: $0)) == wall }
    }
}
