"""``allOf`` as a real intersection: merge subschemas into one, exactly, or say why not.

Real schemas compose with ``allOf: [{"$ref": base}, {"properties": ..., "required": ...}]``
and put keywords beside ``$ref`` or ``anyOf``. The lowering handles one schema at a time, so
composition is folded into a single equivalent schema first. Every rule here is an exact
identity of JSON Schema semantics (intersection of constraints); where none applies the
merge fails with :class:`MergeError` naming the keyword, and the caller refuses the schema
(never a silent widening).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from structspec.automata.limits import check_time

#: Keywords that only annotate; dropped by the merge.
_IGNORED = {"title", "description", "examples", "default", "$comment", "deprecated",
            "readOnly", "writeOnly", "$schema", "$id", "$anchor", "$defs", "definitions"}
_LOWER_BOUNDS = {"minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum"}
_UPPER_BOUNDS = {"maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum"}
_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")
#: Keywords that assert something in some draft (and the lowering's internal ones); any other
#: keyword is an annotation, which two parts may give different values (the first is kept).
_ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "items",
    "additionalItems", "prefixItems", "maxItems", "minItems", "uniqueItems", "contains",
    "minContains", "maxContains", "maxProperties", "minProperties", "required", "properties",
    "patternProperties", "additionalProperties", "dependencies", "dependentRequired",
    "dependentSchemas", "propertyNames", "if", "then", "else", "allOf", "anyOf", "oneOf", "not",
    "$ref", "$dynamicRef", "$recursiveRef", "unevaluatedItems", "unevaluatedProperties",
    "extends", "disallow", "divisibleBy", "id",
    "x-structspec-non-integer", "x-structspec-not-multiple", "x-structspec-some-extra",
    "x-structspec-not-pattern",
})


class MergeError(Exception):
    """The subschemas cannot be merged exactly; ``keyword`` is the obstacle."""

    def __init__(self, keyword: str, detail: str) -> None:
        self.keyword = keyword
        super().__init__(detail)


def _types(value: Any) -> set[str]:
    return {value} if isinstance(value, str) else set(value)


def _merge_types(a: Any, b: Any) -> list[str]:
    ta, tb = _types(a), _types(b)
    out = ta & tb
    if "number" in ta and "integer" in tb:
        out.add("integer")
    if "integer" in ta and "number" in tb:
        out.add("integer")
    return [t for t in _TYPES if t in out]


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _equal_values(a: Any, b: Any) -> bool:
    """JSON equality (``1 == 1.0``, ``True != 1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return _same(a, b)


def _both(a: Any, b: Any) -> Any:
    """The conjunction of two subschemas (an ``allOf`` unless one side is trivial)."""
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


_CONDITIONAL = ("if", "then", "else")
_CONTAINS = ("contains", "minContains", "maxContains")


def _contains_unit(node: dict[str, Any]) -> tuple[Any, int, int | None] | None:
    """``(contains schema, minContains, maxContains)`` of ``node`` (defaults 1 and no
    bound), or ``None`` without ``contains`` (the bounds alone have no effect)."""
    if "contains" not in node:
        return None
    hi = node.get("maxContains")
    return node["contains"], int(node.get("minContains", 1)), None if hi is None else int(hi)


def _merge_draft4_bounds(a: dict[str, Any], b: dict[str, Any]
                         ) -> tuple[dict[str, Any], set[str]]:
    """``minimum``/``maximum`` with draft 4's boolean ``exclusiveMinimum``/``exclusiveMaximum``,
    merged as units: the flag belongs to its own part's bound (``> 5`` and ``>= 10`` is
    ``>= 10``, not ``> 10``); the stricter bound wins, a tie keeps either flag. A numeric
    flag beside them (a complement's, written in the later drafts' form) is a bound of its
    own, exclusive. Returns the merged keys and the keys of both parts they replace; bounds
    without a boolean flag on either side are left to the key-by-key merge."""
    out: dict[str, Any] = {}
    consumed: set[str] = set()
    for key, flag, lower in (("minimum", "exclusiveMinimum", True),
                             ("maximum", "exclusiveMaximum", False)):
        if not any(isinstance(part.get(flag), bool) for part in (a, b)):
            continue
        consumed.add(flag)
        bounds = [(part[key], part.get(flag) is True) for part in (a, b) if key in part]
        bounds += [(part[flag], True) for part in (a, b)
                   if isinstance(part.get(flag), (int, float))
                   and not isinstance(part.get(flag), bool)]
        if not bounds:
            continue  # a flag without its bound has no effect
        value = max(v for v, _ in bounds) if lower else min(v for v, _ in bounds)
        out[key] = value
        consumed.add(key)
        if any(v == value and ex for v, ex in bounds):
            out[flag] = True
    return out, consumed


def _merge_contains(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``contains`` with its bounds, merged as one unit: each part counts the items that
    match its own schema, so the bounds of a part never apply to the other's schema (a
    part's missing ``minContains`` is 1, not "no bound"). Two parts with the same schema
    intersect their count ranges.

    Raises:
        MergeError: two different schemas that both count (``contains X`` and
            ``contains Y`` is not ``contains (X and Y)``: ``[x, y]`` passes the first).
    """
    ua, ub = _contains_unit(a), _contains_unit(b)
    if ua is not None and ua[1:] == (0, None):  # counts nothing: no effect
        ua = None
    if ub is not None and ub[1:] == (0, None):
        ub = None
    if ua is None or ub is None:
        src = a if ua is not None else b if ub is not None else {}
        return {k: src[k] for k in _CONTAINS if k in src}
    (sa, la, ha), (sb, lb, hb) = ua, ub
    if not _same(sa, sb):
        raise MergeError("contains", "two different contains schemas each count their own "
                                     "matches; one contains cannot say both")
    bounds = [h for h in (ha, hb) if h is not None]
    out: dict[str, Any] = {"contains": sa}
    if max(la, lb) != 1:
        out["minContains"] = max(la, lb)
    if bounds:
        out["maxContains"] = min(bounds)
    return out


def _conditional_unit(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` without ``if``/``then``/``else`` that have no effect (``then``/``else``
    without ``if``; ``if`` alone), so that the rest is merged as one unit."""
    if "if" not in node or ("then" not in node and "else" not in node):
        return {k: v for k, v in node.items() if k not in _CONDITIONAL}
    return node


def _lcm(a: float, b: float) -> float:
    """The least common multiple of two positive steps, exactly in decimal.

    Raises:
        MergeError: the result has no exact float spelling.
    """
    from decimal import Decimal
    from fractions import Fraction
    from math import gcd

    fa, fb = (Fraction(Decimal(repr(x))) if isinstance(x, float) else Fraction(x)
              for x in (a, b))
    out = Fraction(fa.numerator * fb.numerator // gcd(fa.numerator, fb.numerator),
                   gcd(fa.denominator, fb.denominator))
    if out.denominator == 1:
        return int(out.numerator)
    value = float(out)
    if Fraction(Decimal(repr(value))) != out:
        raise MergeError("multipleOf", "the common multiple has no exact spelling")
    return value


def merge_pair(a: Any, b: Any) -> Any:
    """One schema accepting exactly what both ``a`` and ``b`` accept.

    Raises:
        MergeError: no exact merge is known for some keyword.
    """
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    for part in (a, b):
        ident = part.get("$id")
        if isinstance(ident, str) and not ident.startswith("#"):
            raise MergeError("$id", "a subschema with its own $id moves the base of its refs")
    a = _conditional_unit({k: v for k, v in a.items() if k not in _IGNORED})
    b = _conditional_unit({k: v for k, v in b.items() if k not in _IGNORED})
    if any(k in a for k in _CONDITIONAL) and any(k in b for k in _CONDITIONAL) and \
            not all(_same(a.get(k), b.get(k)) for k in _CONDITIONAL):
        # Each if/then/else works within its own subschema: two cannot share one node.
        raise MergeError("if", "two if/then/else from different subschemas")
    for key in ("unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"):
        if key in a or key in b:  # these see annotations across applicators: not local
            raise MergeError(key, f"{key} depends on what sibling applicators evaluate")
    tuple_a = "prefixItems" in a or isinstance(a.get("items"), list)
    tuple_b = "prefixItems" in b or isinstance(b.get("items"), list)
    tuple_out: dict[str, Any] = {}
    if tuple_a or tuple_b:  # `items` means "after the prefix" only beside its own prefix
        array_keys = ("items", "prefixItems", "additionalItems")
        if any(k in a for k in array_keys) and any(k in b for k in array_keys):
            tuple_out = _merge_tuples(a, b)
            a = {k: v for k, v in a.items() if k not in array_keys}
            b = {k: v for k, v in b.items() if k not in array_keys}
    bounds, consumed = _merge_draft4_bounds(a, b)
    merged = set(_CONTAINS) | consumed
    out: dict[str, Any] = {**tuple_out, **_merge_contains(a, b), **bounds}
    a = {k: v for k, v in a.items() if k not in merged}
    b = {k: v for k, v in b.items() if k not in merged}
    for key in list(dict.fromkeys([*a, *b])):
        if key in ("properties", "additionalProperties", "patternProperties"):
            continue  # objects are merged together below
        if key not in b:
            out[key] = a[key]
        elif key not in a:
            out[key] = b[key]
        elif _same(a[key], b[key]) or key not in _ASSERTIONS:
            out[key] = a[key]
        elif key == "type":
            out[key] = _merge_types(a[key], b[key])
        elif key == "required" or key == "x-structspec-not-pattern":  # lists: all apply
            out[key] = list(dict.fromkeys([*a[key], *b[key]]))
        elif key == "enum":
            out[key] = [x for x in a[key] if any(_equal_values(x, y) for y in b[key])]
        elif key == "const":
            if not _equal_values(a[key], b[key]):
                return False
            out[key] = a[key]
        elif key in _LOWER_BOUNDS and not isinstance(a[key], bool):
            out[key] = max(a[key], b[key])
        elif key in _UPPER_BOUNDS and not isinstance(a[key], bool):
            out[key] = min(a[key], b[key])
        elif key in ("items", "additionalItems", "propertyNames") \
                and isinstance(a[key], (dict, bool)) and isinstance(b[key], (dict, bool)):
            out[key] = _both(a[key], b[key])
        elif key == "allOf":
            out[key] = [*a[key], *b[key]]
        elif key == "anyOf" or key == "oneOf":
            # (A1 | A2) & (B1 | B2): distribute, keeping branch order.
            if key == "oneOf":
                raise MergeError(key, "two oneOf lists cannot be intersected exactly here")
            out[key] = [_both(x, y) for x in a[key] for y in b[key]]
        elif key == "multipleOf":  # multiples of both: of their least common multiple
            out[key] = _lcm(a[key], b[key])
        elif key == "not":  # neither a nor b: not (a or b)
            out[key] = {"anyOf": [a[key], b[key]]}
        elif key == "uniqueItems":
            out[key] = bool(a[key]) or bool(b[key])
        else:
            raise MergeError(key, f"two different {key!r} values cannot be merged")
    if "type" in out and out["type"] == []:
        return False
    _merge_objects(a, b, out)
    return out


def _tuple_view(node: dict[str, Any]) -> tuple[list[Any], Any]:
    """``(schemas of the first positions, schema of every later position)``, in any draft."""
    if "prefixItems" in node:
        return list(node["prefixItems"]), node.get("items", True)
    if isinstance(node.get("items"), list):
        return list(node["items"]), node.get("additionalItems", True)
    return [], node.get("items", True)


def _merge_tuples(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Array positions of two subschemas, position by position: each item must satisfy, in
    each part, that part's schema for its position (a prefix schema, else the rest)."""
    pa, ra = _tuple_view(a)
    pb, rb = _tuple_view(b)
    n = max(len(pa), len(pb))
    prefix = [_both(pa[i] if i < len(pa) else ra, pb[i] if i < len(pb) else rb)
              for i in range(n)]
    rest = _both(ra, rb)
    if "prefixItems" in a or "prefixItems" in b:  # the parts share their draft's spelling
        return {"prefixItems": prefix, **({} if rest is True else {"items": rest})}
    return {"items": prefix, **({} if rest is True else {"additionalItems": rest})}


def _merge_objects(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any]) -> None:
    """``properties``/``additionalProperties``: a key's value must satisfy, in each part,
    the property schema naming it, or else that part's ``additionalProperties``."""
    if not any(k in part for part in (a, b)
               for k in ("properties", "additionalProperties", "patternProperties")):
        return
    if "patternProperties" in a or "patternProperties" in b:
        open_a = a.get("additionalProperties", True) in (True, {})
        open_b = b.get("additionalProperties", True) in (True, {})
        if not (open_a and open_b):
            raise MergeError("patternProperties",
                             "patternProperties cannot be merged with other properties here")
        # Without additionalProperties, a key's value takes every matching pattern's schema
        # of both parts (and both named schemas): the union of the patterns says just that.
        patterns = dict(a.get("patternProperties", {}))
        for pattern, sub in b.get("patternProperties", {}).items():
            patterns[pattern] = _both(patterns[pattern], sub) if pattern in patterns else sub
        out["patternProperties"] = patterns
    pa, pb = a.get("properties", {}), b.get("properties", {})
    xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
    props: dict[str, Any] = {}
    for name in list(dict.fromkeys([*pa, *pb])):
        props[name] = _both(pa.get(name, xa), pb.get(name, xb))
    if props:
        out["properties"] = props
    extra = _both(xa, xb)
    if extra is not True:
        out["additionalProperties"] = extra


def merge_all(parts: list[Any], deref: Callable[[Any], Any], depth: int = 0) -> Any:
    """Fold ``parts`` (each dereferenced, nested ``allOf`` flattened) into one schema.

    Raises:
        MergeError: as :func:`merge_pair`, or nesting beyond 32 levels.
    """
    if depth > 32:
        raise MergeError("allOf", "allOf nests too deeply")
    # Merges of negated oneOf branches can multiply; the time budget must see them.
    check_time()
    merged: Any = True
    for part in parts:
        part = deref(part)
        if isinstance(part, dict) and "$ref" in part:
            ref_part = deref({"$ref": part["$ref"]})
            if isinstance(ref_part, dict) and "$ref" in ref_part:
                raise MergeError("$ref", "a $ref inside allOf that cannot be resolved here")
            rest = {k: v for k, v in part.items() if k != "$ref"}
            # The subschema's own properties come first, then those of its target: the
            # order in which a reader meets them (``allOf`` parts keep their list order).
            part = merge_all([rest, ref_part], deref, depth + 1)
        if isinstance(part, dict) and "allOf" in part:
            rest = {k: v for k, v in part.items() if k != "allOf"}
            part = merge_all([rest, *part["allOf"]], deref, depth + 1)
        merged = merge_pair(merged, part)
        if merged is False:
            return False
    return merged
