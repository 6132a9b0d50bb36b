"""JSON values as the lowering needs them: JSON types and equality, every spelling of a
string or number as a regex (for exact exclusions), RFC 6901 pointers, and "any value".

Pure functions with no dependency on the rest of the lowering, so each of its mixins
(:mod:`.schema_lowering`, :mod:`.schema_unions`, :mod:`.schema_objects`,
:mod:`.schema_arrays`) imports them directly.
"""

from __future__ import annotations

import re
from typing import Any

#: ``json_type`` of the other Python values, by exact type.
_TYPE_NAMES: dict[type, str] = {str: "string", list: "array", dict: "object"}


def json_type(value: Any) -> str:
    """The JSON type of a Python value, with integers folded into ``number``."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    return _TYPE_NAMES.get(type(value), "object")


def json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality: ``1 == 1.0``, ``True != 1``, containers compared deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(json_equal, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if json_type(a) == json_type(b) == "number":
        return bool(a == b)
    return type(a) is type(b) and a == b


#: JSON numbers without an exponent: the form excluded values are removed from.
PLAIN_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f",
                  "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def string_spellings(value: str) -> str:
    """A regex of every JSON spelling of the string ``value`` (quotes included): each
    character as itself where JSON allows it, its short escape, or ``\\u`` with hex digits
    in either case."""
    parts = []
    for c in value:
        alts = []
        if c not in '"\\' and ord(c) >= 0x20:
            alts.append(re.escape(c))
        if c in _JSON_ESCAPES:
            alts.append(re.escape(_JSON_ESCAPES[c]))
        if ord(c) <= 0xFFFF and not 0xD800 <= ord(c) <= 0xDFFF:
            hex_digits = "".join(f"[{h}{h.upper()}]" if h.isalpha() else h
                                 for h in f"{ord(c):04x}")
            alts.append(r"\\u" + hex_digits)
        parts.append(f"(?:{'|'.join(alts)})")
    return '"' + "".join(parts) + '"'


def number_spellings(value: float, integer: bool) -> str:
    """A regex of the spellings of ``value`` the grammar writes: canonical integers for
    integer schemas (``-0`` too), exponent-free decimals with any trailing zeros otherwise."""
    from decimal import Decimal

    d = Decimal(str(value))
    zero = d == 0
    text = f"{abs(d):f}"
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0")
    sign = "-?" if zero else ("-" if d < 0 else "")
    if integer:
        return f"{sign}{whole}"
    return f"{sign}{whole}\\.{frac}0*" if frac else f"{sign}{whole}(?:\\.0+)?"


def escape_pointer(token: Any) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def resolve_pointer(root: Any, pointer: str) -> Any:
    """The value at an RFC 6901 pointer (``KeyError``/``IndexError`` when absent)."""
    node = root
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def any_value() -> dict[str, Any]:
    """Any JSON value, spelled so that outlines-core groups it.

    outlines-core turns ``{}`` into ``A|B|...`` *without* parentheses, so nested inside an
    object it splits the whole regex (``{"k": {}}`` would accept a bare ``null``); an
    ``anyOf`` of the types is wrapped properly.
    """
    return {"anyOf": [{"type": t} for t in ("null", "boolean", "number", "string", "array",
                                            "object")]}
