#!/usr/bin/env python3
"""The in-process libvips anchor: sepia (one recomb matrix) and JPEG q90 for every file, two at a time.

Usage: pyvips_sepia.py OUT_FOLDER FILE_LIST  (the matrix: 0.2·I + 0.8·M, as opqueued's sepia at 0.8)
"""
import concurrent.futures
import os
import sys

import pyvips

M = [[0.393, 0.769, 0.189], [0.349, 0.686, 0.168], [0.272, 0.534, 0.131]]
MATRIX = [[(0.2 if r == c else 0) + 0.8 * M[r][c] for c in range(3)] for r in range(3)]


def one(path, out):
    image = pyvips.Image.new_from_file(path, access="sequential")
    image.recomb(MATRIX).cast("uchar").write_to_file(os.path.join(out, "pyvips-" + os.path.basename(path)), Q=90)


def main():
    out, listing = sys.argv[1], sys.argv[2]
    with open(listing) as f:
        files = [line.strip() for line in f if line.strip()]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for _ in pool.map(lambda p: one(p, out), files):
            pass


if __name__ == "__main__":
    main()
