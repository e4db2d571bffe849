// The `sleep` kind's timer: it fires once, and a cancelled one lets go of what it holds at once.

import Foundation
import Testing
@testable import OperationKinds

struct KindsTests {
    final class Held: @unchecked Sendable {
        let lock = NSLock()
        var fired = 0
        func fire() { lock.withLock { fired += 1 } }
        var count: Int { lock.withLock { fired } }
    }

    @Test func oneShotTimerFiresOnce() throws {
        let held = Held()
        _ = OneShotTimer(after: 0.02) { held.fire() }
        let deadline = Date().addingTimeInterval(5)
        while held.count == 0 && Date() < deadline { usleep(2_000) }
        usleep(50_000)
        #expect(held.count == 1)
    }

    @Test func aCancelledTimerReleasesItsHandlerAtOnce() throws {
        // A year-long sleep that is cancelled must not keep its context (and the input it holds) for a year.
        weak var watched: Held?
        var timer: OneShotTimer?
        do {
            let held = Held()
            watched = held
            timer = OneShotTimer(after: 31_536_000) { held.fire() }
        }
        #expect(watched != nil, "the pending timer holds its handler")
        timer?.cancel()
        timer = nil
        let deadline = Date().addingTimeInterval(5)
        while watched != nil && Date() < deadline { usleep(2_000) }
        #expect(watched == nil, "the cancelled timer still holds its handler")
    }
}
