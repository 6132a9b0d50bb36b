"""BFCL function calls right, per way of showing the schema to the model.

For each task of ``../shared/data/bfcl/bfcl_dev.jsonl`` the default model writes the call
greedily under the task's ``call_json_schema`` (speculation on: the same output as off, just
faster), and the call is compared with the task's ``ground_truth_bfcl``: the function name,
every argument it gives among the allowed values (strings compared case-insensitively), no
argument the ground truth does not list, and every argument without a ``""`` (may be left
out) in its allowed values present. Layouts:

- ``system`` (what ``Generator.prompt_ids`` does): the schema in the system message as a
  typed JSON template (:mod:`structspec.schema_prompt`), then the request as the user message;
- ``system-json``: the same with the schema as compact JSON Schema (structspec's layout
  before the template);
- ``request``: the JSON Schema after the request in the user message, under a short system
  message (structspec's layout before it moved the schema).

``--whitespace spaced,compact,flexible`` compares the output's whitespace policies (each
layout × policy a run; the default is a ``Generator``'s, spaced).

    python benchmarks/bfcl_accuracy.py [--n 250] [--offset 0]
        [--layouts system,system-json,request] [--whitespace spaced,compact,flexible]
        [--threads T] [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import structspec  # noqa: E402
from structspec.api import Generator  # noqa: E402
from structspec.automata.json_schema import DEFAULT_WHITESPACE  # noqa: E402
from structspec.errors import GenerationError  # noqa: E402
from structspec.sampling import SamplingParams  # noqa: E402
from structspec.schema_prompt import schema_instruction  # noqa: E402
from structspec.spec import SpecConfig, speculative_decode  # noqa: E402
from structspec.spec.cost import AcceptanceModel  # noqa: E402
from structspec.spec.prefix import PrefixCache  # noqa: E402

BFCL = ROOT.parent / "shared" / "data" / "bfcl" / "bfcl_dev.jsonl"
#: The system message of the ``request`` layout (structspec's before the schema moved).
REQUEST_LAYOUT_SYSTEM = "You are a precise assistant. Answer with JSON only."
LAYOUTS = ("system", "system-json", "request")


def call_is_right(text: str, ground_truth: list[dict]) -> bool:
    """Whether the JSON call ``text`` matches BFCL's ``ground_truth`` (one call). Pure."""
    try:
        call = json.loads(text)
    except ValueError:
        return False
    if not isinstance(call, dict) or len(ground_truth) != 1:
        return False
    (name, allowed), = ground_truth[0].items()
    args = call.get("arguments", {})
    if call.get("name") != name or not isinstance(args, dict):
        return False
    if any(key not in allowed for key in args):
        return False
    for key, values in allowed.items():
        if key not in args:
            if "" not in values:
                return False
            continue
        value = args[key]
        if not any(value == v or (isinstance(v, str) and isinstance(value, str)
                                  and value.lower() == v.lower()) for v in values):
            return False
    return True


def prompt_ids(gen: Generator, layout: str, request: str, schema: object) -> list[int]:
    """The templated prompt of ``request`` with ``schema`` shown the ``layout`` way."""
    if layout == "system":
        return gen.prompt_ids(request, schema=schema)
    if layout == "system-json":
        return gen.prompt_ids(request, schema=schema, schema_style="json")
    messages = [{"role": "system", "content": REQUEST_LAYOUT_SYSTEM},
                {"role": "user",
                 "content": f"{request}\n\n{schema_instruction(schema, 'json')}"}]
    ids = gen.loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                   tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=250)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--no-int8-activations", action="store_true",
                    help="run the exactly Q4_1-quantized layers with float32 activations "
                         "(Generator(int8_activations=False))")
    ap.add_argument("--whitespace", default=DEFAULT_WHITESPACE,
                    help="comma-separated output whitespace policies to compare (spaced, "
                         f"compact, flexible; default {DEFAULT_WHITESPACE})")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if not BFCL.exists():
        print(f"skipped: {BFCL} is absent (the shared test data)")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in BFCL.read_text().splitlines() if line.strip()]
    rows = rows[args.offset:args.offset + args.n]
    gen = Generator(None, int8_activations=not args.no_int8_activations)
    summary = {}
    runs = [(layout, ws) for layout in args.layouts.split(",")
            for ws in args.whitespace.split(",")]
    for layout, whitespace in runs:
        if layout not in LAYOUTS:
            raise SystemExit(f"--layouts: unknown layout {layout!r} ({', '.join(LAYOUTS)})")
        name = layout if whitespace == DEFAULT_WHITESPACE else f"{layout}+{whitespace}"
        prefixes, acceptance = PrefixCache(), AcceptanceModel()
        right = passes = tokens = prompt_tokens = 0
        start = time.perf_counter()
        for row in rows:
            constraint = structspec.compile_json_schema(row["call_json_schema"], gen.vocab,
                                                        whitespace=whitespace)
            ids = prompt_ids(gen, layout, row["messages"][-1]["content"], constraint.schema)
            prompt_tokens += len(ids)
            try:
                out = speculative_decode(gen.loaded.model, gen.vocab, ids, constraint,
                                         max_new_tokens=args.max_new_tokens,
                                         sampling=SamplingParams(), config=SpecConfig(),
                                         tokenizer=gen.loaded.tokenizer, acceptance=acceptance,
                                         prefix_cache=prefixes)
                text, stats = gen.vocab.decode_text(out.token_ids), out.stats
                tokens += len(out.token_ids)
            except GenerationError as exc:  # unfinished: wrong
                text, stats = "", getattr(exc, "stats", None)
            passes += stats.forward_passes if stats is not None else 0
            right += call_is_right(text, row["ground_truth_bfcl"])
        summary[name] = {"right": right, "n": len(rows), "accuracy": round(right / len(rows), 3),
                           "prompt_tokens": prompt_tokens, "prefix_reused": prefixes.reused_tokens,
                           "tokens_per_pass": round(tokens / max(1, passes), 2),
                           "seconds": round(time.perf_counter() - start, 1)}
        print(f"{name:11s} right {right}/{len(rows)} ({100 * right / len(rows):.1f}%)  "
              f"prompt tokens {prompt_tokens} (prefix cache {prefixes.reused_tokens})  "
              f"tokens/pass {summary[name]['tokens_per_pass']}  "
              f"{summary[name]['seconds']} s", flush=True)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({"offset": args.offset,
                                                   "int8_activations":
                                                       not args.no_int8_activations,
                                                   "layouts": summary},
                                                  indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
