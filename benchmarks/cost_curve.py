"""Cost of one verification pass vs the number of new tokens, with and without packed linears.

On a prefix of ~350 tokens in the KV cache, times one forward pass of ``q`` new tokens (a
draft tree of ``q`` nodes — a chain — through ``structspec.spec.verify.verify_tree``, then
rolled back) for ``q`` in 1, 2, 4, 8, 16, 32, with the model's ``nn.Linear`` layers as they
are and packed for oneDNN (:func:`structspec.spec.fastlinear.pack_linears`). Measurements
of the two variants are interleaved (the same packed modules are swapped in and out), and
each point is the median of ``--repeats`` runs. Also reports the largest logit difference
between the variants and whether the argmax agrees.

    python benchmarks/cost_curve.py [--repeats R] [--prefix N] [--threads T] [--json-out F]

The first use of the default model converts it (~25 s).
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

from structspec.models import load_model  # noqa: E402
from structspec.spec.fastlinear import PackedLinear, pack_linears, packing_available  # noqa: E402
from structspec.spec.tree import chain  # noqa: E402
from structspec.spec.verify import rollback, verify_tree  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32)
TEXT = ("The quick brown fox jumps over the lazy dog while the committee reviews the budget "
        "for the next fiscal year, including travel, equipment and salaries. ")


class _Swapper:
    """Swap packed linears in and out without re-packing."""

    def __init__(self, model) -> None:
        pack_linears(model)
        self.sites = [(parent, name, child) for parent in model.modules()
                      if not isinstance(parent, PackedLinear)
                      for name, child in parent.named_children() if isinstance(child, PackedLinear)]

    def use(self, packed: bool) -> None:
        for parent, name, module in self.sites:
            setattr(parent, name, module if packed else module.original)


def _time_pass(model, cache, prefix_len: int, tokens: list[int]) -> tuple[float, torch.Tensor]:
    tree = chain(tokens, [None] * len(tokens))
    t0 = time.perf_counter()
    logits = verify_tree(model, cache, tree, prefix_len)
    elapsed = time.perf_counter() - t0
    rollback(cache, prefix_len)
    return elapsed, logits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--prefix", type=int, default=350)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--model", default=None)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import DynamicCache

    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    ids = tok.encode(TEXT * 20, add_special_tokens=False)[: args.prefix]
    new = tok.encode(TEXT * 2, add_special_tokens=False)[args.prefix % 7:][: max(SIZES)]
    variants = ["plain"]
    swap = None
    if packing_available(model):
        swap = _Swapper(model)
        variants.append("packed")
    times: dict[str, dict[int, list[float]]] = {v: {q: [] for q in SIZES} for v in variants}
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
        diff, agree = 0.0, True
        for repeat in range(args.repeats + 1):  # the first round warms up
            for variant in variants:
                if swap is not None:
                    swap.use(variant == "packed")
                for q in SIZES:
                    t, logits = _time_pass(model, cache, len(ids), new[:q])
                    if repeat:
                        times[variant][q].append(t)
                    if q == max(SIZES) and repeat == 1:
                        if variant == "plain":
                            ref = logits.clone()
                        else:
                            diff = float((logits - ref).abs().max())
                            agree = bool((logits.argmax(-1) == ref.argmax(-1)).all())
    result = {"threads": torch.get_num_threads(), "prefix": len(ids),
              "load": round(os.getloadavg()[0], 2), "ms": {}, "relative": {}}
    print(f"prefix={len(ids)} threads={result['threads']} load={result['load']}")
    print(f"{'q':>4} " + " ".join(f"{v + ' ms':>12} {v + ' ×t(1)':>12}" for v in variants))
    for v in variants:
        result["ms"][v] = {q: round(1000 * statistics.median(times[v][q]), 2) for q in SIZES}
        t1 = result["ms"][v][1]
        result["relative"][v] = {q: round(result["ms"][v][q] / t1, 3) for q in SIZES}
    for q in SIZES:
        print(f"{q:>4} " + " ".join(f"{result['ms'][v][q]:>12.1f} {result['relative'][v][q]:>12.2f}"
                                    for v in variants))
    if swap is not None:
        result["max_logit_diff"] = diff
        result["argmax_agree"] = agree
        print(f"max |logit diff| packed vs plain over {max(SIZES)} rows: {diff:.2e}; "
              f"argmax identical: {agree}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
