"""A batch of requests on one process against several replicas: throughput, same outputs.

One sequence decodes one pass at a time; on a CPU a pass of a few rows leaves cores idle
that a second sequence can use. This script runs the same requests through
``Generator.run`` in this process (torch's threads: ``--threads``, default all cores) and
through :class:`structspec.replicas.Replicas` (``--replicas R`` processes of
``--replica-threads T``), speculation on and off, and reports each one's wall time for the
batch, its tokens per second and its throughput against one process, with how many outputs
were identical to the one process's (greedy: all of them should be).

Both sides are warmed first (the one process with one request, the replicas with one
request each, sent together), so model loading, the draft head's and the cost curve's
set-up are outside the times; the replicas' start-up is reported apart.

Tasks: ``json``, BFCL function calls (``../shared/data/bfcl/bfcl_dev.jsonl``: the user
message, the call's schema; ``Generator.run`` shows the schema in the system message) and
``code``, HumanEval infilling prefixes continued under the Python grammar (raw prompt), as
``benchmarks/speculative.py`` takes them.

    python benchmarks/replicas.py --task json [--data FILE] [--offset 150] [--n 20]
        [--replicas 2] [--replica-threads 1] [--threads T] [--device cpu|cuda]
        [--max-new-tokens N] [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from speculative import BFCL, CODE_DATA, _prompt_of, _read_rows, code_rows  # noqa: E402


def requests_for(task: str, offset: int, n: int, max_new_tokens: int | None,
                 data: str | None = None) -> list[dict]:
    """``Generator.run`` keyword arguments of ``n`` tasks from ``offset`` (``data``: another
    task file of the same format).

    Raises:
        SystemExit: the task data is absent (the message names the file)."""
    path = Path(data) if data else BFCL if task == "json" else CODE_DATA
    if not path.exists():
        raise SystemExit(f"{path}: absent (the shared data folder is beside the repository)")
    rows = _read_rows(path)
    if task == "json":
        return [{"prompt": _prompt_of(row, path), "schema": row["call_json_schema"],
                 "max_new_tokens": max_new_tokens or 160}
                for row in rows[offset:offset + n]]
    return [{"prompt": row["prompt"], "grammar": "python", "grammar_prefix": row["prompt"],
             "chat": False, "max_new_tokens": max_new_tokens or 64}
            for _, row in code_rows(rows, offset, n)]


def _outcome(value: Any) -> tuple:
    """What a request came to, comparable across processes."""
    if isinstance(value, BaseException):
        return type(value).__name__, getattr(value, "text", str(value))
    return "ok", tuple(value.token_ids)


def _tokens(outcomes: list[Any]) -> int:
    return sum(len(o.token_ids) if not isinstance(o, BaseException) else
               len(getattr(o, "token_ids", [])) for o in outcomes)


def in_process(gen: Any, requests: list[dict]) -> tuple[float, list[Any]]:
    """Seconds for ``requests`` one after another on ``gen``, and their outcomes (as
    ``structspec batch`` runs them in one process)."""
    from structspec.batch import run_in_process

    start = time.perf_counter()
    outcomes = list(run_in_process(gen, requests))
    return time.perf_counter() - start, outcomes


def on_replicas(pool: Any, requests: list[dict]) -> tuple[float, list[Any]]:
    """Seconds for ``requests`` shared out over ``pool``, and their outcomes in order."""
    start = time.perf_counter()
    outcomes = list(pool.map(requests, errors="return"))
    return time.perf_counter() - start, outcomes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=["json", "code"], default="json")
    ap.add_argument("--offset", type=int, default=150)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="default: 160 for json, 64 for code")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--replica-threads", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads of the one process (0: torch's default)")
    ap.add_argument("--device", default="cpu",
                    help="torch device of the one process and of every replica ('cuda': "
                         "replica i on GPU i modulo the GPUs)")
    ap.add_argument("--data", default=None, help="task file (as speculative.py --data)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    import torch

    from structspec.api import Generator
    from structspec.replicas import Replicas

    if args.threads:
        torch.set_num_threads(args.threads)
    requests = requests_for(args.task, args.offset, args.n, args.max_new_tokens, args.data)
    warm = requests_for(args.task, 0, args.replicas, args.max_new_tokens, args.data)
    plain = [{**r, "speculative": False} for r in requests]

    gen = Generator(device=args.device)
    in_process(gen, warm[:1])
    start = time.perf_counter()
    pool = Replicas(replicas=args.replicas, threads=args.replica_threads, device=args.device)
    started = time.perf_counter() - start
    rows = []
    try:
        on_replicas(pool, warm)
        for mode, batch in (("speculative", requests), ("plain", plain)):
            one_s, one = in_process(gen, batch)
            rep_s, rep = on_replicas(pool, batch)
            same = sum(_outcome(a) == _outcome(b) for a, b in zip(one, rep, strict=True))
            tokens = _tokens(one)
            rows.append({"mode": mode, "requests": len(batch), "tokens": tokens,
                         "one_process_s": round(one_s, 3), "replicas_s": round(rep_s, 3),
                         "one_process_tokens_per_s": round(tokens / one_s, 2),
                         "replicas_tokens_per_s": round(_tokens(rep) / rep_s, 2),
                         "throughput_ratio": round(one_s / rep_s, 3), "identical": same})
    finally:
        pool.close()

    print(f"{args.task}: {len(requests)} requests; one process at {torch.get_num_threads()} "
          f"thread(s) against {args.replicas} replicas of {args.replica_threads} thread(s) "
          f"(started in {started:.1f} s)")
    print(f"{'mode':<12} {'one process s':>14} {'replicas s':>11} {'tokens/s':>17} "
          f"{'throughput':>11} {'identical':>10}")
    for r in rows:
        rates = f"{r['one_process_tokens_per_s']:.1f} / {r['replicas_tokens_per_s']:.1f}"
        print(f"{r['mode']:<12} {r['one_process_s']:>14.2f} {r['replicas_s']:>11.2f} "
              f"{rates:>17} {r['throughput_ratio']:>10.2f}x "
              f"{r['identical']:>5}/{r['requests']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "task": args.task, "offset": args.offset, "n": args.n, "device": args.device,
            "threads_one_process": torch.get_num_threads(), "replicas": args.replicas,
            "replica_threads": args.replica_threads, "replicas_start_s": round(started, 2),
            "machine": platform.processor() or platform.machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
