// What an operator looks at (contrib/prometheus, contrib/grafana, docs/operations.md), kept honest:
// - the alerting rules pass `promtool check rules` and their own unit tests (`promtool test rules`), every alert has
//   a severity, a summary and a description naming a command to run, and is tested both firing and not firing;
// - the Grafana dashboard is valid JSON of a dashboard importable with a Prometheus data source;
// - every `opqueued_…` name the rules and the dashboard mention is one that real daemons export, as read from
//   `opqueuectl metrics` of a spool-only daemon that has run a job and of a cluster node (whose database is away, so
//   that only its cluster gauges are added); every family they export has a panel; and opqueued.plist(5) lists exactly
//   those families. Renaming a metric in Metrics.swift therefore fails here until the rules, the dashboard and the
//   manual follow (a check against the manual or the source text alone would pass on a name no daemon exports);
// - docs/operations.md's ways of submitting from a program (the shell one, the Python function) submit jobs that a
//   real daemon runs.
// promtool comes from Debian's `prometheus` package (TEST_APT_PACKAGES: make test installs it). Without it these
// tests fail; they never skip.

import Foundation
import Testing
import TestSupport
import TestTraits

let rulesPath = repositoryRoot + "/contrib/prometheus/opqueued.rules.yml"
let rulesTestPath = repositoryRoot + "/contrib/prometheus/opqueued.rules.test.yml"
let dashboardPath = repositoryRoot + "/contrib/grafana/opqueued.json"

/// promtool on PATH or where Debian's package puts it; nil when missing.
func promtoolPath() -> String? {
    let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
    let folders = path.split(separator: ":").map(String.init) + ["/usr/bin", "/usr/local/bin"]
    return folders.map { $0 + "/promtool" }.first { FileManager.default.isExecutableFile(atPath: $0) }
}

/// Every `opqueued_…` name a text mentions (expressions, legends, descriptions, comments alike).
func metricNames(in text: String) throws -> Set<String> {
    let pattern = try Regex("opqueued_[a-z_]+")
    return Set(text.matches(of: pattern).map { String(text[$0.range]) })
}

/// The text exposition, read as names: families (from `# TYPE` lines) and sample names (`_bucket`, `_sum` and
/// `_count` included).
struct Exposition {
    var families: [String: String] = [:]
    var samples: Set<String> = []

    init(_ texts: [String]) {
        for line in texts.flatMap({ $0.split(separator: "\n") }) {
            if line.hasPrefix("# TYPE ") {
                let parts = line.split(separator: " ")
                if parts.count == 4 { families[String(parts[2])] = String(parts[3]) }
            } else if !line.hasPrefix("#") {
                samples.insert(String(line.prefix { $0 != "{" && $0 != " " }))
            }
        }
    }

    /// A name the exposition has: a family, or a sample name (a histogram's `_bucket`, `_sum`, `_count`).
    func has(_ name: String) -> Bool { families[name] != nil || samples.contains(name) }

    /// The family a name belongs to: itself, or a histogram's once its suffix is stripped.
    func family(of name: String) -> String {
        for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
            let base = String(name.dropLast(suffix.count))
            if families[base] == "histogram" { return base }
        }
        return name
    }
}

/// What real daemons export. A spool-only daemon after one job of one operation (the operations counter and the wait
/// and run histograms have a series only once something ran), and a cluster node configured against a database that
/// cannot be reached (it starts all the same, SPEC §8) with a queue limited cluster-wide: the cluster gauges, the slot
/// gauges included, which only a cluster node exports.
func exportedByRealDaemons() throws -> Exposition {
    let single = TestSpool()
    try single.start(single.configure([:]))
    try single.drop("one.plist", ["job": "one", "operations": [sleepOp("a", 0)]])
    #expect(single.result("one")?["status"] as? String == "succeeded")
    let spoolOnly = try single.ctl(["metrics"])
    #expect(spoolOnly.status == 0, "\(spoolOnly.stderr)")

    let node = TestSpool()
    try node.start(node.configure([
        "cluster": ["database": "postgresql://opq@127.0.0.1:1/jobs?sslmode=disable", "node": "monitoring"],
        "queues": ["api": ["maxConcurrentOperationCount": 1, "clusterMaxConcurrentOperationCount": 1]],
    ]))
    let clusterNode = try node.ctl(["metrics"])
    #expect(clusterNode.status == 0, "\(clusterNode.stderr)")
    let exposition = Exposition([spoolOnly.stdout, clusterNode.stdout])
    // Not vacuous: both daemons answered with what they are known to export.
    #expect(exposition.families["opqueued_operation_run_seconds"] == "histogram", "\(spoolOnly.stdout)")
    #expect(exposition.families["opqueued_cluster_slots_held"] == "gauge", "\(clusterNode.stdout)")
    return exposition
}

/// The families opqueued.plist(5) lists in its METRICS section (`.It Li opqueued_…`).
func familiesInTheManual() throws -> Set<String> {
    let manual = try String(contentsOfFile: repositoryRoot + "/docs/man/opqueued.plist.5", encoding: .utf8)
    let lines = manual.split(separator: "\n", omittingEmptySubsequences: false)
    guard let start = lines.firstIndex(of: ".Sh METRICS") else { return [] }
    let section = lines[(start + 1)...].prefix { !$0.hasPrefix(".Sh ") }
    let items = section.filter { $0.hasPrefix(".It Li opqueued_") }
    return Set(items.compactMap { $0.split(separator: " ").dropFirst(2).first.map(String.init) })
}

/// Every string in a JSON value, recursively (titles, descriptions, expressions, legends, variable queries).
func strings(in json: Any) -> [String] {
    switch json {
    case let text as String: return [text]
    case let array as [Any]: return array.flatMap { strings(in: $0) }
    case let object as [String: Any]: return object.keys.sorted().flatMap { [$0] + strings(in: object[$0] as Any) }
    default: return []
    }
}

/// The code blocks of a Markdown text in language `language` (```language … ```).
func codeBlocks(_ language: String, in text: String) -> [String] {
    text.components(separatedBy: "```\(language)\n").dropFirst().compactMap { $0.components(separatedBy: "\n```").first }
}

@Suite(.serialized, .onItsOwnExecutor) struct MonitoringTests {
    @Test func theRulesPassPromtoolAndTheirUnitTests() throws {
        let promtool = try #require(promtoolPath(), "promtool is missing: apt-get install prometheus (make test does)")
        let check = try run(promtool, ["check", "rules", rulesPath], timeout: 60)
        #expect(check.status == 0, "promtool check rules: \(check.stdout)\(check.stderr)")
        #expect(check.stdout.contains("SUCCESS"), "\(check.stdout)")
        let tests = try run(promtool, ["test", "rules", rulesTestPath], timeout: 120)
        #expect(tests.status == 0, "promtool test rules: \(tests.stdout)\(tests.stderr)")
        #expect(tests.stdout.contains("SUCCESS"), "\(tests.stdout)")
    }

    /// Each alert says how bad it is and what to run, and its unit tests see it fire and, at another time or for
    /// other series, not fire.
    @Test func everyAlertHasASeverityWhatToDoAndTestsBothWays() throws {
        let rules = try String(contentsOfFile: rulesPath, encoding: .utf8)
        let tests = try String(contentsOfFile: rulesTestPath, encoding: .utf8)
        let chunks = rules.components(separatedBy: "- alert: ").dropFirst()
        #expect(chunks.count >= 8, "the rules file has lost its alerts")
        for chunk in chunks {
            let name = String(chunk.prefix { !$0.isWhitespace })
            #expect(chunk.range(of: #"severity: (critical|warning|info)\n"#, options: .regularExpression) != nil, "\(name): severity")
            #expect(chunk.contains("summary: "), "\(name): summary")
            let description = chunk.components(separatedBy: "description: ").dropFirst().first ?? ""
            #expect(description.range(of: "`(opqueuectl|journalctl|systemctl) ", options: .regularExpression) != nil,
                    "\(name): the description names a command to run")
            // (Alert names are letters only: no regex escaping needed.)
            #expect(tests.range(of: #"alertname: \#(name)\s+exp_alerts:\s*\n\s*- exp_labels:"#, options: .regularExpression) != nil,
                    "\(name): a test where it fires")
            #expect(tests.range(of: #"alertname: \#(name)\s+exp_alerts: \[\]"#, options: .regularExpression) != nil,
                    "\(name): a test where it does not")
            let lettersOnly = name.allSatisfy { $0.isLetter }
            #expect(lettersOnly, "\(name): letters only")
        }
    }

    @Test func theDashboardIsAnImportableDashboard() throws {
        let data = try Data(contentsOf: URL(fileURLWithPath: dashboardPath))
        let dashboard = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any], "not a JSON object")
        #expect((dashboard["schemaVersion"] as? Int ?? 0) >= 36)
        let inputs = dashboard["__inputs"] as? [[String: Any]] ?? []
        #expect(inputs.contains { $0["name"] as? String == "DS_PROMETHEUS" && $0["pluginId"] as? String == "prometheus" })
        let panels = dashboard["panels"] as? [[String: Any]] ?? []
        let ids = panels.compactMap { $0["id"] as? Int }
        #expect(ids.count == panels.count && Set(ids).count == ids.count, "every panel has its own id")
        for panel in panels where panel["type"] as? String != "row" {
            let title = panel["title"] as? String ?? "?"
            let targets = panel["targets"] as? [[String: Any]] ?? []
            #expect(!targets.isEmpty && targets.allSatisfy { !($0["expr"] as? String ?? "").isEmpty }, "\(title): its queries")
            for source in [panel["datasource"]] + targets.map({ $0["datasource"] }) {
                #expect((source as? [String: Any])?["uid"] as? String == "${DS_PROMETHEUS}", "\(title): the data source input")
            }
        }
    }

    /// The names the rules and the dashboard use against what real daemons export (see above); the dashboard covers
    /// every exported family; the manual lists exactly the exported families.
    @Test func everyMetricTheRulesAndTheDashboardUseIsExported() throws {
        let exposition = try exportedByRealDaemons()
        let rules = try metricNames(in: String(contentsOfFile: rulesPath, encoding: .utf8))
        let json = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dashboardPath)))
        let dashboard = try metricNames(in: strings(in: json).joined(separator: "\n"))
        #expect(rules.count >= 8 && dashboard.count >= 20, "rules \(rules.sorted()), dashboard \(dashboard.sorted())")
        for name in rules.sorted() where !exposition.has(name) {
            Issue.record("the rules use \(name), which no daemon exports (families: \(exposition.families.keys.sorted()))")
        }
        for name in dashboard.sorted() where !exposition.has(name) {
            Issue.record("the dashboard uses \(name), which no daemon exports (families: \(exposition.families.keys.sorted()))")
        }
        let shown = Set(dashboard.map { exposition.family(of: $0) })
        for family in exposition.families.keys.sorted() where !shown.contains(family) {
            Issue.record("the daemon exports \(family) and the dashboard has no panel for it")
        }
        let manual = try familiesInTheManual()
        let missing = Set(exposition.families.keys).subtracting(manual).sorted()
        let extra = manual.subtracting(exposition.families.keys).sorted()
        #expect(manual == Set(exposition.families.keys), "opqueued.plist(5) METRICS: missing \(missing), not exported \(extra)")
    }

    /// The shell block as written, and the Python `submit` function given a job of its own, against a running
    /// daemon's inbox: both jobs run, and nothing is left hidden in the inbox.
    @Test func theDocumentedWaysOfSubmittingRun() throws {
        let doc = try String(contentsOfFile: repositoryRoot + "/docs/operations.md", encoding: .utf8)
        let shell = try #require(codeBlocks("sh", in: doc).first)
        // The function, without the example's call (its download would need the network).
        let python = try #require(codeBlocks("python", in: doc).first?.components(separatedBy: "\nsubmit(").first)
        let spool = TestSpool()
        try spool.start()
        let inbox = spool.root + "/inbox"
        let sh = try run("/bin/bash", ["-euc", shell.replacingOccurrences(of: "/var/spool/opqueued/inbox", with: inbox)])
        #expect(sh.status == 0, "\(sh.stderr)")
        let call = "import sys\nsubmit(sys.argv[1], {'job': 'from-python', "
            + "'operations': [{'id': 'nap', 'kind': 'sleep', 'seconds': 0.1}]})\n"
        let py = try run(systemPython, ["-c", python + "\n" + call, inbox])
        #expect(py.status == 0, "\(py.stderr)")
        #expect(spool.result("nightly")?["status"] as? String == "succeeded")
        #expect(spool.result("from-python")?["status"] as? String == "succeeded")
        let left = (try? FileManager.default.contentsOfDirectory(atPath: inbox)) ?? []
        #expect(left.isEmpty, "\(left)")
    }
}
