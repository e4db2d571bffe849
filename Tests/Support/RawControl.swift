// The control socket untyped, for tests, campaigns and benchmarks: a request as a JSON object and its answer as
// one, exactly as they cross the wire (opqueuectl reads answers typed: ControlPlane's answer types).

import ControlPlane
import Foundation

extension ControlClient {
    /// Sends `request` and returns the answer's JSON object; throws what `exchange` throws.
    public static func request(_ path: String, _ request: [String: Any], timeout: Double = 30) throws -> [String: Any] {
        let line = try exchange(path, JSONSerialization.data(withJSONObject: request), timeout: timeout)
        return try JSONSerialization.jsonObject(with: line) as? [String: Any] ?? [:]
    }
}
