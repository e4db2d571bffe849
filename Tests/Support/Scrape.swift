// Metrics text as Prometheus reads it: parsed by prometheus_client's own parser (metrics_client.py here, Debian's
// python3-prometheus-client), for the tests that check `opqueuectl metrics` and the HTTP listener.

import Foundation

/// The parser runs under Debian's Python, where `make deps` installs python3-prometheus-client.
public let systemPython = "/usr/bin/python3"

public struct Scrape {
    /// Every sample of the text, and each family's type, as prometheus_client read them.
    public let samples: [(name: String, labels: [String: String], value: Double)]
    public let types: [String: String]
    public let contentType: String?

    public init(json: String) throws {
        guard let object = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any] else {
            throw SupportFailure("not JSON: \(json)")
        }
        samples = (object["samples"] as? [[String: Any]] ?? []).map {
            ($0["name"] as? String ?? "", $0["labels"] as? [String: String] ?? [:], ($0["value"] as? NSNumber)?.doubleValue ?? .nan)
        }
        types = object["types"] as? [String: String] ?? [:]
        contentType = object["contentType"] as? String
    }

    /// The sample's value; 0 when the series does not exist yet (a counter before its first event).
    public func value(_ name: String, _ labels: [String: String] = [:]) -> Double {
        samples.first { $0.name == name && $0.labels == labels }?.value ?? 0
    }

    /// Parses text with the real parser.
    public static func parse(_ text: String) throws -> Scrape {
        let input = Pipe(), output = Pipe(), errors = Pipe()
        let process = Process()
        process.executableURL = URL(fileURLWithPath: systemPython)
        process.arguments = [supportFolder + "/metrics_client.py", "parse"]
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        input.fileHandleForWriting.write(Data(text.utf8))
        try input.fileHandleForWriting.close()
        let out = output.fileHandleForReading.readDataToEndOfFile()
        let err = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw SupportFailure("the parser refused the text: \(String(decoding: err, as: UTF8.self))")
        }
        return try Scrape(json: String(decoding: out, as: UTF8.self))
    }
}
