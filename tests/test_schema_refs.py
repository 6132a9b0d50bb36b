"""References: anchors, relative URIs, nested ids and a caller's registry — never fetched."""

from __future__ import annotations

import functools
import json

import pytest
from conftest import make_byte_vocab

from structspec import SchemaError, UnsupportedSchemaError, compile_json_schema
from structspec.automata import accepts
from structspec.automata.schema_refs import bundle_refs

#: The texts these tests drive through the constraint are compact JSON (``{"a":1}``), as the
#: suites write their instances: compile in that policy, not the default (spaced).
compile_json_schema = functools.partial(compile_json_schema, whitespace="compact")

VOCAB = make_byte_vocab([])


def ids(text: str) -> list[int]:
    return [b + 1 for b in text.encode()] + [0]


def ok(constraint, value) -> bool:
    return accepts(constraint, ids(json.dumps(value, separators=(",", ":"))))


def test_anchor_ref() -> None:
    schema = {"$defs": {"n": {"$anchor": "num", "type": "integer", "minimum": 3}},
              "type": "object", "properties": {"a": {"$ref": "#num"}}, "required": ["a"]}
    c = compile_json_schema(schema, VOCAB)
    assert ok(c, {"a": 5}) and not ok(c, {"a": 2}) and not ok(c, {"a": "x"})


def test_relative_uri_against_nested_id() -> None:
    schema = {"$id": "https://example.com/root.json",
              "properties": {"item": {"$ref": "item.json"}}, "required": ["item"],
              "type": "object",
              "$defs": {"item": {"$id": "item.json", "type": "string", "maxLength": 2}}}
    bundled = bundle_refs(schema)
    assert bundled["properties"]["item"]["$ref"] == "#/$defs/item"
    assert "$id" not in bundled["$defs"]["item"] and bundled["$id"] == schema["$id"]
    c = compile_json_schema(schema, VOCAB)
    assert ok(c, {"item": "ab"}) and not ok(c, {"item": "abc"})


def test_registry_documents_and_their_own_refs() -> None:
    registry = {
        "https://schemas.example/point.json": {
            "type": "object", "properties": {"x": {"$ref": "#/$defs/coord"},
                                             "y": {"$ref": "#/$defs/coord"}},
            "required": ["x", "y"], "$defs": {"coord": {"type": "integer"}}},
    }
    schema = {"type": "array", "items": {"$ref": "https://schemas.example/point.json"},
              "maxItems": 2}
    c = compile_json_schema(schema, VOCAB, registry=registry)
    assert ok(c, [{"x": 1, "y": 2}]) and not ok(c, [{"x": 1, "y": "2"}])
    assert c.validator.is_valid([{"x": 1, "y": 2}])
    assert not c.validator.is_valid([{"x": 1}])


def test_missing_remote_is_refused_never_fetched() -> None:
    schema = {"$ref": "https://json-schema.org/draft/2020-12/schema"}  # would be fetchable
    with pytest.raises(UnsupportedSchemaError) as info:
        compile_json_schema(schema, VOCAB)
    assert info.value.keyword == "$ref" and "registry" in str(info.value)


def test_bad_pointer_and_bad_anchor_are_schema_errors() -> None:
    with pytest.raises(SchemaError, match="does not resolve"):
        compile_json_schema({"properties": {"a": {"$ref": "#/$defs/nope"}}}, VOCAB)
    with pytest.raises(SchemaError, match="does not resolve"):
        compile_json_schema({"properties": {"a": {"$ref": "#nope"}}}, VOCAB)


def test_data_keywords_are_not_rewritten() -> None:
    schema = {"$defs": {"s": {"type": "string"}}, "anyOf": [
        {"$ref": "#/$defs/s"}, {"const": {"$ref": "not a reference"}}]}
    bundled = bundle_refs(schema)
    assert bundled["anyOf"][1] == {"const": {"$ref": "not a reference"}}
    c = compile_json_schema(schema, VOCAB)
    assert ok(c, "x") and ok(c, {"$ref": "not a reference"}) and not ok(c, 3)


def test_registry_must_be_a_mapping() -> None:
    with pytest.raises(TypeError, match="registry"):
        compile_json_schema({"type": "string"}, VOCAB, registry=[1, 2])  # type: ignore[arg-type]


def test_ref_to_boolean_schema() -> None:
    schema = {"$defs": {"no": False}, "type": "object",
              "properties": {"a": {"$ref": "#/$defs/no"}, "b": {"type": "null"}}}
    c = compile_json_schema(schema, VOCAB)
    assert ok(c, {"b": None}) and not ok(c, {"a": 1})
