// Finding a zone's rules: a name under /usr/share/zoneinfo, or the machine's zone (TZ, else /etc/localtime, else
// UTC, as glibc chooses). A name comes from a configuration file, so it may only name a file inside the zoneinfo
// folder: `..` anywhere, and absolute paths elsewhere, are refused before anything is opened.

#if canImport(Glibc)
import Glibc
#endif
import SystemCalls

extension TimeZoneRules {
    static let zoneinfo = "/usr/share/zoneinfo"

    /// The zone of this name in /usr/share/zoneinfo (`Europe/Paris`, `UTC`); a path inside that folder also works.
    public init(named name: String) throws(TimeZoneError) {
        let path = try TimeZoneRules.path(of: name)
        guard let rules = try TimeZoneRules.load(named: name) else {
            throw TimeZoneError("unknown time zone '\(name)' (no zone file \(path))")
        }
        self = rules
    }

    /// The machine's zone: `TZ` (a zone name, optionally after ':', or a POSIX TZ string such as
    /// `CET-1CEST,M3.5.0,M10.5.0/3`; empty means UTC), else /etc/localtime, else UTC.
    public static func local() throws(TimeZoneError) -> TimeZoneRules {
        try local(tz: getenv("TZ").map { String(cString: $0) }, localtime: "/etc/localtime")
    }

    static func local(tz: String?, localtime: String) throws(TimeZoneError) -> TimeZoneRules {
        if var name = tz {
            if name.hasPrefix(":") { name.removeFirst() }
            if name.isEmpty { return .utc }
            if let rules = try load(named: name) { return rules }
            if let posix = try? PosixTimeZone(name) {
                return TimeZoneRules(name: name, transitions: [], offsets: [], initialOffset: posix.standardOffset, footer: posix)
            }
            throw TimeZoneError("TZ='\(name)' is neither a time zone in \(zoneinfo) nor a POSIX TZ string")
        }
        switch readFile(localtime) {
        case .missing: return .utc
        case .failed(let reason): throw TimeZoneError("the machine's time zone: cannot read \(localtime): \(reason)")
        case .bytes(let bytes):
            do { return try TimeZoneRules(name: linkedZoneName(localtime) ?? localtime, tzif: bytes) } catch {
                throw TimeZoneError("the machine's time zone: \(localtime) is not a valid TZif file: \(error.reason)")
            }
        }
    }

    /// The zone's rules, or nil when no such file exists.
    private static func load(named name: String) throws(TimeZoneError) -> TimeZoneRules? {
        let path = try path(of: name)
        switch readFile(path) {
        case .missing: return nil
        case .failed(let reason): throw TimeZoneError("time zone '\(name)': cannot read \(path): \(reason)")
        case .bytes(let bytes):
            do { return try TimeZoneRules(name: name, tzif: bytes) } catch {
                throw TimeZoneError("time zone '\(name)': \(path) is not a valid TZif file: \(error.reason)")
            }
        }
    }

    /// The file of a zone name, once the name is known to stay inside the zoneinfo folder.
    private static func path(of name: String) throws(TimeZoneError) -> String {
        let inside = name.hasPrefix(zoneinfo + "/") ? String(name.dropFirst(zoneinfo.count + 1)) : name
        guard !inside.isEmpty, !inside.hasPrefix("/"), !inside.contains(".."), !inside.utf8.contains(0) else {
            throw TimeZoneError("'\(name)' is not a time zone name (a file under \(zoneinfo), such as Europe/Paris)")
        }
        return zoneinfo + "/" + inside
    }

    /// `Europe/Paris` when /etc/localtime is a link into the zoneinfo folder.
    private static func linkedZoneName(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: 4096)
        let count = readlink(path, &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        let target = String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let range = target.firstRange(of: "zoneinfo/") else { return nil }
        let name = String(target[range.upperBound...])
        return name.isEmpty ? nil : name
    }
}

private enum FileContents {
    case bytes([UInt8])
    case missing
    case failed(String)
}

/// A regular file's bytes (zone files are a few kilobytes; more than a mebibyte is refused); missing when there is no
/// file or it is not a regular file.
private func readFile(_ path: String) -> FileContents {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else {
        let code = errno
        return code == ENOENT || code == ENOTDIR ? .missing : .failed(String(cString: strerror(code)))
    }
    defer { close(fd) }
    var status = stat()
    guard fstat(fd, &status) == 0 else { return .failed(String(cString: strerror(errno))) }
    guard status.st_mode & S_IFMT == S_IFREG else { return .missing }   // a folder such as Europe is no zone
    let limit = 1 << 20
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65_536)
    while true {
        let count = chunk.withUnsafeMutableBytes { buffer in retryingInterrupts { read(fd, buffer.baseAddress, buffer.count) } }
        guard count >= 0 else { return .failed(String(cString: strerror(errno))) }
        if count == 0 { return .bytes(bytes) }
        bytes += chunk[0..<count]
        guard bytes.count <= limit else { return .failed("larger than \(limit) bytes") }
    }
}
