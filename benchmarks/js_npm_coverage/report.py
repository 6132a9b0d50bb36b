"""Print the tables from results.json:  python3 report.py results.json"""

import json
import re
import sys
from collections import OrderedDict, defaultdict

r = json.load(open(sys.argv[1]))


def charpos(text, bpos):
    return len(text.encode()[:bpos].decode(errors="ignore"))


def cause(s):
    text, pos = s["text"], s["fail"]
    cp = charpos(text, pos)  # acorn offsets are UTF-16 units; identical to code points for BMP text
    # the grammar accepts the opening "/" (it could start a // or /* comment) and fails on the next char
    rs = [x for x in s.get("regex_starts", []) if x in (cp, cp - 1)]
    if rs:
        before = text[: rs[0]].rstrip()
        if re.search(r"(var|let|const)\s+[\w$]+\s*=\s*$", before):
            return "regex literal (/.../flags) - as a variable initializer"
        if re.search(r"[(,]\s*$", before):
            return "regex literal (/.../flags) - as a call argument"
        return "regex literal (/.../flags) - other position"
    if re.search(r"for\s*\(\s*(?!var\b|let\b|const\b)[\w$.]+\s+in\s", text[:cp][-200:]):
        return "for (x in o) without var/let/const (for-in on an existing variable)"
    if pos == len(text.encode()):
        return "prefix valid but not accepting at end of text"
    return "other / unclassified"


def fmt(before, after):
    return (before + "\u25b6" + after).replace("\n", "\\n")


if r["errors"]:
    print("NOT MEASURED:", r["errors"])
files = {f["package"]: f for f in r["files"]}
per = OrderedDict()
for s in r["statements"]:
    p = per.setdefault(s["package"], [0, 0, 0])
    p[1] += 1
    p[0] += s["accepted"]
    p[2] += s["masked_accepted"]

print("## Per package (main file split into top-level statements by acorn)\n")
print(
    "| package | main | statements accepted / total | whole file | (regex literals masked: stmts / file) |"
)
print("|---|---|---|---|---|")
tot = [0, 0, 0]
fa = fm = 0
for pkg, (a, n, m) in per.items():
    f = files[pkg]
    tot[0] += a
    tot[1] += n
    tot[2] += m
    fa += f["accepted"]
    fm += f["masked_accepted"]
    print(
        f"| {pkg} | {f['main']} | {a} / {n} | {'yes' if f['accepted'] else 'no'} | {m} / {n}, {'yes' if f['masked_accepted'] else 'no'} |"
    )
print(
    f"| **TOTAL** ({len(per)} packages) | | **{tot[0]} / {tot[1]} = {100 * tot[0] / tot[1]:.1f}%** | **{fa} / {len(files)}** | {tot[2]} / {tot[1]} = {100 * tot[2] / tot[1]:.1f}%, {fm} / {len(files)} |"
)

print("\n## Refused statements by cause (first failing byte; \u25b6 marks it)\n")
by = defaultdict(list)
for s in r["statements"]:
    if not s["accepted"]:
        by[cause(s)].append(s)
print("| cause | count | examples (~60 chars around the failure) |")
print("|---|---|---|")
for c, ss in sorted(by.items(), key=lambda kv: -len(kv[1])):
    ex = "<br>".join(
        f"`{fmt(s['before'], s['after'])}` ({s['package']} #{s['index']})" for s in ss[:2]
    )
    print(f"| {c} | {len(ss)} | {ex} |")
print(f"| **total refused** | **{sum(map(len, by.values()))}** | |")

print("\n## Every refused statement\n")
for s in r["statements"]:
    if not s["accepted"]:
        print(f"- {s['package']} #{s['index']}: [{cause(s)}] `{fmt(s['before'], s['after'])}`")

print("\n## Whole files refused (first failure)\n")
for f in r["files"]:
    if not f["accepted"]:
        s = (
            dict(
                f,
                text=json.load(open(sys.argv[2]))["files"][
                    [x["package"] for x in r["files"]].index(f["package"])
                ]["text"],
            )
            if len(sys.argv) > 2
            else None
        )
        c = cause(s) if s else ""
        print(f"- {f['package']}: [{c}] `{fmt(f['before'], f['after'])}`")

print(
    "\n## Still refused with regex literals masked (each regex literal replaced by identifier __re__)\n"
)
left = [s for s in r["statements"] + r["files"] if not s["masked_accepted"]]
for s in left:
    print(
        f"- {s['package']} {'#%d' % s['index'] if 'index' in s else 'whole file'}: `{fmt(s['masked_before'], s['masked_after'])}`"
    )
if not left:
    print("(none)")
