"""Arrays for the lowering (``ArrayLowering``, a mixin of ``_Lowering``): ``items``,
``prefixItems``, lengths, ``contains``/``minContains``/``maxContains`` and ``uniqueItems``.

- **contains** is regular over items: every item either matches ``contains`` (and ``items``)
  or matches ``items`` and the exact complement of ``contains`` (:mod:`.schema_negation`);
  the grammar counts the matching ones up to the bound (``x-contains``: a rule per (items so
  far, matches so far), both saturating where no bound needs more, at most
  ``MAX_COUNTED_STATES``).
- **uniqueItems** is exact where every item comes from a finite set of values (``enum``,
  booleans, ``null``, and ``anyOf`` of those, per position of a tuple): the grammar carries
  the set of values used so far (``x-unique``), at most ``MAX_UNIQUE_STATES`` sets; JSON-equal
  values (``1``, ``1.0``) are one value. Elsewhere it holds only when at most one item fits.
"""

from __future__ import annotations

from typing import Any

from structspec.automata.schema_negation import NegationError, negate
from structspec.automata.schema_values import json_equal

#: (items so far) x (matches so far) rules of one array with ``contains``.
MAX_COUNTED_STATES = 4096
#: Sets of used values of one array with ``uniqueItems``.
MAX_UNIQUE_STATES = 4096

_MISSING: Any = object()


def finite_values(lowered: Any) -> list[Any] | None:
    """The values of a lowered schema when it has finitely many (spelled one way each), else
    ``None``."""
    if not isinstance(lowered, dict):
        return None
    if "anyOf" in lowered:
        out: list[Any] = []
        for branch in lowered["anyOf"]:
            sub = finite_values(branch)
            if sub is None:
                return None
            out += sub
        return out
    if "enum" in lowered:
        return list(lowered["enum"])
    if lowered.get("type") == "boolean" and len(lowered) == 1:
        return [True, False]
    if lowered.get("type") == "null" and len(lowered) == 1:
        return [None]
    return None


def unique_states(positions: list[list[int]], rest: list[int] | None, hi: int | None,
                  budget: int) -> int | None:
    """How many sets of used values an array with unique items can pass through (position
    ``i`` draws from ``positions[i]``, later ones from ``rest``), or ``None`` above
    ``budget``."""
    seen: set[frozenset[int]] = {frozenset()}
    frontier: list[frozenset[int]] = [frozenset()]
    while frontier:
        nxt = []
        for used in frontier:
            i = len(used)
            if hi is not None and i >= hi:
                continue
            domain = positions[i] if i < len(positions) else rest
            for v in domain or ():
                if v not in used:
                    grown = used | {v}
                    if grown not in seen:
                        seen.add(grown)
                        if len(seen) > budget:
                            return None
                        nxt.append(grown)
        frontier = nxt
    return len(seen)


class ArrayLowering:
    """The array half of ``_Lowering`` (see the module docstring)."""

    # Provided by _Lowering.
    known: frozenset[str]
    lower: Any
    refuse: Any
    nothing: Any
    deref: Any
    excluded_values: Any

    def lower_array(self, node: dict[str, Any], ptr: str) -> Any:
        prefix, prefix_key = node.get("prefixItems"), "prefixItems"
        items, items_ptr = node.get("items", _MISSING), f"{ptr}/items"
        if isinstance(items, list):  # drafts 4-2019: items as a tuple
            prefix, prefix_key = items, "items"
            items, items_ptr = node.get("additionalItems", _MISSING), f"{ptr}/additionalItems"
        lo, hi = int(node.get("minItems", 0)), node.get("maxItems")
        hi = None if hi is None else int(hi)
        if hi is not None and lo > hi:
            return self.nothing(ptr, "minItems exceeds maxItems")
        unique = bool(node.get("uniqueItems", False)) and (hi is None or hi > 1)
        counted = self.contains_spec(node, ptr, items, prefix)
        if prefix is not None:
            tup = self.lower_tuple(node, ptr, prefix, prefix_key, items, items_ptr, lo, hi)
            return self.unique_array(tup, ptr) if unique and tup is not None else tup
        if items is _MISSING and "unevaluatedItems" in node:
            items, items_ptr = node["unevaluatedItems"], f"{ptr}/unevaluatedItems"
        out: dict[str, Any] = {"type": "array"}
        if items is not _MISSING:
            lowered_items = self.lower(items, items_ptr)
            if lowered_items is None:
                if lo > 0:
                    return None
                hi = 0
            else:
                out["items"] = lowered_items
        if lo:
            out["minItems"] = lo
        if hi is not None:
            out["maxItems"] = hi
        if counted is not None and hi != 0:
            if unique:
                self.refuse("uniqueItems", ptr, "beside contains")
            return self.contains_array(out, counted, ptr)
        if counted is not None and counted["min"] > 0:
            return self.nothing(ptr, "contains needs an item but no item is allowed")
        return self.unique_array(out, ptr) if unique else out

    def contains_spec(self, node: dict[str, Any], ptr: str, items: Any,
                      prefix: Any) -> dict[str, Any] | None:
        """``contains`` as two lowered item schemas — ``match`` (items and contains) and
        ``other`` (items and not contains) — with the count bounds; ``None`` where it has no
        effect (``minContains: 0`` without ``maxContains``) or after a lenient refusal."""
        if "contains" not in node:
            return None
        c_lo = int(node.get("minContains", 1))
        c_hi = None if node.get("maxContains") is None else int(node["maxContains"])
        if "unevaluatedItems" in node:
            self.refuse("contains", ptr, "beside unevaluatedItems (which sees the items "
                        "contains evaluates)")
            return None
        if c_lo == 0 and c_hi is None:
            return None
        if prefix is not None:
            self.refuse("contains", ptr, "beside a tuple (prefixItems)")
            return None
        contains = node["contains"]
        if self.excluded_values(contains) is not None:
            neg: Any = {"not": contains}  # values: the lowering excludes every spelling
        else:
            try:
                neg = negate(contains, self.deref, 0, self.known)
            except NegationError as exc:
                self.refuse("contains", ptr, f"the contains schema has no exact complement: "
                            f"{exc}")
                return None
        base = True if items is _MISSING else items
        sub_ptr = f"{ptr}/contains"
        match = self.lower({"allOf": [base, contains]}, sub_ptr)
        other = None if neg is False else self.lower({"allOf": [base, neg]}, sub_ptr)
        return {"match": match, "other": other, "min": c_lo, "max": c_hi}

    def contains_array(self, out: dict[str, Any], counted: dict[str, Any], ptr: str) -> Any:
        """The array dialect with ``x-contains`` (see the module docstring)."""
        lo, hi = int(out.get("minItems", 0)), out.get("maxItems")
        c_lo, c_hi = counted["min"], counted["max"]
        if c_hi is not None and c_lo > c_hi:
            return self.nothing(ptr, "minContains exceeds maxContains")
        if hi is not None and c_lo > hi:
            return self.nothing(ptr, "minContains exceeds maxItems")
        n_states = (hi if hi is not None else lo) + 1
        c_states = (c_hi if c_hi is not None else c_lo) + 1
        if n_states * c_states > MAX_COUNTED_STATES:
            self.refuse("contains", ptr, f"counting {c_states - 1} matches over {n_states - 1} "
                        f"items needs over {MAX_COUNTED_STATES} rules")
            return out
        result = {"type": "array", "x-contains": counted}
        for key in ("minItems", "maxItems"):
            if key in out:
                result[key] = out[key]
        return result

    def unique_array(self, out: dict[str, Any], ptr: str) -> Any:
        """``uniqueItems`` over finite item domains (``x-unique``), else refused."""
        tuple_form = "prefixItems" in out
        prefix = out.get("prefixItems", [])
        rest = out.get("items", None if tuple_form else True)
        lo, hi = int(out.get("minItems", 0)), out.get("maxItems")
        if hi is not None and hi <= 1:
            return out
        if hi is not None and hi <= len(prefix):  # no item beyond the tuple
            rest = None
        groups: list[list[Any]] = []  # JSON-equal values share one index

        def index(value: Any) -> int:
            for i, group in enumerate(groups):
                if json_equal(group[0], value):
                    if all(type(v) is not type(value) or v != value for v in group):
                        group.append(value)
                    return i
            groups.append([value])
            return len(groups) - 1

        domains = []
        for sub in [*prefix, *([] if rest is None else [rest])]:
            values = finite_values(sub)
            if values is None:
                self.refuse("uniqueItems", ptr, "only items from a finite set of values (enum, "
                            "boolean, null) can be kept unique")
                return out
            domains.append(list(dict.fromkeys(index(v) for v in values)))
        positions = domains[:len(prefix)]
        rest_domain = None if rest is None else domains[-1]
        if unique_states(positions, rest_domain, hi, MAX_UNIQUE_STATES) is None:
            self.refuse("uniqueItems", ptr, f"more than {MAX_UNIQUE_STATES} sets of used "
                        "values")
            return out
        longest = len(positions) + (len(groups) if rest_domain is not None else 0)
        if lo > min(longest, len(groups)):
            return self.nothing(ptr, "minItems exceeds the distinct values available")
        spec: dict[str, Any] = {"values": groups, "positions": positions, "rest": rest_domain,
                                "minItems": lo}
        if hi is not None:
            spec["maxItems"] = int(hi)
        return {"type": "array", "x-unique": spec}

    def lower_tuple(self, node: dict[str, Any], ptr: str, prefix: list[Any], prefix_key: str,
                    items: Any, items_ptr: str, lo: int, hi: int | None) -> Any:
        """Tuple arrays for the grammar compiler: any length from ``minItems`` on, the prefix
        schemas first, then ``items`` (absent: any value; ``false``: nothing more)."""
        lowered = []
        for i, sub in enumerate(prefix):
            one = self.lower(sub, f"{ptr}/{prefix_key}/{i}")
            if one is None:  # no value for position i: arrays end before it
                if lo > i:
                    return self.nothing(ptr, f"{prefix_key}/{i} accepts no value")
                hi = i if hi is None else min(hi, i)
                break
            lowered.append(one)
        out: dict[str, Any] = {"prefixItems": lowered, "minItems": lo}
        if items is _MISSING and "unevaluatedItems" in node:
            items, items_ptr = node["unevaluatedItems"], f"{ptr}/unevaluatedItems"
        rest = True if items is _MISSING else (None if items is False else
                                               self.lower(items, items_ptr))
        if rest is None:  # nothing after the prefix
            hi = len(lowered) if hi is None else min(hi, len(lowered))
        else:
            out["items"] = rest
        if hi is not None:
            if lo > hi:
                return self.nothing(ptr, "minItems exceeds the items that can exist")
            out["maxItems"] = hi
        return out
