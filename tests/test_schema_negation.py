"""``not``, ``if``/``then``/``else`` and overlapping ``oneOf``: exact, through complements."""

from __future__ import annotations

import functools
import json

import jsonschema
import pytest
from conftest import make_byte_vocab
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from structspec import SchemaError, UnsupportedSchemaError, compile_json_schema
from structspec.automata import accepts
from structspec.automata.schema_negation import NON_INTEGER, NegationError, negate, public_schema

#: The texts these tests drive through the constraint are compact JSON (``{"a":1}``), as the
#: suites write their instances: compile in that policy, not the default (spaced).
compile_json_schema = functools.partial(compile_json_schema, whitespace="compact")

VOCAB = make_byte_vocab([])


def ok(constraint, text: str) -> bool:
    return accepts(constraint, [b + 1 for b in text.encode()] + [0])


CASES = [
    ({"type": "string", "not": {"const": "j"}},
     ['"b"', '""', '"\\u0041"'], ['"j"', '"\\u006a"', '"\\u006A"']),
    ({"type": "string", "not": {"enum": ["a/b", "\n"]}},
     ['"a"', '"ab"'], ['"a/b"', '"a\\/b"', '"\\n"', '"\\u000a"', '"\\u000A"']),
    ({"not": {"enum": ["x", 1, None]}}, ['"y"', "2", "true", "1.5"], ['"x"', "1", "1.0", "null"]),
    ({"type": "integer", "not": {"enum": [0, 3]}}, ["1", "-3", "30"], ["0", "-0", "3"]),
    ({"type": "number", "not": {"const": 2.5}}, ["2.4", "25", "2.55"], ["2.5", "2.50"]),
    ({"type": "boolean", "not": {"const": True}}, ["false"], ["true"]),
    ({"not": {"type": "string"}}, ["1", "null", "{}", "[]"], ['"s"']),
    ({"not": {"type": "integer"}}, ["1.5", '"s"', "null"], ["1", "-7"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "not": {"required": ["a", "b"]}}, ['{"a":1}', "{}", '{"b":2}'], ['{"a":1,"b":2}']),
    ({"type": "object", "properties": {"kind": {"enum": ["x", "y"]}, "n": {"type": "integer"}},
      "required": ["kind"], "if": {"properties": {"kind": {"const": "x"}}},
      "then": {"required": ["n"]}, "else": {"not": {"required": ["n"]}}},
     ['{"kind":"x","n":1}', '{"kind":"y"}'], ['{"kind":"x"}', '{"kind":"y","n":1}']),
    ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 10}]},
     ["1", "10.5", "5"], ["10", "12"]),
    ({"type": "number", "not": {"minimum": 3}}, ["2.5", "-1"], ["3", "4"]),
    ({"type": "string", "not": {"maxLength": 2}}, ['"abc"'], ['"ab"', '""']),
    ({"type": "array", "items": {"type": "integer"}, "not": {"minItems": 2}},
     ["[]", "[1]"], ["[1,2]"]),
    ({"if": {"type": "integer"}, "else": {"type": "string"}}, ["1", '"s"'], ["null", "1.5"]),
]


@pytest.mark.parametrize(("schema", "good", "bad"), CASES,
                         ids=[json.dumps(c[0])[:50] for c in CASES])
def test_golden(schema, good, bad) -> None:
    c = compile_json_schema(schema, VOCAB, extra_properties=True, max_array_items=None)
    for text in good:
        assert jsonschema.validate(json.loads(text), schema) is None
        assert ok(c, text), text
    for text in bad:
        assert not ok(c, text), text


def test_what_has_no_complement_is_refused_with_its_pointer() -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        compile_json_schema({"properties": {"a": {"not": {"format": "email"}}}}, VOCAB)
    assert info.value.keyword == "not" and info.value.pointer == "/properties/a"
    with pytest.raises(NegationError):
        negate({"uniqueItems": True}, lambda s: s)


# -- property: negate(S) accepts exactly what S rejects, checked by jsonschema ------------------

_LEAF = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(
        ["null", "boolean", "integer", "number", "string", "array", "object"])}),
    st.fixed_dictionaries({"const": st.one_of(st.none(), st.booleans(), st.integers(-3, 3),
                                              st.sampled_from(["a", "b", ""]))}),
    st.fixed_dictionaries({"minLength": st.integers(0, 3)}),
    st.fixed_dictionaries({"maxLength": st.integers(0, 3)}),
    st.fixed_dictionaries({"minimum": st.integers(-2, 2)}),
    st.fixed_dictionaries({"exclusiveMaximum": st.integers(-2, 2)}),
    st.fixed_dictionaries({"minItems": st.integers(0, 2)}),
    st.fixed_dictionaries({"required": st.lists(st.sampled_from("ab"), min_size=1,
                                                max_size=2, unique=True)}),
    st.fixed_dictionaries({"multipleOf": st.sampled_from([1, 2, 3])}),
    st.fixed_dictionaries({"dependentRequired": st.fixed_dictionaries(
        {"a": st.lists(st.sampled_from("bc"), max_size=2, unique=True)})}),
    st.booleans(),
)
SCHEMAS = st.recursive(_LEAF, lambda inner: st.one_of(
    st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"not": inner}),
    st.fixed_dictionaries({"properties": st.fixed_dictionaries({"a": inner})}),
    st.fixed_dictionaries({"oneOf": st.lists(inner, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"items": inner}),
    st.fixed_dictionaries({"contains": inner}),
    st.fixed_dictionaries({"contains": inner, "minContains": st.integers(0, 2),
                           "maxContains": st.integers(0, 2)}),
    st.fixed_dictionaries({"if": inner, "then": inner, "else": inner}),
    st.fixed_dictionaries({"dependentSchemas": st.fixed_dictionaries({"a": inner})}),
    st.fixed_dictionaries({"properties": st.fixed_dictionaries({"a": inner}),
                           "additionalProperties": inner}),
), max_leaves=5)
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-4, 4), st.sampled_from([0.5, -1.5, 2.0]),
              st.sampled_from(["", "a", "b", "abc", "abcd"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from("abc"), inner, max_size=3)),
    max_leaves=6)


def _non_integer(validator, value, instance, schema):
    """The internal keyword's meaning, for the reference validator."""
    if value is True and validator.is_type(instance, "number") and float(instance).is_integer():
        yield jsonschema.ValidationError(f"{instance!r} is an integer")


Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                         {NON_INTEGER: _non_integer})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCHEMAS, st.lists(VALUES, min_size=1, max_size=8))
@example({"type": "integer"}, [1, 1.5, "x"])
@example({"not": {"required": ["a"]}}, [{"a": 1}, {}, 3])
def test_negation_is_the_complement(schema, values) -> None:
    negated = public_schema(negate(schema, lambda s: s))  # internal keywords spelled out
    for value in values:
        assert Validator(negated).is_valid(value) != Validator(schema).is_valid(value), \
            (negated, value)


# -- contains with its bounds, merged by allOf and by complements -------------------------

_ITEM_SCHEMAS = [{"type": "integer", "minimum": 100}, {"type": "string"}, {"type": "array"},
                 {"type": "integer"}, {"const": 1}]
_ITEM_TEXTS = ["110", "1", '"a"', "[]", "5"]


@st.composite
def _counted_arrays(draw: st.DrawFn) -> dict:
    """An array schema with ``items`` and a ``contains`` counted within optional bounds."""
    node: dict = {"type": "array"}
    if draw(st.booleans()):
        node["items"] = draw(st.sampled_from(_ITEM_SCHEMAS))
    if draw(st.integers(0, 4)):
        node["contains"] = draw(st.sampled_from(_ITEM_SCHEMAS))
        for bound in ("minContains", "maxContains"):
            if draw(st.booleans()):
                node[bound] = draw(st.integers(0, 2))
    return node


@st.composite
def _contains_compositions(draw: st.DrawFn) -> dict:
    a, b = draw(_counted_arrays()), draw(_counted_arrays())
    shape = draw(st.sampled_from(["allOf", "oneOf", "not", "anyOf"]))
    if shape == "allOf":
        return {"allOf": [a, b]}
    if shape == "oneOf":
        return {"oneOf": [a, b]}
    if shape == "not":
        return {"type": "array", "not": a, "allOf": [b]}
    return {"anyOf": [a, b], "allOf": [draw(_counted_arrays())]}


_ARRAY_TEXTS = ["[]", *(f"[{a}]" for a in _ITEM_TEXTS),
                *(f"[{a},{b}]" for a in _ITEM_TEXTS for b in _ITEM_TEXTS),
                *(f"[{a},{b},{c}]" for a in _ITEM_TEXTS[:3] for b in _ITEM_TEXTS[:3]
                  for c in _ITEM_TEXTS[:3])]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_contains_compositions())
@example({"allOf": [{"type": "array", "contains": {"type": "array"}},
                    {"type": "array", "contains": {"type": "integer"}, "minContains": 0}]})
@example({"type": "array", "oneOf": [
    {"allOf": [{"items": {"type": "array", "contains": {"const": 1}}},
               {"contains": {"type": "array", "contains": {"const": 1}}}]},
    {"allOf": [{"items": {"type": "array", "items": {"const": 1}}},
               {"contains": {"type": "array", "items": {"const": 1}}}]}]})
def test_contains_compositions_are_exact_or_refused(schema) -> None:
    """``contains`` counts the items matching its own schema within its own bounds
    (``minContains`` 1 where absent), so merging it with another part's ``contains`` or a
    complement's count bounds must keep each count apart: every schema built from counted
    arrays either compiles to exactly the arrays ``jsonschema`` accepts (over every array of
    up to three items drawn from five values) or is refused. Before, ``{contains: X}`` and
    the complement ``{contains: X, maxContains: 0}`` merged into "no X at all", and
    ``oneOf`` of such branches let invalid arrays through."""
    validator = jsonschema.Draft202012Validator(schema)
    try:
        c = compile_json_schema(schema, VOCAB, extra_properties=True, max_array_items=None)
    except UnsupportedSchemaError:
        return
    except SchemaError as exc:  # "accepts no value": then no array may be valid
        assert "accepts no value" in str(exc)
        assert not any(validator.is_valid(json.loads(t)) for t in _ARRAY_TEXTS), schema
        return
    for text in _ARRAY_TEXTS:
        assert ok(c, text) == validator.is_valid(json.loads(text)), (text, schema)


@st.composite
def _draft4_bound_parts(draw: st.DrawFn) -> dict:
    """A draft-4 part with an optional ``minimum``/``maximum``, each optionally exclusive
    by the boolean flag of that draft."""
    part: dict = {}
    for key, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if draw(st.booleans()):
            part[key] = draw(st.integers(0, 10))
            if draw(st.booleans()):
                part[flag] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:  # a complement: its bounds come back in the numeric form
        return {"not": part}
    return part


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_draft4_bound_parts(), _draft4_bound_parts())
@example({"minimum": 5, "exclusiveMinimum": True}, {"minimum": 10})
@example({"maximum": 20, "exclusiveMaximum": True}, {"maximum": 10})
@example({"maximum": 10, "exclusiveMaximum": True}, {"not": {"minimum": 5}})
@example({"minimum": 2, "exclusiveMinimum": True},
         {"not": {"maximum": 7, "exclusiveMaximum": True}})
def test_draft4_exclusive_flags_stay_with_their_own_bound(a, b) -> None:
    """Draft 4's ``exclusiveMinimum: true`` modifies its own part's ``minimum``: ``allOf``
    of ``> 5`` and ``>= 10`` is ``>= 10`` (before, the flag moved to the merged bound and
    10 was refused)."""
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
              "allOf": [a, b]}
    validator = jsonschema.Draft4Validator(schema)
    texts = [str(n) for n in range(-1, 13)]
    try:
        c = compile_json_schema(schema, VOCAB, extra_properties=True, max_array_items=None)
    except UnsupportedSchemaError:
        return
    except SchemaError:  # "accepts no value": then no integer may be valid
        assert not any(validator.is_valid(int(t)) for t in texts), schema
        return
    for text in texts:
        assert ok(c, text) == validator.is_valid(int(text)), (text, schema)
