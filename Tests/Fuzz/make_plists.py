#!/usr/bin/env python3
"""Seeds for the property-list fuzzer: a manifest with every value type, in XML and binary, and a photo list."""
import datetime, plistlib, sys

folder = sys.argv[1]
manifest = {
    "job": "seed", "qualityOfService": "utility", "queuePriority": "high", "timeoutSeconds": 60.5,
    "metadata": {"owner": "ana", "list": [1, -2, 2.5, True, False, b"\x00\xffxy", datetime.datetime(2020, 1, 2, 3, 4, 5)]},
    "operations": [
        {"id": "get", "kind": "download", "url": "http://127.0.0.1/a.jpg", "maxBytes": 1000000},
        {"id": "s", "kind": "sepia", "input": "get", "intensity": 0.5, "retries": 2, "runsAfterFailure": False},
        {"id": "w", "kind": "write", "input": "s", "path": "a&<b> é.png", "dependencies": ["get"]},
    ],
}
for name, fmt in (("manifest.xml.plist", plistlib.FMT_XML), ("manifest.binary.plist", plistlib.FMT_BINARY)):
    with open(f"{folder}/{name}", "wb") as f:
        f.write(plistlib.dumps(manifest, fmt=fmt))
with open(f"{folder}/photos.plist", "wb") as f:
    f.write(plistlib.dumps({"a.jpg": "http://127.0.0.1/a.jpg", "b": "file:///srv/b.png"}))
