"""``scripts/lossless_sweep.py``: the lossless comparison at a width the default run has no
time for — here only that each sweep runs, counts and reports."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from structspec.spec.prompt_rows import kernel as prompt_rows_kernel

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lossless_sweep.py"


@pytest.fixture(scope="module")
def sweep_script(shared_data, smollm_tokenizer, one_thread):
    spec = importlib.util.spec_from_file_location("lossless_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv", [["json", "--stride", "3000", "--limit", "2"],
                                  ["code", "--stride", "3000", "--limit", "1"],
                                  ["grammars", "--per", "1"],
                                  ["fuzz", "--stride", "3000", "--limit", "2"],
                                  ["api", "--cases", "6"],
                                  ["json", "--stride", "3000", "--limit", "1", "--target", "q4",
                                   "--prefix"],
                                  ["grammars", "--per", "1", "--target", "q4", "--prefix"]])
def test_each_sweep_runs_and_reports(sweep_script, tmp_path, argv):
    out_file = tmp_path / "sweep.json"
    assert sweep_script.main([*argv, "--json-out", str(out_file)]) == 0
    out = json.loads(out_file.read_text())
    assert out["kind"] == argv[0] and out["mismatches"] == 0 and out["lines"] == []
    assert out["tasks"] >= 1 and out["runs"] >= out["tasks"]
    if "--prefix" in argv:  # every comparison also decoded from a prefix cache, and hit it
        assert out["prefix_hits"] >= 2 * out["tasks"]
    if "q4" in argv and prompt_rows_kernel() is not None:
        assert out["prompt_panels"] > 0  # the prompt's rows took the prompt panels


def test_a_random_configuration_is_a_valid_one(sweep_script):
    import random

    from structspec.spec import SpecConfig

    rng = random.Random(0)
    for _ in range(200):
        SpecConfig(**sweep_script.random_config(rng, head=None))


def test_random_requests_vary_what_they_ask(sweep_script):
    import random

    rng = random.Random(0)
    requests = [sweep_script.random_request(rng) for _ in range(200)]
    for key in ("schema", "regex", "grammar", "grammar_suffix", "temperature", "lenient"):
        assert any(key in kw for kw in requests), key


def test_a_start_past_the_stride_is_refused(sweep_script, capsys):
    with pytest.raises(SystemExit) as exc:
        sweep_script.main(["json", "--stride", "5", "--start", "5"])
    assert exc.value.code == 2 and "--start" in capsys.readouterr().err


def test_a_typed_error_mid_decode_is_an_outcome_to_compare(sweep_script):
    from structspec.errors import GenerationError, ResourceLimitError

    def limit(*_, **__):
        raise ResourceLimitError("grammar state has over 2000 configurations")

    def budget(*_, **__):
        raise GenerationError("max_new_tokens reached", token_ids=[5, 6])

    assert sweep_script.outcome(limit) == (
        [], False, "ResourceLimitError: grammar state has over 2000 configurations")
    assert sweep_script.outcome(budget) == ([5, 6], False, "limit")
