// Manifest and configuration validation (SPEC §3, §6).

import Foundation
import Testing
@testable import JobModel

func plist(_ object: Any, binary: Bool = false) -> Data {
    (try? PropertyListSerialization.data(fromPropertyList: object, format: binary ? .binary : .xml, options: 0)) ?? Data()
}

func problems(_ object: Any) -> [String] {
    if case .failure(let p) = Manifest.parse(plist(object), configuration: .builtIn) { return p.problems }
    return []
}

extension Configuration {
    /// Parsing without the cluster store, whose URL parser checks `cluster.database` (ClusterConfigurationTests, with
    /// the daemon): no configuration here gives one, and one that did would get this problem.
    static func parse(_ data: Data, path: String = "configuration") throws -> Configuration {
        try parse(data, path: path) { _ in "cluster.database: not checked without the cluster store" }
    }
}

@Suite struct ManifestTests {
    @Test func validManifestInXMLAndBinary() throws {
        let manifest: [String: Any] = [
            "job": "holiday", "qualityOfService": "utility", "queuePriority": "high", "timeoutSeconds": 60, "metadata": ["owner": "ana"],
            "operations": [
                ["id": "a", "kind": "sleep", "seconds": 0.5, "retries": 2, "retryDelaySeconds": 0.1, "timeoutSeconds": 3],
                ["id": "b", "kind": "spin", "seconds": 1, "input": "a", "queue": "io", "qualityOfService": "background",
                 "queuePriority": "veryLow"],
                ["id": "c", "kind": "fail", "dependencies": ["a", "b"], "runsAfterFailure": true],
            ],
        ]
        for binary in [false, true] {
            let result = Manifest.parse(plist(manifest, binary: binary), configuration: .builtIn)
            let plan = try result.get()
            #expect(plan.job == "holiday")
            #expect(plan.operations.map(\.id) == ["a", "b", "c"])
            #expect(plan.operations[1].dependencies == ["a"], "naming an input adds it to the dependencies")
            #expect(plan.operations[1].queue == "io")
            #expect(plan.operations[0].queue == "default", "sleep is of the 'other' family")
            #expect(plan.operations[2].runsAfterFailure)
            #expect(plan.metadata != nil)
        }
        #expect(Manifest.requestedJob(in: plist(manifest)) == "holiday")
    }

    @Test func everyProblemIsReportedWithTheOperationInvolved() {
        let found = problems([
            "job": ".hidden", "colour": "red",
            "operations": [
                ["id": "a", "kind": "sleep", "seconds": 1, "sleepy": true],
                ["id": "a", "kind": "sleep", "seconds": 1],
                ["id": "bad id!", "kind": "sleep", "seconds": 1],
                ["id": "b", "kind": "teleport"],
                ["id": "c", "kind": "spin", "seconds": -1, "queue": "nowhere"],
                ["id": "d", "kind": "sleep", "seconds": 1, "dependencies": ["ghost"]],
                ["id": "e", "kind": "sleep", "retries": "many"],
                ["id": "f", "kind": "fail", "runsAfterFailure": 1],
            ],
        ])
        let expected = [
            "unknown key 'colour'",
            "job: must be a string of 1 to 128 characters from [A-Za-z0-9._-], not starting with '.'",
            "operation 'a': unknown key 'sleepy' for kind 'sleep'",
            "operations[2]: id must be a string of 1 to 128 characters from [A-Za-z0-9._-], not starting with '.'",
            "operation 'b': unknown kind 'teleport' (one of download, sepia, grayscale, blur, resize, thumbnail, vignette, write, "
                + "sleep, spin, fail, command)",
            "operation 'c': unknown queue 'nowhere' (configured: default, downloads, filters, io)",
            "operation 'c': seconds must be a number from 0 to 86400",
            "operation 'e': retries must be an integer from 0 to 1000",
            "operation 'e': seconds is required",
            "operation 'f': runsAfterFailure must be a boolean",
            "operation 'a': duplicate id",
            "operation 'd' depends on unknown operation 'ghost'",
        ]
        for problem in expected { #expect(found.contains(problem), "missing: \(problem)\nfound: \(found)") }
        #expect(found.count == expected.count, "\(found)")
    }

    /// An operation with a bad parameter (or kind, or dependencies) still takes part in the graph checks: its
    /// dependents are not told it does not exist, and what is not known of it makes no problem of its own.
    @Test func aDependencyOnAnOperationWithProblemsSaysNothingFalse() {
        let write: [String: Any] = ["id": "w", "kind": "write", "path": "out.png", "dependencies": ["s"]]
        let sepia: [String: Any] = ["id": "s", "kind": "sepia", "dependencies": ["d"]]
        for (d, problem) in [
            (["id": "d", "kind": "download", "url": "ftp://example.org/a"],
             "operation 'd': url scheme 'ftp' is not allowed (http, https, file)"),
            (["id": "d", "kind": "download", "url": "https://example.org/a", "maxBytes": 0],
             "operation 'd': maxBytes must be an integer from 1 to 9223372036854775807"),
            (["id": "d", "kind": "teleport"], "operation 'd': unknown kind 'teleport' (one of download, sepia, grayscale, blur, resize, "
                + "thumbnail, vignette, write, sleep, spin, fail, command)"),
            (["id": "d", "kind": "download", "url": "https://example.org/a", "dependencies": "z"],
             "operation 'd': dependencies must be an array of operation ids"),
        ] as [([String: Any], String)] {
            #expect(problems(["operations": [d, sepia, write]]) == [problem])
        }
        // Dependencies that did not parse: whether the operation has an input is not known.
        #expect(problems(["operations": [["id": "s", "kind": "sepia", "dependencies": [1]]]])
                == ["operation 's': dependencies must be an array of operation ids"])
        // An operation with no id has its other keys checked too.
        #expect(problems(["operations": [["kind": "sleep", "seconds": -1]]])
                == ["operations[0]: id is missing", "operations[0]: seconds must be a number from 0 to 31536000"])
    }

    /// A file URL must be under a root of download.fileRoots as written (`..` resolved, nothing on disk read but the
    /// roots themselves, which may be symbolic links).
    @Test func fileURLsOutsideTheRootsAreManifestProblems() throws {
        let folder = NSTemporaryDirectory() + "opq-roots-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: folder + "/real", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try FileManager.default.createSymbolicLink(atPath: folder + "/link", withDestinationPath: folder + "/real")
        func found(_ url: String, roots: [String]) throws -> [String] {
            let configuration = try Configuration.parse(plist(["download": ["fileRoots": roots]]))
            let manifest = plist(["operations": [["id": "d", "kind": "download", "url": url]]])
            if case .failure(let p) = Manifest.parse(manifest, configuration: configuration) { return p.problems }
            return []
        }
        #expect(try found("file:///srv/a.png", roots: []) == ["operation 'd': /srv/a.png is not under a configured file root "
                                                              + "(download.fileRoots is empty)"])
        #expect(try found("file://\(folder)/link/a.png", roots: [folder + "/link"]).isEmpty)
        #expect(try found("file://\(folder)/real/a.png", roots: [folder + "/link"]).isEmpty, "where the root leads")
        #expect(try found("file://\(folder)/real/../a.png", roots: [folder + "/real"])
                == ["operation 'd': \(folder)/real/../a.png is not under a configured file root (download.fileRoots)"])
        #expect(try found("file://\(folder)/realm/a.png", roots: [folder + "/real"]).count == 1, "a prefix is not a folder")
        #expect(try found("https://example.org/a.png", roots: []).isEmpty)
    }

    /// Each problem of an operation with a bad parameter is reported, once, naming it.
    @Test func anOperationWithABadParameterHasItsGraphProblemsReportedToo() throws {
        let configuration = try Configuration.parse(plist(["commands": [
            "count": ["argv": ["/bin/echo", "${n}"], "parameters": ["n": "integer"], "output": "stdout"],
        ]]))
        func found(_ operations: [[String: Any]]) -> [String] {
            if case .failure(let p) = Manifest.parse(plist(["operations": operations]), configuration: configuration) { return p.problems }
            return []
        }
        let pause: [String: Any] = ["id": "a", "kind": "sleep", "seconds": 0]
        #expect(found([pause, ["id": "a", "kind": "download", "url": "ftp://example.org/a"]])
                == ["operation 'a': url scheme 'ftp' is not allowed (http, https, file)", "operation 'a': duplicate id"])
        #expect(found([["id": "c", "kind": "command", "command": "count", "arguments": ["n": "many"], "dependencies": ["ghost"]]])
                == ["operation 'c': argument 'n' must be an integer", "operation 'c' depends on unknown operation 'ghost'"])
        let cycle = found([["id": "a", "kind": "sleep", "seconds": 0, "dependencies": ["b"]],
                           ["id": "b", "kind": "download", "url": "ftp://example.org/a", "dependencies": ["a"]]])
        #expect(cycle.count == 2 && cycle.first == "operation 'b': url scheme 'ftp' is not allowed (http, https, file)", "\(cycle)")
        #expect(cycle.contains { ["cycle: a → b → a", "cycle: b → a → b"].contains($0) }, "\(cycle)")
        // Path conflicts and inputs: a write with a bad quality still writes its path; a sepia with a bad intensity
        // still hands over an image.
        let d: [String: Any] = ["id": "d", "kind": "download", "url": "https://example.org/a"]
        #expect(found([d, ["id": "w1", "kind": "write", "path": "x.bin", "quality": 0, "dependencies": ["d"]],
                       ["id": "w2", "kind": "write", "path": "x.bin", "dependencies": ["d"]]])
                == ["operation 'w1': quality must be an integer from 1 to 100", "operations 'w1' and 'w2' both write 'x.bin'"])
        #expect(found([d, ["id": "s", "kind": "sepia", "intensity": 2, "dependencies": ["d"]],
                       ["id": "w", "kind": "write", "path": "photo", "dependencies": ["s"]],
                       ["id": "z", "kind": "sleep", "seconds": 0], ["id": "g", "kind": "grayscale", "input": "z"]])
                == ["operation 's': intensity must be a number from 0 to 1",
                    "operation 'w': format is required to write the image of 's' when the path does not end in .png, .jpg or .jpeg",
                    "operation 'g': its input 'z' hands over no output; grayscale needs an image"])
    }

    /// A dictionary that gives a key twice is ambiguous: the manifest (or configuration) is refused, naming the key.
    @Test func aKeyGivenTwiceIsRefused() throws {
        func xml(_ body: String) -> Data {
            Data("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<plist version=\"1.0\">\n\(body)</plist>\n".utf8)
        }
        func refused(_ data: Data) -> [String] {
            if case .failure(let p) = Manifest.parse(data, configuration: .builtIn) { return p.problems }
            return []
        }
        #expect(refused(xml("<dict>\n<key>job</key><string>a</string>\n<key>job</key><string>b</string>\n"
                            + "<key>operations</key><array/>\n</dict>"))
                == ["not a property list: line 5: the key 'job' is given twice in one <dict> (first on line 4)"])
        let operation = "<dict><key>id</key><string>d</string><key>kind</key><string>download</string>\n"
            + "<key>url</key><string>https://example.org/a</string>\n<key>url</key><string>https://example.org/b</string></dict>\n"
        #expect(refused(xml("<dict><key>operations</key><array>\n\(operation)</array></dict>\n"))
                == ["not a property list: line 6: the key 'url' is given twice in one <dict> (first on line 5)"])
        do {
            _ = try Configuration.parse(xml("<dict><key>maxActiveJobs</key><integer>1</integer>\n"
                                            + "<key>maxActiveJobs</key><integer>2</integer></dict>"), path: "c.plist")
            Issue.record("a configuration with a key given twice was taken")
        } catch let error as Configuration.Invalid {
            #expect(error.description == "c.plist: not a property list: line 4: the key 'maxActiveJobs' is given twice in one <dict> "
                        + "(first on line 3)")
        }
    }

    /// Found by the fuzz campaign: a job timeout of 1e300 s reached the engine's timer and trapped.
    @Test func hugeManifestsGetShortAnswers() {
        let many = problems(["operations": Array(repeating: 7, count: 1000)])
        #expect(many.count == 101)
        #expect(many.first == "operations[0]: must be a dictionary")
        #expect(many.last == "… and 900 more problems")
        let long = String(repeating: "k", count: 1_000_000)
        let clipped = problems(["operations": [["id": "a", "kind": "sleep", "seconds": 0, long: 1]]])
        #expect(clipped == ["operation 'a': unknown key '\(String(repeating: "k", count: 80))… (1000000 bytes)' for kind 'sleep'"])
    }

    @Test func absurdTimesAreRejected() {
        let op: [String: Any] = ["id": "a", "kind": "sleep", "seconds": 0]
        #expect(problems(["timeoutSeconds": 3.5e300, "operations": [op]])
                    == ["timeoutSeconds: must be a positive number of seconds, less than 1e9"])
        #expect(problems(["operations": [op.merging(["timeoutSeconds": Double.infinity]) { $1 }]])
                    .first?.contains("timeoutSeconds") == true)
        #expect(problems(["operations": [op.merging(["retryDelaySeconds": 1e20]) { $1 }]]).first?.contains("retryDelaySeconds") == true)
    }

    /// The keys a job and its operations share are read by one reader: each problem worded for where it was found.
    @Test func sharedKeysNameWhereTheyWereFound() {
        let bad: [String: Any] = ["qualityOfService": "fast", "queuePriority": 9, "timeoutSeconds": 0]
        let qos = "must be one of userInteractive, userInitiated, default, utility, background"
        let priority = "must be one of veryLow, low, normal, high, veryHigh"
        let timeout = "must be a positive number of seconds, less than 1e9"
        #expect(problems(bad.merging(["operations": [["id": "a", "kind": "sleep", "seconds": 0]]]) { $1 })
                    == ["qualityOfService: \(qos)", "queuePriority: \(priority)", "timeoutSeconds: \(timeout)"])
        #expect(problems(["operations": [bad.merging(["id": "a", "kind": "sleep", "seconds": 0]) { $1 }]])
                    == ["operation 'a': qualityOfService \(qos)", "operation 'a': queuePriority \(priority)",
                        "operation 'a': timeoutSeconds \(timeout)"])
    }

    /// A resize that must make more pixels than an image may have is rejected before anything runs; `fit`, whose
    /// result depends on the input, is checked when it runs (ImageTests).
    @Test func absurdSizesAreRejected() {
        let resize: [String: Any] = ["id": "r", "kind": "resize", "width": 1_000_000, "height": 1_000_000, "dependencies": ["d"]]
        func found(_ r: [String: Any]) -> [String] {
            problems(["operations": [["id": "d", "kind": "download", "url": "https://example.org/a"], r]])
        }
        #expect(found(resize.merging(["mode": "stretch"]) { $1 })
            == ["operation 'r': 1000000×1000000 is more pixels than image.maxPixels (100000000)"])
        #expect(found(resize.merging(["mode": "fill"]) { $1 }).count == 1)
        #expect(found(resize.merging(["mode": "stretch", "width": 10_000]) { $1 }).isEmpty == false)
        #expect(found(resize.merging(["mode": "stretch", "width": 100]) { $1 }).isEmpty, "10⁸ pixels is the limit itself")
        #expect(found(resize).isEmpty, "fit")
    }

    @Test func cyclesNameTheOperationsAlongThem() {
        let found = problems(["operations": [
            ["id": "a", "kind": "sleep", "seconds": 0, "dependencies": ["c"]],
            ["id": "b", "kind": "sleep", "seconds": 0, "dependencies": ["a"]],
            ["id": "c", "kind": "sleep", "seconds": 0, "dependencies": ["b"]],
            ["id": "self", "kind": "sleep", "seconds": 0, "dependencies": ["self"]],
        ]])
        #expect(found.contains("cycle: self → self"))
        let rotations = ["cycle: a → b → c → a", "cycle: b → c → a → b", "cycle: c → a → b → c"]
        #expect(found.contains { rotations.contains($0) }, "\(found)")
    }

    @Test func unsafeWritePathsAreRefused() {
        for (path, reason) in [("/etc/passwd", "is absolute"), ("../x.png", "goes up with '..'"), ("a//b.png", "has an empty component"),
                               ("a/.hidden.png", "has a component starting with '.'"), ("", "is empty")] {
            #expect(Manifest.unsafePathReason(path) == reason, "\(path)")
        }
        #expect(Manifest.unsafePathReason("albums/2026/photo.png") == nil)
        let found = problems(["operations": [["id": "w", "kind": "write", "path": "../../etc/x.png"]]])
        #expect(found.contains("operation 'w': path '../../etc/x.png' goes up with '..'"))
    }

    /// Two owners of one file in the job folder are a manifest problem, not an output lost at run time.
    @Test func twoOwnersOfOneFileAreAProblem() throws {
        let configuration = try Configuration.parse(plist(["commands": [
            "tar": ["argv": ["/usr/bin/tar", "-c", "${input}"], "output": "stdout"],
        ]]))
        func found(_ operations: [[String: Any]]) -> [String] {
            if case .failure(let p) = Manifest.parse(plist(["operations": operations]), configuration: configuration) { return p.problems }
            return []
        }
        let d: [String: Any] = ["id": "d", "kind": "download", "url": "https://example.org/a"]
        func write(_ id: String, _ path: String) -> [String: Any] { ["id": id, "kind": "write", "path": path, "dependencies": ["d"]] }
        let c: [String: Any] = ["id": "c", "kind": "command", "command": "tar", "arguments": [String: Any](), "dependencies": ["d"]]
        #expect(found([d, write("w1", "same.bin"), write("w2", "same.bin")]) == ["operations 'w1' and 'w2' both write 'same.bin'"])
        #expect(found([d, write("w", "logs/c.stderr"), c])
                == ["operation 'w' writes 'logs/c.stderr', the standard error log of command operation 'c'"])
        #expect(found([d, write("w1", "a"), write("w2", "a/b/c.bin")])
                == ["operation 'w2' writes 'a/b/c.bin' inside 'a', which is a file (written by operation 'w1')"])
        #expect(found([d, write("w", "result.plist/x.bin")])
                == ["operation 'w' writes 'result.plist/x.bin' inside 'result.plist', which is a file (the daemon's own)"])
        #expect(found([d, c, write("w", "logs")]) == ["operation 'w' writes 'logs', the folder of command operation 'c''s logs"])
        #expect(found([d, c, write("w1", "a/b.bin"), write("w2", "a/c.bin"), write("w3", "logs/other.txt")]) == [])
    }

    /// A `real` argument of any size is an argument, spelled as the user wrote it: a whole number past Int's range
    /// once stopped the daemon (and again at each restart, its manifest being in active/).
    @Test func aRealArgumentOfAnySizeIsSpelledNotTrapped() throws {
        let configuration = try Configuration.parse(plist(["commands": [
            "echo": ["argv": ["/bin/echo", "${r}"], "parameters": ["r": "real"], "output": "stdout"],
        ]]))
        func argument(_ value: Double) -> String? {
            let manifest = ["operations": [["id": "c", "kind": "command", "command": "echo", "arguments": ["r": value]]]]
            guard case .success(let plan) = Manifest.parse(plist(manifest), configuration: configuration),
                  case .command(_, let arguments) = plan.operations[0].parameters else { return nil }
            return arguments["r"]
        }
        #expect(argument(1e300) == "1e+300")
        #expect(argument(1e19) == "1e+19")
        #expect(argument(-9.3e18) == "-9.3e+18")
        #expect(argument(42) == "42")
        #expect(argument(2.5) == "2.5")
    }

    /// SPEC §3.3: bytes (a download's, a command's, another write's) are written under any name with no `format`;
    /// only a write of an image needs one its path does not give, and which is which is known from the graph.
    @Test func bytesAreWrittenUnderAnyNameAndOnlyAnImageNeedsAFormat() throws {
        let configuration = try Configuration.parse(plist(["commands": [
            "tar": ["argv": ["/usr/bin/tar", "-c", "${input}"], "output": "stdout"],
            "touch": ["argv": ["/usr/bin/touch", "${workdir}/x"], "output": "none"],
        ]]))
        func found(_ operations: [[String: Any]]) -> [String] {
            if case .failure(let p) = Manifest.parse(plist(["operations": operations]), configuration: configuration) { return p.problems }
            return []
        }
        let download: [String: Any] = ["id": "d", "kind": "download", "url": "https://example.org/a"]
        #expect(found([download, ["id": "w", "kind": "write", "path": "out.txt", "dependencies": ["d"]]]) == [])
        #expect(found([download, ["id": "t", "kind": "command", "command": "tar", "arguments": [String: Any](), "dependencies": ["d"]],
                       ["id": "w", "kind": "write", "path": "report.json", "dependencies": ["t"]],
                       ["id": "w2", "kind": "write", "path": "a.tar.gz", "input": "t"],
                       ["id": "w3", "kind": "write", "path": "copy", "dependencies": ["w"]]]) == [])
        let image: [[String: Any]] = [download, ["id": "s", "kind": "sepia", "dependencies": ["d"]]]
        #expect(found(image + [["id": "w", "kind": "write", "path": "photo", "dependencies": ["s"]]])
                == ["operation 'w': format is required to write the image of 's' when the path does not end in .png, .jpg or .jpeg"])
        #expect(found(image + [["id": "w", "kind": "write", "path": "photo", "format": "jpeg", "dependencies": ["s"]]]) == [])
        #expect(found(image + [["id": "w", "kind": "write", "path": "photo.JPG", "dependencies": ["s"]]]) == [])
        // The input is the first dependency with an output: a sleep has none, a command declared `output = none` neither.
        #expect(found(image + [["id": "z", "kind": "sleep", "seconds": 0],
                               ["id": "n", "kind": "command", "command": "touch", "arguments": [String: Any]()],
                               ["id": "w", "kind": "write", "path": "p", "dependencies": ["z", "n", "s", "d"]]]).count == 1)
        #expect(found(image + [["id": "w", "kind": "write", "path": "p", "dependencies": ["d", "s"]]]) == [], "the download comes first")
        #expect(found(image + [["id": "w", "kind": "write", "path": "p", "format": "gif", "dependencies": ["d"]]])
                == ["operation 'w': format must be png or jpeg"])
    }

    @Test func photosURLFormStartsWithTheListDownload() throws {
        guard case .success(let plan) = Manifest.parse(plist(["job": "album", "photosURL": "https://example.org/photos.plist"]),
                                                       configuration: .builtIn) else {
            Issue.record("the photosURL form was refused")
            return
        }
        #expect(plan.photosURL == "https://example.org/photos.plist")
        #expect(plan.operations.map(\.id) == ["photos"])
        #expect(plan.operations.first?.queue == "downloads")
        #expect(problems(["photosURL": "https://h/p.plist", "operations": [["id": "a", "kind": "sleep", "seconds": 0]]])
                    == ["photosURL: cannot be combined with operations"])
        #expect(problems(["photosURL": "ftp://h/p.plist"]) == ["photosURL: must be an http, https or file URL string"])
    }

    @Test func writePathsCannotTakeTheDaemonsOwnFiles() {
        let d: [String: Any] = ["id": "d", "kind": "download", "url": "https://example.org/a"]
        func write(_ id: String, _ path: String) -> [String: Any] {
            ["id": id, "kind": "write", "path": path, "format": "png", "dependencies": ["d"]]
        }
        let found = problems(["operations": [d, write("w", "result.plist"), write("v", "sub/result.plist")]])
        #expect(found == ["operation 'w': path 'result.plist' is the daemon's own file in the job folder"])
    }

    /// An image operation or a write with nothing handed to it is a manifest problem, not a failure once it runs.
    @Test func anOperationThatNeedsAnInputAndHasNoneIsAProblem() {
        let pause: [String: Any] = ["id": "z", "kind": "sleep", "seconds": 0]
        #expect(problems(["operations": [pause, ["id": "s", "kind": "sepia", "dependencies": ["z"]],
                                         ["id": "w", "kind": "write", "path": "out.png", "dependencies": ["s"]]]])
                == ["operation 's': sepia needs an image: give it a dependency that has an output (a download, an image operation, "
                    + "a write or a command), or `input`"])
        #expect(problems(["operations": [pause, ["id": "w", "kind": "write", "path": "out.bin", "input": "z"]]])
                == ["operation 'w': its input 'z' hands over no output; write needs something to write"])
        #expect(problems(["operations": [["id": "w", "kind": "write", "path": "out.bin"]]]).count == 1)
    }

    @Test func photoListFormBuildsDownloadSepiaWriteChains() {
        let ops = Manifest.photoListOperations(["Beach at dusk": "https://h/a.jpg", "cat": "https://h/c.jpg"], configuration: .builtIn)
        #expect(ops.map(\.id) == ["download-Beach_at_dusk", "sepia-Beach_at_dusk", "write-Beach_at_dusk", "download-cat", "sepia-cat",
                                  "write-cat"])
        #expect(ops.map(\.queue) == ["downloads", "filters", "io", "downloads", "filters", "io"])
        #expect(ops[2].parameters == .write(path: "Beach_at_dusk.png", format: "png", quality: 90))
        #expect(ops[1].parameters == .sepia(intensity: 0.8))
    }

    @Test func notAPropertyListOrNotADictionary() {
        if case .failure(let p) = Manifest.parse(Data("{ a = b; }".utf8), configuration: .builtIn) {
            #expect(p.problems == ["not a property list: the file is neither an XML nor a binary property list"])
        } else { Issue.record("accepted") }
        #expect(problems(["a", "b"]) == ["the top level must be a dictionary, not an array"])
        #expect(problems([String: Any]()) == ["operations: missing (an array of operations is required)"])
    }

    @Test func configurationMergesWithTheBuiltIns() throws {
        let config = try Configuration.parse(plist([
            "queues": ["io": ["maxConcurrentOperationCount": 1],
                       "gpu": ["maxConcurrentOperationCount": 2, "qualityOfService": "userInitiated", "suspended": true]],
            "defaultQueues": ["image": "gpu"], "maxActiveJobs": 8,
        ]))
        #expect(config.queues["io"] == QueueSettings(maxConcurrentOperationCount: 1, qualityOfService: .utility, suspended: false))
        #expect(config.queues["gpu"]?.suspended == true)
        #expect(config.queueNames == ["default", "downloads", "filters", "io", "gpu"])
        #expect(config.defaultQueues == ["download": "downloads", "image": "gpu", "write": "io", "other": "default"])
        #expect(config.maxActiveJobs == 8)
        #expect(throws: Configuration.Invalid.self) { try Configuration.parse(plist(["queus": [:]])) }
        do {
            _ = try Configuration.parse(plist(["queues": ["q": ["maxConcurrentOperationCount": 0]], "maxActiveJobs": -1]), path: "c.plist")
        } catch let error as Configuration.Invalid {
            #expect(error.description == "c.plist: queues.q.maxConcurrentOperationCount: must be -1 or a positive integer\n"
                        + "c.plist: maxActiveJobs: must be a positive integer")
        }
    }

    @Test func identifiers() {
        #expect(sanitizedIdentifier("Beach at dusk!") == "Beach_at_dusk_")
        #expect(sanitizedIdentifier("photo-ünïcode") == "photo-_n_code")
        #expect(sanitizedIdentifier(String(repeating: "x", count: 300)).count == 128)
        #expect(isValidIdentifier("a.b_c-1"))
        #expect(!isValidIdentifier(".a"))
        #expect(!isValidIdentifier(""))
    }
}

extension ManifestTests {
    /// A manifest read again as accepted (a delayed job whose time came, a job resumed at a restart) keeps a queue and
    /// a command the configuration has lost since, by name; its other problems are still problems.
    @Test func anAcceptedManifestKeepsAQueueAndACommandRemovedSince() throws {
        let manifest = plist(["job": "kept", "operations": [
            ["id": "q", "kind": "sleep", "seconds": 0, "queue": "gone"],
            ["id": "c", "kind": "command", "command": "vanished", "arguments": ["x": "1"]],
            ["id": "w", "kind": "write", "path": "out.bin", "input": "c"],
        ]])
        guard case .failure(let refused) = Manifest.parse(manifest, configuration: .builtIn) else {
            Issue.record("a new manifest naming them is refused")
            return
        }
        #expect(refused.problems.contains { $0.hasPrefix("operation 'q': unknown queue 'gone'") })
        #expect(refused.problems.contains { $0.hasPrefix("operation 'c': unknown command 'vanished'") })
        let plan = try Manifest.parse(ManifestTree(manifest), configuration: .builtIn, accepted: true).get()
        #expect(plan.operations.map(\.queue) == ["gone", "default", "io"])
        #expect(plan.operations[1].parameters == .command(name: "vanished", arguments: [:]))
        let broken = plist(["job": "kept", "operations": [["id": "q", "kind": "sleep", "queue": "gone"]]])
        guard case .failure(let still) = Manifest.parse(ManifestTree(broken), configuration: .builtIn, accepted: true) else {
            Issue.record("a missing key is still a problem")
            return
        }
        #expect(still.problems == ["operation 'q': seconds is required"])
    }
}
