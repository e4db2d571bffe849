// The claim record a claim writes on active/<job>/ (Stores/ClaimRecord.swift): its compact form, what it keeps
// inside the inode, the property lists of earlier builds read back, and what it makes of garbage.

import Foundation
import Testing
@testable import Daemon
import PropertyList
import TestTraits

#if canImport(Glibc)
import Glibc
#endif

@Suite("Claim record", .onItsOwnExecutor)
struct ClaimRecordTests {
    let folder = NSTemporaryDirectory() + "opq-claim-record-\(UInt64.random(in: 1...UInt64.max))"

    @Test func everyFieldComesBackAsWritten() throws {
        let inbox = ClaimRecord(manifest: "IMG 2026-11-27 (1).plist", receivedAt: 1_795_759_235.383_400_7, requestedJob: "IMG")
        #expect(ClaimRecord(decoding: inbox.encoded) == inbox)
        #expect(ClaimRecord(decoding: inbox.encoded)?.claimedFromCluster == false)
        let origin = ClusterOrigin(fence: 9_007_199_254_740_993, submittedOn: "node-a", fromNode: "node-b")
        let cluster = ClaimRecord(manifest: "d1.plist", receivedAt: 0.1, requestedJob: nil, origin: origin)
        let read = try #require(ClaimRecord(decoding: cluster.encoded))
        #expect(read == cluster)
        #expect(read.origin == origin)
        #expect(read.receivedAt == 0.1, "the reception time exactly, not rounded")
        // The job.plist form (where the file system takes no user attributes) is a property list, and reads back too.
        for record in [inbox, cluster] {
            #expect((try? PropertyList.parse(record.propertyList))?.dictionary != nil)
            #expect(ClaimRecord(decoding: record.propertyList) == record)
        }
    }

    /// ext4's 256-byte inodes keep 60 bytes of this attribute's value; a record of usual names must fit, else each
    /// job costs a block of its own (the property list records of earlier builds were 98 and 150 bytes).
    @Test func aRecordOfUsualNamesStaysInsideTheInode() throws {
        let now = 1_795_759_235.383_400_7
        let inbox = ClaimRecord(manifest: "IMG_20261127_123456.plist", receivedAt: now)
        let cluster = ClaimRecord(manifest: "IMG_20261127.plist", receivedAt: now, requestedJob: nil,
                                  origin: ClusterOrigin(fence: 123_456, submittedOn: "node-a", fromNode: nil))
        #expect(inbox.encoded.count <= 60, "\(inbox.encoded.count) bytes")
        #expect(cluster.encoded.count <= 60, "\(cluster.encoded.count) bytes")

        // And on the file system these tests run on: a folder with the record uses no more blocks than one without.
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let spool = try Spool(root: folder + "/spool")
        for (name, record) in [("bare", nil), ("inbox", inbox), ("cluster", cluster)] as [(String, ClaimRecord?)] {
            #expect(mkdir(folder + "/" + name, 0o750) == 0)
            if let record { try spool.writeClaimRecord(record, on: folder + "/" + name) }
        }
        #expect(access(folder + "/inbox/job.plist", F_OK) != 0, "kept as the attribute on this file system")
        func blocks(_ name: String) -> Int { var st = stat(); return lstat(folder + "/" + name, &st) == 0 ? Int(st.st_blocks) : -1 }
        #expect(blocks("inbox") == blocks("bare"))
        #expect(blocks("cluster") == blocks("bare"))
        #expect(spool.readClaimRecord(folder + "/cluster") == cluster)
    }

    /// Spools written by earlier builds hold property lists (binary in the attribute, XML in a hand-made job.plist):
    /// read as before, so an upgrade resumes their jobs under the same names and origins.
    @Test func recordsOfEarlierBuildsAreReadBack() throws {
        let legacy = PlistBinaryWriter.document(.dictionary(PlistDictionary([
            "manifest": .string("old.plist"), "receivedAt": .real(1.5e9), "requestedJob": .string("old"),
            "claimedFrom": .string("cluster"), "fence": .integer(42), "submittedOn": .string("a"), "fromNode": .string("b"),
        ])))
        let read = try #require(ClaimRecord(decoding: legacy))
        #expect(read.manifest == "old.plist" && read.receivedAt == 1.5e9 && read.requestedJob == "old")
        #expect(read.origin == ClusterOrigin(fence: 42, submittedOn: "a", fromNode: "b"))
        let xml = try PropertyListSerialization.data(fromPropertyList: ["manifest": "x.plist", "receivedAt": 2.0e9], format: .xml,
                                                     options: 0)
        let fromXML = try #require(ClaimRecord(decoding: [UInt8](xml)))
        #expect(fromXML == ClaimRecord(manifest: "x.plist", receivedAt: 2.0e9))

        // Through recovery: a job folder left by an earlier build, its record in the attribute.
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let dir = spool.active + "/older"
        #expect(mkdir(dir, 0o750) == 0)
        #expect(spool.setJobAttribute(PlistBinaryWriter.document(.dictionary(PlistDictionary([
            "manifest": .string("photo shoot.plist"), "receivedAt": .real(1.7e9),
        ]))), on: dir))
        try Data("<plist><dict><key>operations</key><array/></dict></plist>".utf8).write(to: URL(fileURLWithPath: dir + "/manifest.plist"))
        let job = try #require(try spool.recover().jobs.first)
        #expect(job.id == "older" && job.manifestName == "photo shoot.plist" && job.receivedAt == 1.7e9)
    }

    /// A folder whose record is gone (copied without attributes) is dated by its modification time, the same at
    /// every start — in active/ and in active/.submissions/ alike — so that a cluster node submitting it keeps one
    /// submission key across a crash (a key with the restart's time inserted it once more).
    @Test func aFolderWithoutARecordIsDatedByTheFolder() throws {
        let spool = try Spool(root: folder)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let manifest = Data("<plist><dict><key>operations</key><array/></dict></plist>".utf8)
        let dated = 1_700_000_000.25
        var times = [timeval(tv_sec: 1_700_000_000, tv_usec: 250_000), timeval(tv_sec: 1_700_000_000, tv_usec: 250_000)]
        for dir in [spool.active + "/bare", spool.active + "/.submissions/moved"] {
            #expect(mkdir(spool.active + "/.submissions", 0o750) == 0 || errno == EEXIST)
            #expect(mkdir(dir, 0o750) == 0)
            try manifest.write(to: URL(fileURLWithPath: dir + "/manifest.plist"))
            #expect(utimes(dir, &times) == 0)
        }
        let recovered = try #require(try spool.recover().jobs.first)
        #expect(recovered.id == "bare" && recovered.receivedAt == dated)
        let pending = try #require(spool.pendingSubmissions().first)
        #expect(pending.job.id == "moved" && pending.job.receivedAt == dated)
        #expect(spool.pendingSubmissions().first?.job.receivedAt == dated, "the same at the next start")
    }

    /// What a careless hand or a torn write leaves: never a crash; a record that does not decode reads as absent.
    @Test func garbageReadsAsAbsentAndAFenceMarksAClusterClaimEvenUnreadable() {
        for bytes: [UInt8] in [[], Array("plain text".utf8), [0x6d, 0x3d, 0xff, 0xfe], Array("m=a\0\0r=1".utf8), Array("bplist00junk".utf8),
                               Array("<plist>".utf8), [0]] {
            #expect(ClaimRecord(decoding: bytes) == nil, "\(bytes)")
        }
        let unreadableFence = ClaimRecord(decoding: Array("m=a.plist\0f=twelve\0s=node-a".utf8))
        #expect(unreadableFence?.claimedFromCluster == true, "never taken for an inbox claim")
        #expect(unreadableFence?.origin == nil, "but no origin to resume under")
        #expect(ClaimRecord(decoding: Array("m=a.plist\0r=soon\0z=from a later build".utf8)) == ClaimRecord(manifest: "a.plist"),
                "a field that does not decode is missing; a key not known here is skipped")
    }
}
