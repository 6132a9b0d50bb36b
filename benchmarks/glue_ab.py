"""A/B of the native glue around the linears: the fused gated-MLP activation
(``structspec.spec.gated_mlp``) and the native rotary embeddings (``structspec.spec.rope``),
on and off in one process.

Both give bitwise the numbers of the torch operators they replace, so only time can differ.
This shared machine drifts by more than their effect from minute to minute, so the script
packs the default model as a ``Generator`` does, prefills ``--context`` tokens, and then
alternates the two settings round by round (the order flips every round), timing passes of
each ``--nodes`` size (a chain; the fastest of five after a warm-up pass) — a size of about
a prompt's length is a prompt's pass. It reports, per size, the median time with and without
and the median of the rounds' on/off ratios, and checks that a pass's logits are bitwise
the same either way.

    python benchmarks/glue_ab.py [--threads 1] [--context 150] [--nodes 1,8,12,16,75]
        [--rounds 15] [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from structspec.api import Generator
from structspec.hf_compat import cache_kwargs
from structspec.models import load_model
from structspec.spec import gated_mlp, rope
from structspec.spec.kv_cache import decoding_cache
from structspec.spec.tree import chain
from structspec.spec.verify import rollback, verify_tree


def _set(model, on: bool) -> None:
    if on:
        gated_mlp.use_fused_activation(model)
        rope.use_native_rotary(model)
    else:
        gated_mlp.restore_activation(model)
        rope.restore_rotary(model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=150)
    ap.add_argument("--nodes", default="1,8,12,16,75")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(q) for q in args.nodes.split(",")]
    gen = Generator(load_model(None))
    model = gen.loaded.model
    if not gated_mlp.fused_count(model) or not rope.native_rotary_active(model):
        raise SystemExit("the native glue does not run here (no CPU kernel, or not float32)")
    ids = torch.randint(100, 40000, (1, args.context), generator=torch.Generator().manual_seed(0))
    cache = decoding_cache(model, args.context + max(sizes) + 1)
    with torch.inference_mode():
        model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
    trees = {q: chain(list(range(1000, 1000 + q)), [None] * q) for q in sizes}

    def timed(q: int) -> tuple[float, torch.Tensor]:
        best, logits = float("inf"), None
        for _ in range(6):
            t0 = time.perf_counter()
            with torch.inference_mode():
                logits = verify_tree(model, cache, trees[q], args.context)
                float(logits[0, 0])
            best = min(best, time.perf_counter() - t0)
            rollback(cache, args.context)
        return best, logits

    times: dict[tuple[bool, int], list[float]] = {(on, q): [] for on in (True, False)
                                                  for q in sizes}
    bitwise = True
    for r in range(args.rounds):
        seen: dict[int, torch.Tensor] = {}
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            _set(model, on)
            for q in sizes:
                t, logits = timed(q)
                times[on, q].append(t)
                if q in seen:
                    bitwise = bitwise and torch.equal(seen[q], logits)
                seen[q] = logits
    _set(model, True)
    rows = []
    print(f"threads={torch.get_num_threads()} context={args.context} rounds={args.rounds} "
          f"load={os.getloadavg()[0]:.2f} logits bitwise equal: {bitwise}")
    print(f"{'nodes':>6} {'torch ms':>9} {'native ms':>10} {'native/torch':>13}")
    for q in sizes:
        off, on = statistics.median(times[False, q]), statistics.median(times[True, q])
        ratio = statistics.median(a / b for a, b in zip(times[True, q], times[False, q],
                                                         strict=True))
        rows.append({"nodes": q, "torch_ms": round(1000 * off, 3),
                     "native_ms": round(1000 * on, 3), "ratio": round(ratio, 3)})
        print(f"{q:>6} {1000 * off:>9.2f} {1000 * on:>10.2f} {ratio:>13.3f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"threads": torch.get_num_threads(), "context": args.context,
             "rounds": args.rounds, "bitwise": bitwise, "rows": rows}, indent=1) + "\n")
    return 0 if bitwise else 1


if __name__ == "__main__":
    raise SystemExit(main())
