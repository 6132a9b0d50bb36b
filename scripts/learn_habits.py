"""Learn the default model's tokenization habits (how it splits forced JSON punctuation, how
it ends values) and write them beside its draft head, as the prior every new
``AcceptanceModel`` starts from (:mod:`structspec.spec.habits`).

The requests are MaskBench's Glaive function-argument schemas (none of the BFCL calls the
speculative benchmark runs), each asked for with the values of one of its valid instances,
so that the model writes the kind of call the benchmarks and users ask for::

    .venv/bin/python scripts/learn_habits.py --requests 40

Takes ~2 minutes on one CPU thread. Outputs are not checked: only how they were tokenized
is kept.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MASKBENCH = ROOT.parent / "shared" / "data" / "maskbench" / "maskbench_dev.jsonl.gz"


def _leaves(value: Any) -> list[str]:
    """The scalar values of a JSON instance, in order, as text."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [] if value is None else [json.dumps(value) if isinstance(value, bool) else str(value)]


def requests(path: Path, n: int, seed: int) -> list[tuple[str, dict]]:
    """``n`` (prompt, schema) pairs from Glaive schemas with a small valid instance."""
    rows = []
    with gzip.open(path, "rt") as f:
        for line in f:
            row = json.loads(line)
            if not row["id"].startswith("Glaiveai2K"):
                continue
            valid = [t["data"] for t in row.get("tests", []) if t.get("valid")]
            if valid and isinstance(valid[0], dict) and 0 < len(json.dumps(valid[0])) <= 160:
                rows.append((row, valid[0]))
    random.Random(seed).shuffle(rows)
    out = []
    for row, instance in rows[:n]:
        values = ", ".join(_leaves(instance)) or "any"
        out.append((f"Call it with these values: {values}.", row["schema"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="model to learn for (default: the embedded default model)")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None,
                    help="habits file (default: the model's packaged one, beside the draft "
                         "heads, where every new AcceptanceModel for it looks)")
    args = ap.parse_args(argv)
    if not MASKBENCH.is_file():
        print(f"{MASKBENCH}: not found (the shared test data)", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    import structspec
    from structspec.errors import StructSpecError
    from structspec.spec.habits import habits_path, save_habits

    gen = structspec.Generator(args.model)
    asked = requests(MASKBENCH, args.requests, args.seed)
    done = 0
    for prompt, schema in asked:
        try:
            gen.run(prompt, schema=schema, max_new_tokens=128, lenient=True, max_retries=0)
            done += 1
        except (StructSpecError, ValueError) as exc:  # a schema or output it refuses
            print(f"skipped: {type(exc).__name__}: {str(exc)[:100]}")
    acceptance = gen.acceptance("JsonSchemaConstraint")
    if acceptance is None:
        print("no speculative request ran", file=sys.stderr)
        return 1
    out = args.out or habits_path(Path(gen.loaded.name).name)
    save_habits(out, acceptance, gen.loaded.model, name=gen.loaded.name,
                meta={"requests": done, "source": "MaskBench Glaiveai2K", "seed": args.seed})
    habits = acceptance.habits()
    print(f"{out}: {len(habits['splits'])} split contexts, {len(habits['closers'])} closers "
          f"from {done} of {len(asked)} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
