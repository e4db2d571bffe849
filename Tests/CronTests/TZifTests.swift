// The TZif reader on made and damaged files, and POSIX TZ strings (TZif footers) on their own.

#if canImport(Glibc)
import Glibc
#endif
import Testing
@testable import Cron

/// A version 1 TZif file: one transition at `at` from UTC to +01:00.
func versionOneFile(transitionAt at: Int32) -> [UInt8] {
    func be32(_ v: Int32) -> [UInt8] { (0..<4).map { UInt8(truncatingIfNeeded: v >> (24 - 8 * $0)) } }
    var bytes = Array("TZif".utf8) + [UInt8](repeating: 0, count: 16)
    for count: Int32 in [0, 0, 0, 1, 2, 8] { bytes += be32(count) }   // ut, std, leap, time, type, char counts
    bytes += be32(at) + [1]
    bytes += be32(0) + [0, 0] + be32(3600) + [0, 4]
    bytes += Array("UTC\0+01\0".utf8)
    return bytes
}

/// The bytes of an installed zone file.
func zoneFile(_ name: String) -> [UInt8] {
    var bytes: [UInt8] = []
    guard let file = fopen("/usr/share/zoneinfo/" + name, "rb") else { Issue.record("no \(name)"); return [] }
    defer { fclose(file) }
    while true {
        let c = fgetc(file)
        if c == EOF { return bytes }
        bytes.append(UInt8(c))
    }
}

@Suite struct TZifTests {
    @Test func readsAVersionOneFile() throws {
        let rules = try TimeZoneRules(name: "test", tzif: versionOneFile(transitionAt: 1000))
        #expect(rules.offset(at: 999) == 0)
        #expect(rules.offset(at: 1000) == 3600)
        #expect(rules.offset(at: 4_000_000_000) == 3600)
        #expect(rules.footer == nil)
    }

    static let malformedTable: [(bytes: [UInt8], reason: String)] = [
        ([], "truncated header"),
        (Array("TZif2".utf8), "truncated header"),
        (Array("XZif".utf8) + [UInt8](repeating: 0, count: 60), "no TZif magic"),
        (Array("TZif9".utf8) + [UInt8](repeating: 0, count: 60), "unknown version byte 57"),
        (Array("TZif".utf8) + [UInt8](repeating: 0, count: 60), "no local time types"),
        (Array(versionOneFile(transitionAt: 1000).dropLast()), "truncated data"),
    ]

    @Test(arguments: malformedTable)
    func refusesMalformed(_ row: (bytes: [UInt8], reason: String)) {
        do {
            _ = try TimeZoneRules(name: "test", tzif: row.bytes)
            Issue.record("accepted")
        } catch {
            #expect(error.reason == row.reason)
        }
    }

    @Test func refusesTransitionsOutOfOrderAndBadTypes() {
        var file = versionOneFile(transitionAt: 1000)
        file[44 + 4] = 2   // the transition's type index, past the two types
        #expect(throws: TZifError.self) { try TimeZoneRules(name: "test", tzif: file) }
    }

    @Test func refusesABadFooter() throws {
        var file = zoneFile("Europe/Paris")
        let footer = Array("CET-1CEST,M3.5.0,M10.5.0/3\n".utf8)
        #expect(Array(file.suffix(footer.count)) == footer)
        file.removeLast(footer.count)
        file += Array("CET-1CEST,M3.5.0\n".utf8)
        do {
            _ = try TimeZoneRules(name: "test", tzif: file)
            Issue.record("accepted")
        } catch {
            #expect(error.reason == "footer 'CET-1CEST,M3.5.0': a ',' and the end of daylight saving time expected")
        }
    }

    /// Every strict prefix of a real file is refused; a file with any one byte inverted is refused or read, never a crash.
    @Test(arguments: ["Europe/Paris", "America/New_York"])
    func survivesDamage(_ name: String) {
        let file = zoneFile(name)
        #expect(file.count > 1000)
        let acceptedPrefixes = (0..<file.count).filter { (try? TimeZoneRules(name: name, tzif: Array(file[0..<$0]))) != nil }
        #expect(acceptedPrefixes == [])
        let schedule = cron("0 2 * * *")
        for index in file.indices {
            var damaged = file
            damaged[index] ^= 0xFF
            if let rules = try? TimeZoneRules(name: name, tzif: damaged) {
                _ = rules.offset(at: 1_800_000_000)
                _ = CronSchedule(schedule, zone: rules).next(after: 1_800_000_000)
            }
        }
    }

    /// (TZ string, UTC instant, offset there).
    static let posixTable: [(tz: String, at: String, offset: Int64)] = [
        ("CET-1CEST,M3.5.0,M10.5.0/3", "2026-03-29 00:59:59Z", 3600),
        ("CET-1CEST,M3.5.0,M10.5.0/3", "2026-03-29 01:00Z", 7200),
        ("CET-1CEST,M3.5.0,M10.5.0/3", "2026-10-25 00:59:59Z", 7200),
        ("CET-1CEST,M3.5.0,M10.5.0/3", "2026-10-25 01:00Z", 3600),
        ("EST5EDT,M3.2.0,M11.1.0", "2026-03-08 06:59:59Z", -18000),
        ("EST5EDT,M3.2.0,M11.1.0", "2026-03-08 07:00Z", -14400),
        ("EST5EDT,M3.2.0,M11.1.0", "2026-11-01 06:00Z", -18000),
        ("AEST-10AEDT,M10.1.0,M4.1.0/3", "2026-01-15 00:00Z", 39_600),   // southern: DST across the new year
        ("AEST-10AEDT,M10.1.0,M4.1.0/3", "2026-04-04 15:59:59Z", 39_600),
        ("AEST-10AEDT,M10.1.0,M4.1.0/3", "2026-04-04 16:00Z", 36_000),
        ("AEST-10AEDT,M10.1.0,M4.1.0/3", "2026-10-03 16:00Z", 39_600),
        ("<+0330>-3:30", "2026-07-01 00:00Z", 12_600),
        ("JST-9", "2026-07-01 00:00Z", 32_400),
        ("<-03>3<-02>,M3.5.0/-2,M10.5.0/-1", "2026-03-29 00:59:59Z", -10_800),   // negative times (Nuuk)
        ("<-03>3<-02>,M3.5.0/-2,M10.5.0/-1", "2026-03-29 01:00Z", -7200),
        ("IST-2IDT,M3.4.4/26,M10.5.0", "2026-03-26 23:59:59Z", 7200),   // hours past 24 (Israel)
        ("IST-2IDT,M3.4.4/26,M10.5.0", "2026-03-27 00:00Z", 10_800),
        ("EST5EDT4,0/0,J365/25", "2026-07-01 00:00Z", -14400),   // daylight time all year (RFC 8536)
        ("EST5EDT4,0/0,J365/25", "2026-12-31 23:59Z", -14400),
        ("EST5EDT4,0/0,J365/25", "2027-01-01 05:00Z", -14400),
        ("AAA0BBB,J60/0,J300/0", "2028-02-29 23:59:59Z", 0),   // J never counts February 29
        ("AAA0BBB,J60/0,J300/0", "2028-03-01 00:00Z", 3600),
        ("AAA0BBB,59/0,300/0", "2028-02-28 23:59:59Z", 0),   // n does
        ("AAA0BBB,59/0,300/0", "2028-02-29 00:00Z", 3600),
    ]

    @Test(arguments: posixTable)
    func posixRules(_ row: (tz: String, at: String, offset: Int64)) throws {
        let rules = try PosixTimeZone(row.tz)
        #expect(rules.period(containing: instant(row.at)).offset == row.offset)
    }

    static let badPosixTable = [
        "", "CET", "C-1", "CET-1CEST", "CET-1CEST,M13.1.0,M10.5.0", "CET-1CEST,M3.5.0,M10.5.0/3x", "CET-1CEST,M3.6.0,M10.5.0",
        "CET-1CEST,J0,J300", "CET25", "<+03-3", "CET-1CEST,M3.5.7,M10.5.0",
    ]

    @Test(arguments: badPosixTable)
    func refusesBadPosix(_ tz: String) {
        #expect(throws: PosixError.self) { try PosixTimeZone(tz) }
    }
}
