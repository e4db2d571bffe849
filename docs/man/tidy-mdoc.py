#!/usr/bin/env python3
# Tidies a man page that argument-parser's generate-manual wrote, in place, so that `mandoc -T lint`
# has nothing to warn about: a discussion's blank lines become paragraph macros (.Pp), each sentence
# starts a new input line (mdoc's rule, so that sentence spacing is right), and a paragraph macro left
# just before a list item (an option whose values have descriptions) is dropped. A program whose only
# subcommand is argument-parser's own `help` loses `subcommand` from its synopsis and the `help` item.
# Pages named after the page (`tidy-mdoc.py PAGE opqueued.plist:5 …`) go into a SEE ALSO section.
# With `--keep OLD`, what was written by hand in the page as it was (OLD) is kept: its sections the generator does not
# write (SIGNALS, FILES, EXAMPLES, …) in their place, and a generated section that OLD extends (EXIT STATUS) as OLD has it.
import re
import sys

args = sys.argv[1:]
old = None
if "--keep" in args:
    i = args.index("--keep")
    old = open(args[i + 1], encoding="utf-8").read().split("\n")
    del args[i:i + 2]
path = args[0]
see_also = [a.split(":") for a in args[1:]]
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


def sections(page):
    """The page's head (before the first .Sh) and its sections, each (name, lines)."""
    head, out = [], []
    for line in page:
        if line.startswith(".Sh "):
            out.append((line[4:].strip('"'), [line]))
        elif out:
            out[-1][1].append(line)
        else:
            head.append(line)
    return head, out


if old is not None:
    head, new_sections = sections(tidy)
    _, old_sections = sections([line for line in old if line != ""])
    new_names = [name for name, _ in new_sections]
    merged = []
    for name, body in new_sections:
        kept = dict(old_sections).get(name)
        # A generated section the old page extends keeps the old page's text (SEE ALSO is always made anew).
        merged.append((name, kept if kept and name != "SEE ALSO" and kept[:len(body)] == body else body))
    for k, (name, body) in enumerate(old_sections):
        if name in new_names:
            continue
        # After the section it followed in the old page, where that is in the new one; else before SEE ALSO.
        before = [n for n, _ in old_sections[:k]]
        at = next((i + 1 for i in range(len(merged) - 1, -1, -1) if merged[i][0] in before), None)
        if at is None:
            at = next((i for i, (n, _) in enumerate(merged) if n == "SEE ALSO"), len(merged))
        merged.insert(at, (name, body))
    tidy = head + [line for _, body in merged for line in body]
open(path, "w", encoding="utf-8").write("\n".join(tidy) + "\n")
