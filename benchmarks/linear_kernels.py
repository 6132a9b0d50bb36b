"""Time of the default model's linear layers per pass size, for each packing kernel.

The 30 layers × 7 linears of SmolLM2-135M (q, k, v, o: 576→576/192; gate, up: 576→1536;
down: 1536→576), random weights quantized like the default model's (GGUF Q4_1, dequantized to
float32; cost does not depend on the values), packed by each kernel that runs here
(:func:`structspec.spec.fastlinear.available_kernels`) and as plain ``nn.Linear``; ``panel+q``
is the panel kernel with its exactly quantized panels (passes of up to ``QUANT_MAX_ROWS``
rows read them; the column beside it, ``panel``, keeps the float32 panels only). For each
number of rows, the fastest of ``--repeats`` sweeps through all 210 layers, kernels
interleaved. ``int8`` is ``"panel_int8"`` (8-bit activations, a ``Generator``'s default);
on a CPU without AVX512-VNNI ``int8-3row`` is the same layers with qdot's half-panel
kernels switched off (``qdot.set_halves``: 3-row blocks throughout, as before session 26);
on one with it (and no AMX) ``int8-2panel`` is the same layers with qdot's one-panel kernels
switched off (``fastlinear.use_one_panel(1, 0)``: two panels against blocks of 6 rows
throughout, as before session 47). Also checks that every kernel agrees with ``nn.Linear``,
``panel+q`` with ``panel`` and ``int8`` with ``int8-3row`` / ``int8-2panel`` bit for bit.

    python benchmarks/linear_kernels.py [--threads T] [--rows 1,2,4,8] [--repeats R] [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from structspec.spec.block_quant import dequantize, quantize_q4_1  # noqa: E402
from structspec.spec.fastlinear import (  # noqa: E402
    PackedLinear,
    available_kernels,
    int8_amx,
    int8_vnni,
    one_panel_rows,
    use_half_panels,
    use_one_panel,
)

SHAPES = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
LAYERS = 30


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,2,4,6,8,12,16,32,64,256")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    kernels = available_kernels()
    quant = "panel" in kernels
    # "panel_int8" (8-bit activations, a Generator's default) with qdot's AVX2 half-panel
    # kernels ("int8") and without ("int8-3row": 3-row blocks throughout; same bits)
    int8 = "panel_int8" in available_kernels(approx=True)
    int8_ab = int8 and not int8_vnni()
    # ... and on VNNI without AMX tiles, with qdot's one-panel kernels ("int8") and without
    # ("int8-2panel": two panels against blocks of 6 rows throughout; same bits)
    panel_ab = int8 and int8_vnni() and not int8_amx()
    one_panel = one_panel_rows()
    variants = ["plain", *kernels, *(["panel+q"] if quant else []),
                *(["int8"] if int8 else []), *(["int8-3row"] if int8_ab else []),
                *(["int8-2panel"] if panel_ab else [])]
    layers = []
    for k, n in SHAPES * LAYERS:
        lin = nn.Linear(k, n, bias=False).eval()
        with torch.no_grad():  # as the default model's weights are
            lin.weight.copy_(torch.from_numpy(dequantize(quantize_q4_1(lin.weight.numpy()))))
        mods = {"plain": lin, **{kern: PackedLinear(lin, kern, quantized=False)
                                 for kern in kernels}}
        if quant:
            mods["panel+q"] = PackedLinear(lin, "panel")
            assert mods["panel+q"].quantized
        if int8:
            mods["int8"] = mods["int8-3row"] = mods["int8-2panel"] = PackedLinear(
                lin, "panel_int8")
            assert mods["int8"].int8
        layers.append((k, mods))
    rows = [int(r) for r in args.rows.split(",")]
    inputs = {k: torch.randn(max(rows), k) for k in {k for k, _ in SHAPES}}

    def sweep(variant: str, m: int) -> None:
        if int8_ab and variant.startswith("int8"):
            use_half_panels(variant == "int8")
        if panel_ab and variant.startswith("int8"):
            use_one_panel(*(one_panel if variant == "int8" else (1, 0)))
        for k, mods in layers:
            mods[variant](inputs[k][:m])

    ms: dict[str, dict[int, float]] = {v: {} for v in variants}
    with torch.inference_mode():
        for k, mods in layers[:7]:  # agreement with nn.Linear
            ref = mods["plain"](inputs[k][:5])
            for kern in kernels:
                assert torch.allclose(mods[kern](inputs[k][:5]), ref, atol=1e-4), kern
            if quant:
                for m in (1, 2, 3, 5):
                    assert torch.equal(mods["panel+q"](inputs[k][:m]),
                                       mods["panel"](inputs[k][:m])), m
            if int8_ab:
                for m in (5, 9):
                    use_half_panels(True)
                    halves = mods["int8"](inputs[k][:m])
                    use_half_panels(False)
                    assert torch.equal(halves, mods["int8"](inputs[k][:m])), m
                use_half_panels(True)
            if panel_ab:
                for m in (1, 5, 9, 16):
                    use_one_panel(*one_panel)
                    single = mods["int8"](inputs[k][:m])
                    use_one_panel(1, 0)
                    assert torch.equal(single, mods["int8"](inputs[k][:m])), m
                use_one_panel(*one_panel)
        for m in rows:
            best = {v: float("inf") for v in variants}
            for v in variants:
                sweep(v, m)  # warm-up
            for _ in range(args.repeats):
                for v in variants:
                    t0 = time.perf_counter()
                    sweep(v, m)
                    best[v] = min(best[v], time.perf_counter() - t0)
            for v in variants:
                ms[v][m] = round(1000 * best[v], 2)
    if int8_ab:
        use_half_panels(True)
    if panel_ab:
        use_one_panel(*one_panel)
    print(f"threads={args.threads} load={os.getloadavg()[0]:.2f} "
          f"({LAYERS * len(SHAPES)} linears, ms per sweep)")
    # oneDNN's time over each other kernel's, where oneDNN runs
    compared = [k for k in kernels if k != "onednn"] if "onednn" in kernels else []
    print(f"{'rows':>5} " + " ".join(f"{v:>9}" for v in variants)
          + "".join(f" {'onednn/' + k:>14}" for k in compared)
          + (f" {'panel+q/panel':>14}" if quant else "")
          + (f" {'int8/3row':>10}" if int8_ab else "")
          + (f" {'int8/2panel':>12}" if panel_ab else ""))
    for m in rows:
        ratios = "".join(f" {ms['onednn'][m] / ms[k][m]:>14.2f}" for k in compared)
        if quant:
            ratios += f" {ms['panel+q'][m] / ms['panel'][m]:>14.2f}"
        if int8_ab:
            ratios += f" {ms['int8'][m] / ms['int8-3row'][m]:>10.2f}"
        if panel_ab:
            ratios += f" {ms['int8'][m] / ms['int8-2panel'][m]:>12.2f}"
        print(f"{m:>5} " + " ".join(f"{ms[v][m]:>9.1f}" for v in variants) + ratios)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"threads": args.threads, "load": round(os.getloadavg()[0], 2),
             "kernels": list(kernels), "ms": ms}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
