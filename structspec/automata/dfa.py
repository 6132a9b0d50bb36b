"""Byte-level DFAs: subset construction with budgets, lazy DFAs, minimization, products.

The grammar layer needs, for every terminal, a DFA over *bytes* (tokens split UTF-8
characters), whose every live state can still reach an accepting one (so "alive" means
"a valid prefix"), plus intersection and difference (``pattern`` ∩ ``minLength``; property
names other than the named ones). outlines-core builds token automata but exposes no byte
DFA and no products, hence this small engine of our own: a Thompson NFA over byte ranges
(:mod:`.byte_nfa`: the regex dialect, code-point classes expanded to UTF-8 byte sequences,
excluded-word groups), subset construction with a state budget, and a numpy transition
table that lets one call walk the whole vocabulary at once.

A :class:`ByteDFA` is immutable and thread-safe. State 0 is the dead state.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from structspec.automata.byte_nfa import (
    MAX_CODEPOINT,
    PYTHON_KEYWORDS,
    REG_SHIFT,
    STATE_MASK,
    WORD_SETS,
    ByteNFA,
    DFALimits,
    Ranges,
    complement,
    current_dfa_limits,
    normalize,
    parse_regex,
    utf8_sequences,
)
from structspec.automata.limits import charge, check_time
from structspec.errors import ResourceLimitError

__all__ = [
    "MAX_CODEPOINT", "PYTHON_KEYWORDS", "WORD_SETS", "ByteDFA", "DFALimits", "LazyDFA",
    "Ranges", "compile_dfa", "complement", "current_dfa_limits", "literal_dfa",
    "literals_dfa", "minimized", "normalize", "product", "trimmed", "utf8_sequences",
]


# -- DFA ------------------------------------------------------------------------------------------


class ByteDFA:
    """A deterministic automaton over bytes; every live state can reach an accepting one.

    Attributes:
        table: ``int32 [n_states, 256]`` transitions; state 0 is dead (absorbing).
        accepting: ``bool [n_states]``.
        start: the start state (0 if the language is empty).
    """

    __slots__ = ("accepting", "memo", "start", "table")

    def __init__(self, table: np.ndarray, accepting: np.ndarray, start: int) -> None:
        table.setflags(write=False)
        accepting.setflags(write=False)
        self.table = table
        self.accepting = accepting
        self.start = start
        # Results derived from this DFA alone (vocabulary walks, keyed by the vocabulary's
        # fingerprint): shared by every grammar that uses the DFA. Grows only.
        self.memo: dict[object, object] = {}

    @property
    def n_states(self) -> int:
        """Number of states, the dead state included."""
        return int(self.table.shape[0])

    def walk_key(self, state: int, max_token_len: int) -> int:
        """A key such that states with equal keys let exactly the same tokens (of at most
        ``max_token_len`` bytes) stay inside or leave the language: memo tables of token
        walks use it. Here the state itself; structured DFAs override it."""
        return state

    def step(self, state: int, data: bytes) -> int:
        """The state after ``data`` (0 once dead)."""
        t = self.table
        for b in data:
            state = int(t[state, b])
            if not state:
                return 0
        return state

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` is in the language."""
        return bool(self.accepting[self.step(self.start, data)])

    def is_empty(self) -> bool:
        """Whether the language is empty."""
        return self.start == 0

    def literal(self) -> bytes | None:
        """The single string of the language, if it has exactly one (else ``None``)."""
        out = bytearray()
        s = self.start
        for _ in range(self.n_states + 1):
            live = np.flatnonzero(self.table[s])
            if self.accepting[s]:
                return bytes(out) if live.size == 0 else None
            if live.size != 1:
                return None
            out.append(int(live[0]))
            s = int(self.table[s, live[0]])
        return None


def trimmed(table: np.ndarray, accepting: np.ndarray, start: int) -> ByteDFA:
    """Drop states that cannot reach an accepting state (they become the dead state 0)."""
    n = table.shape[0]
    alive = accepting.copy()
    alive[0] = False
    preds: list[set[int]] = [set() for _ in range(n)]
    for s in range(1, n):
        for t in np.unique(table[s]):
            if t:
                preds[int(t)].add(s)
    frontier: list[int] = np.flatnonzero(alive).tolist()
    while frontier:
        t = frontier.pop()
        for s in preds[t]:
            if not alive[s]:
                alive[s] = True
                frontier.append(s)
    if not alive[start]:
        return ByteDFA(np.zeros((1, 256), dtype=np.int32), np.zeros(1, dtype=bool), 0)
    keep = [0, *[s for s in range(1, n) if alive[s]]]
    remap = np.zeros(n, dtype=np.int32)
    remap[keep] = np.arange(len(keep), dtype=np.int32)
    new_table = remap[table[keep]]
    new_table[0] = 0
    return ByteDFA(new_table.astype(np.int32), accepting[keep].copy(), int(remap[start]))


class _Subsets:
    """Subset construction over a Thompson NFA, one DFA row at a time.

    ``order[i]`` is the set of NFA states of DFA state ``i`` (0: the empty set, dead);
    ``row(i)`` computes state ``i``'s transitions, interning the target sets it meets.
    With ``coreachable_only`` the NFA states that cannot reach ``final`` are dropped
    first, so every non-empty set can reach acceptance: rows built on demand are trimmed
    without a backward pass over the finished table (what :class:`LazyDFA` needs).
    Not thread-safe (callers lock).
    """

    def __init__(self, nfa: ByteNFA, start: int, final: int, coreachable_only: bool) -> None:
        self.nfa = nfa
        self.final = final
        keep: list[bool] | None = None
        if coreachable_only:
            rev: list[list[int]] = [[] for _ in nfa.edges]
            for s, (edges, eps) in enumerate(zip(nfa.edges, nfa.eps)):
                for _, _, t in edges:
                    rev[t].append(s)
                for t in eps:
                    rev[t].append(s)
            keep = [False] * len(nfa.edges)
            keep[final] = True
            stack = [final]
            while stack:
                for s in rev[stack.pop()]:
                    if not keep[s]:
                        keep[s] = True
                        stack.append(s)
        self.keep = keep
        # Bytes that no edge tells apart behave alike: work per class, not per byte.
        cuts = {0, 256}
        for edges in nfa.edges:
            for lo, hi, _ in edges:
                cuts.add(lo)
                cuts.add(hi + 1)
        for trie in nfa.tries:  # the tries tell their words' bytes apart
            for b in trie.bytes_used:
                cuts.add(b)
                cuts.add(b + 1)
        bounds = sorted(cuts)
        self.n_classes = len(bounds) - 1
        self.class_of = np.zeros(256, dtype=np.int64)
        for ci, (a, b) in enumerate(itertools.pairwise(bounds)):
            self.class_of[a:b] = ci
        self._class_of = self.class_of.tolist()
        self._class_byte = [bounds[ci] for ci in range(self.n_classes)]
        self.ids: dict[frozenset[int], int] = {frozenset(): 0}
        self.order: list[frozenset[int]] = [frozenset()]
        init = self.closure({start}) if keep is None or keep[start] else frozenset()
        self.order.append(init)  # state 1, even when empty (then it is dead-ended)
        self.ids.setdefault(init, 1)

    def closure(self, states: frozenset[int] | set[int]) -> frozenset[int]:
        if self.nfa.tries:
            return self._closure_words(states)
        eps, edges, keep = self.nfa.eps, self.nfa.edges, self.keep
        seen = set(states)
        stack = list(states)
        while stack:
            s = stack.pop()
            for t in eps[s]:
                if t not in seen and (keep is None or keep[t]):
                    seen.add(t)
                    stack.append(t)
        final = self.final
        return frozenset(s for s in seen if edges[s] or s == final)

    def _closure_words(self, states: frozenset[int] | set[int]) -> frozenset[int]:
        """:meth:`closure` over (NFA state, trie node) elements: an epsilon move that
        leaves an excluded-words group needs a node that ends no word, and resets it."""
        eps, edges, keep, region = self.nfa.eps, self.nfa.edges, self.keep, self.nfa.region
        tries = self.nfa.tries
        seen = set(states)
        stack = list(states)
        while stack:
            e = stack.pop()
            s, node = e & STATE_MASK, e >> REG_SHIFT
            r = region[s]
            for t in eps[s]:
                if keep is not None and not keep[t]:
                    continue
                if r != -1 and region[t] != r:  # leaving the group
                    if tries[r].ends[node]:
                        continue
                    x = t
                else:
                    x = t | node << REG_SHIFT
                if x not in seen:
                    seen.add(x)
                    stack.append(x)
        final = self.final
        return frozenset(e for e in seen if edges[e & STATE_MASK] or e == final)

    def row(self, i: int) -> np.ndarray:
        """The transitions of DFA state ``i``, ``int32 [256]``; interns new targets."""
        cur = self.order[i]
        targets: list[set[int]] = [set() for _ in range(self.n_classes)]
        class_of, keep = self._class_of, self.keep
        if self.nfa.tries:
            self._targets_words(cur, targets)
        else:
            for s in cur:
                for lo, hi, t in self.nfa.edges[s]:
                    if keep is not None and not keep[t]:
                        continue
                    for ci in range(class_of[lo], class_of[hi] + 1):
                        targets[ci].add(t)
        class_row = np.zeros(self.n_classes, dtype=np.int32)
        memo: dict[frozenset[int], int] = {}
        ids, order = self.ids, self.order
        for ci, tset in enumerate(targets):
            if not tset:
                continue
            key = frozenset(tset)
            sid = memo.get(key)
            if sid is None:
                nxt = self.closure(key)
                sid = ids.get(nxt)
                if sid is None:
                    sid = len(order)
                    ids[nxt] = sid
                    order.append(nxt)
                memo[key] = sid
            class_row[ci] = sid
        return class_row[self.class_of]

    def _targets_words(self, cur: frozenset[int], targets: list[set[int]]) -> None:
        """The byte moves of :meth:`row` over (NFA state, trie node) elements: inside an
        excluded-words group each byte steps the trie node (a class holds one byte of
        the words, or none)."""
        nfa, class_of, keep = self.nfa, self._class_of, self.keep
        region, tries, class_byte = nfa.region, nfa.tries, self._class_byte
        for e in cur:
            s, node = e & STATE_MASK, e >> REG_SHIFT
            r = region[s]
            for lo, hi, t in nfa.edges[s]:
                if keep is not None and not keep[t]:
                    continue
                if r == -1 or region[t] != r:  # outside a group (groups end by epsilon)
                    for ci in range(class_of[lo], class_of[hi] + 1):
                        targets[ci].add(t)
                    continue
                step = tries[r].step[node]
                for ci in range(class_of[lo], class_of[hi] + 1):
                    targets[ci].add(t | step[class_byte[ci]] << REG_SHIFT)


def _determinize(nfa: ByteNFA, start: int, final: int, limits: DFALimits) -> ByteDFA:
    deadline = time.monotonic() + limits.max_seconds
    sub = _Subsets(nfa, start, final, coreachable_only=False)
    rows: list[np.ndarray] = [np.zeros(256, dtype=np.int32)]
    i = 1
    while i < len(sub.order):
        if len(sub.order) > limits.max_states:
            raise ResourceLimitError(f"regex automaton exceeds {limits.max_states} DFA states")
        if time.monotonic() > deadline:
            raise ResourceLimitError(f"regex automaton took over {limits.max_seconds} s to build")
        rows.append(sub.row(i))
        i += 1
    table = np.stack(rows)
    charge(table.nbytes, "a regex automaton")
    accepting = np.array([final in s for s in sub.order], dtype=bool)
    return trimmed(table, accepting, 1)


class _LazyRows:
    """``LazyDFA.table``: indexing (``t[s]``, ``t[s, b]``) builds the rows it reads."""

    __slots__ = ("_dfa",)

    def __init__(self, dfa: LazyDFA) -> None:
        self._dfa = dfa

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple):
            s, b = key
            return self._dfa.row(int(s))[b]
        return self._dfa.row(int(key))

    @property
    def shape(self) -> tuple[int, int]:
        """(states interned so far, 256)."""
        return (self._dfa.n_known(), 256)


class _LazyAccepting:
    """``LazyDFA.accepting``: ``a[s]`` for any state interned so far."""

    __slots__ = ("_dfa",)

    def __init__(self, dfa: LazyDFA) -> None:
        self._dfa = dfa

    def __getitem__(self, s: Any) -> bool:
        return self._dfa.is_accepting(int(s))


class LazyDFA(ByteDFA):
    """The DFA of ``pattern``, built on demand: nothing is parsed before the first read,
    and a state's row is computed (subset construction) the first time it is read.

    For terminals whose full DFA is large and mostly never visited (python.lark's
    f-string alternatives: ~13,000 states each, seconds to build, while real code walks a
    few dozen). Same interface as :class:`ByteDFA`: ``table[s]`` / ``table[s, b]`` and
    ``accepting[s]`` work (``table`` is not a numpy array); ``start`` is 1. ``pattern``
    may be a function returning it (called on first use). Hints a caller may give, so
    that common questions need no build: ``start_accepts`` (whether the empty string
    matches) and ``prefix`` (a small DFA: every match begins with one of its strings). NFA states
    that cannot reach acceptance are dropped before the construction, so every state
    but 0 can still reach an accepting one (trimmed, as ``ByteDFA``'s are) — except state
    1 when the language is empty (then it has no transitions and does not accept). Not
    minimized. There is no state budget: the states built are the ones text has reached.

    Thread-safe (building is locked; rows never change once built). Pickles with the rows
    built so far, so state numbers stay valid. ``pattern`` errors (:class:`GrammarError`)
    surface at the first read: callers validate it beforehand where that matters.
    """

    __slots__ = (
        "_accepting",
        "_built",
        "_built_order",
        "_lock",
        "_pattern",
        "_prefix",
        "_rows",
        "_sub",
    )

    def __init__(self, pattern: str | Callable[[], str], start_accepts: bool | None = None,
                 prefix: ByteDFA | None = None) -> None:
        # no super().__init__(): nothing is built yet
        self._pattern = pattern
        self._prefix = prefix
        self._lock = threading.Lock()
        self._sub: _Subsets | None = None
        self._rows = np.zeros((64, 256), dtype=np.int32)
        self._built = np.zeros(64, dtype=bool)
        self._built[0] = True
        self._built_order: list[int] = []  # state numbers depend on the order rows are built
        self._accepting: list[bool] = [False] if start_accepts is None else [False, start_accepts]
        self.table = _LazyRows(self)  # type: ignore[assignment]
        self.accepting = _LazyAccepting(self)  # type: ignore[assignment]
        self.start = 1
        self.memo = {}

    @property
    def pattern(self) -> str:
        """The (flag-free, :func:`compile_dfa` dialect) pattern."""
        if not isinstance(self._pattern, str):
            self._pattern = self._pattern()
        return self._pattern

    def _subsets(self) -> _Subsets:
        if self._sub is None:
            nfa, start, end = parse_regex(self.pattern, DFALimits(max_nfa_states=1 << 30))
            sub = _Subsets(nfa, start, end, coreachable_only=True)
            self._accepting = [end in x for x in sub.order]
            self._sub = sub
        return self._sub

    def n_known(self) -> int:
        """States interned so far (rows of some may not be built yet)."""
        with self._lock:
            return len(self._subsets().order)

    def is_accepting(self, s: int) -> bool:
        """Whether state ``s`` (interned already) accepts."""
        acc = self._accepting
        if s < len(acc):
            return acc[s]
        with self._lock:
            self._subsets()
            return self._accepting[s]

    def row(self, s: int) -> np.ndarray:
        """State ``s``'s transitions, ``int32 [256]`` (built now if needed; read-only)."""
        if s < self._built.shape[0] and self._built[s]:
            return self._rows[s]
        with self._lock:
            sub = self._subsets()
            if s >= len(sub.order):
                raise IndexError(f"state {s} of a lazy DFA does not exist yet")
            if s >= self._built.shape[0] or not self._built[s]:
                row = sub.row(s)
                n = len(sub.order)
                if n > self._rows.shape[0]:
                    size = max(n, 2 * self._rows.shape[0])
                    rows = np.zeros((size, 256), dtype=np.int32)
                    rows[: self._rows.shape[0]] = self._rows
                    built = np.zeros(size, dtype=bool)
                    built[: self._built.shape[0]] = self._built
                    self._rows, self._built = rows, built
                final = sub.final
                self._accepting.extend(final in x for x in sub.order[len(self._accepting):])
                self._rows[s] = row
                self._built[s] = True
                self._built_order.append(s)
            return self._rows[s]

    def step(self, state: int, data: bytes) -> int:
        """The state after ``data`` (0 once dead)."""
        if state == 1 and self._prefix is not None and len(self._accepting) < 3:
            p = self._prefix
            q = p.start
            for b in data:  # text outside every prefix is answered without building
                q = int(p.table[q, b])
                if not q:
                    return 0
                if p.accepting[q]:
                    break
        for b in data:
            state = int(self.row(state)[b])
            if not state:
                return 0
        return state

    def built_states(self) -> int:
        """How many rows have been built (for tests and diagnostics)."""
        return int(self._built.sum())

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            n = len(self._sub.order) if self._sub is not None else 0
            return {"pattern": self._pattern, "n": n, "built": list(self._built_order),
                    "start_accepts": self._accepting[1] if len(self._accepting) > 1 else None,
                    "prefix": self._prefix}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["pattern"], state["start_accepts"], state["prefix"])  # type: ignore[misc]
        # Rebuild the same rows in the same order: the NFA and the construction are
        # deterministic, so state numbers come out as they were.
        for s in state["built"]:
            self.row(s)
        if state["n"]:
            self.n_known()


def minimized(dfa: ByteDFA, max_states: int = 256) -> ByteDFA:
    """The minimal equivalent DFA (Moore's partition refinement, vectorized).

    Skipped (the DFA is returned as it is) above ``max_states``, where refinement rounds
    would cost more than the smaller tables save.
    """
    n = dfa.n_states
    if n <= 2 or n > max_states:
        return dfa
    table = dfa.table
    cls = dfa.accepting.astype(np.int64) + 1
    cls[0] = 0  # the dead state is a class of its own
    n_cls = len(np.unique(cls))
    while True:
        signature = np.concatenate([cls[:, None], cls[table]], axis=1)  # [n, 257]
        _, new_cls = np.unique(signature, axis=0, return_inverse=True)
        new_cls = new_cls.reshape(-1)
        new_n = int(new_cls.max()) + 1
        if new_n == n_cls:
            break
        cls, n_cls = new_cls, new_n
    # Renumber so that the dead state's class is 0 and the others follow.
    order = np.full(n_cls, -1, dtype=np.int64)
    order[cls[0]] = 0
    nxt = 1
    reps = np.zeros(n_cls, dtype=np.int64)
    for s in range(n):
        c = cls[s]
        if order[c] < 0:
            order[c] = nxt
            nxt += 1
            reps[order[c]] = s
    new_table = order[cls[table[reps]]].astype(np.int32)
    new_table[0] = 0
    accepting = dfa.accepting[reps].copy()
    accepting[0] = False
    return ByteDFA(new_table, accepting, int(order[cls[dfa.start]]))


def compile_dfa(pattern: str, limits: DFALimits | None = None) -> ByteDFA:
    """Compile ``pattern`` (whole-text match) into a trimmed byte DFA.

    Raises:
        GrammarError: the pattern does not parse or uses an unsupported construct.
        ResourceLimitError: the automaton exceeds ``limits``.
    """
    limits = limits or current_dfa_limits()
    nfa, start, end = parse_regex(pattern, limits)
    return minimized(_determinize(nfa, start, end, limits))


def literal_dfa(data: bytes) -> ByteDFA:
    """The DFA of exactly one byte string."""
    n = len(data) + 2  # dead, then one state per prefix
    table = np.zeros((n, 256), dtype=np.int32)
    for i, b in enumerate(data):
        table[i + 1, b] = i + 2
    accepting = np.zeros(n, dtype=bool)
    accepting[n - 1] = True
    return ByteDFA(table, accepting, 1)


def literals_dfa(words: Sequence[bytes]) -> ByteDFA:
    """The DFA of exactly the byte strings ``words`` (their trie): one automaton for a set
    of literals, so that removing them from a language is one product, not one each."""
    edges: list[dict[int, int]] = [{}, {}]  # dead, root
    accepting_states = set()
    for word in words:
        node = 1
        for b in word:
            nxt = edges[node].get(b)
            if nxt is None:
                nxt = len(edges)
                edges.append({})
                edges[node][b] = nxt
            node = nxt
        accepting_states.add(node)
    table = np.zeros((len(edges), 256), dtype=np.int32)
    for node, out in enumerate(edges):
        for b, nxt in out.items():
            table[node, b] = nxt
    accepting = np.zeros(len(edges), dtype=bool)
    accepting[list(accepting_states)] = True
    return trimmed(table, accepting, 1)  # no words: the empty language


def product(a: ByteDFA, b: ByteDFA, mode: str, limits: DFALimits | None = None) -> ByteDFA:
    """Intersection (``mode="and"``) or difference ``a - b`` (``mode="minus"``) of two DFAs.

    Raises:
        ResourceLimitError: the product exceeds ``limits.max_states``.
    """
    if mode not in ("and", "minus"):
        raise ValueError(f"mode must be 'and' or 'minus', got {mode!r}")
    limits = limits or current_dfa_limits()
    ids: dict[tuple[int, int], int] = {(0, 0): 0}
    order = [(0, 0)]
    rows: list[np.ndarray] = [np.zeros(256, dtype=np.int32)]

    def sid(pair: tuple[int, int]) -> int:
        if mode == "and" and (pair[0] == 0 or pair[1] == 0):
            return 0
        if pair[0] == 0:
            return 0
        got = ids.get(pair)
        if got is None:
            if len(order) >= limits.max_states:
                raise ResourceLimitError(f"automaton product exceeds {limits.max_states} states")
            got = len(order)
            ids[pair] = got
            order.append(pair)
        return got

    start = sid((a.start, b.start))
    nb = b.n_states
    i = 1
    while i < len(order):
        sa, sb = order[i]
        ta = a.table[sa].astype(np.int64)  # [256]
        tb = b.table[sb].astype(np.int64)  # [256]
        if i % 256 == 0:
            check_time()
        keys = ta * nb + tb  # [256] one key per target pair
        uniq, inverse = np.unique(keys, return_inverse=True)
        ids_row = np.array([sid((int(k) // nb, int(k) % nb)) for k in uniq], dtype=np.int32)
        rows.append(ids_row[inverse.reshape(-1)])
        i += 1
    table = np.stack(rows) if len(rows) > 1 else np.zeros((1, 256), dtype=np.int32)
    charge(table.nbytes, "an automaton product")
    if mode == "and":
        acc = [bool(a.accepting[x]) and bool(b.accepting[y]) for x, y in order]
    else:
        acc = [bool(a.accepting[x]) and not bool(b.accepting[y]) for x, y in order]
    accepting = np.array(acc, dtype=bool)
    accepting[0] = False
    if start == 0:
        return ByteDFA(np.zeros((1, 256), dtype=np.int32), np.zeros(1, dtype=bool), 0)
    return trimmed(table, accepting, start)
