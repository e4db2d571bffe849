// Power cuts for tests: an ext4 image of a test's own, mounted, and shut down the way xfstests simulates a power
// cut (EXT4_IOC_SHUTDOWN without flushing the log: whatever was not committed is gone, page cache and all).

import Foundation

#if canImport(Glibc)
import Glibc
#endif

public enum PowerCut {
    /// Makes an ext4 image of `megabytes` (mkfs's `features`, e.g. ["-O", "^has_journal"]) and mounts it on `folder`.
    public static func mountImage(_ image: String, on folder: String, megabytes: Int = 256, features: [String] = []) throws {
        for (program, arguments) in [("/usr/bin/truncate", ["-s", "\(megabytes)M", image]),
                                     ("/sbin/mkfs.ext4", ["-q", "-F"] + features + [image])] {
            let run = try runProgram(program, arguments)
            guard run.status == 0 else { throw SupportFailure("\(program): \(run.stderr)") }
        }
        try mount(image, on: folder)
    }

    private static func mount(_ image: String, on folder: String) throws {
        let run = try runProgram("/bin/mount", ["-o", "loop", image, folder])
        guard run.status == 0 else { throw SupportFailure("mount \(image): \(run.stderr)") }
    }

    /// After a cut (the programs writing there stopped): unmounts `folder` and mounts on it what reached the disk, a
    /// copy of `image`; returns the copy's path, the image from then on (`image` is removed). Not the image itself: a
    /// mount namespace made meanwhile (a test starting systemd, say) keeps its own copy of the cut mount, and mounting
    /// the same image again would then give back the shut-down file system, every read an EIO.
    public static func remount(_ image: String, on folder: String) throws -> String {
        try unmount(folder)
        let copy = image + ".\(UInt32.random(in: 0...UInt32.max))"
        let run = try runProgram("/bin/cp", ["--sparse=always", image, copy])
        guard run.status == 0 else { throw SupportFailure("cp \(image): \(run.stderr)") }
        unlink(image)
        do { try mount(copy, on: folder) } catch { unlink(copy); throw error }
        return copy
    }

    public static func unmount(_ folder: String, lazily: Bool = false) throws {
        let run = try runProgram("/bin/umount", lazily ? ["-l", folder] : [folder])
        guard run.status == 0 else { throw SupportFailure("umount \(folder): \(run.stderr)") }
    }

    /// Shuts down the file system mounted on `folder`: nothing more reaches its disk (Python's ioctl; the request is
    /// _IOR('X', 125, __u32), the flag EXT4_GOING_FLAGS_NOLOGFLUSH). Stop the programs writing there first: a power
    /// cut ends them too, and a file system shut down may answer a later syncfs with success.
    public static func cut(_ folder: String) throws {
        let script = "import fcntl, os, struct, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            + "fcntl.ioctl(fd, 0x8004587D, struct.pack('I', 2))"
        let run = try runProgram("/usr/bin/python3", ["-c", script, folder])
        guard run.status == 0 else { throw SupportFailure("shutdown \(folder): \(run.stderr)") }
    }

    /// The jobs a daemon's console log says finished and succeeded (announced only once their entries were committed).
    public static func announcedSuccesses(log: String) -> Set<String> {
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        var jobs = Set<String>()
        for line in text.split(separator: "\n")
        where line.contains("OPQ_EVENT=job ") && line.contains("OPQ_STATE=finished OPQ_STATUS=succeeded") {
            if let field = line.split(separator: " ").first(where: { $0.hasPrefix("OPQ_JOB=") }) {
                jobs.insert(String(field.dropFirst("OPQ_JOB=".count)))
            }
        }
        return jobs
    }
}
