"""Speculative decoding against plain decoding, on far more external constraints than the
test suite has time for.

``tests/test_spec_lossless_external.py`` holds speculation to plain decoding's outputs on
samples of constraints others wrote (78 MaskBench schemas, a quarter of the
JSON-Schema-Test-Suite, 15 HumanEval infilling tasks) within the default test run. This
script runs the same comparison, with the same tiny random model, real tokenizer and random
draft head (``tests/conftest.py``), over as much of the data as one asks for, greedy and
sampled (under one seed speculation must emit plain sampling's tokens), and prints every
mismatch; it exits 1 if there was one. Run it after changing drafting, the tree walk or the
verification pass.

- ``json``: every ``--stride``-th MaskBench schema from ``--start``, with the default
  drafters, the random head on a flat cost curve, 32-node trees on a flat curve, and no
  tokenizer (forced text drafted as the longest matching tokens);
- ``code``: HumanEval multi-line infilling tasks as Python views (``eof``, ``statement``,
  ``block`` stops in turn), the first three set-ups;
- ``grammars``: the shipped Lark grammars (json, javascript, sql, python) after BFCL and
  HumanEval prompts, two random models;
- ``fuzz``: MaskBench schemas under random ``SpecConfig`` combinations (drafter subsets
  including the opt-in ``topk`` and ``splits``, budgets, depths, nested rounds, sparse
  logits, adaptivity, cost model or not, the head) and a random whitespace policy and
  sampling mode each;
- ``api``: ``Generator.run`` with random arguments (``--cases``; schemas, regexes, the shipped
  grammars with prefixes, suffixes and stops, chat or not, a system message, the schema shown
  or not, whitespace, lenient retries, budgets, sampling), with speculation off, on, and on
  with 4-node trees: the three must agree (outputs, or the same typed error), and nothing
  but a typed error may escape.

``--target q4`` runs every sweep on a tiny target with the default model's number formats
(Q4_1 body, Q8_0 output layer): every pass on the integer kernels, a prompt's rows on the
prompt panels of session 63; ``--prefix`` also decodes each comparison, plain and
speculative, from a prefix cache that holds two thirds of the prompt (only the tail is
prefilled), and fails if the cache was not hit.

Session 61 (one thread each, ~20 min in all): json ``--stride 10 --start 3`` (757 schemas
compiled, 6,056 speculative runs), code ``--stride 25 --start 5`` (233 tasks, 1,398 runs),
grammars ``--per 100`` (800 prompts, 2,400 runs), fuzz ``--stride 7 --start 2 --seed 11``
(1,070 schemas, 2,140 runs), api ``--cases 1500``: no mismatch. Its first run found that
``tokenizer=None`` raised ``AttributeError`` (fixed then).
Session 64, the same five with ``--target q4 --prefix``: 26,334 runs, 9,840 of them from a
prefix hit, no mismatch (``docs/performance.md``, "Session 64").

    python scripts/lossless_sweep.py json [--stride 10] [--start 3] [--limit N]
    python scripts/lossless_sweep.py code [--stride 25] [--start 5] [--limit N]
    python scripts/lossless_sweep.py grammars [--per 25]
    python scripts/lossless_sweep.py fuzz [--stride 7] [--start 2] [--limit N] [--seed 11]
    python scripts/lossless_sweep.py api [--cases 300] [--seed 11]
    (each: [--target tiny|q4] [--prefix] [--json-out F])
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from conftest import (  # noqa: E402
    SHARED_DATA,
    instance_prompt,
    maskbench_rows,
    q4_llama,
    random_draft_head,
    run_decode,
    tiny_llama,
)

from structspec.automata import compile_json_schema  # noqa: E402
from structspec.engine import decode  # noqa: E402
from structspec.errors import GenerationError, StructSpecError  # noqa: E402
from structspec.sampling import SamplingParams  # noqa: E402
from structspec.spec import SpecConfig, speculative_decode  # noqa: E402
from structspec.spec.cost import CostCurve  # noqa: E402
from structspec.spec.prefix import PrefixCache  # noqa: E402
from structspec.vocab import Vocabulary  # noqa: E402

FLAT = CostCurve((1, 64), (1.0, 1.0))  # every tree size costs the same: nothing is pruned
MAX_NEW = 40
OPTIONAL_DRAFTERS = ("values", "closers", "lookup", "text_lookup", "counting", "alternatives",
                     "topk", "splits")
Outcome = tuple[list[int], bool, str | None]


def outcome(fn: Any, *args: Any, **kwargs: Any) -> Outcome:
    """(token ids, complete, error kind or ``None``) of one decode: conftest's
    ``run_decode`` without the output object. A typed error the constraint raises on the
    way (a grammar whose state grows past its resource limit on what a random target
    writes) is an outcome too, ``([], False, "<type>: <message>")``: both decoders must
    meet it at the same token, with the same message."""
    try:
        return run_decode(fn, *args, **kwargs)[:3]
    except StructSpecError as exc:
        return [], False, f"{type(exc).__name__}: {exc}"


class Sweep:
    """The tiny target (with a ``Generator``'s CPU paths), the real tokenizer and the
    mismatch log of one run.

    ``target``: ``"tiny"``, a float32 Llama of width 32 (the packed float kernels), or
    ``"q4"``, one of width 64 whose body weights are exact Q4_1 numbers and whose output
    layer is exact Q8_0, as the default model's: every pass runs the integer kernels and a
    prompt's rows the prompt panels (``structspec.spec.prompt_rows``). ``prefix``: each
    comparison also decodes, plain and speculative, from a :class:`PrefixCache` that holds
    the prompt's first two thirds, so that only its tail is prefilled."""

    def __init__(self, seed: int = 0, target: str = "tiny", prefix: bool = False) -> None:
        from structspec.models import load_tokenizer

        self.tok = load_tokenizer(None)
        self.vocab = Vocabulary.from_tokenizer(self.tok, eos_token_ids=[self.tok.eos_token_id])
        self.kind = target
        self.prefix = prefix
        self.target = self.packed(seed)
        self.runs = 0
        self.prefix_hits = 0
        self.mismatches: list[str] = []

    def model(self, seed: int = 0) -> Any:
        """A new target of this sweep's kind, unpacked (as a ``Generator`` takes it)."""
        if self.kind == "q4":
            return q4_llama(seed=seed, vocab_size=len(self.tok))
        return tiny_llama(self.tok, seed=seed)

    def packed(self, seed: int = 0) -> Any:
        """A new target of this sweep's kind with a ``Generator``'s CPU paths."""
        from structspec.spec.cpu_paths import use_fast_cpu_paths

        return use_fast_cpu_paths(self.model(seed))

    def setups(self, tokenizer_free: bool = False) -> dict[str, tuple[SpecConfig, Any]]:
        """``{name: (config, tokenizer)}``: the set-ups each task runs under."""
        head = random_draft_head(self.target)
        out = {"default": (SpecConfig(), self.tok),
               "draft_head": (SpecConfig(draft_head=head, draft_head_min_prob=0.0,
                                         adaptive=False, cost_curve=FLAT), self.tok),
               "flat_wide": (SpecConfig(cost_curve=FLAT, max_nodes=32), self.tok)}
        if tokenizer_free:
            out["no_tokenizer"] = (SpecConfig(), None)
        return out

    def compare(self, name: str, prompt: list[int], constraint: Any, sampling: SamplingParams,
                setups: dict[str, tuple[SpecConfig, Any]], max_new: int = MAX_NEW) -> Outcome:
        """Plain decoding, then each set-up's speculative decoding (and with ``prefix``, both
        from a prefix cache): a mismatch is logged."""
        plain = outcome(decode, self.target, self.vocab, prompt, constraint,
                        max_new_tokens=max_new, sampling=sampling)
        runs = {setup: (speculative_decode, config, tokenizer, None)
                for setup, (config, tokenizer) in setups.items()}
        if self.prefix and len(prompt) >= 3:
            cache = self.taught_cache(prompt, constraint)
            runs["prefix, plain"] = (decode, None, None, cache)
            runs["prefix, speculative"] = (speculative_decode, SpecConfig(), self.tok, cache)
        for setup, (fn, config, tokenizer, cache) in runs.items():
            extra: dict[str, Any] = {} if fn is decode else {"tokenizer": tokenizer,
                                                             "config": config}
            hits = cache.hits if cache is not None else 0
            spec = outcome(fn, self.target, self.vocab, prompt, constraint,
                           max_new_tokens=max_new, sampling=sampling, prefix_cache=cache,
                           **extra)
            if cache is not None:
                if cache.hits == hits:  # the prefix must have been used, or nothing is shown
                    raise RuntimeError(f"{name}: the prefix cache was not hit")
                self.prefix_hits += 1
            self.runs += 1
            if spec != plain:
                line = f"MISMATCH {name} ({setup}, {sampling}): plain {plain} speculative {spec}"
                self.mismatches.append(line)
                print(line, flush=True)
        return plain

    def taught_cache(self, prompt: list[int], constraint: Any) -> PrefixCache:
        """A prefix cache holding ``prompt``'s first two thirds: two requests that share
        them and part there (one token each) teach it."""
        keep = max(1, 2 * len(prompt) // 3)
        cache = PrefixCache(min_tokens=1)
        other = (prompt[keep] + 1) % len(self.tok)
        for nxt in (prompt[keep], other):
            outcome(decode, self.target, self.vocab, [*prompt[:keep], nxt], constraint,
                    max_new_tokens=1, sampling=SamplingParams(), prefix_cache=cache)
        return cache

    def prompt(self, description: str, instance: Any) -> list[int]:
        """A schema's description and a valid instance: text for the copying drafters."""
        return instance_prompt(self.tok, description, instance)


def compiled(sweep: Sweep, schema: Any, **kwargs: Any) -> Any:
    """The schema's constraint, or ``None`` where the compiler refuses it (typed errors,
    which other tests check)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return compile_json_schema(schema, sweep.vocab, **kwargs)
    except StructSpecError:
        return None


def sweep_json(sweep: Sweep, args: argparse.Namespace) -> dict[str, int]:
    setups = sweep.setups(tokenizer_free=True)
    tasks = refused = 0
    for row in maskbench_rows(args.stride, args.start)[:args.limit]:
        constraint = compiled(sweep, row["schema"])
        if constraint is None:
            refused += 1
            continue
        instance = next((t["data"] for t in row.get("tests", []) if t.get("valid")), None)
        prompt = sweep.prompt(row.get("description", ""), instance)
        for sampling in (SamplingParams(), SamplingParams(temperature=1.0, seed=tasks)):
            sweep.compare(row["id"], prompt, constraint, sampling, setups)
        tasks += 1
    return {"tasks": tasks, "refused": refused}


def sweep_code(sweep: Sweep, args: argparse.Namespace) -> dict[str, int]:
    import structspec
    from structspec.grammars import grammar_path

    python = structspec.compile_grammar(grammar_path("python"), sweep.vocab)
    setups = sweep.setups()
    path = SHARED_DATA / "code" / "HumanEval-MultiLineInfilling.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()][args.start::args.stride]
    rows = rows[:args.limit] if args.limit is not None else rows
    unparsed = 0
    for n, row in enumerate(rows):
        stop = ("eof", "statement", "block")[n % 3]
        view = python.with_suffix(row["suffix"], prefix=row["prompt"], stop=stop)
        prompt = sweep.tok.encode(row["prompt"], add_special_tokens=False)
        for sampling in (SamplingParams(), SamplingParams(temperature=1.0, seed=n)):
            plain = sweep.compare(f"{row['task_id']} {stop}", prompt, view, sampling, setups,
                                  max_new=32)
            if plain[1] and stop == "eof":  # the middle fills the hole: the file parses
                try:
                    ast.parse(row["prompt"] + sweep.vocab.decode(plain[0]).decode("utf-8")
                              + row["suffix"])
                except SyntaxError:
                    unparsed += 1
                    print(f"UNPARSED {row['task_id']} ({sampling})", flush=True)
    return {"tasks": len(rows), "unparsed": unparsed}


def sweep_grammars(sweep: Sweep, args: argparse.Namespace) -> dict[str, int]:
    import structspec
    from structspec.grammars import grammar_path

    calls = [line[:400] for line in
             (SHARED_DATA / "bfcl" / "bfcl_dev.jsonl").read_text().splitlines()]
    code = [json.loads(line)["prompt"] for line in (
        SHARED_DATA / "code" / "HumanEval-SingleLineInfilling.jsonl").read_text().splitlines()]
    tasks = 0
    for seed in (0, 1):
        if seed:  # a second random target: other choices at every step
            sweep.target = sweep.packed(seed)
        setups = sweep.setups()
        for name in ("json", "javascript", "sql", "python"):
            grammar = structspec.compile_grammar(grammar_path(name), sweep.vocab)
            rng = random.Random(seed)
            for i in range(args.per):
                text = rng.choice(code if name == "python" else calls)
                prompt = sweep.tok.encode(text, add_special_tokens=False)[-150:]
                sampling = SamplingParams() if i % 2 == 0 else SamplingParams(temperature=1.0,
                                                                             seed=i)
                sweep.compare(f"{name} #{i} (model {seed})", prompt, grammar, sampling, setups,
                              max_new=48)
                tasks += 1
    return {"tasks": tasks}


def random_config(rng: random.Random, head: Any) -> dict[str, Any]:
    """Keyword arguments of a random valid ``SpecConfig``."""
    kw: dict[str, Any] = dict(
        drafters=tuple(rng.sample(OPTIONAL_DRAFTERS, rng.randint(0, len(OPTIONAL_DRAFTERS)))),
        forced=rng.random() < 0.8, nested_rounds=rng.randint(0, 3),
        adaptive=rng.random() < 0.5, cost_model=rng.random() < 0.5,
        max_nodes=rng.choice([None, 1, 2, 5, 16, 48]),
        num_speculations=rng.choice([None, 1, 3, 12]), draft_length=rng.choice([1, 2, 7, 32]),
        sparse_logits=rng.random() < 0.5, lookup_max_n=rng.choice([1, 2, 4]),
        topk=rng.choice([1, 2, 5]), alternatives_max=rng.choice([1, 4, 16]),
        values_max=rng.choice([1, 4, 12]))
    if rng.random() < 0.3:
        kw.update(draft_head=head, draft_head_min_prob=0.0,
                  draft_head_topk=rng.choice([1, 2, 4]),
                  draft_head_max_depth=rng.choice([1, 3, 8]))
    if kw["cost_model"] and rng.random() < 0.5:
        kw["cost_curve"] = FLAT
    return kw


def sweep_fuzz(sweep: Sweep, args: argparse.Namespace) -> dict[str, int]:
    rng = random.Random(args.seed)
    head = random_draft_head(sweep.target)
    tasks = refused = 0
    for row in maskbench_rows(args.stride, args.start)[:args.limit]:
        constraint = compiled(sweep, row["schema"],
                              whitespace=rng.choice(["spaced", "compact", "flexible"]))
        if constraint is None:
            refused += 1
            continue
        instance = next((t["data"] for t in row.get("tests", []) if t.get("valid")), None)
        prompt = sweep.prompt(row.get("description", ""), instance)
        for _ in range(2):
            kw = random_config(rng, head)
            sampling = rng.choice([SamplingParams(), SamplingParams(temperature=1.0, seed=tasks),
                                   SamplingParams(temperature=0.7, top_p=0.9, seed=tasks),
                                   SamplingParams(temperature=1.2, top_k=10, seed=tasks)])
            shown = {k: v for k, v in kw.items() if k not in ("draft_head", "cost_curve")}
            sweep.compare(f"{row['id']} {shown}", prompt, constraint, sampling,
                          {"random": (SpecConfig(**kw), sweep.tok)})
        tasks += 1
    return {"tasks": tasks, "refused": refused}


API_SCHEMAS: list[Any] = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                      "n": {"type": "integer", "minimum": -5, "maximum": 500}},
     "required": ["name"]},
    {"type": "array", "items": {"enum": ["a", "b", 3, None]}, "maxItems": 4},
    {"anyOf": [{"type": "boolean"}, {"type": "number", "multipleOf": 0.5}]},
    {"type": "object", "properties": {
        "d": {"type": "string", "format": "date"},
        "t": {"type": "array", "prefixItems": [{"type": "integer"},
                                               {"type": "string", "pattern": "^[a-z]{2}$"}],
              "items": False}}, "required": ["d", "t"]},
    '{"type": "string", "minLength": 2, "maxLength": 5}', True]
API_REGEXES = [r"[0-9]{3}", r"(yes|no)( maybe)?", r"[a-z]+@[a-z]+\.(com|org)",
               r"\d{4}-\d{2}-\d{2}"]


def random_request(rng: random.Random) -> dict[str, Any]:
    """Keyword arguments of a random ``Generator.run`` call."""
    kw: dict[str, Any] = dict(
        prompt=rng.choice(["Give it.", "Name: Ann, n = 42", "x" * 300, "def f(a):\n    return"]),
        max_new_tokens=rng.choice([1, 5, 24, 64]), chat=rng.choice([None, False, True]),
        system=rng.choice([None, "Be brief."]))
    kind = rng.choice(["schema", "schema", "regex", "grammar"])
    if kind == "schema":
        kw.update(schema=rng.choice(API_SCHEMAS),
                  schema_in_prompt=(rng.choice([True, False, "json"]) if kw["chat"] is not False
                                    else True),
                  whitespace=rng.choice(["spaced", "compact", "flexible"]),
                  lenient=rng.random() < 0.3, max_retries=rng.choice([0, 1, 3]))
    elif kind == "regex":
        kw["regex"] = rng.choice(API_REGEXES)
    else:
        kw.update(grammar=rng.choice(["json", "python", "sql", "javascript"]),
                  stop=rng.choice(["eof", "statement", "block"]))
        if kw["grammar"] == "python" and rng.random() < 0.5:
            kw.update(grammar_prefix="def f(a):\n    ",
                      grammar_suffix=rng.choice([None, "\n    return a\n"]),
                      tolerant=rng.random() < 0.5)
    if rng.random() < 0.4:
        kw.update(temperature=rng.choice([0.7, 1.0]), top_k=rng.choice([None, 5]),
                  top_p=rng.choice([None, 0.9]), seed=rng.randint(0, 9))
    return kw


def sweep_api(sweep: Sweep, args: argparse.Namespace) -> dict[str, int]:
    import traceback

    from structspec.api import Generator
    from structspec.models import LoadedModel

    loaded = LoadedModel(sweep.model(0), sweep.tok, f"{sweep.kind}-random",
                         frozenset({sweep.tok.eos_token_id}))
    gen = Generator(loaded)
    sweep.target = gen.loaded.model  # what the summary describes: the model the calls ran on
    rng = random.Random(args.seed)
    ends: dict[str, int] = {}
    for case in range(args.cases):
        kw = random_request(rng)
        results = []
        for speculative in (False, True, SpecConfig(max_nodes=4)):
            try:
                results.append(("ok", gen.run(speculative=speculative, **kw).token_ids))
            except GenerationError as exc:
                results.append(("budget or dead end", exc.token_ids))
            except (StructSpecError, ValueError, TypeError) as exc:
                results.append((type(exc).__name__, str(exc)))
            except Exception:  # anything untyped is a bug, whatever the arguments
                results.append(("untyped " + traceback.format_exc(limit=3), None))
            sweep.runs += 1
        ends[results[0][0]] = ends.get(results[0][0], 0) + 1
        if results[0] != results[1] or results[0] != results[2] or any(
                r[0].startswith("untyped") for r in results):
            shown = {k: (v if not isinstance(v, str) else v[:60]) for k, v in kw.items()}
            line = f"MISMATCH api #{case} {shown}: {[str(r)[:400] for r in results]}"
            sweep.mismatches.append(line)
            print(line, flush=True)
    print("how the calls ended:", dict(sorted(ends.items())), flush=True)
    return {"tasks": args.cases}


SWEEPS = {"json": (sweep_json, 10, 3), "code": (sweep_code, 25, 5),
          "grammars": (sweep_grammars, 1, 0), "fuzz": (sweep_fuzz, 7, 2),
          "api": (sweep_api, 1, 0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=sorted(SWEEPS))
    ap.add_argument("--stride", type=int, default=None, help="every stride-th task")
    ap.add_argument("--start", type=int, default=None, help="from this task")
    ap.add_argument("--limit", type=int, default=None, help="at most this many tasks")
    ap.add_argument("--per", type=int, default=25, help="grammars: prompts per grammar")
    ap.add_argument("--seed", type=int, default=11,
                    help="fuzz and api: the random configurations' and calls' seed")
    ap.add_argument("--cases", type=int, default=300, help="api: random calls")
    ap.add_argument("--target", choices=["tiny", "q4"], default="tiny",
                    help="the random target: float32 (tiny) or with the default model's "
                         "Q4_1/Q8_0 weights, on the integer kernels and prompt panels (q4)")
    ap.add_argument("--prefix", action="store_true",
                    help="also decode from a prefix cache holding two thirds of each prompt")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    fn, stride, start = SWEEPS[args.kind]
    args.stride = args.stride or stride
    args.start = start if args.start is None else args.start
    if not 0 <= args.start < args.stride:
        ap.error(f"--start must be in [0, --stride): {args.start} with stride {args.stride}")
    if not SHARED_DATA.is_dir():
        ap.error(f"external test data not found at {SHARED_DATA} (see ../shared/data/README.md)")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    sweep = Sweep(target=args.target, prefix=args.prefix)
    out = fn(sweep, args)
    from structspec.spec.prompt_rows import prompt_panel_count

    out.update(runs=sweep.runs, mismatches=len(sweep.mismatches), target=args.target,
               prompt_panels=prompt_panel_count(sweep.target), prefix_hits=sweep.prefix_hits)
    print(f"{args.kind}: " + ", ".join(f"{k} {v}" for k, v in out.items())
          + f" in {time.perf_counter() - t0:.0f} s", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({**out, "kind": args.kind,
                                                   "lines": sweep.mismatches}, indent=1))
    return 1 if sweep.mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
