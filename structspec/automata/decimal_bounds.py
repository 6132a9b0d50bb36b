"""Regexes of the JSON numbers on one side of a decimal bound (``minimum: 0.5``).

``x >= L`` (or ``x > L``) for any decimal ``L``, as a regex over JSON number text without an
exponent (a documented narrowing); a range is the DFA intersection of its two sides, so no
regex here has to handle both bounds at once. Digit-string comparison: a fraction ``.d`` is
at least ``.s`` exactly when, at the first position where they differ, ``d`` has the larger
digit, or ``d`` extends ``s``.
"""

from __future__ import annotations

from decimal import Decimal

_FRACTION = r"(?:\.[0-9]+)?"


def _uint_from(n: int) -> str:
    """Canonical decimal integers ``>= n`` (``n >= 0``)."""
    s = str(n)
    parts = [f"[1-9][0-9]{{{len(s)},}}"]  # longer numbers
    for k in range(len(s)):  # same length, larger at position k
        d = int(s[k])
        top = 9
        lo_digit = d + 1
        if lo_digit > top:
            continue
        first = k == 0 and len(s) > 1
        lo_digit = max(lo_digit, 1) if first else lo_digit
        parts.append(f"{s[:k]}[{lo_digit}-{top}][0-9]{{{len(s) - k - 1}}}")
    parts.append(s)
    return "(?:" + "|".join(parts) + ")"


def _uint_below(n: int) -> str | None:
    """Canonical decimal integers ``< n`` (``n >= 1``), or ``None`` when there are none."""
    if n <= 0:
        return None
    s = str(n)
    parts = ["0"] if n > 0 else []
    for length in range(1, len(s)):  # shorter positive numbers
        parts.append(f"[1-9][0-9]{{{length - 1}}}")
    for k in range(len(s)):  # same length, smaller at position k
        d = int(s[k])
        lo_digit = 1 if k == 0 else 0
        if d - 1 < lo_digit:
            continue
        if k == 0 and len(s) == 1:
            continue  # single digits below n are covered by "0" and the shorter-number case
        parts.append(f"{s[:k]}[{lo_digit}-{d - 1}][0-9]{{{len(s) - k - 1}}}")
    if len(s) == 1 and n > 1:
        parts.append(f"[1-{n - 1}]")
    return "(?:" + "|".join(parts) + ")"


def _digits_at_least(s: str, strict: bool) -> str:
    """Non-empty digit strings ``d`` with ``0.d >= 0.s`` (``> 0.s`` if strict); ``s`` has no
    trailing zero."""
    parts = [f"{s[:k]}[{int(s[k]) + 1}-9][0-9]*" for k in range(len(s)) if s[k] != "9"]
    parts.append(f"{s}[0-9]*[1-9][0-9]*" if strict else f"{s}[0-9]*")
    return "(?:" + "|".join(parts) + ")"


def _digits_at_most(s: str, strict: bool) -> str:
    """Non-empty digit strings ``d`` with ``0.d <= 0.s`` (``<`` if strict); ``s`` has no
    trailing zero (so every proper prefix of ``s`` is strictly smaller)."""
    parts = [f"{s[:k]}[0-{int(s[k]) - 1}][0-9]*" for k in range(len(s)) if s[k] != "0"]
    parts += [f"{s[:k]}0*" for k in range(1, len(s))]
    if not strict:
        parts.append(f"{s}0*")
    return "(?:" + "|".join(parts) + ")"


def _split(a: Decimal) -> tuple[int, str]:
    """``a >= 0`` as (integer part, fraction digits without trailing zeros)."""
    text = format(a, "f")
    whole, _, frac = text.partition(".")
    return int(whole), frac.rstrip("0")


def magnitude_at_least(a: Decimal, strict: bool) -> str:
    """Unsigned numbers ``w`` (``I(.F)?``) with ``w >= a`` (``> a`` if strict), ``a >= 0``."""
    ai, af = _split(a)
    parts = [_uint_from(ai + 1) + _FRACTION]
    if af:
        parts.append(rf"{ai}\.{_digits_at_least(af, strict)}")
    elif strict:
        parts.append(rf"{ai}\.[0-9]*[1-9][0-9]*")
    else:
        parts.append(f"{ai}{_FRACTION}")
    return "(?:" + "|".join(parts) + ")"


def magnitude_at_most(a: Decimal, strict: bool) -> str | None:
    """Unsigned numbers ``w`` with ``w <= a`` (``< a`` if strict), ``a >= 0``; ``None`` if
    none (``w < 0``)."""
    ai, af = _split(a)
    parts = []
    below = _uint_below(ai)
    if below is not None:
        parts.append(below + _FRACTION)
    if af:
        parts.append(rf"{ai}(?:\.{_digits_at_most(af, strict)})?")
    elif not strict:
        parts.append(rf"{ai}(?:\.0+)?")
    return "(?:" + "|".join(parts) + ")" if parts else None


def number_at_least(bound: Decimal, strict: bool) -> str:
    """JSON numbers (no exponent) ``x >= bound`` (``> bound`` if strict)."""
    if bound > 0:
        return magnitude_at_least(bound, strict)
    # x >= -m: every non-negative x (x > -m too, unless m == 0 and strict), and negatives
    # whose magnitude is at most m.
    m = -bound
    positive = magnitude_at_least(Decimal(0), strict and m == 0)
    negative = magnitude_at_most(m, strict)
    return f"(?:{positive}|-{negative})" if negative else positive


def number_at_most(bound: Decimal, strict: bool) -> str:
    """JSON numbers (no exponent) ``x <= bound`` (``< bound`` if strict)."""
    if bound < 0:
        return "-" + magnitude_at_least(-bound, strict)
    negative = magnitude_at_least(Decimal(0), strict and bound == 0)
    positive = magnitude_at_most(bound, strict)
    return f"(?:-{negative}|{positive})" if positive else "-" + negative
