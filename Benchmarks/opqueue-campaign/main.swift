// opqueue-campaign: the reliability campaigns of issue 5, each printing its figures and exiting 1 if
// anything was lost, duplicated, inconsistent, crashed or hung. `.ci/run` (make test) runs them at a
// bounded size; `make campaigns` at full size.
//
//   crash    [--jobs N] [--kills K]      kill -9 at random moments and at crash points, then check the outbox
//   faults                               full file system, EMFILE, read-only outbox, slow disk (root)
//   fuzz     [--manifests N] [--images N]  mutated manifests and images through the real daemon
//   load     [--manifests N] [--operations N]  a mass drop and one huge manifest: RSS, journal, status p99
//
// Common: --parent FOLDER (where spools are made; default /tmp), --seed S.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

var arguments = Array(CommandLine.arguments.dropFirst())
guard let campaign = arguments.first else {
    FileHandle.standardError.write(Data("usage: opqueue-campaign crash|faults|fuzz|load [options]\n".utf8))
    exit(64)
}
arguments.removeFirst()
var options: [String: String] = [:]
while arguments.count >= 2, arguments[0].hasPrefix("--") {
    options[String(arguments[0].dropFirst(2))] = arguments[1]
    arguments.removeFirst(2)
}
guard arguments.isEmpty else {
    FileHandle.standardError.write(Data("opqueue-campaign: unexpected argument \(arguments[0])\n".utf8))
    exit(64)
}
let settings = options
func option(_ name: String, _ fallback: Int) -> Int { settings[name].flatMap { Int($0) } ?? fallback }
let parent = options["parent"] ?? "/tmp"
let seed = UInt64(options["seed"] ?? "") ?? UInt64(now() * 1000)
say("campaign=\(campaign) seed=\(seed)")

do {
    let ok: Bool
    switch campaign {
    case "crash":
        ok = try CrashCampaign(jobs: option("jobs", 3000), kills: option("kills", 500), parent: parent, seed: seed).run()
    case "faults":
        ok = try FaultCampaign(parent: parent, jobs: option("jobs", 40), only: options["fault"]).run()
    case "fuzz":
        ok = try FuzzCampaign(manifests: option("manifests", 100_000), images: option("images", 10_000), parent: parent, seed: seed).run()
    case "load":
        ok = try LoadCampaign(manifests: option("manifests", 100_000), operations: option("operations", 1_000_000), parent: parent).run()
    default:
        FileHandle.standardError.write(Data("opqueue-campaign: unknown campaign \(campaign)\n".utf8))
        exit(64)
    }
    exit(ok ? 0 : 1)
} catch {
    FileHandle.standardError.write(Data("opqueue-campaign \(campaign): \(error)\n".utf8))
    exit(1)
}
