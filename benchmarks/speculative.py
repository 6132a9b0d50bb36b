"""Speculative vs plain decoding, same engine, same model: speed and identical outputs.

Tasks:
- ``json``: BFCL function calls (``../shared/data/bfcl/bfcl_dev.jsonl``): the schema is the
  task's ``call_json_schema`` (compiled with ``structspec.compile_json_schema``), the prompt
  is the user message, templated by ``Generator.prompt_ids`` with the schema shown;
- ``code``: HumanEval infilling (``../shared/data/code/HumanEval-SingleLineInfilling.jsonl``):
  the code above the cursor is the raw prompt, and the output is constrained by the shipped
  Python grammar from that prefix on (``state_after``): whatever the model writes must keep
  the file a valid start of a Python program (falls back to short free-text requests when
  the data is absent);
- ``prose``: short prose requests, free text (``PROSE``: the first five are the original
  ones, the next fifteen were written after the draft head's training prompts and are held
  out from them — ``--offset 5`` runs only those).

Speculation uses the learned draft head shipped for the default model
(:mod:`structspec.spec.draft_head`) unless ``--no-draft-head`` (or another head file:
``--draft-head FILE``).

Per task, greedy: ``baseline`` (speculation off: one token per pass, the same loop) and
``speculative`` (default ``SpecConfig``), after a warm-up of one whole request per mode. Each
mode keeps its own :class:`~structspec.spec.prefix.PrefixCache`, as a ``Generator`` does, so
the chat header the prompts share is prefilled once per mode (``--no-prefix-cache``: every
prompt whole). Reported: tokens/s (decode time = end-to-end time minus a separately measured
prefill of the prompt, from the stored header on), speedup of the
decode time, end-to-end speedup, mean accepted length (tokens per verification pass),
tokens per forward pass, acceptance per drafter and per depth, the scheduler's node budgets
(upper bound and what the cost plan kept), the time split, the device cost curve the plan
used (measured at the start of the run, like the baseline it is compared with;
``--cached-curve`` takes a Generator's on-disk one, which may date from other load), and
whether the outputs are identical. With ``--repeats R`` each task runs R times per mode,
the modes alternating round by round, and each mode's fastest run counts. Beside them, what
users would run instead on the same (packed) model, end to end per generated token: Hugging
Face ``generate`` unconstrained (``speedup_vs_hf``) and, for JSON, with xgrammar's logits
processor (``speedup_vs_hf_xgrammar``); ``--no-peers`` skips them.

``--temperature T`` (with ``--top-k``, ``--top-p``, ``--seed``) samples instead, in both
modes and for the peers (``do_sample``): task ``i`` seeds both modes with ``seed + i``, and
under one seed speculative sampling emits plain sampling's tokens (each position's token is
the one its seeded number picks, :class:`structspec.sampling.TokenDraws`), so the outputs
are compared as greedy ones are; the summary also says how many outputs of each mode were
complete. (Sessions before 57 sampled speculatively by multi-draft rejection sampling: the
same distribution, other samples, rates per token of each mode's own output.)

``--cost-curve RUN.json`` sizes the trees by the curve another run of this script recorded
(a GPU's, say) instead of this machine's: the tokens per pass are what that device's plan
would draft; the times stay this machine's.

    python benchmarks/speculative.py --task json [--data FILE] [--offset K] [--n 5]
        [--max-new-tokens 160] [--layout system|system-json|request]
        [--no-pack] [--no-exact-quant] [--no-avx512] [--no-amx] [--no-half-panels]
        [--no-sparse-logits]
        [--threads T]
        [--repeats R]
        [--draft-model ID] [--no-draft-head | --draft-head FILE] [--no-cost-model]
        [--cost-curve RUN.json] [--max-nodes N] [--head-topk K] [--head-min-prob P]
        [--no-prefix-cache]
        [--temperature T [--top-k K] [--top-p P] [--seed S]]
        [--json-out F]

On a CPU shared with other work, ``--threads 1`` gives stable timings: oneDNN/OpenMP with
more threads than idle cores stalls unpredictably.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from bfcl_accuracy import LAYOUTS, prompt_ids  # noqa: E402  (beside this script)

import structspec  # noqa: E402
from structspec.api import Generator  # noqa: E402
from structspec.automata.json_schema import DEFAULT_WHITESPACE  # noqa: E402
from structspec.automata.lark_compile import STOPS  # noqa: E402
from structspec.engine import free_text  # noqa: E402
from structspec.errors import GenerationError, StructSpecError  # noqa: E402
from structspec.hf_compat import cache_kwargs  # noqa: E402
from structspec.models import load_model  # noqa: E402
from structspec.sampling import SamplingParams  # noqa: E402
from structspec.spec import SpecConfig, speculative_decode  # noqa: E402
from structspec.spec.cost import (  # noqa: E402
    AcceptanceModel,
    CostCurve,
    device_cost_curve,
    measure_cost_curve,
)
from structspec.spec.cpu_paths import use_fast_cpu_paths  # noqa: E402
from structspec.spec.fastlinear import (  # noqa: E402
    avx512,
    half_panels,
    int8_amx,
    packed_kernel,
    quantized_count,
    use_amx,
    use_avx512,
    use_half_panels,
)
from structspec.spec.gated_mlp import fused_count  # noqa: E402
from structspec.spec.habits import fresh_acceptance  # noqa: E402
from structspec.spec.hugepages import huge_page_mb  # noqa: E402
from structspec.spec.kv_cache import use_roomy  # noqa: E402
from structspec.spec.prefix import PrefixCache  # noqa: E402
from structspec.spec.prompt_rows import prompt_panel_count  # noqa: E402
from structspec.spec.rope import native_rotary_active  # noqa: E402

BFCL = ROOT.parent / "shared" / "data" / "bfcl" / "bfcl_dev.jsonl"
CODE_DATA = ROOT.parent / "shared" / "data" / "code" / "HumanEval-SingleLineInfilling.jsonl"
CODE = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function is_palindrome(s) that ignores case and spaces.",
    "Write a Python class Stack with push, pop and peek methods.",
    "Write a Python function that counts the words in a text file.",
    "Write a Python function that merges two sorted lists into one sorted list.",
]
PROSE = [
    "Explain in three sentences why the sky is blue.",
    "Write a short paragraph about the history of the bicycle.",
    "Summarize the benefits of regular exercise.",
    "Describe a sunset over the sea in a few sentences.",
    "Give three tips for learning a new language.",
    # Held out from the draft head's training (scripts/train_draft_head.py checks that no
    # training prompt is one of these, and its topics avoid theirs).
    "Explain how a refrigerator keeps food cold.",
    "Write a short paragraph about the invention of the compass.",
    "Describe the life cycle of a butterfly.",
    "What makes a good teacher? Answer in a few sentences.",
    "Give three reasons why people enjoy hiking.",
    "Summarize the causes of the First World War.",
    "Describe a busy city market in the morning.",
    "Explain why leaves change colour in autumn.",
    "Write a short thank-you note to a neighbour who helped you move.",
    "What are the benefits of learning to play a musical instrument?",
    "Explain how airplanes stay in the air.",
    "Describe the sounds of a thunderstorm at night.",
    "Give advice to someone starting their first job.",
    "Write a paragraph about the importance of clean drinking water.",
    "Explain what a black hole is in simple terms.",
]


def _read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL file (gzipped where its name ends in ``.gz``, as MaskBench's), or
    (for prose) one ``{"prompt"}`` per non-empty text line."""
    rows = []
    inner = Path(path.stem) if path.suffix == ".gz" else path
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if inner.suffix in (".jsonl", ".json"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise SystemExit(f"{path}:{number}: not a JSON line: {exc}") from exc
            else:
                rows.append({"prompt": line})
    return rows


def _prompt_of(row: dict, path: Path) -> str:
    """A row's request: its ``prompt``, or the content of its last ``messages`` entry; a row
    with a schema and no request (MaskBench's) asks for an instance of the schema, by its
    top-level ``title`` or ``description`` where it has one (the schema itself is in the
    system message)."""
    if isinstance(row.get("prompt"), str):
        return row["prompt"]
    messages = row.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return str(messages[-1].get("content", ""))
    schema = row.get("schema")
    if schema is not None:
        named = [schema.get(key) for key in ("description", "title")] \
            if isinstance(schema, dict) else []
        what = next((v.strip() for v in named if isinstance(v, str) and v.strip()), "")
        return ("Write a JSON object that follows the schema"
                + (f": {what[:300]}" if what else ".") + " Fill it with realistic values.")
    raise SystemExit(f"{path}: a row has neither 'prompt' nor 'messages': {sorted(row)}")


def _shuffled(rows: list[dict], seed: int | None) -> list[dict]:
    """``rows`` in a random order drawn from ``seed`` (``None``: as they are)."""
    if seed is not None:
        rows = list(rows)
        random.Random(seed).shuffle(rows)
    return rows


def code_rows(rows: list[dict], offset: int, n: int) -> list[tuple[int, dict]]:
    """``(index, row)`` of the first infilling row of each function (``task_id`` up to its
    last ``/``), skipping the first ``offset`` functions, at most ``n``. The HumanEval
    infilling files hold several rows per function (one per line left out, same prefix up
    to that line), so an offset in rows would run the same functions again. Pure."""
    seen: set[str] = set()
    out: list[tuple[int, dict]] = []
    for index, row in enumerate(rows):
        function = str(row.get("task_id", index)).rsplit("/", 1)[0]
        if function in seen:
            continue
        seen.add(function)
        if len(seen) > offset:
            out.append((index, row))
            if len(out) >= n:
                break
    return out


def load_tasks(kind: str, n: int, gen: Generator, data: str | None = None,
               offset: int = 0, layout: str = "system", stop: str = "eof", *,
               lenient: bool = False, skipped: list[dict] | None = None,
               shuffle: int | None = None, whitespace: str = DEFAULT_WHITESPACE) -> list[dict]:
    """``[{"id", "prompt_ids", "constraint"}]`` for ``kind``.

    ``layout`` (JSON): ``"system"`` shows the schema as ``Generator.prompt_ids`` does, in the
    system message as a typed template; ``"system-json"`` there as JSON Schema;
    ``"request"`` as JSON Schema after the request (see ``benchmarks/bfcl_accuracy.py``).

    ``data`` replaces the default task file (held-out prompts and schemas): JSONL rows in the
    default file's format (``json``: ``messages`` + ``call_json_schema``; ``code``:
    ``prompt`` (+ ``task_id``); ``prose``: ``prompt`` or ``messages``) or, for prose, a text
    file with one prompt per line. ``offset`` skips that many tasks first: rows, except for
    code, whose file holds several infilling rows per function and one task is taken per
    function (``--offset 10`` then starts at the 11th function, none of the first ten's).

    ``shuffle`` (JSON and prose files): the rows in a random order drawn from that seed
    before ``offset`` and ``n`` apply — a sample of a file sorted by source, as MaskBench is.

    ``whitespace`` (JSON): the output's whitespace policy, a ``Generator``'s default unless
    said (``compile_json_schema``'s ``whitespace``).

    A JSON row whose schema the compiler refuses (a keyword it cannot enforce exactly, an
    invalid schema) is left out with its reason appended to ``skipped`` (``{"id", "error"}``;
    raised when ``skipped`` is None), so one schema of a held-out file does not stop the
    run; ``lenient`` compiles such schemas as ``Generator.run(lenient=True)`` does, under a
    superset of what they allow (both modes decode under the same constraint).
    """
    tasks = []
    if data is not None and not Path(data).is_file():
        raise SystemExit(f"--data {data}: no such file")
    if kind == "json":
        path = Path(data) if data else BFCL
        rows = _shuffled(_read_rows(path), shuffle)[offset:offset + n]
        for index, row in enumerate(rows, offset):
            schema = row.get("call_json_schema", row.get("schema"))
            if schema is None:
                raise SystemExit(f"{path}: row {index} has no 'call_json_schema' (or 'schema')")
            task_id = str(row.get("id", f"json_{index}"))
            try:
                constraint = structspec.compile_json_schema(schema, gen.vocab, lenient=lenient,
                                                            whitespace=whitespace)
            except StructSpecError as exc:
                if skipped is None:
                    raise
                skipped.append({"id": task_id, "error": f"{type(exc).__name__}: {exc}"})
                print(f"{path}: row {index} ({task_id}) left out: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
                continue
            ids = prompt_ids(gen, layout, _prompt_of(row, path), constraint.schema)
            tasks.append({"id": task_id, "constraint": constraint, "schema": schema,
                          "prompt_ids": ids})
        return tasks
    code_path = Path(data) if data and kind == "code" else CODE_DATA
    if kind == "code" and code_path.exists():
        from structspec.grammars import grammar_path

        python = structspec.compile_grammar(grammar_path("python"), gen.vocab)
        for index, row in code_rows(_read_rows(code_path), offset, n):
            prompt = _prompt_of(row, code_path)
            view = python.with_suffix(b"", prefix=prompt, stop=stop)  # constrained from here
            tasks.append({"id": str(row.get("task_id", f"code_{index}")), "constraint": view,
                          "prompt_ids": gen.prompt_ids(prompt, chat=False)})
        return tasks
    if data and kind == "prose":
        prompts = [_prompt_of(row, Path(data))
                   for row in _shuffled(_read_rows(Path(data)), shuffle)]
    else:
        prompts = CODE if kind == "code" else PROSE
    for i, prompt in enumerate(prompts[offset:offset + n], offset):
        tasks.append({"id": f"{kind}_{i}", "constraint": free_text(gen.vocab),
                      "prompt_ids": gen.prompt_ids(prompt)})
    return tasks


def stored_curve(path: Path) -> CostCurve:
    """The cost curve a ``--json-out`` file of this script recorded (its ``cost_curve``:
    milliseconds per tree size, and per cached token where measured), so that this
    machine's plan sizes trees as that run's device did.

    Raises:
        SystemExit: the file holds no such curve (the message names it)."""
    try:
        shown = json.loads(path.read_text())["cost_curve"]
        ms = {int(q): float(t) for q, t in shown["ms"].items()}
        rates = shown.get("us_per_cached_token") or {"pass": 0.0, "node": 0.0}
        return CostCurve(tuple(sorted(ms)), tuple(ms[q] / 1000 for q in sorted(ms)),
                         context=int(shown.get("context", 0)),
                         per_token=(rates["pass"] / 1e6, rates["node"] / 1e6))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SystemExit(f"--cost-curve {path}: no cost curve there ({exc!r})") from exc


def loop_pass_costs(log: list[tuple[int, int, float]], curve: CostCurve
                    ) -> dict[int, list[float]]:
    """``{tree nodes: [passes, median ms, median of time / the curve's price, that median
    relative to one node's]}`` over verification passes timed inside the decode loop
    (``SpecStats.pass_log``; plain runs give the one-node passes). The start-up curve is
    measured on back-to-back passes; in the loop, drafting and the walk run between
    passes, and large trees cost more there than the curve says (docs/performance.md,
    sessions 28-29)."""
    by: dict[int, list[tuple[float, float]]] = {}
    for nodes, context, seconds in log:
        by.setdefault(nodes, []).append((seconds, seconds / curve.at(context)(nodes)))
    one = statistics.median(r for _, r in by[1]) if 1 in by else None
    out = {}
    for q, v in sorted(by.items()):
        ratio = statistics.median(r for _, r in v)
        out[q] = [len(v), round(1000 * statistics.median(s for s, _ in v), 2), round(ratio, 3),
                  round(ratio / one, 3) if one else None]
    return out


def _run(gen: Generator, task: dict, config: SpecConfig, max_new: int,
         acceptance: AcceptanceModel | None = None, prefixes: PrefixCache | None = None,
         sampling: SamplingParams | None = None):
    """(token ids, stats, seconds, complete); a GenerationError's partial output counts
    too. ``sampling``: greedy when ``None``."""
    t0 = time.perf_counter()
    try:
        out = speculative_decode(gen.loaded.model, gen.vocab, task["prompt_ids"],
                                 task["constraint"], max_new_tokens=max_new,
                                 sampling=sampling or SamplingParams(), config=config,
                                 tokenizer=gen.loaded.tokenizer, acceptance=acceptance,
                                 prefix_cache=prefixes)
        return out.token_ids, out.stats, time.perf_counter() - t0, True
    except GenerationError as exc:  # speculative_decode attaches its stats to the error
        return exc.token_ids, getattr(exc, "stats", None), time.perf_counter() - t0, False


class _Peers:
    """What users would run instead, on the same (packed) model: Hugging Face ``generate``
    unconstrained, and with xgrammar's logits processor for the task's JSON Schema; greedy,
    or sampling as ``sampling`` says."""

    def __init__(self, gen: Generator, sampling: SamplingParams | None = None,
                 whitespace: str = DEFAULT_WHITESPACE) -> None:
        self.gen = gen
        # xgrammar writes what structspec's policy does: json.dumps' separators, spaced or not
        # (its default without indentation is spaced); "flexible" lets it choose too.
        self.xgrammar_options: dict = (
            {"any_whitespace": True} if whitespace == "flexible" else
            {"any_whitespace": False,
             "separators": (", ", ": ") if whitespace == "spaced" else (",", ":")})
        self.sampling = sampling if sampling is not None and not sampling.greedy else None
        self.compiler = None
        try:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(
                gen.loaded.tokenizer, vocab_size=gen.loaded.model.config.vocab_size)
            self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        except Exception as exc:  # optional peer
            print(f"xgrammar unavailable: {exc}")

    def _generate(self, ids: list[int], n: int, processors: list | None,
                  p: SamplingParams | None) -> tuple[int, float]:
        from transformers import LogitsProcessorList

        model = self.gen.loaded.model
        sampled: dict = {"do_sample": False}
        if p is not None:
            sampled = {"do_sample": True, "temperature": p.temperature,
                       "top_k": p.top_k or 0, "top_p": p.top_p or 1.0}
            if p.seed is not None:
                torch.manual_seed(p.seed)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids], device=model.device), max_new_tokens=n,
                                 logits_processor=LogitsProcessorList(processors or []),
                                 pad_token_id=self.gen.loaded.tokenizer.eos_token_id,
                                 **sampled)
        return out.shape[1] - len(ids), time.perf_counter() - t0

    def run(self, task: dict, n: int, seed: int | None = None) -> dict[str, float]:
        """Seconds and tokens of each peer for ``n`` new tokens at most (sampling: from
        ``seed``)."""
        p = None if self.sampling is None else replace(self.sampling, seed=seed)
        out: dict[str, float] = {}
        tok, sec = self._generate(task["prompt_ids"], n, None, p)
        out.update(hf_tokens=tok, hf_s=round(sec, 3))
        if self.compiler is not None and "schema" in task:
            import xgrammar as xgr

            try:
                compiled = self.compiler.compile_json_schema(json.dumps(task["schema"]),
                                                             **self.xgrammar_options)
                tok, sec = self._generate(task["prompt_ids"], n,
                                          [xgr.contrib.hf.LogitsProcessor(compiled)], p)
                out.update(hf_xgrammar_tokens=tok, hf_xgrammar_s=round(sec, 3))
            except Exception as exc:  # a schema xgrammar refuses
                out["hf_xgrammar_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return out


def _prefill_seconds(model, ids: list[int], repeats: int = 2,
                     prefixes: PrefixCache | None = None) -> float:
    """The prompt's prefill, from the stored header on when ``prefixes`` has one."""
    from transformers import DynamicCache

    times = []
    counted = (prefixes.hits, prefixes.reused_tokens) if prefixes is not None else None
    for _ in range(repeats):
        t0 = time.perf_counter()
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            start = prefixes.restore(ids, cache) if prefixes is not None else 0
            model(input_ids=torch.tensor([ids[start:]], device=model.device),
                  **cache_kwargs(model, cache),
                  use_cache=True, logits_to_keep=1)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if counted is not None:  # a measurement, not a request: keep the reuse counts of runs
        prefixes.hits, prefixes.reused_tokens = counted
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=["json", "code", "prose"], default="json")
    ap.add_argument("--data", default=None,
                    help="task file instead of the default (held-out tasks): JSONL in the "
                         "default file's format, or for prose one prompt per line")
    ap.add_argument("--offset", type=int, default=0, help="skip this many tasks first")
    ap.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                    help="JSON and prose files: take the rows in a random order drawn from "
                         "SEED before --offset and --n (a sample of a file sorted by source, "
                         "e.g. MaskBench's maskbench_dev.jsonl.gz)")
    ap.add_argument("--layout", choices=LAYOUTS, default="system",
                    help="JSON: the schema in the system message as a typed template (as "
                         "Generator.prompt_ids) or as JSON Schema, or after the request")
    ap.add_argument("--whitespace", choices=["spaced", "compact", "flexible"],
                    default=DEFAULT_WHITESPACE,
                    help=f"JSON: the output's whitespace policy (default: {DEFAULT_WHITESPACE}, "
                         "a Generator's)")
    ap.add_argument("--stop", choices=STOPS, default="eof",
                    help="code: where an output may end (Generator.run's stop): eof, or the "
                         "end of the line, statement or block holding the cursor")
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--no-pack", action="store_true",
                    help="keep the plain nn.Linear layers and transformers' sdpa attention")
    ap.add_argument("--no-sparse-logits", action="store_true",
                    help="compute every logit of every row, in both modes (default: only the "
                         "tokens a row's state allows where they are few; same outputs)")
    ap.add_argument("--no-exact-quant", action="store_true",
                    help="keep the packed linears off their exactly quantized panels (same "
                         "outputs; to measure what those panels change)")
    ap.add_argument("--no-int8-activations", action="store_true",
                    help="run the exactly Q4_1-quantized layers with float32 activations "
                         "(default: 8-bit, kernel panel_int8, as a Generator does; both "
                         "modes alike)")
    ap.add_argument("--no-half-panels", action="store_true",
                    help="run the 8-bit kernels' AVX2 passes as 3-row blocks throughout, "
                         "as before session 26 (same outputs; to measure what the "
                         "half-panel kernels change)")
    ap.add_argument("--no-avx512", action="store_true",
                    help="run the panel kernels' AVX2 versions where the CPU has AVX-512 (same "
                         "outputs; to measure what the AVX-512 kernels change)")
    ap.add_argument("--no-amx", action="store_true",
                    help="run the 8-bit kernels' passes of several rows on AVX512-VNNI where "
                         "the CPU has AMX tiles (same outputs; to measure what the tiles "
                         "change)")
    ap.add_argument("--no-roomy-cache", action="store_true",
                    help="append each pass's keys and values by concatenation, as before "
                         "session 45 (same outputs; to measure what the roomy cache changes)")
    ap.add_argument("--no-huge-pages", action="store_true",
                    help="leave the packed weights in ordinary pages (same outputs; for A/B "
                         "runs of the huge-page arena)")
    ap.add_argument("--no-prompt-panels", action="store_true",
                    help="prefill prompts on the shared integer kernels instead of the prompt "
                         "rows' coarser blocks (structspec.spec.prompt_rows; A/B timing)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per variant, each from the same acceptance statistics; the "
                         "fastest counts")
    ap.add_argument("--max-nodes", type=int, default=None,
                    help="speculative node bound (default: 16 structured, 8 free text; where the "
                         "cost curve carries more nodes for free, those, at most 32)")
    ap.add_argument("--drafters", default=",".join(SpecConfig.drafters))
    ap.add_argument("--draft-model", default=None,
                    help="a small model with the same tokenizer, as the draft_model drafter")
    ap.add_argument("--no-draft-head", action="store_true",
                    help="switch the learned draft head off (default: the head shipped for "
                         "the model, when one matches)")
    ap.add_argument("--draft-head", default=None, metavar="FILE",
                    help="draft with this head file (scripts/train_draft_head.py) instead of "
                         "the one shipped for the model")
    ap.add_argument("--no-cost-model", action="store_true",
                    help="keep every drafted node (no tree sizing from the cost curve)")
    ap.add_argument("--cost-curve", default=None, metavar="FILE",
                    help="size the trees by the cost curve stored in FILE (a --json-out of "
                         "this script, e.g. a GPU run's) instead of this machine's: what "
                         "another device's plan drafts, in tokens per pass (the times stay "
                         "this machine's)")
    ap.add_argument("--head-topk", type=int, default=None,
                    help="the draft head's beam width (SpecConfig.draft_head_topk)")
    ap.add_argument("--head-min-prob", type=float, default=None,
                    help="the draft head's path probability floor "
                         "(SpecConfig.draft_head_min_prob)")
    ap.add_argument("--cached-curve", action="store_true",
                    help="take the cost curve from the on-disk cache, as a Generator does "
                         "(default: measure it in this run, like the baseline it is compared "
                         "with; a curve cached under other load mis-sizes the trees)")
    ap.add_argument("--fresh-acceptance", action="store_true",
                    help="start every request from the prior (the model's packaged tokenization "
                         "habits; default: acceptance statistics carry over between requests, "
                         "as in a Generator)")
    ap.add_argument("--no-prefix-cache", action="store_true",
                    help="prefill every prompt whole (default: each mode keeps a PrefixCache, "
                         "as a Generator does, so the shared chat header is prefilled once)")
    ap.add_argument("--device", default="cpu", help="torch device")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                    default="auto", help="weights' dtype (auto: as load_model has it, float32 "
                                         "for the default model on every device)")
    ap.add_argument("--no-peers", action="store_true",
                    help="skip Hugging Face generate (plain, and with xgrammar for JSON)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature in both modes (default 0: greedy); "
                         "under one seed the outputs must be identical either way")
    ap.add_argument("--top-k", type=int, default=None, help="sampling: keep the k likeliest")
    ap.add_argument("--top-p", type=float, default=None, help="sampling: nucleus mass")
    ap.add_argument("--seed", type=int, default=0,
                    help="sampling: task i seeds both modes (and the peers) with seed + i")
    ap.add_argument("--lenient", action="store_true",
                    help="JSON: compile schemas with keywords that cannot be enforced exactly "
                         "under a superset (Generator.run(lenient=True)); default: such rows "
                         "are left out, each with its reason (the summary's 'skipped')")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    try:
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed)
    except ValueError as exc:
        ap.error(str(exc))
    if args.shuffle is not None and (args.task == "code" or (args.task == "prose"
                                                             and not args.data)):
        ap.error("--shuffle applies to JSON tasks and to prose read from --data")
    if sampling.greedy and (args.top_k is not None or args.top_p is not None):
        ap.error("--top-k and --top-p need --temperature > 0 (greedy decoding ignores them)")
    if args.threads:
        torch.set_num_threads(args.threads)

    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    gen = Generator(load_model(None, dtype=dtype, device=args.device), pack=False)
    if not args.no_pack:  # as a Generator does (no-ops off CPU)
        use_fast_cpu_paths(gen.loaded.model, quantized=not args.no_exact_quant,
                           int8_activations=not args.no_int8_activations,
                           huge_pages=not args.no_huge_pages,
                           prompt_panels=not args.no_prompt_panels)
    kernel = packed_kernel(gen.loaded.model)
    quantized = quantized_count(gen.loaded.model)
    if args.no_roomy_cache:
        use_roomy(False)
    if args.no_avx512:
        use_avx512(False)
    if args.no_amx:
        use_amx(False)
    if args.no_half_panels:
        use_half_panels(False)
    skipped: list[dict] = []
    tasks = load_tasks(args.task, args.n, gen, args.data, args.offset, args.layout,
                       args.stop, lenient=args.lenient, skipped=skipped,
                       shuffle=args.shuffle, whitespace=args.whitespace)
    if not tasks:
        raise SystemExit(f"no task to run ({len(skipped)} left out: their schemas could not "
                         "be compiled; --lenient compiles them under a superset)")
    base_cfg = SpecConfig(enabled=False, sparse_logits=not args.no_sparse_logits)
    draft = None
    if args.draft_model:
        from structspec.spec.draft_model import DraftModel

        draft = DraftModel.resolve(args.draft_model, device=args.device,
                                   pack=not args.no_pack and args.device == "cpu")
    curve = None
    if args.cost_curve and not args.no_cost_model:
        t0 = time.perf_counter()
        curve = stored_curve(Path(args.cost_curve))
        curve_s = time.perf_counter() - t0
        shown = curve.as_dict()
        print(f"cost curve (ms) {shown['ms']} from {args.cost_curve}")
    elif not args.no_cost_model:  # measured once per run (or cached per device: --cached-curve)
        t0 = time.perf_counter()
        curve = (device_cost_curve(gen.loaded.model) if args.cached_curve
                 else measure_cost_curve(gen.loaded.model, budget_seconds=3.0))
        curve_s = time.perf_counter() - t0
        shown = curve.as_dict()
        print(f"cost curve (ms) {shown['ms']} on {curve.context} cached tokens, "
              f"+us per cached token {shown.get('us_per_cached_token')} "
              f"{'cached' if args.cached_curve else 'measured'} in {curve_s:.2f} s")
    spec_cfg = SpecConfig(max_nodes=args.max_nodes,
                          drafters=tuple(d for d in args.drafters.split(",") if d),
                          draft_model=draft, cost_model=not args.no_cost_model,
                          cost_curve=curve,
                          draft_head=(False if args.no_draft_head
                                      else args.draft_head or "auto"),
                          sparse_logits=not args.no_sparse_logits,
                          **({} if args.head_topk is None
                             else {"draft_head_topk": args.head_topk}),
                          **({} if args.head_min_prob is None
                             else {"draft_head_min_prob": args.head_min_prob}))
    print(f"model={gen.loaded.name} {gen.loaded.model.dtype} on {gen.loaded.model.device} "
          f"linears={kernel} exact-quantized={quantized} "
          f"avx512={avx512()} attention={gen.loaded.model.config._attn_implementation} "
          f"threads={torch.get_num_threads()} "
          f"load={os.getloadavg()[0]:.2f} task={args.task} n={len(tasks)}")
    peers = None if args.no_peers else _Peers(gen, sampling, args.whitespace)

    def sampling_of(index: int) -> SamplingParams | None:
        """Task ``index``'s sampling (the same seed for both modes and every repeat)."""
        return None if sampling.greedy else replace(sampling, seed=args.seed + index)
    shared = None if args.fresh_acceptance else fresh_acceptance(gen.loaded.model)
    # Warm-up: per-process tables, then one whole request per mode, so that one-time work
    # (vocabulary indexes, the token trie) is not billed to the first tasks measured.
    # Each mode has its own prefix cache (they learn the header from two different prompts).
    base_pc = None if args.no_prefix_cache else PrefixCache()
    spec_pc = None if args.no_prefix_cache else PrefixCache()
    gen.vocab.ids_for(b"{")  # per-process tables a long-running Generator has built
    try:
        from structspec.automata.token_walk import token_table, token_trie

        token_table(gen.vocab)
        token_trie(gen.vocab)
    except ImportError:  # pragma: no cover - another automata layout
        pass
    _run(gen, tasks[-1], base_cfg, 8, None, base_pc, sampling_of(0))
    _run(gen, tasks[-1], spec_cfg, 8, None, spec_pc, sampling_of(0))
    _run(gen, tasks[0], base_cfg, args.max_new_tokens, None, base_pc, sampling_of(0))
    _run(gen, tasks[0], spec_cfg, args.max_new_tokens, shared, spec_pc, sampling_of(0))
    if peers is not None:
        peers.run(tasks[0], 4, args.seed)
    rows = []
    decoded: list[tuple[int, float, int, float]] = []  # (tokens, decode s) plain, speculative
    logs: list[tuple[int, int, float]] = []  # every measured run's passes in the loop
    for index, task in enumerate(tasks):
        samp = sampling_of(index)
        prefill = _prefill_seconds(gen.loaded.model, task["prompt_ids"], prefixes=base_pc)
        # Every repeat starts from the acceptance statistics as they were before the task
        # (a repeat that had learned this very output's splits would be faster than any
        # first run); the first run's statistics carry over to the next task. The modes
        # alternate, each round in the other order: this machine's speed drifts by tens
        # of percent over seconds, and three plain runs then three speculative ones put
        # the two modes' best runs in different conditions (per-task ratios of the same
        # trees moved 1.2-1.8x between runs).
        before = copy.deepcopy(shared)
        b_runs, s_runs = [], []
        for r in range(args.repeats):
            for mode in (("base", "spec") if r % 2 == 0 else ("spec", "base")):
                if mode == "base":
                    b_runs.append(_run(gen, task, base_cfg, args.max_new_tokens, None,
                                       base_pc, samp))
                else:
                    s_runs.append(_run(gen, task, spec_cfg, args.max_new_tokens,
                                       shared if r == 0 else copy.deepcopy(before), spec_pc,
                                       samp))
        logs.extend(p for run in (*b_runs, *s_runs) if run[1] is not None
                    for p in run[1].pass_log)
        b_ids, b_stats, _, b_ok = b_runs[0]
        s_ids, s_stats, _, s_ok = s_runs[0]
        # The least disturbed run per mode (shared machines), per token of its own output
        # (greedy repeats, and sampling ones from one seed, give the same tokens).
        b_sec = min(r[2] / max(1, len(r[0])) for r in b_runs) * max(1, len(b_ids))
        s_sec = min(r[2] / max(1, len(r[0])) for r in s_runs) * max(1, len(s_ids))
        n_tok, s_tok = len(b_ids), len(s_ids)
        # Decode time: end to end minus the prompt's prefill (at least one pass's worth).
        floor = prefill / max(1, len(task["prompt_ids"]))
        b_dec, s_dec = max(b_sec - prefill, floor), max(s_sec - prefill, floor)
        b_rate, s_rate = max(n_tok, 1) / b_dec, max(s_tok, 1) / s_dec  # decode tokens/s
        decoded.append((max(n_tok, 1), b_dec, max(s_tok, 1), s_dec))
        row = {
            "id": task["id"], "prompt_tokens": len(task["prompt_ids"]), "new_tokens": n_tok,
            "speculative_tokens": s_tok, "complete": b_ok, "speculative_complete": s_ok,
            # sampling under one seed: the same tokens too (TokenDraws)
            "identical": b_ids == s_ids,
            # not identical: the first token index where they part (half-precision arithmetic
            # can break a near-tie differently in a tree pass and a one-token step)
            "first_difference": (None if b_ids == s_ids else next(
                (i for i, (a, b) in enumerate(zip(b_ids, s_ids)) if a != b),
                min(len(b_ids), len(s_ids)))),
            "prefill_s": round(prefill, 3),
            "baseline_s": round(b_sec, 3), "speculative_s": round(s_sec, 3),
            "baseline_tok_s": round(b_rate, 2), "speculative_tok_s": round(s_rate, 2),
            "speedup": round(s_rate / b_rate, 3),
            "speedup_e2e": round((max(s_tok, 1) / s_sec) / (max(n_tok, 1) / b_sec), 3),
        }
        if s_stats is not None:
            row.update({
                "passes": s_stats.forward_passes,
                "baseline_passes": b_stats.forward_passes if b_stats else None,
                "mean_accepted_length": round(s_stats.mean_accepted_length, 3),
                "tokens_per_pass": round(s_stats.tokens_per_pass, 3),
                "draft_s": round(s_stats.draft_seconds, 3),
                "verify_s": round(s_stats.verify_seconds, 3),
                "mask_s": round(s_stats.mask_seconds, 3),
                "acceptance": s_stats.acceptance(),
                "per_drafter": {k: list(v) for k, v in sorted(s_stats.per_drafter.items())},
                "acceptance_per_depth": s_stats.acceptance_per_depth(),
                "acceptance_per_drafter_depth": s_stats.acceptance_per_drafter_depth(),
                "mean_budget": round(statistics.mean(s_stats.budgets), 2)
                if s_stats.budgets else 0,
                "mean_planned": round(statistics.mean(s_stats.planned), 2)
                if s_stats.planned else 0,
                "draft_model_passes": s_stats.draft_model_passes,
                "draft_head": s_stats.draft_head,
                "max_nodes": s_stats.max_nodes, "wide": s_stats.wide,
                "time_split": s_stats.time_split(),
            })
        if peers is not None:  # the same number of new tokens, end to end
            row.update(peers.run(task, max(n_tok, 1), None if samp is None else samp.seed))
            for name in ("hf", "hf_xgrammar"):
                if f"{name}_s" in row:
                    per_tok = row[f"{name}_s"] / max(row[f"{name}_tokens"], 1)
                    row[f"speedup_vs_{name}"] = round(per_tok * max(s_tok, 1) / s_sec, 3)
        rows.append(row)
        print(f"{row['id']:<28} tok={n_tok:>4} ident={row['identical']!s:<5} "
              f"base={row['baseline_tok_s']:>6.1f} tok/s spec={row['speculative_tok_s']:>6.1f} "
              f"tok/s x{row['speedup']:.2f} (e2e x{row['speedup_e2e']:.2f}) "
              f"tok/pass={row.get('tokens_per_pass', 0):.2f} acc={row.get('acceptance', {})}",
              flush=True)
    summary = {
        "task": args.task, "data": args.data, "offset": args.offset, "n": len(rows),
        "shuffle": args.shuffle, "skipped": skipped, "lenient": args.lenient,
        "layout": args.layout if args.task == "json" else None,
        "stop": args.stop if args.task == "code" else None,
        "packed": kernel is not None, "linear_kernel": kernel,
        "exact_quantized_linears": quantized,
        "avx512_kernels": avx512(),
        "int8_amx": int8_amx(),
        "roomy_cache": not args.no_roomy_cache,
        "huge_pages_mb": huge_page_mb(gen.loaded.model),
        "prompt_panels": prompt_panel_count(gen.loaded.model),
        "int8_half_panels": half_panels(),
        "fused_activations": fused_count(gen.loaded.model),
        "native_rotary": native_rotary_active(gen.loaded.model),
        "sparse_logits": not args.no_sparse_logits,
        "attention": gen.loaded.model.config._attn_implementation,
        "device": str(gen.loaded.model.device), "dtype": str(gen.loaded.model.dtype),
        "threads": torch.get_num_threads(),
        "load": round(os.getloadavg()[0], 2),
        "cost_model": spec_cfg.cost_model, "cost_curve_from": args.cost_curve,
        # the node bound as the runs resolved it (--max-nodes, or the auto one: 16 or 8,
        # wider where the cost curve carries more nodes for free)
        "max_nodes": max((r.get("max_nodes", 0) for r in rows), default=args.max_nodes),
        "wide": any(r.get("wide") for r in rows),
        "draft_head_topk": spec_cfg.draft_head_topk,
        "draft_head_min_prob": spec_cfg.draft_head_min_prob,
        "draft_model": args.draft_model,
        "draft_head": next((r.get("draft_head") for r in rows if r.get("draft_head")), None),
        "prefix_cache": not args.no_prefix_cache,
        "prefix_reused_tokens": {"baseline": base_pc.reused_tokens if base_pc else 0,
                                 "speculative": spec_pc.reused_tokens if spec_pc else 0},
        "sampling": None if sampling.greedy else {
            "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "seed": args.seed},
        "identical": sum(r["identical"] for r in rows),
        "complete": {"baseline": sum(r["complete"] for r in rows),
                     "speculative": sum(r["speculative_complete"] for r in rows)},
        "speedup_median": round(statistics.median(r["speedup"] for r in rows), 3),
        "speedup_e2e_median": round(statistics.median(r["speedup_e2e"] for r in rows), 3),
        "tokens_per_pass_mean": round(
            statistics.mean(r.get("tokens_per_pass", 1) for r in rows), 3),
        # every task's speculative tokens over its passes, pooled
        "tokens_per_pass_total": round(sum(r["speculative_tokens"] for r in rows)
                                       / max(1, sum(r.get("passes", 0) for r in rows)), 3),
        # all tasks' decode tokens per second, speculative over plain
        "speedup_total": round(sum(t[2] for t in decoded) / sum(t[3] for t in decoded)
                               / (sum(t[0] for t in decoded) / sum(t[1] for t in decoded)), 3),
    }
    for name in ("hf", "hf_xgrammar"):  # end to end, per generated token
        vals = [r[f"speedup_vs_{name}"] for r in rows if f"speedup_vs_{name}" in r]
        if vals:
            summary[f"speedup_vs_{name}_median"] = round(statistics.median(vals), 3)
    print(json.dumps(summary))
    result = {"summary": summary, "rows": rows}
    if spec_cfg.cost_model:
        result["cost_curve"] = {**curve.as_dict(), "measure_seconds": round(curve_s, 3),
                                "cached": args.cached_curve}
        result["loop_pass_costs"] = loop_pass_costs(logs, curve)
        print("passes in the decode loop (nodes: passes, median ms, median ms / the curve's "
              "price at their context, relative to one node's):",
              result["loop_pass_costs"])
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    return 0 if summary["identical"] == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
