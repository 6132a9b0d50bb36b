"""Validating outputs against their schema, numbers read as the decimals they spell.

The compiled automaton means JSON's numbers: decimals, exactly as written. Python's ``json``
reads them as floats, and a float can round across a bound or onto an integer —
``0.99999999999999999`` reads as ``1.0``, which ``exclusiveMaximum: 1`` refuses, and
``1.00000000000000001`` as a float with no fraction, which ``not: {type: integer}`` refuses —
while ``jsonschema`` divides floats for ``multipleOf`` (``19.99`` is no multiple of ``0.01``).
Validating a float reading would call such outputs invalid although they are valid, and an
exact constraint's output that fails validation is reported as an internal error. So outputs
are validated as text: numbers parsed as :class:`~decimal.Decimal`, against the schema with
its own floats read back as the decimals they print as (the compiler reads them so).
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import cache
from typing import Any

__all__ = ["decimal_validator", "exact_validator", "text_problem"]


def exact_fraction(value: Any) -> Fraction:
    """The number a JSON number was written as, exactly (a float's ``repr`` round-trips)."""
    if isinstance(value, (int, Decimal)):
        return Fraction(value)
    return Fraction(Decimal(repr(value)))


def exact_multiple_of(validator: Any, step: Any, instance: Any, schema: Any) -> Any:
    """``multipleOf`` in decimal arithmetic, as the specification means it (``jsonschema``
    divides floats: it finds ``19.99`` not a multiple of ``0.01``)."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "number") or isinstance(instance, bool):
        return
    if (exact_fraction(instance) / exact_fraction(step)).denominator != 1:
        yield ValidationError(f"{instance!r} is not a multiple of {step}")


@cache
def exact_validator(cls: Any) -> Any:
    """``cls`` with exact decimal ``multipleOf`` (the grammar enforces that meaning)."""
    from jsonschema.validators import extend

    return extend(cls, {"multipleOf": exact_multiple_of})


@cache
def _decimal_class(cls: Any) -> Any:
    """:func:`exact_validator` of ``cls`` whose ``integer`` also means a decimal without a
    fraction — where the draft counts ``1.0`` as an integer (draft 6 on; not draft 4)."""
    from jsonschema.validators import extend

    exact = exact_validator(cls)
    checker = cls.TYPE_CHECKER
    if not checker.is_type(1.0, "integer"):
        return exact
    decimal_integer = checker.redefine("integer", lambda tc, instance: (
        checker.is_type(instance, "integer")
        or (isinstance(instance, Decimal) and instance.is_finite()
            and instance == instance.to_integral_value())))
    return extend(exact, type_checker=decimal_integer)


def decimal_schema(node: Any) -> Any:
    """A copy of ``node`` with every float read back as the decimal it prints as."""
    if isinstance(node, float):
        return Decimal(repr(node))
    if isinstance(node, list):
        return [decimal_schema(v) for v in node]
    if isinstance(node, dict):
        return {k: decimal_schema(v) for k, v in node.items()}
    return node


def decimal_validator(schema: Any, cls: Any) -> Any:
    """A validator of ``schema`` (draft ``cls``, format checking on) for instances whose
    numbers are :class:`~decimal.Decimal`: see :func:`text_problem`."""
    return _decimal_class(cls)(decimal_schema(schema), format_checker=cls.FORMAT_CHECKER)


_EXPONENT_CLAMP = 10**15


def _decimal(text: str) -> Decimal:
    """``text`` as a :class:`~decimal.Decimal`; an exponent beyond what one holds
    (``1e99999999999999999999``, which unbounded numbers may spell) is clamped to 10**15,
    which keeps the number's sign, whether it is zero or an integer, and its order against
    any bound a schema can write."""
    try:
        return Decimal(text)
    except InvalidOperation:
        mantissa, _, exponent = text.lower().partition("e")
        digits = exponent.lstrip("+-").lstrip("0") or "0"
        size = min(int(digits), _EXPONENT_CLAMP) if len(digits) <= 16 else _EXPONENT_CLAMP
        return Decimal(f"{mantissa}e{-size if exponent.startswith('-') else size}")


def text_problem(validator: Any, text: str) -> str | None:
    """Why the JSON ``text`` is not valid under ``validator`` (a :func:`decimal_validator`),
    its numbers read exactly; ``None`` if it is valid."""
    try:
        value = json.loads(text, parse_float=_decimal)
    except ValueError as exc:
        return f"not JSON: {exc}"
    error = next(iter(validator.iter_errors(value)), None)
    if error is None:
        return None
    where = "/" + "/".join(str(p) for p in error.absolute_path)
    return f"{error.message} (at instance {where})"
