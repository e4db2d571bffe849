// The control socket's answers (SPEC §1), typed: the daemon's handler returns one, the server writes it as one
// JSON object line, opqueuectl decodes it into the same type. Every answer has an `exit` (opqueuectl's exit status);
// one that is not 0 has an `error` too and nothing else (`ExitAnswer`). An optional field is absent from the JSON
// when nil. The JSON text is `ControlJSON`'s, its keys sorted.

import Foundation

/// What the daemon answers one request: `status`, `show` and the rest, each its type; cancel, suspend, resume and
/// every refusal answer an `ExitAnswer` alone. Encoded as the answer itself, with no tag.
public enum ControlAnswer: Encodable, Sendable, Equatable {
    case status(StatusAnswer)
    case declared(DeclaredAnswer)
    case submitted(SubmittedAnswer)
    case show(ShowAnswer)
    case metrics(MetricsAnswer)
    case exit(ExitAnswer)

    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .status(let answer): try answer.encode(to: encoder)
        case .declared(let answer): try answer.encode(to: encoder)
        case .submitted(let answer): try answer.encode(to: encoder)
        case .show(let answer): try answer.encode(to: encoder)
        case .metrics(let answer): try answer.encode(to: encoder)
        case .exit(let answer): try answer.encode(to: encoder)
        }
    }

    /// A refusal: `exit` (1 unknown, 3 try again, 64 usage) and why.
    public static func refused(_ exit: Int, _ error: String) -> ControlAnswer { .exit(ExitAnswer(exit: exit, error: error)) }
    /// Done, with nothing to say (cancel, suspend, resume).
    public static let done = ControlAnswer.exit(ExitAnswer(exit: 0))
}

/// Every answer's envelope, and the whole answer of cancel, suspend, resume and of a refusal: `{"exit": 0}`, or
/// `{"error": "…", "exit": 1}`. A client reads it first: an answer whose exit is not 0 is this and nothing more.
public struct ExitAnswer: Codable, Sendable, Equatable, Error, CustomStringConvertible {
    public var exit: Int
    public var error: String?

    public init(exit: Int, error: String? = nil) {
        self.exit = exit
        self.error = error
    }

    /// Read as opqueuectl always read it: an `exit` that is missing (or not an integer) is 0 without an `error`, else 1.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        error = try? container.decodeIfPresent(String.self, forKey: .error)
        exit = (try? container.decodeIfPresent(Int.self, forKey: .exit)) ?? (error == nil ? 0 : 1)
    }

    public var description: String { error ?? "the daemon answered exit \(exit)" }
}

/// `declared`: the queues and commands a manifest may name here (on a cluster node, those of every node), the
/// folders a `file://` download may read here, and whether this daemon is a cluster node. `commands`: each command's
/// name and its signature (CommandSignature). `fileRoots`: this daemon's `download.fileRoots` as configured (a
/// cluster node validates file URLs with its own); absent from an older daemon's answer (nil: not known).
public struct DeclaredAnswer: Codable, Sendable, Equatable {
    public var exit = 0
    public var queues: [String]
    public var commands: [String: String]
    public var fileRoots: [String]?
    public var cluster: Bool

    public init(queues: [String], commands: [String: String], fileRoots: [String]? = nil, cluster: Bool) {
        self.queues = queues
        self.commands = commands
        self.fileRoots = fileRoots
        self.cluster = cluster
    }
}

/// `submitted`: the id the daemon gave the manifest, once it has taken it; nil (absent) until then.
public struct SubmittedAnswer: Codable, Sendable, Equatable {
    public var exit = 0
    public var job: String?

    public init(job: String?) { self.job = job }
}

/// `metrics`: the daemon's metrics in the Prometheus text format.
public struct MetricsAnswer: Codable, Sendable, Equatable {
    public var exit = 0
    public var text: String

    public init(text: String) { self.text = text }
}

/// The JSON text of the control socket and of opqueuectl's `--json`: JSONEncoder's, keys sorted by code point
/// (`clusterSlotWait` before `clusterSlotsHeld`, queue `q10` before `q2`), so that the same answer is the same text.
public enum ControlJSON {
    public static func data(_ value: some Encodable, pretty: Bool = false) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = pretty ? [.prettyPrinted, .sortedKeys] : [.sortedKeys]
        return try encoder.encode(value)
    }

    /// An answer read back; throws the decoder's error.
    public static func decode<Answer: Decodable>(_ type: Answer.Type, from data: Data) throws -> Answer {
        try JSONDecoder().decode(type, from: data)
    }
}
