"""Soundness of the Python constraint by random walks: how many texts it accepts that
``ast.parse`` refuses, by Python's message.

Each walk starts after one of a few prefixes (module level, a function body, a class
method, a ``for`` body, an assignment's right side; with ``--stdlib``, a function or class
of the running interpreter's standard library cut after one of its lines, the code above
the cursor of an editor), takes 3 to 30 tokens of the default
model's vocabulary chosen uniformly from the mask (half the time from its tokens of at most
two bytes, which close brackets and end lines), and counts when the constraint accepts
where it stopped. Every accepted text should parse; the table lists the ones that did not
(PEP 695's `type X = ...` and `def f[T]()` are Python 3.12 syntax: not counted when the
interpreter is older).

    python benchmarks/python_walks.py [--walks 2000] [--seed 0] [--stdlib] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import random
import re
import sys
import sysconfig
import time
import warnings
from pathlib import Path

PREFIXES = ["", "def f(x):\n    ", "x = ", "for i in range(3):\n    ",
            "class A:\n    def m(self):\n        "]
PY312_ONLY = re.compile(r"(?m)^\s*type\s+\w|(?:def|class)\s+\w+\s*\[")


def stdlib_prefixes(rng: random.Random, n: int) -> list[str]:
    """``n`` prefixes: top-level functions and classes of stdlib modules, each cut after a
    random line."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py"))
    units: list[str] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.decorator_list:
                units.append("".join(lines[node.lineno - 1:node.end_lineno]))
    out = []
    for _ in range(n):
        lines = rng.choice(units).splitlines(keepends=True)
        out.append("".join(lines[:rng.randint(1, len(lines))]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--walks", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stdlib", action="store_true",
                    help="start from prefixes of stdlib functions and classes")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    from structspec import GrammarError, Vocabulary, compile_grammar
    from structspec.grammars import grammar_path
    from structspec.models import load_tokenizer

    vocab = Vocabulary.from_tokenizer(load_tokenizer(None))
    c = compile_grammar(grammar_path("python"), vocab)
    eos = set(vocab.eos_token_ids)
    rng = random.Random(args.seed)
    failures: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[str]] = {}
    accepted = 0
    prefixes = stdlib_prefixes(rng, args.walks) if args.stdlib else None
    old_python = sys.version_info < (3, 12)
    t0 = time.perf_counter()
    for w in range(args.walks):
        prefix = prefixes[w] if prefixes else rng.choice(PREFIXES)
        try:
            s = c.state_after(prefix)
        except GrammarError:  # a prefix outside python.lark (documented refusals)
            continue
        out = bytearray()
        for _ in range(rng.randint(3, 30)):
            ids = [i for i in c.allowed(s).ids().tolist() if i not in eos]
            if not ids:
                break
            short = [i for i in ids if len(vocab.tokens[i]) <= 2]
            t = rng.choice(short if short and rng.random() < 0.5 else ids)
            out += vocab.tokens[t]
            s = c.advance(s, t)
        if not c.is_accepting(s):
            continue
        accepted += 1
        text = prefix + out.decode("utf-8", errors="replace")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SyntaxWarning)
                ast.parse(text)
        except SyntaxError as exc:
            if old_python and PY312_ONLY.search(text):
                continue
            msg = (exc.msg or "").split(". Maybe")[0]
            failures[msg] += 1
            examples.setdefault(msg, []).append(text)
    seconds = time.perf_counter() - t0
    bad = sum(failures.values())
    print(f"| walks | accepted | refused by ast.parse | seconds |\n|---|---|---|---|\n"
          f"| {args.walks} | {accepted} | {bad} ({100 * bad / max(accepted, 1):.2f}%) | "
          f"{seconds:.0f} |")
    for msg, n in failures.most_common():
        print(f"  {n:4d}  {msg}: {examples[msg][0][-70:]!r}")
    if args.json_out:
        args.json_out.write_text(json.dumps({
            "walks": args.walks, "seed": args.seed, "stdlib": args.stdlib,
            "accepted": accepted, "refused": bad,
            "by_message": dict(failures), "seconds": seconds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
