"""LALR(1) parse tables (from lark) and a persistent, interned parser stack.

lark builds the tables; this module only *runs* them, on values: a parser stack is an
interned id of a linked list ``(parent id, LALR state)``, so feeding a terminal returns a
new id and never mutates anything. That makes the parser part of a constraint state a
single int, hashable and cheap to memoize on, the way XGrammar keeps persistent stacks.

Reductions are simulated exactly as lark's ``ParserState.feed_token`` does them: LALR may
reduce several times before it detects that a terminal is an error, so "is terminal ``t``
acceptable" is answered by running those reductions on the interned stack (memoized per
``(stack, terminal)``), not by looking at the top state's action row alone.

Each simulation also reports the lowest stack height it read (``feed_low``,
``takes_low``): its result is the same on every stack whose states agree from there up.
``store_signature``/``find_signature`` keep values in tries keyed by those top states
(:class:`Signatures`).

The reductions run in C when the ``lalr_sim`` kernel is built (``structspec/_native/
lalr_sim.c``, over :meth:`ParseTables.dense` and the nodes mirrored as arrays); the Python
loops here are its twins and give the same answers (``tests/test_lalr_native.py``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from structspec import _native

END = "$END"
NO_ACTION = -(1 << 31)  # the dense action table's "no action" (lalr_sim.c's NO_ACTION)


@dataclass(frozen=True)
class ParseTables:
    """Integer LALR(1) tables.

    Attributes:
        terminals: terminal names by index (``$END`` included).
        actions: per LALR state, terminal index -> ``code``: ``code >= 0`` shifts to state
            ``code``; ``code < 0`` reduces rule ``-code - 1``.
        gotos: per LALR state, nonterminal name -> state.
        rule_len: number of symbols each rule pops.
        rule_lhs: the nonterminal each rule produces.
        start_state: the state of the empty stack.
        end_state: the state lark's parser reaches when it accepts.
        index: terminal name -> index (derived).
    """

    terminals: tuple[str, ...]
    actions: tuple[dict[int, int], ...]
    gotos: tuple[dict[str, int], ...]
    rule_len: tuple[int, ...]
    rule_lhs: tuple[str, ...]
    start_state: int
    end_state: int

    index: dict[str, int] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self.index.update({n: i for i, n in enumerate(self.terminals)})

    @classmethod
    def from_lark(cls, parse_table: Any, start: str, terminal_names: list[str]) -> ParseTables:
        """Convert lark's ``IntParseTable`` (``parser.parser.parser.parse_table``)."""
        names = [str(n) for n in terminal_names]
        if END not in names:
            names.append(END)
        index = {n: i for i, n in enumerate(names)}
        rules: dict[Any, int] = {}
        rule_len: list[int] = []
        rule_lhs: list[str] = []
        n_states = max(parse_table.states) + 1
        actions: list[dict[int, int]] = [{} for _ in range(n_states)]
        gotos: list[dict[str, int]] = [{} for _ in range(n_states)]
        for state, row in parse_table.states.items():
            for sym, (action, arg) in row.items():
                sym = str(sym)  # lark's Token subclasses str with a slow __eq__
                is_term = sym in index or sym.isupper()
                if is_term and sym not in index:  # declared (e.g. _INDENT) or unknown to lexer
                    index[sym] = len(names)
                    names.append(sym)
                if action.name == "Shift":
                    if is_term:
                        actions[state][index[sym]] = int(arg)
                    else:
                        gotos[state][sym] = int(arg)
                else:
                    rid = rules.get(arg)
                    if rid is None:
                        rid = rules[arg] = len(rule_len)
                        rule_len.append(len(arg.expansion))
                        rule_lhs.append(str(arg.origin.name))
                    actions[state][index[sym]] = -rid - 1
        return cls(tuple(names), tuple(actions), tuple(gotos), tuple(rule_len),
                   tuple(rule_lhs), int(parse_table.start_states[start]),
                   int(parse_table.end_states[start]))

    def dense(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The tables as int32 arrays for the ``lalr_sim`` kernel: ``actions[S, T]`` (codes
        as in ``actions``; ``NO_ACTION`` where there is none), ``gotos[S, N]`` (-1: none;
        nonterminals numbered in ``rule_lhs`` order of first use), ``rule_len[R]``,
        ``rule_lhs[R]`` (those numbers). Built on each call; callers keep it."""
        actions = np.full((len(self.actions), len(self.terminals)), NO_ACTION, dtype=np.int32)
        for st, row in enumerate(self.actions):
            if row:
                actions[st, list(row)] = list(row.values())
        nts: dict[str, int] = {}
        for lhs in self.rule_lhs:
            nts.setdefault(lhs, len(nts))
        for goto_row in self.gotos:
            for nt in goto_row:
                nts.setdefault(nt, len(nts))
        gotos = np.full((len(self.gotos), max(1, len(nts))), -1, dtype=np.int32)
        for st, grow in enumerate(self.gotos):
            for nt, dst in grow.items():
                gotos[st, nts[nt]] = dst
        return (actions, gotos, np.array(self.rule_len, dtype=np.int32).reshape(-1),
                np.array([nts[n] for n in self.rule_lhs], dtype=np.int32).reshape(-1))


class Signatures:
    """Values kept under the top states of the stacks they were computed from (see
    ``ParserStacks.store_signature``): a trie over the states from the top, stored flat —
    ``child[node * n_states + state]`` is the node below ``node`` along ``state`` (node 0
    is the root), ``value[node]`` the ``(value, depth)`` kept there. Ints rather than
    nested dicts: the interpreter's cyclic GC tracks no container per trie node, so the
    memo adds little to its collections. Grows only; growth is locked by the stacks."""

    __slots__ = ("child", "value")

    def __init__(self) -> None:
        self.child: dict[int, int] = {}
        self.value: dict[int, tuple] = {}


class ParserStacks:
    """Interned LALR stacks over one :class:`ParseTables`; ids are ints, 0 = the start stack.

    ``feed`` and ``accepts_end`` are pure and memoized; the tables only grow, interning is
    locked, so one instance is shared by every thread using the constraint.

    The reductions run in the native kernel ``lalr_sim`` when it is built (over
    :meth:`ParseTables.dense` and the nodes mirrored in two arrays, ``parent`` and
    ``state``), else in Python (``_feed_python``, ``_viable_python``): the same answers.
    """

    def __init__(self, tables: ParseTables) -> None:
        self.tables = tables
        self._nodes: list[tuple[int, int, int]] = [(-1, tables.start_state, 1)]  # parent, st, n
        self._ids: dict[tuple[int, int], int] = {(-1, tables.start_state): 0}
        self._feed: dict[tuple[int, int], tuple[int, int]] = {}
        self._takes: dict[tuple[int, int], tuple[bool, int]] = {}
        self._end: dict[int, bool] = {}
        self._lock = threading.Lock()
        self._n_states = len(tables.actions)  # LALR states: trie keys node * n + state
        # The nodes mirrored as arrays for the kernel (capacity doubles; rows past
        # len(_nodes) unused), and the kernel's leading arguments: ParseTables.dense() and
        # those arrays, built on first use and swapped whole on growth.
        self._parent = np.full(1024, -1, dtype=np.int64)
        self._state = np.zeros(1024, dtype=np.int32)
        self._state[0] = tables.start_state
        self._dense: tuple[np.ndarray, ...] | None = None
        self._head: tuple[np.ndarray, ...] | None = None
        # Whether the kernel is used is decided once, here (``STRUCTSPEC_NATIVE`` read
        # now): both paths give the same answers, so a later switch changes nothing.
        self._lib = _native.load("lalr_sim")

    def top(self, stack: int) -> int:
        """The LALR state on top of ``stack``."""
        return self._nodes[stack][1]

    def depth(self, stack: int) -> int:
        """How many LALR states ``stack`` holds."""
        return self._nodes[stack][2]

    def states(self, stack: int) -> list[int]:
        """The LALR states of ``stack``, bottom first (for debugging and tests)."""
        out = []
        while stack >= 0:
            parent, st, _ = self._nodes[stack]
            out.append(st)
            stack = parent
        return out[::-1]

    def _push(self, parent: int, state: int) -> int:
        key = (parent, state)
        got = self._ids.get(key)
        if got is None:
            with self._lock:
                got = self._ids.get(key)
                if got is None:
                    got = len(self._nodes)
                    if got == self._parent.size:
                        n = got
                        self._parent = np.concatenate([self._parent,
                                                       np.full(n, -1, dtype=np.int64)])
                        self._state = np.concatenate([self._state,
                                                      np.zeros(n, dtype=np.int32)])
                        if self._dense is not None:
                            self._head = (*self._dense, self._parent, self._state)
                    self._parent[got] = parent
                    self._state[got] = state
                    self._nodes.append((parent, state, self._nodes[parent][2] + 1))
                    self._ids[key] = got
        return got

    def _kernel(self) -> tuple[Any, tuple] | None:
        """The ``lalr_sim`` kernel and its leading arguments (the dense tables, the node
        arrays), or None (not built, or ``STRUCTSPEC_NATIVE=off``). A stack id handed out
        is always inside the arrays of the arguments read after it: growth swaps them
        before the new node is published."""
        native = self._lib
        if native is None:
            return None
        head = self._head
        if head is None:
            dense = self.tables.dense()
            with self._lock:
                if self._dense is None:
                    self._dense = dense
                head = self._head = (*self._dense, self._parent, self._state)
        return native, head

    def native(self) -> bool:
        """Whether the ``lalr_sim`` kernel runs the reductions (``_native.load`` when
        these stacks were made)."""
        return self._lib is not None

    def takes(self, stack: int, terminals: np.ndarray, bits: np.ndarray
              ) -> tuple[int, tuple[tuple[int, int], ...]]:
        """Which of ``terminals`` (int64 parser ids) ``stack`` takes, all at once, each
        named by its bit ``bits[i]``: the bitmask of the taken ones, and the lowest height
        each one's simulation read as ``(height, bitmask)`` pairs, ascending (a taken
        terminal's answer holds on every stack that agrees from its height up; a refused
        one's too). Pure; not memoized (the caller keeps it per stack)."""
        kernel = self._kernel()
        if kernel is None:
            return self._takes_python(stack, terminals, bits)
        native, head = kernel
        taken, levels = native.takes(*head, stack, self._nodes[stack][2], terminals, bits)
        # tuples of ints: the cyclic GC stops tracking them (the rows are kept per stack)
        return (int.from_bytes(taken, "little"),
                tuple([(h, int.from_bytes(m, "little")) for h, m in levels]))

    def _takes_python(self, stack: int, terminals: np.ndarray, bits: np.ndarray
                      ) -> tuple[int, tuple[tuple[int, int], ...]]:
        """``takes`` in Python (the twin of the ``lalr_sim`` kernel's ``takes``)."""
        taken = 0
        levels: dict[int, int] = {}
        for t, bit in zip(terminals.tolist(), bits.tolist()):
            ok, lo = self.takes_low(stack, t)
            if ok:
                taken |= 1 << bit
            levels[lo] = levels.get(lo, 0) | 1 << bit
        return taken, tuple(sorted(levels.items()))

    def _reduce(self, stack: int, rule: int) -> int:
        t = self.tables
        for _ in range(t.rule_len[rule]):
            stack = self._nodes[stack][0]
        nxt = t.gotos[self._nodes[stack][1]].get(t.rule_lhs[rule])
        if nxt is None:  # pragma: no cover - lark's tables always have the goto
            return -1
        return self._push(stack, nxt)

    def feed(self, stack: int, terminal: int) -> int:
        """The stack after shifting ``terminal`` (with every reduction before it), or ``-1``
        when ``terminal`` is a syntax error here. Pure; memoized."""
        got = self._feed.get((stack, terminal))
        return got[0] if got is not None else self.feed_low(stack, terminal)[0]

    def feed_low(self, stack: int, terminal: int) -> tuple[int, int]:
        """``feed`` and the lowest height of ``stack`` it read (the top is at
        ``depth(stack)``): the result is the same on every stack whose states agree from
        that height up. Pure; memoized."""
        key = (stack, terminal)
        got = self._feed.get(key)
        if got is None:
            kernel = self._kernel()
            if kernel is None:
                got = self._feed_python(stack, terminal)
            else:
                native, head = kernel
                base, low, pushed = native.feed(*head, stack, self._nodes[stack][2],
                                                terminal)
                if base >= 0:
                    for st in pushed:
                        base = self._push(base, st)
                got = (base, low)
            self._feed[key] = got
        return got

    def _feed_python(self, stack: int, terminal: int) -> tuple[int, int]:
        """``feed_low`` in Python (the twin of the ``lalr_sim`` kernel's ``feed``)."""
        shift, base, pushed, low = self._simulate(stack, terminal)
        if shift is None:
            return -1, low
        for st in pushed:
            base = self._push(base, st)
        return self._push(base, shift), low

    def takes_low(self, stack: int, terminal: int) -> tuple[bool, int]:
        """Whether ``feed(stack, terminal)`` succeeds, and the lowest height it reads — the
        same simulation, without interning the stacks it passes through. Pure; memoized."""
        key = (stack, terminal)
        got = self._feed.get(key)
        if got is not None:
            return got[0] >= 0, got[1]
        got = self._takes.get(key)
        if got is None:
            shift, _, _, low = self._simulate(stack, terminal)
            got = self._takes[key] = (shift is not None, low)
        return got

    def _simulate(self, stack: int, terminal: int) -> tuple[int | None, int, list[int], int]:
        """Run ``terminal``'s reductions from ``stack`` on a scratch list of states pushed
        over the part of the stack not popped yet, interning nothing: ``(the state it
        shifts to, or None where the terminal is refused; that unpopped part; the states
        pushed over it; the lowest height read)``. Pure."""
        t = self.tables
        actions, nodes, gotos = t.actions, self._nodes, t.gotos
        rule_len, rule_lhs = t.rule_len, t.rule_lhs
        base = stack
        low = nodes[stack][2]
        pushed: list[int] = []
        top = nodes[stack][1]
        while True:
            code = actions[top].get(terminal)
            if code is None:
                return None, base, pushed, low
            if code >= 0:
                return code, base, pushed, low
            rule = -code - 1
            n = rule_len[rule]
            if n <= len(pushed):
                if n:
                    del pushed[-n:]
            else:
                for _ in range(n - len(pushed)):
                    base = nodes[base][0]
                pushed.clear()
                h = nodes[base][2]
                if h < low:
                    low = h
            under = pushed[-1] if pushed else nodes[base][1]
            goto = gotos[under].get(rule_lhs[rule])
            if goto is None:  # pragma: no cover - lark's tables always have the goto
                return None, base, pushed, low
            pushed.append(goto)
            top = goto

    def find_signature(self, sigs: Signatures, stack: int) -> tuple | None:
        """A value kept in ``sigs`` by ``store_signature`` for a stack whose states agree
        with ``stack``'s from the top down as far as that value's computation read, as
        ``(value, depth read)`` (the shallowest such); None if there is none. Pure (the
        kernel's ``find`` when built, else ``_find_python``)."""
        head, lib = self._head, self._lib  # a head is built only where the kernel is
        if head is None or lib is None or stack < 0:
            return self._find_python(sigs, stack)
        return lib.find(sigs.child, sigs.value, head[4], head[5], stack, self._n_states)

    def _find_python(self, sigs: Signatures, stack: int) -> tuple | None:
        """``find_signature`` in Python (the twin of the ``lalr_sim`` kernel's ``find``)."""
        nodes, child, value, m = self._nodes, sigs.child, sigs.value, self._n_states
        node = 0
        s = stack
        while True:
            got = value.get(node)
            if got is not None:
                return got
            if s < 0:
                return None
            s, st, _ = nodes[s]
            nxt = child.get(node * m + st)
            if nxt is None:
                return None
            node = nxt

    def store_signature(self, sigs: Signatures, stack: int, low: int, value: object
                        ) -> tuple:
        """Keep ``value``, computed from ``stack``'s states at heights ``low`` and up
        (``low`` above the top: none), in ``sigs`` under those states (top first).
        Returns the kept ``(value, depth read)`` (an earlier one for the same states
        wins)."""
        depth = max(0, self._nodes[stack][2] - low + 1) if stack >= 0 else 0
        nodes, child, m = self._nodes, sigs.child, self._n_states
        with self._lock:
            node = 0
            s = stack
            for _ in range(depth):
                s, st, _ = nodes[s]
                nxt = child.get(node * m + st)
                if nxt is None:
                    nxt = child[node * m + st] = len(child) + 1
                node = nxt
            return sigs.value.setdefault(node, (value, depth))

    def accepts_end(self, stack: int) -> bool:
        """Whether the input may end here (``$END`` reduces to lark's end state)."""
        got = self._end.get(stack)
        if got is None:
            t = self.tables
            end = t.index[END] if END in t.terminals else -1
            s = stack
            got = False
            while s >= 0:
                code = t.actions[self._nodes[s][1]].get(end)
                if code is None or code >= 0:
                    break
                s = self._reduce(s, -code - 1)
                if s >= 0 and self._nodes[s][1] == t.end_state:
                    got = True
                    break
            self._end[stack] = got
        return got

    def expected(self, stack: int) -> list[int]:
        """Terminals the top state has an action for (a superset of those ``feed`` takes)."""
        return list(self.tables.actions[self._nodes[stack][1]])


__all__ = ["END", "ParseTables", "ParserStacks", "Signatures"]
