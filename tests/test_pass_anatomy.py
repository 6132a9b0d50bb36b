"""``benchmarks/pass_anatomy.py``: a request's time split by stage, a pass's by part."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import load_benchmark, torch_threads, write_json_tasks


def test_a_line_is_fitted_by_weight():
    bench = load_benchmark("pass_anatomy.py")
    a, b = bench.fit_line([(1, 3.0, 5), (3, 7.0, 1), (5, 11.0, 2)])
    assert a == pytest.approx(1.0) and b == pytest.approx(2.0)
    assert bench.fit_line([(4, 2.0, 3), (4, 4.0, 1)]) == (2.5, 0.0)  # one size: no slope
    assert bench.fit_line([]) == (0.0, 0.0)


def test_the_script_splits_both_modes(tmp_path, tiny_model):
    """Two JSON tasks on the tiny model: each mode's stages add up to its requests' time,
    plain decoding's passes are one node each, the outputs agree, and the timed classes get
    their own ``forward`` back."""
    from structspec.api import Generator

    bench = load_benchmark("pass_anatomy.py")
    data = write_json_tasks(tmp_path / "tasks.jsonl")
    gen = Generator(tiny_model, pack=False)
    forward = torch.nn.Linear.forward
    out_file = tmp_path / "anatomy.json"
    with torch_threads(1):
        assert bench.main(["--task", "json", "--data", str(data), "--offset", "0", "--n", "2",
                           "--max-new-tokens", "16", "--json-out", str(out_file)], gen=gen) == 0
    assert torch.nn.Linear.forward is forward
    out = json.loads(out_file.read_text())
    assert out["summary"]["n"] == 2 and out["summary"]["identical"] == 2
    for mode in ("plain", "speculative"):
        stages = out["per_request_ms"][mode]
        parts = sum(stages[k] for k in ("first pass", "later passes", "drafting", "rest"))
        assert parts == pytest.approx(stages["total"], abs=0.05)
        assert stages["passes"] >= 1 and stages["tokens"] >= 1
    assert set(out["passes_by_nodes"]["plain"]) <= {"1"}
    for row in out["passes_by_nodes"]["speculative"].values():
        assert row["passes"] >= 1 and row["ms"] >= row["linears"] >= 0
