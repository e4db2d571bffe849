// The control socket's requests (SPEC §1: what status, show, cancel, suspend, resume and metrics ask the running
// daemon), typed. A request arrives as one JSON object `{"command": …, …}`; `init(wire:)` checks every field the
// command needs and says what is missing, and `wire` is what a client sends. The answers are typed too
// (ControlAnswer.swift): JSON objects with an `exit` (opqueuectl's exit status) and, on a refusal, an `error`.

public enum ControlRequest: Equatable, Sendable {
    /// The daemon's state; `memory`: with the heap's bytes in use (`status --memory`).
    case status(memory: Bool)
    /// The queues and commands a manifest may name here (a cluster's too), for submit and validate.
    case declared
    /// The id the daemon gave the manifest it took from inbox/`manifest` (that file, when `inode` is given).
    case submitted(manifest: String, inode: UInt64?)
    case show(job: String)
    /// A whole job (`operation` nil) or one operation and its dependents.
    case cancel(job: String, operation: String?)
    case metrics
    case suspend(queue: String)
    case resume(queue: String)

    /// A request that cannot be carried out as sent: exit 64 (usage), with why.
    public struct Refusal: Error, Equatable, Sendable {
        public let message: String
        public init(message: String) { self.message = message }
    }

    public init(wire request: [String: Any]) throws(Refusal) {
        let command = request["command"] as? String ?? ""
        func field(_ key: String) throws(Refusal) -> String {
            guard let value = request[key] as? String else { throw Refusal(message: "\(command) needs a \(key)") }
            return value
        }
        // Absent, or a string: anything else is a mistake to refuse, not a field to ignore (a cancel of one
        // operation sent as a number must not cancel the whole job).
        func optionalField(_ key: String) throws(Refusal) -> String? {
            guard let value = request[key] else { return nil }
            guard let string = value as? String else { throw Refusal(message: "\(command): \(key) must be a string") }
            return string
        }
        switch command {
        case "status": self = .status(memory: request["memory"] as? Bool == true)
        case "declared": self = .declared
        case "submitted":
            self = .submitted(manifest: try field("manifest"), inode: (request["inode"] as? Int).flatMap { UInt64(exactly: $0) })
        case "show": self = .show(job: try field("job"))
        case "cancel": self = .cancel(job: try field("job"), operation: try optionalField("operation"))
        case "metrics": self = .metrics
        case "suspend": self = .suspend(queue: try field("queue"))
        case "resume": self = .resume(queue: try field("queue"))
        default: throw Refusal(message: "unknown command '\(command)'")
        }
    }

    /// The JSON object a client sends for this request.
    public var wire: [String: Any] {
        switch self {
        case .status(let memory): return memory ? ["command": "status", "memory": true] : ["command": "status"]
        case .declared: return ["command": "declared"]
        case .submitted(let manifest, let inode):
            var request: [String: Any] = ["command": "submitted", "manifest": manifest]
            if let inode, let exact = Int(exactly: inode) { request["inode"] = exact }
            return request
        case .show(let job): return ["command": "show", "job": job]
        case .cancel(let job, let operation):
            return operation.map { ["command": "cancel", "job": job, "operation": $0] } ?? ["command": "cancel", "job": job]
        case .metrics: return ["command": "metrics"]
        case .suspend(let queue): return ["command": "suspend", "queue": queue]
        case .resume(let queue): return ["command": "resume", "queue": queue]
        }
    }
}
