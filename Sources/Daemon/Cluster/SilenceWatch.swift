// SilenceWatch: which other nodes have gone silent, judged by this node's own monotonic clock (SPEC §8 leases).
//
// A node is silent once its last beat, as read from the database, has not changed for longer than its lease on
// this node's clock, counted from when this node first read that beat (after the read returned: never earlier than
// the beat was made). The database's clock gives only a token that changes with each beat and is never read as a
// time, so a step of the database server's clock (NTP stepping, a VM moved or resumed) neither makes a beating node
// look lost — its jobs and slots taken while it still runs them, overlapping its runs and breaking a cluster-wide
// limit — nor hides a dead node for the length of the step. The beating node stops its own work at its beat's send
// time plus its lease minus a margin, on its own monotonic clock: before any watcher can judge it silent.
// Pure: no I/O; the loop reads the beats and runs the takeover.

import ClusterStore

struct SilenceWatch {
    private struct Seen {
        var beat: Int64
        var since: Double
        /// Taken over at this beat: not reported again until the node beats again.
        var takenOver = false
    }

    private var seen: [String: Seen] = [:]

    /// Takes a fresh read of every node's beat at monotonic time `now` (taken after the read returned); returns the
    /// nodes, other than `me`, whose beat has not changed for longer than their lease (`defaultLease` for a node
    /// that recorded none) and that were not taken over at that beat. Nodes no longer read are forgotten.
    mutating func silent(in beats: [NodeBeat], now: Double, defaultLease: Double, except me: String) -> [NodeBeat] {
        var next: [String: Seen] = [:]
        var silent: [NodeBeat] = []
        for read in beats where read.node != me {
            guard let known = seen[read.node], known.beat == read.beat else {
                next[read.node] = Seen(beat: read.beat, since: now)
                continue
            }
            next[read.node] = known
            if !known.takenOver && now - known.since > (read.leaseSeconds ?? defaultLease) { silent.append(read) }
        }
        seen = next
        return silent
    }

    /// Takes a fresh read of one node's beat (the holder of a name this node would register): whether it has not
    /// changed for longer than its lease (`defaultLease` when it recorded none), counted as `silent(in:)` does. Other
    /// nodes read before are forgotten.
    mutating func isSilent(_ beat: NodeBeat, now: Double, defaultLease: Double) -> Bool {
        !silent(in: [beat], now: now, defaultLease: defaultLease, except: "").isEmpty
    }

    /// These nodes were taken over (at the beats last read): not reported again until they beat again.
    mutating func tookOver(_ nodes: [String]) {
        for node in nodes { seen[node]?.takenOver = true }
    }
}
