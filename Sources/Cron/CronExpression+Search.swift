// The matching wall-clock minutes of an expression, found forward or backward within bounds. The search skips
// whole months and days that cannot match, then finds the hour and minute with bit scans, so its cost grows with
// the days it crosses, never with the minutes: a year of a monthly job's misses is twelve steps.

extension CronExpression {
    /// Vixie cron's "wildcard" job (its minute or hour field begins with `*`): it follows elapsed time across a
    /// daylight-saving change, where a fixed-time job runs once (CronSchedule.swift says how).
    var followsElapsedTime: Bool { minuteStar || hourStar }

    /// Whether the day `days` (since 1970-01-01) matches the month, day-of-month and day-of-week fields.
    func matchesDay(_ days: Int64) -> Bool {
        let date = Civil.date(days: days)
        guard months & (1 << UInt64(date.month)) != 0 else { return false }
        let dayMatches = self.days & (1 << UInt64(date.day)) != 0
        let weekdayMatches = weekdays & (1 << UInt64(Civil.weekday(days: days))) != 0
        return dayStar || weekdayStar ? dayMatches && weekdayMatches : dayMatches || weekdayMatches
    }

    /// Whether the wall-clock minute holding `wallSeconds` matches.
    func matches(wallSeconds: Int64) -> Bool {
        let minute = floorDiv(wallSeconds, 60)
        let day = floorDiv(minute, 1440)
        let minuteOfDay = Int(minute - day * 1440)
        return matchesDay(day) && hours & (1 << UInt64(minuteOfDay / 60)) != 0 && minutes & (1 << UInt64(minuteOfDay % 60)) != 0
    }

    /// The first matching wall minute (in wall seconds) at or after `low` and before `high`.
    func firstMatch(from low: Int64, before high: Int64) -> Int64? {
        var minute = ceilDiv(low, 60)
        let end = ceilDiv(high, 60)
        while minute < end {
            let day = floorDiv(minute, 1440)
            let date = Civil.date(days: day)
            if months & (1 << UInt64(date.month)) == 0 {
                let next = date.month == 12 ? (date.year + 1, 1) : (date.year, date.month + 1)
                minute = Civil.days(year: next.0, month: next.1, day: 1) * 1440
                continue
            }
            if matchesDay(day), let time = firstTime(fromMinuteOfDay: Int(minute - day * 1440)) {
                let found = day * 1440 + Int64(time)
                return found < end ? found * 60 : nil
            }
            minute = (day + 1) * 1440
        }
        return nil
    }

    /// The last matching wall minute (in wall seconds) at or before `high` and at or after `low`.
    func lastMatch(from low: Int64, through high: Int64) -> Int64? {
        var minute = floorDiv(high, 60)
        let start = ceilDiv(low, 60)
        while minute >= start {
            let day = floorDiv(minute, 1440)
            let date = Civil.date(days: day)
            if months & (1 << UInt64(date.month)) == 0 {
                minute = Civil.days(year: date.year, month: date.month, day: 1) * 1440 - 1
                continue
            }
            if matchesDay(day), let time = lastTime(throughMinuteOfDay: Int(minute - day * 1440)) {
                let found = day * 1440 + Int64(time)
                return found >= start ? found * 60 : nil
            }
            minute = day * 1440 - 1
        }
        return nil
    }

    /// The first matching minute of a matching day at or after `minuteOfDay`.
    private func firstTime(fromMinuteOfDay minuteOfDay: Int) -> Int? {
        var hour = minuteOfDay / 60, minute = minuteOfDay % 60
        while let h = nextBit(hours, from: hour) {
            if h != hour { minute = 0 }
            if let m = nextBit(minutes, from: minute) { return h * 60 + m }
            hour = h + 1
            minute = 0
        }
        return nil
    }

    /// The last matching minute of a matching day at or before `minuteOfDay`.
    private func lastTime(throughMinuteOfDay minuteOfDay: Int) -> Int? {
        var hour = minuteOfDay / 60, minute = minuteOfDay % 60
        while let h = lastBit(hours, through: hour) {
            if h != hour { minute = 59 }
            if let m = lastBit(minutes, through: minute) { return h * 60 + m }
            hour = h - 1
            minute = 59
        }
        return nil
    }
}

/// The lowest set bit of `mask` at or above `index`.
private func nextBit(_ mask: UInt64, from index: Int) -> Int? {
    guard index < 64 else { return nil }
    let rest = mask >> UInt64(index)
    return rest == 0 ? nil : index + rest.trailingZeroBitCount
}

/// The highest set bit of `mask` at or below `index`.
private func lastBit(_ mask: UInt64, through index: Int) -> Int? {
    guard index >= 0 else { return nil }
    let rest = index >= 63 ? mask : mask & ((1 << UInt64(index + 1)) - 1)
    return rest == 0 ? nil : 63 - rest.leadingZeroBitCount
}
