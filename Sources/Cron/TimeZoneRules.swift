// A time zone's UTC offsets over time: the transitions listed in its TZif file (RFC 8536) and, after the last of
// them, the POSIX TZ rule in the file's footer. The zone is seen as a sequence of periods of constant offset; the
// cron search walks them, and a period's start, with the offsets on either side, is where a daylight-saving gap
// (the offset grows) or overlap (it shrinks) happens.

/// A zone that cannot be used: unknown, refused, unreadable or malformed.
public struct TimeZoneError: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String

    init(_ description: String) {
        self.description = description
    }
}

/// A zone's UTC offsets over time.
public struct TimeZoneRules: Sendable, Equatable {
    /// The zone's name (`Europe/Paris`, `UTC`), or the TZ string or path it came from.
    public let name: String
    /// Instants (UTC seconds, ascending) at which the offset changes, and the offset (seconds east of UTC) from each.
    var transitions: [Int64]
    var offsets: [Int64]
    /// The offset before the first transition (or always, with neither transitions nor footer).
    var initialOffset: Int64
    /// The rule after the last transition.
    var footer: PosixTimeZone?

    /// Coordinated Universal Time.
    public static let utc = TimeZoneRules(name: "UTC", transitions: [], offsets: [], initialOffset: 0, footer: nil)

    init(name: String, transitions: [Int64], offsets: [Int64], initialOffset: Int64, footer: PosixTimeZone?) {
        self.name = name
        self.transitions = transitions
        self.offsets = offsets
        self.initialOffset = initialOffset
        self.footer = footer
    }

    /// The offset from UTC, in seconds east, in effect at `utcSeconds`.
    public func offset(at utcSeconds: Int64) -> Int32 {
        Int32(period(containing: utcSeconds).offset)
    }

    /// The wall-clock date and time at `utcSeconds`.
    public func localDateTime(at utcSeconds: Int64) -> LocalDateTime {
        let t = TimeZoneRules.clamped(utcSeconds)
        return LocalDateTime(wallSeconds: t + period(containing: t).offset)
    }

    /// Every UTC instant at which the wall clock reads `local`, in order: none in a gap (the clock skipped it), two
    /// in an overlap (it read it twice), one otherwise; none for an invalid date or time.
    public func instants(for local: LocalDateTime) -> [Int64] {
        guard (-999_999...999_999).contains(local.year), local.isValid else { return [] }
        let wall = local.wallSeconds
        var result: [Int64] = []
        // Offsets are within ±26 hours, so any instant with this wall time lies within two days of it.
        var p = period(containing: wall - 2 * 86_400)
        while true {
            let t = wall - p.offset
            if t >= p.start && t < p.end { result.append(t) }
            if p.end > wall + 2 * 86_400 { return result }
            p = period(containing: p.end)
        }
    }

    /// The period of constant offset holding `t`, and the offset just before it.
    func period(containing t: Int64) -> Period {
        let t = TimeZoneRules.clamped(t)
        var low = 0, high = transitions.count   // the first transition after t is at `low` when they meet
        while low < high {
            let middle = (low + high) / 2
            if transitions[middle] <= t { low = middle + 1 } else { high = middle }
        }
        let i = low - 1   // the last transition at or before t, or -1
        let count = transitions.count
        if i == count - 1, let footer {
            var p = footer.period(containing: t)
            if count > 0 && p.start <= transitions[count - 1] {   // the table's last transition starts this period
                p.start = transitions[count - 1]
                p.previousOffset = count > 1 ? offsets[count - 2] : initialOffset
            }
            return p
        }
        guard i >= 0 else {
            return Period(start: .min, end: count > 0 ? transitions[0] : .max, offset: initialOffset, previousOffset: initialOffset)
        }
        return Period(start: transitions[i], end: i + 1 < count ? transitions[i + 1] : .max, offset: offsets[i],
                      previousOffset: i > 0 ? offsets[i - 1] : initialOffset)
    }

    /// Times are kept within about 4 million years of 1970, where no arithmetic here can overflow.
    static func clamped(_ t: Int64) -> Int64 {
        min(max(t, -(1 << 47)), 1 << 47)
    }

    /// The instants a search may start from: half the clamped range, so that no search reaches where clamping would
    /// stop it from moving on.
    static let searchable: ClosedRange<Int64> = -(1 << 46)...(1 << 46)
}

/// A span of UTC instants [start, end) with one offset; `previousOffset` is the offset just before `start` (equal
/// to `offset` when nothing is known before it).
struct Period: Equatable {
    var start: Int64
    var end: Int64
    var offset: Int64
    var previousOffset: Int64
}
