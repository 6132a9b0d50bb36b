"""Lowered JSON Schema -> grammar IR: objects, arrays and alternatives as rules, the regular
pieces (strings, numbers, literals, patterns, formats) as byte-DFA terminals.

The input is the small, exact *dialect* that :mod:`.json_schema` lowers every schema into
(see ``_Lowering`` there): ``anyOf``, ``enum``, ``const`` (or a placeholder standing for a
regex), ``type`` with ``minLength``/``maxLength`` for strings, ``items``/``prefixItems``/
``minItems``/``maxItems`` for arrays, ``properties``/``required`` or a free
``additionalProperties`` for objects. Nothing is flattened into one regex: structure stays
in rules, so compile time grows with the schema, not with the product of its choices.

Generation order is the dialect's: named properties in schema order, each optional one
present or absent, commas placed by a two-state ("something emitted yet?") chain of rules.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import numpy as np

from structspec.automata.dfa import (
    ByteDFA,
    compile_dfa,
    literal_dfa,
    literals_dfa,
    product,
    trimmed,
)
from structspec.automata.grammar_ir import (
    EMPTY,
    Expr,
    Grammar,
    GrammarBuilder,
    alt,
    opt,
    ref,
    rep,
    seq,
    term,
)
from structspec.automata.json_grammar_sets import SetRules
from structspec.automata.limits import active_limits
from structspec.errors import ResourceLimitError

#: One character of JSON string text: a safe character, a short escape, or a \\u escape
#: outside the surrogate range (surrogate pairs would count as two characters here but one
#: in the decoded string, so they are left out: narrowing, never widening).
JSON_CHAR = (
    r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]'
    r"|\\u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))"
)
INTEGER = r"-?(?:0|[1-9][0-9]*)"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
#: Whitespace between JSON tokens under ``whitespace="flexible"``; bounded so a model cannot
#: loop on blank space.
FLEXIBLE_WS = r"[ \t\n\r]{1,16}"
#: Above this many states a counted string computes its transitions on the fly.
MAX_STRING_STATES = 60_000
#: Longest ``maxLength`` (or ``minLength``) counted exactly.
MAX_STRING_CHARS = 10_000_000

_RUST_HEX = re.compile(r"(?<!\\)((?:\\\\)*)\\x\{([0-9A-Fa-f]+)\}")


def python_regex(rx: str) -> str:
    """Rewrite the Rust-only ``\\x{HEX}`` escape (as the lowering emits it) for ``re``."""
    return _RUST_HEX.sub(lambda m: f"{m.group(1)}\\U{int(m.group(2), 16):08X}", rx)


def json_text(value: Any, *, spaced: bool = False) -> str:
    """Compact JSON text of ``value`` (with ``spaced``, a space after each ``,`` and ``:``, as
    Python's ``json.dumps`` writes): characters as they are, except lone surrogates (not
    encodable in UTF-8), which are spelled as ``\\u`` escapes."""
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(value, ensure_ascii=False, separators=separators)
    try:
        text.encode()
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, separators=separators)
    return text


@functools.lru_cache(maxsize=2048)
def _cached_dfa(rx: str) -> ByteDFA:
    """``compile_dfa`` shared across schemas (string, number and format DFAs recur)."""
    return compile_dfa(rx)


def cached_dfa(rx: str) -> ByteDFA:
    """``compile_dfa`` shared across schemas, within the active limits (a DFA cached under
    more generous limits is not handed to a stricter compilation)."""
    dfa = _cached_dfa(rx)
    limit = active_limits().max_states
    if dfa.n_states > limit:
        raise ResourceLimitError(f"automaton of {rx[:60]!r} has {dfa.n_states} states, over "
                                 f"Limits.max_states={limit}")
    return dfa


@functools.lru_cache(maxsize=8192)
def cached_literal(data: bytes) -> ByteDFA:
    """``literal_dfa`` shared across schemas."""
    return literal_dfa(data)


@functools.lru_cache(maxsize=256)
def json_string_dfa(lo: int, hi: int | None) -> ByteDFA:
    """The DFA of a JSON string (quotes included) of ``lo`` to ``hi`` characters.

    Built directly rather than from ``"CHAR{lo,hi}"``: one block of the one-character DFA per
    count, vectorized, so a ``maxLength`` of hundreds costs milliseconds, not the seconds a
    subset construction over hundreds of copies would.

    Raises:
        ResourceLimitError: the string may be longer than ``MAX_STRING_CHARS``.
    """
    char = cached_dfa(JSON_CHAR)
    m = char.n_states
    k = m - 1  # states per block: the one-char DFA without its dead state
    top = lo if hi is None else hi  # the last block; unbounded strings loop there
    n = 3 + (top + 1) * k
    if n > MAX_STRING_STATES:  # too big for a table: compute transitions on the fly
        if top > MAX_STRING_CHARS:
            raise ResourceLimitError(
                f"a string of up to {top} characters exceeds the {MAX_STRING_CHARS} "
                "this compiler counts"
            )
        lazy = _CountedTable(char, lo, top, hi is not None)
        return CountedStringDFA(lazy, _CountedAccepting(n), 1, lo=lo, top=top, block=k,
                                bounded=hi is not None)
    base = char.table[1:].astype(np.int64)  # [k, 256] targets in the one-char DFA
    completes = char.accepting[base] & (base != 0)  # [k, 256] the byte ends a character
    counts = np.arange(top + 1, dtype=np.int64)[:, None, None]  # [C, 1, 1]
    next_block = np.minimum(counts + 1, top) if hi is None else counts + 1
    inside = 3 + counts * k + (base - 1)  # [C, k, 256] stay in this block
    ready_next = 3 + next_block * k + (char.start - 1)  # the next block's "ready" state
    blocks = np.where(base == 0, 0, np.where(completes, ready_next, inside))
    if hi is not None:
        blocks[top] = 0  # at the maximum only the closing quote may follow
    table = np.zeros((n, 256), dtype=np.int32)
    table[3:] = blocks.reshape(-1, 256)
    table[1, ord('"')] = 3 + (char.start - 1)  # the opening quote -> block 0, ready
    ready_rows = 3 + np.arange(lo, top + 1) * k + (char.start - 1)
    table[ready_rows, ord('"')] = 2  # enough characters: the closing quote
    accepting = np.zeros(n, dtype=bool)
    accepting[2] = True
    return CountedStringDFA(table, accepting, 1, lo=lo, top=top, block=k, bounded=hi is not None)


class _CountedTable:
    """The transition table of a long counted string, computed on demand (numpy indexing
    semantics of ``table[q, b]``, ``table[states, bytes]`` and ``table[q]``), so a
    ``maxLength`` of 65,535 costs no memory until its states are visited."""

    def __init__(self, char: ByteDFA, lo: int, top: int, bounded: bool) -> None:
        self.base = char.table.astype(np.int64)  # [m, 256]
        self.completes = char.accepting[self.base] & (self.base != 0)  # [m, 256]
        self.start = char.start
        self.k = char.n_states - 1
        self.lo, self.top, self.bounded = lo, top, bounded
        self.shape = (3 + (top + 1) * self.k, 256)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple):
            q, b = key
            scalar = np.isscalar(q) and np.isscalar(b)
            out = self._next(np.asarray(q, dtype=np.int64), np.asarray(b, dtype=np.int64))
            return int(out) if scalar else out
        q = np.int64(key)
        return self._next(np.full(256, q), np.arange(256, dtype=np.int64))

    def _next(self, q: np.ndarray, b: np.ndarray) -> np.ndarray:
        q, b = np.broadcast_arrays(q, b)
        c, sub = np.divmod(np.maximum(q - 3, 0), self.k)
        sub = sub + 1
        nb = self.base[sub, b]
        nxt_c = c + 1 if self.bounded else np.minimum(c + 1, self.top)
        res = np.where(nb == 0, 0, np.where(self.completes[sub, b],
                                             3 + nxt_c * self.k + (self.start - 1),
                                             3 + c * self.k + (nb - 1)))
        if self.bounded:
            res = np.where(c >= self.top, 0, res)
        ready = sub == self.start
        res = np.where(ready & (b == ord('"')) & (c >= self.lo), 2, res)
        res = np.where(q >= 3, res, 0)
        res = np.where((q == 1) & (b == ord('"')), 3 + (self.start - 1), res)
        return res.astype(np.int32)


class _CountedAccepting:
    """``accepting[q]`` of a counted string: only the closed state 2."""

    def __init__(self, n: int) -> None:
        self.shape = (n,)

    def __getitem__(self, q: Any) -> Any:
        return np.asarray(q) == 2


class CountedStringDFA(ByteDFA):
    """:func:`json_string_dfa`'s automaton, which knows its layout: state ``3 + c*block + s``
    is sub-state ``s`` of the one-character DFA after ``c`` characters.

    A token of ``L`` bytes spells at most ``L`` characters, so from any count ``c`` with
    ``lo <= c <= top - L`` (or ``c < lo - L``) the same tokens stay inside or close the
    string: such states share one :meth:`walk_key`, and a string of ``maxLength`` 1000 costs
    a handful of vocabulary walks instead of one per character.
    """

    __slots__ = ("block", "bounded", "lo", "top")

    def __init__(self, table: Any, accepting: Any, start: int, *, lo: int,
                 top: int, block: int, bounded: bool) -> None:
        if isinstance(table, np.ndarray):
            super().__init__(table, accepting, start)
        else:  # a lazily computed table (:class:`_CountedTable`)
            self.table, self.accepting, self.start, self.memo = table, accepting, start, {}
        self.lo, self.top, self.block, self.bounded = lo, top, block, bounded

    def walk_key(self, state: int, max_token_len: int) -> int:
        if state < 3:
            return state
        c, sub = divmod(state - 3, self.block)
        far_from_top = not self.bounded or c <= self.top - max_token_len
        if c >= self.lo and far_from_top:
            c = self.lo
        elif c < self.lo - max_token_len:
            c = 0
        return 3 + c * self.block + sub


@functools.lru_cache(maxsize=256)
def multiples_dfa(k: int) -> ByteDFA:
    """Canonical JSON integers (``-?(0|[1-9][0-9]*)``) that are multiples of ``k``: the
    residue of the digits read so far modulo ``k`` is the state."""
    n = 5 + k  # dead, start, after "-", "0", then residues 0..k-1
    table = np.zeros((n, 256), dtype=np.int32)
    digits = np.arange(ord("0"), ord("9") + 1)
    table[1, ord("-")] = 2
    for s in (1, 2):
        table[s, ord("0")] = 3
        table[s, digits[1:]] = 4 + (np.arange(1, 10) % k)
    residues = np.arange(k)
    for d in range(10):
        table[4 + residues, ord("0") + d] = 4 + (residues * 10 + d) % k
    accepting = np.zeros(n, dtype=bool)
    accepting[3] = True  # "0" and "-0"
    accepting[4] = True  # residue 0
    return trimmed(table, accepting, 1)


@functools.lru_cache(maxsize=256)
def decimal_multiples_dfa(a: int, k: int) -> ByteDFA:
    """Exponent-free JSON numbers that are multiples of ``a / 10**k`` (exactly, in decimal:
    ``10.99`` is a multiple of ``0.01``).

    ``x`` is such a multiple iff ``x * 10**k`` is an integer divisible by ``a``: the state is
    the residue modulo ``a`` of the digits read so far (the integer part, then up to ``k``
    fraction digits); fraction digits beyond the ``k``-th must be ``0``. A state with ``j``
    fraction digits accepts iff ``residue * 10**(k - j)`` is divisible by ``a``.
    """
    # dead, start, "-", "0"; then I(r), F(j, r) for j in 0..k, Z(r)
    base_i, base_f = 4, 4 + a
    base_z = base_f + (k + 1) * a
    n = base_z + a
    table = np.zeros((n, 256), dtype=np.int32)
    accepting = np.zeros(n, dtype=bool)
    digits = np.arange(10)
    zero, dot = ord("0"), ord(".")
    r = np.arange(a)
    table[1, ord("-")] = 2
    for s in (1, 2):
        table[s, zero] = 3
        table[s, zero + 1: zero + 10] = base_i + (digits[1:] % a)
    accepting[3] = True
    table[3, dot] = base_f  # "0." -> F(0, 0)
    for d in digits:
        table[base_i + r, zero + d] = base_i + (r * 10 + d) % a
    table[base_i + r, dot] = base_f + r  # F(0, r)
    accepting[base_i + r] = (r * 10**k) % a == 0
    for j in range(k + 1):
        here = base_f + j * a + r
        if j < k:
            for d in digits:
                table[here, zero + d] = base_f + (j + 1) * a + (r * 10 + d) % a
        else:
            table[here, zero] = base_z + r
        if j >= 1:
            accepting[here] = (r * 10 ** (k - j)) % a == 0
    table[base_z + r, zero] = base_z + r
    accepting[base_z + r] = r == 0
    return trimmed(table, accepting, 1)


@functools.lru_cache(maxsize=256)
def _keys_except(names: tuple[str, ...]) -> ByteDFA:
    """Keys spelled without escapes, minus the spellings of ``names`` (one product with
    their trie)."""
    keys = cached_dfa(r'"[^"\\\x00-\x1f]*"')
    if not names:
        return keys
    return product(keys, literals_dfa([json_text(n).encode() for n in names]), "minus")


@functools.lru_cache(maxsize=512)
def string_dfa(lo: int, hi: int | None, regexes: tuple[str, ...]) -> ByteDFA:
    """The counted string DFA intersected with each regex (pattern, format)."""
    dfa = json_string_dfa(lo, hi)
    for rx in regexes:
        dfa = product(dfa, cached_dfa(rx), "and")
    return dfa


class DialectCompiler(SetRules):
    """Turns one lowered schema into a :class:`Grammar`. Single use, not thread-safe."""

    def __init__(self, placeholders: dict[str, str], whitespace: str,
                 rules: dict[str, Any] | None = None, *,
                 max_array_items: int | None = None) -> None:
        self.b = GrammarBuilder()
        self.placeholders = placeholders
        self.flexible = whitespace == "flexible"
        self.spaced = whitespace == "spaced"
        self.rules = rules or {}  # recursive targets: pointer -> lowered subschema
        self._rule_ids: dict[str, int] = {}
        self.max_array_items = max_array_items
        self._any: int | None = None

    def build(self, lowered: Any) -> Grammar:
        """The grammar of a whole output: optional whitespace, the value, whitespace."""
        start = self.b.rule("document", seq(self.ws(), self.value(lowered), self.ws()))
        return self.b.build(start)

    # -- terminals ----------------------------------------------------------------------------

    def lit(self, text: str) -> Expr:
        data = text.encode()
        return term(self.b.terminal(cached_literal(data), text, key=b"lit\0" + data))

    def rx(self, regex: str, name: str) -> Expr:
        dfa = cached_dfa(regex)
        if dfa.is_empty():
            return alt()
        literal = dfa.literal()
        if literal is not None:
            return self.lit(literal.decode())
        return term(self.b.terminal(dfa, name, key=b"rx\0" + regex.encode()))

    def string(self, lo: int, hi: int | None, markers: tuple[str, ...] = ()) -> Expr:
        """A JSON string of ``lo..hi`` characters matching every regex of ``markers``."""
        hi = None if hi is None else int(hi)
        regexes = tuple(python_regex(self.placeholders[m]) for m in markers)
        if regexes and lo == 0 and hi is None:
            dfa = cached_dfa(regexes[0]) if len(regexes) == 1 else None
        else:
            dfa = None
        if dfa is None:
            dfa = string_dfa(lo, hi, regexes)
        if dfa.is_empty():
            return alt()
        key = "\0".join(["str", str(lo), str(hi), *regexes]).encode()
        return term(self.b.terminal(dfa, "string", key=key))

    def ws(self) -> Expr:
        """Whitespace where JSON allows it and the policy adds none of its own: around
        brackets and the document (``flexible``: what the model writes, bounded)."""
        return opt(self.rx(FLEXIBLE_WS, "ws")) if self.flexible else EMPTY

    def sep(self, mark: str) -> Expr:
        """A ``,`` or ``:`` between JSON tokens, spaced as the policy says: nothing around it
        (``compact``), what the model writes (``flexible``), or one space after it
        (``spaced``, as Python's ``json.dumps`` writes)."""
        if self.spaced:
            return self.lit(mark + " ")
        return seq(self.ws(), self.lit(mark), self.ws())

    def json_literal(self, value: Any) -> Expr:
        return self.lit(json_text(value, spaced=self.spaced))

    # -- values -------------------------------------------------------------------------------

    def value(self, d: Any) -> Expr:
        """The expression of one lowered subschema (``None``: no value at all)."""
        if d is None:
            return alt()
        if "$ref" in d:  # a recursive subschema: one rule, referenced
            target = d["$ref"]
            rid = self._rule_ids.get(target)
            if rid is None:
                rid = self._rule_ids[target] = self.b.declare(f"ref:{target}")
                self.b.define(rid, self.value(self.rules[target]))
            return ref(rid)
        if "anyOf" in d:
            return alt(*(self.value(x) for x in d["anyOf"]))
        if "const" in d:
            c = d["const"]
            if isinstance(c, str) and c in self.placeholders:
                return self.rx(python_regex(self.placeholders[c]), "pattern")
            return self.json_literal(c)
        if "enum" in d:
            return alt(*(self.json_literal(v) for v in d["enum"]))
        if "prefixItems" in d:
            if "minItems" in d:  # the grammar compiler's tuple form
                return self.array_prefix(d)
            return self.array_tuple(d["prefixItems"])
        t = d.get("type")
        if t == "null":
            return self.lit("null")
        if t == "boolean":
            return alt(self.lit("true"), self.lit("false"))
        if t in ("integer", "number", "string") and "x-not-regex" in d:
            return self.excluding(d)
        if t == "integer" and "x-not-multiple" in d:
            return self.excluding({**d, "x-not-regex": []})
        if t == "integer":
            if "x-multiple" in d:
                dfa = multiples_dfa(int(d["x-multiple"]))
                for marker in d.get("x-regex", ()):
                    dfa = product(dfa, cached_dfa(python_regex(self.placeholders[marker])),
                                  "and")
                if dfa.is_empty():
                    return alt()
                key = "\0".join(["mul", str(d["x-multiple"]), *d.get("x-regex", ())]).encode()
                return term(self.b.terminal(dfa, "integer", key=key))
            return self.rx(INTEGER, "integer")
        if t == "number" and "x-decimal-multiple" in d:
            return self.excluding({**d, "x-not-regex": []})
        if t == "number":
            if "x-regex" in d:  # bounds: one regex per side, intersected
                dfa = cached_dfa(python_regex(self.placeholders[d["x-regex"][0]]))
                for marker in d["x-regex"][1:]:
                    dfa = product(dfa, cached_dfa(python_regex(self.placeholders[marker])),
                                  "and")
                if dfa.is_empty():
                    return alt()
                key = "\0".join(["num", *d["x-regex"]]).encode()
                return term(self.b.terminal(dfa, "number", key=key))
            return self.rx(NUMBER, "number")
        if t == "string":
            return self.string(int(d.get("minLength", 0)), d.get("maxLength"),
                               tuple(d.get("x-regex", ())))
        if t == "array":
            return self.array(d)
        if t == "object":
            return self.object(d)
        raise ValueError(f"not a lowered schema: {d!r}")

    def excluding(self, d: dict[str, Any]) -> Expr:
        """A string, integer or number subschema minus the spellings of excluded values
        (``x-not-regex``): the automaton of the rest, then one difference per regex."""
        rest = {k: v for k, v in d.items() if k != "x-not-regex"}
        t = d["type"]
        if t == "string":
            regexes = tuple(python_regex(self.placeholders[m]) for m in rest.get("x-regex", ()))
            dfa = string_dfa(int(rest.get("minLength", 0)), rest.get("maxLength"), regexes)
        else:
            if "x-multiple" in rest:
                base = multiples_dfa(int(rest["x-multiple"]))
            elif "x-decimal-multiple" in rest:
                base = decimal_multiples_dfa(*map(int, rest["x-decimal-multiple"]))
            else:
                base = cached_dfa(INTEGER if t == "integer" else NUMBER)
            dfa = base
            for marker in rest.get("x-regex", ()):
                dfa = product(dfa, cached_dfa(python_regex(self.placeholders[marker])), "and")
        for marker in d["x-not-regex"]:
            dfa = product(dfa, cached_dfa(python_regex(self.placeholders[marker])), "minus")
        if "x-not-multiple" in rest:  # integers that are not multiples of k
            dfa = product(dfa, multiples_dfa(int(rest["x-not-multiple"])), "minus")
        if dfa.is_empty():
            return alt()
        markers = [*rest.get("x-regex", ()), "not", *d["x-not-regex"]]
        key = "\0".join(["excl", t, str(rest.get("minLength", 0)), str(rest.get("maxLength")),
                         str(rest.get("x-multiple")), str(rest.get("x-decimal-multiple")),
                         str(rest.get("x-not-multiple")), *(self.placeholders[m] if m != "not"
                                                        else m for m in markers)]).encode()
        return term(self.b.terminal(dfa, t, key=key))

    def any_value(self) -> Expr:
        """Any JSON value (one recursive rule, shared)."""
        if self._any is None:
            self._any = self.b.declare("any")
            self.b.define(self._any, alt(
                self.lit("null"), self.lit("true"), self.lit("false"),
                self.rx(NUMBER, "number"), self.string(0, None),
                self.array({"type": "array"}), self.object({"type": "object"}),
            ))
        return ref(self._any)

    def sub(self, d: Any) -> Expr:
        """A nested value: the shared rule for "any value", else the value itself."""
        if d is None or d is True:
            return self.any_value() if d is True else alt()
        return self.value(d)

    # -- arrays -------------------------------------------------------------------------------

    def array(self, d: dict[str, Any]) -> Expr:
        if "x-contains" in d:
            return self.array_counted(d)
        if "x-unique" in d:
            return self.array_unique(d["x-unique"])
        # The item is a rule of its own: bounded repetition copies only a reference to it.
        item = ref(self.b.rule("item", self.value(d["items"]))) if "items" in d \
            else self.any_value()
        lo, hi = int(d.get("minItems", 0)), d.get("maxItems")
        hi = None if hi is None else int(hi)
        if hi is None and self.max_array_items is not None:  # generation cap (narrowing)
            hi = max(lo, self.max_array_items)
        if hi == 0:
            return seq(self.lit("["), self.ws(), self.lit("]"))
        more = seq(self.sep(","), item)
        rest = rep(more, max(lo - 1, 0), None if hi is None else hi - 1)
        body = seq(item, rest)
        items = body if lo > 0 else opt(body)
        return seq(self.lit("["), self.ws(), items, self.ws(), self.lit("]"))

    def array_prefix(self, d: dict[str, Any]) -> Expr:
        """``prefixItems`` then ``items``: ``minItems``..``maxItems`` items in all; position
        ``i`` takes the ``i``-th prefix schema, later positions the ``items`` schema."""
        lo, hi = int(d["minItems"]), d.get("maxItems")
        hi = None if hi is None else int(hi)
        n = len(d["prefixItems"]) if hi is None else min(len(d["prefixItems"]), hi)
        if n == 0:  # nothing but `items`
            plain = {"type": "array", "minItems": lo, **({} if hi is None else {"maxItems": hi})}
            if d.get("items", True) is not True:
                plain["items"] = d["items"]
            return self.array(plain) if "items" in d or hi == 0 else \
                seq(self.lit("["), self.ws(), self.lit("]"))
        prefix = [self.value(x) for x in d["prefixItems"][:n]]
        comma = self.sep(",")
        rest: Expr = EMPTY  # what may follow the last prefix item
        if "items" in d and (hi is None or hi > n):
            item = ref(self.b.rule("item", self.any_value() if d["items"] is True
                                   else self.value(d["items"])))
            extra_lo = max(lo - n, 0)
            extra_hi = None if hi is None else hi - n
            if extra_hi is None and self.max_array_items is not None:  # generation cap
                extra_hi = max(extra_lo, self.max_array_items - n, 0)
            rest = rep(seq(comma, item), extra_lo, extra_hi)
        for i in range(n - 1, 0, -1):  # from the back: item i is required iff i < minItems
            step = seq(comma, prefix[i], rest)
            rest = step if i < lo else opt(step)
        body = seq(prefix[0], rest)
        return seq(self.lit("["), self.ws(), body if lo > 0 else opt(body), self.ws(),
                   self.lit("]"))

    def array_tuple(self, items: list[Any]) -> Expr:
        if not items:
            return seq(self.lit("["), self.ws(), self.lit("]"))
        parts: list[Expr] = []
        for i, d in enumerate(items):
            if i:
                parts.append(self.sep(","))
            parts.append(self.value(d))
        return seq(self.lit("["), self.ws(), *parts, self.ws(), self.lit("]"))

    # -- objects ------------------------------------------------------------------------------

    def object(self, d: dict[str, Any]) -> Expr:
        open_, close = seq(self.lit("{"), self.ws()), seq(self.ws(), self.lit("}"))
        if "properties" in d:
            members = self.named_members(d["properties"], set(d.get("required", [])),
                                         d.get("x-extra"), d.get("x-exclude", ()))
            return seq(open_, members, close)
        if d.get("maxProperties") == 0:
            return seq(open_, close)
        if "x-free" in d:  # members in any order: key regions, tracked keys
            return seq(open_, self.free_members(d["x-free"]), close)
        value = self.value(d["additionalProperties"]) if "additionalProperties" in d \
            else self.any_value()
        member = seq(self.string(0, None), self.sep(":"), value)
        hi = d.get("maxProperties")  # members, not distinct keys: repeats only lower the count
        more = rep(seq(self.sep(","), member), 0,
                   None if hi is None else max(int(hi) - 1, 0))
        members = seq(member, more)
        return seq(open_, members if d.get("minProperties", 0) else opt(members), close)

    def extra_members(self, extra: Any, taken: list[str]) -> Expr | None:
        """One member with a key not in ``taken``: ``extra`` is the value schema of every
        such key, or ``{"x-regions": [...], "names": ...}`` splitting the keys by patterns
        (each region with its own values) within the ``propertyNames`` language; ``None``
        when no key is left."""
        if not (isinstance(extra, dict) and "x-regions" in extra):
            value = self.any_value() if extra is True else self.value(extra)
            return seq(self.extra_key(taken), self.sep(":"), value)
        base = self._extra_keys(taken)
        return self.region_members(base, extra["x-regions"], extra["names"],
                                   "xkey\0" + "\0".join(taken))

    def _extra_keys(self, names: list[str]) -> ByteDFA:
        """Strings without escapes (an escaped spelling of a named key would duplicate it)
        minus the named keys."""
        return _keys_except(tuple(names))

    def extra_key(self, names: list[str]) -> Expr:
        """Keys other than ``names`` (see :meth:`_extra_keys`)."""
        key = "\0".join(["extra-key", *names]).encode()
        return term(self.b.terminal(self._extra_keys(names), "key", key=key))

    def named_members(self, props: dict[str, Any], required: set[str],
                      extra: Any = None, exclude: Any = ()) -> Expr:
        """Named properties in order, then (if ``extra``) other keys with ``extra`` values;
        optional ones may be absent; commas only between members."""
        names = list(props)
        members = [seq(self.json_literal(n), self.sep(":"),
                       self.value(props[n])) for n in names]
        comma = self.sep(",")
        after: dict[bool, Expr] = {False: EMPTY, True: EMPTY}
        if extra is not None:
            taken = list(dict.fromkeys([*names, *exclude]))
            member = self.extra_members(extra, taken)
        if extra is not None and member is not None:
            more = ref(self.b.rule("extras", rep(seq(comma, member))))
            after = {False: opt(seq(member, more)), True: more}
        # after[e]: members j.. given whether one was emitted before (e), built backwards.
        for j in range(len(names) - 1, -1, -1):
            nxt: dict[bool, Expr] = {}
            for emitted in (False, True):
                take = seq(comma if emitted else EMPTY, members[j], after[True])
                if names[j] in required:
                    nxt[emitted] = take
                else:
                    nxt[emitted] = alt(take, after[emitted])
            # Share the tails as rules so the expression stays linear in the property count.
            after = {e: ref(self.b.rule(f"members{j}_{int(e)}", nxt[e])) for e in (False, True)}
        return after[False]
