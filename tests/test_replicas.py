"""Data-parallel replicas: several processes, each a whole Generator, decode what one would."""

from __future__ import annotations

import pickle
import time

import pytest

from structspec.api import Generator, Result
from structspec.errors import (
    DistributedError,
    GenerationError,
    ModelLoadError,
    StructSpecError,
)
from structspec.replicas import Replicas, default_layout, replica_device
from tests.conftest import torch_threads

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "maximum": 120}},
          "required": ["name", "age"]}
REQUESTS = [
    {"prompt": "Name someone.", "schema": PERSON, "max_new_tokens": 40},
    {"prompt": "A date.", "regex": "20[0-9][0-9]-(0[1-9]|1[0-2])"},
    {"prompt": "Some JSON.", "grammar": "json", "max_new_tokens": 12},
    {"prompt": "Anything at all.", "max_new_tokens": 16},
    {"prompt": "Anything, sampled.", "max_new_tokens": 16, "temperature": 0.9, "seed": 5},
    {"prompt": "Name someone else.", "schema": PERSON, "max_new_tokens": 40,
     "speculative": False},
]


def _outcome(outcome):
    """What a request came to, comparable across processes."""
    if isinstance(outcome, Result):
        return "ok", outcome.text, outcome.token_ids
    assert isinstance(outcome, GenerationError), outcome  # the random model's budget
    return type(outcome).__name__, outcome.text, outcome.token_ids


@pytest.fixture(scope="module")
def pool(tiny_model_dir):
    with Replicas(str(tiny_model_dir), replicas=2, threads=1) as replicas:
        yield replicas


COUNTED = ("requests", "failed_requests", "decodes", "new_tokens", "prompt_tokens")


def test_replicas_emit_what_one_generator_emits(pool, tiny_model_dir):
    before = pool.totals.as_dict()
    got = [_outcome(o) for o in pool.map(REQUESTS, errors="return")]
    after = pool.totals.as_dict()
    with torch_threads(1):
        gen = Generator(str(tiny_model_dir))
        want = []
        for request in REQUESTS:
            try:
                want.append(_outcome(gen.run(**request)))
            except GenerationError as exc:
                want.append(_outcome(exc))
    assert got == want
    assert sorted(index for index, _ in pool.devices) == [0, 1]
    # the totals are what one Generator counts for the same requests
    one = gen.totals.as_dict()
    assert {k: after[k] - before[k] for k in COUNTED} == {k: one[k] for k in COUNTED}
    assert one["requests"] == len(REQUESTS)


def test_submit_and_run_give_results_and_raise_errors_as_run_does(pool):
    future = pool.submit("A date.", regex="2020-01-0[1-9]")
    assert future.result(timeout=120).text.startswith("2020-01-0")
    with pytest.raises(StructSpecError, match="/type") as info:
        pool.run("x", schema={"type": "nope"})
    assert type(info.value).__name__ == "SchemaError"
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        pool.run("x", max_new_tokens=0)


def test_map_returns_or_raises_a_failed_request_in_its_place(pool):
    bad = {"prompt": "x", "schema": {"type": "nope"}}
    good = {"prompt": "A date.", "regex": "2021-0[1-9]"}
    out = list(pool.map([good, bad, good], errors="return"))
    assert [type(o).__name__ for o in out] == ["Result", "SchemaError", "Result"]
    with pytest.raises(StructSpecError, match="/type"):
        list(pool.map([good, bad, good]))


@pytest.mark.parametrize(("request_", "message"), [
    ({"prompt": "x", "shema": {}}, r"request 0: unknown field\(s\) shema"),
    ({"schema": {}}, "request 0: no 'prompt'"),
    (["x"], "request 0: a request is a mapping"),
])
def test_a_malformed_request_is_refused_before_it_leaves(pool, request_, message):
    with pytest.raises(ValueError, match=message):
        list(pool.map([request_]))


def test_a_model_that_does_not_load_is_reported_by_the_constructor(tmp_path):
    start = time.monotonic()
    with pytest.raises(ModelLoadError):
        Replicas(str(tmp_path / "no-such-model"), replicas=1, threads=1)
    assert time.monotonic() - start < 120


def test_an_untyped_start_up_failure_is_named_in_a_distributed_error(tiny_model_dir):
    with pytest.raises(DistributedError, match="replica 0 could not start on nonsense: "
                                               "RuntimeError"):
        Replicas(str(tiny_model_dir), replicas=1, threads=1, device="nonsense")


class _Stall:
    """Unpickles (in the replica, as its start-up arguments arrive) into an hour's sleep."""

    def __reduce__(self):
        return time.sleep, (3600,)


def test_a_replica_that_hangs_in_its_start_is_given_up_on_not_waited_for(tiny_model_dir):
    start = time.monotonic()
    with pytest.raises(DistributedError, match="did not load the model within 3 s"):
        Replicas(str(tiny_model_dir), replicas=1, threads=1, start_timeout=3,
                 speculation=_Stall())  # type: ignore[arg-type]
    assert time.monotonic() - start < 60


def test_a_replica_that_dies_is_a_distributed_error_not_a_hang(tiny_model_dir):
    with Replicas(str(tiny_model_dir), replicas=1, threads=1) as replicas:
        future = replicas.submit("Anything.", max_new_tokens=4000)
        for process in list(replicas._pool._processes.values()):
            process.kill()
        with pytest.raises(DistributedError, match="died"):
            future.result(timeout=120)
        with pytest.raises(DistributedError, match="died earlier"):
            replicas.run("Anything.", max_new_tokens=4)
        assert replicas.totals.as_dict()["requests"] == 0  # its counts died with it


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="model must be a model spec"):
        Replicas(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replicas must be a positive integer"):
        Replicas(replicas=0)
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        default_layout("cpu", 2, -1)


def test_the_default_layout_shares_out_the_cores():
    import os

    cores = len(os.sched_getaffinity(0))
    replicas, threads = default_layout("cpu", None, None)
    assert replicas == min(4, cores) and threads == max(1, cores // replicas)
    assert default_layout("cpu", 3, 2) == (3, 2)
    assert replica_device("cpu", 3) == "cpu" and replica_device("cuda:1", 0) == "cuda:1"


def test_errors_and_results_pickle_as_they_are():
    import structspec.errors as errors_module
    from structspec.errors import GrammarError, SchemaError, UnsupportedSchemaError
    from structspec.spec.stats import SpecStats

    for error in (SchemaError("bad", "/a"), UnsupportedSchemaError("if", "/x", "why"),
                  GrammarError("g", 3, 4), GenerationError("m", "t", [1, 2], SpecStats()),
                  DistributedError("d")):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert back.args == error.args and vars(back).keys() == vars(error).keys()
    stats = SpecStats(new_tokens=3)
    stats.per_drafter["lookup"][1] += 2
    back = pickle.loads(pickle.dumps(Result({"a": 1}, '{"a": 1}', [1], stats)))
    assert back.stats.per_drafter["lookup"] == [0, 2] and back.stats.per_drafter["x"] == [0, 0]
    assert errors_module.StructSpecError.__subclasses__()  # the walk above is not vacuous
    from structspec.spec.totals import StatsTotals

    totals = StatsTotals()
    totals.add(stats)
    totals.finish(True)
    assert pickle.loads(pickle.dumps(totals)).as_dict() == totals.as_dict()


def test_the_benchmark_sends_run_what_speculative_py_decodes(shared_data):
    from tests.conftest import load_benchmark

    bench = load_benchmark("replicas.py")
    calls = bench.requests_for("json", 150, 3, None)
    assert len(calls) == 3 and all(c["max_new_tokens"] == 160 and "schema" in c for c in calls)
    code = bench.requests_for("code", 10, 2, 32)
    assert [set(c) for c in code] == [{"prompt", "grammar", "grammar_prefix", "chat",
                                       "max_new_tokens"}] * 2
    assert code[0]["prompt"] == code[0]["grammar_prefix"] and code[0]["chat"] is False
    assert bench._outcome(GenerationError("m", "t", [1])) == ("GenerationError", "t")


def test_the_embedded_model_is_known_by_its_aliases():
    from structspec.models import is_default_model

    assert all(is_default_model(s) for s in (None, "default", "smollm2"))
    assert not is_default_model("some/other-model")


def test_map_reads_an_endless_iterable_as_it_goes(pool):
    import itertools

    request = {"prompt": "A year.", "regex": "19[0-9][0-9]"}
    results = pool.map(itertools.repeat(request), window=2)
    first = list(itertools.islice(results, 3))
    results.close()  # the ones still in flight are cancelled or finish unseen
    assert len({r.text for r in first}) == 1  # greedy: the same request, the same text
    with pytest.raises(ValueError, match="window must be a positive integer"):
        next(pool.map([request], window=0))
    with pytest.raises(ValueError, match="errors must be 'raise' or 'return'"):
        next(pool.map([request], errors="ignore"))
