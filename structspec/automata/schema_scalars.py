"""Strings, integers and numbers for the lowering (``ScalarLowering``, a mixin of
``_Lowering``).

Strings keep lengths, ``pattern`` and ``format`` side by side (``x-regex`` placeholders whose
automata the grammar compiler intersects). Integers: bounds, and ``multipleOf`` as a residue
automaton (``x-multiple``) up to ``MAX_MODULUS``, else an enumeration between close bounds.
Numbers: any decimal bounds as regexes and decimal ``multipleOf`` (``x-decimal-multiple``).
"""

from __future__ import annotations

import math
from typing import Any

from structspec.automata.schema_keywords import (
    MAX_BOUND,
    MAX_ENUMERATED,
    MAX_MODULUS,
    STANDARD_FORMATS,
)
from structspec.automata.schema_negation import NON_INTEGER, NOT_MULTIPLE, NOT_PATTERN
from structspec.automata.schema_regex import FORMATS, _int_range, _Refuse, pattern_regex


def decimal_step(step: float) -> tuple[int, int] | None:
    """``step`` as ``(a, k)`` with ``step == a / 10**k`` exactly in decimal (``0.01`` ->
    ``(1, 2)``), or ``None`` when its automaton would need over ``MAX_MODULUS`` states."""
    from decimal import Decimal

    _, digits, exp = Decimal(repr(float(step))).normalize().as_tuple()
    a = int("".join(map(str, digits)))
    k = -int(exp)
    if k < 0:
        a, k = a * 10 ** (-k), 0
    if a * (k + 3) > MAX_MODULUS:
        return None
    return a, k


class ScalarLowering:
    """``string``, ``integer`` and ``number`` schemas."""

    # Provided by _Lowering.
    refuse: Any
    nothing: Any
    placeholder: Any
    is_valid: Any

    def lower_string(self, node: dict[str, Any], ptr: str, top: bool = False) -> Any:
        """Strings: lengths, pattern and format all at once (their automata are intersected
        by the grammar compiler), as ``x-regex`` placeholders beside the lengths."""
        lo, hi = node.get("minLength"), node.get("maxLength")
        if lo is not None and hi is not None and lo > hi:
            return self.nothing(ptr, "minLength exceeds maxLength")
        return self.lower_string_grammar(node, ptr, lo, hi, node.get("pattern"),
                                         node.get("format"))


    def lower_string_grammar(self, node: dict[str, Any], ptr: str, lo: Any, hi: Any,
                             pattern: Any, fmt: Any) -> Any:
        """Strings for the grammar compiler: lengths, pattern and format all at once (their
        automata are intersected there), as ``x-regex`` placeholders beside the lengths."""
        out: dict[str, Any] = {"type": "string"}
        if lo is not None:
            out["minLength"] = int(lo)
        if hi is not None:
            out["maxLength"] = int(hi)
        regexes = []
        if pattern is not None:
            try:
                body = pattern_regex(pattern, quote=True, max_repeat=None, search=True)
                regexes.append(f'"(?:{body})"')
            except _Refuse as exc:
                self.refuse("pattern", ptr, str(exc))
        not_patterns = []
        for banned in node.get(NOT_PATTERN, ()):  # (from a negation) a superset, excluded
            try:
                wide = pattern_regex(banned, quote=True, max_repeat=None, search=True, wide=True)
            except _Refuse as exc:
                self.refuse("not", ptr, f"cannot exclude the pattern {banned!r}: {exc}")
                continue
            not_patterns.append(self.placeholder(f'"(?:{wide})"')["const"])
        if not_patterns:  # within the spellings the pattern automata use
            canonical = pattern_regex("", quote=True, max_repeat=None, search=True)
            regexes.append(f'"(?:{canonical})"')
            out["x-not-regex"] = not_patterns
        if fmt is not None:
            if fmt in FORMATS:
                regexes.append(f'"(?:{FORMATS[fmt]})"')
            elif fmt in STANDARD_FORMATS:
                self.refuse("format", ptr, f"format {fmt!r} is not supported "
                            f"(supported: {', '.join(sorted(FORMATS))})")
            # Formats the specification does not define are annotations: ignored, as the
            # spec asks and as validators do (e.g. "path", "url", "topic").
        if regexes:
            out["x-regex"] = [self.placeholder(rx)["const"] for rx in regexes]
        return out


    def bounds(self, node: dict[str, Any], ptr: str, integer: bool) -> tuple[Any, Any]:
        """Lower and upper bounds as ``(value, exclusive)``; integers get inclusive ones."""
        found: list[Any] = [None, None]
        for side, plain, strict in ((0, "minimum", "exclusiveMinimum"),
                                    (1, "maximum", "exclusiveMaximum")):
            cands = []
            if plain in node:
                draft4 = node.get(strict) is True
                cands.append((node[plain], draft4))
            if strict in node and not isinstance(node[strict], bool):
                cands.append((node[strict], True))
            for value, excl in cands:
                if abs(value) > MAX_BOUND:
                    self.refuse(strict if excl and strict in node else plain, ptr,
                                "bound too large")
                    continue
                if integer:  # fold into an inclusive integer bound
                    value = (math.floor(value) + 1 if excl else math.ceil(value)) if side == 0 \
                        else (math.ceil(value) - 1 if excl else math.floor(value))
                    excl = False
                elif value != int(value):
                    self.refuse(strict if excl and strict in node else plain, ptr,
                                "only integer bounds of numbers are supported")
                    continue
                bound = (int(value), excl)
                best = found[side]
                tighter = best is None or (bound[0] > best[0] if side == 0 else bound[0] < best[0])
                if tighter or (bound[0] == best[0] and bound[1]):
                    found[side] = bound
        return found[0], found[1]


    def lower_integer(self, node: dict[str, Any], ptr: str) -> Any:
        if node.get(NON_INTEGER) is True:  # an integer with a non-zero fraction: none
            return self.nothing(ptr, "an integer is required where integers are excluded")
        out = self.lower_integer_plain(node, ptr)
        not_multiple = node.get(NOT_MULTIPLE)
        if not_multiple is None or out is None or "enum" in out:  # (enum: is_valid checked)
            return out
        if not_multiple > MAX_MODULUS:
            self.refuse("not", ptr, f"excluding multiples of {not_multiple} needs over "
                        f"{MAX_MODULUS} automaton states")
            return out
        if "const" in out:  # a bare range regex
            out = {"type": "integer", "x-regex": [out["const"]]}
        return {**out, "x-not-multiple": int(not_multiple)}


    def lower_integer_plain(self, node: dict[str, Any], ptr: str) -> Any:
        """Integers: bounds, ``multipleOf`` (a residue automaton or an enumeration)."""
        low, high = self.bounds(node, ptr, integer=True)
        lo, hi = (low[0] if low else None), (high[0] if high else None)
        step = node.get("multipleOf")
        if step is not None and not float(step).is_integer():
            # An integer x is a multiple of a / 10**k iff x * 10**k is divisible by a, i.e.
            # iff x is a multiple of a / gcd(a, 10**k).
            frac = decimal_step(step)
            if frac is not None:
                step = frac[0] // math.gcd(frac[0], 10 ** frac[1])
        if step is not None and step != 1 and float(step).is_integer() \
                and 1 < step <= MAX_MODULUS:
            # Multiples of an integer are a regular language (a residue automaton), so no
            # enumeration is needed: intersected with the bounds in the grammar compiler.
            out: dict[str, Any] = {"type": "integer", "x-multiple": int(step)}
            if lo is not None or hi is not None:
                regex = _int_range(lo, hi)
                if regex is None:
                    return self.nothing(ptr, "empty integer range")
                out["x-regex"] = [self.placeholder(regex)["const"]]
            return out
        if step is not None and step != 1:
            if lo is not None and hi is not None and hi - lo <= MAX_ENUMERATED:
                values = [v for v in range(hi, lo - 1, -1) if self.is_valid(node, v)]
                values.sort(key=lambda v: -len(str(v)))  # longest first: see _longest_first
                return {"enum": values} if values else self.nothing(ptr, "no multiple in range")
            self.refuse("multipleOf", ptr, "supported only for integers between bounds at "
                        f"most {MAX_ENUMERATED} apart")
        if lo is None and hi is None:
            return {"type": "integer"}
        regex = _int_range(lo, hi)
        return self.placeholder(regex) if regex else self.nothing(ptr, "empty integer range")


    def decimal_bounds(self, node: dict[str, Any], ptr: str) -> Any:
        """Grammar mode: any decimal bounds, as one regex per side (intersected later)."""
        from decimal import Decimal

        from structspec.automata.decimal_bounds import number_at_least, number_at_most

        sides = []
        for plain, strict_kw, side in (("minimum", "exclusiveMinimum", number_at_least),
                                       ("maximum", "exclusiveMaximum", number_at_most)):
            if plain in node:
                sides.append((node[plain], node.get(strict_kw) is True, side, plain))
            if strict_kw in node and not isinstance(node[strict_kw], bool):
                sides.append((node[strict_kw], True, side, strict_kw))
        regexes = []
        for value, strict, side, keyword in sides:
            if abs(value) > MAX_BOUND:
                self.refuse(keyword, ptr, "bound too large")
                continue
            regexes.append(side(Decimal(str(value)), strict))
        out: dict[str, Any] = {"type": "number"}
        if regexes:
            out["x-regex"] = [self.placeholder(rx)["const"] for rx in regexes]
        return out


    def lower_number(self, node: dict[str, Any], ptr: str) -> Any:
        step = decimal_step(node["multipleOf"]) if "multipleOf" in node else None
        if "multipleOf" in node and step is None:
            self.refuse("multipleOf", ptr, f"a step of {node['multipleOf']!r} needs over "
                        f"{MAX_MODULUS} automaton states")
        out = self.decimal_bounds(node, ptr)
        if step is not None:  # exact decimal multiples, written without exponent
            out["x-decimal-multiple"] = list(step)
        if node.get(NON_INTEGER) is True:  # written without exponent: a narrowing
            out["x-regex"] = [*out.get("x-regex", ()), self.placeholder(
                r"-?(?:0|[1-9][0-9]*)\.[0-9]*[1-9][0-9]*")["const"]]
        return out
