"""Fill-in-the-middle by stopping point: how the canonical HumanEval infilling solutions fare
under each ``stop``, and what a view's masks cost.

For each task: ``python.with_suffix(suffix, prefix=prompt, stop=STOP)`` over the default
model's tokenizer; the canonical solution is walked token by token, every step timing
``allowed(state)`` and checking the solution's next token is in it; at the end
``is_accepting`` is timed too. A task counts as *accepted* when every token was allowed and
the end accepts. Each stop is run twice in one process (``cold``: the first pass, which
also fills the shared runtime memo; ``warm``: views built again over warm runtime tables —
what a server sees once it has served similar code).

    python benchmarks/fim_stops.py [--data FILE] [--limit N] [--stops eof,line,statement,block]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
DATA = SHARED / "code" / "HumanEval-SingleLineInfilling.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="a HumanEval-style .jsonl")
    ap.add_argument("--limit", type=int, default=150, help="tasks (first N)")
    ap.add_argument("--stops", default="eof,line,statement,block")
    args = ap.parse_args()

    from structspec.automata.lark_compile import compile_grammar
    from structspec.grammars import grammar_path
    from structspec.models import load_tokenizer
    from structspec.vocab import Vocabulary

    tok = load_tokenizer(None)
    vocab = Vocabulary.from_tokenizer(tok)
    python = compile_grammar(grammar_path("python"), vocab)
    with args.data.open() as f:
        rows = [json.loads(line) for line in f][:args.limit]
    solutions = [tok.encode(r["canonical_solution"], add_special_tokens=False) for r in rows]
    print(f"{args.data.name}: {len(rows)} tasks, {sum(map(len, solutions))} solution tokens")
    for run in ("cold", "warm"):
        for stop in args.stops.split(","):
            times: list[float] = []
            accepted = 0
            t0 = time.perf_counter()
            for r, ids in zip(rows, solutions, strict=True):
                view = python.with_suffix(r["suffix"], prefix=r["prompt"], stop=stop)
                s, ok = view.initial, True
                for i in ids:
                    t = time.perf_counter()
                    mask = view.allowed(s)
                    times.append(time.perf_counter() - t)
                    if i not in mask:
                        ok = False
                        break
                    s = view.advance(s, i)
                t = time.perf_counter()
                ok = ok and view.is_accepting(s)
                times.append(time.perf_counter() - t)
                accepted += ok
            wall = time.perf_counter() - t0
            us = np.asarray(times) * 1e6
            print(f"{run:4} {stop:9} accepted {accepted}/{len(rows)}  calls {us.size}  "
                  f"avg {us.mean():7.1f} us  p50 {np.median(us):6.1f} us  "
                  f"p99 {np.percentile(us, 99):8.1f} us  wall {wall:5.2f} s")


if __name__ == "__main__":
    main()
