"""JSON-Schema-Test-Suite per category: structspec beside llguidance (and its other peers).

For every category (one file of the suite's draft 2020-12 folder, ``optional/`` left out) and
every engine, each test group's schema is compiled once and every test instance is driven
through the engine's constraint token by token with the default model's tokenizer. The
pieces are shared, not copied:

- instances are serialised like the ratchet does (``tests/test_json_schema_suite.py``:
  compact, ``ensure_ascii=False``, object keys in the schema's ``properties`` order first),
  then tokenized with ``encode(text, add_special_tokens=False)``;
- the engines (``_engines.py``) and the driving (``maskbench.Worker`` → ``maskbench.evaluate``:
  one worker process per engine, the mask decides at every step, EOS must be allowed at the
  end; structspec's mask must agree with ``advance``) are MaskBench's, so structspec runs in
  its spec-faithful mode (``extra_properties=True, max_array_items=None``) and every engine
  with compact separators.

Each instance gets the ratchet's outcome, best to worst: ``pass`` (accepted iff valid),
``refused`` (the engine declined to compile the group's schema), ``narrowing`` (a valid
instance refused), ``crash`` (an exception, a mask that disagrees with ``advance``, or the
per-group time budget ``--timeout`` running out), ``unsound`` (an invalid instance accepted).
When a group crashes or times out after its schema compiled, its instances are rerun one by
one so that only the guilty ones count as crashes; a group whose compile crashed, or whose
worker hung and was killed, counts as a crash for all its instances.

The output is a Markdown table per category (instances, then per engine the pass rate and the
number of invalid instances accepted), a summary per engine, the categories where structspec
is below llguidance, and — as a cross-check — how structspec's outcomes differ from the
ratchet's committed baseline (byte-level vocabulary). No engine gets a registry of remote
documents here (the peers cannot take one), so structspec refuses ``refRemote``'s remote
references, which the ratchet resolves from the suite's ``remotes/`` folder: those instances
are the expected difference.

    python benchmarks/json_schema_suite.py [--suite DIR] [--categories a,b]
        [--engines structspec,llguidance,xgrammar,outlines] [--timeout S] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engines import ENGINE_NAMES, availability  # noqa: E402
from maskbench import Worker  # noqa: E402
from test_json_schema_suite import BASELINE, RANK, _keys, serialize  # noqa: E402

DEFAULT_SUITE = Path("..") / "shared" / "data" / "json-schema-test-suite" / "tests" / "draft2020-12"
OUTCOMES = tuple(RANK)  # pass, refused, narrowing, crash, unsound


# -- the suite ------------------------------------------------------------------------------------


def load_groups(suite: Path, categories: list[str] | None) -> list[dict[str, Any]]:
    """Every test group of ``suite`` (``*.json``, not ``optional/``), in file order.

    A group is ``{"category", "schema", "tests": [{"key", "valid", "data"}]}``; ``key`` is the
    ratchet's ``file::group::test`` key.
    """
    files = {p.stem: p for p in sorted(suite.glob("*.json"))}
    if categories:
        unknown = [c for c in categories if c not in files]
        if unknown:
            raise SystemExit(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {unknown}; "
                             f"available: {', '.join(files)}")
        files = {c: files[c] for c in categories}
    out = []
    for category, path in files.items():
        groups = json.loads(path.read_text(encoding="utf-8"))
        for group, keys in zip(groups, _keys(path.name, groups)):
            out.append({"category": category, "schema": group["schema"],
                        "tests": [{"key": k, "valid": bool(t["valid"]), "data": t["data"]}
                                  for t, k in zip(group["tests"], keys)]})
    return out


def make_tasks(groups: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """One MaskBench task per group: the schema and its instances as token ids."""
    tasks = []
    for i, group in enumerate(groups):
        tests = []
        for t in group["tests"]:
            text = serialize(t["data"], group["schema"]).decode("utf-8")
            tests.append({"valid": t["valid"], "description": t["key"],
                          "tokens": tokenizer.encode(text, add_special_tokens=False)})
        tasks.append({"id": f"{group['category']}#{i}", "split": group["category"],
                      "schema": group["schema"], "tests": tests})
    return tasks


# -- outcomes --------------------------------------------------------------------------------------


def _outcomes_of(rec: dict[str, Any], n: int) -> list[tuple[str, str]] | None:
    """Per-instance ``(outcome, detail)`` of a MaskBench record, or ``None`` when the record
    stopped part-way (a crash or timeout after compiling): then the instances must be rerun."""
    status, detail = rec["status"], rec.get("detail", "")
    if status == "compile_error":
        return [("refused", detail)] * n
    if status in ("crash", "timeout"):
        if rec.get("ttfm_ms") is None:  # compile crashed, or the worker hung and was killed
            return [("crash", f"{status}: {detail}")] * n
        return None
    out = [("pass", "")] * n
    for e in rec["validation_errors"]:
        out[e["test"]] = ("narrowing", f"refused {e['token']!r} after {e['prefix']!r}")
    for e in rec["invalidation_errors"]:
        out[e["test"]] = ("unsound", "invalid instance accepted")
    return out


def run_group(worker: Worker, task: dict[str, Any], budget_s: float) -> list[tuple[str, str]]:
    """The outcome of every instance of one group under ``worker``'s engine."""
    rec = worker.run(task, budget_s)
    outcomes = _outcomes_of(rec, len(task["tests"]))
    if outcomes is not None:
        return outcomes
    out = []
    for test in task["tests"]:  # find the instances that crash or hang, one at a time
        one = worker.run({**task, "tests": [test]}, budget_s)
        got = _outcomes_of(one, 1)
        out.append(got[0] if got is not None else ("crash", f"{one['status']}: {one['detail']}"))
    return out


def tally(outcomes: list[str], valid: list[bool]) -> dict[str, Any]:
    """Counts per outcome, the pass rate, and soundness (invalid instances rejected)."""
    c = Counter(outcomes)
    n = len(outcomes)
    invalid = sum(not v for v in valid)
    return {"instances": n, **{o: c.get(o, 0) for o in OUTCOMES},
            "pass_pct": 100.0 * c.get("pass", 0) / n if n else float("nan"),
            "invalid_instances": invalid, "sound": c.get("unsound", 0) == 0}


def non_passing(groups: list[dict[str, Any]],
                outcomes: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """What one engine did not pass, compactly: the refused groups (``file::group`` → the
    engine's reason; all their instances are ``refused``) and every other non-passing instance
    (ratchet key → outcome and detail)."""
    refused: dict[str, str] = {}
    instances: dict[str, dict[str, str]] = {}
    it = iter(outcomes)
    for group in groups:
        for test in group["tests"]:
            outcome, detail = next(it)
            if outcome == "refused":
                refused.setdefault(test["key"].rsplit("::", 1)[0], detail[:200])
            elif outcome != "pass":
                instances[test["key"]] = {"outcome": outcome, "detail": detail[:200]}
    return {"refused_groups": refused, "instances": instances}


# -- tables ----------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:.1f}%"


def category_table(summary: dict[str, dict[str, dict[str, Any]]], engines: list[str]) -> str:
    """Markdown: per category the instances, then per engine pass % and unsound count."""
    head = "| category | instances | " + " | ".join(f"{e} pass | {e} unsound" for e in engines)
    lines = [head + " |", "|---|---:|" + "---:|---:|" * len(engines)]
    for category, per_engine in summary.items():
        first = per_engine[engines[0]]
        cells = " | ".join(f"{_pct(per_engine[e]['pass_pct'])} | {per_engine[e]['unsound']}"
                           for e in engines)
        name = "**all**" if category == "ALL" else category
        lines.append(f"| {name} | {first['instances']} | {cells} |")
    return "\n".join(lines)


def engine_table(summary: dict[str, dict[str, dict[str, Any]]], engines: list[str],
                 versions: dict[str, str]) -> str:
    """Markdown: per engine the totals of every outcome and the sound categories."""
    cats = [c for c in summary if c != "ALL"]
    lines = ["| engine | instances | pass | refused | narrowing | crash | unsound (invalid "
             "accepted) | pass % | sound categories |", "|---|" + "---:|" * 8]
    for e in engines:
        s = summary["ALL"][e]
        sound = sum(summary[c][e]["sound"] for c in cats)
        lines.append(f"| {e} {versions[e]} | {s['instances']} | {s['pass']} | {s['refused']} "
                     f"| {s['narrowing']} | {s['crash']} | {s['unsound']} of "
                     f"{s['invalid_instances']} | {_pct(s['pass_pct'])} "
                     f"| {sound} of {len(cats)} |")
    return "\n".join(lines)


def below(summary: dict[str, dict[str, dict[str, Any]]], ours: str,
          peer: str) -> list[tuple[str, float, float]]:
    """The categories where ``ours`` passes a smaller share than ``peer``."""
    return [(c, s[ours]["pass_pct"], s[peer]["pass_pct"]) for c, s in summary.items()
            if c != "ALL" and s[ours]["pass_pct"] < s[peer]["pass_pct"]]


# -- command line ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", type=Path, default=None,
                   help=f"the suite's draft folder (default: {DEFAULT_SUITE}, from the repo root)")
    p.add_argument("--categories", default="", help="comma-separated file stems (default: all)")
    p.add_argument("--engines", default="",
                   help=f"comma-separated, of {','.join(ENGINE_NAMES)} (default: structspec "
                   "and every installed peer)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds per group and engine, compile included (default 60)")
    p.add_argument("--memory-gib", type=float, default=8.0,
                   help="address-space limit of each worker in GiB (0: none; default 8)")
    p.add_argument("--json-out", type=Path, default=None,
                   help="write every figure and every non-passing instance here")
    return p.parse_args(argv)


def _revision() -> str:
    """The structspec commit measured: short hash, ``+dirty`` when ``structspec/`` has edits."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()

    try:
        return git("rev-parse", "--short", "HEAD") + (
            "+dirty" if git("status", "--porcelain", "--", "structspec") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"


def _pick_engines(spec: str) -> tuple[list[str], dict[str, str], list[str]]:
    """The engines to run, their versions, and a note per engine skipped."""
    explicit = [e.strip() for e in spec.split(",") if e.strip()]
    engines, versions, notes = [], {}, []
    for name in explicit or list(ENGINE_NAMES):
        ok, info = availability(name)
        if ok:
            engines.append(name)
            versions[name] = info
        elif explicit or name == "structspec":
            notes.append(f"skipping {name}: {info}")
    return engines, versions, notes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    suite = args.suite if args.suite is not None else ROOT / DEFAULT_SUITE
    if not suite.is_dir():
        print(f"json_schema_suite: no JSON-Schema-Test-Suite folder at {suite.resolve()} "
              "(pass --suite DIR; see ../shared/data/README.md)", file=sys.stderr)
        return 2
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"

    engines, versions, notes = _pick_engines(args.engines)
    revision = _revision()  # before the run: the workers import structspec as it is now
    for note in notes:
        print(note, file=sys.stderr)
    if not engines:
        print("json_schema_suite: no engine to run", file=sys.stderr)
        return 2

    groups = load_groups(suite, [c for c in args.categories.split(",") if c] or None)
    from structspec.models import load_tokenizer

    tokenizer = load_tokenizer(None)
    tasks = make_tasks(groups, tokenizer)
    valid = [t["valid"] for g in groups for t in g["tests"]]
    keys = [t["key"] for g in groups for t in g["tests"]]
    category_of = [g["category"] for g in groups for _ in g["tests"]]
    print(f"{len(groups)} groups, {len(keys)} instances in "
          f"{len(dict.fromkeys(category_of))} categories from {suite}; engines: "
          + ", ".join(f"{e} {versions[e]}" for e in engines), file=sys.stderr)

    results: dict[str, list[tuple[str, str]]] = {}
    seconds: dict[str, float] = {}
    for name in engines:
        worker = Worker(name, args.memory_gib)
        started = time.perf_counter()
        got: list[tuple[str, str]] = []
        try:
            for i, task in enumerate(tasks, 1):
                got += run_group(worker, task, args.timeout)
                if i % 50 == 0 or i == len(tasks):
                    print(f"{name}: {i}/{len(tasks)} groups in "
                          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
        finally:
            worker.close()
        results[name] = got
        seconds[name] = round(time.perf_counter() - started, 1)

    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for category in [*dict.fromkeys(category_of), "ALL"]:
        idx = [i for i, c in enumerate(category_of) if category == "ALL" or c == category]
        summary[category] = {e: tally([results[e][i][0] for i in idx], [valid[i] for i in idx])
                             for e in engines}

    command = "python benchmarks/json_schema_suite.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    print(f"\n## JSON-Schema-Test-Suite ({suite.name}, {len(keys)} instances, "
          f"timeout {args.timeout:g} s per group)\n")
    print(f"`{command.strip()}`  versions: " + ", ".join(f"{e} {v}" for e, v in versions.items())
          + f"; structspec at {revision}")
    print()
    print(engine_table(summary, engines, versions))
    print()
    print(category_table(summary, engines))
    gaps: dict[str, list[tuple[str, float, float]]] = {}
    if "structspec" in engines:
        for peer in [e for e in engines if e != "structspec"]:
            gaps[peer] = below(summary, "structspec", peer)
            listed = ", ".join(f"{c} ({a:.1f}% vs {b:.1f}%)" for c, a, b in gaps[peer])
            print(f"\nstructspec below {peer} in {len(gaps[peer])} categor"
                  f"{'y' if len(gaps[peer]) == 1 else 'ies'}" + (f": {listed}" if listed else ""))
    drift: dict[str, list[str]] = {}
    if "structspec" in engines and BASELINE.is_file():
        baseline = json.loads(BASELINE.read_text(encoding="utf-8"))
        for key, (outcome, _) in zip(keys, results["structspec"]):
            if key in baseline and baseline[key] != outcome:
                drift.setdefault(f"{baseline[key]} -> {outcome}", []).append(key)
        remote = sum(k.startswith("refRemote.json::") for v in drift.values() for k in v)
        print(f"\nstructspec vs the ratchet baseline ({BASELINE.name}, byte vocabulary): "
              + (", ".join(f"{k}: {len(v)}" for k, v in drift.items()) or "identical")
              + (f" ({remote} in refRemote: the ratchet passes the suite's remotes as a "
                 "registry, this benchmark none)" if remote else ""))
    for note in notes:
        print(f"\nnote: {note}")

    if args.json_out:
        failures = {e: non_passing(groups, results[e]) for e in engines}
        payload = {"command": command.strip(), "suite": str(args.suite or DEFAULT_SUITE),
                   "timeout_s": args.timeout,
                   "versions": versions, "structspec_revision": revision, "notes": notes,
                   "seconds": seconds,
                   "outcomes": list(OUTCOMES), "summary": summary,
                   "structspec_below": {p: [c for c, _, _ in g] for p, g in gaps.items()},
                   "structspec_vs_ratchet_baseline": drift,
                   "non_passing": failures}
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n",
                                 encoding="utf-8")
        print(f"\nwrote {args.json_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
