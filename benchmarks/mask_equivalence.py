"""Mask equivalence and first-visit cost: drive MaskBench instances through structspec in one
process, record a digest of every mask, and compare the digests with an earlier run.

Masks must stay bit-for-bit identical across optimisations of the mask computation. Record the
reference with the old code (e.g. an exported tree on ``PYTHONPATH``), then compare:

    git archive HEAD | tar -x -C /tmp/ref
    PYTHONPATH=/tmp/ref python benchmarks/mask_equivalence.py --limit 300 --record /tmp/ref.json
    python benchmarks/mask_equivalence.py --limit 300 --compare /tmp/ref.json

Every schema runs in this one process, in file order, as in a MaskBench worker (so walks
shared across grammars are shared here too). It prints the mask time (perf counter: avg, p99)
and the CPU time spent in masks, which is steadier than wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from maskbench import DEFAULT_DATA, load_rows, make_tasks


def drive(constraint: Any, tokens: list[int], eos: int, digests: list[str],
          times: list[float], cpu: list[float], deadline: float) -> None:
    """Mask, check, advance through ``tokens`` then EOS; append digests and mask times (µs,
    wall and thread CPU)."""
    state = constraint.initial
    for token in [*tokens, eos]:
        if time.perf_counter() > deadline:
            digests.append("timeout")
            return
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        mask = constraint.allowed(state)
        times.append((time.perf_counter_ns() - t0) / 1000)
        cpu.append((time.thread_time_ns() - c0) / 1000)
        digests.append(hashlib.blake2b(mask.words.tobytes(), digest_size=8).hexdigest())
        if token == eos or token not in mask:
            return
        state = constraint.advance(state, token)
        if state is None:  # mask and advance disagree
            digests.append("inconsistent")
            return


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--splits", default="")
    p.add_argument("--limit", type=int, default=300)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per schema")
    p.add_argument("--record", type=Path, help="write the digests here")
    p.add_argument("--compare", type=Path, help="compare the digests with this record")
    args = p.parse_args(argv)

    from structspec import compile_json_schema
    from structspec.errors import StructSpecError
    from structspec.models import load_tokenizer
    from structspec.vocab import Vocabulary

    rows = load_rows(args.data, [s for s in args.splits.split(",") if s] or None, args.limit)
    tokenizer = load_tokenizer(None)
    tasks = make_tasks(rows, tokenizer)
    vocab = Vocabulary.from_tokenizer(tokenizer)
    eos = min(vocab.eos_token_ids)

    out: dict[str, list[str]] = {}
    times: list[float] = []
    cpu: list[float] = []
    started = time.perf_counter()
    for task in tasks:
        deadline = time.perf_counter() + args.timeout
        try:
            constraint = compile_json_schema(task["schema"], vocab, whitespace="compact",
                                             extra_properties=True, max_array_items=None)
        except StructSpecError as exc:
            out[task["id"]] = [f"refused {type(exc).__name__}"]
            continue
        digests: list[str] = []
        for test in task["tests"]:
            drive(constraint, test["tokens"], eos, digests, times, cpu, deadline)
            digests.append("|")
        out[task["id"]] = digests
    wall = time.perf_counter() - started
    print(f"{len(tasks)} schemas, {len(times)} masks in {wall:.1f} s")
    for name, values in (("wall", times), ("CPU", cpu)):
        t = np.asarray(values)
        print(f"  mask {name}: avg {t.mean():.1f} µs, p50 {np.percentile(t, 50):.1f} µs, "
              f"p99 {np.percentile(t, 99):.0f} µs, max {t.max() / 1000:.1f} ms, "
              f"total {t.sum() / 1e6:.2f} s")
    if args.record:
        args.record.write_text(json.dumps(out))
    if args.compare:
        ref = json.loads(args.compare.read_text())
        bad = [k for k in ref if k in out and ref[k] != out[k]]
        missing = [k for k in ref if k not in out]
        steps = sum(len(v) for k, v in out.items() if k in ref)
        print(f"compared {len(ref) - len(missing)} schemas, {steps} digests: "
              f"{len(bad)} differ" + (f" ({', '.join(bad[:10])})" if bad else ""))
        for k in bad[:3]:
            i = next(i for i, (a, b) in enumerate(zip(ref[k], out[k], strict=False)) if a != b)
            print(f"  {k}: first difference at digest {i}: {ref[k][i]} vs {out[k][i]}")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
