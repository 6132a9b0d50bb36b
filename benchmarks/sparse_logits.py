"""Sparse logits on vs off, plain and speculative decoding, in alternating rounds.

Where a row's state allows few tokens, structspec computes only their logits
(:mod:`structspec.spec.sparse_logits`); the outputs are the same either way (checked here,
token for token). This times each task set whole with it on and off, in ``--rounds``
alternating rounds per mode (the machine's conditions drift, so the two settings take turns),
and prints per mode the fastest and median round times and their ratios (on / off).

    python benchmarks/sparse_logits.py --task json [--n 10] [--rounds 5] [--threads 1]
        [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from speculative import load_tasks  # noqa: E402  (beside this script)

from structspec.api import Generator  # noqa: E402
from structspec.errors import GenerationError  # noqa: E402
from structspec.sampling import SamplingParams  # noqa: E402
from structspec.spec import SpecConfig, speculative_decode  # noqa: E402
from structspec.spec.cost import measure_cost_curve  # noqa: E402
from structspec.spec.cpu_paths import use_fast_cpu_paths  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=("json", "code", "prose"), default="json")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="default: 64 for code, 160 otherwise")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    limit = args.max_new_tokens or (64 if args.task == "code" else 160)
    gen = Generator(None, pack=False)
    use_fast_cpu_paths(gen.loaded.model, quantized=True)
    model = gen.loaded.model
    tasks = load_tasks(args.task, args.n, gen)
    curve = measure_cost_curve(model, budget_seconds=3.0)  # one curve for every round

    def run(enabled: bool, sparse: bool) -> tuple[list[list[int]], float]:
        config = SpecConfig(enabled=enabled, sparse_logits=sparse, cost_curve=curve)
        outputs, start = [], time.perf_counter()
        for task in tasks:
            try:
                out = speculative_decode(model, gen.vocab, task["prompt_ids"], task["constraint"],
                                         max_new_tokens=limit, sampling=SamplingParams(),
                                         config=config, tokenizer=gen.loaded.tokenizer)
                outputs.append(out.token_ids)
            except GenerationError as exc:  # the token limit: the partial output counts
                outputs.append(exc.token_ids)
        return outputs, time.perf_counter() - start

    times: dict[tuple[str, bool], list[float]] = {}
    identical = True
    reference = None  # greedy: speculative outputs equal plain ones too
    for mode, enabled in (("plain", False), ("speculative", True)):
        run(enabled, True)  # warm-up
        for r in range(args.rounds):
            for sparse in ((True, False) if r % 2 == 0 else (False, True)):
                outputs, seconds = run(enabled, sparse)
                times.setdefault((mode, sparse), []).append(seconds)
                if reference is None:
                    reference = outputs
                identical = identical and outputs == reference
    rows = []
    print(f"task={args.task} n={len(tasks)} rounds={args.rounds} threads={args.threads} "
          f"identical={identical}")
    print(f"{'mode':<12} {'on min s':>9} {'off min s':>9} {'ratio':>6} "
          f"{'on med s':>9} {'off med s':>9} {'ratio':>6}")
    for mode in ("plain", "speculative"):
        on, off = times[(mode, True)], times[(mode, False)]
        row = {"mode": mode, "on_s": [round(t, 3) for t in on],
               "off_s": [round(t, 3) for t in off],
               "ratio_min": round(min(on) / min(off), 3),
               "ratio_median": round(statistics.median(on) / statistics.median(off), 3)}
        rows.append(row)
        print(f"{mode:<12} {min(on):>9.2f} {min(off):>9.2f} {row['ratio_min']:>6.3f} "
              f"{statistics.median(on):>9.2f} {statistics.median(off):>9.2f} "
              f"{row['ratio_median']:>6.3f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"task": args.task, "n": len(tasks), "rounds": args.rounds,
             "threads": args.threads, "identical": identical, "rows": rows}, indent=1))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
