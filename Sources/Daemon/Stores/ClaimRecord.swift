// The claim record: what a claim writes on active/<job>/ beside the manifest (inbox name, reception time, the id asked
// for, and for a job claimed from the cluster its origin), kept as the folder's `user.opqueued.job` attribute, or as
// a job.plist file in it where the file system takes no user attributes (a property list, as its name says).
//
// The attribute is written compact: `key=value` entries separated by NUL bytes, one-letter keys —
//   m  the inbox name            r  the reception time (seconds since 1970, shortest exact decimal)
//   q  the id asked for, when a collision renamed the job
//   f  the fence of a job claimed from the cluster (the key marks such a claim even when its value is unreadable)
//   s  the node it was submitted on          n  the node it was claimed from (lost or handed back there)
// so that a record of usual names stays within the inode: ext4's 256-byte inodes hold 60 bytes of this attribute's
// value; more takes a block of its own, written with the folder and freed with it. A property list record was
// 100–150 bytes, and that block cost a job 15–20 µs of CPU and 4 KiB more at every commit.
// Read back, both forms are taken: the compact one, and the property list (binary or XML) that earlier builds wrote
// and a hand-made job.plist holds. Nothing read back is trusted: a record that does not decode reads as absent, a
// field that does not decode as missing, and keys not known here are skipped.

import Foundation
import PropertyList

struct ClaimRecord: Equatable {
    var manifest: String?
    var receivedAt: Double?
    var requestedJob: String?
    /// Claimed from the cluster (SPEC §8): written with its fence; true even when the fence does not decode, so that
    /// recovery never takes such a folder for an inbox claim and submits it again.
    var claimedFromCluster = false
    var fence: Int64?
    var submittedOn: String?
    var fromNode: String?

    /// The record of a job claimed from the cluster.
    init(manifest: String, receivedAt: Double, requestedJob: String?, origin: ClusterOrigin) {
        self.init(manifest: manifest, receivedAt: receivedAt, requestedJob: requestedJob)
        claimedFromCluster = true
        fence = origin.fence
        submittedOn = origin.submittedOn
        fromNode = origin.fromNode
    }

    init(manifest: String? = nil, receivedAt: Double? = nil, requestedJob: String? = nil) {
        self.manifest = manifest
        self.receivedAt = receivedAt
        self.requestedJob = requestedJob
    }

    /// The origin of a job claimed from the cluster, when the record says it whole.
    var origin: ClusterOrigin? {
        guard claimedFromCluster, let fence, let submittedOn else { return nil }
        return ClusterOrigin(fence: fence, submittedOn: submittedOn, fromNode: fromNode)
    }

    /// The compact form (see the top of this file).
    var encoded: [UInt8] {
        var entries: [(UInt8, String)] = []
        if let manifest { entries.append((UInt8(ascii: "m"), manifest)) }
        if let receivedAt { entries.append((UInt8(ascii: "r"), receivedAt.description)) }
        if let requestedJob { entries.append((UInt8(ascii: "q"), requestedJob)) }
        if claimedFromCluster { entries.append((UInt8(ascii: "f"), fence.map { String($0) } ?? "")) }
        if let submittedOn { entries.append((UInt8(ascii: "s"), submittedOn)) }
        if let fromNode { entries.append((UInt8(ascii: "n"), fromNode)) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(entries.reduce(0) { $0 + 3 + $1.1.utf8.count })
        for (key, value) in entries {
            if !bytes.isEmpty { bytes.append(0) }
            bytes.append(key)
            bytes.append(UInt8(ascii: "="))
            // A NUL cannot be in a file name or a node name; one in any other value would end the entry early.
            bytes.append(contentsOf: value.utf8.prefix { $0 != 0 })
        }
        return bytes
    }

    /// The property-list form (binary), for a job.plist file: where the record is a file, its size does not matter,
    /// and a file of that name holds what its name says.
    var propertyList: [UInt8] {
        var dictionary = PlistDictionary([:])
        if let manifest { dictionary["manifest"] = .string(manifest) }
        if let receivedAt { dictionary["receivedAt"] = .real(receivedAt) }
        if let requestedJob { dictionary["requestedJob"] = .string(requestedJob) }
        if claimedFromCluster { dictionary["claimedFrom"] = .string("cluster") }
        if let fence { dictionary["fence"] = .integer(Int(fence)) }
        if let submittedOn { dictionary["submittedOn"] = .string(submittedOn) }
        if let fromNode { dictionary["fromNode"] = .string(fromNode) }
        return PlistBinaryWriter.document(.dictionary(dictionary))
    }

    /// A record read back, in either form; nil if it decodes as neither.
    init?(decoding bytes: [UInt8]) {
        self.init()
        if bytes.first == UInt8(ascii: "<") || bytes.starts(with: Array("bplist".utf8)) {
            guard let dictionary = (try? PropertyList.parse(bytes))?.dictionary else { return nil }
            manifest = dictionary["manifest"]?.string
            receivedAt = dictionary["receivedAt"]?.real
            requestedJob = dictionary["requestedJob"]?.string
            claimedFromCluster = dictionary["claimedFrom"]?.string == "cluster"
            if case .integer(let value)? = dictionary["fence"] { fence = Int64(value) }
            submittedOn = dictionary["submittedOn"]?.string
            fromNode = dictionary["fromNode"]?.string
            return
        }
        guard !bytes.isEmpty else { return nil }
        for entry in bytes.split(separator: 0, omittingEmptySubsequences: false) {
            guard entry.count >= 2, entry[entry.startIndex + 1] == UInt8(ascii: "="),
                  let value = String(validating: entry.dropFirst(2), as: UTF8.self) else { return nil }
            switch entry[entry.startIndex] {
            case UInt8(ascii: "m"): manifest = value
            case UInt8(ascii: "r"): receivedAt = Double(value)
            case UInt8(ascii: "q"): requestedJob = value
            case UInt8(ascii: "f"): claimedFromCluster = true; fence = Int64(value)
            case UInt8(ascii: "s"): submittedOn = value
            case UInt8(ascii: "n"): fromNode = value
            default: break
            }
        }
    }
}
