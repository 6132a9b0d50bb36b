"""One rank of a tensor-parallel check, run by ``torch.distributed.run`` (torchrun) from
``tests/test_tensor_parallel.py``: a tiny random Llama with the default model's tokenizer,
split over the group; rank 0 decodes (plain and speculative, through ``Generator``) and
writes what it saw to the JSON file named by ``argv[1]``; the other
ranks serve its passes.

Each rank prints where it is (``rank R: <phase>``) so that a failure names its phase, and
ends with ``os._exit(0)`` once it has left the group: the group is torn down cleanly by
then, and skipping the interpreter's teardown keeps torch's C++ threads from racing it (a
rare abort at exit, "terminate called without an active exception", about one CI run in
fifty)."""

from __future__ import annotations

import json
import os
import sys

import torch

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 6},
    {"type": "object", "properties": {"ok": {"type": "boolean"},
                                      "tags": {"type": "array", "items": {"type": "string"},
                                               "maxItems": 3}}},
]
PROMPTS = ["Describe a person.", "List some colours, please.", "Is it fine? Say why."]


def both(gen, prompt: str, schema: dict, greedy: bool) -> dict:
    """Plain and speculative decoding of one request on the group: token ids, whether each
    output was complete, and whether it validates against ``schema``."""
    import jsonschema

    from structspec.errors import GenerationError

    result: dict = {"schema": schema, "greedy": greedy}
    for name, spec in (("plain", False), ("spec", True)):
        try:
            r = gen.run(prompt, schema=schema, max_new_tokens=48, speculative=spec,
                        temperature=0.0 if greedy else 0.9, seed=None if greedy else 11,
                        max_retries=0)
            ids, text, complete, passes = r.token_ids, r.text, True, r.stats.forward_passes
        except GenerationError as exc:
            ids, text, complete, passes = exc.token_ids, exc.text, False, None
        valid = None
        if complete:
            try:
                jsonschema.validate(json.loads(text), schema)
                valid = True
            except (ValueError, jsonschema.ValidationError):
                valid = False
        result[name] = {"ids": list(ids), "complete": complete, "valid": valid,
                        "passes": passes}
    return result


def main(out_path: str) -> None:
    from conftest import tiny_llama  # (this script's folder is tests/)

    from structspec.api import Generator
    from structspec.models import LoadedModel, load_tokenizer
    from structspec.spec.lockstep import init_group, leave_group

    torch.set_num_threads(1)
    rank, world = init_group("gloo", timeout_s=120)
    tok = load_tokenizer(None)
    model = tiny_llama(tok)  # 4 query / 2 key-value heads: groups of 1 or 2 ranks divide it
    reference = tiny_llama(tok) if rank == 0 else None  # the whole model, for its logits
    loaded = LoadedModel(model, tok, "tiny-random", frozenset({tok.eos_token_id}))
    gen = Generator(loaded, tensor_parallel=True)
    if not gen.leader:
        print(f"rank {rank}: served {gen.serve()} passes", flush=True)
        leave_group()  # this script set the group up: it leaves it, with rank 0
        print(f"rank {rank}: left", flush=True)
        return
    report: dict = {"world": world, "runs": []}
    ids = tok.encode("Hello there, tell me a story", add_special_tokens=False)
    with torch.inference_mode():
        whole = reference(input_ids=torch.tensor([ids])).logits[0]
        split = gen.loaded.model(input_ids=torch.tensor([ids])).logits[0]
    report["logits_max_diff"] = float((whole - split).abs().max())
    report["logits_scale"] = float(whole.abs().max())
    for schema, prompt in zip(SCHEMAS, PROMPTS, strict=True):
        for greedy in (True, False):
            report["runs"].append(both(gen, prompt, schema, greedy))
    with open(out_path, "w") as f:
        json.dump(report, f)
    print("rank 0: decoded", flush=True)
    gen.close()
    leave_group()
    print("rank 0: left", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
