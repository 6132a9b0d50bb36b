"""The Python API on a tiny random model: outputs validate, Pydantic instances come back,
bad arguments name themselves."""

from __future__ import annotations

import json
from typing import ClassVar, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field, field_validator

from structspec.api import Generator, Result
from structspec.errors import GenerationError, SchemaError, UnsupportedSchemaError

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green"]},
    },
    "required": ["name", "ok", "color"],
    "additionalProperties": False,
}


class Item(BaseModel):
    label: str = Field(max_length=10)
    count: int
    tags: list[Literal["red", "blue"]] = Field(max_length=2)


@pytest.fixture(scope="module")
def gen(tiny_model) -> Generator:
    """A Generator over a private copy: it packs the linear layers of its model in place."""
    import copy

    from structspec.models import LoadedModel

    own = LoadedModel(copy.deepcopy(tiny_model.model), tiny_model.tokenizer, tiny_model.name,
                      tiny_model.eos_token_ids)
    return Generator(own)


@pytest.mark.parametrize("seed", range(4))
def test_outputs_validate_against_the_schema(gen, seed):
    result = gen.run("Make an object.", schema=SCHEMA, temperature=1.0, seed=seed,
                     max_new_tokens=200)
    assert isinstance(result, Result)
    jsonschema.validate(result.value, SCHEMA)
    assert json.loads(result.text) == result.value
    assert result.stats.new_tokens == len(result.token_ids) > 0
    assert result.stats.forward_passes >= 1 and result.stats.seconds > 0


def test_schema_as_json_text(gen):
    value = gen.generate("Yes or no?", schema='{"type": "boolean"}', max_new_tokens=5)
    assert isinstance(value, bool)


def test_pydantic_model_returns_an_instance(gen):
    item = gen.generate("An item please.", schema=Item, temperature=0.8, seed=1,
                        max_new_tokens=300)
    assert isinstance(item, Item)
    assert len(item.tags) <= 2 and len(item.label) <= 10


class Picky(BaseModel):
    """A model whose own validator goes beyond its JSON Schema."""

    word: Literal["yes", "no"]
    refusals: ClassVar[list[int]] = [0]  # how many more outputs the validator refuses

    @field_validator("word")
    @classmethod
    def _refuse_some(cls, value: str) -> str:
        if cls.refusals[0] > 0:
            cls.refusals[0] -= 1
            raise ValueError("not today")
        return value


def test_a_models_own_validators_are_retried_not_raised(gen):
    Picky.refusals[0] = 1
    result = gen.run("Yes or no?", schema=Picky, seed=3, max_new_tokens=20)
    assert isinstance(result.value, Picky) and result.attempts == 2
    Picky.refusals[0] = 10
    with pytest.raises(GenerationError, match=r"Picky refused it: Value error, not today "
                                              r"\(at instance /word") as info:
        gen.run("Yes or no?", schema=Picky, seed=3, max_new_tokens=20, max_retries=2)
    assert "after 3 attempts" in str(info.value)
    assert Picky.refusals[0] == 7


def test_regex_and_free_text(gen):
    assert gen.generate("Digits:", regex=r"[0-9]{3}") .isdigit()
    text = gen.generate("Say something.", max_new_tokens=5, temperature=1.0, seed=0)
    assert isinstance(text, str)


def test_raw_prompt_skips_the_template(gen):
    ids = gen.prompt_ids("hello", chat=False)
    assert ids == gen.loaded.tokenizer.encode("hello", add_special_tokens=False)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    templated = gen.prompt_ids("hello", schema=schema)
    assert len(templated) > len(ids)
    text = gen.loaded.tokenizer.decode(templated)
    # The schema goes in the system message, before the request (BFCL: twice the calls right),
    # as a typed template by default.
    assert text.index('"city"?: string') < text.index("hello")
    as_json = gen.loaded.tokenizer.decode(gen.prompt_ids("hello", schema=schema,
                                                         schema_style="json"))
    assert as_json.index('{"type":"object"') < as_json.index("hello")
    assert "JSON Schema" in as_json.split("hello")[0]
    custom = gen.loaded.tokenizer.decode(
        gen.prompt_ids("hello", schema=schema, system="Be brief."))
    assert custom.index("Be brief.") < custom.index('"city"') < custom.index("hello")
    with pytest.raises(ValueError, match="schema_style"):
        gen.prompt_ids("hello", schema=schema, schema_style="yaml")
    with pytest.raises(ValueError, match="schema_in_prompt"):
        gen.run("hello", schema=schema, schema_in_prompt="yaml")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -5}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 2.0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_retries": -1}, "max_retries"),
        ({"regex": "a+"}, "schema or regex"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(gen, kwargs, name):
    args = {"prompt": "x", "schema": SCHEMA, **kwargs}
    with pytest.raises(ValueError, match=name):
        gen.run(args.pop("prompt"), **args)


def test_invalid_schema_has_a_pointer(gen):
    with pytest.raises(SchemaError) as info:
        gen.run("x", schema={"type": "object", "properties": {"a": {"type": "nope"}}})
    assert info.value.pointer.startswith("/properties/a")


def test_unsupported_keyword_is_refused_not_ignored(gen):
    with pytest.raises(UnsupportedSchemaError) as info:
        gen.run("x", schema={"type": "number", "multipleOf": 0.0000123457})
    assert info.value.keyword == "multipleOf"


def test_token_limit_raises_generation_error(gen):
    with pytest.raises(GenerationError) as info:
        gen.run("x", schema=SCHEMA, max_new_tokens=3)
    assert info.value.text and len(info.value.token_ids) == 3


def test_speculation_on_and_off_give_the_same_greedy_output(gen):
    from structspec.spec import SpecConfig

    plain = gen.run("Make an object.", schema=SCHEMA, max_new_tokens=200, speculative=False)
    fast = gen.run("Make an object.", schema=SCHEMA, max_new_tokens=200)
    tuned = gen.run("Make an object.", schema=SCHEMA, max_new_tokens=200,
                    speculative=SpecConfig(max_nodes=4, draft_length=8))
    assert plain.token_ids == fast.token_ids == tuned.token_ids
    assert fast.stats.forward_passes <= plain.stats.forward_passes
    with pytest.raises(ValueError, match="speculative"):
        gen.run("x", schema=SCHEMA, speculative="yes")


def test_acceptance_statistics_carry_over_between_requests(gen):
    gen.run("x", schema=SCHEMA, max_new_tokens=60)
    first = gen._acceptance["JsonSchemaConstraint"]
    seen = sum(p for p, _ in first.counts.values()) + first.chain[0]
    gen.run("y", schema=SCHEMA, max_new_tokens=60)
    second = gen._acceptance["JsonSchemaConstraint"]
    assert second is not first  # each request works on its own copy
    assert sum(p for p, _ in second.counts.values()) + second.chain[0] > 0 and seen > 0


def test_totals_add_up_over_requests(tiny_model):
    """``Generator.totals``: every attempt's decode and every request counted, speculative
    figures apart, validation failures and failed requests included."""
    import copy
    import warnings

    from structspec.models import LoadedModel

    own = LoadedModel(copy.deepcopy(tiny_model.model), tiny_model.tokenizer, tiny_model.name,
                      tiny_model.eos_token_ids)
    gen = Generator(own)
    a = gen.run("Make an object.", schema=SCHEMA, temperature=1.0, seed=0, max_new_tokens=200)
    b = gen.run("Digits:", regex=r"[0-9]{3}", speculative=False)
    t = gen.totals.as_dict()
    assert (t["requests"], t["failed_requests"], t["decodes"]) == (2, 0, 2)
    assert t["new_tokens"] == a.stats.new_tokens + b.stats.new_tokens
    assert t["forward_passes"] == a.stats.forward_passes + b.stats.forward_passes
    spec = t["speculative"]
    assert spec["decodes"] == 1 and spec["new_tokens"] == a.stats.new_tokens
    assert spec["draft_nodes"] == a.stats.draft_nodes
    assert spec["per_drafter"] == {k: list(v) for k, v in sorted(a.stats.per_drafter.items())}
    assert spec["mean_accepted_length"] == pytest.approx(a.stats.mean_accepted_length, abs=1e-3)

    # The back-reference is dropped in lenient mode, and it needs two characters where the
    # length allows one: each attempt fails validation.
    never = {"type": "string", "maxLength": 1, "pattern": "^(a)\\1$"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(GenerationError, match="3 attempts"):
            gen.run("Two ones.", schema=never, lenient=True, max_retries=2, seed=0)
    with pytest.raises(GenerationError, match="max_new_tokens"):  # too short to finish
        gen.run("Make an object.", schema=SCHEMA, max_new_tokens=2)
    t = gen.totals.as_dict()
    assert (t["requests"], t["failed_requests"], t["decodes"]) == (4, 2, 6)
    assert t["validation_failures"] == 3
    gen.totals.reset()
    assert gen.totals.as_dict()["requests"] == 0 and "speculative" not in gen.totals.as_dict()


def test_the_readmes_property_based_strategy(gen):
    """README, "Property-based tests": a seed drawn by Hypothesis maps to a schema-valid
    object, the same one again for the same seed (a failing example replays)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    order = {"type": "object", "additionalProperties": False, "required": ["sku", "quantity"],
             "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                            "gift": {"type": "boolean"}}}

    def draw(seed: int):
        return gen.run("An order in the shop's catalogue.", schema=order, temperature=1.0,
                       seed=seed, max_new_tokens=60).value

    seen = []

    @settings(max_examples=5, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(0, 2**31 - 1).map(lambda seed: (seed, draw(seed))))
    def check(pair):
        seed, value = pair
        jsonschema.validate(value, order)
        assert draw(seed) == value
        seen.append(value)

    check()
    assert seen
