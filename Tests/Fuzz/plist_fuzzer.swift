// libFuzzer entry for the property-list reader and writer (make fuzz-plist): any bytes must give a value
// or a PlistError, never a trap; what the writer makes of a value must read back, and writing that
// again must give the same bytes (control characters XML cannot carry are replaced once, then stable).

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPropertyList(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    guard let value = try? PropertyList.parse(bytes) else { return 0 }
    let written = PlistXMLWriter.document(value)
    guard let again = try? PropertyList.parse(written) else {
        fatalError("the writer's output does not read back: \(String(decoding: written.prefix(2000), as: UTF8.self))")
    }
    if PlistXMLWriter.document(again) != written {
        fatalError("writing the value read back changed it:\n\(value)\n\(again)")
    }
    return 0
}
