"""``structspec.Limits``: hostile inputs end in ResourceLimitError, within the budget."""

from __future__ import annotations

import contextlib
import time

import pytest
from conftest import make_byte_vocab

import structspec
from structspec import Limits, ResourceLimitError, compile_json_schema, compile_regex
from structspec.automata.limits import active_limits, compiling

VOCAB = make_byte_vocab()


def test_limits_validate_their_fields() -> None:
    with pytest.raises(ValueError, match="max_states"):
        Limits(max_states=0)
    with pytest.raises(ValueError, match="max_seconds"):
        Limits(max_seconds=-1.0)
    assert structspec.Limits is Limits


def test_hostile_pattern_hits_the_state_budget() -> None:
    # (a|b)*a(a|b){n}: the DFA needs 2^n states.
    with pytest.raises(ResourceLimitError, match="states"):
        compile_regex("(a|b)*a(a|b){16}", VOCAB, limits=Limits(max_states=500))
    with pytest.raises(ResourceLimitError):
        compile_json_schema({"type": "string", "pattern": "^(a|b)*a(a|b){16}$"}, VOCAB,
                            limits=Limits(max_states=500))


def test_hostile_pattern_hits_the_time_budget() -> None:
    start = time.monotonic()
    with pytest.raises(ResourceLimitError, match="s"):
        compile_json_schema({"type": "string", "pattern": "^(a|b)*a(a|b){15}$"}, VOCAB,
                            limits=Limits(max_seconds=0.2, max_states=10**6))
    assert time.monotonic() - start < 5


def test_many_properties_hit_the_time_budget_not_a_hang() -> None:
    schema = {"type": "object",
              "properties": {f"p{i}": {"type": "integer", "minimum": i} for i in range(3000)}}
    start = time.monotonic()
    with pytest.raises(ResourceLimitError, match="max_seconds"):
        compile_json_schema(schema, VOCAB, limits=Limits(max_seconds=0.3))
    # The budget is checked between steps (the metaschema check is one step): generous
    # bound, the point is "no hang" (unlimited, this schema takes over 30 s).
    assert time.monotonic() - start < 20


def _repository(system: str, typ: list, required: list[str]) -> dict:
    url = {"type": "array", "items": {"type": "string", "minLength": 1}}
    item = {"type": "object", "required": required,
            "properties": {"alias": {"type": "string", "minLength": 1},
                           "name": {"type": "string", "minLength": 1},
                           "type": {"enum": typ}, "url": url, "gpgkey": url,
                           "enabled": {"type": "boolean"}, "gpgcheck": {"type": "boolean"},
                           "priority": {"type": "integer", "minimum": 1}}}
    return {"properties": {
        "_attributes": {"type": "object", "required": ["repository_system"],
                        "properties": {"repository_system": {"enum": [system]}}},
        "_elements": {"type": "array", "items": item}}}


def test_oneof_merges_stay_within_the_time_budget() -> None:
    # Shaped like a real MaskBench schema (Github_trivial o25751): exact oneOf complements
    # multiply allOf merges; they must see the deadline (this once ran 54 s under a 10 s one).
    schema = {"type": "object", "required": ["_elements"], "oneOf": [
        _repository("zypp", ["yast2", "rpm-md", None],
                    ["alias", "name", "url", "type", "enabled", "gpgcheck", "priority"]),
        _repository("yum", ["rpm-md", None],
                    ["alias", "name", "url", "type", "enabled", "gpgcheck", "gpgkey"])]}
    start = time.monotonic()
    with contextlib.suppress(ResourceLimitError, structspec.UnsupportedSchemaError):
        compile_json_schema(schema, VOCAB, extra_properties=True,
                            limits=Limits(max_seconds=1.0))
    assert time.monotonic() - start < 20


def test_input_size_and_table_bytes() -> None:
    schema = {"enum": ["x" * 1000]}
    with pytest.raises(ResourceLimitError, match="max_input_bytes"):
        compile_json_schema(schema, VOCAB, limits=Limits(max_input_bytes=100))
    with pytest.raises(ResourceLimitError, match="max_bytes"):
        compile_json_schema({"type": "string", "pattern": "^[a-z]{40}@[0-9]{30}$"}, VOCAB,
                            limits=Limits(max_bytes=10_000))


def test_limits_are_part_of_the_cache_key() -> None:
    schema = {"type": "string", "pattern": "^(a|b)*a(a|b){9}$"}
    compile_json_schema(schema, VOCAB)  # fine under the defaults, cached
    with pytest.raises(ResourceLimitError):
        compile_json_schema(schema, VOCAB, limits=Limits(max_states=50))


def test_deep_nesting_is_a_resource_error() -> None:
    schema: dict = {"type": "integer"}
    for _ in range(5000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(ResourceLimitError):
        compile_json_schema(schema, VOCAB)


def test_budget_is_per_thread_context() -> None:
    assert active_limits() == Limits()
    with compiling(Limits(max_states=7)):
        assert active_limits().max_states == 7
        with compiling(Limits(max_states=9)):  # nested: the outer budget stays
            assert active_limits().max_states == 7
    assert active_limits() == Limits()


def test_bad_limits_argument() -> None:
    with pytest.raises(TypeError, match="Limits"):
        compile_json_schema({"type": "string"}, VOCAB, limits={"max_states": 3})  # type: ignore[arg-type]


def test_grammar_compilation_takes_limits() -> None:
    from structspec import compile_grammar

    grammar = 'start: WORD\nWORD: /(a|b)*a(a|b){14}/\n'
    with pytest.raises(ResourceLimitError):
        compile_grammar(grammar, VOCAB, limits=Limits(max_states=300))
    with pytest.raises(ResourceLimitError, match="max_input_bytes"):
        compile_grammar('start: "x"\n' + "// padding\n" * 50, VOCAB,
                        limits=Limits(max_input_bytes=100))
    with pytest.raises(TypeError, match="Limits"):
        compile_grammar('start: "x"\n', VOCAB, limits=3)  # type: ignore[arg-type]
