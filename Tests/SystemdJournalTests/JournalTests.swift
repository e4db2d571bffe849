// The journal's entries (Journal.swift, SPEC §4): a MESSAGE_ID per event and state, each in the catalog, and the
// field names journald takes.

import Foundation
import Testing
@testable import SystemdJournal

@Suite struct JournalTests {
    @Test func catalogHasEveryMessageID() throws {
        // The clone's root: two folders above this file's (Tests/SystemdJournalTests).
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let catalog = try String(contentsOf: root.appendingPathComponent("systemd/opqueued.catalog"), encoding: .utf8)
        var ids = Set<String>()
        for pair in MessageIDs.pairs {
            let id = MessageIDs.id(event: pair.event, state: pair.state)
            #expect(id.count == 32 && id.allSatisfy { $0.isHexDigit && !$0.isUppercase })
            #expect(catalog.contains("-- \(id)\nSubject: opqueued \(pair.event) \(pair.state)\n"), "\(pair)")
            ids.insert(id)
        }
        #expect(ids.count == MessageIDs.pairs.count)
    }

    @Test func journalFieldNames() {
        #expect(journalFieldName("OPQ_JOB") == "OPQ_JOB")
        #expect(journalFieldName("opq_job") == "OPQ_JOB")
        #expect(journalFieldName("bad-name") == nil)
        #expect(journalFieldName("_TRUSTED") == nil)
    }
}
