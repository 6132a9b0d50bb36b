"""The complement of a subschema, as a schema: what makes ``not``, ``if``/``then``/``else`` and
overlapping ``oneOf`` exact.

A grammar has no complement in general, but most subschemas that real schemas negate are
small: a ``type``, a ``const``/``enum``, ``required`` properties, a property's value, bounds.
Each keyword of a subschema constrains one JSON type only (``minLength`` says nothing about
numbers), so the complement of a subschema is the union, over its keywords, of "a value of
that keyword's type that breaks it" — plus the other types where ``type`` restricts them:

    not {type: string, minLength: 3}  =  anyOf [{type: [null, boolean, ...]},
                                                 {type: string, maxLength: 2}]

Every rule here is an exact identity of JSON Schema semantics; where none is known
:class:`NegationError` names the keyword, and the caller refuses the schema (never a silent
widening). ``not {enum: [...]}`` stays a ``not`` of values: the lowering excludes values
itself (it knows how each value can be spelled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: JSON types; ``integer`` is a subset of ``number``.
TYPES = ("null", "boolean", "object", "array", "number", "string")
_IGNORED = frozenset({
    "title", "description", "examples", "default", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$schema", "$anchor",
    "$dynamicAnchor", "$id", "id", "$defs", "definitions", "discriminator",
})
_FLIP = {  # bound keyword -> (type, keyword of the broken bound, value transform)
    "minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}
MAX_DEPTH = 16
#: Internal keyword: "a number with a non-zero fraction" (the complement of ``integer``
#: among numbers), which no JSON Schema keyword expresses.
NON_INTEGER = "x-structspec-non-integer"
#: Internal keyword: "an integer that is not a multiple of this integer" (with
#: ``NON_INTEGER`` numbers, the complement of an integer ``multipleOf``).
NOT_MULTIPLE = "x-structspec-not-multiple"
#: Internal keyword: "an object with a key outside ``exclude`` and ``patterns`` whose value
#: matches ``value``" (the complement of ``additionalProperties``).
SOME_EXTRA = "x-structspec-some-extra"
#: Internal keyword: "a string matching none of these patterns" — generated as the
#: canonical spellings minus a *superset* of each pattern (a narrowing, so it has no exact
#: complement itself).
NOT_PATTERN = "x-structspec-not-pattern"
INTERNAL = frozenset({NON_INTEGER, NOT_MULTIPLE, SOME_EXTRA, NOT_PATTERN})


def public_schema(node: Any) -> Any:
    """``node`` with the internal keywords spelled in JSON Schema (``NON_INTEGER`` as
    ``not: {type: integer}``, ``NOT_MULTIPLE`` as ``not: {multipleOf: k}``), for a validator
    that would otherwise ignore them; ``node`` itself when it has none."""
    if isinstance(node, list):
        out_list = [public_schema(v) for v in node]
        return node if all(a is b for a, b in zip(out_list, node)) else out_list
    if not isinstance(node, dict):
        return node
    out = {k: public_schema(v) for k, v in node.items() if k not in INTERNAL}
    extra: list[dict[str, Any]] = []
    extra += [{"not": {"pattern": p}} for p in node.get(NOT_PATTERN, ())]
    if SOME_EXTRA in node:
        witness = node[SOME_EXTRA]
        extra.append({"type": "object",
                      "not": public_schema(_all_extras(witness, negated=False))})
    if node.get(NON_INTEGER) is True:
        extra.append({"not": {"type": "integer"}})
    if NOT_MULTIPLE in node:
        extra.append({"not": {"multipleOf": node[NOT_MULTIPLE]}})
    if not extra and len(out) == len(node) and all(out[k] is node[k] for k in out):
        return node
    if extra:
        out = {"allOf": [out, *extra]}
    return out


class NegationError(Exception):
    """No exact complement is known; ``keyword`` is the obstacle."""

    def __init__(self, keyword: str, detail: str) -> None:
        self.keyword = keyword
        super().__init__(detail)


def _types(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _any_of(parts: list[Any]) -> Any:
    parts = [p for p in parts if p is not False]
    if any(p is True or p == {} for p in parts):
        return True
    if not parts:
        return False
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def _all_of(parts: list[Any]) -> Any:
    parts = [p for p in parts if p is not True and p != {}]
    if any(p is False for p in parts):
        return False
    if not parts:
        return True
    return parts[0] if len(parts) == 1 else {"allOf": parts}


def negate(schema: Any, deref: Callable[[Any], Any], depth: int = 0,
           known: frozenset[str] | None = None) -> Any:
    """A schema accepting exactly the JSON values ``schema`` rejects.

    ``deref`` follows a ``$ref`` (a subschema whose only keyword is ``$ref``) to its target;
    ``known``: the assertion keywords of the draft (others are annotations, ignored).

    Raises:
        NegationError: a keyword of ``schema`` has no known exact complement.
    """
    if depth > MAX_DEPTH:
        raise NegationError("not", "negation nests too deeply (or a recursive $ref)")
    schema = deref(schema)
    if schema is True:
        return False
    if schema is False:
        return True
    if not isinstance(schema, dict):
        raise NegationError("not", f"not a schema: {schema!r}")
    node = {k: v for k, v in schema.items()
            if k not in _IGNORED and (known is None or k in known or k in INTERNAL)}
    if not node:
        return False
    if "$ref" in node:  # the target and the siblings both apply: either may fail
        target = deref({"$ref": node["$ref"]})
        if isinstance(target, dict) and "$ref" in target:
            raise NegationError("$ref", f"cannot negate the reference {node['$ref']!r}")
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _any_of([negate(target, deref, depth + 1, known),
                        negate(rest, deref, depth + 1, known) if rest else False])
    out: list[Any] = []
    types = _types(node["type"]) if "type" in node else None
    if types is not None:
        covered = set(types) | ({"number"} if "integer" in types else set())
        others = [t for t in TYPES if t not in covered]
        if others:
            out.append({"type": others})
        if "integer" in types and "number" not in types:
            out.append({"type": "number", NON_INTEGER: True})
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else list(node["enum"])
        out.append({"not": {"enum": values}})
    for key, value in node.items():
        if key in ("type", "const", "enum"):
            continue
        out.append(_negate_keyword(key, value, node, deref, depth, known))
    return _any_of(out)


def _negate_keyword(key: str, value: Any, node: dict[str, Any],
                    deref: Callable[[Any], Any], depth: int,
                    known: frozenset[str] | None) -> Any:
    """Values (of ``key``'s type) that break ``key``; other types satisfy it vacuously."""
    if key in _FLIP:
        family, other, delta = _FLIP[key]
        bound = int(value) + delta
        return False if bound < 0 else {"type": family, other: bound}
    if key in ("minimum", "maximum"):
        strict = node.get("exclusiveM" + key[1:]) is True  # draft 4's boolean modifier
        if key == "minimum":
            return {"type": "number", "maximum" if strict else "exclusiveMaximum": value}
        return {"type": "number", "minimum" if strict else "exclusiveMinimum": value}
    if key in ("exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(value, bool):  # draft 4: negated together with its bound
            return False
        return {"type": "number", "maximum" if key == "exclusiveMinimum" else "minimum": value}
    if key == "required":
        return _any_of([{"type": "object", "properties": {name: False}} for name in value])
    if key == "properties":
        return _any_of([
            {"type": "object", "required": [name], "properties": {
                name: negate(sub, deref, depth + 1, known)}}
            for name, sub in value.items() if deref(sub) is not True])
    if key == "anyOf":
        return _all_of([negate(b, deref, depth + 1, known) for b in value])
    if key == "allOf":
        return _any_of([negate(b, deref, depth + 1, known) for b in value])
    if key == "not":
        return value
    if key == "oneOf" and len(value) <= 8:  # none of the branches, or two of them
        negated = [negate(b, deref, depth + 1, known) for b in value]
        pairs = [_all_of([value[i], value[j]])
                 for i in range(len(value)) for j in range(i + 1, len(value))]
        return _any_of([_all_of(negated), *pairs])
    if key == "multipleOf" and float(value).is_integer() and value >= 1:
        # non-integers are multiples of no integer; integers: the other residues
        return _any_of([{"type": "number", NON_INTEGER: True},
                        {"type": "integer", NOT_MULTIPLE: int(value)}])
    if key == "if":  # not ((if and then) or (not if and else))
        then, other = node.get("then", True), node.get("else", True)
        parts = []
        not_then = negate(then, deref, depth + 1, known)
        if not_then is not False:
            parts.append(_all_of([value, not_then]))
        not_else = negate(other, deref, depth + 1, known)
        if not_else is not False:
            parts.append(_all_of([negate(value, deref, depth + 1, known), not_else]))
        return _any_of(parts)
    if key in ("then", "else"):  # negated with their `if` (alone: no effect)
        return False
    if key == "items" and not isinstance(value, list) and "prefixItems" not in node:
        sub = negate(value, deref, depth + 1, known)  # some item outside the schema
        return False if sub is False else {"type": "array", "contains": sub}
    if key == "contains":
        return _negate_contains(value, node)
    if key in ("minContains", "maxContains"):  # negated with their `contains`
        return False
    if key == NON_INTEGER:  # numbers that break "no integer": the integers
        return {"type": "integer"} if value is True else False
    if key == NOT_MULTIPLE:  # integers that break "not a multiple of k"
        return {"type": "integer", "multipleOf": value}
    if key == "additionalProperties":  # some key beyond the others, its value outside
        sub = negate(value, deref, depth + 1, known)
        if sub is False:
            return False
        return {"type": "object", SOME_EXTRA: {
            "exclude": list(node.get("properties", {})),
            "patterns": list(node.get("patternProperties", {})), "value": sub}}
    if key == "pattern":  # strings that do not match (narrowed: see NOT_PATTERN)
        return {"type": "string", NOT_PATTERN: [value]}
    if key == "propertyNames" and deref(value) in (False, True, {}):
        # some key fails the names schema: with `false`, any key at all
        return {"type": "object", "minProperties": 1} if deref(value) is False else False
    if key == SOME_EXTRA:  # every key beyond the others has a value outside
        return _all_extras(value, negated=True, deref=deref, depth=depth, known=known)
    if key in ("dependentRequired", "dependencies"):
        return _any_of([_negate_dependency(t, deps, deref, depth, known)
                        for t, deps in value.items()])
    if key == "dependentSchemas":
        return _any_of([_negate_dependency(t, sub, deref, depth, known)
                        for t, sub in value.items()])
    raise NegationError(key, f"no exact complement is known for {key!r}")


def _all_extras(witness: dict[str, Any], negated: bool, deref: Any = None, depth: int = 0,
                known: frozenset[str] | None = None) -> dict[str, Any]:
    """"Every key outside the witness's ``exclude``/``patterns`` has a value outside its
    ``value`` schema" (``negated``: the complement of the value schema is taken; else the
    schema whose failure the witness stands for: ``additionalProperties: not value``)."""
    value = witness["value"]
    rest = negate(value, deref, depth + 1, known) if negated else {"not": value}
    return {"properties": {p: True for p in witness["exclude"]},
            "patternProperties": {q: True for q in witness["patterns"]},
            "additionalProperties": rest}


def _negate_contains(value: Any, node: dict[str, Any]) -> Any:
    """Arrays whose count of items matching ``value`` is outside
    ``minContains``..``maxContains``: fewer (``maxContains: min - 1``) or more."""
    lo = int(node.get("minContains", 1))
    hi = node.get("maxContains")
    parts: list[Any] = []
    if lo > 0:
        parts.append({"type": "array", "contains": value, "minContains": 0,
                      "maxContains": lo - 1})
    if hi is not None:
        parts.append({"type": "array", "contains": value, "minContains": int(hi) + 1})
    return _any_of(parts)


def _negate_dependency(trigger: str, dependency: Any, deref: Callable[[Any], Any], depth: int,
                       known: frozenset[str] | None) -> Any:
    """Objects with key ``trigger`` that break its dependency: a listed key absent, or the
    dependent schema failed."""
    present = {"type": "object", "required": [trigger]}
    if isinstance(dependency, list):
        return _any_of([{**present, "properties": {d: {"not": {}}}} for d in dependency])
    return _all_of([present, negate(dependency, deref, depth + 1, known)])


def if_then_else(cond: Any, then: Any, other: Any, deref: Callable[[Any], Any],
                 known: frozenset[str] | None = None) -> Any:
    """``if``/``then``/``else`` as an ``anyOf``: (if and then) or (not if and else).

    Without ``else`` that is "not if, or then"; without ``then`` "if, or else" — the second
    needs no complement at all.

    Raises:
        NegationError: ``cond`` must be negated and cannot be.
    """
    if other is True or other == {}:
        return _any_of([negate(cond, deref, 0, known), then])
    if then is True or then == {}:
        return _any_of([cond, other])
    return _any_of([_all_of([cond, then]), _all_of([negate(cond, deref, 0, known), other])])


def exactly_one(branches: list[Any], deref: Callable[[Any], Any],
                known: frozenset[str] | None = None) -> list[Any]:
    """``oneOf`` as ``anyOf`` branches: branch ``i`` and none of the others.

    Raises:
        NegationError: some branch cannot be negated.
    """
    negated = [negate(b, deref, 0, known) for b in branches]
    return [_all_of([b, *(n for j, n in enumerate(negated) if j != i)])
            for i, b in enumerate(branches)]


__all__ = ["INTERNAL", "NON_INTEGER", "NOT_MULTIPLE", "NOT_PATTERN", "SOME_EXTRA",
           "NegationError",
           "exactly_one", "if_then_else", "negate", "public_schema"]
