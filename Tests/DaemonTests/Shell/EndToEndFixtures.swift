// The end-to-end tests' fixtures: the built binaries, running a program with a deadline, a temporary spool
// with its own daemon (TestSpool), and a Unix-socket server that is not opqueued.

import ControlPlane
import Foundation
import SystemCalls
import Testing
import TestSupport
@testable import Daemon

/// The clone's root: two folders above Tests/Support (TestSupport's own file says where it is).
let repositoryRoot = URL(fileURLWithPath: supportFolder).deletingLastPathComponent().deletingLastPathComponent().path
let binaries = repositoryRoot + "/.build/debug"

struct Run {
    let status: Int32
    let stdout: String
    let stderr: String
}

/// Runs a program to its end (at most `timeout` seconds); `input`, when given, is its standard input.
@discardableResult
func run(_ program: String, _ arguments: [String], input: Data? = nil, timeout: Double = 30) throws -> Run {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: program.hasPrefix("/") ? program : binaries + "/" + program)
    process.arguments = arguments
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    let stdin = input.map { _ in Pipe() }
    if let stdin { process.standardInput = stdin }
    try process.run()
    if let input, let stdin {
        // From another thread: a program that answers before it has read everything must not block this one.
        Thread.detachNewThread {
            stdin.fileHandleForWriting.write(input)
            try? stdin.fileHandleForWriting.close()
        }
    }
    // Both pipes are drained on threads of their own, so that a program that hangs is killed at the deadline
    // (reading to the end first waited for it, and its test, for good).
    let outData = DrainedPipe(out), errData = DrainedPipe(err)
    let deadline = Date().addingTimeInterval(timeout)
    while process.isRunning && Date() < deadline { usleep(10_000) }
    if process.isRunning {
        process.terminate()
        usleep(200_000)
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
    process.waitUntilExit()
    // Children it left holding the pipes are not waited for past 5 s.
    return Run(status: process.terminationStatus, stdout: String(decoding: outData.data(waiting: 5), as: UTF8.self),
               stderr: String(decoding: errData.data(waiting: 5), as: UTF8.self))
}

/// A pipe read to its end on a thread of its own.
final class DrainedPipe: @unchecked Sendable {
    private let lock = NSLock()
    private var read = Data()
    private let done = DispatchSemaphore(value: 0)

    init(_ pipe: Pipe) {
        Thread.detachNewThread { [self] in
            let data = pipe.fileHandleForReading.readDataToEndOfFile()
            lock.withLock { read = data }
            done.signal()
        }
    }

    /// What was read, once the pipe ended or after `seconds` (then what was read by then: nothing).
    func data(waiting seconds: Double) -> Data {
        _ = done.wait(timeout: .now() + seconds)
        return lock.withLock { read }
    }
}

/// A temporary spool and, when started, a daemon on it.
final class TestSpool: @unchecked Sendable {
    let root: String
    var daemon: Process?
    var logPath: String { root + ".log" }
    /// The configuration `configure` writes (removed with the spool).
    var configPath: String { root + ".config.plist" }
    /// Variables added to the daemon's environment (internal settings, such as a smaller delayed window).
    var environment: [String: String] = [:]

    init() {
        root = NSTemporaryDirectory() + "opq-test-" + UUID().uuidString.prefix(8)
        try? FileManager.default.createDirectory(atPath: root + "/inbox", withIntermediateDirectories: true)
    }

    deinit {
        if let daemon, daemon.isRunning { kill(daemon.processIdentifier, SIGKILL); daemon.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: root)
        try? FileManager.default.removeItem(atPath: logPath)
        try? FileManager.default.removeItem(atPath: configPath)
    }

    /// Writes the daemon's configuration; returns the arguments that use it.
    @discardableResult
    func configure(_ settings: [String: Any]) throws -> [String] {
        try plist(settings).write(to: URL(fileURLWithPath: configPath))
        return ["--config", configPath]
    }

    /// Writes a manifest the way users should: a hidden name, then a rename into the inbox.
    func drop(_ name: String, _ manifest: Any) throws {
        let hidden = root + "/inbox/." + name
        try writeWhole(hidden, [UInt8](plist(manifest)))
        guard rename(hidden, root + "/inbox/" + name) == 0 else { throw POSIXError(.EIO) }
    }

    /// Starts the daemon and waits until its control socket answers.
    func start(_ extra: [String] = [], target: String = "console") throws {
        try launch(extra, target: target)
        // Ready when the socket accepts connections.
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            if (try? ControlClient.request(root + "/opqueued.sock", ["command": "status"], timeout: 1)) != nil { return }
            usleep(20_000)
        }
        Issue.record("the daemon did not become ready")
    }

    /// Starts the daemon, its output appended to `logPath`, without waiting for it.
    func launch(_ extra: [String] = [], target: String = "console") throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binaries + "/opqueued")
        process.arguments = ["--spool", root, "--log-target", target] + extra
        if !environment.isEmpty { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        if !FileManager.default.fileExists(atPath: logPath) { _ = FileManager.default.createFile(atPath: logPath, contents: nil) }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        process.standardError = log
        process.standardOutput = log
        try process.run()
        daemon = process
    }

    func signal(_ sig: Int32) {
        if let daemon { kill(daemon.processIdentifier, sig) }
    }

    /// SIGSTOP, then waits until every thread of the daemon is stopped; whether they all were within `seconds`. The
    /// kernel stops each thread as it next runs it: on a busy machine one may still act for milliseconds after kill().
    @discardableResult
    func freeze(within seconds: Double = 10) -> Bool {
        guard let pid = daemon?.processIdentifier else { return false }
        kill(pid, SIGSTOP)
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
            let stopped = threads.allSatisfy { task in
                let state = Int32(task).flatMap { statFields($0)?.fields.first }
                return state == "T" || state == "t"
            }
            if !threads.isEmpty && stopped { return true }
            usleep(2_000)
        }
        return false
    }

    /// Waits for the daemon to exit; returns its status.
    func waitForExit(timeout: Double = 30) -> Int32? {
        guard let daemon else { return nil }
        let deadline = Date().addingTimeInterval(timeout)
        while daemon.isRunning && Date() < deadline { usleep(10_000) }
        if daemon.isRunning { return nil }
        return daemon.terminationStatus
    }

    func result(_ job: String, timeout: Double = 20) -> [String: Any]? {
        let path = root + "/outbox/" + job + "/result.plist"
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let data = FileManager.default.contents(atPath: path) {
                return try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any]
            }
            usleep(20_000)
        }
        return nil
    }

    func ctl(_ arguments: [String], input: Data? = nil) throws -> Run { try run("opqueuectl", ["--spool", root] + arguments, input: input) }

    func list(_ folder: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: root + "/" + folder)) ?? []).filter { !$0.hasPrefix(".") }.sorted()
    }
}

/// A property list's bytes (XML, or binary) from Foundation's objects: the tests' manifests and configurations.
func plist(_ object: Any, binary: Bool = false) -> Data {
    (try? PropertyListSerialization.data(fromPropertyList: object, format: binary ? .binary : .xml, options: 0)) ?? Data()
}

func sleepOp(_ id: String, _ seconds: Double, deps: [String] = []) -> [String: Any] {
    ["id": id, "kind": "sleep", "seconds": seconds, "dependencies": deps]
}

/// What a test's own set-up throws when something it needs went wrong.
struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A Unix-socket server that is not opqueued: each connection is handed to `serve` on a thread of its own, then closed.
final class Impostor: @unchecked Sendable {
    private let fd: Int32
    private let lock = NSLock()
    private var stopped = false

    init(path: String, serve: @escaping @Sendable (Int32) -> Void) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        let bound = try withUnixAddress(path) { [fd] in bind(fd, $0, $1) }
        guard bound == 0, listen(fd, 8) == 0 else { close(fd); throw POSIXError(.EADDRINUSE) }
        let listening = fd
        Thread.detachNewThread { [self] in
            while true {
                let client = accept(listening, nil, nil)
                guard client >= 0 else { return }
                if lock.withLock({ stopped }) { close(client); return }
                Thread.detachNewThread {
                    serve(client)
                    close(client)
                }
            }
        }
    }

    func stop() {
        lock.withLock { stopped = true }
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }
}

/// Fields of /proc/PID/stat after the command name: state, ppid, pgrp, …; nil when the process is gone.
func statFields(_ pid: Int32) -> (comm: String, fields: [Substring])? {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")") else { return nil }
    return (String(stat[stat.index(after: open)..<close]), stat[stat.index(after: close)...].split(separator: " "))
}
