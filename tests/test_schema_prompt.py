"""How a schema is shown to the model: the typed template and its JSON fallback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from structspec.schema_prompt import (
    SCHEMA_JSON_INSTRUCTION,
    render_schema,
    renders_as_template,
    schema_instruction,
)

CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "calculate_triangle_area"},
        "arguments": {
            "type": "object",
            "properties": {
                "base": {"type": "integer", "description": "The base of the triangle."},
                "unit": {"type": "string", "description": "The unit\n of measure",
                         "default": "units"},
                "shape": {"enum": ["right", "isosceles"]},
                "sides": {"type": "array", "items": {"type": "number", "minimum": 0},
                          "maxItems": 3},
            },
            "required": ["base"],
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def test_a_call_schema_as_a_template() -> None:
    assert render_schema(CALL) == "\n".join([
        "{",
        '  "name": "calculate_triangle_area",',
        '  "arguments": {',
        '    "base": integer, // The base of the triangle.',
        '    "unit"?: string, // The unit of measure (default "units")',
        '    "shape"?: "right" | "isosceles",',
        '    "sides"?: number (minimum 0)[] (maxItems 3)',
        "  }",
        "}",
    ])
    assert "keys marked ? are optional" in schema_instruction(CALL)


@pytest.mark.parametrize("schema", [
    {"$ref": "other.json#/$defs/a"},
    {"$ref": "#/$defs/a/properties/b", "$defs": {"a": {"properties": {"b": {}}}}},
    {"$ref": "#/$defs/a", "minLength": 1, "$defs": {"a": {"type": "string"}}},
    {"$ref": "#/$defs/missing", "$defs": {"a": {"type": "string"}}},
    {"properties": {"a": {"$defs": {"b": {}}, "$ref": "#/$defs/b"}}},
    {"$defs": {"b": {}}, "properties": {"a": {"$id": "http://x/", "$ref": "#/$defs/b"}}},
    {"$ref": "#/$defs/a", "$defs": {"a": {"not": {"type": "string"}}}},
    {"type": "object", "properties": {"a": {"allOf": [{"type": "string"}]}}},
    {"type": "array", "items": {"not": {"type": "null"}}},
    {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
    {"type": "array", "prefixItems": [{"not": {}}]},
    # A value list or a union beside other validation keywords would read wider than it is.
    {"type": "string", "enum": ["a", "bb"], "minLength": 2},
    {"properties": {"a": {}}, "anyOf": [{"properties": {"b": {}}}]},
    {"type": "string", "anyOf": [{"type": "integer"}]},
    # Not valid schemas (Generator validates first): shown as they are, never a crash.
    {"enum": 5},
    {"type": "object", "properties": {"a": {}}, "required": "a"},
    {"type": 3},
])
def test_what_a_template_cannot_state_is_shown_as_json_schema(schema: Any) -> None:
    assert not renders_as_template(schema)
    assert json.loads(render_schema(schema)) == schema
    assert schema_instruction(schema) == SCHEMA_JSON_INSTRUCTION.format(
        schema=json.dumps(schema, separators=(",", ":")))


@pytest.mark.parametrize(("schema", "text"), [
    (True, "any"),
    (False, "never"),
    ({}, "any"),
    ({"type": ["string", "null"]}, "string | null"),
    ({"type": "integer", "enum": [1, "a", 2.0, 2.5]}, "1 | 2.0"),
    ({"type": "object"}, "object"),
    ({"type": "object", "additionalProperties": False}, "{}"),
    ({"type": "object", "additionalProperties": {"type": "integer"}},
     "{\n  [key: string]: integer\n}"),
    ({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]},
     "integer | string[]"),
    ({"type": "string", "format": "date", "description": "When"},
     '// When\nstring (format "date")'),
    ({"type": "array", "items": {"enum": [1, 2]}}, "(1 | 2)[]"),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
      "items": False, "minItems": 2}, "[integer, string] (minItems 2)"),
    ({"prefixItems": [{"type": "null"}], "items": {"type": ["string", "null"]}},
     "[null, ...(string | null)[]]"),
    ({"type": "object", "properties": {"a": {"type": "null"}}, "required": ["a", "b"],
      "additionalProperties": False}, '{\n  "a": null,\n  "b": any\n}'),
])
def test_template_forms(schema: Any, text: str) -> None:
    assert renders_as_template(schema)
    assert render_schema(schema) == text


# -- every key and value of a templated schema is in the template --------------------------

_names = st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=6)
_scalars = st.sampled_from([{"type": t} for t in ("string", "integer", "number", "boolean",
                                                  "null")])
_enums = st.lists(st.one_of(st.integers(-50, 50), _names, st.booleans(), st.none()),
                  min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v})


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    objects = st.dictionaries(_names, children, max_size=4).flatmap(
        lambda props: st.fixed_dictionaries({
            "type": st.just("object"), "properties": st.just(props),
            "required": st.lists(st.sampled_from(sorted(props)), unique=True)
            if props else st.just([]),
            "additionalProperties": st.booleans()}))
    arrays = children.map(lambda item: {"type": "array", "items": item})
    unions = st.lists(children, min_size=2, max_size=3).map(lambda o: {"anyOf": o})
    return st.one_of(objects, arrays, unions)


_schemas = st.recursive(st.one_of(_scalars, _enums), _extend, max_leaves=12)


def _keys_and_values(schema: Any) -> tuple[list[str], list[str]]:
    keys, values = [], []
    if isinstance(schema, dict):
        required = set(schema.get("required", ()))
        for name, sub in schema.get("properties", {}).items():
            keys.append(json.dumps(name) + ("" if name in required else "?") + ": ")
            k, v = _keys_and_values(sub)
            keys += k
            values += v
        values += [json.dumps(v) for v in schema.get("enum", ())]
        for sub in [schema.get("items"), *schema.get("anyOf", [])]:
            k, v = _keys_and_values(sub)
            keys += k
            values += v
    return keys, values


@settings(max_examples=200, deadline=None)
@given(_schemas)
def test_the_template_names_every_key_and_value(schema: Any) -> None:
    assert renders_as_template(schema)
    text = render_schema(schema)
    keys, values = _keys_and_values(schema)
    for piece in keys + values:
        assert piece in text


class Address(BaseModel):
    street: str = Field(description="Street and number")
    country: Literal["FR", "DE"] = "FR"


class Person(BaseModel):
    """Someone to write to."""

    name: str
    address: Address
    previous: list[Address] = []
    friends: list[Person] = []
    age: int | None = None


def test_pydantic_models_render_their_definitions_by_name() -> None:
    schema = Person.model_json_schema()
    assert "$defs" in schema
    assert renders_as_template(schema)
    # The root is a recursive definition: shown last, under its name.
    assert render_schema(schema) == "\n".join([
        "Address = {",
        '  "street": string, // Street and number',
        '  "country"?: "FR" | "DE" // default "FR"',
        "}",
        "// Someone to write to.",
        "Person = {",
        '  "name": string,',
        '  "address": Address,',
        '  "previous"?: Address[], // default []',
        '  "friends"?: Person[], // default []',
        '  "age"?: integer | null // default null',
        "}",
    ])
    # Titles (Pydantic's "Street" for street) are left out; descriptions are kept.
    assert "Street and" in render_schema(Address.model_json_schema())
    assert "Street\n" not in render_schema(Address.model_json_schema())


class Order(BaseModel):
    to: Address
    items: list[str]


def test_a_definition_used_below_the_root_is_named_before_it() -> None:
    assert render_schema(Order.model_json_schema()) == "\n".join([
        "Address = {",
        '  "street": string, // Street and number',
        '  "country"?: "FR" | "DE" // default "FR"',
        "}",
        "{",
        '  "to": Address,',
        '  "items": string[]',
        "}",
    ])


def test_suite_schemas_render(shared_data: Path) -> None:
    """Every schema of the JSON-Schema-Test-Suite renders, as a template or as itself."""
    suite = shared_data / "json-schema-test-suite" / "tests" / "draft2020-12"
    if not suite.is_dir():
        pytest.skip(f"{suite} is absent")
    templated = 0
    for path in sorted(suite.glob("*.json")):
        for group in json.loads(path.read_text(encoding="utf-8")):
            schema = group["schema"]
            text = render_schema(schema)
            if renders_as_template(schema):
                templated += 1
            else:
                assert json.loads(text) == schema, (path.name, group["description"])
    assert templated > 100
