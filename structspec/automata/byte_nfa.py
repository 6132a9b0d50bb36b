"""Regular expressions -> Thompson NFAs over byte ranges, for :mod:`.dfa` to determinize.

Regex syntax is Python's (parsed with ``re._parser``), with ECMA-262 / JSON-friendly
meanings for ``\\d`` (``[0-9]``), ``\\w`` (``[A-Za-z0-9_]``) and ``.`` (any character but line
terminators). The match is always *whole-text*; ``^``/``$`` are accepted only at the ends.
Look-arounds, back-references and flags are refused with :class:`GrammarError`. Code-point
classes are expanded to UTF-8 byte sequences (:func:`utf8_sequences`), so the automata read
bytes, as tokens do.

One extension: a named group ``(?P<_without_SET_N>BODY)`` matches BODY's texts other than
the words of the registered set ``SET`` (:data:`WORD_SETS`; ``N`` only makes the name
unique). ``re`` reads it as the plain group, so lark's lexer matches BODY. A regex would
write "a name but not a keyword" as ~80 states of trie per place a name stands; here the
trie is shared: the NFA marks the group's states with their word set (``region``, ``tries``)
and the subset construction carries, beside each NFA state inside the group, the trie node
of the text read so far (an element ``nfa_state | trie_node << REG_SHIFT``), leaving the
group only from a node that ends no word (python.lark's f-string fields name ~1,400 places).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from structspec.automata.limits import active_budget, active_limits
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


class ByteNFA:
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


def _compile_items(nfa: ByteNFA, items: list[tuple[Any, Any]], at_start: bool,
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


def _compile_item(nfa: ByteNFA, op: Any, av: Any, at_start: bool, at_end: bool) -> tuple[int, int]:
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
REG_SHIFT = 32  # a subset element is ``nfa_state | trie_node << REG_SHIFT``
STATE_MASK = (1 << REG_SHIFT) - 1


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


def parse_regex(pattern: str, limits: DFALimits) -> tuple[ByteNFA, int, int]:
    """The Thompson NFA of ``pattern`` (whole-text match): ``(nfa, start, final)``.

    Raises:
        GrammarError: the pattern does not parse or uses an unsupported construct.
        ResourceLimitError: the NFA exceeds ``limits.max_nfa_states``.
    """
    try:
        parsed = _sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise GrammarError(f"invalid regular expression {pattern[:80]!r}: {exc}") from exc
    if parsed.state.flags & ~(re.UNICODE | re.U):
        raise GrammarError("regex flags are not supported")
    nfa = ByteNFA(limits, _excluded_word_groups(parsed))
    start, end = _compile_items(nfa, list(parsed), True, True)
    return nfa, start, end

