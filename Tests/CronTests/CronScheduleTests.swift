// Occurrences in UTC: next, latest (catch-up) and the job-id suffix, as tables; then the skipping search against
// a minute-by-minute walk.

import Testing
@testable import Cron

@Suite struct CronScheduleTests {
    /// (expression, after, the occurrences that follow, in order).
    static let nextInUTCTable: [(cron: String, after: String, next: [String])] = [
        ("* * * * *", "2026-01-01 00:00Z", ["2026-01-01 00:01Z", "2026-01-01 00:02Z"]),
        ("* * * * *", "2026-01-01 00:00:30Z", ["2026-01-01 00:01Z"]),
        ("* * * * *", "2026-12-31 23:59Z", ["2027-01-01 00:00Z"]),
        ("*/15 * * * *", "2026-01-01 00:00Z", ["2026-01-01 00:15Z", "2026-01-01 00:30Z", "2026-01-01 00:45Z", "2026-01-01 01:00Z"]),
        ("*/15 * * * *", "2026-01-01 00:50Z", ["2026-01-01 01:00Z"]),
        ("1-5/2 * * * *", "2026-01-01 00:00Z", ["2026-01-01 00:01Z", "2026-01-01 00:03Z", "2026-01-01 00:05Z", "2026-01-01 01:01Z"]),
        ("5-59/20 * * * *", "2026-01-01 00:45Z", ["2026-01-01 01:05Z", "2026-01-01 01:25Z"]),
        ("0 2 * * *", "2026-01-01 00:00Z", ["2026-01-01 02:00Z", "2026-01-02 02:00Z"]),
        ("0 2 * * *", "2026-01-01 02:00Z", ["2026-01-02 02:00Z"]),
        ("0 2 * * *", "2026-01-01 01:59:59Z", ["2026-01-01 02:00Z"]),
        ("0 0 31 * *", "2026-01-31 00:00Z", ["2026-03-31 00:00Z", "2026-05-31 00:00Z", "2026-07-31 00:00Z", "2026-08-31 00:00Z"]),
        ("0 0 31 * *", "2026-04-01 00:00Z", ["2026-05-31 00:00Z"]),
        ("0 0 29 2 *", "2026-01-01 00:00Z", ["2028-02-29 00:00Z", "2032-02-29 00:00Z"]),
        ("0 0 29 2 *", "2096-03-01 00:00Z", ["2104-02-29 00:00Z"]),
        ("0 0 1 1 *", "2026-06-15 00:00Z", ["2027-01-01 00:00Z", "2028-01-01 00:00Z"]),
        // Both days restricted: the 13th OR a Friday (2026-04-13 is a Monday, 04-17 a Friday).
        ("0 0 13 * 5", "2026-04-11 00:00Z", ["2026-04-13 00:00Z", "2026-04-17 00:00Z", "2026-04-24 00:00Z", "2026-05-01 00:00Z"]),
        ("0 0 13 * fri", "2026-04-11 00:00Z", ["2026-04-13 00:00Z", "2026-04-17 00:00Z"]),
        // A field beginning with `*` is unrestricted for Vixie, even with a step: odd days AND Fridays.
        ("0 0 */2 * 5", "2026-04-17 00:00Z", ["2026-05-01 00:00Z", "2026-05-15 00:00Z"]),
        ("0 0 * * 5", "2026-04-11 00:00Z", ["2026-04-17 00:00Z"]),
        ("0 0 13 * *", "2026-04-11 00:00Z", ["2026-04-13 00:00Z", "2026-05-13 00:00Z"]),
        ("0 0 * * 7", "2026-01-01 00:00Z", ["2026-01-04 00:00Z", "2026-01-11 00:00Z"]),
        ("0 0 * * 0", "2026-01-01 00:00Z", ["2026-01-04 00:00Z"]),
        ("0 0 * * sun", "2026-01-01 00:00Z", ["2026-01-04 00:00Z"]),
        ("0 9 * * mon-fri", "2026-01-02 09:00Z", ["2026-01-05 09:00Z", "2026-01-06 09:00Z"]),
        ("0 0 1 jan,jul *", "2026-01-02 00:00Z", ["2026-07-01 00:00Z", "2027-01-01 00:00Z"]),
        ("@weekly", "2026-01-01 00:00Z", ["2026-01-04 00:00Z", "2026-01-11 00:00Z"]),
        ("@hourly", "2026-01-01 00:30Z", ["2026-01-01 01:00Z", "2026-01-01 02:00Z"]),
        ("@daily", "2026-01-01 00:00Z", ["2026-01-02 00:00Z"]),
        ("@monthly", "2026-01-15 00:00Z", ["2026-02-01 00:00Z", "2026-03-01 00:00Z"]),
        ("@yearly", "2026-01-01 00:00Z", ["2027-01-01 00:00Z"]),
        ("59 23 31 12 *", "2026-06-01 00:00Z", ["2026-12-31 23:59Z", "2027-12-31 23:59Z"]),
        ("59 23 31 12 *", "2026-12-31 23:59Z", ["2027-12-31 23:59Z"]),
        // February 29 that is a Sunday (`*/7`: both day fields must pass): 2032, then 2060, beyond the search.
        ("0 0 29 2 */7", "2026-01-01 00:00Z", ["2032-02-29 00:00Z"]),
        ("0 0 29 2 */7", "2033-01-01 00:00Z", ["none"]),
        ("0 0 29 2 1", "2026-01-01 00:00Z", ["2026-02-02 00:00Z"]),
    ]

    @Test(arguments: nextInUTCTable)
    func next(_ row: (cron: String, after: String, next: [String])) {
        let schedule = CronSchedule(cron(row.cron), zone: .utc)
        var t = instant(row.after)
        var found: [String] = []
        for _ in row.next {
            let next = schedule.next(after: t)
            found.append(show(next))
            guard let next else { break }
            t = next
        }
        #expect(found == row.next)
    }

    /// (zone, expression, atOrBefore, notBefore, the latest occurrence in between).
    static let latestTable: [(zone: String, cron: String, atOrBefore: String, notBefore: String, latest: String)] = [
        ("UTC", "0 2 * * *", "2026-01-05 12:00Z", "2026-01-01 12:00Z", "2026-01-05 02:00Z"),
        ("UTC", "0 2 * * *", "2026-01-05 02:00Z", "2026-01-01 12:00Z", "2026-01-05 02:00Z"),
        ("UTC", "0 2 * * *", "2026-01-06 01:59Z", "2026-01-05 02:00Z", "none"),
        ("UTC", "0 2 * * *", "2026-01-05 12:00Z", "2026-01-05 12:00Z", "none"),
        ("UTC", "0 2 * * *", "2026-01-05 12:00Z", "2026-01-06 12:00Z", "none"),
        ("UTC", "*/15 * * * *", "2026-01-01 10:07Z", "2026-01-01 09:00Z", "2026-01-01 10:00Z"),
        ("UTC", "* * * * *", "2026-06-01 00:00:30Z", "2020-01-01 00:00Z", "2026-06-01 00:00Z"),
        ("UTC", "0 0 1 1 *", "2026-06-01 00:00Z", "2026-01-01 00:00Z", "none"),
        ("UTC", "0 0 1 1 *", "2026-06-01 00:00Z", "2025-12-31 00:00Z", "2026-01-01 00:00Z"),
        ("UTC", "0 0 29 2 *", "2026-06-01 00:00Z", "2020-01-01 00:00Z", "2024-02-29 00:00Z"),
        ("UTC", "0 0 13 * 5", "2026-04-16 12:00Z", "2026-01-01 00:00Z", "2026-04-13 00:00Z"),
        ("UTC", "0 0 13 * 5", "2026-04-12 12:00Z", "2026-01-01 00:00Z", "2026-04-10 00:00Z"),
        ("UTC", "59 23 31 12 *", "2027-06-01 00:00Z", "2020-01-01 00:00Z", "2026-12-31 23:59Z"),
        ("UTC", "0 9 * * mon-fri", "2026-01-04 12:00Z", "2025-12-01 00:00Z", "2026-01-02 09:00Z"),
        ("UTC", "0 0 31 * *", "2026-05-30 00:00Z", "2025-01-01 00:00Z", "2026-03-31 00:00Z"),
        ("UTC", "0 0 29 2 */7", "2031-06-01 00:00Z", "2005-01-01 00:00Z", "none"),
        ("Europe/Paris", "0 2 * * *", "2026-03-29 03:30+02:00", "2026-03-28 12:00+01:00", "2026-03-29 03:00+02:00"),
        ("Europe/Paris", "30 2 * * *", "2026-03-29 03:00+02:00", "2026-03-28 12:00+01:00", "2026-03-29 03:00+02:00"),
        ("Europe/Paris", "0 2 * * *", "2026-03-29 01:59+01:00", "2026-03-28 12:00+01:00", "none"),
        ("Europe/Paris", "0 2 * * *", "2026-03-29 12:00+02:00", "2026-03-29 03:00+02:00", "none"),
        ("Europe/Paris", "30 * * * *", "2026-03-29 03:15+02:00", "2026-03-29 00:00+01:00", "2026-03-29 01:30+01:00"),
        ("Europe/Paris", "0 2 * * *", "2026-10-25 02:30+01:00", "2026-10-24 12:00+02:00", "2026-10-25 02:00+02:00"),
        ("Europe/Paris", "0 2 * * *", "2026-10-25 02:30+01:00", "2026-10-25 02:00+02:00", "none"),
        ("Europe/Paris", "30 * * * *", "2026-10-25 02:45+01:00", "2026-10-25 00:00+02:00", "2026-10-25 02:30+01:00"),
        ("Europe/Paris", "30 * * * *", "2026-10-25 02:15+01:00", "2026-10-25 00:00+02:00", "2026-10-25 02:30+02:00"),
        ("America/New_York", "0 1 * * *", "2026-11-01 01:30-05:00", "2026-10-31 12:00-04:00", "2026-11-01 01:00-04:00"),
        ("America/New_York", "0 2 * * *", "2026-03-08 03:10-04:00", "2026-03-07 12:00-05:00", "2026-03-08 03:00-04:00"),
    ]

    @Test(arguments: latestTable)
    func latest(_ row: (zone: String, cron: String, atOrBefore: String, notBefore: String, latest: String)) {
        let zone = zoneNamed(row.zone)
        let schedule = CronSchedule(cron(row.cron), zone: zone)
        let found = schedule.latest(atOrBefore: instant(row.atOrBefore), notBefore: instant(row.notBefore))
        #expect(show(found, in: zone) == row.latest)
    }

    static let suffixesTable: [(utc: String, suffix: String)] = [
        ("2026-11-28 02:00Z", "20261128T0200Z"),
        ("2026-11-28 02:00:59Z", "20261128T0200Z"),
        ("2026-11-28 03:00+01:00", "20261128T0200Z"),
        ("1970-01-01 00:00Z", "19700101T0000Z"),
        ("2000-02-29 23:59Z", "20000229T2359Z"),
        ("2026-03-29 03:00+02:00", "20260329T0100Z"),
        ("2026-12-31 23:59Z", "20261231T2359Z"),
    ]

    @Test(arguments: suffixesTable)
    func jobIDSuffix(_ row: (utc: String, suffix: String)) {
        #expect(CronSchedule.jobIDSuffix(instant(row.utc)) == row.suffix)
    }

    static let walkedTable = [
        "0 0 13 * 5", "*/7 */5 1-10 */2 mon-wed", "0 0 */2 * 5", "15,45 8-18/3 * * 1-5", "0 0 29 2 *", "0 12 1,15 * *",
        "59 23 * * 6,0", "30 4 31 * *", "0 0 1-7 * 1", "0 0 1-7 * *", "0 0 * * 1", "*/13 2 * mar,oct 0", "@weekly",
    ]

    /// The skipping search agrees with a minute-by-minute walk over 70 days in UTC, forward and backward.
    @Test(arguments: walkedTable)
    func agreesWithAWalk(_ text: String) {
        let expression = cron(text)
        let schedule = CronSchedule(expression, zone: .utc)
        let start = instant("2028-01-20 00:00Z"), end = start + 70 * 86_400
        let walk = stride(from: start + 60, to: end, by: 60).filter { expression.matches(wallSeconds: $0) }
        var found: [Int64] = []
        var t = start
        while let next = schedule.next(after: t), next < end {
            found.append(next)
            t = next
        }
        #expect(found == walk)
        for u in stride(from: start + 59, to: end, by: 7 * 3600 + 13 * 60) {
            #expect(schedule.latest(atOrBefore: u, notBefore: start) == walk.last(where: { $0 <= u }), "latest at \(show(u))")
        }
    }
}

extension CronScheduleTests {
    /// Instants far outside any calendar end the search rather than overflow or loop.
    @Test func extremeInstants() {
        let schedule = CronSchedule(cron("* * * * *"), zone: zoneNamed("Europe/Paris"))
        let extremes: [Int64] = [.min, .max, -(1 << 46) - 1, (1 << 46) + 1]
        for t in extremes {
            #expect(schedule.next(after: t) == nil)
            #expect(schedule.latest(atOrBefore: t, notBefore: Int64.min) == nil)
        }
        #expect(schedule.next(after: (1 << 46) - 60) != nil)
        #expect(schedule.latest(atOrBefore: -(1 << 46) + 60, notBefore: Int64.min) != nil)
        #expect([3600, 7200].contains(zoneNamed("Europe/Paris").offset(at: Int64.max)))
        #expect(CronSchedule.jobIDSuffix(Int64.min).hasSuffix("Z"))
    }
}
