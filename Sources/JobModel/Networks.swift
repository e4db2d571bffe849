// Networks: the destinations downloads may connect to (SPEC §6, `download.allowNetworks`).
//
// Loopback, private, shared, link-local, unspecified, multicast and broadcast addresses are refused
// (the table is in CCurl, where libcurl's open-socket callback checks each address before connecting),
// unless a network of `download.allowNetworks` contains the address. Every address is handled in IPv6
// form: an IPv4 address is its IPv4-mapped form, so a range covers both ways of writing an address.
// What it trusts: nothing; a CIDR that does not parse is a configuration error that says why.
// (The check against libcurl's table is in Sources/OperationKinds/Networks+Curl.swift: this file stays free of C,
// as the job model is.)

import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// An IP network (`10.1.0.0/16`, `::1/128`; a bare address is the single host).
public struct IPNetwork: Sendable, Equatable, CustomStringConvertible {
    /// 16 bytes; an IPv4 network is held IPv4-mapped (`::ffff:a.b.c.d`), its prefix counting the 96 bits before.
    public let bytes: [UInt8]
    public let prefix: Int
    public let description: String

    public struct Invalid: Error, CustomStringConvertible {
        public let description: String
    }

    public init(cidr text: String) throws {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count <= 2, let address = parts.first.map(String.init), !address.isEmpty else {
            throw Invalid(description: "'\(text)' is not an address or ADDRESS/PREFIX")
        }
        let (bytes, isV4) = try Self.parse(address, in: text)
        let limit = isV4 ? 32 : 128
        var length = limit
        if parts.count == 2 {
            guard let n = Int(parts[1]), (0...limit).contains(n), parts[1].allSatisfy(\.isASCII) else {
                throw Invalid(description: "'\(text)': the prefix length must be 0 to \(limit)")
            }
            length = n
        }
        let prefix = isV4 ? 96 + length : length
        var masked = bytes
        for i in 0..<16 {
            let kept = max(0, min(8, prefix - i * 8))
            masked[i] &= kept == 0 ? 0 : UInt8(truncatingIfNeeded: 0xFF << (8 - kept))
        }
        guard masked == bytes else {
            throw Invalid(description: "'\(text)' has bits set past its /\(length) prefix "
                              + "(the network is \(Self.show(masked, isV4: isV4))/\(length))")
        }
        self.bytes = bytes
        self.prefix = prefix
        description = "\(Self.show(bytes, isV4: isV4))/\(length)"
    }

    /// Parses an IPv4 or IPv6 address into its 16-byte (IPv4-mapped) form.
    package static func parse(_ address: String, in text: String) throws -> (bytes: [UInt8], isV4: Bool) {
        var v4 = in_addr()
        if inet_pton(AF_INET, address, &v4) == 1 {
            return ([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF] + withUnsafeBytes(of: v4) { Array($0) }, true)
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, address, &v6) == 1 {
            return (withUnsafeBytes(of: v6) { Array($0) }, false)
        }
        throw Invalid(description: "'\(text)': '\(address)' is not an IPv4 or IPv6 address")
    }

    static func show(_ bytes: [UInt8], isV4: Bool) -> String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        if isV4 {
            var v4 = in_addr()
            withUnsafeMutableBytes(of: &v4) { $0.copyBytes(from: bytes[12..<16]) }
            inet_ntop(AF_INET, &v4, &buffer, socklen_t(buffer.count))
        } else {
            var v6 = in6_addr()
            withUnsafeMutableBytes(of: &v6) { $0.copyBytes(from: bytes) }
            inet_ntop(AF_INET6, &v6, &buffer, socklen_t(buffer.count))
        }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
