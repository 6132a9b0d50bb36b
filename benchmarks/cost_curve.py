"""Cost of one verification pass vs the number of new tokens, with and without packed linears.

On a prefix of ~350 tokens in the KV cache, times one forward pass of ``q`` new tokens (a
draft tree of ``q`` nodes — a chain — through ``structspec.spec.verify.verify_tree``, then
rolled back) for ``q`` in 1, 2, 4, 8, 16, 32, with the model's ``nn.Linear`` layers as they
are ("plain") and packed by each kernel that runs here ("panel", "onednn":
:func:`structspec.spec.fastlinear.pack_linears`). Measurements of the variants are
interleaved (the same packed modules are swapped in and out), and each point is the median
of ``--repeats`` runs. Also reports, per kernel, the largest logit difference from the plain
model and whether the argmax agrees, and whether a row's logits are bitwise the same in the
32-row pass and in a pass of that row alone. Where grouped tree attention applies
(:mod:`structspec.spec.attention`), more variants run with it ("<kernel>+grouped"): the
first kernel, and "panel_int8" (8-bit activations, a ``Generator``'s default), which runs
with it only; the others keep transformers' sdpa.

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

from structspec.hf_compat import cache_kwargs  # noqa: E402
from structspec.models import load_model  # noqa: E402
from structspec.spec.attention import restore_sdpa, use_grouped_sdpa  # noqa: E402
from structspec.spec.fastlinear import (  # noqa: E402
    PackedLinear,
    available_kernels,
    pack_linears,
    unpack_linears,
)
from structspec.spec.tree import chain  # noqa: E402
from structspec.spec.verify import rollback, verify_tree  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32)
TEXT = ("The quick brown fox jumps over the lazy dog while the committee reviews the budget "
        "for the next fiscal year, including travel, equipment and salaries. ")


class _Swapper:
    """Swap each kernel's packed linears in and out without re-packing."""

    def __init__(self, model, kernels: tuple[str, ...]) -> None:
        self.sites: dict[str, list] = {}
        for kernel in kernels:
            pack_linears(model, kernel)
            self.sites[kernel] = [
                (parent, name, child) for parent in model.modules()
                if not isinstance(parent, PackedLinear)
                for name, child in parent.named_children() if isinstance(child, PackedLinear)]
            unpack_linears(model)

    def use(self, variant: str) -> None:
        for kernel, sites in self.sites.items():
            for parent, name, module in sites:
                if kernel == variant:
                    setattr(parent, name, module)
                elif getattr(parent, name) is module:
                    setattr(parent, name, module.original)


def _time_pass(model, cache, prefix_len: int, tokens: list[int]) -> tuple[float, torch.Tensor]:
    tree = chain(tokens, [None] * len(tokens))
    t0 = time.perf_counter()
    logits = verify_tree(model, cache, tree, prefix_len)
    elapsed = time.perf_counter() - t0
    rollback(cache, prefix_len)
    return elapsed, logits


def _row_bitwise(model, cache, prefix_len: int, new: list[int], logits: torch.Tensor) -> bool:
    """Whether the first row of a 32-row pass equals, bit for bit, a pass of that row alone."""
    _, alone = _time_pass(model, cache, prefix_len, new[:1])
    return bool(torch.equal(alone[0], logits[0]))


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
    kernels = available_kernels()
    # 8-bit activations (what a Generator runs by default) only with the row-exact attention
    # of the "+grouped" variants: without it rows are not bitwise the same across passes
    approx = [k for k in available_kernels(approx=True) if k not in kernels]
    variants = ["plain", *kernels]
    if kernels and use_grouped_sdpa(model):  # the attention Generator uses, on the first kernel
        restore_sdpa(model)
        variants += [f"{kernels[0]}+grouped", *(f"{k}+grouped" for k in approx)]
    swap = _Swapper(model, (*kernels, *approx))
    times: dict[str, dict[int, list[float]]] = {v: {q: [] for q in SIZES} for v in variants}
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids]), **cache_kwargs(model, cache),
              use_cache=True, logits_to_keep=1)
        checks: dict[str, dict] = {}
        for repeat in range(args.repeats + 1):  # the first round warms up
            for variant in variants:
                kernel, grouped = variant.removesuffix("+grouped"), variant.endswith("+grouped")
                swap.use(kernel)
                if grouped:
                    use_grouped_sdpa(model)
                else:
                    restore_sdpa(model)
                for q in SIZES:
                    t, logits = _time_pass(model, cache, len(ids), new[:q])
                    if repeat:
                        times[variant][q].append(t)
                    if q == max(SIZES) and repeat == 1:
                        if variant == "plain":
                            ref = logits.clone()
                        else:
                            checks[variant] = {
                                "max_logit_diff": float((logits - ref).abs().max()),
                                "argmax_agree": bool((logits.argmax(-1) == ref.argmax(-1)).all()),
                                "row_bitwise": _row_bitwise(model, cache, len(ids), new, logits)}
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
    result["checks"] = checks
    for variant, check in checks.items():
        print(f"{variant}: max |logit diff| vs plain over {max(SIZES)} rows "
              f"{check['max_logit_diff']:.2e}; argmax identical: {check['argmax_agree']}; "
              f"first row bitwise equal to a 1-row pass: {check['row_bitwise']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
