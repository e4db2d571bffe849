// A POSIX TZ string, such as the footer of a TZif file that gives a zone's rule after its last listed transition:
// `CET-1CEST,M3.5.0,M10.5.0/3` (Europe/Paris), `EST5EDT,M3.2.0,M11.1.0` (America/New_York), `<+0330>-3:30`.
// Offsets count west of Greenwich, as POSIX writes them; they are stored east-positive like TZif's. A rule's day is
// `Mm.w.d` (weekday d, 0 = Sunday, of week w, 5 = last, of month m), `Jn` (1-365, February 29 never counted) or
// `n` (0-365); its time, 02:00 unless given after `/`, may be negative or up to 167 hours (RFC 8536 §3.3.1).

struct PosixTimeZone: Sendable, Equatable {
    struct Rule: Sendable, Equatable {
        enum Day: Sendable, Equatable {
            case julian(Int64)
            case zeroBased(Int64)
            case monthWeek(month: Int, week: Int, weekday: Int)
        }

        var day: Day
        /// Seconds after the day's local midnight, in the offset in effect before the change.
        var time: Int64

        /// The change in `year`, in UTC.
        func instant(year: Int64, offsetBefore: Int64) -> Int64 {
            let jan1 = Civil.days(year: year, month: 1, day: 1)
            let day: Int64
            switch self.day {
            case .julian(let n): day = jan1 + n - 1 + (Civil.isLeap(year) && n >= 60 ? 1 : 0)
            case .zeroBased(let n): day = jan1 + n
            case let .monthWeek(month, week, weekday):
                let first = Civil.days(year: year, month: month, day: 1)
                var d = first + floorMod(Int64(weekday - Civil.weekday(days: first)), 7) + Int64(week - 1) * 7
                if d >= first + Int64(Civil.monthLength(year: year, month: month)) { d -= 7 }
                day = d
            }
            return day * 86_400 + time - offsetBefore
        }
    }

    struct Daylight: Sendable, Equatable {
        var offset: Int64
        var start: Rule
        var end: Rule
    }

    var standardOffset: Int64
    var daylight: Daylight?

    /// Parses a TZ string; the error is the reason it is not one.
    init(_ text: String) throws(PosixError) {
        var s = PosixScanner(Array(text.utf8))
        try s.abbreviation()
        standardOffset = -(try s.time(maxHours: 24))
        if s.atEnd { return }
        try s.abbreviation()
        let offset = s.peek == UInt8(ascii: ",") ? standardOffset + 3600 : -(try s.time(maxHours: 24))
        guard s.take(",") else { throw PosixError("daylight saving time without its rules") }
        let start = try s.rule()
        guard s.take(",") else { throw PosixError("a ',' and the end of daylight saving time expected") }
        let end = try s.rule()
        guard s.atEnd else { throw PosixError("unexpected text after the rules") }
        daylight = Daylight(offset: offset, start: start, end: end)
    }

    /// The span of constant offset around `t`, from this year's, last year's and next years' changes.
    func period(containing t: Int64) -> Period {
        guard let daylight else { return Period(start: .min, end: .max, offset: standardOffset, previousOffset: standardOffset) }
        let year = Civil.date(days: floorDiv(t + standardOffset, 86_400)).year
        var changes: [(at: Int64, offset: Int64)] = []
        for y in year - 1...year + 2 {
            changes.append((daylight.start.instant(year: y, offsetBefore: standardOffset), daylight.offset))
            changes.append((daylight.end.instant(year: y, offsetBefore: daylight.offset), standardOffset))
        }
        changes = changes.indices.sorted { (changes[$0].at, $0) < (changes[$1].at, $1) }.map { changes[$0] }   // stable on ties
        guard let i = changes.lastIndex(where: { $0.at <= t }) else {
            let offset = changes[0].offset == standardOffset ? daylight.offset : standardOffset
            return Period(start: .min, end: changes[0].at, offset: offset, previousOffset: offset)
        }
        let previous = i > 0 ? changes[i - 1].offset : (changes[i].offset == standardOffset ? daylight.offset : standardOffset)
        let end = i + 1 < changes.count ? changes[i + 1].at : .max
        return Period(start: changes[i].at, end: end, offset: changes[i].offset, previousOffset: previous)
    }
}

struct PosixError: Error {
    let reason: String
    init(_ reason: String) { self.reason = reason }
}

/// A cursor over a TZ string's bytes.
private struct PosixScanner {
    let bytes: [UInt8]
    var index = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    var atEnd: Bool { index == bytes.count }
    var peek: UInt8? { index < bytes.count ? bytes[index] : nil }

    mutating func take(_ c: Unicode.Scalar) -> Bool {
        guard peek == UInt8(ascii: c) else { return false }
        index += 1
        return true
    }

    /// A zone abbreviation: three or more letters, or `<…>` around letters, digits and signs.
    mutating func abbreviation() throws(PosixError) {
        let begin = index
        if take("<") {
            while let c = peek, c != UInt8(ascii: ">") { index += 1 }
            guard take(">"), index - begin >= 5 else { throw PosixError("a zone abbreviation in <> is malformed") }
        } else {
            while let c = peek, (65...90).contains(c) || (97...122).contains(c) { index += 1 }
            guard index - begin >= 3 else { throw PosixError("a zone abbreviation of three letters or more expected") }
        }
    }

    /// `[+-]h[h…][:mm[:ss]]` in seconds, the hours at most `maxHours`.
    mutating func time(maxHours: Int64) throws(PosixError) -> Int64 {
        let sign: Int64 = take("-") ? -1 : 1
        if sign == 1 { _ = take("+") }
        let hours = try number(max: maxHours, what: "hours")
        var seconds = hours * 3600
        if take(":") {
            seconds += try number(max: 59, what: "minutes") * 60
            if take(":") { seconds += try number(max: 59, what: "seconds") }
        }
        return sign * seconds
    }

    /// `Mm.w.d`, `Jn` or `n`, then an optional `/time`.
    mutating func rule() throws(PosixError) -> PosixTimeZone.Rule {
        let day: PosixTimeZone.Rule.Day
        if take("M") {
            let month = try number(max: 12, what: "month")
            guard take("."), month >= 1 else { throw PosixError("Mm.w.d rule malformed") }
            let week = try number(max: 5, what: "week")
            guard take("."), week >= 1 else { throw PosixError("Mm.w.d rule malformed") }
            day = .monthWeek(month: Int(month), week: Int(week), weekday: Int(try number(max: 6, what: "weekday")))
        } else if take("J") {
            let n = try number(max: 365, what: "Julian day")
            guard n >= 1 else { throw PosixError("Julian day 0 is out of range 1-365") }
            day = .julian(n)
        } else {
            day = .zeroBased(try number(max: 365, what: "day of year"))
        }
        let time = take("/") ? try self.time(maxHours: 167) : 7200
        return PosixTimeZone.Rule(day: day, time: time)
    }

    /// Decimal digits, at most `max`.
    private mutating func number(max: Int64, what: String) throws(PosixError) -> Int64 {
        var value: Int64 = 0, digits = 0
        while let c = peek, (48...57).contains(c), digits < 4 {
            value = value * 10 + Int64(c - 48)
            digits += 1
            index += 1
        }
        guard digits > 0 else { throw PosixError("\(what) expected") }
        guard value <= max else { throw PosixError("\(what) \(value) is out of range 0-\(max)") }
        return value
    }
}
