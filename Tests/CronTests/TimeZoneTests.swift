// Time-zone rules: offsets read from the installed TZif files (checked against known values, before and after the
// files' last transition, where the footer's rule takes over), POSIX TZ strings, conversions, refused names, and
// damaged files, which must give errors and never crash.

import Testing
@testable import Cron

@Suite struct TimeZoneTests {
    static let offsetsTable: [(zone: String, at: String, offset: Int32)] = [
        ("UTC", "2026-07-01 00:00Z", 0),
        ("Europe/Paris", "2026-01-15 12:00Z", 3600),
        ("Europe/Paris", "2026-07-15 12:00Z", 7200),
        ("Europe/Paris", "2026-03-29 00:59:59Z", 3600),
        ("Europe/Paris", "2026-03-29 01:00Z", 7200),
        ("Europe/Paris", "2026-10-25 00:59:59Z", 7200),
        ("Europe/Paris", "2026-10-25 01:00Z", 3600),
        ("Europe/Paris", "1970-01-01 00:00Z", 3600),
        ("Europe/Paris", "1900-01-01 00:00Z", 561),   // Paris Mean Time, +0:09:21
        ("Europe/Paris", "2040-01-15 00:00Z", 3600),   // 2040 and 2100: after the file's transitions, the footer's rule
        ("Europe/Paris", "2040-03-25 00:59:59Z", 3600),
        ("Europe/Paris", "2040-03-25 01:00Z", 7200),
        ("Europe/Paris", "2040-10-28 00:59:59Z", 7200),
        ("Europe/Paris", "2040-10-28 01:00Z", 3600),
        ("Europe/Paris", "2100-03-28 01:00Z", 7200),
        ("Europe/Paris", "2100-10-31 01:00Z", 3600),
        ("America/New_York", "2026-01-15 12:00Z", -18000),
        ("America/New_York", "2026-07-15 12:00Z", -14400),
        ("America/New_York", "2026-03-08 06:59:59Z", -18000),
        ("America/New_York", "2026-03-08 07:00Z", -14400),
        ("America/New_York", "2026-11-01 05:59:59Z", -14400),
        ("America/New_York", "2026-11-01 06:00Z", -18000),
        ("America/New_York", "1960-07-01 00:00Z", -14400),
        ("America/New_York", "2040-03-11 07:00Z", -14400),
        ("America/New_York", "2040-11-04 05:59:59Z", -14400),
        ("America/New_York", "2040-11-04 06:00Z", -18000),
        ("America/New_York", "2100-03-14 06:59:59Z", -18000),
        ("America/New_York", "2100-03-14 07:00Z", -14400),
        ("Asia/Kolkata", "2026-07-01 00:00Z", 19_800),
        ("Australia/Lord_Howe", "2026-01-15 00:00Z", 39_600),
        ("Australia/Lord_Howe", "2026-07-15 00:00Z", 37_800),
        ("Australia/Sydney", "2026-04-04 15:59:59Z", 39_600),
        ("Australia/Sydney", "2026-04-04 16:00Z", 36_000),
        ("Pacific/Apia", "2011-12-30 09:59:59Z", -36_000),
        ("Pacific/Apia", "2011-12-30 10:00Z", 50_400),
    ]

    @Test(arguments: offsetsTable)
    func offset(_ row: (zone: String, at: String, offset: Int32)) {
        #expect(zoneNamed(row.zone).offset(at: instant(row.at)) == row.offset)
    }

    /// (zone, wall time, every instant the clock reads it).
    static let instantsTable: [(zone: String, local: LocalDateTime, instants: [String])] = [
        ("UTC", LocalDateTime(year: 2026, month: 7, day: 1, hour: 12), ["2026-07-01 12:00Z"]),
        ("Europe/Paris", LocalDateTime(year: 2026, month: 7, day: 1, hour: 12), ["2026-07-01 10:00Z"]),
        ("Europe/Paris", LocalDateTime(year: 2026, month: 3, day: 29, hour: 1, minute: 59), ["2026-03-29 00:59Z"]),
        ("Europe/Paris", LocalDateTime(year: 2026, month: 3, day: 29, hour: 2, minute: 30), []),
        ("Europe/Paris", LocalDateTime(year: 2026, month: 3, day: 29, hour: 3), ["2026-03-29 01:00Z"]),
        ("Europe/Paris", LocalDateTime(year: 2026, month: 10, day: 25, hour: 2, minute: 30), ["2026-10-25 00:30Z", "2026-10-25 01:30Z"]),
        ("Europe/Paris", LocalDateTime(year: 2026, month: 10, day: 25, hour: 3), ["2026-10-25 02:00Z"]),
        ("Europe/Paris", LocalDateTime(year: 2040, month: 10, day: 28, hour: 2), ["2040-10-28 00:00Z", "2040-10-28 01:00Z"]),
        ("America/New_York", LocalDateTime(year: 2026, month: 11, day: 1, hour: 1, minute: 15), ["2026-11-01 05:15Z", "2026-11-01 06:15Z"]),
        ("America/New_York", LocalDateTime(year: 2026, month: 3, day: 8, hour: 2), []),
        ("Pacific/Apia", LocalDateTime(year: 2011, month: 12, day: 30, hour: 12), []),
        ("Europe/Paris", LocalDateTime(year: 2026, month: 2, day: 29), []),
        ("Europe/Paris", LocalDateTime(year: 2026, month: 13, day: 1), []),
        ("Europe/Paris", LocalDateTime(year: 2026, month: 1, day: 1, hour: 24), []),
        ("Europe/Paris", LocalDateTime(year: Int.min, month: 1, day: 1), []),
    ]

    @Test(arguments: instantsTable)
    func instants(_ row: (zone: String, local: LocalDateTime, instants: [String])) {
        let zone = zoneNamed(row.zone)
        let found = zone.instants(for: row.local)
        #expect(found == row.instants.map { instant($0) })
        for t in found { #expect(zone.localDateTime(at: t) == row.local) }
    }

    @Test func localDateTime() {
        let paris = zoneNamed("Europe/Paris")
        #expect(paris.localDateTime(at: instant("2026-03-29 01:00Z")).description == "2026-03-29 03:00:00")
        #expect(paris.localDateTime(at: instant("2026-03-29 00:59:59Z")).description == "2026-03-29 01:59:59")
        #expect(TimeZoneRules.utc.localDateTime(at: -1).description == "1969-12-31 23:59:59")
    }

    static let notAName = "is not a time zone name (a file under /usr/share/zoneinfo, such as Europe/Paris)"

    static let refusedTable: [(name: String, error: String)] = [
        ("../../etc/passwd", "'../../etc/passwd' \(notAName)"),
        ("Europe/../../../etc/passwd", "'Europe/../../../etc/passwd' \(notAName)"),
        ("/etc/passwd", "'/etc/passwd' \(notAName)"),
        ("/usr/share/zoneinfo/../../../etc/passwd", "'/usr/share/zoneinfo/../../../etc/passwd' \(notAName)"),
        ("", "'' \(notAName)"),
        ("Nowhere/City", "unknown time zone 'Nowhere/City' (no zone file /usr/share/zoneinfo/Nowhere/City)"),
        ("Europe", "unknown time zone 'Europe' (no zone file /usr/share/zoneinfo/Europe)"),
        ("zone.tab", "time zone 'zone.tab': /usr/share/zoneinfo/zone.tab is not a valid TZif file: no TZif magic"),
    ]

    @Test(arguments: refusedTable)
    func refusesNames(_ row: (name: String, error: String)) {
        #expect(throws: TimeZoneError(row.error)) { try TimeZoneRules(named: row.name) }
    }

    @Test func acceptsAPathInsideTheZoneFolder() throws {
        #expect(try TimeZoneRules(named: "/usr/share/zoneinfo/Europe/Paris").offset(at: instant("2026-07-01 00:00Z")) == 7200)
    }

    /// The machine's zone: TZ (name, ':name', POSIX string, empty), else the localtime file, else UTC.
    static let localTable: [(tz: String?, localtime: String, name: String, julyOffset: Int32)] = [
        ("Europe/Paris", "/nonexistent", "Europe/Paris", 7200),
        (":Europe/Paris", "/nonexistent", "Europe/Paris", 7200),
        ("", "/usr/share/zoneinfo/Europe/Paris", "UTC", 0),
        ("CET-1CEST,M3.5.0,M10.5.0/3", "/nonexistent", "CET-1CEST,M3.5.0,M10.5.0/3", 7200),
        ("<+0330>-3:30", "/nonexistent", "<+0330>-3:30", 12_600),
        (nil, "/usr/share/zoneinfo/America/New_York", "/usr/share/zoneinfo/America/New_York", -14400),
        (nil, "/nonexistent/localtime", "UTC", 0),
    ]

    @Test(arguments: localTable)
    func local(_ row: (tz: String?, localtime: String, name: String, julyOffset: Int32)) throws {
        let rules = try TimeZoneRules.local(tz: row.tz, localtime: row.localtime)
        #expect(rules.name == row.name)
        #expect(rules.offset(at: instant("2026-07-01 00:00Z")) == row.julyOffset)
    }

    @Test func localRefusesAnUnknownTZAndABadFile() {
        #expect(throws: TimeZoneError("TZ='Nowhere/City' is neither a time zone in /usr/share/zoneinfo nor a POSIX TZ string")) {
            try TimeZoneRules.local(tz: "Nowhere/City", localtime: "/nonexistent")
        }
        #expect(throws: TimeZoneError("'../../etc/passwd' \(TimeZoneTests.notAName)")) {
            try TimeZoneRules.local(tz: ":../../etc/passwd", localtime: "/nonexistent")
        }
        #expect(throws: TimeZoneError("the machine's time zone: /etc/passwd is not a valid TZif file: no TZif magic")) {
            try TimeZoneRules.local(tz: nil, localtime: "/etc/passwd")
        }
    }
}
