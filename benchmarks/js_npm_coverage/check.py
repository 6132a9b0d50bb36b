"""Check each statement / whole file of statements.json against structspec's JS grammar.
Run by run.sh: .venv/bin/python benchmarks/js_npm_coverage/check.py WORK/statements.json WORK/results.json
"""

import json
import sys
import time

_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT / "tests"))
sys.path.insert(0, str(_ROOT))
from conftest import make_byte_vocab

from structspec import GrammarError, compile_grammar
from structspec.grammars import grammar_path

t0 = time.time()
c = compile_grammar(grammar_path("javascript"), make_byte_vocab())
print(f"compiled in {time.time() - t0:.1f}s", file=sys.stderr)


def check(text):
    """(accepted, fail_byte_index or None). fail index == len(data) means: prefix ok, not accepting at end."""
    data = text.encode()
    s = None
    # chunked stepping for speed, then byte-wise inside a failing chunk
    i = 0
    CH = 256
    while i < len(data):
        chunk = data[i : i + CH]
        try:
            s = c.state_after(chunk, state=s)
            i += len(chunk)
        except GrammarError:
            for j, b in enumerate(chunk):
                try:
                    s = c.state_after(bytes([b]), state=s)
                except GrammarError:
                    return False, i + j
            raise AssertionError("chunk failed but bytes did not")
    if s is None:
        s = c.state_after(b"")
    return (True, None) if c.is_accepting(s) else (False, len(data))


def context(text, pos, width=30):
    data = text.encode()
    before = data[max(0, pos - width) : pos].decode(errors="replace")
    after = data[pos : pos + width].decode(errors="replace")
    return before, after


def main():
    src, dst = sys.argv[1], sys.argv[2]
    d = json.load(open(src))
    res = {"statements": [], "files": [], "errors": d["errors"]}
    for st in d["statements"]:
        ok, pos = check(st["text"])
        r = dict(st, accepted=ok, fail=pos)
        if not ok:
            r["before"], r["after"] = context(st["text"], pos)
        mok, mpos = check(st["masked"])
        r["masked_accepted"], r["masked_fail"] = mok, mpos
        if not mok:
            r["masked_before"], r["masked_after"] = context(st["masked"], mpos)
        res["statements"].append(r)
    for f in d["files"]:
        ok, pos = check(f["text"])
        r = {
            "package": f["package"],
            "main": f["main"],
            "regexes": f["regexes"],
            "regex_starts": f["regex_starts"],
            "accepted": ok,
            "fail": pos,
        }
        if not ok:
            r["before"], r["after"] = context(f["text"], pos)
        mok, mpos = check(f["masked"])
        r["masked_accepted"], r["masked_fail"] = mok, mpos
        if not mok:
            r["masked_before"], r["masked_after"] = context(f["masked"], mpos)
        res["files"].append(r)
    json.dump(res, open(dst, "w"), indent=1)
    print(f"done in {time.time() - t0:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
