// System calls as Swift code wants them: an interrupted call (EINTR, a signal arrived) is made again in this one place
// rather than in a loop at each call site. swift-nio's System.swift is the model.

#if canImport(Glibc)
import Glibc
#endif

/// Calls `body` again while it fails with EINTR. Any other failure (a negative result) is returned as it is, with
/// `errno` as the call left it.
@inlinable
public func retryingInterrupts<T: SignedInteger>(_ body: () -> T) -> T {
    while true {
        let result = body()
        if result < 0 && errno == EINTR { continue }
        return result
    }
}
