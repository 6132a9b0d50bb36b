"""Cost of a verification (tree) pass by dtype, node count and context, on any device.

The default model's architecture (SmolLM2-135M) with random weights — a pass's time does not
depend on the weights, so this needs neither the model file nor the tokenizer — prefilled to
``--context`` tokens, then trees of ``--nodes`` nodes (a root and a chain below it) run
through :func:`structspec.spec.verify.verify_tree`, each keeping its root, so that every pass
sees one more cached token than the last, as in decoding (a backend that prepares per shape,
like cuDNN attention, pays for that every pass).
With ``--profile Q`` one pass of Q nodes per dtype is profiled (torch.profiler, top ops).

    python benchmarks/tree_pass_profile.py --device cuda --dtypes bfloat16,float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from structspec.hf_compat import cache_kwargs
from structspec.spec.tree import chain
from structspec.spec.verify import keep_path, rollback, verify_tree


def smollm2_like(dtype: torch.dtype, device: str, attn: str):
    """SmolLM2-135M's architecture, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rope_theta=100000.0,
                         tie_word_embeddings=True, attn_implementation=attn)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--attn", default="sdpa", help="attention implementation(s), comma-separated")
    ap.add_argument("--contexts", default="32,300")
    ap.add_argument("--nodes", default="1,2,4,9,17,32")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--profile", type=int, default=0, help="profile one pass of this many nodes")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    from transformers import DynamicCache

    rows = []
    for attn in args.attn.split(","):
        for name in args.dtypes.split(","):
            dtype = getattr(torch, name)
            model = smollm2_like(dtype, args.device, attn)
            for ctx in (int(c) for c in args.contexts.split(",")):
                ids = torch.randint(100, 40000, (1, ctx), device=args.device)
                cache = DynamicCache(config=model.config)
                with torch.inference_mode():
                    model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True,
                          logits_to_keep=1)
                times = {}
                past = ctx
                for q in (int(n) for n in args.nodes.split(",")):
                    tree = chain(list(range(1000, 1000 + q)), [None] * q)
                    samples = []
                    for r in range(args.repeats + 2):
                        _sync(args.device)
                        t0 = time.perf_counter()
                        with torch.inference_mode():
                            logits = verify_tree(model, cache, tree, past)
                            float(logits[0, 0])  # the decode loop reads the logits
                        _sync(args.device)
                        if r >= 2:
                            samples.append(time.perf_counter() - t0)
                        # As in decoding, the root stays: the next pass sees one more key
                        # (a shape never seen before, as every pass of a decode does).
                        keep_path(cache, past, [0])
                        past += 1
                    times[q] = round(1000 * statistics.median(samples), 3)
                rollback(cache, ctx)
                row = {"attn": attn, "dtype": name, "context": ctx, "ms": times}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.profile and ctx == max(int(c) for c in args.contexts.split(",")):
                    from torch.profiler import ProfilerActivity, profile

                    q = args.profile
                    tree = chain(list(range(1000, 1000 + q)), [None] * q)
                    acts = [ProfilerActivity.CPU]
                    if args.device.startswith("cuda"):
                        acts.append(ProfilerActivity.CUDA)
                    with profile(activities=acts) as prof, torch.inference_mode():
                        float(verify_tree(model, cache, tree, ctx)[0, 0])
                        _sync(args.device)
                    rollback(cache, ctx)
                    key = ("self_cuda_time_total" if args.device.startswith("cuda")
                           else "self_cpu_time_total")
                    print(f"--- profile {attn} {name} q={q} context={ctx}")
                    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
                    if key != "self_cpu_time_total":
                        print(prof.key_averages().table(sort_by=key, row_limit=8))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
