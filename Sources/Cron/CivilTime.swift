// Calendar arithmetic on the proleptic Gregorian calendar, counted in whole days since 1970-01-01, which the zone
// rules and the cron search share. A "wall" time is a local date and time counted like an epoch time: days since
// 1970-01-01 times 86,400 plus the seconds of the day, so a zone turns UTC into wall time by adding its offset.
// The conversions are Howard Hinnant's days_from_civil and civil_from_days (chrono-compatible low-level date
// algorithms): exact, branch-light, and right for negative years too.

/// A date and time as a clock on the wall reads it in some zone.
public struct LocalDateTime: Sendable, Hashable, CustomStringConvertible {
    public var year: Int
    /// 1 to 12.
    public var month: Int
    /// 1 to 31.
    public var day: Int
    public var hour: Int
    public var minute: Int
    public var second: Int

    public init(year: Int, month: Int, day: Int, hour: Int = 0, minute: Int = 0, second: Int = 0) {
        self.year = year
        self.month = month
        self.day = day
        self.hour = hour
        self.minute = minute
        self.second = second
    }

    /// `2026-03-29 02:00:00`.
    public var description: String {
        "\(padded(year, 4))-\(padded(month, 2))-\(padded(day, 2)) \(padded(hour, 2)):\(padded(minute, 2)):\(padded(second, 2))"
    }

    /// Whether every field is in range (the day for its month and year).
    var isValid: Bool {
        (1...12).contains(month) && day >= 1 && day <= Civil.monthLength(year: Int64(year), month: month)
            && (0...23).contains(hour) && (0...59).contains(minute) && (0...59).contains(second)
    }

    /// Seconds since 1970-01-01 00:00:00 of this date and time on the wall.
    var wallSeconds: Int64 {
        Civil.days(year: Int64(year), month: month, day: day) * 86_400 + Int64(hour * 3600 + minute * 60 + second)
    }

    init(wallSeconds: Int64) {
        let days = floorDiv(wallSeconds, 86_400)
        let date = Civil.date(days: days)
        let seconds = Int(wallSeconds - days * 86_400)
        self.init(year: Int(date.year), month: date.month, day: date.day,
                  hour: seconds / 3600, minute: seconds / 60 % 60, second: seconds % 60)
    }
}

enum Civil {
    /// Days since 1970-01-01 of a date (month 1-12).
    static func days(year: Int64, month: Int, day: Int) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = floorDiv(y, 400)
        let yearOfEra = y - era * 400
        let shiftedMonth = Int64(month > 2 ? month - 3 : month + 9)
        let dayOfYear = (153 * shiftedMonth + 2) / 5 + Int64(day) - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// The date of a count of days since 1970-01-01.
    static func date(days: Int64) -> (year: Int64, month: Int, day: Int) {
        let z = days + 719_468
        let era = floorDiv(z, 146_097)
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let shiftedMonth = (5 * dayOfYear + 2) / 153
        let day = Int(dayOfYear - (153 * shiftedMonth + 2) / 5 + 1)
        let month = Int(shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9)
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }

    /// 0 for Sunday to 6 for Saturday (1970-01-01 was a Thursday).
    static func weekday(days: Int64) -> Int {
        Int(floorMod(days + 4, 7))
    }

    static func isLeap(_ year: Int64) -> Bool {
        year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
    }

    static func monthLength(year: Int64, month: Int) -> Int {
        switch month {
        case 2: isLeap(year) ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }
}

func floorDiv(_ a: Int64, _ b: Int64) -> Int64 {
    let q = a / b
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q
}

func floorMod(_ a: Int64, _ b: Int64) -> Int64 {
    a - floorDiv(a, b) * b
}

func ceilDiv(_ a: Int64, _ b: Int64) -> Int64 {
    -floorDiv(-a, b)
}

/// `value` in decimal with leading zeros to `width` digits (a minus sign first if negative).
func padded(_ value: Int, _ width: Int) -> String {
    let digits = String(value.magnitude)
    let zeros = String(repeating: "0", count: max(0, width - digits.count))
    return (value < 0 ? "-" : "") + zeros + digits
}
