#!/usr/bin/env python3
"""Seeds for the manifest fuzzer (make fuzz-manifest): valid manifests using every kind and every key,
in XML and binary form, plus a photo-list job. Usage: make_manifests.py FOLDER"""
import os, plistlib, sys

folder = sys.argv[1]
os.makedirs(folder, exist_ok=True)
ops = [
    {"id": "get", "kind": "download", "url": "http://127.0.0.1:8080/a.jpg", "maxBytes": 1000000, "timeoutSeconds": 5.0,
     "retries": 2, "retryDelaySeconds": 0.5, "queue": "downloads"},
    {"id": "sep", "kind": "sepia", "intensity": 0.7, "dependencies": ["get"], "qualityOfService": "userInitiated"},
    {"id": "gray", "kind": "grayscale", "input": "get", "dependencies": ["get"], "queuePriority": "high"},
    {"id": "blur", "kind": "blur", "radius": 3.5, "dependencies": ["sep"]},
    {"id": "size", "kind": "resize", "width": 64, "height": 48, "mode": "fill", "dependencies": ["blur"]},
    {"id": "thumb", "kind": "thumbnail", "size": 32, "dependencies": ["gray"]},
    {"id": "vig", "kind": "vignette", "strength": 0.4, "dependencies": ["size"]},
    {"id": "save", "kind": "write", "path": "out/a.png", "format": "png", "dependencies": ["vig"]},
    {"id": "savejpg", "kind": "write", "path": "b.jpg", "quality": 80, "dependencies": ["thumb"], "runsAfterFailure": True},
    {"id": "nap", "kind": "sleep", "seconds": 0.1},
    {"id": "spin", "kind": "spin", "seconds": 0.01, "dependencies": ["nap"]},
    {"id": "bad", "kind": "fail", "message": "on purpose", "dependencies": ["spin"]},
]
manifests = {
    "all-kinds": {"job": "all", "qualityOfService": "utility", "queuePriority": "low", "timeoutSeconds": 60.0,
                  "metadata": {"owner": "fuzz", "n": 3, "when": 1.5, "tags": ["a", "b"], "raw": b"\x00\x01"},
                  "operations": ops},
    "chain": {"operations": [{"id": f"s{i}", "kind": "sleep", "seconds": 0.0, **({"dependencies": [f"s{i-1}"]} if i else {})} for i in range(8)]},
    "photos": {"job": "photos", "photosURL": "http://127.0.0.1:8080/photos.plist"},
    "minimal": {"operations": [{"id": "a", "kind": "fail"}]},
}
for name, m in manifests.items():
    for fmt, ext in ((plistlib.FMT_XML, "xml"), (plistlib.FMT_BINARY, "bin")):
        with open(os.path.join(folder, f"{name}.{ext}.plist"), "wb") as f:
            f.write(plistlib.dumps(m, fmt=fmt))
