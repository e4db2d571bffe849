#!/usr/bin/env python3
# Tidies a man page that argument-parser's generate-manual wrote, in place, so that `mandoc -T lint`
# has nothing to warn about: a discussion's blank lines become paragraph macros (.Pp), each sentence
# starts a new input line (mdoc's rule, so that sentence spacing is right), and a paragraph macro left
# just before a list item (an option whose values have descriptions) is dropped.
import re
import sys

path = sys.argv[1]
lines = open(path, encoding="utf-8").read().split("\n")
out = []
for line in lines:
    if line == "":
        out.append(".Pp")
    elif line.startswith(".") or line.startswith("'"):
        out.append(line)
    else:
        out.extend(re.split(r"(?<=[a-z0-9)][.]) (?=[A-Z])", line))
while out and out[-1] == ".Pp":
    out.pop()
tidy = []
for i, line in enumerate(out):
    following = out[i + 1] if i + 1 < len(out) else ""
    if line == ".Pp" and (following.startswith((".It", ".El", ".Bl")) or following.startswith(".Sh") or tidy[-1:] == [".Pp"]):
        continue
    tidy.append(line)
open(path, "w", encoding="utf-8").write("\n".join(tidy) + "\n")
