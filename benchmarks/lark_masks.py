"""Mask time and compile time of the Lark constraint, driven along real code.

For each HumanEval infilling task, the whole program (prompt + canonical solution +
suffix) is tokenized with the default model's tokenizer and walked token by token; every
step times ``allowed(state)`` and checks that the next real token is in the mask. A
fill-in-the-middle check then starts from ``state_after(prompt)`` with the suffix attached
and requires the tokenized solution to be accepted and final.

    python benchmarks/lark_masks.py [--grammar FILE] [--data FILE] [--limit N] [--json OUT]

Mask times are per call of ``allowed`` in one process that keeps its memo tables, i.e.
what a server sees after its first requests (``--warmup`` tasks are walked first and not
counted). Compile time is measured cold (no disk cache) and warm (loaded grammar cached).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT.parent / "shared" / "data" / "code" / "HumanEval-SingleLineInfilling.jsonl"


def _tasks(path: Path, limit: int) -> list[dict]:
    seen: set[str] = set()
    out = []
    for line in path.read_text().splitlines():
        task = json.loads(line)
        program = task["prompt"] + task["canonical_solution"] + task["suffix"]
        if program in seen:
            continue
        seen.add(program)
        out.append(task)
        if len(out) >= limit:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grammar", default=str(ROOT / "structspec" / "grammars" / "python.lark"))
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    from structspec.automata.lark_compile import compile_grammar
    from structspec.automata.lark_grammar import load_grammar
    from structspec.models import load_tokenizer
    from structspec.vocab import Vocabulary

    tok = load_tokenizer(None)
    vocab = Vocabulary.from_tokenizer(tok)
    t0 = time.perf_counter()
    load_grammar(args.grammar, cache=False)
    cold = time.perf_counter() - t0
    load_grammar(args.grammar)  # registers it with the disk cache ...
    from structspec.automata.cache import disk_cache

    if disk_cache() is not None:
        disk_cache().flush()  # ... which writes it here
    t0 = time.perf_counter()
    c = compile_grammar(args.grammar, vocab)
    warm = time.perf_counter() - t0

    tasks = _tasks(Path(args.data), args.limit + args.warmup)
    times: list[float] = []
    rejected = []
    not_final = []
    fim_failed = []
    for n, task in enumerate(tasks):
        program = task["prompt"] + task["canonical_solution"] + task["suffix"]
        ids = tok.encode(program, add_special_tokens=False)
        s = c.initial
        ok = True
        for i, t in enumerate(ids):
            t0 = time.perf_counter()
            mask = c.allowed(s)
            dt = time.perf_counter() - t0
            if n >= args.warmup:
                times.append(dt)
            if t not in mask:
                rejected.append((task["task_id"], i, vocab.tokens[t].decode(errors="replace")))
                ok = False
                break
            s = c.advance(s, t)
        if ok and not c.is_accepting(s):
            not_final.append(task["task_id"])
        fim = c.with_suffix(task["suffix"], prefix=task["prompt"], tolerant=False)
        s = fim.initial
        for t in tok.encode(task["canonical_solution"], add_special_tokens=False):
            s = fim.advance(s, t) if s is not None else None
        if s is None or not fim.is_accepting(s):
            fim_failed.append(task["task_id"])

    us = np.array(times) * 1e6
    result = {
        "grammar": os.path.relpath(args.grammar, ROOT),
        "tasks": len(tasks) - args.warmup,
        "tokens": int(us.size),
        "mask_us": {"avg": float(us.mean()), "p50": float(np.median(us)),
                    "p90": float(np.percentile(us, 90)), "p99": float(np.percentile(us, 99)),
                    "max": float(us.max())},
        "compile_s": {"cold": cold, "warm": warm},
        "rejected": rejected[:20], "n_rejected": len(rejected),
        "not_final": not_final[:20], "fim_failed": fim_failed[:20],
        "n_fim_failed": len(fim_failed),
        "states": c.state_count(),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
