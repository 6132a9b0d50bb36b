"""Compile time and mask time of Lark grammar constraints on real code: structspec beside
llguidance's Lark support, in one run.

Each program is tokenized with the default model's tokenizer and walked token by token:
every step times the engine's next-token mask and checks that the program's own next token
is in it; at the end the engine must accept (EOS allowed). For structspec on HumanEval a
fill-in-the-middle check follows: from ``state_after(prompt)`` with the suffix attached, the
tokenized canonical solution must be accepted and final.

    python benchmarks/grammar_masks.py [--grammar python,json,sql] [--data FILE]
        [--limit N] [--warmup N] [--engines structspec,llguidance] [--json-out FILE]

Programs per grammar: ``python``: HumanEval infilling (``prompt + canonical_solution +
suffix``, distinct programs, from ``../shared/data/code/``); ``json``: valid MaskBench
instances (``json.dumps(indent=2)``) and ``tests/data/grammars/json``; ``sql`` /
``javascript``: the files of ``tests/data/grammars/<name>``. ``--data`` replaces them (a
HumanEval-style ``.jsonl``, a directory of programs, or one file).

Mask times in the table are over the programs every engine accepted (the same tokens for
each); the JSON also has each engine's times over all it accepted (``mask_us``). They are
per mask in one process that keeps its memo tables (the first ``--warmup``
programs are walked and not counted): what a server sees after its first requests. Each
mask is timed twice: wall clock (``mask_us``, the table's first columns) and the thread's
CPU time (``mask_cpu_us``; it includes ~1 µs of the clock calls themselves): on a shared,
loaded machine the wall clock also counts the time other processes held the CPU.
The JSON records the load average at the start and the end (``load_average``): where it
exceeds the CPU count, compare the CPU columns.
Compile: structspec cold (empty disk cache, in-memory cache cleared) and from the disk cache
(a temporary directory; the user's cache is not touched); llguidance has no disk cache
(``grammar_from_lark`` + ``LLMatcher``). Both single-threaded, default tokenizer.
llguidance's Lark dialect has no templates (``_params{p}``) and no indentation postlexer,
so it cannot take python.lark or javascript.lark: those rows say why.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED = ROOT.parent / "shared" / "data"
HUMANEVAL = SHARED / "code" / "HumanEval-SingleLineInfilling.jsonl"
MASKBENCH = SHARED / "maskbench" / "maskbench_dev.jsonl.gz"
CORPUS = ROOT / "tests" / "data" / "grammars"
ENGINES = ("structspec", "llguidance")


# -- programs ---------------------------------------------------------------------------------


def _humaneval(path: Path, n: int) -> list[dict[str, Any]]:
    """Distinct HumanEval programs, each ``{"name", "text", "fim": (prefix, middle, suffix)}``."""
    seen: set[str] = set()
    out = []
    for line in path.read_text().splitlines():
        task = json.loads(line)
        text = task["prompt"] + task["canonical_solution"] + task["suffix"]
        if text in seen:
            continue
        seen.add(text)
        out.append({"name": task["task_id"], "text": text,
                    "fim": (task["prompt"], task["canonical_solution"], task["suffix"])})
        if len(out) >= n:
            break
    return out


_PROGRAM_SUFFIXES = {".py", ".json", ".sql", ".js", ".mjs"}


def _files(path: Path, n: int) -> list[dict[str, Any]]:
    """The program files of a directory (not its ``.txt`` lists of rejects and gaps)."""
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _PROGRAM_SUFFIXES) \
        if path.is_dir() else [path]
    return [{"name": p.name, "text": p.read_text(encoding="utf-8")} for p in files[:n]]


def _statements(progs: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """SQL files cut into their statements (one program each, comments kept)."""
    out = []
    for prog in progs:
        parts = re.split(r"(?<=;)[ \t]*\n", prog["text"])
        for i, part in enumerate(p for p in parts if p.strip()):
            out.append({"name": f"{prog['name']}#{i + 1}", "text": part.strip() + "\n"})
    return out[:n]


def _maskbench_json(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not MASKBENCH.is_file():
        return out
    with gzip.open(MASKBENCH, "rt") as f:
        for line in f:
            row = json.loads(line)
            for t in row.get("tests", []):
                if t.get("valid"):
                    out.append({"name": row["id"], "text": json.dumps(t["data"], indent=2)})
                    break
            if len(out) >= n:
                break
    return out


def programs(grammar: str, data: str | None, n: int) -> list[dict[str, Any]]:
    """Up to ``n`` programs for ``grammar`` (see the module doc)."""
    if data:
        path = Path(data)
        return _humaneval(path, n) if path.suffix == ".jsonl" else _files(path, n)
    if grammar == "python":
        return _humaneval(HUMANEVAL, n)
    if grammar == "json":
        return (_files(CORPUS / "json", n) + _maskbench_json(n))[:n]
    if grammar == "sql":
        return _statements(_files(CORPUS / "sql", n), n)
    return _files(CORPUS / grammar, n)


# -- engines ----------------------------------------------------------------------------------


class Structspec:
    """structspec's ``compile_grammar`` and the Constraint protocol."""

    name = "structspec"

    def __init__(self, tokenizer: Any) -> None:
        from structspec.vocab import Vocabulary

        self.vocab = Vocabulary.from_tokenizer(tokenizer)

    def compile(self, path: Path) -> tuple[Any, dict[str, float]]:
        from structspec.automata import lark_compile
        from structspec.automata.cache import configure_disk_cache

        with tempfile.TemporaryDirectory() as tmp:
            disk = configure_disk_cache(tmp)
            lark_compile._COMPILED.clear()
            t0 = time.perf_counter()
            lark_compile.compile_grammar(path, self.vocab)
            cold = time.perf_counter() - t0
            assert disk is not None
            disk.flush()
            lark_compile._COMPILED.clear()
            t0 = time.perf_counter()
            c = lark_compile.compile_grammar(path, self.vocab)
            warm = time.perf_counter() - t0
            configure_disk_cache(None)
        return c, {"cold_s": cold, "disk_cache_s": warm}

    def walk(self, c: Any, ids: list[int], times: list[float] | None,
             cpu: list[float] | None = None) -> str | None:
        s = c.initial
        for i, t in enumerate(ids):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            mask = c.allowed(s)
            t1 = time.perf_counter()
            if times is not None:
                times.append(t1 - t0)
            if cpu is not None:
                cpu.append(time.thread_time() - c0)
            if t not in mask:
                return f"token {i} {self.vocab.tokens[t]!r} rejected"
            s = c.advance(s, t)
        return None if c.is_accepting(s) else "not accepting at the end"

    def fim(self, c: Any, prefix: str, middle_ids: list[int], suffix: str) -> bool:
        view = c.with_suffix(suffix, prefix=prefix)
        s = view.initial
        for t in middle_ids:
            s = view.advance(s, t)
            if s is None:
                return False
        return view.is_accepting(s)


class LLGuidance:
    """llguidance: ``LLMatcher.grammar_from_lark`` + ``LLMatcher`` (mask, consume)."""

    name = "llguidance"

    def __init__(self, tokenizer: Any) -> None:
        import llguidance
        import llguidance.hf

        self._ll = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self._bitmask = np.zeros(((self.tokenizer.vocab_size + 31) // 32,), dtype=np.int32)

    def compile(self, path: Path) -> tuple[Any, dict[str, float]]:
        t0 = time.perf_counter()
        grammar = self._ll.LLMatcher.grammar_from_lark(path.read_text(encoding="utf-8"))
        matcher = self._ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        cold = time.perf_counter() - t0
        if matcher.is_error():
            raise ValueError(" ".join(matcher.get_error().split())[:200])
        return matcher, {"cold_s": cold}

    def walk(self, matcher: Any, ids: list[int], times: list[float] | None,
             cpu: list[float] | None = None) -> str | None:
        m = matcher.deep_copy()
        for i, t in enumerate(ids):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            m.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
            t1 = time.perf_counter()
            if times is not None:
                times.append(t1 - t0)
            if cpu is not None:
                cpu.append(time.thread_time() - c0)
            if m.is_error():
                return f"token {i}: {m.get_error()[:120]}"
            if not (int(self._bitmask[t >> 5]) >> (t & 31)) & 1:
                return f"token {i} rejected"
            if not m.consume_token(t):
                return f"token {i} not consumed: {m.get_error()[:120]}"
        return None if m.is_accepting() else "not accepting at the end"


# -- the run ----------------------------------------------------------------------------------


def _stats(times: list[float]) -> dict[str, float]:
    if not times:
        return {}
    us = np.array(times) * 1e6
    return {"avg": float(us.mean()), "p50": float(np.median(us)),
            "p90": float(np.percentile(us, 90)), "p99": float(np.percentile(us, 99)),
            "max": float(us.max())}


def run_one(engine: Any, grammar: str, progs: list[dict[str, Any]], warmup: int,
            tok: Any) -> dict[str, Any]:
    """Compile ``grammar`` with ``engine`` and walk ``progs``; the row of the table."""
    from structspec.grammars import grammar_path

    path = grammar_path(grammar) if "/" not in grammar else Path(grammar)
    row: dict[str, Any] = {"engine": engine.name, "grammar": grammar}
    try:
        compiled, compile_times = engine.compile(path)
    except Exception as exc:  # a refusal: the row says why
        row["refused"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return row
    row["compile"] = compile_times
    times: list[float] = []
    cpu: list[float] = []
    per_program: list[tuple[list[float], list[float]] | None] = []
    failures = []
    fim_failed = []
    for n, prog in enumerate(progs):
        ids = tok.encode(prog["text"], add_special_tokens=False)
        mine: list[float] = []
        mine_cpu: list[float] = []
        why = engine.walk(compiled, ids, mine, mine_cpu)
        if n >= warmup:
            times.extend(mine)
            cpu.extend(mine_cpu)
        per_program.append((mine, mine_cpu) if why is None and n >= warmup else None)
        if why is not None:
            failures.append(f"{prog['name']}: {why}")
        if "fim" in prog and hasattr(engine, "fim"):
            prefix, middle, suffix = prog["fim"]
            if not engine.fim(compiled, prefix, tok.encode(middle, add_special_tokens=False),
                              suffix):
                fim_failed.append(prog["name"])
    row.update({
        "programs": len(progs) - warmup, "warmup": warmup, "masks": len(times),
        "accepted": len(progs) - len(failures), "of": len(progs),
        "mask_us": _stats(times), "mask_cpu_us": _stats(cpu), "failures": failures[:10],
    })
    row["_per_program"] = per_program
    if any("fim" in p for p in progs) and hasattr(engine, "fim"):
        row["fim_final"] = len(progs) - len(fim_failed)
        row["fim_failed"] = fim_failed[:10]
    return row


def add_common(rows: list[dict[str, Any]]) -> None:
    """Mask statistics over the programs every engine accepted (same tokens for all):
    ``common`` in each row; drops the per-program times."""
    walked = [r for r in rows if "_per_program" in r]
    if not walked:
        return
    n = len(walked[0]["_per_program"])
    both = [i for i in range(n) if all(r["_per_program"][i] is not None for r in walked)]
    for r in walked:
        times = [t for i in both for t in r["_per_program"][i][0]]
        cpu = [t for i in both for t in r["_per_program"][i][1]]
        r["common"] = {"programs": len(both), "masks": len(times), "mask_us": _stats(times),
                       "mask_cpu_us": _stats(cpu)}
    for r in walked:
        del r["_per_program"]


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the rows (mask times over the programs all engines accepted)."""
    head = ("| grammar | engine | accepted | compile cold | from disk cache | programs (masks) "
            "timed | mask avg | p50 | p99 | CPU avg | CPU p99 |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        if "refused" in r:
            why = r["refused"][:90].replace("|", "/")
            lines.append(f"| {r['grammar']} | {r['engine']} | — | refused: {why} "
                         "| — | — | — | — | — | — | — |")
            continue
        c, common = r["compile"], r["common"]
        m, mc = common["mask_us"], common.get("mask_cpu_us", {})
        disk = f"{c['disk_cache_s']:.2f} s" if "disk_cache_s" in c else "—"
        fim = f", FIM {r['fim_final']}/{r['of']}" if "fim_final" in r else ""
        lines.append(
            f"| {r['grammar']} | {r['engine']} | {r['accepted']}/{r['of']}{fim} "
            f"| {c['cold_s']:.3f} s | {disk} | {common['programs']} ({common['masks']:,}) "
            f"| {m.get('avg', 0):,.1f} µs | {m.get('p50', 0):,.1f} µs "
            f"| {m.get('p99', 0):,.1f} µs | {mc.get('avg', 0):,.1f} µs "
            f"| {mc.get('p99', 0):,.1f} µs |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--grammar", default="python,json,sql,javascript",
                    help="comma-separated shipped grammar names (or .lark paths)")
    ap.add_argument("--data", default=None, help="programs instead of the defaults")
    ap.add_argument("--limit", type=int, default=40, help="programs counted per grammar")
    ap.add_argument("--warmup", type=int, default=5, help="programs walked first, not counted")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--json-out", default=None,
                    help="write the results here (the README's run: "
                         "benchmarks/results/grammar_masks.json)")
    args = ap.parse_args(argv)

    load_start = os.getloadavg()  # the machine's load: wall times count other processes
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from structspec.models import load_tokenizer

    tok = load_tokenizer(None)
    makers = {"structspec": Structspec, "llguidance": LLGuidance}
    engines = []
    versions = {}
    for name in args.engines.split(","):
        if name not in makers:
            ap.error(f"unknown engine {name!r} (known: {', '.join(makers)})")
        try:
            engines.append(makers[name](tok))
        except ImportError as exc:
            print(f"skipping {name}: {exc}", file=sys.stderr)
            continue
        import importlib.metadata

        versions[name] = importlib.metadata.version(name)

    rows = []
    for grammar in args.grammar.split(","):
        progs = programs(grammar, args.data, args.limit + args.warmup)
        warmup = min(args.warmup, len(progs) // 4)
        group = []
        for engine in engines:
            t0 = time.perf_counter()
            row = run_one(engine, grammar, progs, warmup, tok)
            row["seconds"] = round(time.perf_counter() - t0, 2)
            group.append(row)
        add_common(group)
        for row in group:
            print(json.dumps({k: row[k] for k in row if k not in ("failures", "fim_failed")}),
                  file=sys.stderr)
        rows.extend(group)
    print(table(rows))
    result = {"command": "python benchmarks/grammar_masks.py " + " ".join(
                  argv if argv is not None else sys.argv[1:]),
              "versions": versions, "tokenizer": "SmolLM2-135M-Instruct (49,152 tokens)",
              "load_average": {"start": [round(x, 2) for x in load_start],
                               "end": [round(x, 2) for x in os.getloadavg()],
                               "cpus": os.cpu_count()},
              "rows": rows}
    print(f"load average (1, 5, 15 min): start {result['load_average']['start']}, end "
          f"{result['load_average']['end']} on {os.cpu_count()} CPUs", file=sys.stderr)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
