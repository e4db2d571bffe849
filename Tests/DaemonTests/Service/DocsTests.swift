// The operator's documents, tested: the man pages lint clean and opqueuectl(1)/opqueued(8) name every
// subcommand and option the programs have; the completion scripts load and complete job ids and queue
// names from a running daemon; and the README's shell examples run, in order, against a daemon the test
// starts (blocks preceded by `<!-- docs-test: skip (why) -->` are not run: building, systemd, the journal).

import ControlPlane
import Foundation
import PropertyList
import Testing
import TestSupport
@testable import Daemon
@testable import JobModel
import TestTraits

let manFolder = repositoryRoot + "/docs/man"

/// The runnable `sh` blocks of a Markdown file, in order; a block is skipped when the line before its fence
/// is a `<!-- docs-test: skip … -->` comment.
func runnableShellBlocks(_ markdown: String) -> (run: [String], skipped: Int) {
    var blocks: [String] = [], skipped = 0
    var inBlock = false, language = "", body: [String] = [], skipMarked = false, lastOutside = ""
    for line in markdown.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
        if !inBlock {
            if line.hasPrefix("```") {
                inBlock = true
                language = String(line.dropFirst(3))
                body = []
                skipMarked = lastOutside.hasPrefix("<!-- docs-test: skip")
            } else if !line.trimmingCharacters(in: .whitespaces).isEmpty {
                lastOutside = line
            }
        } else if line == "```" {
            inBlock = false
            // Other languages (text, xml, ini, yaml) are read, not run.
            if language == "sh" {
                if skipMarked { skipped += 1 } else { blocks.append(body.joined(separator: "\n")) }
            }
            lastOutside = ""
        } else {
            body.append(line)
        }
    }
    return (blocks, skipped)
}

@Suite(.serialized, .onItsOwnExecutor) struct DocsTests {
    @Test func manPagesLintClean() throws {
        for page in ["opqueuectl.1", "opqueued.8", "opqueued.plist.5"] {
            // mandoc comes with `make deps`; without it this fails rather than passing unchecked.
            let lint = try run("/usr/bin/mandoc", ["-T", "lint", "-W", "warning", manFolder + "/" + page])
            #expect(lint.status == 0 && lint.stdout.isEmpty && lint.stderr.isEmpty, "\(page): \(lint.stdout)\(lint.stderr)")
            let rendered = try run("/usr/bin/mandoc", ["-T", "markdown", manFolder + "/" + page])
            #expect(rendered.status == 0 && rendered.stdout.contains("NAME"))
        }
    }

    /// Every key the configuration parser takes is named in opqueued.plist(5) (the page is written by hand: a key
    /// added to the parser and not to the page fails here); and that list is the parser's own gate: each key in it
    /// is taken (a bad value is a bad value, not an unknown key), a key beside them is refused as unknown.
    @Test func configurationPageNamesEveryKey() throws {
        let page = try String(contentsOfFile: manFolder + "/opqueued.plist.5", encoding: .utf8)
        // mdoc names a key with Ic, alone or in a list (".Ic a , b"): a whole word on a line with the macro.
        let named = Set(page.split(separator: "\n").filter { $0.split(separator: " ").contains { $0 == "Ic" || $0 == ".Ic" } }
            .flatMap { $0.split(whereSeparator: { !($0.isLetter || $0.isNumber) }) }.map(String.init))
        var keys = 0
        for (section, sectionKeys) in Configuration.keys {
            for key in sectionKeys.union(["notAKeyOf\(section.isEmpty ? "Top" : "Section")"]) {
                keys += 1
                let isKey = sectionKeys.contains(key)
                if isKey { #expect(named.contains(key), "opqueued.plist(5) does not name \(section.isEmpty ? "" : section + ".")\(key)") }
                // The key with a value no key takes, where the section puts it.
                var value = PlistValue.dictionary(PlistDictionary([key: .array([.data([1])])]))
                switch section {
                case "": break
                case "queues.NAME": value = .dictionary(PlistDictionary(["queues": .dictionary(PlistDictionary(["q": value]))]))
                case "commands.NAME": value = .dictionary(PlistDictionary(["commands": .dictionary(PlistDictionary(["c": value]))]))
                case "schedules.NAME": value = .dictionary(PlistDictionary(["schedules": .dictionary(PlistDictionary(["s": value]))]))
                default: value = .dictionary(PlistDictionary([section: value]))
                }
                var problems: [String] = []
                do {
                    _ = try Configuration.parse(Data(PlistBinaryWriter.document(value)))
                } catch let error as Configuration.Invalid {
                    problems = error.problems
                }
                let unknown = problems.contains { $0.contains("unknown key '\(key)'") }
                #expect(unknown != isKey, "\(section).\(key): \(problems)")
                #expect(!problems.isEmpty, "\(section).\(key): an array of data taken as a value")
            }
        }
        #expect(keys > 40)
    }

    /// Every subcommand and option the program's own parser knows appears in its generated page:
    /// a page left behind by a change to the command line fails here (`make man` brings it up to date).
    @Test(arguments: [("opqueuectl", "opqueuectl.1"), ("opqueued", "opqueued.8")])
    func generatedPagesAreCurrent(program: String, page: String) throws {
        let text = try String(contentsOfFile: manFolder + "/" + page, encoding: .utf8)
        let dump = try run(program, ["--experimental-dump-help"])
        let root = try #require(
            (try JSONSerialization.jsonObject(with: Data(dump.stdout.utf8)) as? [String: Any])?["command"] as? [String: Any])
        var checked = 0
        func check(_ command: [String: Any]) {
            for argument in command["arguments"] as? [[String: Any]] ?? [] where argument["shouldDisplay"] as? Bool != false {
                for name in argument["names"] as? [[String: Any]] ?? [] {
                    let spelled = name["kind"] as? String == "long" ? "Fl -\(name["name"] ?? "")" : "Fl \(name["name"] ?? "")"
                    #expect(text.contains(spelled), "\(page) lacks \(spelled)")
                    checked += 1
                }
                if let help = argument["abstract"] as? String, !help.isEmpty {
                    #expect(text.contains(help.prefix(30)), "\(page) lacks the help '\(help)'")
                }
            }
            // (`help` is argument-parser's own; docs/man/tidy-mdoc.py drops it where it is the only one.)
            for sub in command["subcommands"] as? [[String: Any]] ?? [] where sub["commandName"] as? String != "help" {
                let name = sub["commandName"] as? String ?? ""
                #expect(text.contains(".It Em \(name)"), "\(page) lacks the subcommand \(name)")
                if let discussion = sub["discussion"] as? String, !discussion.isEmpty {
                    #expect(text.contains(discussion.prefix(40)), "\(page) lacks what \(name)'s help says: '\(discussion)'")
                }
                checked += 1
                check(sub)
            }
        }
        check(root)
        #expect(checked > 5)
        if program == "opqueuectl" {
            for command in ["submit", "validate", "status", "show", "wait", "cancel", "suspend", "resume", "graph", "metrics"] {
                #expect(text.contains(".It Em \(command)"))
            }
        }
    }

    @Test func completionScriptsLoadAndAskTheDaemon() throws {
        let folder = NSTemporaryDirectory() + "opq-completion-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        for shell in ["bash", "zsh", "fish"] {
            let script = try run("opqueuectl", ["--generate-completion-script", shell])
            #expect(script.status == 0 && script.stdout.contains("opqueuectl"))
            for command in ["submit", "status", "cancel", "suspend", "metrics"] {
                #expect(script.stdout.contains(command), "\(shell) lacks \(command)")
            }
            try script.stdout.write(toFile: folder + "/opqueuectl.\(shell)", atomically: true, encoding: .utf8)
        }
        #expect(try run("/bin/bash", ["-n", folder + "/opqueuectl.bash"]).status == 0)
        let loaded = try run("/bin/bash", ["-c", "source \(folder)/opqueuectl.bash && complete -p opqueuectl"])
        #expect(loaded.status == 0 && loaded.stdout.contains("-F _opqueuectl"), "\(loaded.stdout)\(loaded.stderr)")

        // A job running, and what TAB offers for `cancel l` and `suspend ` on that spool.
        let spool = TestSpool()
        try spool.start()
        try spool.drop("long.plist", ["job": "long", "operations": [sleepOp("a", 30)]])
        // Running, not only dropped (the completion asks the daemon for the jobs it runs): on a loaded machine the
        // claim can take longer than any fixed wait.
        var running = false
        for _ in 0..<300 where !running {
            running = (try? spool.ctl(["status", "--json"]).stdout.contains("\"long\"")) ?? false
            if !running { usleep(100_000) }
        }
        #expect(running, "job long is running")
        func complete(_ words: [String]) throws -> [String] {
            let quoted = words.map { "'\($0)'" }.joined(separator: " ")
            let line = words.joined(separator: " ")
            let script = """
                export PATH='\(binaries)':"$PATH"
                source '\(folder)/opqueuectl.bash'
                COMP_WORDS=(\(quoted)); COMP_CWORD=\(words.count - 1); COMP_LINE='\(line)'; COMP_POINT=${#COMP_LINE}
                COMPREPLY=(); _opqueuectl; printf '%s\\n' "${COMPREPLY[@]}"
                """
            let r = try run("/bin/bash", ["-c", script])
            return r.stdout.split(separator: "\n").map { String($0).trimmingCharacters(in: .whitespaces) }
        }
        #expect(try complete(["opqueuectl", "--spool", spool.root, "cancel", "l"]).contains("long"))
        let queues = try complete(["opqueuectl", "--spool", spool.root, "suspend", ""])
        #expect(queues.contains("io") && queues.contains("downloads"), "\(queues)")
        #expect(try spool.ctl(["cancel", "long"]).status == 0)
    }

    /// `make install` puts the man pages where `man` finds them and the completions where the shells look
    /// (into a DESTDIR here: nothing is installed on the machine, and no system command runs).
    @Test func installPutsManPagesAndCompletionsInPlace() throws {
        let destination = NSTemporaryDirectory() + "opq-install-" + UUID().uuidString.prefix(8)
        defer { try? FileManager.default.removeItem(atPath: destination) }
        let install = try run("/usr/bin/make",
                              ["-C", repositoryRoot, "-s", "install-files", "BINARIES=.build/debug", "DESTDIR=" + destination], timeout: 60)
        #expect(install.status == 0, "\(install.stderr)")
        let share = destination + "/usr/local/share"
        for (page, section) in [("opqueuectl", "1"), ("opqueued", "8"), ("opqueued.plist", "5")] {
            let found = try run("/usr/bin/man", ["-M", share + "/man", "-w", section, page])
            #expect(found.status == 0 && found.stdout.contains("/man\(section)/\(page).\(section)"),
                    "\(page)(\(section)): \(found.stdout)\(found.stderr)")
        }
        let bash = share + "/bash-completion/completions/opqueuectl"
        #expect(try run("/bin/bash", ["-c", "source '\(bash)' && complete -p opqueuectl"]).stdout.contains("_opqueuectl"))
        #expect(FileManager.default.fileExists(atPath: share + "/zsh/site-functions/_opqueuectl"))
        #expect(FileManager.default.fileExists(atPath: share + "/fish/vendor_completions.d/opqueuectl.fish"))
    }

    @Test func readmeStartsWithTheTwoCommandsAndItsExamplesRun() throws {
        let readme = try String(contentsOfFile: repositoryRoot + "/README.md", encoding: .utf8)
        let firstBlock = readme.components(separatedBy: "```sh\n").dropFirst().first?.components(separatedBy: "\n```").first ?? ""
        #expect(readme.hasPrefix("# opqueued\n"))
        #expect(firstBlock.split(separator: "\n")
                    .map { $0.split(separator: " ").prefix(2).joined(separator: " ") } == ["make run", "make test"])
        let (blocks, skipped) = runnableShellBlocks(readme)
        #expect(blocks.count >= 5 && skipped >= 3, "\(blocks.count) runnable, \(skipped) skipped")

        // A clone-like folder: the Makefile (for `make example` and the walk-through's configuration), the
        // examples, and the debug binaries where `make run` would have put the release ones.
        let clone = NSTemporaryDirectory() + "opq-readme-" + UUID().uuidString.prefix(8)
        defer { try? FileManager.default.removeItem(atPath: clone) }
        try FileManager.default.createDirectory(atPath: clone + "/spool", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: repositoryRoot + "/Makefile", toPath: clone + "/Makefile")
        try FileManager.default.copyItem(atPath: repositoryRoot + "/spool/examples", toPath: clone + "/spool/examples")
        try FileManager.default.createDirectory(atPath: clone + "/.build", withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: clone + "/.build/release", withDestinationPath: binaries)
        #expect(try run("/usr/bin/make", ["-C", clone, "-s", "spool/opqueued.plist"]).status == 0)

        let daemon = Process()
        daemon.executableURL = URL(fileURLWithPath: binaries + "/opqueued")
        daemon.arguments = ["--spool", "spool", "--config", "spool/opqueued.plist", "--log-target", "console"]
        daemon.currentDirectoryURL = URL(fileURLWithPath: clone)
        let log = FileHandle(forWritingAtPath: "/dev/null")
        daemon.standardError = log
        daemon.standardOutput = log
        try daemon.run()
        defer { if daemon.isRunning { kill(daemon.processIdentifier, SIGKILL); daemon.waitUntilExit() } }
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline,
              (try? ControlClient.request(clone + "/spool/opqueued.sock", ["command": "status"], timeout: 1)) == nil { usleep(20_000) }

        // All runnable blocks in one shell, as a reader would type them, stopping at the first failure.
        let script = "set -euo pipefail\ncd '\(clone)'\n" + blocks.joined(separator: "\n")
        let r = try run("/bin/bash", ["-c", script], timeout: 120)
        #expect(r.status == 0, "the README's examples failed:\n\(r.stdout.suffix(1500))\n\(r.stderr.suffix(1500))")
        // What the walk-through says happens, happened.
        #expect(r.stdout.contains("photos: succeeded"))
        #expect(r.stdout.contains("hello: failed"))
        #expect(r.stdout.contains("harbour.jpg"))
        #expect(r.stdout.contains("QUEUE"))
        #expect(r.stdout.contains("opqueued_jobs_total"))
        #expect(r.stdout.contains("unknown kind 'teleport'"))
        daemon.terminate()
        daemon.waitUntilExit()
        #expect(daemon.terminationStatus == 0)
    }
}
