"""A/B of two builds of the panel kernel: the working tree's source against a git revision's.

Changes to ``structspec/_native/smallgemm.c`` move a pass by a few percent, and this shared
machine moves by more than that from minute to minute: a fastest-of comparison of two
separate runs says little. This script loads both builds into one process, packs the
default model's 210 body linears (and, unless ``--no-head``, its 49152×576 output layer)
with random float32 weights (cost does not depend on the values), and alternates the two
builds sweep by sweep, per pass size, for ``--rounds`` rounds (the order flips every round).
It reports, per size, the fastest sweep of each, the median of the rounds' new/old ratios,
the middle half of those ratios, and in how many rounds the new build was faster — the
paired figures are the ones to read. It also checks that both builds give bitwise the same
outputs (a kernel change must not move them).

``--quantized`` quantizes the random weights as the default model's are (GGUF Q4_1,
dequantized to float32) and runs every pass on the exactly quantized panels (checking them
bit for bit against the float32 panels too); ``--no-avx512`` runs both builds' AVX2 kernels
where the CPU has AVX-512 (builds that predate the AVX-512 kernels ignore it).

    python benchmarks/kernel_ab.py --old-rev REV [--old-so PATH] [--threads T]
        [--rows 1,2,6,7,8,12,16,24,32] [--rounds 41] [--quantized] [--no-avx512]
        [--json-out F]

Both builds are compiled here with one command (``gcc -O3 -fopenmp``, as ``setup.py`` adds to
Python's flags): the old from ``REV``'s ``smallgemm.c``, the new from the working tree's, so
that the comparison is of the sources and not of two compilers' settings. ``--old-so`` /
``--new-so`` take built modules instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from linear_kernels import LAYERS, SHAPES  # noqa: E402  (the default model's body linears)

from structspec.spec.block_quant import dequantize, quantize_q4_1  # noqa: E402
from structspec.spec.fastlinear import pack_quantized  # noqa: E402

HEAD = (576, 49152)
SOURCE = "structspec/_native/smallgemm.c"


def _load(path: Path, name: str = "smallgemm") -> ModuleType:
    """The extension module ``name`` built at ``path`` (beside the installed one)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(rev: str | None, out_dir: Path) -> Path:
    """Compile the kernel source of git revision ``rev`` (``None``: the working tree's) into
    ``out_dir`` and return the module's path."""
    import numpy

    if rev is None:
        source = (ROOT / SOURCE).read_text()
    else:
        source = subprocess.run(["git", "show", f"{rev}:{SOURCE}"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "smallgemm.c"
    src.write_text(source)
    header = ROOT / "structspec" / "_native"
    target = out_dir / ("smallgemm" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [os.environ.get("CC", "gcc"), "-shared", "-fPIC", "-O3", "-fopenmp",
           f"-I{sysconfig.get_paths()['include']}", f"-I{numpy.get_include()}", f"-I{header}",
           str(src), "-o", str(target)]
    subprocess.run(cmd, check=True)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-rev", help="git revision whose smallgemm.c is the old build")
    ap.add_argument("--old-so", help="a built smallgemm module as the old build")
    ap.add_argument("--new-so", help="a built smallgemm module as the new build (default: "
                                     "the working tree's source, compiled here)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,2,6,7,8,12,16,24,32")
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--no-head", action="store_true", help="the 210 body linears only")
    ap.add_argument("--quantized", action="store_true",
                    help="weights quantized like the default model's, passes on the exactly "
                         "quantized panels")
    ap.add_argument("--no-avx512", action="store_true",
                    help="the AVX2 kernels in both builds where the CPU has AVX-512")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if not args.old_rev and not args.old_so:
        ap.error("give --old-rev or --old-so")
    with tempfile.TemporaryDirectory() as tmp:
        old = _load(Path(args.old_so) if args.old_so else build(args.old_rev, Path(tmp, "old")))
        new = _load(Path(args.new_so) if args.new_so else build(None, Path(tmp, "new")))
    if not new.available():
        raise SystemExit("the panel kernel does not run here (an x86-64 CPU with AVX2 and FMA)")
    builds = {"old": old, "new": new}
    kind = 2 if args.quantized else 0
    if args.quantized and not all(hasattr(mod, "pack_q") for mod in builds.values()):
        raise SystemExit("--quantized: a build predates the quantized panels")
    switched = [(mod, mod.set_avx512(False)) for mod in builds.values()
                if args.no_avx512 and hasattr(mod, "set_avx512")]
    try:
        return _run(args, builds, kind)
    finally:  # as it was (a build may be the module this process already uses)
        for mod, before in reversed(switched):
            mod.set_avx512(before)


def _run(args: argparse.Namespace, builds: dict[str, ModuleType], kind: int) -> int:
    """The sweeps and the report of :func:`main`."""
    new = builds["new"]
    rows = [int(r) for r in args.rows.split(",")]
    shapes = SHAPES * LAYERS + ([] if args.no_head else [HEAD])
    torch.manual_seed(0)
    layers: dict[str, list[tuple[int, int, torch.Tensor]]] = {t: [] for t in builds}
    floats: list[torch.Tensor] = []  # the new build's float32 panels (the --quantized check)
    for k, n in shapes:
        w = torch.randn(n, k)
        if args.quantized:
            w = torch.from_numpy(dequantize(quantize_q4_1(w.numpy())))
        for tag, mod in builds.items():  # each build packs its own copy (layouts may differ)
            packed = torch.empty(mod.packed_size(n, k))
            mod.pack(packed.data_ptr(), w.data_ptr(), n, k)
            if args.quantized:
                if tag == "new":
                    floats.append(packed)
                packed = pack_quantized(mod, w)
                if packed is None:
                    raise SystemExit("--quantized: the weights are not exactly block-quantized")
            layers[tag].append((k, n, packed))
    m_max = max(rows)
    xs = {k: torch.randn(m_max, k) for k in {k for k, _ in shapes}}
    outs = {n: torch.empty(m_max, n) for n in {n for _, n in shapes}}

    def sweep(tag: str, m: int) -> float:
        mod = builds[tag]
        t0 = time.perf_counter()
        for k, n, packed in layers[tag]:
            mod.linear(xs[k].data_ptr(), m, k, packed.data_ptr(), n, 0, outs[n].data_ptr(),
                       args.threads, kind)
        return time.perf_counter() - t0

    for m in rows:  # bitwise the same outputs, on the largest layer
        got = {}
        for tag, mod in builds.items():
            k, n, packed = layers[tag][-1]
            out = torch.empty(m, n)
            mod.linear(xs[k].data_ptr(), m, k, packed.data_ptr(), n, 0, out.data_ptr(),
                       args.threads, kind)
            got[tag] = out
        if not torch.equal(got["old"], got["new"]):
            raise SystemExit(f"the builds disagree at {m} rows: the kernel change moved bits")
        if args.quantized:
            k, n, _ = layers["new"][-1]
            out = torch.empty(m, n)
            new.linear(xs[k].data_ptr(), m, k, floats[-1].data_ptr(), n, 0, out.data_ptr(),
                       args.threads, 0)
            if not torch.equal(out, got["new"]):
                raise SystemExit(f"quantized and float32 panels disagree at {m} rows")
    times: dict[tuple[str, int], list[float]] = {(t, m): [] for t in builds for m in rows}
    for r in range(args.rounds):
        for m in rows:
            for tag in (("old", "new") if r % 2 == 0 else ("new", "old")):
                times[(tag, m)].append(sweep(tag, m))
    print(f"threads={args.threads} load={os.getloadavg()[0]:.2f} rounds={args.rounds} "
          f"layers={len(shapes)} (ms per sweep; ratios new/old)")
    print(f"{'rows':>4} {'old':>8} {'new':>8} {'median':>7} {'q25':>6} {'q75':>6} new-faster")
    table = {}
    for m in rows:
        ratios = sorted(n / o for o, n in zip(times[("old", m)], times[("new", m)]))
        q = len(ratios)
        entry = {"old_ms": round(min(times[("old", m)]) * 1e3, 2),
                 "new_ms": round(min(times[("new", m)]) * 1e3, 2),
                 "median_ratio": round(statistics.median(ratios), 3),
                 "q25": round(ratios[q // 4], 3), "q75": round(ratios[(3 * q) // 4], 3),
                 "new_faster": sum(x < 1 for x in ratios), "rounds": q}
        table[m] = entry
        print(f"{m:4d} {entry['old_ms']:8.1f} {entry['new_ms']:8.1f} {entry['median_ratio']:7.3f} "
              f"{entry['q25']:6.3f} {entry['q75']:6.3f} {entry['new_faster']}/{q}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"threads": args.threads, "rounds": args.rounds, "old": args.old_rev or args.old_so,
             "head": not args.no_head, "quantized": args.quantized,
             "avx512": bool(getattr(new, "avx512", lambda: False)()),
             "load": round(os.getloadavg()[0], 2),
             "rows": {str(m): v for m, v in table.items()}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
