"""How a JSON Schema is shown to the model in the prompt.

The constraint already enforces the schema, so the prompt only has to tell the model what
each field *means* and which shape to expect. A JSON Schema spends most of its tokens on
keyword syntax (``{"type":"integer","description":...}``): on the BFCL dev set the compact
JSON is 128 tokens per call schema on average, and the prompt is prefilled on every
request, speculation or not. :func:`render_schema` writes the same schema as a typed JSON
template, the form function-calling prompts use::

    {
      "name": "calculate_triangle_area",
      "arguments": {
        "base": integer, // The base of the triangle.
        "unit"?: string // The unit of measure
      }
    }

Definitions referenced by local ``$ref`` (``#/$defs/Name``, ``#/definitions/Name`` — what
Pydantic writes for nested models and enums) are shown once, by name, before the template
(``Address = {...}``), so recursive schemas render too.

It is written by hand because no library renders a JSON Schema this way while guaranteeing
that nothing is lost: a schema that uses a validation keyword the template cannot state
(``allOf``, ``not``, ``patternProperties``, ``if``, a ``$ref`` to anything but a local
definition ...) is shown as compact JSON Schema instead, whole, so the model never sees a
wider shape than the one enforced. ``oneOf`` is shown as a union, like ``anyOf``.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Validation keywords of draft 2020-12 (and older drafts) that the template cannot state.
_UNSTATED = frozenset({
    "$dynamicRef", "$recursiveRef", "allOf", "not", "if",
    "then", "else", "dependentSchemas", "dependentRequired", "dependencies",
    "patternProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
    "contains", "minContains", "maxContains", "additionalItems",
    "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary",
})

#: Validation keywords the template states (everything else that is not in ``_UNSTATED`` is
#: an annotation or unknown, and constrains nothing).
_STATED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum",
    "const",
    "anyOf", "oneOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minLength", "maxLength", "pattern", "format", "minItems", "maxItems",
    "uniqueItems", "minProperties", "maxProperties",
})

#: A local reference the template names: ``#/$defs/Name`` or ``#/definitions/Name``.
_LOCAL_REF = re.compile(r"#/(\$defs|definitions)/([A-Za-z_][A-Za-z0-9_.\-]*)\Z")

#: How a schema can be shown: ``"template"`` a typed JSON template (the compact JSON Schema
#: where a template cannot state it), ``"json"`` always the compact JSON Schema.
SCHEMA_STYLES = ("template", "json")
SCHEMA_JSON_INSTRUCTION = "Answer with a JSON value that matches this JSON Schema:\n{schema}"
SCHEMA_TEMPLATE_INSTRUCTION = (
    "Answer with a JSON value of this form (keys marked ? are optional):\n{schema}")


def renders_as_template(schema: Any) -> bool:
    """Whether :func:`render_schema` can state every constraint of ``schema`` as a template."""
    return _templatable(schema) is not None


def _templatable(schema: Any) -> dict[str, tuple[str, Any]] | None:
    """The root's definitions (:func:`_definitions`; none for a boolean schema) when a
    template states every constraint of ``schema``, else ``None``."""
    if isinstance(schema, bool):
        return {}
    if not isinstance(schema, dict):
        return None
    definitions = _definitions(schema)
    if definitions is None:
        return None
    if (_stated(schema, definitions, root=True)
            and all(_stated(sub, definitions) for _, sub in definitions.values())):
        return definitions
    return None


def _definitions(root: dict[str, Any]) -> dict[str, tuple[str, Any]] | None:
    """``{"#/$defs/Name": (shown name, schema)}`` of the root's definitions; ``None`` when
    they are not name -> schema maps."""
    found: dict[str, tuple[str, Any]] = {}
    names: set[str] = set()
    for key in ("$defs", "definitions"):
        table = root.get(key)
        if table is None:
            continue
        if not isinstance(table, dict):
            return None
        for name, sub in table.items():
            shown = name
            while shown in names:  # the same name under both keywords
                shown += "_"
            names.add(shown)
            found[f"#/{key}/{name}"] = (shown, sub)
    return found


def _stated(schema: Any, definitions: dict[str, tuple[str, Any]], root: bool = False) -> bool:
    """Whether the template states every constraint of ``schema`` (a subschema of a root
    with ``definitions``)."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not _UNSTATED.isdisjoint(schema):
        return False
    if not root and ("$defs" in schema or "definitions" in schema or "$id" in schema):
        return False  # nested resources: their references resolve elsewhere
    if not (isinstance(schema.get("enum", []), list)
            and isinstance(schema.get("required", []), list)
            and isinstance(schema.get("type", ""), (str, list))):
        return False  # not a valid schema: shown as it is
    validating = _STATED.intersection(schema) - {"type"}
    if "$ref" in schema:
        # A reference is shown as the definition's name: alone, or it would read wider.
        ref = schema["$ref"]
        return (isinstance(ref, str) and _LOCAL_REF.match(ref) is not None
                and ref in definitions and not validating and "type" not in schema)
    # A value list or a union is shown alone: beside other validation keywords (other than
    # "type", which the template applies) it would show a wider shape than enforced.
    if ("const" in schema or "enum" in schema) and len(validating) > 1:
        return False
    unions = [schema[k] for k in ("anyOf", "oneOf") if k in schema]
    if unions and (len(validating) > 1 or any(
            isinstance(o, dict) and "type" in o and "type" in schema for o in unions[0])):
        return False
    for key, value in schema.items():
        if key == "properties":
            subschemas = list(value.values()) if isinstance(value, dict) else [None]
        elif key in ("items", "additionalProperties"):
            subschemas = [value]
        elif key in ("anyOf", "oneOf", "prefixItems"):
            subschemas = value if isinstance(value, list) else [None]
        else:
            continue
        if not all(_stated(sub, definitions) for sub in subschemas):
            return False
    return True


def schema_instruction(schema: Any, style: str = "template") -> str:
    """The instruction that shows ``schema`` to the model in ``style`` (one of
    :data:`SCHEMA_STYLES`; ``ValueError`` otherwise)."""
    if style not in SCHEMA_STYLES:
        raise ValueError(f"schema_style must be one of {SCHEMA_STYLES}, not {style!r}")
    template = _template(schema) if style == "template" else None
    if template is not None:
        return SCHEMA_TEMPLATE_INSTRUCTION.format(schema=template)
    return SCHEMA_JSON_INSTRUCTION.format(schema=_compact_json(schema))


def render_schema(schema: Any) -> str:
    """``schema`` as a typed JSON template (see the module docstring), or as compact JSON
    Schema when it uses a keyword the template cannot state."""
    template = _template(schema)
    return _compact_json(schema) if template is None else template


def _compact_json(schema: Any) -> str:
    return json.dumps(schema, separators=(",", ":"))


def _template(schema: Any) -> str | None:
    """``schema`` as a typed JSON template, or ``None`` where one cannot state it all."""
    definitions = _templatable(schema)
    if definitions is None:
        return None
    renderer = _Renderer(definitions)
    main, main_ref = schema, None
    while isinstance(main, dict) and "$ref" in main:  # the root is a definition: inline it
        main_ref = main["$ref"]
        main = definitions[main_ref][1]
    text = renderer.value(main, 0)
    shown = []
    done: set[str] = set()
    while len(done) < len(renderer.used):  # definitions used, and those they use
        for ref in [r for r in renderer.used if r not in done]:
            done.add(ref)
            if ref == main_ref:  # recursive: the main template carries its name
                text = f"{definitions[ref][0]} = {text}"
                continue
            name, sub = definitions[ref]
            note = _Renderer.comment(sub)
            shown.append((f"// {note}\n" if note else "") + f"{name} = {renderer.value(sub, 0)}")
    comment = _Renderer.comment(main) or _Renderer.comment(schema)
    body = f"// {comment}\n{text}" if comment else text
    return "\n".join([*shown, body])


def _has_type(value: Any, types: Any) -> bool:
    """Whether ``value`` has one of the JSON Schema ``types`` (``None``: any type)."""
    if types is None:
        return True
    if isinstance(types, str):
        types = [types]
    kind = {type(None): "null", bool: "boolean", str: "string", list: "array",
            dict: "object"}.get(type(value))
    if kind is None:  # a number
        kind = "integer" if float(value).is_integer() else "number"
    return kind in types or (kind == "integer" and "number" in types)


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


#: Array keywords shown as notes after the array's template.
_ARRAY_NOTES = ("minItems", "maxItems", "uniqueItems")


class _Renderer:
    """Renders a schema that :func:`renders_as_template` accepts."""

    indent = "  "

    def __init__(self, definitions: dict[str, tuple[str, Any]]) -> None:
        self.definitions = definitions
        self.used: dict[str, None] = {}  # references met, in order

    def value(self, schema: Any, depth: int) -> str:
        """The template of one value, without its description (the caller places that)."""
        if schema is True or schema == {}:
            return "any"
        if schema is False:
            return "never"
        assert isinstance(schema, dict)
        if "$ref" in schema:
            self.used.setdefault(schema["$ref"], None)
            return self.definitions[schema["$ref"]][0]
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            fits = [v for v in values if _has_type(v, schema.get("type"))]
            return " | ".join(json.dumps(v) for v in fits) if fits else "never"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                options = [self.value({**rest, **o} if isinstance(o, dict) else o, depth)
                           for o in schema[key]]
                return " | ".join(dict.fromkeys(options))
        types = schema.get("type")
        if isinstance(types, list):
            return " | ".join(self.value({**schema, "type": t}, depth) for t in types)
        if types is None:
            if "properties" in schema or "additionalProperties" in schema:
                types = "object"
            elif "items" in schema or "prefixItems" in schema:
                types = "array"
        if types == "object":
            return self.object(schema, depth)
        if types == "array" and "prefixItems" in schema:  # a tuple: [integer, string, ...]
            parts = [self.value(sub, depth) for sub in schema["prefixItems"]]
            rest = schema.get("items", True)
            if rest is not False:
                more = self.value(rest, depth)
                parts.append(f"...({more})[]" if " | " in more else f"...{more}[]")
            return "[" + ", ".join(parts) + "]" + self.notes(schema, _ARRAY_NOTES)
        if types == "array":
            items = schema.get("items", True)
            inner = self.value(items, depth)
            if " | " in inner:
                inner = f"({inner})"
            return inner + "[]" + self.notes(schema, _ARRAY_NOTES)
        if types in ("string", "integer", "number", "boolean", "null"):
            return types + self.notes(schema, (
                "format", "pattern", "minLength", "maxLength", "minimum", "maximum",
                "exclusiveMinimum", "exclusiveMaximum", "multipleOf"))
        return "any"

    def object(self, schema: dict[str, Any], depth: int) -> str:
        properties: dict[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties", True)
        notes = self.notes(schema, ("minProperties", "maxProperties"))
        if not properties and extra is True:
            return "object" + notes
        required = set(schema.get("required") or ())
        pad = self.indent * (depth + 1)
        lines = []
        entries = [(json.dumps(k) + ("" if k in required else "?"), v)
                   for k, v in properties.items()]
        entries += [(json.dumps(k), True) for k in sorted(required) if k not in properties]
        # Other keys, when allowed, are shown only where they carry a schema or are all
        # there is: a "..." after every property list costs tokens and invites extra keys.
        if extra is not False and (extra is not True or not properties):
            entries.append(("[key: string]", extra))
        if not entries:
            return "{}" + notes
        for i, (key, sub) in enumerate(entries):
            comma = "," if i < len(entries) - 1 else ""
            line = f"{pad}{key}: {self.value(sub, depth + 1)}{comma}"
            comment = self.comment(sub)
            lines.append(f"{line} // {comment}" if comment else line)
        closing = self.indent * depth + "}"
        return "{\n" + "\n".join(lines) + "\n" + closing + notes

    @staticmethod
    def comment(schema: Any) -> str:
        if not isinstance(schema, dict):
            return ""
        # Titles are left out: Pydantic titles every field with its own name ("Zip Code").
        text = _one_line(schema.get("description") or "")
        if "default" in schema:
            default = f"default {json.dumps(schema['default'])}"
            text = f"{text} ({default})" if text else default
        return text

    @staticmethod
    def notes(schema: dict[str, Any], keys: tuple[str, ...]) -> str:
        said = [f"{k} {json.dumps(schema[k])}" for k in keys if k in schema]
        return f" ({', '.join(said)})" if said else ""
