"""``benchmarks/draft_passes.py``: speculation-only pass counts at a stored curve's prices,
and how each pass's drafts ended."""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark, torch_threads, write_json_tasks


def test_pass_endings_are_told_apart():
    """The model's token after the accepted drafts was verified (``planned``), drafted and
    dropped by the plan (``built``), missing beside other drafts (``none``), or beyond the
    tree's end (``ran-out``)."""
    bench = load_benchmark("draft_passes.py")
    # tree: root -> 5 -> 6 -> 7, root -> 5 -> 8 (planned: root -> 5 -> 6 only)
    built = bench.tree_paths([0, 5, 6, 7, 8], [-1, 0, 1, 2, 1],
                             ["root", "values", "forced", "closers", "lookup"])
    assert ((5, 8), "lookup") in built and ((5, 6, 7), "closers") in built
    planned = bench.tree_paths([0, 5, 6], [-1, 0, 1], ["root", "values", "forced"])
    out = [1, 5, 6, 9, 4]  # a pass started at index 1
    assert bench.pass_ending(out, 1, 3, built, planned) == "planned"  # 5 then 6 (the bonus)
    assert bench.pass_ending([1, 5, 8], 1, 3, built, planned) == "built"
    assert bench.pass_ending([1, 5, 9], 1, 3, built, planned) == "none"  # 6 and 8 drafted
    assert bench.pass_ending([1, 5, 6, 7, 2], 1, 5, built, planned) == "ran-out"


def test_runs_are_compared_task_by_task():
    bench = load_benchmark("draft_passes.py")
    before = {"a": 5, "b": 7, "c": 3, "gone": 4}
    after = {"a": 5, "b": 4, "c": 4, "new": 2}
    assert bench.compare(before, after) == [("b", 7, 4), ("c", 3, 4)]


def test_json_places_are_named():
    bench = load_benchmark("draft_passes.py")
    assert bench.slot_kind('{"city": "Par') == "in-string"
    assert bench.slot_kind('{"n": 12') == "number"
    assert bench.slot_kind('{"n": ') == "value-start"
    assert bench.slot_kind('{"n": 1, ') == "key-or-punct"
    assert bench.slot_kind("def f(x):") == "other"


def test_the_script_counts_passes_per_task(tmp_path, tiny_model):
    """A run over a small task file: totals, per-task passes, endings, the JSON file; the
    same counts again from a second run (the plans are priced by the stored curve, not by
    this machine)."""
    from structspec.api import Generator

    bench = load_benchmark("draft_passes.py")
    data = write_json_tasks(tmp_path / "tasks.jsonl")
    gen = Generator(tiny_model, pack=False)
    with torch_threads(1):  # (the script sets --threads 1; restored after)
        outs = []
        for k in range(2):
            out_file = tmp_path / f"run{k}.json"
            again = ["--compare", str(tmp_path / "run0.json")] if k else []
            assert bench.main(["--task", "json", "--data", str(data), "--n", "2",
                               "--max-new-tokens", "24", "--endings",
                               "--json-out", str(out_file), *again], gen=gen) == 0
            outs.append(json.loads(out_file.read_text()))
    first, second = outs
    assert set(first["per_task"]) == {"t0", "t1"}
    assert first["passes"] == sum(first["per_task"].values()) > 0
    assert first["tokens"] > 0 and first["modeled_s"] > 0
    assert sum(first["endings"].values()) <= first["passes"] - 2  # not the last passes
    assert first["summary"]["n"] == 2 and first["summary"]["max_new_tokens"] == 24
    assert second["per_task"] == first["per_task"]


def test_a_bad_comparison_file_is_refused_before_the_run(tmp_path, capsys):
    """``--compare`` names a file that is missing or not this script's output: a usage error
    naming it, before any model is loaded or task run."""
    bench = load_benchmark("draft_passes.py")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"summary": {}}))
    for path in (tmp_path / "missing.json", other):
        with pytest.raises(SystemExit) as exc:
            bench.main(["--compare", str(path)], gen=None)
        assert exc.value.code == 2
        assert f"--compare {path}" in capsys.readouterr().err
