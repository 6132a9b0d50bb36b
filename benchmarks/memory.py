"""What a Generator holds in memory and how long it takes to start, stage by stage.

Each variant runs in a fresh child process that imports structspec, loads the model, builds
a ``Generator`` (packing its linears), runs a few requests, and reads Linux'
``/proc/self/smaps_rollup`` after each stage:

- ``seconds``: the stage's time, in the ``now`` variant (the other runs today's code too,
  with only the two memory steps below switched off);
- ``rss``: resident set, as ``top`` shows it;
- ``anon``: anonymous memory (the process's own: packed panels, KV cache, torch's heap) —
  what each extra process or replica really costs;
- ``file``: file-backed pages (the model's weights, mapped from the cached safetensors
  file, and the shared libraries): clean, shared by every process that maps the same
  files, and reclaimable under pressure. ``pss`` splits shared pages among the processes
  that map them.

Variants, in one run: ``now`` (what a Generator does: packing's freed heap handed back,
:func:`structspec.spec.heap.trim_heap`, and the original weights let go where the panels
hold them exactly and the process owns their memory,
:func:`structspec.spec.fastlinear.release_originals`) and ``session65`` (neither).
``--anonymous-weights`` copies every weight into the process's own memory after loading,
as loading a bfloat16 checkpoint in float32 does for most models (the default model's
float32 cache is mapped from its file instead). ``--concurrent 2`` starts the children of
a variant at once, as :class:`structspec.replicas.Replicas` would, so ``pss`` shows what
the shared pages cost each of them.

    python benchmarks/memory.py [--model SPEC] [--anonymous-weights] [--concurrent N]
        [--threads 1] [--json-out F]

Linux only (it reads ``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"Rss:": "rss", "Pss:": "pss", "Pss_Anon:": "anon", "Pss_File:": "file"}
VARIANTS = ("session65", "now")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


_CLOCK = [0.0]


def rollup() -> dict[str, float]:
    """This process's memory in MB (see the module docstring), and ``seconds`` since the
    last call (the stage's time; the first call's since the clock started)."""
    import time

    now = time.perf_counter()
    out: dict[str, float] = {"seconds": round(now - _CLOCK[0], 3) if _CLOCK[0] else 0.0}
    _CLOCK[0] = now
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] in FIELDS:
                out[FIELDS[parts[0]]] = round(int(parts[1]) / 1024, 1)
    return out


def _meet(barrier: str, mark: str, deadline: float) -> None:
    """Leave ``mark`` in the folder ``barrier``, then wait (until ``deadline``) for every
    sibling's (``MEM_SIBLINGS`` of them)."""
    import time

    Path(barrier, f"{os.getpid()}.{mark}").touch()
    while len(list(Path(barrier).glob(f"*.{mark}"))) < int(os.environ["MEM_SIBLINGS"]):
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)


def child(variant: str, model: str | None, threads: int, barrier: str | None,
          anonymous: bool) -> None:
    """One variant's stages, as a JSON line on stdout."""
    import time

    _CLOCK[0] = time.perf_counter()
    stages: dict[str, dict[str, float]] = {"python": rollup()}
    import torch

    torch.set_num_threads(threads)
    import structspec
    from structspec.spec import cpu_paths, heap

    if variant == "session65":
        heap._malloc_trim = lambda: None  # type: ignore[assignment]
        cpu_paths.release_originals = lambda model: 0  # type: ignore[assignment]
    stages["imports"] = rollup()
    from structspec.models import load_model

    loaded = load_model(model)
    if anonymous:
        with torch.no_grad():
            for param in loaded.model.parameters():
                param.data = param.data.clone()
    stages["model loaded"] = rollup()
    gen = structspec.Generator(loaded)
    stages["Generator (packed)"] = rollup()
    gen.run("Describe a person as JSON.", schema=SCHEMA, max_new_tokens=40)
    stages["first request"] = rollup()
    for prompt in ("Another person, please.", "Write a haiku about rain."):
        gen.run(prompt, schema=SCHEMA if "person" in prompt else None, max_new_tokens=40)
    stages["three requests"] = rollup()
    if barrier:  # concurrent children: measure while every sibling is alive
        deadline = time.monotonic() + 300
        _meet(barrier, "ready", deadline)
        stages["all siblings up"] = rollup()
        stages["all siblings up"]["seconds"] = 0.0  # (waiting, not working)
        _meet(barrier, "done", deadline)
    print(json.dumps({"variant": variant, "stages": stages}), flush=True)


def run_variant(variant: str, model: str | None, threads: int, concurrent: int,
                anonymous: bool) -> list[dict[str, Any]]:
    """Start ``concurrent`` children of ``variant`` at once; their reports."""
    import tempfile

    with tempfile.TemporaryDirectory() as barrier:
        env = dict(os.environ, MEM_SIBLINGS=str(concurrent))
        cmd = [sys.executable, __file__, "--child", variant, "--threads", str(threads)]
        if model:
            cmd += ["--model", model]
        if anonymous:
            cmd.append("--anonymous-weights")
        if concurrent > 1:
            cmd += ["--barrier", barrier]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, env=env) for _ in range(concurrent)]
        reports = []
        for proc in procs:
            out, _ = proc.communicate(timeout=900)
            if proc.returncode:
                raise SystemExit(f"{variant}: a child failed (exit {proc.returncode})")
            reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model spec (default: the embedded one)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--anonymous-weights", action="store_true",
                        help="copy the weights into the process's own memory after loading")
    parser.add_argument("--concurrent", type=int, default=1,
                        help="children per variant started at once (as replicas)")
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not Path("/proc/self/smaps_rollup").exists():
        raise SystemExit("memory.py reads /proc/self/smaps_rollup: Linux only")
    if args.child:
        sys.path.insert(0, str(ROOT))
        child(args.child, args.model, args.threads, args.barrier, args.anonymous_weights)
        return 0
    results = {v: run_variant(v, args.model, args.threads, args.concurrent,
                              args.anonymous_weights) for v in VARIANTS}
    stages = list(results["now"][0]["stages"])
    print(f"MB per process (first child of {args.concurrent}), {platform.machine()}; "
          f"seconds: the stage's time, now")
    print(f"{'stage':<22}" + "".join(f"{v + ' ' + f:>16}" for v in VARIANTS
                                      for f in ("rss", "anon", "pss")) + f"{'seconds':>9}")
    for stage in stages:
        row = "".join(f"{results[v][0]['stages'][stage][f]:>16.0f}" for v in VARIANTS
                      for f in ("rss", "anon", "pss"))
        print(f"{stage:<22}{row}{results['now'][0]['stages'][stage]['seconds']:>9.2f}")
    last = stages[-1]
    saved = (results["session65"][0]["stages"][last]["anon"]
             - results["now"][0]["stages"][last]["anon"])
    print(f"the process's own memory at '{last}': {saved:.0f} MB less than session 65's")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"machine": platform.machine(), "python": platform.python_version(),
             "model": args.model or "default", "threads": args.threads,
             "anonymous_weights": args.anonymous_weights,
             "concurrent": args.concurrent, "results": results,
             "anon_saved_mb": round(saved, 1)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
