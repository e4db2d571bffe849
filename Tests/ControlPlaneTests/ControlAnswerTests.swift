// The control socket's answers, typed: each as the exact JSON line the daemon writes (keys, their order, numbers,
// optional keys absent when nil), and read back by a client into the same value.

import ControlPlane
import Foundation
import Testing

@Suite("Control answers")
struct ControlAnswerTests {
    static func text(_ answer: ControlAnswer) throws -> String { String(decoding: try ControlJSON.data(answer), as: UTF8.self) }

    static func queue() -> StatusAnswer.Queue {
        StatusAnswer.Queue(name: "default", maxConcurrentOperationCount: -1, qualityOfService: "default", suspended: false,
                           pending: 2, executing: 1)
    }

    static func bare() -> StatusAnswer {
        StatusAnswer(activeJobs: ["a"], waiting: 0, executing: 1, operations: 3, maxActiveOperations: 100, queues: [queue()],
                     jobs: [StatusAnswer.Job(job: "a", operations: 3, ended: 1, notBefore: nil)])
    }

    static func full() -> StatusAnswer {
        var status = bare()
        var rated = queue()
        rated.name = "photos"
        rated.suspended = true
        rated.rateLimit = StatusAnswer.RateLimit(operations: 5, seconds: 60)
        rated.nextStartAt = 1_732_900_000.25
        rated.held = true
        rated.clusterMaxConcurrentOperationCount = 4
        rated.clusterSlotsHeld = 1
        rated.clusterSlotWait = "high"
        status.queues.append(rated)
        status.schedules = [StatusAnswer.Schedule(name: "nightly", cron: "0 3 * * *", timeZone: "UTC", next: 1_732_950_000)]
        status.fault = "inbox: EIO"
        status.delayed = 7
        status.submissions = 2
        status.submissionsSince = 1_732_899_990.5
        status.nodes = [StatusAnswer.Node(node: "n1", connected: true, lastHeartbeat: 1_732_900_000, jobs: 3, freeSlots: 5, schema: 7)]
        status.cluster = StatusAnswer.Cluster(node: "n1", state: "disconnected", reason: "timeout", wakeupsArrive: false,
                                              unrunnable: [StatusAnswer.Unrunnable(job: "g", reason: "no live node declares queue gpu")],
                                              queues: ["q10": .init(waiting: 1, running: 0), "q2": .init(waiting: 0, running: 2)],
                                              queuesReadAt: 1_732_900_000.125)
        status.jobs?.append(StatusAnswer.Job(job: "later", operations: 0, ended: 0, notBefore: 1_732_990_000))
        status.heapBytes = 1_048_576
        return status
    }

    static func showRunning() -> ShowAnswer {
        var op = ShowAnswer.Operation(id: "a", kind: "sleep", queue: "default", state: "succeeded", attempts: 1, dependencies: [])
        op.startedAt = 1_732_900_000.5
        op.finishedAt = 1_732_900_001.75
        let next = ShowAnswer.Operation(id: "b", kind: "sleep", queue: "default", state: "pending", attempts: 0, dependencies: ["a"])
        return ShowAnswer(job: "j", status: "running", operations: [op, next])
    }

    static func showEnded() -> ShowAnswer {
        var op = ShowAnswer.Operation(id: "a", kind: "command", queue: "default", state: "failed", attempts: 2, dependencies: [])
        op.startedAt = 10.5
        op.finishedAt = 12
        op.durationSeconds = 1.5
        op.error = "exit 3"
        op.outputs = ["a.log"]
        op.qualityOfService = "utility"
        op.queuePriority = "normal"
        var answer = ShowAnswer(job: "j", status: "failed", operations: [op, ShowAnswer.Operation(id: "z", state: "unknown")])
        answer.node = "n2"
        answer.submittedOn = "n1"
        answer.progressAt = 11.25
        answer.notBefore = 9
        answer.starting = true
        return answer
    }

    @Test func statusWithoutItsOptionalKeys() throws {
        #expect(try Self.text(.status(Self.bare())) == """
            {"activeJobs":["a"],"executing":1,"exit":0,"jobs":[{"ended":1,"job":"a","operations":3}],"maxActiveOperations":100,\
            "operations":3,"queues":[{"executing":1,"maxConcurrentOperationCount":-1,"name":"default","pending":2,\
            "qualityOfService":"default","suspended":false}],"state":"running","waiting":0}
            """)
    }

    /// Keys sorted by code point (`clusterSlotWait` before `clusterSlotsHeld`, queue `q10` before `q2`).
    @Test func statusWithEveryKey() throws {
        #expect(try Self.text(.status(Self.full())) == """
            {"activeJobs":["a"],"cluster":{"node":"n1","queues":{"q10":{"running":0,"waiting":1},"q2":{"running":2,"waiting":0}},\
            "queuesReadAt":1732900000.125,"reason":"timeout","state":"disconnected","unrunnable":[{"job":"g",\
            "reason":"no live node declares queue gpu"}],"wakeupsArrive":false},"delayed":7,"executing":1,"exit":0,\
            "fault":"inbox: EIO","heapBytes":1048576,"jobs":[{"ended":1,"job":"a","operations":3},{"ended":0,"job":"later",\
            "notBefore":1732990000,"operations":0}],"maxActiveOperations":100,"nodes":[{"connected":true,"freeSlots":5,"jobs":3,\
            "lastHeartbeat":1732900000,"node":"n1","schema":7}],"operations":3,"queues":[{"executing":1,\
            "maxConcurrentOperationCount":-1,"name":"default","pending":2,"qualityOfService":"default","suspended":false},\
            {"clusterMaxConcurrentOperationCount":4,"clusterSlotWait":"high","clusterSlotsHeld":1,"executing":1,"held":true,\
            "maxConcurrentOperationCount":-1,"name":"photos","nextStartAt":1732900000.25,"pending":2,"qualityOfService":"default",\
            "rateLimit":{"operations":5,"seconds":60},"suspended":true}],"schedules":[{"cron":"0 3 * * *","name":"nightly",\
            "next":1732950000,"timeZone":"UTC"}],"state":"running","submissions":2,"submissionsSince":1732899990.5,"waiting":0}
            """)
    }

    @Test func showOfARunningJob() throws {
        #expect(try Self.text(.show(Self.showRunning())) == """
            {"exit":0,"job":"j","operations":[{"attempts":1,"dependencies":[],"finishedAt":1732900001.75,"id":"a","kind":"sleep",\
            "queue":"default","startedAt":1732900000.5,"state":"succeeded"},{"attempts":0,"dependencies":["a"],"id":"b",\
            "kind":"sleep","queue":"default","state":"pending"}],"status":"running"}
            """)
    }

    @Test func showWithEveryKey() throws {
        #expect(try Self.text(.show(Self.showEnded())) == """
            {"exit":0,"job":"j","node":"n2","notBefore":9,"operations":[{"attempts":2,"dependencies":[],"durationSeconds":1.5,\
            "error":"exit 3","finishedAt":12,"id":"a","kind":"command","outputs":["a.log"],"qualityOfService":"utility",\
            "queue":"default","queuePriority":"normal","startedAt":10.5,"state":"failed"},{"id":"z","state":"unknown"}],\
            "progressAt":11.25,"starting":true,"status":"failed","submittedOn":"n1"}
            """)
    }

    @Test func theSmallAnswers() throws {
        #expect(try Self.text(.done) == #"{"exit":0}"#)
        #expect(try Self.text(.refused(1, "unknown job 'x'")) == #"{"error":"unknown job 'x'","exit":1}"#)
        #expect(try Self.text(.declared(DeclaredAnswer(queues: ["default", "gpu"], commands: ["echo": "e1"], cluster: false)))
                == #"{"cluster":false,"commands":{"echo":"e1"},"exit":0,"queues":["default","gpu"]}"#)
        #expect(try Self.text(.declared(DeclaredAnswer(queues: ["default"], commands: [:], fileRoots: ["/srv/in"], cluster: false)))
                == #"{"cluster":false,"commands":{},"exit":0,"fileRoots":["\/srv\/in"],"queues":["default"]}"#)
        #expect(try Self.text(.submitted(SubmittedAnswer(job: nil))) == #"{"exit":0}"#)
        #expect(try Self.text(.submitted(SubmittedAnswer(job: "j.1"))) == #"{"exit":0,"job":"j.1"}"#)
        #expect(try Self.text(.metrics(MetricsAnswer(text: "opqueued_up 1\n"))) == #"{"exit":0,"text":"opqueued_up 1\n"}"#)
    }

    /// ControlJSON's promise: the object the answer was when it was written untyped, whatever the keys (case, digits,
    /// accents, punctuation), with the keys in code-point order; numbers (whole, fractional, tiny, huge) written as
    /// JSONSerialization writes them and read back exactly.
    @Test func theTextIsTheUntypedObjectWithSortedKeys() throws {
        let names = ["q10", "q2", "Q1", "a", "_b", "é", "z", "A-1", "a.b", "a_b", "aB", "ab", "gpu/x"]
        let commands = Dictionary(uniqueKeysWithValues: names.map { ($0, "sig \($0)") })
        let declared = DeclaredAnswer(queues: names, commands: commands, cluster: true)
        let before: NSDictionary = ["exit": 0, "queues": names, "commands": commands, "cluster": true]
        for pretty in [false, true] {
            let text = try ControlJSON.data(declared, pretty: pretty)
            #expect(try JSONSerialization.jsonObject(with: text) as? NSDictionary == before)
            let written = String(decoding: text, as: UTF8.self).replacingOccurrences(of: "\\/", with: "/")
            let keys = written.components(separatedBy: "\"sig ").dropFirst().map { String($0.prefix { $0 != "\"" }) }
            #expect(keys == names.sorted(), "commands' keys in code-point order")
        }
        for value in [0, 5, -1, 0.1, 1e-7, 2.5e-10, 1.5e300, 1_732_900_000.123456, 1_795_954_554.3930037, 1e16, 1e21] {
            var job = StatusAnswer.Job(job: "j", operations: 1, ended: 0, notBefore: value)
            // Numbers as JSONSerialization writes them (these keys sort alike both ways), and read back exactly.
            let object: [String: Any] = ["job": "j", "operations": 1, "ended": 0, "notBefore": value]
            #expect(try ControlJSON.data(job) == JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), "\(value)")
            #expect(try ControlJSON.decode(StatusAnswer.Job.self, from: ControlJSON.data(job)).notBefore == value)
            job.notBefore = nil
            #expect(try ControlJSON.data(job) == Data(#"{"ended":0,"job":"j","operations":1}"#.utf8))
        }
    }

    @Test func whatTheDaemonWritesAClientReadsBack() throws {
        func back<Answer: Codable & Equatable>(_ answer: Answer) throws -> Answer {
            try ControlJSON.decode(Answer.self, from: ControlJSON.data(answer))
        }
        for status in [Self.bare(), Self.full()] { #expect(try back(status) == status) }
        for show in [Self.showRunning(), Self.showEnded()] { #expect(try back(show) == show) }
        let declared = DeclaredAnswer(queues: ["q"], commands: ["c": "s"], cluster: true)
        #expect(try back(declared) == declared)
        let rooted = DeclaredAnswer(queues: ["q"], commands: [:], fileRoots: ["/srv/in", "/data"], cluster: false)
        #expect(try back(rooted) == rooted)
        // An older daemon's answer has no fileRoots: read all the same, the roots unknown (nil, not empty).
        let json = #"{"cluster":false,"commands":{},"exit":0,"queues":["q"]}"#
        let older = try ControlJSON.decode(DeclaredAnswer.self, from: Data(json.utf8))
        #expect(older.fileRoots == nil && older.queues == ["q"])
        for submitted in [SubmittedAnswer(job: nil), SubmittedAnswer(job: "j")] { #expect(try back(submitted) == submitted) }
        #expect(try back(MetricsAnswer(text: "x 1\n")) == MetricsAnswer(text: "x 1\n"))
        for exit in [ExitAnswer(exit: 0), ExitAnswer(exit: 64, error: "show needs a job")] { #expect(try back(exit) == exit) }
    }

    /// The envelope as opqueuectl always read it: no `exit` is 0, or 1 with an `error`.
    @Test func anEnvelopeWithoutAnExit() throws {
        func envelope(_ json: String) throws -> ExitAnswer { try ControlJSON.decode(ExitAnswer.self, from: Data(json.utf8)) }
        #expect(try envelope("{}") == ExitAnswer(exit: 0))
        #expect(try envelope(#"{"error":"no"}"#) == ExitAnswer(exit: 1, error: "no"))
        #expect(try envelope(#"{"exit":"3"}"#) == ExitAnswer(exit: 0))
        #expect(try envelope(#"{"exit":3,"error":"busy"}"#) == ExitAnswer(exit: 3, error: "busy"))
        #expect(throws: (any Error).self) { try envelope("[1]") }
    }

    /// An ended job's result.plist (SPEC §5) read as `show` reads it: its operations with every key it writes.
    @Test func aResultPlistReadsAsShownOperations() throws {
        let plist = """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict><key>job</key><string>j</string><key>metadata</key><dict/><key>operations</key><array><dict>
            <key>attempts</key><integer>2</integer><key>durationSeconds</key><real>1.5</real><key>error</key><string>exit 3</string>
            <key>finishedAt</key><real>12</real><key>id</key><string>a</string><key>kind</key><string>command</string>
            <key>outputs</key><array><string>a.log</string></array><key>qualityOfService</key><string>utility</string>
            <key>queue</key><string>default</string><key>queuePriority</key><string>normal</string>
            <key>startedAt</key><real>10.5</real><key>state</key><string>failed</string></dict></array>
            <key>status</key><string>failed</string></dict></plist>
            """
        let result = try PropertyListDecoder().decode(ShownResult.self, from: Data(plist.utf8))
        var expected = Self.showEnded().operations[0]
        expected.dependencies = nil
        #expect(result == ShownResult(status: "failed", node: nil, operations: [expected]))
    }
}
