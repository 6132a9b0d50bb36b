"""The grammar IR: rules over terminals, built from expressions.

One IR serves every structured constraint: *rules* over *terminals*, each terminal a byte
DFA (:mod:`.dfa`). A rule is a small NFA over symbols (terminals and rule references),
built from expressions (sequence, alternative, bounded or unbounded repetition), so JSON
objects, arrays, ``anyOf`` alternatives and recursive ``$ref`` are all just rules.
:class:`GrammarBuilder` turns expressions into a frozen :class:`Grammar`, trimmed so that
every terminal DFA is non-empty and every rule state can finish through productive symbols
(what makes the runtime's "alive" mean "completable"); :mod:`.grammar` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from structspec.automata.dfa import ByteDFA
from structspec.automata.limits import active_limits, check_time
from structspec.errors import GrammarError, ResourceLimitError

if TYPE_CHECKING:
    pass


# -- expressions (the builder's input) ----------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """A grammar expression; build with :func:`term`, :func:`ref`, :func:`seq`, ..."""

    kind: str  # "sym" | "seq" | "alt" | "rep" | "empty"
    sym: int = 0
    items: tuple[Expr, ...] = ()
    lo: int = 0
    hi: int | None = None


EMPTY = Expr("empty")


def term(terminal_id: int) -> Expr:
    """One terminal."""
    return Expr("sym", sym=terminal_id)


def ref(rule_id: int) -> Expr:
    """A reference to a rule (recursion allowed, left recursion not)."""
    return Expr("sym", sym=-rule_id - 1)


def seq(*items: Expr) -> Expr:
    """Items one after the other."""
    flat = tuple(i for i in items if i.kind != "empty")
    if not flat:
        return EMPTY
    return flat[0] if len(flat) == 1 else Expr("seq", items=flat)


def alt(*items: Expr) -> Expr:
    """Any one of the items."""
    if len(items) == 1:
        return items[0]
    return Expr("alt", items=tuple(items))


def rep(item: Expr, lo: int = 0, hi: int | None = None) -> Expr:
    """``item`` repeated ``lo`` to ``hi`` times (``None``: unbounded)."""
    if hi is not None and hi < lo:
        raise GrammarError(f"repetition {{{lo},{hi}}} has max < min")
    return Expr("rep", items=(item,), lo=lo, hi=hi)


def opt(item: Expr) -> Expr:
    """``item`` or nothing."""
    return rep(item, 0, 1)


# -- the compiled grammar ------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A rule as an NFA over symbols (``>= 0`` terminal id, ``< 0`` rule ``-sym-1``)."""

    name: str
    start: int
    accept: frozenset[int]
    edges: tuple[tuple[tuple[int, int], ...], ...]  # per state: (symbol, target)
    eps: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Grammar:
    """Terminals (byte DFAs) and rules; ``start`` is the rule of a whole output."""

    terminals: tuple[ByteDFA, ...]
    terminal_names: tuple[str, ...]
    rules: tuple[Rule, ...]
    start: int


@dataclass(frozen=True)
class GrammarLimits:
    """Budgets of the runtime: configurations per state, interned states; ``max_depth`` caps
    nesting (deeper continuations are not offered: a narrowing, never an error)."""

    max_configs: int = 2_000
    max_depth: int = 512
    max_states: int = 2_000_000
    max_rule_states: int = 1_000_000


def current_grammar_limits() -> GrammarLimits:
    """:class:`GrammarLimits` from the active compilation's limits (defaults outside one)."""
    lim = active_limits()
    return GrammarLimits(max_depth=lim.max_depth, max_states=lim.max_runtime_states)


class GrammarBuilder:
    """Collects terminals and rules, then :meth:`build` checks and trims them.

    Not thread-safe (a builder is used by one compiler call).
    """

    def __init__(self, limits: GrammarLimits | None = None) -> None:
        self.limits = limits or current_grammar_limits()
        self._terminals: list[ByteDFA] = []
        self._terminal_names: list[str] = []
        self._terminal_ids: dict[tuple[int, bytes], int] = {}
        self._rule_names: list[str] = []
        self._rule_exprs: list[Expr | None] = []
        self._nfa_states = 0

    def terminal(self, dfa: ByteDFA, name: str, key: bytes | None = None) -> int:
        """Add a terminal (deduplicated by ``key`` when given); returns its id.

        Raises:
            GrammarError: the terminal's language is empty or contains the empty string.
        """
        check_time()
        if key is not None and (id(self), key) in self._terminal_ids:
            return self._terminal_ids[(id(self), key)]
        if dfa.is_empty():
            raise GrammarError(f"terminal {name} matches nothing")
        if dfa.accepting[dfa.start]:
            raise GrammarError(f"terminal {name} matches the empty string")
        self._terminals.append(dfa)
        self._terminal_names.append(name)
        tid = len(self._terminals) - 1
        if key is not None:
            self._terminal_ids[(id(self), key)] = tid
        return tid

    def declare(self, name: str) -> int:
        """Declare a rule (define it later: recursion needs the id first); returns its id."""
        self._rule_names.append(name)
        self._rule_exprs.append(None)
        return len(self._rule_names) - 1

    def define(self, rule_id: int, expr: Expr) -> None:
        """Give a declared rule its expression."""
        check_time()
        self._rule_exprs[rule_id] = expr

    def rule(self, name: str, expr: Expr) -> int:
        """Declare and define a rule in one go; returns its id."""
        rid = self.declare(name)
        self.define(rid, expr)
        return rid

    def build(self, start: int) -> Grammar:
        """Compile every rule to an NFA and trim what cannot finish.

        Raises:
            GrammarError: a rule is undefined, or the start rule derives nothing.
            ResourceLimitError: the rules exceed ``limits.max_rule_states``.
        """
        raw: list[tuple[int, set[int], list[list[tuple[int, int]]], list[list[int]]]] = []
        for rid, expr in enumerate(self._rule_exprs):
            if expr is None:
                raise GrammarError(f"rule {self._rule_names[rid]} is declared but not defined")
            raw.append(self._to_nfa(expr))
        productive = self._productive(raw)
        if not productive[start]:
            raise GrammarError("the grammar derives no complete output")
        rules = [self._trim(self._rule_names[i], r, productive) for i, r in enumerate(raw)]
        return Grammar(tuple(self._terminals), tuple(self._terminal_names), tuple(rules), start)

    # -- internals --------------------------------------------------------------------------

    def _to_nfa(self, expr: Expr) -> tuple[int, set[int], list[list[tuple[int, int]]],
                                            list[list[int]]]:
        edges: list[list[tuple[int, int]]] = []
        eps: list[list[int]] = []

        def new() -> int:
            self._nfa_states += 1
            if self._nfa_states > self.limits.max_rule_states:
                raise ResourceLimitError(
                    f"grammar exceeds {self.limits.max_rule_states} rule states"
                )
            edges.append([])
            eps.append([])
            return len(edges) - 1

        def build(e: Expr) -> tuple[int, int]:
            s = new()
            if e.kind == "empty":
                return s, s
            if e.kind == "sym":
                t = new()
                edges[s].append((e.sym, t))
                return s, t
            if e.kind == "seq":
                cur = s
                for item in e.items:
                    a, b = build(item)
                    eps[cur].append(a)
                    cur = b
                return s, cur
            if e.kind == "alt":
                end = new()
                for item in e.items:
                    a, b = build(item)
                    eps[s].append(a)
                    eps[b].append(end)
                return s, end
            if e.kind == "rep":
                (item,) = e.items
                cur = s
                for _ in range(e.lo):
                    a, b = build(item)
                    eps[cur].append(a)
                    cur = b
                if e.hi is None:
                    a, b = build(item)
                    eps[cur].append(a)
                    eps[b].append(cur)
                    return s, cur
                end = new()
                eps[cur].append(end)
                for _ in range(e.hi - e.lo):
                    a, b = build(item)
                    eps[cur].append(a)
                    eps[b].append(end)
                    cur = b
                return s, end
            raise GrammarError(f"unknown expression kind {e.kind}")

        start, end = build(expr)
        return start, {end}, edges, eps

    def _productive(self, raw: list) -> list[bool]:
        productive = [False] * len(raw)
        changed = True
        while changed:
            changed = False
            for rid, (start, accept, edges, eps) in enumerate(raw):
                if productive[rid]:
                    continue
                if self._reaches_accept(start, accept, edges, eps, productive):
                    productive[rid] = True
                    changed = True
        return productive

    @staticmethod
    def _usable(sym: int, productive: list[bool]) -> bool:
        return sym >= 0 or productive[-sym - 1]

    def _reaches_accept(self, start, accept, edges, eps, productive) -> bool:
        seen = {start}
        stack = [start]
        while stack:
            s = stack.pop()
            if s in accept:
                return True
            nxt = list(eps[s]) + [t for sym, t in edges[s] if self._usable(sym, productive)]
            for t in nxt:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return False

    def _trim(self, name: str, r: tuple, productive: list[bool]) -> Rule:
        start, accept, edges, eps = r
        n = len(edges)
        preds: list[list[int]] = [[] for _ in range(n)]
        for s in range(n):
            for t in eps[s]:
                preds[t].append(s)
            for sym, t in edges[s]:
                if self._usable(sym, productive):
                    preds[t].append(s)
        live = set(accept)
        stack = list(accept)
        while stack:
            t = stack.pop()
            for s in preds[t]:
                if s not in live:
                    live.add(s)
                    stack.append(s)
        new_edges = tuple(
            tuple((sym, t) for sym, t in edges[s] if t in live and self._usable(sym, productive))
            if s in live else ()
            for s in range(n)
        )
        new_eps = tuple(tuple(t for t in eps[s] if t in live) if s in live else ()
                        for s in range(n))
        return Rule(name, start, frozenset(accept), new_edges, new_eps)
