// The operation kinds this build runs: sleep, spin, fail (SPEC §3.3). The image and download kinds are
// refused at validation until they exist, never run as stubs.

import Foundation
import OperationEngine

#if canImport(Glibc)
import Glibc
#endif

struct KindFailure: Error, CustomStringConvertible {
    let description: String
}

enum Kinds {
    static func body(for parameters: Parameters) -> OperationBody {
        switch parameters {
        case .sleep(let seconds):
            // Wall time on a timer: holds a queue slot, no thread. A cancelled sleep ends at once in the
            // engine; the timer's late completion is ignored.
            return .async { context in
                DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { context.finish(.success(nil)) }
            }
        case .spin(let seconds):
            return .sync { context in
                var start = timespec(), now = timespec()
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start)
                var x: UInt64 = 0x9E37_79B9_7F4A_7C15
                while true {
                    for _ in 0..<20_000 { x = x &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407 }
                    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
                    let used = Double(now.tv_sec - start.tv_sec) + Double(now.tv_nsec - start.tv_nsec) / 1e9
                    if used >= seconds { break }
                    if context.isCancelled { throw OperationCancelled() }
                }
                withExtendedLifetime(x) {} // keeps the arithmetic from being optimised away
                return nil
            }
        case .fail(let message):
            return .sync { _ in throw KindFailure(description: message) }
        default:
            return .sync { _ in throw KindFailure(description: "this kind is not available in this version") }
        }
    }
}
