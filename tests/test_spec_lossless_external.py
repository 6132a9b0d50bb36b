"""Lossless on constraints others wrote: speculative decoding against plain decoding over
external schemas and code.

The speculative tests beside this one prove greedy identity on patterns and a schema written
for them; here the constraints are the ones users bring — MaskBench's real-world schemas,
the JSON-Schema-Test-Suite's groups (draft 2020-12), and Python fill-in-the-middle views of
HumanEval's infilling tasks — read from ``../shared/data`` (skipped where it is absent).

The target is the tiny random model with the real tokenizer: its choices are arbitrary, so
its outputs wander into every corner of a schema (odd strings, long numbers, optional keys)
and most drafts are rejected somewhere. Four drafting set-ups cover the acceptance paths:
the default drafters (forced text, alternatives, lookup, values, closers, top-k); a random
draft head (the learned drafter's tree growth and beam); a draft model with the target's
own weights (every draft accepted: long paths, deep compaction of
the cache); and another random model (partial acceptance at any depth). Greedy runs must
give plain decoding's tokens, completion and error; sampled runs a valid output, the same
for the same seed. A Hypothesis test draws schema, prompt and tree budgets together.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import warnings
from typing import Any

import pytest
from conftest import (
    instance_prompt,
    maskbench_rows,
    random_draft_head,
    suite_groups,
    tiny_llama,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automata import compile_json_schema
from structspec.engine import decode
from structspec.errors import GenerationError, StructSpecError
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec.cost import CostCurve
from structspec.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")

MASKBENCH_STRIDE, MASKBENCH_START = 100, 7   # 78 of MaskBench's 7,773 schemas
SUITE_STRIDE = 4                            # a quarter of the suite's 383 groups
CODE_STRIDE = 400                           # 15 of HumanEval's multi-line infilling tasks
MAX_NEW = 40
GREEDY = SamplingParams()
FLAT = CostCurve((1, 64), (1.0, 1.0))  # every tree size costs the same: nothing is pruned
SETUPS = ("default", "draft_head", "draft_model_same", "draft_model_other")


@pytest.fixture(scope="module")
def setting(tiny_model):
    """``(target, tokenizer, vocabulary, drafting set-ups)``. The target runs the fast CPU
    paths a ``Generator`` installs (packed linears, the row-exact attention kernel), where a
    tree pass's row is bitwise a one-token step's — what sampled identity rests on: on a
    near-flat distribution an inverse-CDF pick moves with the last bit of the running sum.
    The draft models are copies (a draft model keeps its own state on the module), the head
    a random one."""
    from structspec.spec.cpu_paths import use_fast_cpu_paths

    tok = tiny_model.tokenizer
    vocab = Vocabulary.from_tokenizer(tok, eos_token_ids=tiny_model.eos_token_ids)
    target = use_fast_cpu_paths(copy.deepcopy(tiny_model.model))
    configs = {
        "default": SpecConfig(),
        # A random head's paths are improbable: kept only with no floor and a flat curve.
        "draft_head": SpecConfig(draft_head=random_draft_head(target),
                                 draft_head_min_prob=0.0, adaptive=False, cost_curve=FLAT),
        "draft_model_same": SpecConfig(draft_model=copy.deepcopy(target)),
        "draft_model_other": SpecConfig(draft_model=tiny_llama(tok, seed=1)),
    }
    return target, tok, vocab, configs


def _run(fn, *args, **kwargs) -> tuple[list[int], bool, str | None, Any]:
    """(token ids, complete, error, stats) of one decode, its error included."""
    try:
        out = fn(*args, **kwargs)
        return out.token_ids, out.complete, None, out.stats
    except GenerationError as exc:
        return exc.token_ids, False, str(exc).split(":")[0], exc.stats


@pytest.fixture(scope="module")
def json_tasks(setting):
    """``[(name, constraint, prompt ids)]``: the MaskBench and suite samples the compiler
    accepts in the default model's vocabulary (the rest are refused with typed errors,
    which other tests check), and how many were refused."""
    _, tok, vocab, _ = setting
    pool = [(row["id"], row["schema"], row.get("description", ""), row.get("tests", []))
            for row in maskbench_rows(MASKBENCH_STRIDE, MASKBENCH_START)]
    pool += [(name, group["schema"], group["description"], group["tests"])
             for name, group in suite_groups()[::SUITE_STRIDE]]
    tasks, refused = [], 0
    for name, schema, description, tests in pool:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                constraint = compile_json_schema(schema, vocab)
        except StructSpecError:
            refused += 1
            continue
        instance = next((t["data"] for t in tests if t.get("valid")), None)
        tasks.append((name, constraint, instance_prompt(tok, description, instance)))
    assert len(tasks) > 120 and refused < len(pool) // 3, (len(tasks), refused)
    return tasks


@pytest.fixture(scope="module")
def plain_json(setting, json_tasks):
    """Plain greedy decoding of every JSON task (the reference for each set-up)."""
    model, _, vocab, _ = setting
    return [_run(decode, model, vocab, prompt, c, max_new_tokens=MAX_NEW, sampling=GREEDY)
            for _, c, prompt in json_tasks]


@pytest.mark.parametrize("setup", SETUPS)
def test_speculative_greedy_is_plain_greedy_on_external_schemas(setting, json_tasks,
                                                                plain_json, setup):
    model, tok, vocab, configs = setting
    mismatches, tokens, passes, head_nodes = [], 0, 0, 0
    for (name, c, prompt), plain in zip(json_tasks, plain_json, strict=True):
        spec = _run(speculative_decode, model, vocab, prompt, c, max_new_tokens=MAX_NEW,
                    sampling=GREEDY, tokenizer=tok, config=configs[setup])
        if spec[:3] != plain[:3]:
            mismatches.append(f"{name}: plain {plain[:3]} speculative {spec[:3]}")
        if plain[1]:  # what a complete output says must be valid
            text = vocab.decode(plain[0]).decode("utf-8")
            assert c.problem(text) is None, (name, text, c.problem(text))
        tokens, passes = tokens + len(plain[0]), passes + spec[3].forward_passes
        head_nodes += spec[3].per_drafter.get("draft_head", (0, 0))[0]
    assert not mismatches, "\n".join(mismatches[:10])
    assert (head_nodes > 0) == (setup == "draft_head")
    # The comparison is not vacuous: speculation ran and committed several tokens a pass
    # (with the target's own weights as its draft model, nearly every draft is accepted).
    assert passes * (3 if setup == "draft_model_same" else 1) < tokens, (passes, tokens)


def test_speculative_decoding_without_a_tokenizer_is_plain_greedy(setting, json_tasks,
                                                                  plain_json):
    """``tokenizer=None`` (documented: forced text then drafts the longest matching tokens;
    it raised AttributeError until session 61): the same outputs as plain decoding."""
    model, _, vocab, configs = setting
    mismatches = []
    for (name, c, prompt), plain in list(zip(json_tasks, plain_json, strict=True))[::4]:
        spec = _run(speculative_decode, model, vocab, prompt, c, max_new_tokens=MAX_NEW,
                    sampling=GREEDY, tokenizer=None, config=configs["default"])
        if spec[:3] != plain[:3]:
            mismatches.append(f"{name}: plain {plain[:3]} speculative {spec[:3]}")
    assert not mismatches, "\n".join(mismatches[:10])


def test_speculative_sampling_is_plain_sampling_on_external_schemas(setting, json_tasks):
    """Sampling (temperature, top-p, top-k): under one seed speculative decoding emits plain
    decoding's tokens, whatever it drafted (each position's token is the one its seeded
    number picks); every complete output is valid. The lossy ``validation_threshold`` mode:
    valid, and the same output again for the same seed."""
    model, tok, vocab, configs = setting
    modes = [SamplingParams(temperature=1.0, seed=0),
             SamplingParams(temperature=0.7, top_p=0.9, seed=1),
             SamplingParams(temperature=1.3, top_k=20, seed=2)]
    mismatches, complete = [], 0
    for n, (name, c, prompt) in enumerate(json_tasks[::2]):
        sampling, setup = modes[n % len(modes)], SETUPS[n % len(SETUPS)]
        plain = _run(decode, model, vocab, prompt, c, max_new_tokens=MAX_NEW, sampling=sampling)
        spec = _run(speculative_decode, model, vocab, prompt, c, max_new_tokens=MAX_NEW,
                    sampling=sampling, tokenizer=tok, config=configs[setup])
        if spec[:3] != plain[:3]:
            mismatches.append(f"{name} ({setup}, {sampling}): plain {plain[:3]} "
                              f"speculative {spec[:3]}")
        lossy = [_run(speculative_decode, model, vocab, prompt, c, max_new_tokens=MAX_NEW,
                      sampling=sampling, tokenizer=tok,
                      config=SpecConfig(validation_threshold=0.5)) for _ in range(2)]
        assert lossy[0][:3] == lossy[1][:3], name
        for run in (plain, lossy[0]):
            if run[1]:
                complete += 1
                text = vocab.decode(run[0]).decode("utf-8")
                assert c.problem(text) is None, (name, text, c.problem(text))
    assert not mismatches, "\n".join(mismatches[:10])
    assert complete >= 10  # enough outputs ended inside the budget to judge


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), max_new=st.integers(1, 48),
       max_nodes=st.sampled_from([None, 1, 4, 16, 32]),
       draft_length=st.sampled_from([1, 3, 32]),
       num_speculations=st.sampled_from([None, 1, 8, 16]),
       sparse_logits=st.booleans(), setup=st.sampled_from(SETUPS),
       sampling=st.sampled_from([GREEDY, SamplingParams(temperature=1.0, seed=3),
                                 SamplingParams(temperature=0.8, top_k=5, top_p=0.95, seed=4)]))
def test_any_tree_budget_is_lossless_on_external_schemas(setting, json_tasks, data, max_new,
                                                         max_nodes, draft_length,
                                                         num_speculations, sparse_logits,
                                                         setup, sampling):
    model, tok, vocab, configs = setting
    name, c, prompt = data.draw(st.sampled_from(json_tasks), label="task")
    cut = data.draw(st.integers(1, max(1, len(prompt))), label="prompt tokens")
    prompt = prompt[:cut]
    config = dataclasses.replace(configs[setup], max_nodes=max_nodes,
                                 draft_length=draft_length, num_speculations=num_speculations,
                                 sparse_logits=sparse_logits)
    plain = _run(decode, model, vocab, prompt, c, max_new_tokens=max_new, sampling=sampling,
                 sparse_logits=sparse_logits)
    spec = _run(speculative_decode, model, vocab, prompt, c, max_new_tokens=max_new,
                sampling=sampling, tokenizer=tok, config=config)
    assert spec[:3] == plain[:3], name


@pytest.fixture(scope="module")
def code_tasks(setting, shared_data):
    """``[(task id, stop, constraint, prompt ids, prefix, suffix)]``: Python views of
    HumanEval's multi-line infilling tasks, cycling through the stopping points."""
    import structspec
    from structspec.grammars import grammar_path

    _, tok, vocab, _ = setting
    python = structspec.compile_grammar(grammar_path("python"), vocab)
    path = shared_data / "code" / "HumanEval-MultiLineInfilling.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()][3::CODE_STRIDE]
    stops = ("eof", "statement", "block")
    tasks = []
    for n, row in enumerate(rows):
        stop = stops[n % len(stops)]
        view = python.with_suffix(row["suffix"], prefix=row["prompt"], stop=stop)
        tasks.append((row["task_id"], stop, view,
                      tok.encode(row["prompt"], add_special_tokens=False),
                      row["prompt"], row["suffix"]))
    return tasks


def test_speculative_greedy_is_plain_greedy_on_code_infilling(setting, code_tasks):
    model, tok, vocab, configs = setting
    mismatches = []
    for task_id, stop, view, prompt, prefix, suffix in code_tasks:
        plain = _run(decode, model, vocab, prompt, view, max_new_tokens=32, sampling=GREEDY)
        if plain[1] and stop == "eof":  # the middle fills the hole: the file parses
            ast.parse(prefix + vocab.decode(plain[0]).decode("utf-8") + suffix)
        for setup, config in configs.items():
            spec = _run(speculative_decode, model, vocab, prompt, view, max_new_tokens=32,
                        sampling=GREEDY, tokenizer=tok, config=config)
            if spec[:3] != plain[:3]:
                mismatches.append(f"{task_id} ({stop}, {setup}): plain {plain[:3]} "
                                  f"speculative {spec[:3]}")
    assert not mismatches, "\n".join(mismatches[:10])
