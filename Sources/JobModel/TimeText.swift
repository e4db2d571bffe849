// Times as people write and read them (SPEC §3.7 "Formats"): in, ISO 8601 with a zone or `@` and seconds since the
// epoch; out, the machine's zone (TZ, else /etc/localtime) with its offset. Inside, times are seconds since the Unix
// epoch, as reals, as result.plist has them.

#if canImport(Glibc)
import Glibc
#endif

public enum TimeText {
    /// The forms `parse` takes, for messages.
    public static let forms = "ISO 8601 with a zone (2026-11-28T02:00:00Z, 2026-11-28T03:00:00+01:00) or @ and seconds since the epoch "
        + "(@1764295200)"

    /// Seconds since the epoch of `2026-11-28T02:00:00Z`, `2026-11-28T03:00:00.250+01:00` (seconds optional, a
    /// fraction allowed; the zone `Z`, `±HH:MM`, `±HHMM` or `±HH` required) or `@1764295200.5`; nil for anything else.
    public static func parse(_ text: String) -> Double? {
        if text.hasPrefix("@") {
            let number = text.dropFirst()
            guard !number.isEmpty, number.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2E || $0 == 0x2D }) else { return nil }
            return Double(number).flatMap { $0.isFinite ? $0 : nil }
        }
        var scanner = Scanner(Array(text.utf8))
        guard let year = scanner.digits(4), scanner.take("-"), let month = scanner.digits(2), scanner.take("-"),
              let day = scanner.digits(2), scanner.take("T") || scanner.take("t"), let hour = scanner.digits(2), scanner.take(":"),
              let minute = scanner.digits(2) else { return nil }
        var second = 0.0
        if scanner.take(":") {
            guard let whole = scanner.digits(2) else { return nil }
            second = Double(whole)
            if scanner.take(".") || scanner.take(",") {
                var scale = 0.1, any = false
                while let digit = scanner.digits(1) {
                    second += Double(digit) * scale
                    scale /= 10
                    any = true
                }
                guard any else { return nil }
            }
        }
        guard let offset = scanner.zone(), scanner.atEnd, (1...12).contains(month), (1...daysIn(month, year)).contains(day),
              hour < 24, minute < 60, second < 61 else { return nil }
        let days = daysSinceEpoch(year, month, day)
        return Double(days * 86_400 + hour * 3_600 + minute * 60 - offset) + second
    }

    /// Epoch seconds as the journal's fields give them (`OPQ_NOT_BEFORE`): a real, to the microsecond.
    public static func epoch(_ seconds: Double) -> String { String(format: "%.6f", seconds) }

    /// `2026-11-28 03:00:00 +01:00`: the time in the machine's zone, to the second, with that zone's offset then.
    /// A time no calendar of localtime(3) holds (a result.plist is a user's file) is given as the number.
    public static func local(_ seconds: Double) -> String {
        guard seconds.isFinite, abs(seconds) < 1e15 else { return String(seconds) }
        var time = time_t(seconds.rounded(.down))
        var parts = tm()
        _ = Self.zoneRead
        guard localtime_r(&time, &parts) != nil else { return String(seconds) }
        let offset = abs(parts.tm_gmtoff)
        func pad(_ n: Int, _ width: Int = 2) -> String {
            let digits = String(n)
            return digits.count < width ? String(repeating: "0", count: width - digits.count) + digits : digits
        }
        return "\(pad(Int(parts.tm_year) + 1900, 4))-\(pad(Int(parts.tm_mon) + 1))-\(pad(Int(parts.tm_mday))) "
            + "\(pad(Int(parts.tm_hour))):\(pad(Int(parts.tm_min))):\(pad(Int(parts.tm_sec))) "
            + "\(parts.tm_gmtoff < 0 ? "-" : "+")\(pad(offset / 3_600)):\(pad(offset % 3_600 / 60))"
    }

    /// tzset(3) once: localtime_r is not required to read TZ itself.
    private static let zoneRead: Void = tzset()

    private static func daysIn(_ month: Int, _ year: Int) -> Int {
        switch month {
        case 2: (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    private static func daysSinceEpoch(_ year: Int, _ month: Int, _ day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        return era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
    }

    /// Reads an ISO 8601 time's parts.
    private struct Scanner {
        let bytes: [UInt8]
        var at = 0
        init(_ bytes: [UInt8]) { self.bytes = bytes }

        var atEnd: Bool { at == bytes.count }

        mutating func take(_ character: Character) -> Bool {
            guard at < bytes.count, let ascii = character.asciiValue, bytes[at] == ascii else { return false }
            at += 1
            return true
        }

        /// Exactly `count` decimal digits, as a number.
        mutating func digits(_ count: Int) -> Int? {
            guard at + count <= bytes.count else { return nil }
            var n = 0
            for byte in bytes[at..<(at + count)] {
                guard byte >= 0x30 && byte <= 0x39 else { return nil }
                n = n * 10 + Int(byte - 0x30)
            }
            at += count
            return n
        }

        /// `Z`, `±HH:MM`, `±HHMM` or `±HH`: the zone's offset east of UTC, in seconds.
        mutating func zone() -> Int? {
            if take("Z") || take("z") { return 0 }
            let sign: Int
            if take("+") { sign = 1 } else if take("-") { sign = -1 } else { return nil }
            guard let hours = digits(2), hours < 24 else { return nil }
            var minutes = 0
            if take(":") {
                guard let m = digits(2) else { return nil }
                minutes = m
            } else if let m = digits(2) {
                minutes = m
            }
            guard minutes < 60 else { return nil }
            return sign * (hours * 3_600 + minutes * 60)
        }
    }
}

/// Seconds for a message: whole ones as such, else one decimal.
package func formatSeconds(_ s: Double) -> String {
    s == s.rounded() ? String(Int(s)) : String(format: "%.1f", s)
}
