// Cron's five fields, parsed as Vixie cron (ISC cron 4.1, cronie) reads them: minute (0-59), hour (0-23),
// day of month (1-31), month (1-12 or jan-dec) and day of week (0-7 or sun-sat, 0 and 7 both Sunday). Each field
// is a comma list of `N`, `N-M` and `*`, the last two optionally with a step `/S`. `N/S` is refused, as cronie
// refuses it (Vixie cron silently reads it as `N`, other parsers as `N-max/S`): the message says what to write.
// Names are three letters, in any case. The macros @yearly (@annually), @monthly, @weekly, @daily (@midnight) and
// @hourly stand for their five fields; @reboot is not a time and is refused.
//
// Two Vixie rules beyond the bits, both decided by whether a field's text begins with `*` (so `*/2` counts as `*`):
// the day matches when day of month AND day of week match if either begins with `*`, and when either matches
// otherwise (`0 0 13 * 5`: every 13th and every Friday); and the DST handling in CronSchedule.swift tells a job
// whose minute or hour begins with `*` from a fixed-time one.

/// A cron expression that cannot be parsed: the description names the field and the bad value.
public struct CronError: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String

    init(_ description: String) {
        self.description = description
    }
}

/// A parsed cron expression: the set of wall-clock minutes it matches.
public struct CronExpression: Sendable, Equatable, CustomStringConvertible {
    /// The expression as written, its fields separated by one space.
    public let description: String
    /// Bit n set: n matches. Minutes 0-59, hours 0-23, days of month 1-31, months 1-12, days of week 0-6 (Sunday 0).
    var minutes: UInt64 = 0
    var hours: UInt64 = 0
    var days: UInt64 = 0
    var months: UInt64 = 0
    var weekdays: UInt64 = 0
    /// Whether each field's text begins with `*` (Vixie's MIN_STAR, HR_STAR, DOM_STAR, DOW_STAR).
    var minuteStar = false
    var hourStar = false
    var dayStar = false
    var weekdayStar = false

    public init(_ text: String) throws(CronError) {
        let words = text.split(whereSeparator: \.isWhitespace)
        description = words.joined(separator: " ")
        guard let first = words.first else { throw CronError("empty expression") }
        var fields = words
        if first.hasPrefix("@") {
            guard words.count == 1 else { throw CronError("unexpected '\(words[1])' after \(first)") }
            guard let expansion = CronExpression.macros[first.lowercased()] else {
                throw CronError("unknown macro '\(first)' (@yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)")
            }
            fields = expansion.split(separator: " ")
        }
        guard fields.count == 5 else {
            throw CronError("expected 5 fields (minute hour day-of-month month day-of-week), found \(fields.count)")
        }
        minutes = try Field.minute.parse(fields[0])
        hours = try Field.hour.parse(fields[1])
        days = try Field.dayOfMonth.parse(fields[2])
        months = try Field.month.parse(fields[3])
        weekdays = try Field.dayOfWeek.parse(fields[4])
        if weekdays & (1 << 7) != 0 { weekdays = weekdays & ~(1 << 7) | 1 }   // 7 is Sunday too
        minuteStar = fields[0].hasPrefix("*")
        hourStar = fields[1].hasPrefix("*")
        dayStar = fields[2].hasPrefix("*")
        weekdayStar = fields[4].hasPrefix("*")
        // With `*` in either day field a day must pass both, so a day-of-month no month of the list has (31 in
        // February, April, June, September, November) never comes: refused rather than silently never run.
        let longest = [0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        if (dayStar || weekdayStar), !(1...12).contains(where: { months & (1 << $0) != 0 && days & ((2 << longest[$0]) - 2) != 0 }) {
            throw CronError("day-of-month '\(fields[2])' never falls in month '\(fields[3])': the expression never matches")
        }
    }

    static let macros: [String: String] = [
        "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
        "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
    ]
}

/// One of the five fields: its name in messages, its range and its names.
struct Field: Sendable {
    let name: String
    let low: Int
    let high: Int
    /// Names for low, low + 1, … (months from 1, days of week from 0).
    let names: [String]
    /// What the names are, for messages.
    let nameKind: String

    static let minute = Field(name: "minute", low: 0, high: 59, names: [], nameKind: "")
    static let hour = Field(name: "hour", low: 0, high: 23, names: [], nameKind: "")
    static let dayOfMonth = Field(name: "day-of-month", low: 1, high: 31, names: [], nameKind: "")
    static let month = Field(name: "month", low: 1, high: 12, names: [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ], nameKind: "a month name (jan-dec)")
    static let dayOfWeek = Field(name: "day-of-week", low: 0, high: 7, names: ["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
                                 nameKind: "a day name (sun-sat)")

    /// The field's comma list as a bit set.
    func parse(_ text: Substring) throws(CronError) -> UInt64 {
        var mask: UInt64 = 0
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            guard !item.isEmpty else { throw error("empty item in '\(text)'") }
            mask |= try parseItem(item)
        }
        return mask
    }

    /// `N`, or `N-M` or `*` with an optional step `/S`.
    private func parseItem(_ item: Substring) throws(CronError) -> UInt64 {
        let parts = item.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count <= 2 else { throw error("'\(item)' has more than one step") }
        let base = parts[0]
        var first = low, last = high
        if base != "*" {
            let ends = base.split(separator: "-", omittingEmptySubsequences: false)
            guard ends.count <= 2, !ends.contains(where: \.isEmpty) else { throw error("'\(item)' is not a value or a range") }
            guard ends.count == 2 || parts.count == 1 else {
                throw error("'\(item)' has a step but no range (write \(base)-\(high)/\(parts[1]) or */\(parts[1]))")
            }
            first = try value(ends[0])
            last = ends.count == 2 ? try value(ends[1]) : first
            guard first <= last else { throw error("range \(base) is reversed") }
        }
        var step = 1
        if parts.count == 2 {
            let maxStep = high - low
            guard !parts[1].isEmpty, parts[1].allSatisfy(\.isASCIIDigit) else {
                throw error("step '\(parts[1])' in '\(item)' is not a number")
            }
            step = Int(parts[1]) ?? Int.max
            guard step >= 1 && step <= maxStep else { throw error("step \(parts[1]) in '\(item)' is out of range 1-\(maxStep)") }
        }
        var mask: UInt64 = 0
        for v in stride(from: first, through: last, by: step) { mask |= 1 << UInt64(v) }
        return mask
    }

    /// A number in range, or a name.
    private func value(_ token: Substring) throws(CronError) -> Int {
        if token.allSatisfy(\.isASCIIDigit) {
            let v = Int(token) ?? Int.max
            guard v >= low && v <= high else { throw error("\(token) is out of range \(low)-\(high)") }
            return v
        }
        if let index = names.firstIndex(of: token.lowercased()) { return index + low }
        throw error(names.isEmpty ? "'\(token)' is not a number" : "'\(token)' is not a number or \(nameKind)")
    }

    private func error(_ message: String) -> CronError {
        CronError("\(name) field: \(message)")
    }
}

extension Character {
    var isASCIIDigit: Bool { asciiValue.map { (48...57).contains($0) } ?? false }
}
