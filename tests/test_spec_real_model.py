"""Speculative decoding on the embedded default model: identical greedy outputs on BFCL
function calls, fewer passes, packed linears included. Few and short."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import load_benchmark

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def gen(smollm_tokenizer):
    from structspec.api import Generator

    return Generator()


def test_speculative_equals_plain_on_bfcl_calls(gen, shared_data):
    import structspec
    from structspec.engine import decode
    from structspec.errors import GenerationError
    from structspec.sampling import SamplingParams
    from structspec.spec import speculative_decode
    from structspec.spec.cost import AcceptanceModel

    with open(shared_data / "bfcl" / "bfcl_dev.jsonl") as f:
        rows = [json.loads(line) for line in f][:3]
    model, tok = gen.loaded.model, gen.loaded.tokenizer
    habits = AcceptanceModel()  # kept across the calls, as a Generator does: learned splits
    for row in rows:
        c = structspec.compile_json_schema(row["call_json_schema"], gen.vocab)
        ids = gen.prompt_ids(row["messages"][-1]["content"], schema=c.schema)
        try:
            plain = decode(model, gen.vocab, ids, c, max_new_tokens=96,
                           sampling=SamplingParams()).token_ids
        except GenerationError as exc:
            plain = exc.token_ids
        try:
            out = speculative_decode(model, gen.vocab, ids, c, max_new_tokens=96,
                                     sampling=SamplingParams(), tokenizer=tok,
                                     acceptance=habits)
            spec, passes = out.token_ids, out.stats.forward_passes
        except GenerationError as exc:
            spec, passes = exc.token_ids, exc.stats.forward_passes
        assert spec == plain
        assert passes * 2 <= len(plain) + 2  # at least ~2 tokens per pass on function calls


def test_sampled_calls_are_plain_sampling_and_the_same_on_every_call(gen, shared_data):
    """Sampling at 0.7 with the shipped draft head and the learned habits: under one seed a
    call emits plain sampling's tokens, and the same again on a later call (whose trees
    differ: the Generator learned from the first)."""
    with open(shared_data / "bfcl" / "bfcl_dev.jsonl") as f:
        rows = [json.loads(line) for line in f][3:5]
    for seed, row in enumerate(rows):
        kw = dict(schema=row["call_json_schema"], temperature=0.7, top_p=0.95, seed=seed,
                  max_new_tokens=96)
        request = row["messages"][-1]["content"]
        plain = gen.run(request, speculative=False, **kw)
        first = gen.run(request, **kw)
        again = gen.run(request, **kw)
        assert first.token_ids == plain.token_ids == again.token_ids
        assert first.stats.forward_passes * 2 <= len(plain.token_ids) + 2


def test_packed_default_model_matches_within_1e_3(gen):
    from structspec.spec.fastlinear import pack_linears, packing_available, unpack_linears

    model = gen.loaded.model
    if not packing_available(model):
        pytest.skip("oneDNN packing unavailable")
    ids = torch.tensor([gen.loaded.tokenizer.encode("The capital of France is",
                                                    add_special_tokens=False)])
    try:
        with torch.inference_mode():
            ref = model(input_ids=ids).logits
            pack_linears(model)
            packed = model(input_ids=ids).logits
    finally:
        unpack_linears(model)
    assert (packed - ref).abs().max().item() < 1e-3
    assert torch.equal(packed.argmax(-1), ref.argmax(-1))


def test_the_default_model_as_its_own_draft_model(gen, shared_data):
    """The draft-model drafter on the real model: identical output, drafts nearly always
    accepted (the same weights draft and verify)."""
    import structspec
    from structspec.engine import decode
    from structspec.sampling import SamplingParams
    from structspec.spec import DraftModel, SpecConfig, speculative_decode
    from structspec.spec.cost import CostCurve

    with open(shared_data / "bfcl" / "bfcl_dev.jsonl") as f:
        row = json.loads(f.readline())
    model, tok = gen.loaded.model, gen.loaded.tokenizer
    c = structspec.compile_json_schema(row["call_json_schema"], gen.vocab)
    ids = gen.prompt_ids(row["messages"][-1]["content"], schema=c.schema)
    plain = decode(model, gen.vocab, ids, c, max_new_tokens=64, sampling=SamplingParams())
    cfg = SpecConfig(draft_model=DraftModel(model, tok), drafters=("draft_model",),
                     cost_curve=CostCurve((1, 64), (1.0, 1.0)), adaptive=False,
                     draft_model_topk=1)
    out = speculative_decode(model, gen.vocab, ids, c, max_new_tokens=64,
                             sampling=SamplingParams(), config=cfg, tokenizer=tok)
    assert out.token_ids == plain.token_ids
    proposed, accepted = out.stats.per_drafter["draft_model"]
    assert accepted >= 0.8 * proposed > 0


def _run_benchmark(script: str, argv: list[str]) -> int:
    """Run ``benchmarks/<script>``'s ``main(argv)`` in this process."""
    return load_benchmark(script).main(argv)


def test_the_speculative_benchmark_runs_and_repeats_compare_like_with_like(tmp_path):
    """``benchmarks/speculative.py`` end to end on two short prose requests, each timed
    twice per mode: outputs identical, and the report complete."""
    out = tmp_path / "prose.json"
    assert _run_benchmark("speculative.py", [
        "--task", "prose", "--n", "2", "--max-new-tokens", "6", "--no-peers", "--repeats", "2",
        "--no-cost-model", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["summary"]["identical"] == 2
    assert all(row["passes"] >= 1 and row["new_tokens"] >= 1 for row in result["rows"])


def test_the_speculative_benchmark_plans_with_another_devices_curve(tmp_path):
    """``--cost-curve`` (a flat curve, as a GPU measures) with larger head trees
    (``--max-nodes``, ``--head-topk``, ``--head-min-prob``): outputs still identical, and
    the summary says which curve and head settings the run used."""
    flat = tmp_path / "gpu.json"
    flat.write_text(json.dumps({"cost_curve": {"ms": {"1": 17.5, "32": 17.5}}}))
    out = tmp_path / "prose.json"
    assert _run_benchmark("speculative.py", [
        "--task", "prose", "--n", "2", "--max-new-tokens", "8", "--no-peers",
        "--cost-curve", str(flat), "--max-nodes", "32", "--head-topk", "2",
        "--head-min-prob", "0.02", "--json-out", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert summary["identical"] == 2 and summary["cost_curve_from"] == str(flat)
    assert (summary["max_nodes"], summary["draft_head_topk"],
            summary["draft_head_min_prob"]) == (32, 2, 0.02)
    assert summary["tokens_per_pass_total"] >= 1.0


def test_the_speculative_benchmark_samples(tmp_path):
    """``--temperature``: both modes sample from the task's seed and, under it, emit the
    same tokens (speculation included), and the run succeeds."""
    out = tmp_path / "sampled.json"
    assert _run_benchmark("speculative.py", [
        "--task", "prose", "--n", "2", "--max-new-tokens", "6", "--no-peers",
        "--no-cost-model", "--temperature", "0.8", "--top-p", "0.95", "--seed", "3",
        "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["sampling"] == {"temperature": 0.8, "top_k": None, "top_p": 0.95, "seed": 3}
    assert summary["identical"] == 2 and summary["complete"]["speculative"] == 2
    for row in result["rows"]:
        assert row["identical"] and 1 <= row["speculative_tokens"] <= 6
        assert row["speedup"] > 0 and row["speedup_e2e"] > 0


def test_the_speculative_benchmark_stops_code_where_asked(tmp_path, shared_data):
    """``--stop line``: code tasks are constrained to end at a line end where the code
    parses (an editor's one-line completion); both modes agree on output and completeness."""
    out = tmp_path / "code.json"
    assert _run_benchmark("speculative.py", [
        "--task", "code", "--n", "1", "--max-new-tokens", "40", "--no-peers",
        "--no-cost-model", "--stop", "line", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["summary"]["stop"] == "line" and result["summary"]["identical"] == 1
    complete = result["summary"]["complete"]
    assert complete["baseline"] == complete["speculative"]


@pytest.mark.parametrize(("argv", "says"), [
    (["--top-p", "0.9"], "need --temperature > 0"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--temperature", "1", "--top-p", "1.5"], "top_p must be in (0, 1]")])
def test_the_speculative_benchmark_refuses_bad_sampling(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        _run_benchmark("speculative.py", ["--task", "prose", *argv])
    assert exc.value.code == 2
    assert says in capsys.readouterr().err.splitlines()[-1]


def test_the_sparse_logits_benchmark_runs(tmp_path, shared_data):
    """``benchmarks/sparse_logits.py`` on one short JSON request, one round per setting:
    outputs identical with sparse logits on and off, plain and speculative."""
    out = tmp_path / "sparse.json"
    assert _run_benchmark("sparse_logits.py", [
        "--task", "json", "--n", "1", "--rounds", "1", "--max-new-tokens", "8",
        "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["identical"] and [r["mode"] for r in result["rows"]] == ["plain", "speculative"]


def test_the_half_panels_ab_benchmark_runs_passes(tmp_path):
    """``benchmarks/half_panels_ab.py --passes`` (one round): the script checks that both
    variants give the same logits; on a CPU without the AVX2 half panels it says so."""
    from structspec.spec.fastlinear import half_panels

    before = half_panels()
    out = tmp_path / "ab.json"
    assert _run_benchmark("half_panels_ab.py", [
        "--passes", "1,3", "--rounds", "1", "--prefix", "40", "--against", "session-26",
        "--json-out", str(out)]) == 0
    assert half_panels() == before  # restored
    if out.exists():
        result = json.loads(out.read_text())
        assert set(result["passes"]) == {"1", "3"} and result["prefix"] == 40


@pytest.mark.parametrize("sizes", ["0,2", "two", ""])
def test_the_half_panels_ab_benchmark_refuses_bad_pass_sizes(sizes, capsys):
    with pytest.raises(SystemExit) as exc:
        _run_benchmark("half_panels_ab.py", ["--passes", sizes])
    assert exc.value.code == 2
    assert "--passes" in capsys.readouterr().err


def test_the_default_models_habits_are_packaged_and_generators_learn_more(gen):
    from structspec.spec.habits import fresh_acceptance, packaged_habits

    assert packaged_habits(gen.loaded.model)["name"] == "smollm2-135m-instruct"
    assert fresh_acceptance(gen.loaded.model).splits  # a first request drafts with them
    gen.run("Weather in Paris?", schema={"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}, max_new_tokens=24)
    taught = gen.acceptance("JsonSchemaConstraint")
    assert taught is not None and taught.splits
    taught.splits.clear()  # a copy: the Generator's own is untouched
    assert gen.acceptance("JsonSchemaConstraint").splits
    assert gen.acceptance("NoSuchConstraint") is None


def test_the_habits_script_writes_a_file_that_seeds(tmp_path, shared_data):
    import importlib.util
    import json
    from pathlib import Path

    from structspec.spec.cost import AcceptanceModel

    path = Path(__file__).resolve().parents[1] / "scripts" / "learn_habits.py"
    spec = importlib.util.spec_from_file_location("learn_habits", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "h.habits.json"
    assert script.main(["--requests", "2", "--out", str(out)]) == 0
    blob = json.loads(out.read_text())
    assert blob["kind"] == "structspec-habits" and blob["meta"]["requests"] >= 1
    AcceptanceModel().seed(blob)  # the shape every fresh AcceptanceModel reads
