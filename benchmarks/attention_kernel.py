"""Row-exact attention (``structspec/_native/attend.c``): its loop variants side by side.

The kernel has three variants of its inner loops, which give bitwise the same numbers
(``tests/test_attention_exact.py``): the one-pair loops (``0``: one (head, row) pair's
accumulators in registers, the keys reloaded for every pair), AVX2 register tiles (``1``:
three pairs per key load) and AVX-512 tiles (``2``: six pairs; 32 vector registers; 512-bit
vectors for the scores, the softmax and, head size a multiple of 64, the weighted sums).
``set_tiles`` switches between them in one process, so this script alternates them round
by round — on a shared machine that drifts by ±10% from minute to minute, only paired
figures say anything — and reports, per shape, the fastest round of each and the median of
the rounds' ratios to the first variant. ``--old-rev REV`` adds the kernel as it was at a
git revision (compiled here like the working tree's, ``gcc -O3 -fopenmp``), as variant
``old`` and the reference of the ratios.

Two parts:

- ``kernel``: the kernel alone at the default model's shapes (9 query heads over 3
  key-value heads, 64 dimensions), ``lq`` query rows against ``lk`` keys under a tree-like
  additive mask (every row sees the cache, the last ``lq`` keys causally) — µs per layer;
- ``pass``: whole verification passes of the default model (``Generator``'s packing) of
  ``q`` nodes (a chain) over a ``--prefix``-token cache, ms per pass.

    python benchmarks/attention_kernel.py [--rounds 9] [--prefix 430] [--threads 1]
        [--old-rev REV] [--no-passes] [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from structspec import _native  # noqa: E402
from structspec.hf_compat import cache_kwargs  # noqa: E402

KERNEL_SHAPES = ((1, 460), (4, 460), (16, 460), (32, 460), (16, 120), (110, 425))
PASS_SIZES = (1, 4, 16, 32)


SOURCE = "structspec/_native/attend.c"


def build_old(rev: str, out_dir: Path):
    """The attend module compiled from git revision ``rev``'s source."""
    import numpy

    source = subprocess.run(["git", "show", f"{rev}:{SOURCE}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    src = out_dir / "attend.c"
    src.write_text(source)
    target = out_dir / ("attend" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([os.environ.get("CC", "gcc"), "-shared", "-fPIC", "-O3", "-fopenmp",
                    f"-I{sysconfig.get_paths()['include']}", f"-I{numpy.get_include()}",
                    f"-I{ROOT / 'structspec' / '_native'}", str(src), "-o", str(target)],
                   check=True)
    from kernel_ab import _load  # beside this script

    return _load(target, "attend")


def _activate(variant) -> None:
    """Route the model's attention calls (and this script's) to a variant."""
    _, module, mode = variant
    _native._CACHE["attend"] = module
    if mode is not None:
        module.set_tiles(mode)


def _kernel_call(lq: int, lk: int, threads: int):
    g = torch.Generator().manual_seed(lq * 1000 + lk)
    q, k, v = (torch.randn(9, lq, 64, generator=g), torch.randn(3, lk, 64, generator=g),
               torch.randn(3, lk, 64, generator=g))
    mask = torch.zeros(lq, lk)
    mask[:, lk - lq:] = torch.full((lq, lq), torch.finfo(torch.float32).min).triu(1)
    out = torch.empty(1, lq, 9, 64)

    def call() -> None:
        _native.load("attend").attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), 9, 3, lq, lk, 64,
                      mask.data_ptr(), 2, 0.125, out.data_ptr(), threads)
    return call, out


def _time(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def _summarize(times: dict[str, list[float]], scale: float) -> dict:
    names = list(times)
    base = times[names[0]]
    row = {name: round(min(ts) * scale, 1) for name, ts in times.items()}
    for name in names[1:]:
        row[f"{name}/{names[0]}"] = round(statistics.median(
            t / b for t, b in zip(times[name], base, strict=True)), 3)
    return row


def _rounds(variants, rounds: int, measure) -> tuple[dict[str, list[float]], dict]:
    """Alternate the variants (order flipped every round); times and last outputs."""
    times: dict[str, list[float]] = {v[0]: [] for v in variants}
    outs = {}
    for r in range(rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            _activate(v)
            seconds, outs[v[0]] = measure()
            times[v[0]].append(seconds)
    return times, outs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--prefix", type=int, default=430)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--old-rev", help="also the kernel of this git revision (variant 'old')")
    ap.add_argument("--no-passes", action="store_true", help="the kernel alone")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    kernel = _native.load("attend")
    if kernel is None or not kernel.available() or not hasattr(kernel, "max_tiles"):
        print("the attend kernel is not built here (or lacks AVX2/FMA): nothing to measure")
        return 0
    torch.set_num_threads(args.threads)
    default = kernel.tiles()
    variants = [(f"tiles{m}", kernel, m) for m in range(kernel.max_tiles() + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        if args.old_rev:
            variants.insert(0, ("old", build_old(args.old_rev, Path(tmp)), None))
        result: dict = {"threads": args.threads, "rounds": args.rounds,
                        "variants": [v[0] for v in variants], "old_rev": args.old_rev,
                        "load": round(os.getloadavg()[0], 2), "kernel": {}, "passes": {}}
        print(f"variants {result['variants']} (default tiles{default}) threads={args.threads} "
              f"load={result['load']}")
        try:
            with torch.inference_mode():
                for lq, lk in KERNEL_SHAPES:
                    call, out = _kernel_call(lq, lk, args.threads)
                    reps = max(3, 2000 // lq)
                    times, outs = _rounds(variants, args.rounds,
                                          lambda call=call, out=out, reps=reps:
                                          (_time(call, reps), out.clone()))
                    row = _summarize(times, 1e6)
                    first = next(iter(outs.values()))
                    row["bitwise"] = all(torch.equal(o, first) for o in outs.values())
                    result["kernel"][f"{lq}x{lk}"] = row
                    print(f"kernel lq={lq:3d} lk={lk:3d} µs/layer {row}")
                if not args.no_passes:
                    _passes(variants, args, result)
        finally:
            _native._CACHE["attend"] = kernel
            kernel.set_tiles(default)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _passes(variants, args, result: dict) -> None:
    from transformers import DynamicCache

    from structspec.api import Generator
    from structspec.spec.tree import chain
    from structspec.spec.verify import rollback, verify_tree

    model = Generator().loaded.model
    vocab = model.config.vocab_size
    ids = [(17 + 31 * i) % vocab for i in range(args.prefix + max(PASS_SIZES))]
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([ids[:args.prefix]]), **cache_kwargs(model, cache), use_cache=True,
          logits_to_keep=1)
    for q in PASS_SIZES:
        tree = chain(ids[args.prefix:args.prefix + q], [None] * q)

        def one(tree=tree) -> torch.Tensor:
            logits = verify_tree(model, cache, tree, args.prefix)
            rollback(cache, args.prefix)
            return logits
        times, outs = _rounds(variants, args.rounds, lambda one=one: (_time(one, 3), one()))
        row = _summarize(times, 1e3)
        first = next(iter(outs.values()))
        row["bitwise"] = all(torch.equal(o, first) for o in outs.values())
        result["passes"][str(q)] = row
        print(f"pass q={q:2d} prefix={args.prefix} ms {row}")


if __name__ == "__main__":
    raise SystemExit(main())
