// The `cluster` keys of the configuration (SPEC §6, §8) and queues' clusterMaxConcurrentOperationCount: defaults,
// every invalid value refused with its key path, the limit refused without `cluster`, and the widening of the
// local configuration to what other nodes declare (submission validation).

import Foundation
import OperationEngine
import Testing
@testable import Daemon
@testable import JobModel
import TestTraits

@Suite(.onItsOwnExecutor) struct ClusterConfigurationTests {
    static let url = "postgresql://opq@db.example:5432/jobs?sslmode=verify-full"

    func problems(_ object: [String: Any]) -> [String] {
        do {
            _ = try Configuration.parse(plist(object), path: "c.plist")
            return []
        } catch let error as Configuration.Invalid {
            return error.problems
        } catch {
            return ["\(error)"]
        }
    }

    @Test func withoutClusterNothingChanges() throws {
        let config = try Configuration.parse(plist(["maxActiveJobs": 3]))
        #expect(config.cluster == nil)
        #expect(config.queues.values.allSatisfy { $0.clusterMaxConcurrentOperationCount == nil })
    }

    @Test func validClusterAndDefaults() throws {
        let config = try Configuration.parse(plist([
            "maxActiveJobs": 12,
            "cluster": ["database": Self.url, "node": "worker-1"],
            "queues": ["api": ["maxConcurrentOperationCount": 2, "clusterMaxConcurrentOperationCount": 4]],
        ]))
        let cluster = try #require(config.cluster)
        #expect(cluster.database == Self.url && cluster.node == "worker-1" && cluster.passwordFile == nil)
        #expect(cluster.jobSlots == 12, "jobSlots defaults to maxActiveJobs")
        #expect(cluster.leaseSeconds == 15 && cluster.keepFinishedDays == 7 && cluster.sharedOutbox == nil)
        #expect(config.queues["api"]?.clusterMaxConcurrentOperationCount == 4)
        #expect(config.queues["api"]?.maxConcurrentOperationCount == 2)

        let full = try Configuration.parse(plist(["cluster": [
            "database": Self.url, "passwordFile": "/run/credentials/opqueued.service/db", "node": "w.2_x-3", "jobSlots": 8,
            "leaseSeconds": 2, "sharedOutbox": "/mnt/outbox", "keepFinishedDays": 0.5,
        ]]))
        #expect(full.cluster == ClusterSettings(database: Self.url, passwordFile: "/run/credentials/opqueued.service/db", node: "w.2_x-3",
                                                jobSlots: 8, leaseSeconds: 2, sharedOutbox: "/mnt/outbox", keepFinishedDays: 0.5))
    }

    /// SIGHUP: whether there is a cluster is decided at start (adding or removing it is refused whole, nothing else
    /// applied); the connection settings keep their start values and are named for the warning; `sharedOutbox` and
    /// everything outside `cluster` take the new values.
    @Test func reloadKeepsWhatIsReadAtStart() throws {
        let spoolOnly = try Configuration.parse(plist(["queues": ["default": ["suspended": true]]]))
        let started = try Configuration.parse(plist([
            "cluster": ["database": Self.url, "node": "worker-1", "leaseSeconds": 6],
            "queues": ["api": ["maxConcurrentOperationCount": 2, "clusterMaxConcurrentOperationCount": 4]],
        ]))
        #expect(throws: Configuration.ReloadRefused.self) { try Configuration.reloaded(started, running: spoolOnly) }
        #expect(throws: Configuration.ReloadRefused.self) { try Configuration.reloaded(spoolOnly, running: started) }
        do {
            _ = try Configuration.reloaded(started, running: spoolOnly)
        } catch {
            #expect("\(error)" == "adding 'cluster' takes a restart (systemctl restart opqueued); nothing else was applied either")
        }

        let same = try Configuration.reloaded(spoolOnly, running: spoolOnly)
        #expect(same.kept.isEmpty && same.configuration.queues["default"]?.suspended == true)

        let edited = try Configuration.parse(plist([
            "cluster": ["database": "postgresql://opq@db2.example/jobs", "node": "worker-9", "leaseSeconds": 30,
                        "sharedOutbox": "/mnt/outbox"],
            "queues": ["api": ["maxConcurrentOperationCount": 3, "clusterMaxConcurrentOperationCount": 5]],
        ]))
        let (applied, kept) = try Configuration.reloaded(edited, running: started)
        #expect(kept == ["cluster.database", "cluster.node", "cluster.leaseSeconds"])
        let cluster = try #require(applied.cluster)
        #expect(cluster.database == Self.url && cluster.node == "worker-1" && cluster.leaseSeconds == 6)
        #expect(cluster.sharedOutbox == "/mnt/outbox", "read at each publication: the new value")
        #expect(applied.queues["api"]?.maxConcurrentOperationCount == 3 && applied.queues["api"]?.clusterMaxConcurrentOperationCount == 5)
    }

    @Test func nodeDefaultsToTheHostName() throws {
        let host = defaultNodeName()
        if isValidNodeName(host) {
            #expect(try Configuration.parse(plist(["cluster": ["database": Self.url]])).cluster?.node == host)
        } else {
            #expect(problems(["cluster": ["database": Self.url]]).contains { $0.hasPrefix("cluster.node:") })
        }
    }

    @Test func everyInvalidValueNamesItsKey() {
        let cases: [(String, Any, String)] = [
            ("database", "mysql://u@h/d", "cluster.database:"),
            ("database", 5, "cluster.database:"),
            ("passwordFile", "relative/pw", "cluster.passwordFile:"),
            ("node", "has space", "cluster.node:"),
            ("node", String(repeating: "n", count: 65), "cluster.node:"),
            ("node", "", "cluster.node:"),
            ("jobSlots", 0, "cluster.jobSlots:"),
            ("jobSlots", "8", "cluster.jobSlots:"),
            ("leaseSeconds", 1.5, "cluster.leaseSeconds:"),
            ("leaseSeconds", -3, "cluster.leaseSeconds:"),
            ("sharedOutbox", "outbox", "cluster.sharedOutbox:"),
            ("keepFinishedDays", -1, "cluster.keepFinishedDays:"),
            ("bogus", 1, "cluster: unknown key 'bogus'"),
        ]
        for (key, value, expected) in cases {
            var cluster: [String: Any] = ["database": Self.url, "node": "n1"]
            cluster[key] = value
            let found = problems(["cluster": cluster])
            #expect(found.count == 1 && found.first?.hasPrefix(expected) == true, "\(key) = \(value): \(found)")
        }
        #expect(problems(["cluster": ["node": "n1"]]) == ["cluster.database: missing (the postgresql:// URL of the cluster's database)"])
        #expect(problems(["cluster": "postgresql://x"]) == ["cluster: must be a dictionary"])
    }

    @Test func aPasswordInTheURLIsNeverInTheProblem() {
        let found = problems(["cluster": ["database": "postgresql://u:hunter2@h:99999/d", "node": "n"]])
        #expect(found.count == 1 && found.first?.hasPrefix("cluster.database:") == true, "\(found)")
        #expect(!found.joined().contains("hunter2"))
    }

    @Test func clusterLimitNeedsClusterAndAPositiveCount() {
        #expect(problems(["queues": ["api": ["clusterMaxConcurrentOperationCount": 4]]])
                == ["queues.api.clusterMaxConcurrentOperationCount: only applies with a 'cluster' dictionary (SPEC §8)"])
        for bad: Any in [0, -1, "4", 1.5] {
            let found = problems(["cluster": ["database": Self.url, "node": "n"],
                                  "queues": ["api": ["clusterMaxConcurrentOperationCount": bad]]])
            #expect(found == ["queues.api.clusterMaxConcurrentOperationCount: must be a positive integer (at most 100000)"],
                    "\(bad): \(found)")
        }
    }

    @Test func clusterRateNeedsClusterAndIsCheckedAsARate() throws {
        let rate: [String: Any] = ["operations": 5, "seconds": 2.0]
        #expect(problems(["queues": ["api": ["clusterRateLimit": rate]]])
                == ["queues.api.clusterRateLimit: only applies with a 'cluster' dictionary (SPEC §8)"])
        let cluster: [String: Any] = ["database": Self.url, "node": "n"]
        let config = try Configuration.parse(plist(["cluster": cluster, "queues": ["api": ["clusterRateLimit": rate]]]))
        #expect(config.queues["api"]?.clusterRateLimit == RateLimit(operations: 5, seconds: 2))
        #expect(config.queues["api"]?.rateLimit == nil, "the node's own rate is another key")
        let cases: [(value: Any, expected: String)] = [
            (["operations": 0, "seconds": 2.0], "queues.api.clusterRateLimit.operations: must be a positive integer"),
            (["operations": 5, "seconds": -1.0], "queues.api.clusterRateLimit.seconds: must be a positive number"),
            (["operations": 5], "queues.api.clusterRateLimit.seconds: must be a positive number"),
            (["operations": 5, "seconds": 2.0, "burst": 1], "queues.api.clusterRateLimit: unknown key 'burst'"),
            (5, "queues.api.clusterRateLimit: must be a dictionary"),
        ]
        for c in cases {
            let found = problems(["cluster": cluster, "queues": ["api": ["clusterRateLimit": c.value]]])
            #expect(found.count == 1 && found.first?.hasPrefix(c.expected) == true, "\(c.value): \(found)")
        }
    }

    /// Submission validates against every queue and command some node declares: a queue or command only another
    /// node has is accepted (its arguments checked by the signature that node recorded); a typo is not.
    @Test func widenedConfigurationAcceptsWhatOtherNodesDeclare() throws {
        let other = try Configuration.parse(plist([
            "queues": ["gpu": ["maxConcurrentOperationCount": 1]],
            "commands": ["render": ["argv": ["/usr/bin/render", "${level}", "${mode}"],
                                    "parameters": ["level": "integer", "mode": ["fast", "best"]], "queue": "gpu"]],
        ]))
        let declaration = other.declaration(node: "gpu-node", jobSlots: 2)
        #expect(declaration.commands == ["render"] && declaration.queues.contains("gpu"))
        let local = Configuration.builtIn
        let widened = local.widened(queues: Set(declaration.queues), commands: Set(declaration.commands),
                                    signatures: declaration.commandSignatures)

        func parse(_ operation: [String: Any], _ config: Configuration) -> Result<JobPlan, ManifestProblems> {
            Manifest.parse(plist(["operations": [operation]]), configuration: config)
        }
        let good: [String: Any] = ["id": "r", "kind": "command", "command": "render", "arguments": ["level": 3, "mode": "best"]]
        #expect((try? parse(good, local).get()) == nil, "the local configuration alone does not know render")
        let plan = try parse(good, widened).get()
        #expect(plan.operations.first?.queue == "gpu", "the command's own queue comes with its signature")
        #expect(plan.clusterPlacement(widened).commands == ["render"] && plan.clusterPlacement(widened).queues == ["gpu"])
        #expect((try? parse(["id": "r", "kind": "command", "command": "render", "arguments": ["level": "x", "mode": "best"]], widened)
                     .get()) == nil,
                "arguments are checked by the signature")
        #expect((try? parse(["id": "r", "kind": "command", "command": "rendr"], widened).get()) == nil, "a typo stays rejected")
        #expect((try? parse(["id": "s", "kind": "sleep", "seconds": 0, "queue": "gpu"], widened).get()) != nil)
        #expect((try? parse(["id": "s", "kind": "sleep", "seconds": 0, "queue": "gpux"], widened).get()) == nil)
        #expect(CommandSignature.decode("x", "not json") == nil && CommandSignature.decode("x", #"{"parameters": {"a": 5}}"#) == nil)
    }
}

/// Which process holds a node's name (SPEC §8: unique in the cluster): an earlier run of the node on this machine
/// that is gone may be replaced at once; anything that may still run may not.
@Suite("Node process identity", .onItsOwnExecutor)
struct NodeProcessTests {
    @Test func onlyAGoneProcessOfThisMachineIsReplacedAtOnce() throws {
        let mine = NodeProcess.info.split(separator: " ").map(String.init)
        #expect(mine.count == 11 && mine[0] == "opqueued" && mine[2] == String(getpid()) && mine[6] != "unknown" && mine[8] != "unknown")
        func info(pid: pid_t, host: String = mine[4], boot: String = mine[6], namespace: String = mine[8], run: String = "1234") -> String {
            "opqueued pid \(pid) on \(host) boot \(boot) pidns \(namespace) run \(run)"
        }
        // A child that has exited and been reaped: its pid is gone.
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/bin/true")
        try child.run()
        child.waitUntilExit()
        #expect(NodeProcess.isGoneFromThisMachine(info(pid: child.processIdentifier)))
        #expect(!NodeProcess.isGoneFromThisMachine(NodeProcess.info), "this very run")
        #expect(NodeProcess.isGoneFromThisMachine(info(pid: getpid(), run: mine[10] + "0")),
                "another run under this pid (a container restarted)")
        #expect(!NodeProcess.isGoneFromThisMachine(info(pid: child.processIdentifier, host: mine[4] + "-elsewhere")), "another machine")
        #expect(!NodeProcess.isGoneFromThisMachine(info(pid: child.processIdentifier, boot: "another-boot")), "another boot")
        #expect(!NodeProcess.isGoneFromThisMachine(info(pid: child.processIdentifier, namespace: "pid:[1]")),
                "another pid namespace: its pids are not ours")
        #expect(!NodeProcess.isGoneFromThisMachine("opqueued pid \(child.processIdentifier)"), "the older format says no machine")
        // A live process that is not an opqueued (the pid was given to another program): the node's run is gone.
        let sleeper = Process()
        sleeper.executableURL = URL(fileURLWithPath: "/bin/sleep")
        sleeper.arguments = ["5"]
        try sleeper.run()
        defer { kill(sleeper.processIdentifier, SIGKILL); sleeper.waitUntilExit() }
        #expect(NodeProcess.isGoneFromThisMachine(info(pid: sleeper.processIdentifier)))
    }
}
