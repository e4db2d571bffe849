// Schedules (SPEC §3.7): the pure book of occurrences (ScheduleBook.swift), which the daemon submits.

import Cron
import Testing
@testable import JobModel

@Suite struct ScheduleBookTests {
    func settings(_ cron: String, catchUp: Bool = true) throws -> ScheduleSettings {
        ScheduleSettings(cron: CronSchedule(try CronExpression(cron), zone: .utc), manifest: "/m.plist", catchUpLatest: catchUp)
    }

    @Test func occurrencesAreDueOnceAndCatchUpTakesOnlyTheLatest() throws {
        var book = ScheduleBook()
        let t0: Int64 = 1_795_910_400  // 2026-11-29T00:00:00Z
        // New: nothing missed, whatever the saved state of other names; next at the next hour.
        #expect(book.configure(["h": try settings("0 * * * *")], saved: ["other": 0], now: t0 + 10).isEmpty)
        #expect(book.nextWake == t0 + 3600)
        #expect(book.due(now: t0 + 3599).isEmpty)
        #expect(book.due(now: t0 + 3600).map(\.at) == [t0 + 3600])
        #expect(book.due(now: t0 + 3601).isEmpty, "an occurrence is due once")
        // A restart 3 h 30 later, from what was saved: the latest missed one, once.
        var restarted = ScheduleBook()
        let saved = ["h": book.entries["h"]?.since ?? 0]
        #expect(restarted.configure(["h": try settings("0 * * * *")], saved: saved, now: t0 + 5 * 3600 + 1800).map(\.at) == [t0 + 5 * 3600])
        // catchUp = none lets them go.
        var none = ScheduleBook()
        #expect(none.configure(["h": try settings("0 * * * *", catchUp: false)], saved: saved, now: t0 + 5 * 3600 + 1800).isEmpty)
        #expect(none.nextWake == t0 + 6 * 3600)
        // A reload keeps a name's state, drops removed ones, starts new ones from now.
        #expect(book.configure(["h": try settings("30 * * * *"), "d": try settings("@daily")], saved: [:], now: t0 + 3700).isEmpty)
        #expect(book.entries.keys.sorted() == ["d", "h"])
        #expect(book.entries["h"]?.next == t0 + 5400)
        #expect(ScheduleBook.jobID("nightly", t0 + 7200) == "nightly-20261129T0200Z")
    }
}
