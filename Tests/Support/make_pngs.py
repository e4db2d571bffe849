#!/usr/bin/env python3
"""Writes PNG variants the codec tests need, with pixel values given by formulas the Swift tests repeat.

grey8.png     8-bit grey, v = (7x + 3y) % 256
grey2.png     2-bit grey, v = ((x + y) % 4) * 85
palette.png   4-entry palette, index (x + 2y) % 4 → PALETTE
rgb16.png     16-bit RGB, sample16 = (x * 4099 + y * 257 + c * 9000) % 65536
huge.png      an IHDR claiming 100000×100000 (8-bit RGB), then a tiny IDAT: must fail on maxPixels
Usage: make_pngs.py FOLDER
"""
import struct
import sys
import zlib

W, H = 24, 16
PALETTE = [(255, 0, 0), (0, 128, 0), (0, 0, 255), (250, 250, 10)]


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(width, height, depth, color, rows, extra=b""):
    raw = b"".join(b"\x00" + row for row in rows)
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def pack_bits(values, depth):
    out, acc, bits = bytearray(), 0, 0
    for v in values:
        acc = (acc << depth) | v
        bits += depth
        if bits == 8:
            out.append(acc)
            acc, bits = 0, 0
    if bits:
        out.append(acc << (8 - bits))
    return bytes(out)


def main(folder):
    files = {
        "grey8.png": png(W, H, 8, 0, [bytes((7 * x + 3 * y) % 256 for x in range(W)) for y in range(H)]),
        "grey2.png": png(W, H, 2, 0, [pack_bits([(x + y) % 4 for x in range(W)], 2) for y in range(H)]),
        "palette.png": png(W, H, 8, 3, [bytes((x + 2 * y) % 4 for x in range(W)) for y in range(H)],
                           extra=chunk(b"PLTE", b"".join(bytes(c) for c in PALETTE))),
        "rgb16.png": png(W, H, 16, 2, [b"".join(struct.pack(">H", (x * 4099 + y * 257 + c * 9000) % 65536)
                                                for x in range(W) for c in range(3)) for y in range(H)]),
        "huge.png": b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(b"\x00" * 301)) + chunk(b"IEND", b""),
    }
    for name, data in files.items():
        with open(f"{folder}/{name}", "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
