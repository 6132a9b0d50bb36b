"""Grammar rules that carry a set or a count (``SetRules``, a mixin of ``DialectCompiler``):
``contains`` matches counted, unique values from finite domains, and the members of objects
with arbitrary keys — key regions by pattern, a ``propertyNames`` language, and keys tracked
for ``dependentRequired``. Each rule stands for one (count) or (set) state, built on demand.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from structspec.automata.dfa import ByteDFA, literals_dfa, product
from structspec.automata.grammar_ir import EMPTY, Expr, alt, opt, ref, rep, seq, term
from structspec.errors import ResourceLimitError


def _jg() -> Any:
    """:mod:`.json_grammar` (which imports this module: imported on use)."""
    from structspec.automata import json_grammar

    return json_grammar


class SetRules:
    """Rules over counts and sets for :class:`~.json_grammar.DialectCompiler`."""

    # Provided by DialectCompiler.
    b: Any
    placeholders: dict[str, str]
    max_array_items: int | None
    ws: Any
    lit: Any
    sep: Any
    sub: Any
    string: Any
    json_literal: Any
    _extra_keys: Any
    any_value: Any
    value: Any

    def _dfa(self, marker: str) -> ByteDFA:
        """The (shared) DFA of a placeholder's regex."""
        return _jg().cached_dfa(_jg().python_regex(self.placeholders[marker]))

    def array_counted(self, d: dict[str, Any]) -> Expr:
        """``contains``: items that match (``match``) or do not (``other``), the matches
        counted. ``body[n, c]`` is the next item after ``n`` items with ``c`` matches,
        ``after[n, c]`` what follows an item; ``n`` saturates at ``minItems`` without
        ``maxItems``, ``c`` at ``minContains`` without ``maxContains``."""
        spec = d["x-contains"]
        lo, hi = int(d.get("minItems", 0)), d.get("maxItems")
        hi = None if hi is None else int(hi)
        c_lo, c_hi = int(spec["min"]), spec["max"]
        if hi is None and self.max_array_items is not None:  # generation cap (narrowing)
            hi = max(lo, c_lo, self.max_array_items)
        n_top = hi if hi is not None else lo
        c_top = c_hi if c_hi is not None else c_lo
        if (n_top + 1) * (c_top + 1) > 4 * 4096:
            raise ResourceLimitError(f"contains over {n_top} items needs too many rules")
        match = None if spec["match"] is None else \
            ref(self.b.rule("contains-match", self.sub(spec["match"])))
        other = None if spec["other"] is None else \
            ref(self.b.rule("contains-other", self.sub(spec["other"])))
        comma = self.sep(",")
        body: dict[tuple[int, int], int] = {}
        after: dict[tuple[int, int], int] = {}
        todo: list[tuple[int, int]] = []

        def body_ref(n: int, c: int) -> Expr:
            if (n, c) not in body:
                body[n, c] = self.b.declare("contains-body")
                todo.append((n, c))
            return ref(body[n, c])

        def after_ref(n: int, c: int) -> Expr:
            if (n, c) not in after:
                after[n, c] = self.b.declare("contains-after")
                ends = n >= lo and c >= c_lo
                more = seq(comma, body_ref(n, c)) if hi is None or n < hi else alt()
                self.b.define(after[n, c], alt(EMPTY, more) if ends else more)
            return ref(after[n, c])

        first = body_ref(0, 0)
        while todo:
            n, c = todo.pop()
            n2 = n + 1 if hi is not None else min(n + 1, n_top)
            choices = []
            if match is not None and (c_hi is None or c < c_hi):
                choices.append(seq(match, after_ref(n2, min(c + 1, c_top))))
            if other is not None:
                choices.append(seq(other, after_ref(n2, c)))
            self.b.define(body[n, c], alt(*choices))
        items = alt(EMPTY, first) if lo == 0 and c_lo == 0 else first
        if hi == 0:
            items = EMPTY if c_lo == 0 else alt()
        return seq(self.lit("["), self.ws(), items, self.ws(), self.lit("]"))

    def array_unique(self, spec: dict[str, Any]) -> Expr:
        """``uniqueItems`` over finite domains: ``body[S]`` is the next item once the values
        ``S`` are used (position ``len(S)`` draws from its domain, minus ``S``)."""
        lo, hi = int(spec["minItems"]), spec.get("maxItems")
        if hi is None and self.max_array_items is not None:  # generation cap (narrowing)
            hi = max(lo, self.max_array_items)
        positions, rest = spec["positions"], spec["rest"]
        value = [ref(self.b.rule("unique-value", alt(*(self.json_literal(v) for v in group))))
                 for group in spec["values"]]
        comma = self.sep(",")
        body: dict[frozenset[int], int] = {}
        after: dict[frozenset[int], int] = {}
        todo: list[frozenset[int]] = []

        def body_ref(used: frozenset[int]) -> Expr:
            if used not in body:
                body[used] = self.b.declare("unique-body")
                todo.append(used)
            return ref(body[used])

        def after_ref(used: frozenset[int]) -> Expr:
            if used not in after:
                after[used] = self.b.declare("unique-after")
                more = seq(comma, body_ref(used))
                self.b.define(after[used], alt(EMPTY, more) if len(used) >= lo else more)
            return ref(after[used])

        first = body_ref(frozenset())
        while todo:
            used = todo.pop()
            i = len(used)
            domain = positions[i] if i < len(positions) else (rest or [])
            if hi is not None and i >= hi:
                domain = []
            self.b.define(body[used], alt(*(seq(value[v], after_ref(used | {v}))
                                            for v in domain if v not in used)))
        items = alt(EMPTY, first) if lo == 0 else first
        return seq(self.lit("["), self.ws(), items, self.ws(), self.lit("]"))

    def region_members(self, base: ByteDFA, regions: list[dict[str, Any]], names: Any,
                       tag: str) -> Expr | None:
        """One member whose key is in ``base`` and in the ``names`` language, from one of the
        ``regions`` (keys in every ``and`` regex and in no ``minus`` one; values from the
        region's schema); ``None`` when no region has a key."""
        if names is not True:
            base = product(base, self.names_dfa(names), "and")
        alts = []
        for r in regions:
            keys = base
            for marker in r["and"]:
                keys = product(keys, self._dfa(marker), "and")
            for marker in r["minus"]:
                keys = product(keys, self._dfa(marker), "minus")
            if keys.is_empty():
                continue
            ident = json.dumps([tag, r["and"], r["minus"], names], sort_keys=True, default=str)
            key = term(self.b.terminal(keys, "key", key=ident.encode()))
            value = self.any_value() if r["value"] is True else self.value(r["value"])
            alts.append(seq(key, self.sep(":"), value))
        return ref(self.b.rule("region-member", alt(*alts))) if alts else None

    def names_dfa(self, d: Any) -> ByteDFA:
        """The JSON spellings of the strings a lowered string schema accepts (a
        ``propertyNames`` language; see ``schema_objects.key_language_ok``)."""
        everything = _jg().json_string_dfa(0, None)
        if d is True:
            return everything
        if "anyOf" in d:  # a union: the complement of the complements, within strings
            rest = everything
            for branch in d["anyOf"]:
                rest = product(rest, self.names_dfa(branch), "minus")
            return product(everything, rest, "minus")
        if "enum" in d:
            words = [_jg().json_text(v).encode() for v in d["enum"] if isinstance(v, str)]
            return literals_dfa(words) if words else product(everything, everything, "minus")
        if "const" in d:
            return self._dfa(d["const"])
        regexes = tuple(_jg().python_regex(self.placeholders[m]) for m in d.get("x-regex", ()))
        dfa = _jg().string_dfa(int(d.get("minLength", 0)), d.get("maxLength"), regexes)
        for marker in d.get("x-not-regex", ()):
            dfa = product(dfa, self._dfa(marker), "minus")
        return dfa

    def free_members(self, f: dict[str, Any]) -> Expr:
        """The members of an object with arbitrary keys (``x-free``), in any order.

        Keys of the regions may repeat (``maxProperties`` bounds the members: a repeat only
        lowers the count). Tracked keys appear at most once each; the rules carry the set
        *S* of tracked keys seen so far — ``body[S]`` is the next member, ``after[S]`` what
        follows one — and the object may close only where every trigger in *S* has its
        dependencies (``needs``) in *S*.
        """
        comma = self.sep(",")
        regions = f["regions"]
        if f.get("escapes") and f["names"] is True and len(regions) == 1 \
                and not regions[0]["and"] and not regions[0]["minus"]:
            # any key: the plain string terminal (shared with string values and their walks)
            value = self.sub(regions[0]["value"])
            other: Expr | None = ref(self.b.rule("free-member", seq(
                self.string(0, None), self.sep(":"), value)))
        else:
            base = _jg().json_string_dfa(0, None) if f.get("escapes") else _jg()._keys_except(())
            other = self.region_members(base, regions, f["names"], f"free{f.get('escapes')}")
        lo = int(f.get("minProperties", 0))
        if not f["tracked"]:
            if other is None:
                return EMPTY
            hi = f.get("maxProperties")
            more = rep(seq(comma, other), 0, None if hi is None else max(int(hi) - 1, 0))
            members = seq(other, more)
            return members if lo else opt(members)
        names = [n for n, _ in f["tracked"]]
        member = {n: ref(self.b.rule(f"tracked:{n}", seq(
            self.json_literal(n), self.sep(":"), self.sub(v))))
            for n, v in f["tracked"]}
        needs = {t: frozenset(deps) for t, deps in f["needs"].items()}
        subsets = [frozenset(c) for k in range(len(names) + 1)
                   for c in itertools.combinations(names, k)]
        body = {s: self.b.declare("free-body") for s in subsets}
        after = {s: self.b.declare("free-after") for s in subsets}
        for s in subsets:
            choices = [seq(member[n], ref(after[s | {n}])) for n in names if n not in s]
            if other is not None:
                choices.append(seq(other, ref(after[s])))
            self.b.define(body[s], alt(*choices))
            go_on = seq(comma, ref(body[s]))
            closes = all(needs.get(t, frozenset()) <= s for t in s)
            self.b.define(after[s], alt(EMPTY, go_on) if closes else go_on)
        start = ref(body[frozenset()])
        return start if lo else opt(start)
