"""Where a request's time goes, plain and speculative: passes by size, and inside each pass.

``benchmarks/speculative.py`` gives the ratios; this script says what bounds them. It runs
the tasks of ``speculative.py`` (``load_tasks``) in both modes, each request once to warm
its caches (masks, compiled forced text) and once measured, the modes alternating, and
reports per request, mean milliseconds:

- the **first pass** (the prompt's prefill, which both modes pay, and under speculation the
  first tree's rows on top), the **later passes**, **drafting** (speculation's own work,
  ``stats.draft_seconds``) and the **rest** (masks, the acceptance walk, sparse logits,
  bookkeeping);

and per verification pass after the first, by its number of tree nodes: the pass's time and
its parts — the **linear layers** (the decoder's projections), the **attention** (each
attention module's time outside its projections: rotary embedding, cache writes and the
attention kernel), the **output layer** and the **rest** (norms, residuals, the MLP's
activation, Python). A least-squares line per part over the passes' node counts separates a
pass's fixed cost from what each added node costs; the linears' per-node slope is also
shown as multiply-adds per second (the body's weights per row over the slope), the figure
to hold against the CPU's arithmetic bound.

Why the split matters: a cost every pass pays whatever its size (the "fixed" column) is paid
per token by plain decoding and per pass by speculation, so cutting it speeds both and lowers
the ratio; a cost per added node is speculation's alone. Timers wrap the linear and
attention classes' ``forward`` and the verification pass (restored after the run); they add
a little to every pass, which the script measures on one-node passes without and with them
and prints (``instrumentation``). CPU only: on a GPU the host would time kernel launches,
not kernels (``benchmarks/tree_pass_profile.py`` profiles a GPU).

    python benchmarks/pass_anatomy.py --task json [--offset 150] [--n 30] [--threads 1]
        [--max-new-tokens N] [--json-out F]
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import statistics
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
from speculative import _run, load_tasks  # noqa: E402

from structspec.api import Generator  # noqa: E402
from structspec.spec import SpecConfig  # noqa: E402
from structspec.spec import decode as decode_module  # noqa: E402
from structspec.spec.habits import fresh_acceptance  # noqa: E402
from structspec.spec.prefix import PrefixCache  # noqa: E402

PARTS = ("linears", "attention", "output layer")
MODES = ("plain", "speculative")
#: The first task of each kind the README's speculative table reads (held out from tuning).
HELD_OUT = {"json": 150, "code": 10, "prose": 0}


def fit_line(points: list[tuple[float, float, int]]) -> tuple[float, float]:
    """``(a, b)`` of the least-squares line ``y = a + b * x`` over ``(x, y, weight)`` points
    (``(mean y, 0)`` where every ``x`` is the same). Pure."""
    total = sum(w for _, _, w in points)
    if total <= 0:
        return 0.0, 0.0
    mx = sum(x * w for x, _, w in points) / total
    my = sum(y * w for _, y, w in points) / total
    sxx = sum(w * (x - mx) ** 2 for x, _, w in points)
    if sxx <= 0:
        return my, 0.0
    b = sum(w * (x - mx) * (y - my) for x, y, w in points) / sxx
    return my - b * mx, b


class PassTimer:
    """Exclusive time per part inside verification passes: a module's time minus that of the
    timed modules it calls (an attention module's projections count as linears, not
    attention). The timed classes' ``forward`` is wrapped for the timer's life (a forward
    hook per module cost ~1 ms a pass of the default model's 240 modules; a wrapper per
    class a tenth of that)."""

    def __init__(self, model: Any) -> None:
        self.parts: collections.Counter[str] = collections.Counter()
        self._stack: list[float] = []  # per open call: the time of its timed children
        self._patched: list[tuple[type, Any]] = []
        out = model.get_output_embeddings()
        classes: set[type] = set()
        for module in model.modules():
            name = type(module).__name__
            if name in ("Linear", "PackedLinear") or name.endswith("Attention"):
                classes.add(type(module))
        for cls in classes:
            part = "attention" if cls.__name__.endswith("Attention") else "linears"
            self._patched.append((cls, cls.__dict__.get("forward")))
            cls.forward = self._timed(cls.forward, part, out)

    def _timed(self, forward: Any, part: str, out: Any) -> Any:
        parts, stack = self.parts, self._stack

        def timed(module: Any, *args: Any, **kwargs: Any) -> Any:
            stack.append(0.0)
            start = time.perf_counter()
            try:
                return forward(module, *args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                children = stack.pop()
                parts["output layer" if module is out else part] += spent - children
                if stack:
                    stack[-1] += spent
        return timed

    def remove(self) -> None:
        for cls, forward in self._patched:
            if forward is None:
                del cls.forward
            else:
                cls.forward = forward
        self._patched.clear()


@contextmanager
def instrumented(model: Any) -> Iterator[list[dict]]:
    """Within the block, every verification pass of ``model`` appends ``{"nodes",
    "prompt_rows", "seconds", <part>: seconds}`` to the yielded list."""
    timer = PassTimer(model)
    log: list[dict] = []
    original = decode_module.verify_tree

    def verify_tree(model: Any, cache: Any, tree: Any, past_len: int, prefix: Any = (),
                    rows: Any = None) -> torch.Tensor:
        timer.parts.clear()
        t0 = time.perf_counter()
        logits = original(model, cache, tree, past_len, prefix, rows=rows)
        entry = {"nodes": len(tree), "prompt_rows": len(prefix),
                 "seconds": time.perf_counter() - t0}
        entry.update({part: timer.parts[part] for part in PARTS})
        log.append(entry)
        return logits

    decode_module.verify_tree = verify_tree
    try:
        yield log
    finally:
        decode_module.verify_tree = original
        timer.remove()


def timer_overhead(gen: Generator, task: dict, repeats: int = 9) -> float:
    """Seconds the timers add to a one-node pass: plain decoding of a few tokens of ``task``
    without and with them, per pass, medians of alternating rounds."""
    config = SpecConfig(enabled=False)
    prefixes = PrefixCache()
    _run(gen, task, config, 4, None, prefixes)

    def per_pass() -> float:
        _, stats, _, _ = _run(gen, task, config, 8, None, prefixes)
        log = stats.pass_log if stats is not None else []
        return sum(s for _, _, s in log) / max(1, len(log))

    bare, timed = [], []
    for _ in range(repeats):
        bare.append(per_pass())
        with instrumented(gen.loaded.model):
            timed.append(per_pass())
    return statistics.median(timed) - statistics.median(bare)


def body_macs_per_row(model: Any) -> int:
    """Multiply-adds of the decoder's linear layers for one row (the output layer apart; a
    packed layer's unpacked original, which it keeps as a child, not counted twice)."""
    out = model.get_output_embeddings()
    layers = [m for m in model.modules() if type(m).__name__ in ("Linear", "PackedLinear")]
    originals = {id(getattr(m, "original", None)) for m in layers}
    return sum(m.in_features * m.out_features for m in layers
               if m is not out and id(m) not in originals)


def measure(gen: Generator, tasks: list[dict], max_new: int) -> dict[str, Any]:
    """Both modes over ``tasks``: per-request means and every measured pass."""
    configs = {"plain": SpecConfig(enabled=False), "speculative": SpecConfig()}
    prefixes = {mode: PrefixCache() for mode in MODES}
    shared = fresh_acceptance(gen.loaded.model)
    requests: dict[str, list[dict]] = {mode: [] for mode in MODES}
    passes: dict[str, list[dict]] = {mode: [] for mode in MODES}
    identical = 0
    for index, task in enumerate(tasks):
        outputs = {}
        order = MODES if index % 2 == 0 else MODES[::-1]
        for mode in order:
            acceptance = shared if mode == "speculative" else None
            warm = copy.deepcopy(acceptance)  # the measured run starts where the warm one did
            _run(gen, task, configs[mode], max_new, warm, prefixes[mode])
            with instrumented(gen.loaded.model) as log:
                ids, stats, seconds, _ = _run(gen, task, configs[mode], max_new, acceptance,
                                              prefixes[mode])
            outputs[mode] = ids
            if not log:
                continue
            first, later = log[0], log[1:]
            requests[mode].append({
                "id": task["id"], "tokens": len(ids), "seconds": seconds,
                "first_pass": first["seconds"], "first_nodes": first["nodes"],
                "prompt_rows": first["prompt_rows"],
                "later_passes": sum(p["seconds"] for p in later), "passes": len(log),
                "drafting": stats.draft_seconds if stats is not None else 0.0})
            passes[mode].extend(later)
        identical += outputs.get("plain") == outputs.get("speculative")
    return {"requests": requests, "passes": passes, "identical": identical}


def request_table(requests: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Per mode, mean milliseconds per request of each stage, and the passes' counts."""
    out = {}
    for mode, rows in requests.items():
        n = max(1, len(rows))

        def mean(key: str, rows: list[dict] = rows, n: int = n) -> float:
            return round(1e3 * sum(r[key] for r in rows) / n, 2)

        total = mean("seconds")
        stages = {"first pass": mean("first_pass"), "later passes": mean("later_passes"),
                  "drafting": mean("drafting")}
        stages["rest"] = round(total - sum(stages.values()), 2)
        stages["total"] = total
        stages["passes"] = round(sum(r["passes"] for r in rows) / n, 2)
        stages["tokens"] = round(sum(r["tokens"] for r in rows) / n, 2)
        stages["first pass nodes"] = round(sum(r["first_nodes"] for r in rows) / n, 2)
        stages["prompt rows"] = round(sum(r["prompt_rows"] for r in rows) / n, 2)
        out[mode] = stages
    return out


def pass_table(passes: list[dict]) -> dict[int, dict[str, float]]:
    """``{nodes: {"passes", "ms", <part> ms, "rest"}}`` means over the passes of each size."""
    groups: dict[int, list[dict]] = collections.defaultdict(list)
    for p in passes:
        groups[p["nodes"]].append(p)
    table = {}
    for nodes in sorted(groups):
        rows = groups[nodes]
        ms = {key: 1e3 * statistics.fmean(r[key] for r in rows) for key in ("seconds", *PARTS)}
        table[nodes] = {"passes": len(rows), "ms": round(ms["seconds"], 2),
                        **{part: round(ms[part], 2) for part in PARTS},
                        "rest": round(ms["seconds"] - sum(ms[p] for p in PARTS), 2)}
    return table


def fits(table: dict[int, dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Per part (and the whole pass), ``(ms fixed, ms per added node)`` over the table."""
    out = {}
    for key in ("ms", *PARTS, "rest"):
        a, b = fit_line([(nodes, row[key], int(row["passes"])) for nodes, row in table.items()])
        out[key] = (round(a, 3), round(b, 3))
    return out


def main(argv: list[str] | None = None, gen: Generator | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=["json", "code", "prose"], default="json")
    ap.add_argument("--data", default=None, help="task file (as speculative.py --data)")
    ap.add_argument("--offset", type=int, default=None,
                    help="tasks to skip first (default: the README's held-out rows: JSON "
                         "150, code 10, prose 0)")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                    help="a seeded sample of a file sorted by source (as speculative.py)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="default: 64 for code, 160 otherwise")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    if args.offset is None:
        args.offset = HELD_OUT[args.task]
    torch.set_num_threads(args.threads)
    gen = gen or Generator()
    if gen.loaded.model.device.type != "cpu":
        ap.error("CPU only: on a GPU the host times launches (benchmarks/tree_pass_profile.py "
                 "profiles a GPU's passes)")
    skipped: list[dict] = []
    tasks = load_tasks(args.task, args.n, gen, args.data, args.offset, skipped=skipped,
                       shuffle=args.shuffle)
    if not tasks:
        raise SystemExit("no task to run")
    max_new = args.max_new_tokens or (64 if args.task == "code" else 160)
    t0 = time.perf_counter()
    overhead = timer_overhead(gen, tasks[0])
    run = measure(gen, tasks, max_new)
    requests = request_table(run["requests"])
    tables = {mode: pass_table(run["passes"][mode]) for mode in MODES}
    spec_fit = fits(tables["speculative"]) if tables["speculative"] else {}
    macs = body_macs_per_row(gen.loaded.model)
    slope = spec_fit.get("linears", (0.0, 0.0))[1]
    out = {
        "summary": {"task": args.task, "data": args.data, "offset": args.offset,
                    "shuffle": args.shuffle,
                    "n": len(tasks), "skipped": skipped, "max_new_tokens": max_new,
                    "threads": args.threads, "identical": run["identical"],
                    "instrumentation_ms_per_pass": round(1e3 * overhead, 3),
                    "body_macs_per_row": macs,
                    "linears_gmacs_per_added_node": round(macs / slope / 1e6, 1) if slope > 0
                    else None,
                    "seconds": round(time.perf_counter() - t0, 1)},
        "per_request_ms": requests,
        "passes_by_nodes": {mode: {str(k): v for k, v in t.items()} for mode, t in tables.items()},
        "speculative_fit_ms": {k: {"fixed": a, "per_node": b} for k, (a, b) in spec_fit.items()},
    }
    s = out["summary"]
    print(f"{len(tasks)} {args.task} tasks from row {args.offset} ({len(skipped)} left out), "
          f"{max_new} new tokens at most, {args.threads} thread(s); outputs identical "
          f"{run['identical']}/{len(tasks)}; instrumentation +{s['instrumentation_ms_per_pass']}"
          f" ms a one-node pass")
    print(f"\nper request, mean ms{'':<10}{'plain':>12}{'speculative':>14}")
    for key in requests["plain"]:
        print(f"{key:<29}{requests['plain'][key]:>12}{requests['speculative'][key]:>14}")
    if requests["speculative"]["total"]:
        print(f"{'end-to-end ratio (means)':<29}"
              f"{requests['plain']['total'] / requests['speculative']['total']:>26.2f}")
    for mode in MODES:
        print(f"\n{mode} passes after the first, mean ms by tree nodes")
        print(f"{'nodes':>5}{'passes':>8}{'pass':>8}{'linears':>9}{'attention':>11}"
              f"{'output':>8}{'rest':>8}")
        for nodes, row in tables[mode].items():
            print(f"{nodes:>5}{row['passes']:>8}{row['ms']:>8}{row['linears']:>9}"
                  f"{row['attention']:>11}{row['output layer']:>8}{row['rest']:>8}")
    if spec_fit:
        print("\nspeculative passes, least squares: ms = fixed + per node x nodes")
        for key, (a, b) in spec_fit.items():
            print(f"  {key:<13} {a:>7.2f} + {b:.3f} x nodes")
        if s["linears_gmacs_per_added_node"]:
            print(f"  the linears' added node: {macs / 1e6:.0f} M multiply-adds in {slope:.3f} ms"
                  f" = {s['linears_gmacs_per_added_node']} G/s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
