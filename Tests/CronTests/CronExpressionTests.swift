// Parsing cron expressions: what each field expands to, and the exact message for each kind of mistake.

import Testing
@testable import Cron

/// The fields' sets as "minutes | hours | days | months | weekdays", a full field as "*".
func expanded(_ e: CronExpression) -> String {
    func list(_ mask: UInt64, _ range: ClosedRange<Int>) -> String {
        let values = range.filter { mask & (1 << UInt64($0)) != 0 }
        return values.count == range.count ? "*" : values.map(String.init).joined(separator: ",")
    }
    return [list(e.minutes, 0...59), list(e.hours, 0...23), list(e.days, 1...31), list(e.months, 1...12),
            list(e.weekdays, 0...6)].joined(separator: " | ")
}

@Suite struct CronExpressionTests {
    static let validTable: [(text: String, expanded: String)] = [
        ("* * * * *", "* | * | * | * | *"),
        ("*/15 * * * *", "0,15,30,45 | * | * | * | *"),
        ("0 2 * * *", "0 | 2 | * | * | *"),
        ("1-5/2 * * * *", "1,3,5 | * | * | * | *"),
        ("5-59/20 * * * *", "5,25,45 | * | * | * | *"),
        ("0-59/59 * * * *", "0,59 | * | * | * | *"),
        ("0,30 9-17 * * mon-fri", "0,30 | 9,10,11,12,13,14,15,16,17 | * | * | 1,2,3,4,5"),
        ("0 0 1 jan,JUL *", "0 | 0 | 1 | 1,7 | *"),
        ("0 12 * Feb-apr/2 *", "0 | 12 | * | 2,4 | *"),
        ("0 0 */10 * *", "0 | 0 | 1,11,21,31 | * | *"),
        ("0 0 13 * 5", "0 | 0 | 13 | * | 5"),
        ("0 0 31 2 1", "0 | 0 | 31 | 2 | 1"),   // both day fields given: Mondays of February match
        ("0 0 29 2 *", "0 | 0 | 29 | 2 | *"),
        ("0 0 * * 7", "0 | 0 | * | * | 0"),
        ("0 0 * * 0", "0 | 0 | * | * | 0"),
        ("0 0 * * SUN", "0 | 0 | * | * | 0"),
        ("0 0 * * 5-7", "0 | 0 | * | * | 0,5,6"),
        ("0 0 * * fri-7", "0 | 0 | * | * | 0,5,6"),
        ("0 0 * * */2", "0 | 0 | * | * | 0,2,4,6"),
        ("59 23 31 12 6", "59 | 23 | 31 | 12 | 6"),
        ("0 0 1,15 * 1", "0 | 0 | 1,15 | * | 1"),
        ("7 */6 * * *", "7 | 0,6,12,18 | * | * | *"),
        ("@yearly", "0 | 0 | 1 | 1 | *"),
        ("@annually", "0 | 0 | 1 | 1 | *"),
        ("@monthly", "0 | 0 | 1 | * | *"),
        ("@weekly", "0 | 0 | * | * | 0"),
        ("@daily", "0 | 0 | * | * | *"),
        ("@midnight", "0 | 0 | * | * | *"),
        ("@hourly", "0 | * | * | * | *"),
        ("@Daily", "0 | 0 | * | * | *"),
        ("  0\t2 *  * *  ", "0 | 2 | * | * | *"),
    ]

    @Test(arguments: validTable)
    func parses(_ row: (text: String, expanded: String)) throws {
        #expect(expanded(try CronExpression(row.text)) == row.expanded)
    }

    @Test func descriptionIsTheFieldsAsWritten() throws {
        #expect(try CronExpression("  0\t2 *  * *  ").description == "0 2 * * *")
        #expect(try CronExpression("@weekly").description == "@weekly")
    }

    static let invalidTable: [(text: String, error: String)] = [
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("* * * *", "expected 5 fields (minute hour day-of-month month day-of-week), found 4"),
        ("* * * * * *", "expected 5 fields (minute hour day-of-month month day-of-week), found 6"),
        ("61 * * * *", "minute field: 61 is out of range 0-59"),
        ("60 * * * *", "minute field: 60 is out of range 0-59"),
        ("0 24 * * *", "hour field: 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month field: 0 is out of range 1-31"),
        ("0 0 32 * *", "day-of-month field: 32 is out of range 1-31"),
        ("0 0 * 13 *", "month field: 13 is out of range 1-12"),
        ("0 0 * 0 *", "month field: 0 is out of range 1-12"),
        ("0 0 * * 8", "day-of-week field: 8 is out of range 0-7"),
        ("0 1-25 * * *", "hour field: 25 is out of range 0-23"),
        ("99999999999999999999 * * * *", "minute field: 99999999999999999999 is out of range 0-59"),
        ("*/0 * * * *", "minute field: step 0 in '*/0' is out of range 1-59"),
        ("0 */24 * * *", "hour field: step 24 in '*/24' is out of range 1-23"),
        ("0 0 1-5/0 * *", "day-of-month field: step 0 in '1-5/0' is out of range 1-30"),
        ("*/x * * * *", "minute field: step 'x' in '*/x' is not a number"),
        ("*/ * * * *", "minute field: step '' in '*/' is not a number"),
        ("1/2/3 * * * *", "minute field: '1/2/3' has more than one step"),
        ("5/20 * * * *", "minute field: '5/20' has a step but no range (write 5-59/20 or */20)"),
        ("0 0 * mar/2 *", "month field: 'mar/2' has a step but no range (write mar-12/2 or */2)"),
        ("0 5-2 * * *", "hour field: range 5-2 is reversed"),
        ("0 0 * * fri-mon", "day-of-week field: range fri-mon is reversed"),
        ("0 0 * * fri-sun", "day-of-week field: range fri-sun is reversed"),   // sun is 0, as for Vixie; fri-7 works
        ("0 0 * dec-jan *", "month field: range dec-jan is reversed"),
        ("0 0 * foo *", "month field: 'foo' is not a number or a month name (jan-dec)"),
        ("0 0 * jan-foo *", "month field: 'foo' is not a number or a month name (jan-dec)"),
        ("0 0 * * sunday", "day-of-week field: 'sunday' is not a number or a day name (sun-sat)"),
        ("0 0 * * jan", "day-of-week field: 'jan' is not a number or a day name (sun-sat)"),
        ("x * * * *", "minute field: 'x' is not a number"),
        ("0 0 mon * *", "day-of-month field: 'mon' is not a number"),
        ("1,,2 * * * *", "minute field: empty item in '1,,2'"),
        ("1, * * * *", "minute field: empty item in '1,'"),
        ("-5 * * * *", "minute field: '-5' is not a value or a range"),
        ("1-2-3 * * * *", "minute field: '1-2-3' is not a value or a range"),
        ("@reboot", "unknown macro '@reboot' (@yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"),
        ("@daily 5", "unexpected '5' after @daily"),
        // A date no month of the list has never comes, unless a day of the week may match instead.
        ("0 0 30 2 *", "day-of-month '30' never falls in month '2': the expression never matches"),
        ("0 0 31 4,6,9,11 *", "day-of-month '31' never falls in month '4,6,9,11': the expression never matches"),
        ("0 0 30-31 feb */2", "day-of-month '30-31' never falls in month 'feb': the expression never matches"),
    ]

    @Test(arguments: invalidTable)
    func refuses(_ row: (text: String, error: String)) {
        #expect(throws: CronError(row.error)) { try CronExpression(row.text) }
    }

    /// Vixie's wildcard jobs (minute or hour begins with `*`) follow elapsed time across DST changes.
    static let wildcardTable: [(text: String, followsElapsedTime: Bool)] = [
        ("0 2 * * *", false), ("30 2 * * *", false), ("0,30 1-3 * * *", false), ("0 1-23/2 * * *", false),
        ("@daily", false), ("@weekly", false), ("*/15 * * * *", true), ("30 * * * *", true), ("* 2 * * *", true),
        ("0 */2 * * *", true), ("@hourly", true),
    ]

    @Test(arguments: wildcardTable)
    func wildcardJobs(_ row: (text: String, followsElapsedTime: Bool)) throws {
        #expect(try CronExpression(row.text).followsElapsedTime == row.followsElapsedTime)
    }
}
