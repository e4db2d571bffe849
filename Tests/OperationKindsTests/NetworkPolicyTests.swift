// The destination check of downloads (Networks.swift, CCurl's opq_address_allowed) and the parsing of
// `download.allowNetworks`, without any network: addresses here are only strings to classify.

import Foundation
import Testing
@testable import JobModel
@testable import OperationKinds

@Suite struct NetworkPolicyTests {
    func range(_ address: String, _ allow: [String] = []) throws -> String? {
        let (allowed, range) = try NetworkPolicy.check(address, allowing: allow.map { try IPNetwork(cidr: $0) })
        #expect(allowed == (range == nil))
        return range
    }

    @Test func theRefusedRangesByDefault() throws {
        let expected: [(String, String?)] = [
            ("127.0.0.1", "loopback"), ("127.255.255.254", "loopback"), ("::1", "loopback"),
            ("10.0.0.1", "private"), ("172.16.0.1", "private"), ("172.31.255.255", "private"), ("192.168.1.1", "private"),
            ("100.64.0.1", "shared (carrier-grade NAT)"), ("100.127.255.255", "shared (carrier-grade NAT)"),
            ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("febf::1", "link-local"),
            ("fc00::1", "private"), ("fdff:ffff::1", "private"),
            ("0.0.0.0", "unspecified"), ("::", "unspecified"),
            ("224.0.0.1", "multicast"), ("239.255.255.255", "multicast"), ("ff02::1", "multicast"), ("255.255.255.255", "broadcast"),
            // IPv4-mapped IPv6 forms are the IPv4 addresses they map.
            ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.1.2.3", "private"), ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:0.0.0.0", "unspecified"),
            // Just outside the ranges.
            ("172.32.0.0", nil), ("172.15.255.255", nil), ("100.128.0.0", nil), ("100.63.255.255", nil), ("126.255.255.255", nil),
            ("128.0.0.0", nil), ("169.253.255.255", nil), ("223.255.255.255", nil), ("fec0::1", nil), ("fbff::1", nil), ("::2", nil),
            ("2001:db8::1", nil), ("192.0.2.1", nil), ("::ffff:192.0.2.1", nil),
        ]
        for (address, name) in expected { #expect(try range(address) == name, "\(address)") }
    }

    @Test func allowNetworksOpensExactlyTheirRanges() throws {
        #expect(try range("127.0.0.1", ["127.0.0.0/8"]) == nil)
        #expect(try range("::ffff:127.0.0.9", ["127.0.0.0/8"]) == nil, "an IPv4 range covers the mapped form")
        #expect(try range("::1", ["127.0.0.0/8"]) == "loopback", "127.0.0.0/8 does not open ::1")
        #expect(try range("::1", ["::1/128"]) == nil)
        #expect(try range("127.0.0.2", ["127.0.0.2/32"]) == nil)
        #expect(try range("127.0.0.1", ["127.0.0.2/32"]) == "loopback")
        #expect(try range("127.0.0.3", ["127.0.0.2/32"]) == "loopback")
        #expect(try range("10.0.0.1", ["10.0.0.0/31"]) == nil)
        #expect(try range("10.0.0.2", ["10.0.0.0/31"]) == "private")
        #expect(try range("10.1.255.255", ["10.1.0.0/16"]) == nil)
        #expect(try range("10.2.0.0", ["10.1.0.0/16"]) == "private")
        #expect(try range("fd00::1", ["fd00::/8"]) == nil)
        #expect(try range("fc00::1", ["fd00::/8"]) == "private")
        #expect(try range("127.0.0.1", ["0.0.0.0/0"]) == nil, "IPv4 /0 opens every IPv4 address")
        #expect(try range("::1", ["0.0.0.0/0"]) == "loopback", "…and no IPv6 one")
        #expect(try range("::1", ["::/0"]) == nil)
        #expect(try range("169.254.169.254", ["::/0"]) == nil, "IPv6 /0 opens everything, mapped IPv4 included")
        #expect(try range("127.0.0.1", ["127.0.0.1"]) == nil, "a bare address is its host")
    }

    @Test func networksParseAndPrint() throws {
        #expect(try IPNetwork(cidr: "10.1.0.0/16").description == "10.1.0.0/16")
        #expect(try IPNetwork(cidr: "10.1.0.0/16").prefix == 96 + 16)
        #expect(try IPNetwork(cidr: "::1").description == "::1/128")
        #expect(try IPNetwork(cidr: "127.0.0.1").description == "127.0.0.1/32")
        #expect(try IPNetwork(cidr: "0.0.0.0/0").prefix == 96)
        #expect(try IPNetwork(cidr: "::/0").prefix == 0)
        for bad in ["10.1.0.5/16", "1.2.3.4/33", "::1/129", "300.1.1.1/8", "10.0.0.0/", "10.0.0.0/x", "/8", "", "10.0.0.0/8/8", "::1/-1",
                    "localhost"] {
            #expect(throws: IPNetwork.Invalid.self, "\(bad)") { try IPNetwork(cidr: bad) }
        }
        do {
            _ = try IPNetwork(cidr: "10.1.0.5/16")
        } catch {
            #expect("\(error)".contains("10.1.0.0/16"), "\(error)")
        }
    }

    @Test func aBadNetworkIsAConfigurationErrorNamingTheKeyAndTheValue() throws {
        let good = try configuration(["download": ["allowNetworks": ["127.0.0.0/8", "::1/128"]]])
        #expect(good.allowNetworks.map(\.description) == ["127.0.0.0/8", "::1/128"])
        #expect(Configuration.builtIn.allowNetworks.isEmpty)
        do {
            _ = try configuration(["download": ["allowNetworks": ["127.0.0.0/8", "10.0.0.1/33"]]])
            Issue.record("a bad network was accepted")
        } catch {
            #expect("\(error)".contains("download.allowNetworks") && "\(error)".contains("10.0.0.1/33"), "\(error)")
        }
        #expect(throws: Configuration.Invalid.self) { try configuration(["download": ["allowNetworks": "127.0.0.0/8"]]) }
        #expect(throws: Configuration.Invalid.self) { try configuration(["download": ["allowNetworks": [8]]]) }
    }
}

/// The configuration written as `object` (an XML property list), parsed by the job model (no `cluster` here, so
/// no database URL to check).
private func configuration(_ object: Any) throws -> Configuration {
    let data = (try? PropertyListSerialization.data(fromPropertyList: object, format: .xml, options: 0)) ?? Data()
    return try Configuration.parse(data, checkDatabase: { _ in nil })
}
