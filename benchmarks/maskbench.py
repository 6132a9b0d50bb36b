"""MaskBench: correctness, compile time and mask time of structspec and its peers on real schemas.

The method follows guidance-ai/jsonschemabench ``maskbench`` (see
``../shared/data/maskbench/README.upstream.md``). For every schema that has test instances and
for every engine:

1. **time to first mask** (TTFM): compile the schema and compute the first mask;
2. for every test instance, serialise it compactly as MaskBench does
   (``json.dumps(data, separators=(",", ":"), ensure_ascii=False)``, keys in the order of the
   data — which is the schema's ``properties`` order for ~99% of the valid instances), tokenize
   it with the default model's tokenizer (``encode(text, add_special_tokens=False)``) and drive
   it token by token: compute the mask (timed), check the token is allowed, advance; at the end
   check that EOS is allowed. A valid instance must pass every step; an invalid one must be
   refused at some step or at EOS (a refusal caused only by the tokenization counts too).

Each schema ends in exactly one class: ``passing`` (compiled, every valid instance accepted,
every invalid one refused), ``compile_error`` (the engine declined the schema), ``validation``
(a valid instance refused), ``invalidation`` (an invalid instance accepted: a soundness bug),
``crash`` (an unexpected exception, a dead worker, or — for structspec, whose contract says
so — a mask that disagrees with ``advance``)
or ``timeout`` (``--timeout`` seconds per schema and engine, compile included).

Mask times are wall time (``perf_counter``) as MaskBench reports them; the tables add each
mask's thread CPU time (``thread_time``), which does not count waits for a core and so stays
comparable on a shared, loaded machine.

Every engine runs in its own worker process (spawned once, respawned after a kill): the
worker checks the deadline between steps, and the parent kills it when compile or a step hangs
in native code. Engines run one after the other with one thread each (``RAYON_NUM_THREADS=1``,
xgrammar ``max_threads=1``).

    python benchmarks/maskbench.py [--data FILE.jsonl.gz] [--splits a,b] [--limit N]
        [--engines structspec,llguidance,xgrammar,outlines] [--timeout S] [--json-out FILE]

``--limit N`` takes the first N schemas round-robin over the selected splits (file order), so
a small run still covers every split.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engines import ENGINE_NAMES, Refused, availability, make_engine  # noqa: E402

DEFAULT_DATA = ROOT / ".." / "shared" / "data" / "maskbench" / "maskbench_dev.jsonl.gz"
STATUSES = ("passing", "compile_error", "validation", "invalidation", "crash", "timeout")
KILL_GRACE_S = 10.0  # the worker stops itself at the deadline; the parent kills it after this
STARTUP_TIMEOUT_S = 600.0


# -- data ---------------------------------------------------------------------------------------


def load_rows(path: Path, splits: list[str] | None, limit: int | None,
              ids: set[str] | None = None) -> list[dict[str, Any]]:
    """The schemas with test instances, filtered by split and id, round-robin limited."""
    by_split: dict[str, list[dict[str, Any]]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if not row.get("tests") or (ids and row["id"] not in ids):
                continue
            by_split.setdefault(row["split"], []).append(row)
    if splits:
        unknown = [s for s in splits if s not in by_split]
        if unknown:
            raise SystemExit(f"unknown split(s) {unknown}; available: {sorted(by_split)}")
        by_split = {s: by_split[s] for s in splits}
    queues = [list(rows) for rows in by_split.values()]
    out: list[dict[str, Any]] = []
    depth = 0
    while any(depth < len(q) for q in queues) and (limit is None or len(out) < limit):
        for q in queues:
            if depth < len(q) and (limit is None or len(out) < limit):
                out.append(q[depth])
        depth += 1
    return out


def serialize(data: Any) -> str:
    """An instance as MaskBench serialises it: compact, keys in the data's order."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def make_tasks(rows: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """Tokenize every instance once; a task is what a worker needs for one schema."""
    tasks = []
    for row in rows:
        tests = [{"valid": bool(t["valid"]), "description": t.get("description", ""),
                  "tokens": tokenizer.encode(serialize(t["data"]), add_special_tokens=False)}
                 for t in row["tests"]]
        tasks.append({"id": row["id"], "split": row["split"], "schema": row["schema"],
                      "tests": tests})
    return tasks


# -- one schema, inside a worker -------------------------------------------------------------------


class _Timeout(Exception):
    pass


class _Inconsistent(Exception):
    pass


def _walk(engine: Any, compiled: Any, tokens: list[int], masks: list[float],
          deadline: float, cpu: list[float] | None = None) -> int | None:
    """Drive ``tokens`` then EOS; ``None`` if all accepted, else the refused step index
    (``len(tokens)`` when only EOS was refused). Appends each mask time (µs) to ``masks``,
    and its thread CPU time (µs) to ``cpu`` when given: on a shared machine the wall time
    also counts the waits for a core, the CPU time does not.

    The mask decides, as in decoding. For a ``strict`` engine (structspec: the Constraint
    contract says ``t in allowed(s)`` iff ``advance(s, t) is not None``, and EOS is allowed iff
    accepting) a disagreement raises :class:`_Inconsistent`; peers promise no such thing
    (llguidance's mask leaves out some non-canonical tokens that ``consume_token`` takes)."""
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    cpu = cpu if cpu is not None else []
    cursor = engine.start(compiled)
    for step, token in enumerate(tokens):
        if time.perf_counter() > deadline:
            raise _Timeout
        c0, t0 = cpu_clock(), clock()
        mask = engine.mask(cursor)
        masks.append((clock() - t0) / 1000)
        cpu.append((cpu_clock() - c0) / 1000)
        if not engine.allows(mask, token):
            if engine.strict and engine.advance(cursor, token) is not None:
                raise _Inconsistent(f"step {step}: token {token} not in the mask but advance "
                                    "accepted it")
            return step
        cursor = engine.advance(cursor, token)
        if cursor is None:
            if engine.strict:
                raise _Inconsistent(f"step {step}: token {token} in the mask but advance "
                                    "refused it")
            return step
    c0, t0 = cpu_clock(), clock()
    mask = engine.mask(cursor)
    masks.append((clock() - t0) / 1000)
    cpu.append((cpu_clock() - c0) / 1000)
    eos_ok = engine.allows(mask, engine.eos)
    if engine.strict and eos_ok != engine.accepting(cursor):
        raise _Inconsistent(f"at the end: EOS in mask={eos_ok}, accepting={not eos_ok}")
    return None if eos_ok else len(tokens)


def _refusal_kind(exc: BaseException) -> str:
    """A short label of why an engine refused: the keyword when it says, else the message."""
    cause = exc.__cause__
    keyword = getattr(cause, "keyword", None)
    if keyword:
        return f"{type(cause).__name__}:{keyword}"
    text = str(cause if cause is not None else exc).split("\n")[0]
    text = text.split(" (at schema")[0].split(" (pass lenient")[0]
    return (f"{type(cause).__name__}: " if cause is not None else "") + text[:60]


def evaluate(engine: Any, tokenizer: Any, task: dict[str, Any], budget_s: float) -> dict[str, Any]:
    """Compile one schema and drive its instances; the per-schema record (see module doc)."""
    rec: dict[str, Any] = {"id": task["id"], "split": task["split"], "engine": engine.name,
                           "status": "", "detail": "", "ttfm_ms": None, "masks": [],
                           "masks_cpu": [],
                           "validation_errors": [], "invalidation_errors": [], "tokens": 0}
    start = time.perf_counter()
    deadline = start + budget_s
    try:
        compiled = engine.compile(task["schema"])
        engine.mask(engine.start(compiled))
    except Refused as exc:
        rec.update(status="compile_error", detail=str(exc)[:300], refusal=_refusal_kind(exc),
                   compile_error_ms=(time.perf_counter() - start) * 1000)
        return rec
    except MemoryError:
        rec.update(status="crash", detail="out of memory while compiling")
        return rec
    except Exception as exc:
        rec.update(status="crash", detail=f"compile: {type(exc).__name__}: {exc}"[:300])
        return rec
    rec["ttfm_ms"] = (time.perf_counter() - start) * 1000
    masks: list[float] = rec["masks"]
    try:
        if time.perf_counter() > deadline:
            raise _Timeout
        for i, test in enumerate(task["tests"]):
            tokens = test["tokens"]
            rec["tokens"] += len(tokens)
            refused_at = _walk(engine, compiled, tokens, masks, deadline, rec["masks_cpu"])
            if test["valid"] and refused_at is not None:
                prefix = tokenizer.decode(tokens[:refused_at])[-60:]
                token = (tokenizer.decode([tokens[refused_at]]) if refused_at < len(tokens)
                         else "<EOS>")
                rec["validation_errors"].append(
                    {"test": i, "step": refused_at, "prefix": prefix, "token": token})
            elif not test["valid"] and refused_at is None:
                rec["invalidation_errors"].append({"test": i, "description": test["description"]})
    except _Timeout:
        rec.update(status="timeout", detail=f"stopped at the {budget_s:g} s budget")
    except _Inconsistent as exc:
        rec.update(status="crash", detail=f"mask and advance disagree: {exc}")
    except MemoryError:
        rec.update(status="crash", detail="out of memory while stepping")
    except Exception as exc:
        rec.update(status="crash", detail=f"step: {type(exc).__name__}: {exc}"[:300])
    if not rec["status"]:
        rec["status"] = ("invalidation" if rec["invalidation_errors"] else
                         "validation" if rec["validation_errors"] else "passing")
    return rec


def _worker_main(engine_name: str, conn: Any, memory_gib: float) -> None:
    """Worker loop: build the engine, then answer ``(task, budget)`` messages until ``None``."""
    if memory_gib > 0:
        import resource

        limit = int(memory_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        from structspec.models import load_tokenizer

        tokenizer = load_tokenizer(None)
        engine = make_engine(engine_name, tokenizer)
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", ""))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        task, budget = msg
        conn.send(evaluate(engine, tokenizer, task, budget))


class Worker:
    """One engine in a child process; :meth:`run` enforces the per-schema budget by killing it."""

    def __init__(self, engine: str, memory_gib: float) -> None:
        self.engine = engine
        self.memory_gib = memory_gib
        self.ctx = mp.get_context("spawn")
        self.proc: Any = None
        self.conn: Any = None
        self.restarts = 0

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker_main, daemon=True,
                                     args=(self.engine, child, self.memory_gib))
        self.proc.start()
        child.close()
        self.conn = parent
        if not parent.poll(STARTUP_TIMEOUT_S):
            self._kill()
            raise RuntimeError(f"{self.engine} worker did not start in {STARTUP_TIMEOUT_S:g} s")
        kind, text = parent.recv()
        if kind != "ready":
            self._kill()
            raise RuntimeError(f"{self.engine} worker failed to start: {text}")

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def run(self, task: dict[str, Any], budget_s: float) -> dict[str, Any]:
        """Evaluate ``task`` in the worker; a timeout or a dead worker becomes a record."""
        if self.proc is None:
            self._start()
        base = {"id": task["id"], "split": task["split"], "engine": self.engine,
                "ttfm_ms": None, "masks": [], "validation_errors": [],
                "invalidation_errors": [], "tokens": 0}
        self.conn.send((task, budget_s))
        if self.conn.poll(budget_s + KILL_GRACE_S):
            try:
                return self.conn.recv()
            except EOFError:
                self.proc.join()
                code = self.proc.exitcode
                self._kill()
                self.restarts += 1
                return {**base, "status": "crash", "detail": f"worker died (exit code {code})"}
        self._kill()
        self.restarts += 1
        return {**base, "status": "timeout",
                "detail": f"killed after {budget_s + KILL_GRACE_S:g} s (compile or one step hung)"}

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.conn.send(None)
                self.proc.join(5)
            except (OSError, BrokenPipeError):
                pass
            self._kill()


# -- statistics and tables ------------------------------------------------------------------------


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def summarize(records: list[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    """Counts per class, TTFM percentiles (ms) and mask-time statistics (µs) of ``records``.

    TTFM is over the schemas that compiled, plus compile timeouts counted at the timeout (as
    MaskBench does); compile errors are left out.
    """
    counts = Counter(r["status"] for r in records)
    ttfm = [r["ttfm_ms"] for r in records if r.get("ttfm_ms") is not None]
    ttfm += [timeout_s * 1000 for r in records
             if r["status"] == "timeout" and r.get("ttfm_ms") is None]
    t = np.asarray(ttfm, dtype=float)
    m = np.concatenate([np.asarray(r["masks"], dtype=float) for r in records] or [np.zeros(0)])
    c = np.concatenate([np.asarray(r.get("masks_cpu") or [], dtype=float) for r in records]
                       or [np.zeros(0)])
    n = len(records)
    return {
        "schemas": n,
        **{s: counts.get(s, 0) for s in STATUSES},
        "passing_pct": 100.0 * counts.get("passing", 0) / n if n else float("nan"),
        "tokens": int(sum(r.get("tokens", 0) for r in records)),
        "ttfm_ms": {"p50": _pct(t, 50), "p90": _pct(t, 90), "p99": _pct(t, 99)},
        "mask_us": {"count": int(m.size), "avg": float(m.mean()) if m.size else float("nan"),
                    "p50": _pct(m, 50), "p99": _pct(m, 99), "p99.9": _pct(m, 99.9)},
        "mask_cpu_us": {"count": int(c.size), "avg": float(c.mean()) if c.size else float("nan"),
                        "p50": _pct(c, 50), "p99": _pct(c, 99), "p99.9": _pct(c, 99.9)},
    }


_HEADER = ("| engine | schemas | passing | compile err | validation err | invalidation err "
           "| crash | timeout | TTFM p50 / p90 / p99 (ms) | mask avg / p50 / p99 / p99.9 (µs) "
           "| mask CPU avg / p99 (µs) |")


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:,.{digits}f}"


def format_table(title: str, summaries: dict[str, dict[str, Any]]) -> str:
    """A Markdown table: one row per engine."""
    lines = [f"### {title}", "", _HEADER, "|" + "---|" * 11]
    for engine, s in summaries.items():
        t, m = s["ttfm_ms"], s["mask_us"]
        c = s.get("mask_cpu_us") or {"avg": float("nan"), "p99": float("nan")}
        lines.append(
            f"| {engine} | {s['schemas']} | {s['passing']} ({_fmt(s['passing_pct'])}%) "
            f"| {s['compile_error']} | {s['validation']} | {s['invalidation']} | {s['crash']} "
            f"| {s['timeout']} | {_fmt(t['p50'])} / {_fmt(t['p90'])} / {_fmt(t['p99'])} "
            f"| {_fmt(m['avg'])} / {_fmt(m['p50'])} / {_fmt(m['p99'])} / {_fmt(m['p99.9'])} "
            f"| {_fmt(c['avg'])} / {_fmt(c['p99'])} |")
    return "\n".join(lines)


def _slim(rec: dict[str, Any]) -> dict[str, Any]:
    """A record for ``--json-out``: the mask times reduced to count, sum and max."""
    masks = rec.get("masks") or []
    out = {k: v for k, v in rec.items() if k not in ("masks", "masks_cpu")}
    out["mask_count"] = len(masks)
    out["mask_us_sum"] = round(float(sum(masks)), 1)
    out["mask_us_max"] = round(float(max(masks)), 1) if masks else None
    return out


# -- command line ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None,
                   help=f"MaskBench JSONL.gz (default: {DEFAULT_DATA})")
    p.add_argument("--splits", default="", help="comma-separated splits (default: all)")
    p.add_argument("--ids", default="", help="comma-separated schema ids (for debugging)")
    p.add_argument("--limit", type=int, default=None,
                   help="at most N schemas, round-robin over the splits")
    p.add_argument("--engines", default="structspec,llguidance",
                   help=f"comma-separated, of {','.join(ENGINE_NAMES)}")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds per schema and engine, compile included (default 30)")
    p.add_argument("--memory-gib", type=float, default=8.0,
                   help="address-space limit of each worker in GiB (0: none; default 8)")
    p.add_argument("--json-out", type=Path, default=None,
                   help="write per-schema records and the summary here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = args.data or DEFAULT_DATA
    if not data.is_file():
        print(f"maskbench: data not found at {data.resolve()}; skipping "
              "(see ../shared/data/README.md)", file=sys.stderr)
        return 0 if args.data is None else 2
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"

    engines, notes, versions = [], [], {}
    for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        ok, info = availability(name)
        if ok:
            engines.append(name)
            versions[name] = info
        else:
            notes.append(f"skipping {name}: {info}")
    for note in notes:
        print(note, file=sys.stderr)
    if not engines:
        print("maskbench: no engine to run", file=sys.stderr)
        return 2

    splits = [s for s in args.splits.split(",") if s] or None
    ids = {s for s in args.ids.split(",") if s} or None
    rows = load_rows(data, splits, args.limit, ids)
    from structspec.models import load_tokenizer

    tokenizer = load_tokenizer(None)
    tasks = make_tasks(rows, tokenizer)
    n_tests = sum(len(t["tests"]) for t in tasks)
    print(f"{len(tasks)} schemas, {n_tests} instances from {data.name}; engines: "
          + ", ".join(f"{e} {versions[e]}" for e in engines), file=sys.stderr)

    records: list[dict[str, Any]] = []
    for name in engines:
        worker = Worker(name, args.memory_gib)
        started = time.perf_counter()
        try:
            for i, task in enumerate(tasks, 1):
                rec = worker.run(task, args.timeout)
                records.append(rec)
                if rec["status"] in ("crash", "timeout", "invalidation"):
                    print(f"  {name} {task['id']}: {rec['status']} {rec.get('detail', '')}"
                          f"{rec['invalidation_errors'] or ''}"[:240], file=sys.stderr)
                if i % 25 == 0 or i == len(tasks):
                    print(f"{name}: {i}/{len(tasks)} in {time.perf_counter() - started:.0f} s",
                          file=sys.stderr)
        finally:
            worker.close()

    split_names = list(dict.fromkeys(t["split"] for t in tasks))
    summary: dict[str, dict[str, Any]] = {}
    for split in [*split_names, "ALL"]:
        summary[split] = {
            e: summarize([r for r in records if r["engine"] == e
                          and (split == "ALL" or r["split"] == split)], args.timeout)
            for e in engines}
    command = "python benchmarks/maskbench.py " + " ".join(argv if argv is not None
                                                          else sys.argv[1:])
    print(f"\n## MaskBench ({data.name}; {len(tasks)} schemas; timeout {args.timeout:g} s)\n")
    print(f"`{command}`  versions: " + ", ".join(f"{e} {v}" for e, v in versions.items()))
    for split in [*split_names, "ALL"]:
        print()
        print(format_table("overall" if split == "ALL" else split, summary[split]))
    for e in engines:
        mine = [r for r in records if r["engine"] == e]
        refusals = Counter(r.get("refusal", "?") for r in mine if r["status"] == "compile_error")
        if refusals:
            top = ", ".join(f"{k} {v}" for k, v in refusals.most_common(12))
            print(f"\n{e} compile errors by reason: {top}")
        unsound = [r["id"] for r in mine if r["status"] == "invalidation"]
        if unsound:
            print(f"{e} invalid instances accepted in: {', '.join(unsound)}")
    for note in notes:
        print(f"\nnote: {note}")
    if args.json_out:
        payload = {"command": command, "data": str(data), "timeout_s": args.timeout,
                   "versions": versions, "notes": notes, "summary": summary,
                   "records": [_slim(r) for r in records]}
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(payload, indent=1, ensure_ascii=False))
        print(f"\nwrote {args.json_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
