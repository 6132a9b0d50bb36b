"""Paired A/B in the decode loop: qdot's AVX2 half-panel kernels against its 3-row blocks.

``--against three-row`` (the default) compares the half panels with the 3-row blocks
throughout; ``--against session-26`` with the half panels as session 26 ran them (from 4
rows on; since session 28 they run from 2 rows).
``--plain`` times decoding with speculation off instead (passes of one node).
``--passes 1,2,3,4`` times single verification passes of those sizes instead (chains over
``--prefix`` cached tokens, the variants interleaved, ``--rounds`` rounds; the median per-round
ratio per size): the kernels' effect on a whole pass, without the decode loop's noise.

A benchmark run's median over 10 tasks moves by ±10% on a shared machine, more than a kernel
change of 5–10%. This script holds everything else fixed: one cost curve (measured once,
with the half panels) for both variants, so the plan draws the same trees and the two runs
of a task make the same passes (checked: same tokens, same pass count); each task runs
with and without the half panels back to back, the order alternating, for ``--rounds``
rounds after a warm-up round. It reports the total time of each variant and the median of
the per-task ratios. Speculative decoding, prefill included; the outputs are the same bits
either way (``tests/test_int8_linear.py``), so only time differs.

    python benchmarks/half_panels_ab.py --task code|json|prose [--n 10] [--offset K]
        [--rounds 2] [--threads 1] [--against three-row|session-26] [--plain] [--json-out F]
    python benchmarks/half_panels_ab.py --passes 1,2,3,4 [--prefix 150] [--rounds 25]
        [--threads 1] [--against ...] [--json-out F]

On a CPU with AVX512-VNNI the integer kernels do not use half panels: the script says so
and stops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from speculative import _run, load_tasks  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from structspec import Generator  # noqa: E402
from structspec.hf_compat import cache_kwargs  # noqa: E402
from structspec.spec import SpecConfig  # noqa: E402
from structspec.spec.cost import measure_cost_curve  # noqa: E402
from structspec.spec.fastlinear import (  # noqa: E402
    int8_vnni,
    narrow_count,
    use_half_panels,
    use_half_panels_from,
)
from structspec.spec.tree import chain  # noqa: E402
from structspec.spec.verify import rollback, verify_tree  # noqa: E402

#: The thresholds before session 28: half panels from 4 rows on (``--against session-26``).
SESSION_26 = (4, 4)


def _sizes(text: str) -> list[int]:
    """``--passes``: positive pass sizes, comma-separated."""
    try:
        sizes = [int(q) for q in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"want positive integers separated by commas, got "
                                         f"{text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=["json", "code", "prose"], default="code")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2, help="measured rounds (after a warm-up)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="default: 64 for code, 160 otherwise (as the README's runs)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--against", choices=["three-row", "session-26"], default="three-row",
                    help="the other variant: 3-row blocks throughout, or the half panels from "
                         "4 rows on (as before session 28)")
    ap.add_argument("--plain", action="store_true", help="speculation off (1-node passes)")
    ap.add_argument("--passes", type=_sizes, default=None,
                    help="comma-separated pass sizes: time single passes instead of decoding")
    ap.add_argument("--prefix", type=int, default=150,
                    help="with --passes: tokens in the KV cache before each pass")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = Generator()
    if int8_vnni() or not narrow_count(gen.loaded.model):
        print("no AVX2 half panels here (AVX512-VNNI kernels, or no 4-bit layers): nothing to "
              "compare")
        return 0
    use_half_panels(True)
    current = use_half_panels_from(*SESSION_26)  # the library's thresholds, read
    if current is None:
        print("qdot was built without set_halves_from: rebuild it (setup.py build_ext --inplace)")
        return 1
    use_half_panels_from(*current)

    def choose(halves: bool) -> None:
        if args.against == "three-row":
            use_half_panels(halves)
        else:
            use_half_panels_from(*(current if halves else SESSION_26))

    try:
        summary = (_passes(gen, args.passes, args, choose)
                   if args.passes else _decode(gen, args, choose))
    finally:
        use_half_panels(True)
        use_half_panels_from(*current)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=1))
    return 0


def _decode(gen: Generator, args: argparse.Namespace, choose) -> dict:
    """Paired decoding of the tasks, each with and without the half panels back to back, the
    order alternating; both runs of a task must decode the same tokens in as many passes."""
    tasks = load_tasks(args.task, args.n, gen, offset=args.offset)
    max_new = args.max_new_tokens or (64 if args.task == "code" else 160)
    config = (SpecConfig(enabled=False) if args.plain
              else SpecConfig(cost_curve=measure_cost_curve(gen.loaded.model,
                                                            budget_seconds=3.0)))

    def run(task: dict, halves: bool) -> tuple[float, list[int], int]:
        choose(halves)
        tokens, stats, seconds, _ = _run(gen, task, config, max_new)
        return seconds, tokens, stats.forward_passes

    total = {True: 0.0, False: 0.0}
    ratios: list[float] = []
    for rnd in range(args.rounds + 1):
        for i, task in enumerate(tasks):
            order = (True, False) if (rnd + i) % 2 == 0 else (False, True)
            res = {halves: run(task, halves) for halves in order}
            if res[True][1:] != res[False][1:]:
                raise SystemExit(f"{task['id']}: the two variants decoded differently")
            if rnd:  # round 0 warms up
                total[True] += res[True][0]
                total[False] += res[False][0]
                ratios.append(res[True][0] / res[False][0])
    other = "three_row_s" if args.against == "three-row" else "session26_s"
    summary = {"task": args.task, "n": len(tasks), "offset": args.offset,
               "rounds": args.rounds, "threads": args.threads, "against": args.against,
               "speculation": not args.plain,
               "half_panels_s": round(total[True], 3), other: round(total[False], 3),
               "ratio_total": round(total[True] / total[False], 4),
               "ratio_median": round(statistics.median(ratios), 4), "pairs": len(ratios)}
    print(f"{args.task}: half panels {total[True]:.2f} s, {args.against} {total[False]:.2f} s, "
          f"ratio {summary['ratio_total']:.3f} (median per task {summary['ratio_median']:.3f}, "
          f"{len(ratios)} pairs)")
    return summary


_CODE = ('def mean(values):\n    """The arithmetic mean of a non-empty list."""\n'
         '    return sum(values) / len(values)\n\n')


def _passes(gen: Generator, sizes: list[int], args: argparse.Namespace, choose) -> dict:
    """Paired timing of single verification passes (chains of each size over ``args.prefix``
    cached tokens), both variants interleaved, the order alternating by round."""
    model = gen.loaded.model
    ids = gen.loaded.tokenizer.encode(_CODE * 40, add_special_tokens=False)
    past = min(args.prefix, len(ids) - max(sizes))
    new = ids[past:past + max(sizes)]
    times = {(q, h): [] for q in sizes for h in (True, False)}
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids[:past]]), **cache_kwargs(model, cache), use_cache=True,
              logits_to_keep=1)
        out: dict[bool, torch.Tensor] = {}
        for rnd in range(args.rounds + 1):
            for q in sizes:
                for halves in ((True, False) if rnd % 2 else (False, True)):
                    choose(halves)
                    tree = chain(new[:q], [None] * q)
                    t0 = time.perf_counter()
                    out[halves] = verify_tree(model, cache, tree, past)
                    elapsed = time.perf_counter() - t0
                    rollback(cache, past)
                    if rnd:  # round 0 warms up
                        times[(q, halves)].append(elapsed)
                if not torch.equal(out[True], out[False]):
                    raise SystemExit(f"a pass of {q} nodes gave other logits")
    rows = {}
    print(f"passes over {past} cached tokens, {args.threads} thread(s), {args.rounds} rounds; "
          f"half panels against {args.against}")
    for q in sizes:
        ratio = statistics.median(a / b for a, b in zip(times[(q, True)], times[(q, False)],
                                                        strict=True))
        rows[str(q)] = {"half_panels_ms": round(1e3 * statistics.median(times[(q, True)]), 2),
                        "other_ms": round(1e3 * statistics.median(times[(q, False)]), 2),
                        "ratio_median": round(ratio, 4)}
        print(f"{q:>3} nodes: half panels {rows[str(q)]['half_panels_ms']:.2f} ms, "
              f"{args.against} {rows[str(q)]['other_ms']:.2f} ms, median ratio {ratio:.3f}")
    return {"passes": rows, "prefix": past, "rounds": args.rounds, "threads": args.threads,
            "against": args.against}


if __name__ == "__main__":
    raise SystemExit(main())
