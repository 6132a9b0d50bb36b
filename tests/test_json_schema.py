"""The interim JSON Schema compiler: golden tables, soundness and completeness, refusals.

Instances are driven through the constraint token by token, tokenized two ways over a toy
byte vocabulary: greedily (longest token first, so multi-byte pieces such as ``":`` cross
JSON lexemes as real BPE tokens do) and one byte per token.
"""

from __future__ import annotations

import heapq
import itertools
import json
import pickle
import random
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from structspec.automata import JsonSchemaConstraint, accepts, compile_json_schema, walk
from structspec.automata.cache import CompileCache
from structspec.automata.json_schema import LenientSchemaWarning, pattern_regex
from structspec.errors import ResourceLimitError, SchemaError, UnsupportedSchemaError
from structspec.vocab import Vocabulary

SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]

# -- tokenization helpers ------------------------------------------------------------------------


def tokenize_greedy(vocab: Vocabulary, text: str) -> list[int]:
    """Longest-match tokenization of ``text`` with the (toy) vocabulary's text tokens."""
    by_bytes = {t: i for i, t in enumerate(vocab.tokens) if t and i not in vocab.special_token_ids}
    longest = max(map(len, by_bytes))
    data, ids, i = text.encode(), [], 0
    while i < len(data):
        for n in range(min(longest, len(data) - i), 0, -1):
            if data[i:i + n] in by_bytes:
                ids.append(by_bytes[data[i:i + n]])
                i += n
                break
        else:
            raise AssertionError(f"byte {data[i]} not in vocabulary")
    return ids


def tokenize_bytes(vocab: Vocabulary, text: str) -> list[int]:
    """One token per byte (the toy vocabulary has every single byte)."""
    return [vocab.ids_for(bytes([b]))[0] for b in text.encode()]


def accepted(constraint: JsonSchemaConstraint, text: str) -> bool:
    """Whether both tokenizations of ``text`` are complete outputs; they must agree."""
    vocab = constraint.vocab
    greedy = accepts(constraint, tokenize_greedy(vocab, text))
    single = accepts(constraint, tokenize_bytes(vocab, text))
    assert greedy == single, f"tokenizations disagree on {text!r}: {greedy} vs {single}"
    return greedy


def compile_(schema: Any, vocab: Vocabulary, **kw: Any) -> JsonSchemaConstraint:
    """Compile without the generation-time array cap (the tables test what validates), for
    compact JSON (the tables' texts are compact; the default policy is spaced)."""
    kw.setdefault("max_array_items", None)
    kw.setdefault("whitespace", "compact")
    return compile_json_schema(schema, vocab, **kw)


# -- golden tables ---------------------------------------------------------------------------------
# (name, schema, accept, reject, narrowed): ``reject`` are invalid instances; ``narrowed`` are
# valid instances the interim compiler does not generate (documented in docs/json_schema.md).

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string", "format": "email"},
    },
    "required": ["name", "age"],
}

GOLDEN: list[tuple[str, Any, list[str], list[str], list[str]]] = [
    ("true", True, ["1", '"x"', "null", '{"a":[1,{"b":false}]}', "[]"], ["", "{", "nul"], []),
    ("empty", {}, ["true", '{"a":"b"}', "[1,2]"], ["[1,]", "tru"], []),
    ("string", {"type": "string"}, ['""', '"héllo"', '"a\\"b"', '"\\n\\\\"'],
     ['"a', "1", '"a\nb"', '"\\x"', '"\\ud800"'], []),
    ("string-unicode-escape", {"type": "string"}, ['"\\u0041"', '"\\u00e9x"'], ['"\\u00"'],
     []),
    ("integer", {"type": "integer"}, ["0", "-7", "120"], ["1.5", "01", "+1", '"1"'], ["1.0"]),
    ("number", {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
     ['{"x":1}', '{"x":-2.5}', '{"x":1.5e+10}', '{"x":0.25}', '{"x":1e5}'],
     ['{"x":.5}', '{"x":1.}'], []),
    ("boolean", {"type": "boolean"}, ["true", "false"], ["1", "True"], []),
    ("null", {"type": "null"}, ["null"], ["0", '""'], []),
    ("type-list", {"type": ["string", "null"], "maxLength": 2}, ["null", '"ab"'],
     ['"abc"', "1"], []),
    ("required-optional", PERSON,
     ['{"name":"Ana","age":31}', '{"name":"Ana","age":31,"email":"ana@example.org"}'],
     ['{"name":"Ana"}', '{"age":31}', '{"name":"Ana","age":"31"}',
      '{"name":"Ana","age":31,"email":"not-an-email"}'],
     ['{"age":31,"name":"Ana"}', '{"name":"Ana","age":31,"extra":1}']),
    ("all-optional", {"type": "object", "properties": {"a": {"type": "integer"},
                                                       "b": {"type": "boolean"}}},
     ["{}", '{"a":1}', '{"b":true}', '{"a":1,"b":false}'], ['{"a":true}', '{"a":1,}'],
     ['{"b":true,"a":1}']),
    ("additional-false", {"type": "object", "properties": {"a": {"type": "integer"}},
                          "additionalProperties": False},
     ["{}", '{"a":1}'], ['{"a":1,"b":2}'], []),
    ("additional-schema", {"type": "object", "additionalProperties": {"type": "integer"}},
     ["{}", '{"a":1}', '{"a":1,"b":-2}'], ['{"a":"x"}', '{"a":1,}'], []),
    ("no-properties-allowed", {"type": "object", "additionalProperties": False},
     ["{}"], ['{"a":1}'], []),
    ("required-without-properties", {"type": "object", "required": ["k"]},
     ['{"k":1}', '{"k":{"a":null}}'], ["{}"], ['{"k":1,"j":2}']),
    ("nested-any", {"type": "object", "properties": {"k": {}}, "required": ["k"]},
     ['{"k":null}', '{"k":[1,"a"]}', '{"k":{"a":{}}}'], ["null", '{"k":true', '{"k":}'], []),
    ("items", {"type": "array", "items": {"type": "integer"}},
     ["[]", "[1]", "[1,2,3]"], ["[1,]", '["a"]', "[1 2]"], []),
    ("min-max-items", {"type": "array", "items": {"type": "boolean"}, "minItems": 1,
                       "maxItems": 2},
     ["[true]", "[true,false]"], ["[]", "[true,true,true]"], []),
    ("prefix-items", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                      "items": False},
     ['[1,"a"]', "[1]", "[]"], ['["a",1]', '[1,"a",2]'], []),
    ("prefix-items-then-items", {"prefixItems": [{"type": "integer"}],
                                 "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
     ["[1,true]", "[1,true,false]"], ["[1]", "[1,2]", "[1,true,true,true]"], []),
    ("tuple-draft7", {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                      "items": [{"type": "null"}, {"type": "boolean"}]},
     ["[null,true]", "[null]", "[null,true,1]"], ["[true,null]"], []),
    ("enum", {"enum": ["red", "green", 3, None, {"x": [1, "a"]}]},
     ['"red"', '"green"', "3", "null", '{"x":[1,"a"]}'], ['"blue"', "4", '{"x":[1]}'],
     ["3.0"]),
    ("enum-filtered-by-type", {"type": "string", "enum": ["a", 1, "b"]},
     ['"a"', '"b"'], ["1"], []),
    ("const", {"const": {"a": [True, None]}}, ['{"a":[true,null]}'], ['{"a":[true]}'], []),
    ("string-escapes-in-enum", {"enum": ['a"b', "c\\d", "e\nf", "ü"]},
     ['"a\\"b"', '"c\\\\d"', '"e\\nf"', '"ü"'], ['"a"b"', '"e\nf"'], []),
    ("anyOf", {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer"}]},
     ['"a"', "12"], ['"ab"', "null"], []),
    ("oneOf-disjoint-types", {"oneOf": [{"type": "string"}, {"type": "boolean"}]},
     ['"x"', "true"], ["1"], []),
    ("oneOf-tagged", {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
         "required": ["kind", "x"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
         "required": ["kind", "y"]}]},
     ['{"kind":"a","x":1}', '{"kind":"b","y":"z"}'], ['{"kind":"a","y":"z"}'], []),
    ("oneOf-pydantic-discriminated", {
        "$defs": {
            "Cat": {"type": "object", "title": "Cat", "required": ["pet_type", "meows"],
                    "properties": {"pet_type": {"const": "cat", "type": "string"},
                                   "meows": {"type": "integer"}}},
            "Dog": {"type": "object", "title": "Dog", "required": ["pet_type", "barks"],
                    "properties": {"pet_type": {"const": "dog", "type": "string"},
                                   "barks": {"type": "number"}}}},
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
        "discriminator": {"propertyName": "pet_type",
                          "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}},
     ['{"pet_type":"cat","meows":3}', '{"pet_type":"dog","barks":1.5}'],
     ['{"pet_type":"dog","meows":3}', '{"pet_type":"cat"}'], []),
    ("ref", {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}},
                                 "required": ["x"]}},
             "type": "array", "items": {"$ref": "#/$defs/point"}},
     ['[{"x":1},{"x":2}]', "[]"], ['[{"y":1}]', '[{"x":"1"}]'], []),
    ("ref-definitions", {"definitions": {"s": {"type": "string"}},
                         "properties": {"a": {"$ref": "#/definitions/s"}}, "required": ["a"]},
     ['{"a":"x"}'], ['{"a":1}'], []),
    ("min-max-length", {"type": "string", "minLength": 2, "maxLength": 3},
     ['"ab"', '"abc"', '"é😀"', '"\\n\\t"'], ['"a"', '"abcd"'], []),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
     ['"AB-123"'], ['"ab-123"', '"AB-12"', '"AB-١٢٣"'], []),
    ("pattern-dot", {"type": "array", "items": {"type": "string", "pattern": "^a.c$"}},
     ['["abc","a\\"c","a\\\\c","a c"]'], ['["a"c"]', '["a\\nc"]', '["ac"]'], []),
    ("pattern-top-level", {"type": "string", "pattern": "^a.c$"},
     ['"abc"', '"a\\\\c"', '"a\\"c"'], ['"a"c"', '"a\\nc"'], []),
    ("pattern-unanchored", {"type": "string", "pattern": "ab+"},
     ['"ab"', '"abbb"', '"xaby"'], ['"a"', '"xay"'], []),
    ("integer-bounds", {"type": "integer", "minimum": -5, "exclusiveMaximum": 100},
     ["-5", "0", "99", "42"], ["-6", "100", "-0"], []),
    ("integer-multiple", {"type": "integer", "minimum": 0, "maximum": 20, "multipleOf": 5},
     ["0", "5", "20"], ["3", "25"], []),
    ("number-bounds", {"type": "array", "items": {"type": "number", "minimum": 0,
                                                  "maximum": 1}},
     ["[0,1,0.5,1.0,0.999]"], ["[1.5]", "[-0.1]", "[2]", "[1.01]"], ["[1e-1]"]),
    ("number-exclusive", {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0}},
     ["[0.1,3,1000.5]"], ["[0]", "[0.0]", "[-1]"], []),
    ("format-date", {"type": "string", "format": "date"},
     ['"2024-02-29"', '"1999-12-31"'], ['"2023-02-29"', '"2023-04-31"', '"2023-13-01"',
                                        '"0000-01-01"', '"2023-1-01"'], []),
    ("format-time", {"type": "string", "format": "time"},
     ['"12:30:00Z"', '"23:59:59.123+02:00"'], ['"24:00:00Z"', '"12:30:00"'], ['"12:30:00z"']),
    ("format-date-time", {"type": "string", "format": "date-time"},
     ['"2024-02-29T12:00:00Z"', '"2023-01-01T00:00:00.5-05:30"'],
     ['"2024-02-29T12:00:00"', '"2023-02-29T12:00:00Z"', '"2023-01-01 00:00:00Z"'], []),
    ("format-uuid", {"type": "string", "format": "uuid"},
     ['"123e4567-e89b-12d3-a456-426614174000"'], ['"123e4567e89b12d3a456426614174000"'],
     ['"123E4567-E89B-12D3-A456-426614174000"']),
    ("format-email", {"type": "string", "format": "email"},
     ['"a.b@example.com"', '"x+y@sub.example.org"'], ['"ab"', '"a@"', '"a b@example.com"'],
     ['"a@localhost"']),
    ("format-uri", {"type": "string", "format": "uri"},
     ['"https://example.com"', '"http://a.b:80/p/q?x=1&y=%20#frag"'],
     ['"example.com"', '"https://exa mple.com"', '"https://a.com/\\"x"'], ['"urn:isbn:1"']),
    ("format-ipv4", {"type": "string", "format": "ipv4"},
     ['"192.168.0.1"', '"0.0.0.0"'], ['"256.1.1.1"', '"01.1.1.1"', '"1.1.1"'], []),
    ("draft4-exclusive", {"$schema": "http://json-schema.org/draft-04/schema#",
                          "type": "integer", "minimum": 0, "exclusiveMinimum": True,
                          "maximum": 3},
     ["1", "3"], ["0", "4"], []),
    ("max-properties-narrows", {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}, "maxProperties": 1},
     ["{}", '{"a":1}'], ['{"a":1,"b":2}'], ['{"b":2}']),
    ("dependent-required", {"type": "object", "properties": {"a": {}, "b": {}, "c": {}},
                            "dependentRequired": {"a": ["c"]}, "maxProperties": 2},
     ['{"c":1}', '{"a":1,"c":2}'], ['{"a":1}', '{"a":1,"b":2,"c":3}'], ["{}", '{"b":1}']),
    ("property-names", {"type": "object", "properties": {"ab": {"type": "integer"},
                                                         "b": {"type": "integer"}},
                        "propertyNames": {"pattern": "^a"}},
     ["{}", '{"ab":1}'], ['{"b":1}'], []),
    ("pattern-properties-required", {"type": "object", "properties": {"x": {"type": "integer"}},
                                     "patternProperties": {"^y": {"type": "string"}},
                                     "required": ["y1"]},
     ['{"y1":"s"}', '{"x":1,"y1":"s"}'], ['{"y1":1}', '{"x":1}'], ['{"y1":"s","x":1}']),
    ("oneOf-tagged-enum", {"type": "array", "items": {"oneOf": [
        {"type": "object", "properties": {"t": {"enum": ["a", "b"]}, "v": {"type": "integer"}},
         "required": ["t", "v"]},
        {"type": "object", "properties": {"t": {"const": "c"}}, "required": ["t"]}]}},
     ['[{"t":"a","v":1},{"t":"c"}]'], ['[{"t":"c","v":1}]', '[{"t":"a"}]'], []),
    ("type-list-keywords", {"type": ["integer", "string", "null"], "maxLength": 2,
                            "minimum": 5, "maximum": 9},
     ["5", "9", '"ab"', "null"], ["4", "10", '"abc"'], []),
    ("ref-chain", {"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"},
                                   "maxItems": 2},
                             "b": {"type": "object", "properties": {"q": {"$ref": "#/$defs/c"}}},
                             "c": {"enum": [1, 2]}},
                   "$ref": "#/$defs/a"},
     ['[{"q":1},{}]'], ['[{"q":3}]', "[{},{},{}]"], []),
    ("min-properties-one", {"type": "object", "minProperties": 1,
                            "additionalProperties": {"type": "boolean"}},
     ['{"a":true}', '{"a":true,"b":false}'], ["{}", '{"a":1}'], []),
    ("unevaluated-properties", {"type": "object", "properties": {"a": {"type": "integer"}},
                                "unevaluatedProperties": False, "required": ["a"]},
     ['{"a":1}'], ['{"a":1,"b":2}', "{}"], []),
    ("long-max-length", {"type": "object", "properties": {"t": {
        "type": "string", "maxLength": 500}}},
     ['{"t":"' + "x" * 500 + '"}'], ['{"t":"' + "x" * 501 + '"}'], []),
    ("top-level-string-with-lengths", {"type": "string", "maxLength": 5},
     ['"abc"', '"a\\b"', '"a\\"b"'], ['"abcdef"'], []),
    ("pattern-and-lengths", {"properties": {"a": {"type": "string", "pattern": "^a+$",
                                                  "minLength": 2}}},
     ['{"a":"aa"}', '{"a":"aaaa"}'], ['{"a":"a"}', '{"a":"ab"}'], []),
    ("format-and-length", {"type": "string", "format": "date", "maxLength": 10},
     ['"2024-02-29"'], ['"2023-02-29"', '"2024-2-1"'], []),
    ("long-min-length", {"type": "string", "minLength": 300},
     ['"' + "y" * 300 + '"'], ['"' + "y" * 299 + '"'], []),
    ("recursive-ref", {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}}, "required": ["v"]}},
        "$ref": "#/$defs/node"},
     ['{"v":1}', '{"v":1,"next":{"v":2,"next":{"v":3,"next":{"v":4}}}}'],
     ['{"v":1,"next":{}}', '{"next":{"v":1}}'], []),
    ("recursive-root", {"type": "array", "items": {"$ref": "#"}},
     ["[]", "[[],[[[]]]]"], ["[1]", "[[],]"], []),
    ("annotations", {"title": "T", "description": "d", "examples": [1], "default": 0,
                     "$comment": "c", "deprecated": False, "x-vendor": 1, "type": "integer"},
     ["1"], ['"a"'], []),
]


@pytest.mark.parametrize(("name", "schema", "accept", "reject", "narrowed"), GOLDEN,
                         ids=[row[0] for row in GOLDEN])
def test_golden(byte_vocab, name, schema, accept, reject, narrowed):
    constraint = compile_(schema, byte_vocab)
    assert constraint.exact
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER) \
        if "$schema" not in json.dumps(schema) else constraint.validator
    for text in accept:
        assert validator.is_valid(json.loads(text)), f"table error: {text} is invalid"
        assert accepted(constraint, text), f"{name}: should accept {text}"
    for text in reject:
        assert not accepted(constraint, text), f"{name}: should reject {text}"
    for text in narrowed:
        assert not accepted(constraint, text), f"{name}: narrowing changed for {text}"


def test_a_pydantic_model_compiles_as_its_json_schema(byte_vocab):
    """``compile_json_schema`` takes a Pydantic model class as ``Generator.run`` does: the
    constraint of its ``model_json_schema()`` (it had failed as "not JSON-serializable")."""
    from pydantic import BaseModel, Field

    class Point(BaseModel):
        x: int
        label: str = Field(max_length=3)

    constraint = compile_(Point, byte_vocab)
    assert constraint.schema == Point.model_json_schema()
    assert accepted(constraint, '{"x":-4,"label":"abc"}')
    assert not accepted(constraint, '{"x":1.5,"label":"abc"}')
    assert not accepted(constraint, '{"x":1,"label":"abcd"}')
    with pytest.raises(SchemaError, match="JSON-serializable"):
        compile_(int, byte_vocab)  # a class, but not a model


def test_spaced_whitespace_is_the_default_and_writes_json_dumps_separators(byte_vocab):
    """The default policy: one space after each ``,`` and ``:`` and none elsewhere, as
    ``json.dumps`` writes — a const or enum object too — and nothing else."""
    constraint = compile_json_schema(PERSON, byte_vocab, max_array_items=None)
    assert constraint.whitespace == "spaced"
    assert accepted(constraint, '{"name": "Ana", "age": 31}')
    for text in ['{"name":"Ana","age":31}', '{ "name": "Ana", "age": 31}',
                 '{"name": "Ana",  "age": 31}', '{"name" : "Ana", "age": 31}',
                 '{"name": "Ana", "age": 31}\n']:
        assert not accepted(constraint, text), text
    nested = {"type": "object",
              "properties": {"xs": {"type": "array", "items": {"type": "integer"}},
                             "k": {"const": {"a": [1, {"b": None}]}}},
              "required": ["xs", "k"]}
    value = {"xs": [1, 2, 3], "k": {"a": [1, {"b": None}]}}
    spaced = compile_json_schema(nested, byte_vocab)
    assert accepted(spaced, json.dumps(value))  # Python's default separators
    assert not accepted(spaced, json.dumps(value, separators=(",", ":")))
    assert accepted(compile_(nested, byte_vocab), json.dumps(value, separators=(",", ":")))


@given(st.recursive(st.none() | st.booleans() | st.integers(-50, 50) | st.text("ab ,:", max_size=4),
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.text("abc", min_size=1, max_size=3), kids, max_size=3),
                    max_leaves=8))
@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
def test_spaced_accepts_json_dumps_of_any_value(byte_vocab, value):
    """Completeness of the spaced policy: ``json.dumps(v)`` of any JSON value is accepted by
    the schema ``true`` and by the value's own ``const``; its compact form is not (where the
    two differ)."""
    anything = compile_json_schema(True, byte_vocab)
    const = compile_json_schema({"const": value}, byte_vocab)
    text = json.dumps(value, ensure_ascii=False)
    assert accepted(anything, text) and accepted(const, text)
    compact = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if compact != text:
        assert not accepted(anything, compact) and not accepted(const, compact)


def test_golden_with_flexible_whitespace(byte_vocab):
    constraint = compile_(PERSON, byte_vocab, whitespace="flexible")
    assert constraint.whitespace == "flexible"
    for text in ['{"name":"Ana","age":31}', '{ "name" : "Ana",\n  "age": 31 }',
                 '{\n\t"name": "Ana",\r\n\t"age": 31\n}']:
        assert accepted(constraint, text), text
    assert not accepted(constraint, '{"name":"Ana","age":31' + " " * 17 + "}")
    assert accepted(constraint, ' {"name":"Ana","age":31}\n')
    assert not accepted(compile_(PERSON, byte_vocab), '{ "name":"Ana","age":31}')


def test_narrowing_root_number_alternatives(byte_vocab):
    """Alternatives are ordered so a top-level number is not cut by an earlier, shorter one."""
    assert accepted(compile_(True, byte_vocab), "10")
    assert accepted(compile_({"enum": [1, 10, 100]}, byte_vocab), "100")
    assert accepted(compile_({"type": "integer", "minimum": 0, "maximum": 150}, byte_vocab), "150")


def test_formats_the_spec_does_not_define_are_annotations(byte_vocab):
    assert accepted(compile_({"type": "string", "format": "topic"}, byte_vocab), '"any"')


def test_keywords_the_draft_does_not_know_are_annotations(byte_vocab):
    schema = {"type": "integer", "minDigits": 2, "example": 3, "readonly": True}
    assert accepted(compile_(schema, byte_vocab), "7")
    nested_id = {"properties": {"x": {"$id": "http://example.com/x", "type": "string"}}}
    assert accepted(compile_(nested_id, byte_vocab), '{"x":"a"}')  # no $ref to move


def test_literals_with_escapes_and_big_numbers(byte_vocab):
    assert accepted(compile_({"type": "object", "properties": {'a"b': {"type": "integer"}},
                              "required": ['a"b']}, byte_vocab), '{"a\\"b":1}')
    assert accepted(compile_({"enum": [2**70]}, byte_vocab), str(2**70))
    assert accepted(compile_({"const": {"a.b": 1}}, byte_vocab), '{"a.b":1}')


def test_allof_is_an_intersection(byte_vocab):
    schema = {"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}},
                                 "required": ["id"], "additionalProperties": False}},
              "allOf": [{"$ref": "#/$defs/base"},
                        {"properties": {"id": {"minimum": 1}, "name": {"type": "string"}}}]}
    c = compile_(schema, byte_vocab, extra_properties=True)
    assert accepted(c, '{"id":3}')
    for text in ['{"id":0}', '{"id":3,"name":"x"}', "{}"]:
        assert not accepted(c, text), text
    assert accepted(compile_({"allOf": [{"type": "string"}, {"maxLength": 3}]}, byte_vocab),
                    '"abc"')
    assert not accepted(compile_({"allOf": [{"type": "string"}, {"maxLength": 3}]},
                                 byte_vocab), '"abcd"')


def test_siblings_of_ref_and_anyof_apply_to_every_branch(byte_vocab):
    ref = {"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a", "maxLength": 2}
    assert accepted(compile_(ref, byte_vocab), '"ab"')
    assert not accepted(compile_(ref, byte_vocab), '"abc"')
    union = {"anyOf": [{"type": "string"}, {"type": "integer"}], "maxLength": 2}
    c = compile_(union, byte_vocab)
    assert accepted(c, '"ab"') and accepted(c, "12345") and not accepted(c, '"abc"')


def test_decimal_number_bounds(byte_vocab):
    c = compile_({"type": "number", "minimum": 0.5, "exclusiveMaximum": 2.25}, byte_vocab)
    for text, ok in [("0.5", True), ("0.49", False), ("2.2499", True), ("2.25", False),
                     ("1", True), ("-1", False), ("3", False)]:
        assert accepted(c, text) == ok, text


# -- refusals ----------------------------------------------------------------------------------

UNSUPPORTED: list[tuple[Any, str, str]] = [
    ({"type": "integer", "minimum": 0, "multipleOf": 1234567}, "multipleOf", ""),
    ({"type": "number", "multipleOf": 0.0000123457}, "multipleOf", ""),
    ({"type": "string", "format": "idn-hostname"}, "format", ""),
    ({"allOf": [{"unevaluatedProperties": False}, {"properties": {"a": {}}}]}, "allOf", ""),
    ({"type": "string", "pattern": "^(?=a)a$"}, "pattern", ""),
    ({"type": "string", "pattern": "^(a)\\1$"}, "pattern", ""),
    ({"type": "string", "pattern": "a\\bb"}, "pattern", ""),
    ({"type": "string", "pattern": "^a{2000}$"}, "pattern", ""),
    ({"not": {"type": "string", "format": "email"}}, "not", ""),
    ({"if": {"format": "email"}, "then": {"maxLength": 2}}, "if", ""),
    ({"oneOf": [{"type": "string", "format": "email"}, {"maxLength": 2}]}, "oneOf", ""),
    ({"$ref": "https://example.com/schema.json"}, "$ref", ""),
    ({"type": "object", "patternProperties": {p: {"type": "integer"} for p in "abcde"}},
     "patternProperties", ""),
    ({"type": "object", "propertyNames": {"not": {"format": "email"}}}, "not", "/propertyNames"),
    ({"type": "object", "dependentRequired": {"a": list("bcdefghi")}}, "dependentRequired", ""),
    ({"type": "object", "dependentSchemas": {k: {"required": ["x"]} for k in "abcde"}},
     "dependentSchemas", ""),
    ({"type": "object", "minProperties": 2}, "minProperties", ""),
    ({"type": "object", "properties": {"a": {}}, "minProperties": 2}, "minProperties", ""),
    ({"type": "array", "uniqueItems": True}, "uniqueItems", ""),
    ({"type": "array", "contains": {"type": "string", "format": "email"}}, "contains", ""),
    ({"properties": {"a/b": {"items": {"not": {"format": "email"}}}}}, "not",
     "/properties/a~1b/items"),
]


@pytest.mark.parametrize(("schema", "keyword", "pointer"), UNSUPPORTED,
                         ids=[f"{k}@{p or '/'}-{i}" for i, (_, k, p) in enumerate(UNSUPPORTED)])
def test_unsupported_keyword_is_refused(byte_vocab, schema, keyword, pointer):
    with pytest.raises(UnsupportedSchemaError) as info:
        compile_(schema, byte_vocab)
    assert info.value.keyword == keyword
    assert info.value.pointer == pointer
    assert keyword in str(info.value) and "lenient=True" in str(info.value)


@pytest.mark.parametrize(("schema", "keyword", "pointer"), UNSUPPORTED,
                         ids=[f"{k}@{p or '/'}-{i}" for i, (_, k, p) in enumerate(UNSUPPORTED)])
def test_lenient_mode_warns_and_drops(byte_vocab, schema, keyword, pointer):
    with pytest.warns(LenientSchemaWarning) as record:
        constraint = compile_(schema, byte_vocab, lenient=True)
    assert not constraint.exact
    assert (keyword, pointer) in [(k, p) for k, p, _ in constraint.dropped]
    assert any(repr(keyword) in str(w.message) for w in record)
    # the generator still yields JSON; the caller validates it with constraint.validator
    state = constraint.initial
    assert constraint.allowed(state).count() > 0


def test_lenient_warns_again_on_cache_hit(byte_vocab):
    schema = {"type": "integer", "minimum": 0, "multipleOf": 1234567, "title": "cache-hit"}
    with pytest.warns(LenientSchemaWarning):
        first = compile_(schema, byte_vocab, lenient=True)
    with pytest.warns(LenientSchemaWarning):
        second = compile_(schema, byte_vocab, lenient=True)
    assert first is second


def test_lenient_without_unsupported_keywords_is_exact(byte_vocab):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        constraint = compile_(PERSON, byte_vocab, lenient=True)
    assert constraint.exact and constraint.dropped == ()


INVALID: list[tuple[Any, str]] = [
    ({"type": "object", "properties": {"age": {"type": "integre"}}}, "/properties/age"),
    ({"properties": {"age": {"minLength": -1}}}, "/properties/age"),
    ({"type": "array", "items": {"type": "string", "pattern": "(("}}, "/items"),
    ({"anyOf": [{"type": "string"}, {"type": 5}]}, "/anyOf/1"),
    ({"$defs": {"x": {"enum": "notalist"}}}, "/$defs/x"),
    ({"required": "a"}, ""),
    ({"properties": 5}, ""),
    ([1, 2], ""),
]


@pytest.mark.parametrize(("schema", "pointer"), INVALID, ids=[p or "/" for _, p in INVALID])
def test_invalid_schema_names_the_subschema(byte_vocab, schema, pointer):
    with pytest.raises(SchemaError) as info:
        compile_(schema, byte_vocab)
    assert not isinstance(info.value, UnsupportedSchemaError)
    assert info.value.pointer == pointer


def test_schema_as_json_text(byte_vocab):
    constraint = compile_(json.dumps(PERSON), byte_vocab)
    assert accepted(constraint, '{"name":"Ana","age":31}')
    assert constraint.schema == PERSON
    with pytest.raises(SchemaError, match="not valid JSON"):
        compile_("{'type': 'string'}", byte_vocab)


@pytest.mark.parametrize("schema", [
    False,
    {"type": "object", "properties": {"a": False}, "required": ["a"]},
    {"type": "string", "minLength": 3, "maxLength": 2},
    {"type": "integer", "minimum": 5, "maximum": 4},
    {"type": "string", "enum": [1, 2]},
    {"type": "object", "required": ["a"], "additionalProperties": False},
])
def test_unsatisfiable_schema(byte_vocab, schema):
    with pytest.raises(SchemaError, match="accepts no value"):
        compile_(schema, byte_vocab)


def test_unresolvable_ref(byte_vocab):
    with pytest.raises(SchemaError, match="does not resolve") as info:
        compile_({"properties": {"a": {"$ref": "#/$defs/missing"}}}, byte_vocab)
    assert info.value.pointer == "/properties/a"


@pytest.mark.parametrize("whitespace", [2, 4, True, "pretty", None, ""])
def test_bad_whitespace_argument(byte_vocab, whitespace):
    with pytest.raises(ValueError, match="whitespace") as info:
        compile_(PERSON, byte_vocab, whitespace=whitespace)
    if isinstance(whitespace, int) and not isinstance(whitespace, bool):
        assert "not supported yet" in str(info.value)


def test_false_property_is_never_generated(byte_vocab):
    constraint = compile_({"type": "object", "properties": {"a": {"type": "integer"},
                                                            "b": False}}, byte_vocab)
    assert accepted(constraint, '{"a":1}')
    assert not accepted(constraint, '{"a":1,"b":1}')


def test_pattern_regex_is_json_escaped():
    assert pattern_regex("^ab$") == "[a][b]"
    assert "\\\\\"" in pattern_regex('^"$')  # a quote is spelled \"


# -- constraint behaviour --------------------------------------------------------------------------


def test_constraint_protocol_and_attributes(byte_vocab):
    from structspec.automata import Constraint

    constraint = compile_(PERSON, byte_vocab)
    assert isinstance(constraint, Constraint)
    assert constraint.vocab_size == len(byte_vocab)
    assert constraint.forced(constraint.initial) == b'{"name":"'
    assert constraint.validator.is_valid({"name": "a", "age": 1})
    assert not constraint.validator.is_valid({"name": "a", "age": 1, "email": "nope"})
    eos = 0
    ids = tokenize_greedy(byte_vocab, '{"name":"A","age":1}')
    end = walk(constraint, ids)
    assert end is not None and constraint.is_accepting(end)
    assert eos in constraint.allowed(end)
    assert constraint.advance(end, eos) == end
    assert eos not in constraint.allowed(walk(constraint, ids[:-1]))
    assert "states=" in repr(constraint)


def test_cross_lexeme_tokens_allowed(byte_vocab):
    constraint = compile_(PERSON, byte_vocab)
    state = walk(constraint, tokenize_greedy(byte_vocab, '{"name'))
    allowed = constraint.allowed(state)
    assert byte_vocab.ids_for(b'":')[0] in allowed
    assert byte_vocab.ids_for(b'":"')[0] in allowed
    assert byte_vocab.ids_for(b'",')[0] not in allowed


# -- soundness: every random walk through the constraint is a valid document ----------------------


class Walker:
    """Random complete walks through a constraint (toy vocabularies with every single byte).

    A walk takes random legal tokens for a while, then finishes by closing what is open
    (string, array, object ends, a zero where a value is due), or else along a shortest
    completion found by breadth-first search over single-byte tokens (states are values, so
    the search deduplicates them; pushdown constraints have unboundedly many, so none are
    enumerated), or by randomised closing.
    """

    def __init__(self, constraint: JsonSchemaConstraint) -> None:
        self.c = constraint
        vocab = constraint.vocab
        self.eos = set(vocab.eos_token_ids)
        self.bytes = [vocab.ids_for(bytes([b]))[0] for b in range(256) if vocab.ids_for(bytes([b]))]
        self.byte_ids = set(self.bytes)
        self.openers = {vocab.ids_for(b)[0] for b in (b"{", b"[", b"\\")}
        self.closers = [vocab.ids_for(b)[0] for b in (b'"', b"}", b"]", b":", b"0", b",")]

    def finish(self, s: Any, limit: int = 400, seed: int = 0) -> list[int] | None:
        # Closing greedily first: a walk can end 30 arrays deep, where a breadth-first
        # search spends its state budget on every way to go on before it closes them.
        closing = self._close(s, limit)
        if closing is not None:
            return closing
        # Then randomised closing (required keys to spell), and a cheapest-first search.

        def tries() -> Iterator[list[int] | None]:
            for k in range(10):
                yield self._close_randomly(s, random.Random(seed + k), limit * 4)
            yield self._search(s, 50_000)

        return next((closing for closing in tries() if closing is not None), None)

    def _search(self, s: Any, budget: int) -> list[int] | None:
        """A cheapest completion (uniform-cost search over single bytes, ``budget`` states),
        where opening a container costs eight bytes: a plain breadth-first search spends its
        state budget on ever deeper nestings before it writes a required value."""
        best = {s: 0}
        came: dict[Any, tuple[Any, int] | None] = {s: None}
        heap = [(0, 0, s)]
        order = itertools.count(1)
        while heap and len(came) < budget:
            cost, _, cur = heapq.heappop(heap)
            if cost > best[cur]:
                continue
            if self.c.is_accepting(cur):
                path = []
                while came[cur] is not None:
                    cur, t = came[cur]
                    path.append(t)
                return path[::-1]
            for t in self._byte_moves(cur):
                nxt = self.c.advance(cur, t)
                step = cost + (8 if t in self.openers else 1)
                if step < best.get(nxt, step + 1):
                    best[nxt] = step
                    came[nxt] = (cur, t)
                    heapq.heappush(heap, (step, next(order), nxt))
        return None

    def _byte_moves(self, s: Any) -> list[int]:
        """The single-byte tokens allowed in ``s``."""
        return [t for t in map(int, self.c.allowed(s).ids()) if t in self.byte_ids]

    def _close(self, s: Any, limit: int) -> list[int] | None:
        """A completion that takes the first allowed of a string's end, a container's end,
        a zero, at each step (None if that leads nowhere within ``limit`` bytes)."""
        preferred = [self.c.vocab.ids_for(b)[0] for b in (b'"', b"]", b"}", b"0")]
        path, seen = [], {s}
        while not self.c.is_accepting(s):
            allowed = self.c.allowed(s)
            t = next((t for t in preferred if t in allowed), None)
            if t is None or len(path) >= limit:
                return None
            s = self.c.advance(s, t)
            if s in seen:
                return None
            seen.add(s)
            path.append(t)
        return path

    def _close_randomly(self, s: Any, rng: random.Random, limit: int) -> list[int] | None:
        """A completion that mostly takes a closer (string end, ``}``, ``]``, ``:``, ``0``,
        ``,``) where one is allowed and otherwise a random byte that opens nothing new."""
        path: list[int] = []
        while not self.c.is_accepting(s):
            if len(path) >= limit:
                return None
            allowed = self.c.allowed(s)
            near = [t for t in self.closers if t in allowed]
            if near and rng.random() < 0.8:
                t = near[0] if rng.random() < 0.7 else rng.choice(near)
            else:
                rest = self._byte_moves(s)
                if not rest:
                    return None
                calm = [t for t in rest if t not in self.openers]
                t = rng.choice(calm or rest)
            s = self.c.advance(s, t)
            path.append(t)
        return path

    def walk(self, rng: random.Random, budget: int) -> list[int]:
        s, ids = self.c.initial, []
        while len(ids) < budget:
            if self.c.is_accepting(s) and rng.random() < 0.25:
                return ids
            out = [int(t) for t in self.c.allowed(s).ids() if int(t) not in self.eos]
            if not out:
                break
            t = rng.choice(out)
            ids.append(t)
            s = self.c.advance(s, t)
        tail = self.finish(s, seed=rng.randrange(2**32))
        assert tail is not None, "no completion found: a live state that cannot finish"
        return ids + tail


SOUND = [row for row in GOLDEN if row[0] not in ("true", "empty")] + [
    ("map-of-arrays", {"type": "object", "additionalProperties": {
        "type": "array", "items": {"type": "integer", "minimum": 1}}}, [], [], []),
]


@pytest.mark.parametrize(("name", "schema"), [(r[0], r[1]) for r in SOUND],
                         ids=[r[0] for r in SOUND])
def test_soundness_random_walks(byte_vocab, name, schema):
    walker = Walker(compile_(schema, byte_vocab))

    @settings(max_examples=25, deadline=None, suppress_health_check=SLOW,
              database=None)
    @given(seed=st.integers(0, 2**32 - 1))
    def check(seed):
        ids = walker.walk(random.Random(seed), budget=60)
        text = byte_vocab.decode(ids).decode("utf-8")
        assert walker.c.problem(text) is None, f"{name}: generated invalid {text!r}"

    check()


# -- completeness: Hypothesis-drawn instances, serialized in schema order, are accepted ----------

_UNSPELLED = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]} - set("\b\f\n\r\t")


def serialize(instance: Any, schema: Any) -> str:
    """Compact JSON in schema property order; numbers without exponents."""
    if isinstance(instance, dict):
        order = list((schema or {}).get("properties", {}))
        keys = sorted(instance, key=lambda k: order.index(k) if k in order else len(order))
        props = (schema or {}).get("properties", {})
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:"
                              f"{serialize(instance[k], props.get(k))}" for k in keys) + "}"
    if isinstance(instance, list):
        items = (schema or {}).get("items")
        return "[" + ",".join(serialize(x, items) for x in instance) + "]"
    if isinstance(instance, float):
        text = format(Decimal(repr(instance)), "f")
        return text if "." in text else text + ".0"
    if isinstance(instance, str):
        assume(not _UNSPELLED & set(instance))
    return json.dumps(instance, ensure_ascii=False)


COMPLETE = [
    PERSON | {"properties": {"name": {"type": "string", "maxLength": 8},
                             "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "additionalProperties": False},
    {"type": "object", "additionalProperties": False, "properties": {
        "tags": {"type": "array", "items": {"enum": ["a", "b", 1, None]}, "maxItems": 3},
        "score": {"type": "number", "minimum": -10, "exclusiveMaximum": 10},
        "when": {"type": "string", "format": "date"},
        "id": {"type": "string", "format": "uuid"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2,3}$"},
        "flag": {"type": ["boolean", "null"]},
    }, "required": ["tags"]},
    {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string",
                                                                 "maxLength": 3}]}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
     "items": [{"type": "string", "format": "ipv4"}, {"const": "x"}], "minItems": 2,
     "additionalItems": False},
]


def instances(schema: Any) -> st.SearchStrategy[Any]:
    """``hypothesis_jsonschema.from_schema``, with objects drawn here: its object strategy
    relies on Hypothesis internals that the installed Hypothesis no longer has."""
    from hypothesis_jsonschema import from_schema

    if isinstance(schema, dict) and schema.get("type") == "object":
        props, required = schema.get("properties", {}), set(schema.get("required", []))
        return st.fixed_dictionaries(
            {k: instances(v) for k, v in props.items() if k in required},
            optional={k: instances(v) for k, v in props.items() if k not in required})
    if isinstance(schema, dict) and schema.get("type") == "array" and \
            isinstance(schema.get("items"), dict) and schema["items"].get("type") == "object":
        return st.lists(instances(schema["items"]), min_size=schema.get("minItems", 0),
                        max_size=schema.get("maxItems", 4))
    return from_schema(schema)


@pytest.mark.parametrize("schema", COMPLETE, ids=[f"complete-{i}" for i in range(len(COMPLETE))])
def test_completeness_hypothesis_jsonschema(byte_vocab, schema):
    constraint = compile_(schema, byte_vocab)

    @settings(max_examples=40, deadline=None, suppress_health_check=SLOW,
              database=None)
    @given(instances(schema))
    def check(instance):
        assume(constraint.validator.is_valid(instance))
        text = serialize(instance, schema)
        assert accepted(constraint, text), f"valid instance rejected: {text}"

    check()


PATTERNS = [r"^\S{1,4}$", r"^[^a-c]{0,3}$", r"^\w+@\d$", r"^(foo|ba[rz])?!$", r"^.{0,3}$",
            r"^[\s\d]{1,3}$", r"^a*?b$", r'^"\\$', r"^[à-ÿ]+$", r"^\D\W$",
            r"^[\x00-\x1f]{1,2}$"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_soundness(byte_vocab, pattern):
    """Random strings generated for a pattern match it (Python ``re.search``) and are JSON."""
    import re

    schema = {"type": "array", "items": {"type": "string", "pattern": pattern}, "maxItems": 2}
    walker = Walker(compile_(schema, byte_vocab))
    rng = random.Random(0)
    for _ in range(40):
        text = byte_vocab.decode(walker.walk(rng, budget=16)).decode("utf-8")
        for value in json.loads(text):
            assert re.search(pattern, value), f"{pattern!r} generated {text!r}"


# -- caching ---------------------------------------------------------------------------------------


def test_compile_cache_is_shared_and_order_sensitive(byte_vocab):
    a = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
         "required": ["x", "y"]}
    b = {"type": "object", "properties": {"y": {"type": "integer"}, "x": {"type": "integer"}},
         "required": ["x", "y"]}
    assert compile_(a, byte_vocab) is compile_(json.loads(json.dumps(a)), byte_vocab)
    cb = compile_(b, byte_vocab)
    assert cb is not compile_(a, byte_vocab)  # property order is generated, so it is keyed
    assert accepted(cb, '{"y":1,"x":2}') and not accepted(cb, '{"x":2,"y":1}')
    assert compile_(a, byte_vocab, whitespace="flexible") is not compile_(a, byte_vocab)


def test_compiled_schema_is_a_private_copy(byte_vocab):
    schema = {"type": "object", "properties": {"n": {"type": "string"}}, "title": "copy"}
    constraint = compile_(schema, byte_vocab)
    schema["properties"]["n"]["type"] = "integer"
    assert constraint.schema["properties"]["n"]["type"] == "string"


def test_compile_cache_lru_and_single_flight():
    cache: CompileCache[int] = CompileCache(maxsize=2)
    calls: list[str] = []
    gate = threading.Event()

    def slow() -> int:
        calls.append("slow")
        gate.wait(5)
        return 1

    threads = [threading.Thread(target=cache.get_or_compile, args=("k", slow)) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert calls == ["slow"] and cache.get("k") == 1
    cache.get_or_compile("a", lambda: 2)
    cache.get_or_compile("b", lambda: 3)
    assert cache.get("k") is None and len(cache) == 2  # least recently used went first
    with pytest.raises(ZeroDivisionError):
        cache.get_or_compile("bad", lambda: 1 // 0)
    assert cache.get("bad") is None


def test_real_vocab_person_schema(smollm_tokenizer, smollm_vocab):
    constraint = compile_(PERSON, smollm_vocab)
    text = '{"name":"Ana Silva","age":31,"email":"ana.silva@example.org"}'
    ids = smollm_tokenizer.encode(text, add_special_tokens=False)
    assert accepts(constraint, ids)
    assert not accepts(constraint, smollm_tokenizer.encode('{"name":"Ana"}',
                                                            add_special_tokens=False))
    state = walk(constraint, smollm_tokenizer.encode('{"name', add_special_tokens=False))
    allowed = constraint.allowed(state)
    for piece in (b'":', b'":"'):
        assert any(i in allowed for i in smollm_vocab.ids_for(piece)), piece
    assert not any(i in allowed for i in smollm_vocab.ids_for(b'",'))
    assert not set(smollm_vocab.special_token_ids - smollm_vocab.eos_token_ids) & \
        set(constraint.allowed(constraint.initial).ids().tolist())


def test_import_automata_does_not_load_torch():
    code = ("import sys, structspec.automata; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- generation-time options -------------------------------------------------------------------


def test_extra_properties_follow_the_named_ones_and_never_repeat_them(byte_vocab):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": {"type": "boolean"}}
    spec = compile_(schema, byte_vocab, extra_properties=True)
    assert accepted(spec, '{"a":1,"b":true,"c":false}')
    for text in ['{"a":1,"b":1}', '{"a":1,"a":2}', '{"a":1,"\\u0061":true}']:
        assert not accepted(spec, text), text
    assert not accepted(compile_(schema, byte_vocab), '{"a":1,"b":true}')  # default: named only
    closed = compile_({**schema, "additionalProperties": False}, byte_vocab,
                      extra_properties=True)
    assert not accepted(closed, '{"a":1,"b":true}')


def test_unbounded_arrays_are_capped_for_generation_only(byte_vocab):
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
    seventeen = "[" + ",".join(["1"] * 17) + "]"
    assert not accepted(compile_json_schema(schema, byte_vocab, whitespace="compact"),
                        seventeen)  # default: 16
    assert accepted(compile_(schema, byte_vocab, max_array_items=None), seventeen)
    assert accepted(compile_(schema, byte_vocab, max_array_items=2), "[1,2]")
    with pytest.raises(ValueError, match="max_array_items"):
        compile_(schema, byte_vocab, max_array_items=0)


# -- regressions found by review ---------------------------------------------------------------


def test_inline_pattern_flags_are_refused_not_ignored(byte_vocab):
    for pattern in ("(?i)[^a]", "a(?i:b)"):
        with pytest.raises(UnsupportedSchemaError) as info:
            compile_({"type": "string", "pattern": pattern}, byte_vocab)
        assert info.value.keyword == "pattern"


def test_merging_keeps_the_base_of_nested_ids(byte_vocab):
    schema = {"$defs": {"b": {"type": "string"},
                        "a": {"$id": "http://other.example/a",
                              "properties": {"x": {"$ref": "#/$defs/b"}},
                              "$defs": {"b": {"type": "integer"}}}},
              "allOf": [{"$ref": "#/$defs/a"}]}
    c = compile_(schema, byte_vocab)  # "#/$defs/b" inside "a" is a's own b: an integer
    assert accepted(c, '{"x":1}') and not accepted(c, '{"x":"s"}')


def test_a_ref_resolves_against_its_nearest_id(byte_vocab):
    schema = {"$defs": {"s": {"type": "string"}}, "properties": {"x": {
        "$id": "http://example.com/x", "properties": {"y": {"$ref": "#/$defs/s"}}}}}
    with pytest.raises(SchemaError, match="does not resolve"):  # x has no $defs/s
        compile_(schema, byte_vocab)


def test_recursive_ref_inside_allof_is_a_rule(byte_vocab):
    schema = {"type": "object",
              "properties": {"kids": {"type": "array", "items": {"allOf": [{"$ref": "#"}]}}}}
    c = compile_(schema, byte_vocab)
    assert accepted(c, '{"kids":[{"kids":[]},{}]}') and not accepted(c, '{"kids":[1]}')


def test_lone_surrogates_are_spelled_as_escapes(byte_vocab):
    c = compile_('{"const": "\\ud800"}', byte_vocab)
    assert accepted(c, '"\\ud800"')


def test_hostile_schemas_end_in_clear_errors(byte_vocab):
    deep: dict[str, Any] = {"type": "array"}
    cur = deep
    for _ in range(3000):
        cur["items"] = {"type": "array"}
        cur = cur["items"]
    with pytest.raises(ResourceLimitError):
        compile_(deep, byte_vocab)
    with pytest.raises(ResourceLimitError):
        compile_({"type": "string", "maxLength": 10**8}, byte_vocab)


def test_oneof_of_object_only_branches_is_a_tagged_union(byte_vocab):
    schema = {"oneOf": [{"properties": {"p": {"enum": ["a"]}}, "required": ["p"]},
                        {"properties": {"p": {"enum": ["b"]}}, "required": ["p"]}]}
    c = compile_(schema, byte_vocab, extra_properties=True)
    validator = Draft202012Validator(schema)
    for text in ['{"p":"a"}', '{"p":"b"}', '"x"', "1", '{"p":"c"}', "{}", "[]"]:
        assert accepted(c, text) == validator.is_valid(json.loads(text)), text


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("hostname", ["example.com", "a-b.c"], ["-a.com", "a..b"]),
    ("ipv6", ["1:2:3:4:5:6:7:8", "::1", "::"], ["1:2:3", "g::1"]),
    ("duration", ["P1D", "PT5M", "P1Y2M3DT4H5M6S", "P2W"], ["P", "PT", "P1DT", "P1M1Y"]),
    ("uri-reference", ["", "/a/b", "a/b?x#y", "https://x.io/p", "#f"], ["a:b", "a b"]),
    ("email", ["m4.van.dijk@vu.nl", "a@b.cd"], ["a..b@x.yz", "@x.yz"]),
])
def test_more_formats(byte_vocab, fmt, good, bad):
    c = compile_({"type": "string", "format": fmt}, byte_vocab)
    for text in good:
        assert accepted(c, json.dumps(text)), text
    for text in bad:
        assert not accepted(c, json.dumps(text)), text


@pytest.mark.parametrize("extra", [False, None, {"type": "boolean"}])
def test_pattern_properties_split_the_keys(byte_vocab, extra):
    schema: dict[str, Any] = {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}
    if extra is not None:
        schema["additionalProperties"] = extra
    c = compile_(schema, byte_vocab)
    validator = Draft202012Validator(schema)
    for text in ["{}", '{"xa":1}', '{"xa":true}', '{"y":true}', '{"y":"s"}', '{"xa":1,"y":true}']:
        assert accepted(c, text) == validator.is_valid(json.loads(text)), text


def test_integer_multiples_are_a_residue_automaton(byte_vocab):
    c = compile_({"type": "integer", "multipleOf": 7, "minimum": -30}, byte_vocab)
    for x in range(-40, 80):
        assert accepted(c, str(x)) == (x % 7 == 0 and x >= -30), x
    assert accepted(c, "700000000000007")


@pytest.mark.parametrize(("step", "good", "bad"), [
    (0.01, ["10.99", "0", "10.990", "-3.5"], ["10.999", "0.001", "1e2"]),
    (2.5, ["5", "7.5", "-2.5", "0", "12.50"], ["1", "2.4", "0.5"]),
])
def test_decimal_multiple_of_numbers(byte_vocab, step, good, bad):
    c = compile_({"type": "number", "multipleOf": step}, byte_vocab)
    for text in good:
        assert accepted(c, text), text
        assert c.validator.is_valid(json.loads(text))  # exact, unlike float division
    for text in bad[:2]:
        assert not accepted(c, text), text
        assert not c.validator.is_valid(json.loads(text))
    assert not accepted(c, bad[2])  # exponents are not written (narrowing)


@pytest.mark.parametrize(("schema", "text", "valid"), [
    # a float reading rounds these across the bound, or onto an integer
    ({"type": "number", "exclusiveMaximum": 1}, "0.99999999999999999", True),
    ({"type": "number", "exclusiveMaximum": 1}, "1.0", False),
    ({"type": "number", "minimum": 0.1}, "0.1", True),
    ({"type": "number", "minimum": 0.1}, "0.09999999999999999999", False),
    ({"not": {"type": "integer"}}, "83970045002956393971654312.6126500139267", True),
    ({"not": {"type": "integer"}}, "2.0", False),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}, "2.0", False),
    ({"enum": [0.1, 2.5]}, "0.1", True),
    # exponents beyond what a Decimal holds (unbounded numbers may spell them)
    ({"type": "number"}, "-0.5e99999999999999999999999", True),
    ({"type": "array", "items": {"type": "number"}}, "[1E-99999999999999999999999]", True),
    ({"type": "number", "multipleOf": 0.01}, "10000000000000000.01", True),
    ({"type": "number", "multipleOf": 0.01}, "10000000000000000.001", False),
])
def test_outputs_are_validated_as_the_decimals_written(byte_vocab, schema, text, valid):
    """``problem`` agrees with the constraint where a float reading of the output would not
    (the generator would otherwise report a valid output as an internal error)."""
    c = compile_(schema, byte_vocab)
    assert accepted(c, text) == valid, text
    assert (c.problem(text) is None) == valid, c.problem(text)


def test_huge_exponents_keep_sign_zero_and_integrality(byte_vocab):
    c = compile_({"not": {"type": "integer"}, "maximum": 0}, byte_vocab)
    assert c.problem("-5e-99999999999999999999999") is None  # tiny, not an integer
    assert c.problem("-5E+99999999999999999999999") is not None  # an integer
    assert c.problem("0e-99999999999999999999999") is not None  # zero: an integer
    assert c.problem("5e-99999999999999999999999") is not None  # above the maximum


def test_problem_names_what_and_where(byte_vocab):
    c = compile_({"type": "object", "properties": {"a": {"type": "array", "items": {
        "type": "integer", "maximum": 3}}}}, byte_vocab)
    assert c.problem('{"a":[1,4]}') == "4 is greater than the maximum of 3 (at instance /a/1)"
    assert c.problem("{").startswith("not JSON")
    assert pickle.loads(pickle.dumps(c)).problem('{"a":[1,2]}') is None


def test_fractional_multiple_of_integers(byte_vocab):
    c = compile_({"type": "integer", "multipleOf": 2.5}, byte_vocab)  # 5, 10, 15, ...
    assert accepted(c, "15") and not accepted(c, "2") and not accepted(c, "7")


def test_pattern_and_named_property_both_apply(byte_vocab):
    c = compile_({"type": "object", "properties": {"a": {"type": "integer"}},
                  "patternProperties": {"^a": {"minimum": 1}}, "required": ["a"]}, byte_vocab)
    assert accepted(c, '{"a":2}') and not accepted(c, '{"a":0}')


def test_max_properties_on_free_objects(byte_vocab):
    c = compile_({"type": "object", "maxProperties": 2}, byte_vocab)
    assert accepted(c, '{"x":1,"y":2}') and not accepted(c, '{"x":1,"y":2,"z":3}')


def test_multiple_of_in_two_parts_is_their_common_multiple(byte_vocab):
    c = compile_({"allOf": [{"type": "integer", "multipleOf": 4}, {"multipleOf": 6}]},
                 byte_vocab)
    assert accepted(c, "24") and accepted(c, "12") and not accepted(c, "8")


def test_tuple_arrays_from_two_parts_merge_position_by_position(byte_vocab):
    c = compile_({"type": "array", "allOf": [{"prefixItems": [{"type": "integer"}]}],
                  "items": {"minimum": 5}}, byte_vocab)
    assert accepted(c, "[5,6.5]") and not accepted(c, "[4]") and not accepted(c, "[5.5]")
    c = compile_({"allOf": [{"prefixItems": [{"type": "integer"}, {"type": "string"}]},
                            {"prefixItems": [{"minimum": 2}], "items": False}]}, byte_vocab)
    assert accepted(c, "[3]") and not accepted(c, '[3,"a"]') and not accepted(c, "[1]")


def test_extra_keys_beside_a_pattern_take_its_schema(byte_vocab):
    schema = {"type": "object", "properties": {"id": {"type": "integer"}},
              "patternProperties": {"^x-": {"type": "string"}},
              "additionalProperties": {"type": "boolean"}}
    c = compile_(schema, byte_vocab, extra_properties=True)
    assert accepted(c, '{"id":1,"x-a":"s","ok":true}')
    assert not accepted(c, '{"id":1,"x-a":true}') and not accepted(c, '{"id":1,"ok":"s"}')
    assert not accepted(c, '{"id":1,"id":2}')  # a named key is never an extra one


def test_unicode_property_escapes_in_patterns(byte_vocab):
    c = compile_({"type": "string", "pattern": "^\\p{Letter}+$"}, byte_vocab)
    assert accepted(c, '"h\u00e9"') and accepted(c, '"Zeta"') and not accepted(c, '"a1"')
    assert c.validator.is_valid("héllo") and not c.validator.is_valid("h3")
    with pytest.raises(UnsupportedSchemaError, match="Greek"):
        compile_({"type": "string", "pattern": "\\p{Script=Greek}"}, byte_vocab)
