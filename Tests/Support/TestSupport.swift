// What the tests, the campaigns and the benchmarks share: the loopback HTTP server (http_server.py beside
// this file), a journald to log to, a process's memory figures, and a deterministic random generator.

import Daemon
import Foundation
import SystemCalls
import SystemdJournal

#if canImport(Glibc)
import Glibc
#endif

/// Tests/Support, where the helper scripts are.
public let supportFolder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().path

public struct SupportFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// http_server.py on a free port of a loopback address (127.0.0.1 unless told), serving `folder`;
/// killed when released.
public final class LoopbackServer {
    let process = Process()
    public let folder: String
    public let address: String
    public let port: Int

    public init(folder: String, address: String = "127.0.0.1") throws {
        self.folder = folder
        self.address = address
        port = try startHelperServer(process, ["http_server.py", folder, address], failure: "the loopback HTTP server did not start")
    }

    public var base: String { "http://\(address):\(port)" }
    public func url(_ path: String) -> String { base + path }

    /// The paths of the requests the server has seen, in order (from FOLDER/requests.log).
    public var requests: [String] {
        ((try? String(contentsOfFile: folder + "/requests.log", encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    deinit {
        // SIGKILL: the child inherits its parent's signal mask, in which SIGTERM may be blocked (swift test).
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }
}

/// Starts journald when none listens (a machine without systemd as PID 1). It outlives the caller, so it
/// must not hold the caller's output pipes open. One caller at a time, in this process and across processes (a
/// lock file): two suites that both found none listening started two journalds writing the same journal files.
public func ensureJournald() throws {
    if journalIsListening() { return }
    try FileManager.default.createDirectory(atPath: "/run/systemd/journal", withIntermediateDirectories: true)
    let lock = open("/run/systemd/journal/.opqueued-tests.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
    guard lock >= 0 else { throw SupportFailure("cannot open the journald start lock: errno \(errno)") }
    defer { close(lock) }
    guard retryingInterrupts({ flock(lock, LOCK_EX) }) == 0 else {
        throw SupportFailure("cannot take the journald start lock: errno \(errno)")
    }
    try startJournaldLocked()
}

/// With the start lock held.
private func startJournaldLocked() throws {
    if journalIsListening() { return }
    // A socket file left by a journald that is gone would make the wait below end at once.
    try? FileManager.default.removeItem(atPath: journalSocketPath)
    let journald = Process()
    journald.executableURL = URL(fileURLWithPath: "/lib/systemd/systemd-journald")
    journald.standardInput = FileHandle.nullDevice
    journald.standardOutput = FileHandle.nullDevice
    journald.standardError = FileHandle.nullDevice
    try journald.run()
    let deadline = Date().addingTimeInterval(10)
    while !journalIsListening() && Date() < deadline { usleep(20_000) }
    if !journalIsListening() { throw SupportFailure("journald did not start listening on \(journalSocketPath)") }
}

/// A figure of /proc/PID/status in megabytes: "VmHWM" (peak RSS) or "VmRSS"; 0 once the process is gone.
public func processMemoryMB(_ pid: Int32, _ field: String = "VmHWM") -> Double {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") }),
          let kb = Double(line.split(separator: " ").dropFirst().first ?? "") else { return 0 }
    return kb / 1024
}

/// SplitMix64: the same numbers for the same seed, so runs can be repeated.
public struct SplitMix: RandomNumberGenerator {
    public var state: UInt64
    public init(state: UInt64) { self.state = state }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The lowest descriptor number process `pid` has free (/proc/PID/fd).
public func lowestFreeDescriptor(_ pid: Int32) -> Int {
    let open = Set(((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []).compactMap { Int($0) })
    var n = 0
    while open.contains(n) { n += 1 }
    return n
}

/// A process's open descriptors and what each refers to (`/proc/PID/fd`), for a failure's message.
public func descriptorTable(_ pid: Int32) -> [Int: String] {
    let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
    var table: [Int: String] = [:]
    for name in names {
        guard let fd = Int(name) else { continue }
        table[fd] = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(name)")) ?? "?"
    }
    return table
}

/// What changed between two descriptor tables, one line per descriptor opened, closed or replaced.
public func descriptorChanges(from before: [Int: String], to after: [Int: String]) -> String {
    Set(before.keys).union(after.keys).sorted().compactMap { fd -> String? in
        guard before[fd] != after[fd] else { return nil }
        return "\(fd): \(before[fd] ?? "-") -> \(after[fd] ?? "-")"
    }.joined(separator: "; ")
}

/// The clocks of a process's timerfds (the daemon's own look at itself, `Daemon.timerClocks`).
public func timerClocks(_ pid: Int32) -> Set<Int> { Daemon.timerClocks(process: "\(pid)") }

/// The lowest free descriptor number seen most often in six looks 50 ms apart. As a soft RLIMIT_NOFILE it leaves
/// the process no descriptor: every number below it is taken (a count of descriptors would leave the holes below a
/// high one free), and a file reopened or a connection open at one look does not move it.
public func steadyLowestFreeDescriptor(_ pid: Int32) -> Int {
    var seen: [Int: Int] = [:]
    for _ in 0..<6 {
        seen[lowestFreeDescriptor(pid), default: 0] += 1
        usleep(50_000)
    }
    return seen.max { $0.value < $1.value }?.key ?? 0
}

/// Runs one of the tests' Python servers (`arguments[0]`, a script beside this file) in `process` and returns the
/// port it prints on its first line; kills it and throws `failure` when no port comes.
func startHelperServer(_ process: Process, _ arguments: [String], failure: String) throws -> Int {
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = ["python3", supportFolder + "/" + arguments[0]] + arguments.dropFirst()
    let out = Pipe()
    process.standardOutput = out
    process.standardError = FileHandle.nullDevice
    process.standardInput = FileHandle.nullDevice
    try process.run()
    var line = Data()
    while !line.contains(0x0A) {
        let chunk = out.fileHandleForReading.availableData
        if chunk.isEmpty { break }
        line.append(chunk)
    }
    guard let port = Int(String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) else {
        kill(process.processIdentifier, SIGKILL)
        throw SupportFailure(failure)
    }
    return port
}

/// Process `pid`'s user and system CPU seconds so far (/proc/PID/stat); 0 when it cannot be read.
public func processCPUSeconds(_ pid: Int32) -> Double {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let end = stat.lastIndex(of: ")") else { return 0 }
    // After the command's closing parenthesis: state is field 3, utime 14 and stime 15.
    let fields = stat[stat.index(after: end)...].split(separator: " ")
    guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// Fills the file system holding `folder` (made if missing) with empty files until it has no inode left; how many
/// were made. errno is the last open's (ENOSPC when the file system is full).
public func fillWithEmptyFiles(_ folder: String) throws -> Int {
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    var count = 0
    while true {
        let fd = open(folder + "/\(count)", O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
        if fd < 0 { return count }
        close(fd)
        count += 1
    }
}
