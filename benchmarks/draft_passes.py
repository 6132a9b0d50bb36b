"""Passes a drafting change saves, without the timing noise: speculation only, at fixed prices.

A sitting of ``benchmarks/speculative.py`` moves by several percent with the machine's load
and with the cost curve it measures at start-up (docs/performance.md, sessions 29, 52, 56),
more than most drafting changes move it. What a drafting change does is fewer or more passes,
and larger or smaller ones; this script measures exactly that. It runs speculative decoding
alone over a task list (the tasks of ``speculative.py``: ``load_tasks``), its trees sized by a
cost curve an earlier ``speculative.py --json-out`` run stored (``--cost-curve``), so that the
plans do not depend on this machine's speed, and the acceptance statistics shared across the
requests as a ``Generator`` keeps them (``--fresh``: each request starts from the packaged
habits, as a one-shot CLI call does). Reported: passes, output tokens, tokens per pass, the
passes' price on that curve ("modeled" seconds, at each pass's tree size and context), the
drafting time (measured, so noisy), the first passes' tree rows (paid at the prompt's
prefill rate), and per drafter the nodes the plans kept and how many were accepted. For one
engine, curve and task list the pass counts are deterministic; ``--json-out`` keeps them per
task, and ``--compare`` lists the tasks whose counts moved against an earlier run's file.

``--endings`` also sorts every pass but each request's last by how its drafts ended: where
the model's own token (the bonus) was ``built`` but dropped by the plan, ``none`` (the tree
held other tokens there) or ``ran-out`` (the tree ended before that depth, everything drafted
on the way accepted) — or ``planned``, in the tree verified, which greedy decoding never shows
(the walk would have accepted it: a check); and by the kind of place (JSON: inside a string,
a number, a value's start, a key or punctuation). Sessions 50-60 found their drafting work
this way.

    python benchmarks/draft_passes.py --task json [--data FILE] [--offset K] [--n N]
        [--max-new-tokens 160] [--cost-curve RUN.json] [--fresh] [--endings]
        [--config '{"max_nodes": 24}'] [--json-out F] [--compare EARLIER.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from speculative import _run, load_tasks, stored_curve  # noqa: E402

from structspec.api import Generator  # noqa: E402
from structspec.spec import SpecConfig  # noqa: E402
from structspec.spec import decode as decode_module  # noqa: E402
from structspec.spec.habits import fresh_acceptance  # noqa: E402
from structspec.spec.prefix import PrefixCache  # noqa: E402

#: The curve the pass counts of sessions 57-60 were priced with (one thread, Zen 4).
DEFAULT_CURVE = ROOT / "benchmarks/results/speculative_json_heldout150_zen4_session56.json"

Paths = set[tuple[tuple[int, ...], str]]


def tree_paths(tokens: list[int], parents: list[int], sources: list[str]) -> Paths:
    """``{(token path from below the root, source of its last node)}`` of a tree. Pure."""
    path: dict[int, tuple[int, ...]] = {0: ()}
    out: Paths = set()
    for i in range(1, len(tokens)):
        path[i] = (*path[parents[i]], tokens[i])
        out.add((path[i], sources[i]))
    return out


def slot_kind(before: str) -> str:
    """Where in a JSON text the output stands after ``before``: ``in-string``, ``number``,
    ``value-start``, ``key-or-punct`` or ``other``. Pure."""
    if re.search(r'":\s*"[^"]*$', before):
        return "in-string"
    if re.search(r'":\s*-?[\d.]*$', before) and before.rstrip()[-1:].isdigit():
        return "number"
    if re.search(r'":\s*$', before):
        return "value-start"
    if before.endswith(('"', ",", ", ", "{")):
        return "key-or-punct"
    return "other"


def pass_ending(output: list[int], start: int, end: int, built: Paths,
                planned: Paths) -> str:
    """How the drafts of the pass that began at output index ``start`` ended, the next pass
    beginning at ``end`` (so ``output[end - 1]`` is the model's own token there): ``planned``,
    ``built``, ``none`` or ``ran-out`` (see the module docstring). Pure."""
    accepted = tuple(output[start:end - 1])
    want = (*accepted, output[end - 1])
    if any(path == want for path, _ in planned):
        return "planned"
    if any(path == want for path, _ in built):
        return "built"
    depth = len(want)
    siblings = any(len(path) == depth and path[:-1] == accepted for path, _ in built)
    return "none" if siblings else "ran-out"


@contextmanager
def watching_trees() -> Iterator[list[tuple[int, Paths, Paths]]]:
    """``[(output index, built paths, planned paths)]`` per pass while inside: the decode
    loop's trees as drafted, read by wrapping its private ``_draft`` (a diagnostic tied to
    this engine's internals)."""
    log: list[tuple[int, Paths, Paths]] = []
    original = decode_module._draft

    def spy(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        built, planned, depth = original(ctx, *args, **kwargs)
        log.append((len(ctx.history.tokens) - ctx.prompt_len,
                    tree_paths(built.tokens, built.parents, built.sources),
                    tree_paths(planned.tokens, planned.parents, planned.sources)))
        return built, planned, depth

    decode_module._draft = spy
    try:
        yield log
    finally:
        decode_module._draft = original


def measure(gen: Generator, tasks: list[dict], config: SpecConfig, max_new: int, *,
            fresh: bool = False, endings: bool = False) -> dict[str, Any]:
    """Run the tasks; the totals, per-task passes and (``endings``) the endings' counts."""
    shared = None if fresh else fresh_acceptance(gen.loaded.model)
    prefixes = PrefixCache()
    curve = config.cost_curve
    totals: collections.Counter[str] = collections.Counter()
    drafters: dict[str, list[int]] = {}
    ends: collections.Counter[tuple[str, str]] = collections.Counter()
    per_task: dict[str, int] = {}
    modeled = drafting = 0.0
    for task in tasks:
        acceptance = fresh_acceptance(gen.loaded.model) if fresh else shared
        with watching_trees() as log:
            ids, stats, _, _ = _run(gen, task, config, max_new, acceptance, prefixes)
        if stats is None:
            continue
        per_task[str(task["id"])] = stats.forward_passes
        totals["passes"] += stats.forward_passes
        totals["tokens"] += len(ids)
        totals["first_rows"] += stats.planned[0] if stats.planned else 0
        if curve is not None:
            modeled += sum(curve.at(context)(nodes) for nodes, context, _ in stats.pass_log)
        drafting += stats.draft_seconds
        for source, (kept, hit) in stats.per_drafter.items():
            row = drafters.setdefault(source, [0, 0])
            row[0] += kept
            row[1] += hit
        if endings:
            starts = [pos for pos, _, _ in log] + [len(ids)]
            for k, (pos, built, planned) in enumerate(log):
                end = starts[k + 1]
                if end >= len(ids) or end <= pos:
                    continue  # the request's last pass: nothing after it to miss
                kind = slot_kind(gen.vocab.decode_text(ids[:end - 1])[-30:])
                how = pass_ending(ids, pos, end, built, planned)
                ends[(kind, f"{how}/{'first' if k == 0 else 'later'}")] += 1
    return {"passes": totals["passes"], "tokens": totals["tokens"],
            "tokens_per_pass": round(totals["tokens"] / max(1, totals["passes"]), 3),
            "modeled_s": round(modeled, 3), "draft_s": round(drafting, 3),
            "first_rows": totals["first_rows"],
            "per_drafter": dict(sorted(drafters.items())),
            "endings": {f"{kind} {how}": n for (kind, how), n in ends.most_common()},
            "per_task": per_task}


def compare(before: dict[str, int], after: dict[str, int]) -> list[tuple[str, int, int]]:
    """``[(task, passes before, passes after)]`` for the tasks both runs have whose counts
    differ, the largest changes first. Pure."""
    changed = [(task, before[task], after[task]) for task in after
               if task in before and before[task] != after[task]]
    return sorted(changed, key=lambda row: (-abs(row[2] - row[1]), row[0]))


def main(argv: list[str] | None = None, gen: Generator | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=["json", "code", "prose"], default="json")
    ap.add_argument("--data", default=None, help="task file (as speculative.py --data)")
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--n", type=int, default=150)
    ap.add_argument("--shuffle", type=int, default=None, metavar="SEED")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="default: 64 for code, 160 otherwise")
    ap.add_argument("--cost-curve", default=str(DEFAULT_CURVE),
                    help="a speculative.py --json-out file whose curve prices the plans")
    ap.add_argument("--fresh", action="store_true",
                    help="each request from the packaged habits (a one-shot call)")
    ap.add_argument("--endings", action="store_true", help="sort the passes by how they ended")
    ap.add_argument("--config", default="{}",
                    help="SpecConfig fields as JSON, e.g. '{\"max_nodes\": 24}'")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--compare", default=None, metavar="RUN.json",
                    help="an earlier --json-out of this script: the tasks whose passes changed")
    args = ap.parse_args(argv)
    try:
        overrides = json.loads(args.config)
        if not isinstance(overrides, dict):
            raise ValueError("not a JSON object")
        config = SpecConfig(cost_curve=stored_curve(Path(args.cost_curve)), **overrides)
    except (ValueError, TypeError) as exc:
        ap.error(f"--config: {exc}")
    before = None
    if args.compare:  # read first: a bad file should not cost a whole run
        try:
            before = json.loads(Path(args.compare).read_text())
            if not isinstance(before, dict) or not isinstance(before.get("per_task"), dict):
                raise ValueError("no per_task counts there (not a --json-out of this script)")
        except (OSError, ValueError) as exc:
            ap.error(f"--compare {args.compare}: {exc}")
    torch.set_num_threads(args.threads)
    gen = gen or Generator()
    skipped: list[dict] = []
    tasks = load_tasks(args.task, args.n, gen, args.data, args.offset, skipped=skipped,
                       shuffle=args.shuffle)
    max_new = args.max_new_tokens or (64 if args.task == "code" else 160)
    t0 = time.perf_counter()
    out = measure(gen, tasks, config, max_new, fresh=args.fresh, endings=args.endings)
    out["summary"] = {"task": args.task, "data": args.data, "offset": args.offset,
                      "n": len(tasks), "skipped": skipped, "max_new_tokens": max_new,
                      "cost_curve": args.cost_curve, "fresh": args.fresh,
                      "config": overrides, "threads": args.threads,
                      "seconds": round(time.perf_counter() - t0, 1)}
    print(f"{len(tasks)} tasks ({len(skipped)} left out), {max_new} new tokens at most, "
          f"plans priced by {Path(args.cost_curve).name}")
    print(f"passes {out['passes']}  tokens {out['tokens']}  tokens/pass "
          f"{out['tokens_per_pass']}  modeled {out['modeled_s']} s  drafting "
          f"{out['draft_s']} s  first-pass rows {out['first_rows']}")
    print(f"{'source':<18}{'kept':>8}{'accepted':>10}")
    for source, (kept, hit) in out["per_drafter"].items():
        print(f"{source:<18}{kept:>8}{hit:>10}")
    if args.endings:
        print(f"{'pass ending':<34}{'passes':>8}")
        for name, n in out["endings"].items():
            print(f"{name:<34}{n:>8}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    if before is not None:
        changed = compare(before["per_task"], out["per_task"])
        print(f"against {args.compare}: passes {before.get('passes')} -> {out['passes']}, "
              f"modeled {before.get('modeled_s')} -> {out['modeled_s']} s; "
              f"{len(changed)} tasks changed")
        for task, old_passes, new_passes in changed:
            print(f"  {task:<40}{old_passes:>5} -> {new_passes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
