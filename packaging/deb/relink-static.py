#!/usr/bin/env python3
"""Links products of a finished debug build again with the Swift runtime linked in, for the test packages.

Usage: relink-static.py BUILD_MANIFEST OUT_DIR PRODUCT...

SwiftPM's own link command for each product is read from its build manifest (.build/debug.yaml) and run again
with -static-stdlib, the output in OUT_DIR. The objects were compiled for the shared runtime, so their autolink
entries name Foundation alone: static Foundation's own libraries are added after it. This takes seconds, where a
second build of the whole tree with --static-swift-stdlib took minutes; `make deb` keeps SwiftPM's static build.
"""
import json
import os
import subprocess
import sys

# What static Foundation needs after it (the order matters: an archive only satisfies what precedes it).
FOUNDATION_STATIC = ["-lFoundationEssentials", "-lCoreFoundation", "-l_FoundationCShims", "-l_FoundationCollections",
                     "-l_FoundationICU"]


def link_commands(manifest):
    """The manifest's link commands by product path: each `args:` line after a `description: "Linking …"` one."""
    commands, linking = {}, None
    with open(manifest) as lines:
        for line in lines:
            text = line.strip()
            if text.startswith('description: "Linking '):
                linking = text[len('description: "Linking '):-1]
            elif text.startswith("args: ") and linking is not None:
                commands[os.path.basename(linking)] = json.loads(text[len("args: "):])
                linking = None
    return commands


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__.strip().splitlines()[2])
    manifest, out, products = sys.argv[1], sys.argv[2], sys.argv[3:]
    commands = link_commands(manifest)
    os.makedirs(out, exist_ok=True)
    for product in products:
        if product not in commands:
            sys.exit(f"relink-static.py: {manifest} has no link command for {product!r}: build it first")
        args = commands[product]
        output = args.index("-o") + 1
        args[output] = os.path.join(out, product)
        # No rpath to the toolchain's shared runtime: nothing of it is loaded.
        rpath = [i for i, a in enumerate(args) if a.startswith("-rpath=") and i > 0 and args[i - 1] == "-Xlinker"]
        for i in reversed(rpath):
            del args[i - 1:i + 1]
        subprocess.run(args + ["-static-stdlib"] + FOUNDATION_STATIC, check=True)


if __name__ == "__main__":
    main()
