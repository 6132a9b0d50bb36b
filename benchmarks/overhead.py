"""What the constraint costs per token: plain HF ``generate`` vs structspec, same run.

For each task (a prompt and a JSON Schema) it measures, interleaved and repeated:

- ``hf``: ``model.generate`` unconstrained, greedy — what a user would run without us;
- ``structspec-free``: our decode loop without a constraint (isolates the loop itself);
- ``structspec``: our decode loop under the compiled schema, greedy.

Per-token time is decode time after the prefill, divided by generated tokens: for ``hf``
``(t(N tokens) - t(1 token)) / (N - 1)``; for structspec the loop times its prefill itself.
The table reports ms/token, tokens/s and the ratio to ``hf`` (target: constraint ≤ 1.10×).
Schemas compile before timing starts (compile time is reported apart).

    python benchmarks/overhead.py [--tasks N] [--repeats R] [--max-new-tokens M] [--json-out F]
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

from structspec.api import Generator  # noqa: E402
from structspec.engine import decode, free_text  # noqa: E402
from structspec.errors import GenerationError, StructSpecError  # noqa: E402
from structspec.sampling import SamplingParams  # noqa: E402

TASKS = [
    ("person", "Extract the person: Maria Lopez is 34, lives in Madrid, email "
     "maria.lopez@example.com, and enjoys chess and hiking."),
    ("invoice", "Invoice INV-2041 dated 2024-03-05 in EUR: 3 desk lamps at 24.50 each and 1 "
     "office chair at 189.00; total 262.50."),
    ("function_call", "What's the weather like in Boston in fahrenheit?"),
    ("issue_report", "Bug: the export button crashes the app on Windows when the file name "
     "has an emoji. Steps: open a project, rename it with an emoji, click export. High "
     "severity, happens every time, component: exporter."),
]


def _hf_time(model, ids: list[int], n: int) -> tuple[float, int]:
    """Seconds and new tokens of ``model.generate`` for ``n`` new tokens, greedy."""
    input_ids = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=model.config.eos_token_id)
    return time.perf_counter() - t0, out.shape[1] - len(ids)


def _constrained(model, vocab, ids, constraint, limit, sampling):
    """Token ids and stats of constrained greedy decoding, also when the limit cuts it."""
    try:
        out = decode(model, vocab, ids, constraint, max_new_tokens=limit, sampling=sampling)
        return out.token_ids, out.stats
    except GenerationError as exc:
        return exc.token_ids, exc.stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model spec (default: embedded)")
    parser.add_argument("--tasks", type=int, default=len(TASKS), help="how many tasks")
    parser.add_argument("--repeats", type=int, default=3, help="repeats per measurement")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json-out", type=Path, default=None, help="write results as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    gen = Generator(args.model, pack=False)  # the model exactly as HF `generate` runs it
    model, vocab = gen.loaded.model, gen.vocab
    greedy = SamplingParams()
    rows = []
    for name, prompt in TASKS[: args.tasks]:
        schema = json.loads((ROOT / "schemas" / f"{name}.json").read_text())
        t0 = time.perf_counter()
        try:
            constraint = gen.compile(schema)
        except StructSpecError as exc:
            print(f"skip {name}: {exc}", file=sys.stderr)
            continue
        compile_s = time.perf_counter() - t0
        ids = gen.prompt_ids(prompt, schema=schema)
        # Warm-up (first-touch masks, allocator), then interleaved repeats. An output cut by
        # the token limit is still a fair per-token measurement.
        out_ids, _ = _constrained(model, vocab, ids, constraint, args.max_new_tokens, greedy)
        n = max(2, len(out_ids))
        _hf_time(model, ids, 2)
        per = {"hf": [], "structspec-free": [], "structspec": []}
        for _ in range(args.repeats):
            t1, _ = _hf_time(model, ids, 1)
            tn, got = _hf_time(model, ids, n)
            per["hf"].append((tn - t1) / max(1, got - 1))
            free = decode(model, vocab, ids, free_text(vocab), max_new_tokens=n, sampling=greedy)
            s = free.stats
            per["structspec-free"].append((s.seconds - s.prefill_seconds) / max(1, s.new_tokens))
            _, c = _constrained(model, vocab, ids, constraint, args.max_new_tokens, greedy)
            per["structspec"].append((c.seconds - c.prefill_seconds) / max(1, c.new_tokens))
        med = {k: statistics.median(v) for k, v in per.items()}
        rows.append({
            "task": name, "new_tokens": len(out_ids), "compile_s": round(compile_s, 3),
            "ms_per_token": {k: round(v * 1e3, 2) for k, v in med.items()},
            "ratio_vs_hf": {k: round(v / med["hf"], 3) for k, v in med.items()},
            "output": vocab.decode_text(out_ids),
        })

    print(f"{'task':<14} {'tokens':>6} {'compile s':>9} {'hf ms/tok':>10} "
          f"{'free ms/tok':>11} {'constr ms/tok':>13} {'constr/hf':>9}")
    for r in rows:
        m = r["ms_per_token"]
        print(f"{r['task']:<14} {r['new_tokens']:>6} {r['compile_s']:>9.3f} {m['hf']:>10.2f} "
              f"{m['structspec-free']:>11.2f} {m['structspec']:>13.2f} "
              f"{r['ratio_vs_hf']['structspec']:>8.3f}x")
    if rows:
        geo = statistics.geometric_mean(r["ratio_vs_hf"]["structspec"] for r in rows)
        print(f"geometric mean constrained/hf per-token time: {geo:.3f}x (target <= 1.10x)")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"rows": rows, "torch": torch.__version__}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
