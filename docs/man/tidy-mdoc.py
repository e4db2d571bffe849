#!/usr/bin/env python3
# Tidies a man page that argument-parser's generate-manual wrote, in place, so that `mandoc -T lint`
# has nothing to warn about: a discussion's blank lines become paragraph macros (.Pp), each sentence
# starts a new input line (mdoc's rule, so that sentence spacing is right), and a paragraph macro left
# just before a list item (an option whose values have descriptions) is dropped. A program whose only
# subcommand is argument-parser's own `help` loses `subcommand` from its synopsis and the `help` item.
# Pages named after the page (`tidy-mdoc.py PAGE opqueued.plist:5 …`) go into a SEE ALSO section.
import re
import sys

path = sys.argv[1]
see_also = [a.split(":") for a in sys.argv[2:]]
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
subcommands = [line for line in tidy if line.startswith(".It Em ")]
if subcommands == [".It Em help"]:
    start = tidy.index(".It Em help")
    end = start
    depth = 0
    while end < len(tidy):
        if tidy[end].startswith(".Bl"):
            depth += 1
        elif tidy[end] == ".El":
            depth -= 1
            if depth == 0:
                break
        end += 1
    del tidy[start:end + 1]
    tidy = [line for line in tidy if line != ".Ar subcommand"]
if see_also:
    tidy.append(".Sh SEE ALSO")
    for i, (name, section) in enumerate(sorted(see_also, key=lambda p: (p[1], p[0]))):
        tidy.append(".Xr %s %s%s" % (name, section, " ," if i < len(see_also) - 1 else ""))
open(path, "w", encoding="utf-8").write("\n".join(tidy) + "\n")
