// Schedules (SPEC §3.7) as a pure core: which occurrences are due, given the configuration, the clock (passed in)
// and what was handled before a restart. No I/O: the shell submits each occurrence and keeps `since` on disk.
//
// Each schedule's `since` is the instant up to which its occurrences are handled: when it was first seen (a new
// schedule, or one added by a reload, starts from then), else its last check that submitted one. At start, with
// `catchUp = latest`, the latest occurrence in (since, now] is due once; with `none`, missed ones are let go.

import Cron

package struct ScheduleBook: Sendable {
    package struct Entry: Sendable, Equatable {
        package var settings: ScheduleSettings
        package var since: Int64
        package var next: Int64?
    }

    package private(set) var entries: [String: Entry] = [:]
    /// When the shell's one wake-up is planned, if it is.
    package var plannedWake: Double?

    /// Takes the configuration's schedules at `now`: names kept keep their `since`; a name not seen before takes
    /// `saved` (what a previous run handled), else now. Returns the occurrences due at once (catch-up).
    package init() {}

    package mutating func configure(_ schedules: [String: ScheduleSettings], saved: [String: Int64],
                                    now: Int64) -> [(name: String, at: Int64)] {
        var fresh: [String: Entry] = [:]
        for (name, settings) in schedules {
            let since = entries[name]?.since ?? saved[name] ?? now
            fresh[name] = Entry(settings: settings, since: settings.catchUpLatest ? since : max(since, now), next: nil)
        }
        entries = fresh
        return due(now: now)
    }

    /// The occurrences due at `now` (at most one per schedule: the latest in (since, now]); each schedule's `since`
    /// moves to now and its `next` is computed.
    package mutating func due(now: Int64) -> [(name: String, at: Int64)] {
        var due: [(name: String, at: Int64)] = []
        for name in entries.keys.sorted() {
            guard var entry = entries[name] else { continue }
            if entry.since < now, let at = entry.settings.cron.latest(atOrBefore: now, notBefore: entry.since) {
                due.append((name, at))
            }
            entry.since = max(entry.since, now)
            entry.next = entry.settings.cron.next(after: entry.since)
            entries[name] = entry
        }
        return due
    }

    /// The earliest next occurrence of any schedule.
    package var nextWake: Int64? { entries.values.compactMap(\.next).min() }

    /// The job id of an occurrence: `NAME-YYYYMMDDTHHMMZ`.
    package static func jobID(_ name: String, _ at: Int64) -> String { name + "-" + CronSchedule.jobIDSuffix(at) }
}
