// Networks+Curl: an address checked against the refused ranges, through the same C table libcurl's
// open-socket callback uses (Sources/CCurl), so that tests and the daemon's connections agree.

import CCurl
import Foundation
import JobModel

extension IPNetwork {
    var cNetwork: opq_network {
        var network = opq_network()
        withUnsafeMutableBytes(of: &network.address) { $0.copyBytes(from: bytes) }
        network.prefix = Int32(prefix)
        return network
    }
}

public enum NetworkPolicy {
    /// Whether a download may connect to `address` (an IPv4 or IPv6 address) with these networks
    /// opened; the refused range's name when not. The same check libcurl's connections go through.
    public static func check(_ address: String, allowing networks: [IPNetwork]) throws -> (allowed: Bool, range: String?) {
        let bytes = try IPNetwork.parse(address, in: address).bytes
        let c = networks.map(\.cNetwork)
        var range: UnsafePointer<CChar>?
        let allowed = bytes.withUnsafeBufferPointer { a in
            c.withUnsafeBufferPointer { opq_address_allowed(a.baseAddress, $0.baseAddress, $0.count, &range) }
        }
        return (allowed != 0, allowed != 0 ? nil : range.map { String(cString: $0) })
    }
}
