// The control socket's requests, typed: what a client sends is what the daemon reads, and a request missing what
// its command needs is refused with the field's name (exit 64 on the socket).

import ControlPlane
import Testing

@Suite("Control requests")
struct ControlRequestTests {
    static let every: [ControlRequest] = [
        .status(memory: false), .status(memory: true), .declared, .submitted(manifest: "a.plist", inode: nil),
        .submitted(manifest: "a.plist", inode: 42), .show(job: "j"), .cancel(job: "j", operation: nil),
        .cancel(job: "j", operation: "op"), .metrics, .suspend(queue: "q"), .resume(queue: "q"),
    ]

    @Test(arguments: every) func whatAClientSendsIsWhatTheDaemonReads(_ request: ControlRequest) throws {
        #expect(try ControlRequest(wire: request.wire) == request)
    }

    @Test func anInodeBeyondJSONsIntegersIsLeftOut() throws {
        let wire = ControlRequest.submitted(manifest: "a.plist", inode: UInt64.max).wire
        #expect(wire["inode"] == nil)
        #expect(try ControlRequest(wire: wire) == .submitted(manifest: "a.plist", inode: nil))
    }

    @Test func aRequestWithoutWhatItNeedsIsRefusedByName() {
        let refusals: [([String: Any], String)] = [
            (["command": "show"], "show needs a job"),
            (["command": "cancel", "operation": "x"], "cancel needs a job"),
            // Not a whole-job cancel: a mistaken operation field is refused, never ignored.
            (["command": "cancel", "job": "j", "operation": 5], "cancel: operation must be a string"),
            (["command": "cancel", "job": "j", "operation": ["a"]], "cancel: operation must be a string"),
            (["command": "suspend", "queue": 3], "suspend needs a queue"),
            (["command": "submitted"], "submitted needs a manifest"),
            (["command": "reboot"], "unknown command 'reboot'"),
            ([:], "unknown command ''"),
        ]
        for (wire, message) in refusals {
            #expect(throws: ControlRequest.Refusal(message: message)) { try ControlRequest(wire: wire) }
        }
    }
}
