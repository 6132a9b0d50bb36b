"""Regular expressions -> byte-level DFAs, with budgets, products and vectorized token walks.

The grammar layer needs, for every terminal, a DFA over *bytes* (tokens split UTF-8
characters), whose every live state can still reach an accepting one (so "alive" means
"a valid prefix"), plus intersection and difference (``pattern`` ∩ ``minLength``; property
names other than the named ones). outlines-core builds token automata but exposes no byte
DFA and no products, hence this small engine of our own: a Thompson NFA over byte ranges
(code-point classes expanded to UTF-8 byte sequences), subset construction with a state
budget, and a numpy transition table that lets one call walk the whole vocabulary at once.

Regex syntax is Python's (parsed with ``re._parser``), with ECMA-262 / JSON-friendly
meanings for ``\\d`` (``[0-9]``), ``\\w`` (``[A-Za-z0-9_]``) and ``.`` (any character but line
terminators). The match is always *whole-text*; ``^``/``$`` are accepted only at the ends.
Look-arounds, back-references and flags are refused with :class:`GrammarError`.

One extension: a named group ``(?P<_without_SET_N>BODY)`` matches BODY's texts other than
the words of the registered set ``SET`` (:data:`WORD_SETS`; ``N`` only makes the name
unique). ``re`` reads it as the plain group, so lark's lexer matches BODY. A regex would
write "a name but not a keyword" as ~80 states of trie per place a name stands; here the
trie is shared: the subset construction carries, beside each NFA state inside the group,
the trie node of the text read so far, and leaves the group only from a node that ends no
word (python.lark's f-string fields name ~1,400 places).

A :class:`ByteDFA` is immutable and thread-safe. State 0 is the dead state.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from structspec.automata.limits import active_budget, active_limits, charge, check_time
from structspec.errors import GrammarError, ResourceLimitError

try:  # Python >= 3.11
    import re._constants as _sre
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

Ranges = list[tuple[int, int]]
MAX_CODEPOINT = 0x10FFFF
_LINE_TERMINATORS: Ranges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]
_ECMA_SPACE: Ranges = [
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
]
_CATEGORIES: dict[Any, tuple[Ranges, bool]] = {
    _sre.CATEGORY_DIGIT: ([(0x30, 0x39)], False),
    _sre.CATEGORY_NOT_DIGIT: ([(0x30, 0x39)], True),
    _sre.CATEGORY_WORD: ([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)], False),
    _sre.CATEGORY_NOT_WORD: ([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)], True),
    _sre.CATEGORY_SPACE: (_ECMA_SPACE, False),
    _sre.CATEGORY_NOT_SPACE: (_ECMA_SPACE, True),
}


@dataclass(frozen=True)
class DFALimits:
    """Budgets for building one DFA: states, NFA size, seconds."""

    max_states: int = 20_000
    max_nfa_states: int = 200_000
    max_seconds: float = 10.0


def current_dfa_limits() -> DFALimits:
    """:class:`DFALimits` from the active compilation's :class:`~structspec.automata.limits.
    Limits` (its remaining seconds), or the defaults outside a compilation."""
    lim = active_limits()
    budget = active_budget()
    seconds = budget.remaining_seconds() if budget is not None else lim.max_seconds
    return DFALimits(lim.max_states, lim.max_nfa_states, seconds)


# -- code-point ranges ------------------------------------------------------------------------


def normalize(ranges: Ranges) -> Ranges:
    """Sorted, merged, non-overlapping ranges."""
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def complement(ranges: Ranges) -> Ranges:
    """All code points not in ``ranges`` (surrogates excluded later by UTF-8 encoding)."""
    out: Ranges = []
    nxt = 0
    for lo, hi in normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return out


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose concatenations are exactly the UTF-8 encodings of
    ``[lo, hi]`` (surrogates skipped). The classic range-splitting algorithm."""
    out: list[list[tuple[int, int]]] = []
    stack = [(lo, hi)]
    while stack:
        a, b = stack.pop()
        if a > b:
            continue
        if a <= 0xDFFF and b >= 0xD800:  # no surrogates in UTF-8
            stack += [(a, 0xD7FF), (0xE000, b)]
            continue
        split = False
        for top in (0x7F, 0x7FF, 0xFFFF):
            if a <= top < b:
                stack += [(a, top), (top + 1, b)]
                split = True
                break
        if split:
            continue
        if b <= 0x7F:
            out.append([(a, b)])
            continue
        n = len(chr(a).encode())
        for i in range(1, n):
            m = (1 << (6 * i)) - 1
            if a & ~m != b & ~m:
                if a & m:
                    stack += [(a, a | m), ((a | m) + 1, b)]
                    split = True
                    break
                if b & m != m:
                    stack += [(a, (b & ~m) - 1), (b & ~m, b)]
                    split = True
                    break
        if split:
            continue
        ea, eb = chr(a).encode(), chr(b).encode()
        out.append(list(zip(ea, eb)))
    return out


# -- NFA ------------------------------------------------------------------------------------------


class _NFA:
    """Thompson NFA over byte ranges: ``edges[s]`` = [(lo, hi, t)], ``eps[s]`` = [t].

    ``region[s]`` is the excluded-words group state ``s`` belongs to (an index into
    ``tries``; -1 outside every group), ``groups`` maps regex group ids to word-set names.
    """

    def __init__(self, limits: DFALimits, groups: dict[int, str] | None = None) -> None:
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self.limits = limits
        self.groups = groups or {}
        self.region: list[int] = []
        self.tries: list[_WordTrie] = []

    def state(self) -> int:
        if len(self.edges) >= self.limits.max_nfa_states:
            raise ResourceLimitError(
                f"regex automaton exceeds {self.limits.max_nfa_states} NFA states"
            )
        self.edges.append([])
        self.eps.append([])
        self.region.append(-1)
        return len(self.edges) - 1

    def chars(self, ranges: Ranges) -> tuple[int, int]:
        """A fragment matching one character in ``ranges`` (UTF-8 encoded)."""
        start, end = self.state(), self.state()
        for lo, hi in normalize(ranges):
            for seq in utf8_sequences(lo, hi):
                cur = start
                for k, (blo, bhi) in enumerate(seq):
                    nxt = end if k == len(seq) - 1 else self.state()
                    self.edges[cur].append((blo, bhi, nxt))
                    cur = nxt
        return start, end

    def bytes_(self, data: bytes) -> tuple[int, int]:
        start = cur = self.state()
        for b in data:
            nxt = self.state()
            self.edges[cur].append((b, b, nxt))
            cur = nxt
        return start, cur


def _compile_items(nfa: _NFA, items: list[tuple[Any, Any]], at_start: bool,
                   at_end: bool) -> tuple[int, int]:
    consuming = [i for i, (op, _) in enumerate(items) if op is not _sre.AT]
    first = consuming[0] if consuming else len(items)
    last = consuming[-1] if consuming else -1
    start = cur = nfa.state()
    for i, (op, av) in enumerate(items):
        if op is _sre.AT:
            if av in (_sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING) and at_start and i < first:
                continue
            if av in (_sre.AT_END, _sre.AT_END_STRING) and at_end and i > last:
                continue
            raise GrammarError("anchors are supported only at the start and end of a regex")
        s, e = _compile_item(nfa, op, av, at_start and i == first, at_end and i == last)
        nfa.eps[cur].append(s)
        cur = e
    return start, cur


def _class_ranges(av: list[tuple[Any, Any]]) -> Ranges:
    ranges: Ranges = []
    negate = False
    for op, arg in av:
        if op is _sre.NEGATE:
            negate = True
        elif op is _sre.LITERAL:
            ranges.append((arg, arg))
        elif op is _sre.RANGE:
            ranges.append(arg)
        elif op is _sre.CATEGORY:
            r, neg = _CATEGORIES[arg]
            ranges += complement(r) if neg else r
        else:
            raise GrammarError(f"unsupported character class item {op}")
    return complement(ranges) if negate else normalize(ranges)


def _compile_item(nfa: _NFA, op: Any, av: Any, at_start: bool, at_end: bool) -> tuple[int, int]:
    if op is _sre.LITERAL:
        return nfa.chars([(av, av)])
    if op is _sre.NOT_LITERAL:
        return nfa.chars(complement([(av, av)]))
    if op is _sre.ANY:
        return nfa.chars(complement(_LINE_TERMINATORS))
    if op is _sre.IN:
        return nfa.chars(_class_ranges(av))
    if op is _sre.CATEGORY:
        r, neg = _CATEGORIES[av]
        return nfa.chars(complement(r) if neg else r)
    if op is _sre.BRANCH:
        start, end = nfa.state(), nfa.state()
        for branch in av[1]:
            s, e = _compile_items(nfa, list(branch), at_start, at_end)
            nfa.eps[start].append(s)
            nfa.eps[e].append(end)
        return start, end
    if op is _sre.SUBPATTERN:
        if av[1] or av[2]:
            raise GrammarError("inline regex flags are not supported")
        word_set = nfa.groups.get(av[0])
        if word_set is None:
            return _compile_items(nfa, list(av[-1]), at_start, at_end)
        first = len(nfa.edges)
        s, e = _compile_items(nfa, list(av[-1]), False, False)
        region = len(nfa.tries)
        nfa.tries.append(_word_trie(word_set))
        for q in range(first, len(nfa.edges)):
            if nfa.region[q] != -1:
                raise GrammarError("excluded-words groups cannot nest")
            nfa.region[q] = region
        end = nfa.state()  # outside the group: reached only from a node that ends no word
        nfa.eps[e].append(end)
        return s, end
    if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
        lo, hi, sub = av
        unbounded = hi == _sre.MAXREPEAT
        start = cur = nfa.state()
        for _ in range(lo):
            s, e = _compile_items(nfa, list(sub), False, False)
            nfa.eps[cur].append(s)
            cur = e
        if unbounded:
            s, e = _compile_items(nfa, list(sub), False, False)
            nfa.eps[cur].append(s)
            nfa.eps[e].append(cur)
            return start, cur
        end = nfa.state()
        nfa.eps[cur].append(end)
        for _ in range(hi - lo):
            s, e = _compile_items(nfa, list(sub), False, False)
            nfa.eps[cur].append(s)
            nfa.eps[e].append(end)
            cur = e
        return start, end
    names = {"GROUPREF": "back-references", "ASSERT": "look-arounds", "ASSERT_NOT":
             "look-arounds", "GROUPREF_EXISTS": "conditionals"}
    raise GrammarError(f"{names.get(str(op), str(op))} are not supported in regexes")


# -- excluded words -------------------------------------------------------------------------------

#: Python 3.12's keywords (``keyword.kwlist``), written out so that automata do not depend
#: on the Python that builds them.
PYTHON_KEYWORDS = (
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
    "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
    "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return",
    "try", "while", "with", "yield",
)
#: The word sets an excluded-words group ``(?P<_without_SET_N>...)`` may name.
WORD_SETS: dict[str, tuple[str, ...]] = {
    "pykeywords": PYTHON_KEYWORDS,
    # where a value may stand: ``True``, ``False`` and ``None`` are values, not keywords
    "pystatements": tuple(k for k in PYTHON_KEYWORDS if k not in ("False", "None", "True")),
}
_WITHOUT_GROUP = re.compile(r"_without_([a-z]+)_[0-9]+\Z")
_REG_SHIFT = 32  # a subset element is ``nfa_state | trie_node << _REG_SHIFT``
_STATE_MASK = (1 << _REG_SHIFT) - 1


@dataclass(frozen=True)
class _WordTrie:
    """The trie of a word set over bytes: node 0 the root, node 1 the sink (text that no
    word begins with), ``step[node][byte]``, ``ends[node]`` (a whole word read)."""

    step: tuple[tuple[int, ...], ...]
    ends: tuple[bool, ...]
    bytes_used: frozenset[int]


@functools.cache
def _word_trie(name: str) -> _WordTrie:
    words = WORD_SETS[name]
    kids: list[dict[int, int]] = [{}, {}]
    ends = [False, False]
    for word in words:
        node = 0
        for b in word.encode():
            nxt = kids[node].get(b)
            if nxt is None:
                nxt = len(kids)
                kids.append({})
                ends.append(False)
                kids[node][b] = nxt
            node = nxt
        ends[node] = True
    step = tuple(tuple(k.get(b, 1) for b in range(256)) for k in kids)
    used = frozenset(b for k in kids for b in k)
    return _WordTrie(step, tuple(ends), used)


def _excluded_word_groups(parsed: Any) -> dict[int, str]:
    """Regex group id -> word-set name, for the groups named ``_without_SET_N``.

    Raises:
        GrammarError: a group so named asks for a set that does not exist.
    """
    out = {}
    for name, gid in parsed.state.groupdict.items():
        m = _WITHOUT_GROUP.match(name)
        if m:
            if m.group(1) not in WORD_SETS:
                raise GrammarError(f"unknown word set {m.group(1)!r} in group {name!r} "
                                   f"(known: {', '.join(sorted(WORD_SETS))})")
            out[gid] = m.group(1)
    return out


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
    frontier = list(np.flatnonzero(alive))
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

    def __init__(self, nfa: _NFA, start: int, final: int, coreachable_only: bool) -> None:
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
            s, node = e & _STATE_MASK, e >> _REG_SHIFT
            r = region[s]
            for t in eps[s]:
                if keep is not None and not keep[t]:
                    continue
                if r != -1 and region[t] != r:  # leaving the group
                    if tries[r].ends[node]:
                        continue
                    x = t
                else:
                    x = t | node << _REG_SHIFT
                if x not in seen:
                    seen.add(x)
                    stack.append(x)
        final = self.final
        return frozenset(e for e in seen if edges[e & _STATE_MASK] or e == final)

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
            s, node = e & _STATE_MASK, e >> _REG_SHIFT
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
                    targets[ci].add(t | step[class_byte[ci]] << _REG_SHIFT)


def _determinize(nfa: _NFA, start: int, final: int, limits: DFALimits) -> ByteDFA:
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
            pattern = self.pattern
            try:
                parsed = _sre_parse.parse(pattern)
            except (re.error, OverflowError, RecursionError) as exc:
                raise GrammarError(
                    f"invalid regular expression {pattern[:80]!r}: {exc}") from exc
            nfa = _NFA(DFALimits(max_nfa_states=1 << 30), _excluded_word_groups(parsed))
            start, end = _compile_items(nfa, list(parsed), True, True)
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
    try:
        parsed = _sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise GrammarError(f"invalid regular expression {pattern[:80]!r}: {exc}") from exc
    if parsed.state.flags & ~(re.UNICODE | re.U):
        raise GrammarError("regex flags are not supported")
    nfa = _NFA(limits, _excluded_word_groups(parsed))
    start, end = _compile_items(nfa, list(parsed), True, True)
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
