"""Token masks for the Lark constraint: parser-independent lexing trees, parser-dependent
evaluation, the XGrammar split.

For a lexer state, the whole vocabulary is walked once through the lexer DFA (numpy). The
result is a *node* of a lexing tree, which depends on the lexer alone:

- **inside groups**: tokens that stay inside the current lexeme, grouped by the set of
  terminals their end state may still become (and, for the indenter's newline, by what
  they do to its indentation). One bit test against the parser's viable terminals decides
  a whole group — most of the vocabulary, most of the time.
- **crossing groups**: tokens whose lexeme ends midway (``foo(``, ``):``, ``"]``), grouped
  by the lexer state where it ends. The rest of those tokens is a *child node*: the same
  walk from the next lexeme's start state, built on first use and memoized by
  ``(group, start state)``.

Evaluating a node needs the parser: end the lexeme (memoized per state), test the
groups. A child's result depends only on the state after the lexeme ends, so it is
memoized per ``(group, state)`` and shared by every mask that reaches it — ``foo(`` and
``bar(`` after ``x = `` in any statement of the same block share one evaluation.

When the lexeme may end right before a token (the token's first byte cannot extend it),
the token is judged from the state after the lexeme: that part of the mask is that
state's mask, limited to those first bytes.

**Signatures** (XGrammar's idea, made exact). An evaluation reads only part of its
context: a few top states of the LALR stack (reductions pop a bounded number), a few top
indentation levels (dedents), and the bracket depth only as ``paren > j`` tests. Every
parser step reports how deep it read (``ParserStacks.feed_low``, ``LarkRuntime.*_low``),
so each result is kept under exactly the top states, top levels and
``min(paren, k)`` it depended on, and any later context that agrees there reuses it — a
new statement in another function, at another depth, hits the results of the first. A
true "some terminal can be taken" needs only its witness's reads; newline indentations
are tried cheapest first (same level, one deeper, then dedents) for the same reason.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from structspec.automata.base import TokenMask
from structspec.automata.lalr import Signatures
from structspec.automata.lark_grammar import TAB_REFUSED
from structspec.automata.lexer import CROSS, INSIDE

FREE = -2  # the tolerant mode's stack value (lark_constraint.FREE)

if TYPE_CHECKING:
    from structspec.automata.lark_constraint import LarkRuntime

_WORDS_MIN = 512  # inside groups at least this large are kept as packed words
_INF = 1 << 60  # "no stack height read"


def groups_of(values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Indices of ``values`` (ints) grouped by value, ascending: one counting pass and one
    radix sort, instead of ``np.unique``'s comparison sort."""
    if values.size == 0:
        return []
    lo, hi = int(values.min()), int(values.max())
    if lo == hi:
        return [(lo, np.arange(values.size))]
    if hi - lo > 4 * values.size + 4096:  # sparse values: sort them, no count over the span
        uniq, inverse = np.unique(values, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        parts = np.split(order, np.cumsum(np.bincount(inverse))[:-1])
        return [(int(u), idx) for u, idx in zip(uniq.tolist(), parts)]
    shifted = values - lo
    counts = np.bincount(shifted)
    present = np.flatnonzero(counts)
    keys = shifted.astype(np.int16) if hi - lo < 32768 else shifted
    order = np.argsort(keys, kind="stable")
    parts = np.split(order, np.cumsum(counts[present])[:-1])
    return [(int(p) + lo, idx) for p, idx in zip(present.tolist(), parts)]


def apply_effect(ind: int, kind: int, cols: int) -> int:
    """A newline lexeme's indentation ``ind`` after bytes that hold a ``\\n`` (``kind``
    1: then ``cols`` after the last ``\\n`` or form feed), only a form feed (2: ``cols``
    after it, once a ``\\n`` was seen) or neither (0: ``cols`` added). -1: no ``\\n`` yet."""
    if kind == 1:
        out = cols
    elif ind < 0:
        return -1
    elif kind == 2:
        out = cols
    else:
        out = ind + cols
    return TAB_REFUSED if out >= TAB_REFUSED else out  # a refused tab stays refused


@dataclass(frozen=True)
class _Group:
    """Tokens of one node that end inside one lexeme: their ids (or packed words)."""

    terms: int  # terminals the lexeme may still become
    ti: int  # the index of ``terms`` in its node's ``terms``
    nl_q: int  # the newline terminal's DFA state in it, or -1
    effect: tuple[int, int] | None  # (apply_effect's kind, columns) when nl_q >= 0
    ids: np.ndarray
    words: np.ndarray | None


@dataclass(frozen=True)
class _Cross:
    """Tokens of one node whose lexeme ends at lexer state ``end`` after byte ``ks``."""

    key: int  # registry id of (rows, ks): names the child node together with a start state
    end: int
    effect: tuple[int, int] | None
    winner: int  # the terminal the lexeme ends as at ``end`` (lexer ``winner``; -1: none)


@dataclass(frozen=True)
class _Node:
    inside: tuple[_Group, ...]
    cross: tuple[_Cross, ...]
    terms: tuple[int, ...] = ()  # the distinct ``terms`` of ``inside``: one check each


class MaskBuilder:
    """Masks of one :class:`LarkRuntime` (see the module docstring). Thread-safe: memo
    tables only grow; registry growth is locked."""

    def __init__(self, rt: LarkRuntime) -> None:
        self.rt = rt
        self.tt = rt.tt
        self.size = self.tt.size
        self._lock = threading.Lock()
        self._top: dict[int, _Node] = {}
        self._child: dict[tuple[int, int], _Node] = {}
        self._rests: list[tuple[np.ndarray, np.ndarray]] = []
        self._rest_ids: dict[bytes, int] = {}
        self._results: dict[tuple[int, int], tuple[np.ndarray, int, int, int]] = {}
        self._kills: dict[int, np.ndarray | None] = {}
        self._masks: dict[tuple, tuple[TokenMask, int, int, int]] = {}
        # Signatures. Per base (group, or -1 for whole masks; lexer state, indent, free):
        # the shapes (top levels read, k) seen; per (base, shape, those levels,
        # min(paren, k)): the results keyed by the stack's states read, from the top
        # (lalr.Signatures); each holds for every stack with those top states.
        self._shapes: dict[tuple, list[tuple[int, int]]] = {}
        self._sigs: dict[tuple, Signatures] = {}

    # -- lexing trees (parser-independent) ------------------------------------------------

    def _effects(self, rows: np.ndarray, lo: np.ndarray,
                 hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: :func:`apply_effect`'s kind of bytes ``[lo, hi)`` (a ``\\n``, a form feed
        only, neither); the columns after the last ``\\n`` or form feed."""
        # A comment's or a string's lexer state reaches nearly the whole vocabulary here,
        # each token whole (a lexing tree's first level): those rows read the per-token
        # effects computed once (46 ms of every such state's first mask before, 0.6 now).
        kind = np.zeros(rows.size, dtype=np.int64)
        spaces, tabs = np.zeros_like(kind), np.zeros_like(kind)
        whole = (lo == 0) & (hi == self.tt.lengths[rows])
        if whole.any():
            at = rows[whole]
            kind[whole], spaces[whole], tabs[whole] = (a[at] for a in self._whole_effects())
        part = np.flatnonzero(~whole)
        if part.size:
            kind[part], spaces[part], tabs[part] = self._segment_effects(
                rows[part], lo[part], hi[part])
        # (every count from TAB_REFUSED on means the same: a refused tab)
        return kind, np.minimum(spaces + self.rt.tab_len * tabs, TAB_REFUSED)

    def _whole_effects(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_segment_effects` of every token row, whole. Memoized."""
        got = getattr(self, "_whole", None)  # (absent from builders pickled before it)
        if got is None:
            tt = self.tt
            got = self._whole = self._segment_effects(
                np.arange(tt.data.shape[0]), np.zeros_like(tt.lengths), tt.lengths)
        return got

    def _segment_effects(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row: the kind of bytes ``[lo, hi)`` (as :meth:`_effects`), and the spaces and
        the tabs after their last ``\\n`` or form feed."""
        width = int(hi.max()) if hi.size else 0  # bytes past every hi do not matter
        if width == 0:
            zero = np.zeros(rows.size, dtype=np.int64)
            return zero, zero, zero
        data = self.tt.data[rows, :width]  # [R, W] uint8
        pos = np.arange(width)[None, :]
        seg = (pos >= lo[:, None]) & (pos < hi[:, None])
        is_nl = (data == 10) & seg
        reset = is_nl | ((data == 12) & seg)
        has = reset.any(axis=1)
        kind = np.where(is_nl.any(axis=1), 1, np.where(has, 2, 0))
        last = np.where(has, width - 1 - np.argmax(reset[:, ::-1], axis=1), -1)
        after = seg & (pos > last[:, None])
        return (kind, np.count_nonzero((data == 32) & after, axis=1),
                np.count_nonzero((data == 9) & after, axis=1))

    def _split_nl(self, end: int, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray
                  ) -> list[tuple[tuple[int, int] | None, np.ndarray]]:
        """Index groups of ``rows`` by their effect on a newline lexeme (if ``end`` may
        still become one)."""
        rt = self.rt
        if not rt.lex.terms(end) & rt.nl_bit:
            return [(None, np.arange(rows.size))]
        kind, cols = self._effects(rows, lo, hi)
        key = cols * 4 + kind  # cols >= 0
        return [((k & 3, k >> 2), idx) for k, idx in groups_of(key)]

    def _node(self, rows: np.ndarray, offs: np.ndarray, in_rows: np.ndarray,
              in_ends: np.ndarray, in_lo: np.ndarray, cr_rows: np.ndarray, cr_ks: np.ndarray,
              cr_ends: np.ndarray, cr_lo: np.ndarray, words: bool) -> _Node:
        rt, tt = self.rt, self.tt
        del rows, offs
        # Groups that the evaluation cannot tell apart (the same terminals, and the same
        # newline state and effect where they matter) are merged: one test each.
        merged: dict[tuple[int, int, tuple[int, int] | None], list[np.ndarray]] = {}
        for end, idx in groups_of(in_ends):
            r, lo = in_rows[idx], in_lo[idx]
            q = rt.lex.component(end, rt.nl) if rt.nl >= 0 else 0
            terms = rt.lex.terms(end)
            for eff, sub in self._split_nl(end, r, lo, tt.lengths[r]):
                merged.setdefault((terms, q if eff is not None else -1, eff), []).append(
                    r[sub])
        inside: list[_Group] = []
        distinct: dict[int, int] = {}
        for (terms, q, eff), parts in merged.items():
            ids = tt.ids[np.concatenate(parts) if len(parts) > 1 else parts[0]]
            w = TokenMask.from_ids(ids, self.size).words \
                if words and ids.size >= _WORDS_MIN else None
            inside.append(_Group(terms, distinct.setdefault(terms, len(distinct)), q, eff,
                                 ids, w))
        cross: list[_Cross] = []
        for end, idx in groups_of(cr_ends):
            r, ks, lo = cr_rows[idx], cr_ks[idx], cr_lo[idx]
            for eff, sub in self._split_nl(end, r, lo, ks):
                key = self._rest_key(r[sub], ks[sub])
                cross.append(_Cross(key, end, eff, rt.lex.winner(end)))
        return _Node(tuple(inside), tuple(cross), tuple(distinct))

    def _rest_key(self, rows: np.ndarray, ks: np.ndarray) -> int:
        """The registry id of the rests ``(rows, ks)`` (token rows, where each rest
        begins), interned by content: equal rests crossing out of different lexing trees
        (``[(`` after ``return`` and after ``=``) share one id, hence one child node per
        start state and one memo of results."""
        order = np.argsort(rows, kind="stable")
        rows, ks = rows[order], ks[order]
        content = rows.astype(np.int64).tobytes() + ks.astype(np.int64).tobytes()
        key = self._rest_ids.get(content)
        if key is None:
            with self._lock:
                key = self._rest_ids.get(content)
                if key is None:
                    key = len(self._rests)
                    self._rests.append((rows, ks))
                    self._rest_ids[content] = key
        return key

    def top_node(self, lx: int) -> _Node:
        """The node of lexer state ``lx``: every token walked from it."""
        got = self._top.get(lx)
        if got is None:
            w = self.rt.lex.walk(lx, self.tt)
            zeros_in = np.zeros(w.inside_rows.size, dtype=np.int64)
            zeros_cr = np.zeros(w.cross_rows.size, dtype=np.int64)
            got = self._node(w.inside_rows, zeros_in, w.inside_rows, w.inside_states,
                             zeros_in, w.cross_rows, w.cross_k, w.cross_states, zeros_cr, True)
            self._top[lx] = got
        return got

    def child_node(self, key: int, lx: int) -> _Node:
        """The node of the rests of crossing group ``key`` walked from start state ``lx``."""
        ck = (key, lx)
        got = self._child.get(ck)
        if got is None:
            rows, offs = self._rests[key]
            got = self._walk_rests(rows, offs, lx)
            self._child[ck] = got
        return got

    def _walk_rests(self, rows: np.ndarray, offs: np.ndarray, lx: int) -> _Node:
        status, pos, ends = self.rt.lex.walk_rows(self.tt, rows, offs,
                                                  np.full(rows.size, lx, dtype=np.int32))
        inside, cross = status == INSIDE, status == CROSS
        return self._node(rows, offs, rows[inside], ends[inside].astype(np.int64),
                          offs[inside], rows[cross], pos[cross], ends[cross].astype(np.int64),
                          offs[cross], False)

    # -- evaluation (parser-dependent) ------------------------------------------------------

    def _eval(self, node: _Node, ind: int, stack: int, paren: int, levels: tuple[int, ...],
              words: np.ndarray | None, ids: list[np.ndarray]) -> tuple[int, int, int]:
        """Add the legal tokens of ``node`` under this parser context to ``words`` (packed
        groups) and ``ids``. Returns what the answer depends on: the lowest stack height
        and the lowest index of ``levels`` read (``INF``: none), and ``k`` such that only
        ``min(paren, k)`` matters."""
        rt = self.rt
        low = llow = _INF
        pk = 0
        nl_check = rt.nl >= 0 and stack >= 0
        viable_low, nl_ok_low = rt.viable_low, rt.nl_ok_low
        checks = [viable_low(t, stack, paren) for t in node.terms]
        for _, lo, k in checks:
            if lo < low:
                low = lo
            if k > pk:
                pk = k
        for g in node.inside:
            ok = checks[g.ti][0]
            if not ok and g.nl_q >= 0 and g.effect is not None and nl_check:
                pk = pk or 1
                if paren == 0:
                    ok, lo, ll = nl_ok_low(g.nl_q, apply_effect(ind, *g.effect), stack, levels)
                    if lo < low:
                        low = lo
                    if ll < llow:
                        llow = ll
            if ok:
                if g.words is not None and words is not None:
                    words |= g.words
                else:
                    ids.append(g.ids)
        end_low, intern, child = rt.end_lexeme_low, rt.intern, self._child_result
        # Ending the lexeme depends on the terminal it ends as (and, for the indenter's
        # newline, on its indentation), not on the lexer state: one end per terminal.
        ended: dict[int | tuple[int, int], tuple[int, int, int, int]] = {}
        nl = rt.nl
        for c in node.cross:
            d = -1 if c.effect is None else apply_effect(ind, *c.effect)
            ek = c.winner if c.winner != nl else (nl, d)
            e = ended.get(ek)
            if e is None:
                e = ended[ek] = end_low(intern((c.end, d, stack, paren, levels, False)))
            y, lo, ll, k = e
            if lo < low:
                low = lo
            if ll < llow:
                llow = ll
            if k > pk:
                pk = k
            if y:
                got, lo, ll, k = child(c.key, y, paren)
                if lo < low:
                    low = lo
                if ll < llow:
                    llow = ll
                if k > pk:
                    pk = k
                if got.size:
                    ids.append(got)
        return low, llow, pk

    def _height(self, stack: int) -> int:
        return self.rt.stacks.depth(stack) if stack >= 0 else 0

    def _child_result(self, key: int, state: int, paren: int
                      ) -> tuple[np.ndarray, int, int, int]:
        """The legal tokens of crossing group ``key`` once their lexeme has ended in
        ``state`` (reached from a context with bracket depth ``paren``), and what they
        depend on as ``_eval`` says it, for that context. Memoized per ``(group, state)``
        and per signature (see ``_lookup``)."""
        ck = (key, state)
        got = self._results.get(ck)
        key_ = self.rt.key(state)
        if got is None:
            lx, ind, stack, paren2, levels, _ = key_
            base = (key, lx, ind, stack == FREE)
            got = self._lookup(base, stack, paren2, levels)
            if got is None:
                parts: list[np.ndarray] = []
                reads = self._eval(self.child_node(key, lx), ind, stack, paren2, levels, None,
                                   parts)
                ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
                got = self._store(base, stack, paren2, levels, reads, ids)
            self._results[ck] = got
        return self._reads(got, key_, paren)

    def _reads(self, got: tuple, key: tuple, paren: int) -> tuple:
        """A memo entry ``(value, depth, n_levels, k)`` of the state value ``key`` as
        ``(value, lowest height, lowest level index, k)`` for a context of bracket depth
        ``paren`` from which ``key`` derives."""
        value, depth, n_lv, k = got
        _, _, stack, paren2, levels, _ = key
        return (value, self._height(stack) - depth + 1 if depth else _INF,
                len(levels) - n_lv if n_lv else _INF,
                max(0, k + paren - paren2) if k else 0)

    def _lookup(self, base: tuple, stack: int, paren: int, levels: tuple[int, ...]
                ) -> tuple | None:
        """A result kept for ``base`` whose reads agree with this context: for each shape
        ``(levels read, k)`` seen under ``base``, the signatures of that shape's top
        levels and ``min(paren, k)``, matched against the stack's states from the top."""
        for n_lv, k in self._shapes.get(base, ()):
            sig = self._sigs.get((base, n_lv, k, levels[len(levels) - n_lv:] if n_lv else (),
                                  min(paren, k)))
            if sig is not None:
                got = self.rt.stacks.find_signature(sig, stack)
                if got is not None:
                    return got[0], got[1], n_lv, k
        return None

    def _store(self, base: tuple, stack: int, paren: int, levels: tuple[int, ...],
               reads: tuple[int, int, int], value: object) -> tuple:
        """Keep ``value`` under what it read (see ``_eval``); returns the memo entry
        ``(value, stack depth read, levels read, k)``."""
        low, llow, k = reads
        n_lv = len(levels) - llow if llow != _INF else 0
        shapes = self._shapes.setdefault(base, [])
        if (n_lv, k) not in shapes:
            with self._lock:
                if (n_lv, k) not in shapes:
                    shapes.append((n_lv, k))
        sk = (base, n_lv, k, levels[len(levels) - n_lv:] if n_lv else (), min(paren, k))
        sig = self._sigs.get(sk)
        if sig is None:
            sig = self._sigs.setdefault(sk, Signatures())
        value, depth = self.rt.stacks.store_signature(sig, stack, low, value)
        return value, depth, n_lv, k

    def _kill(self, lx: int) -> np.ndarray | None:
        """Packed tokens whose first byte cannot extend the lexeme of ``lx`` (``None`` when
        the lexeme cannot end at ``lx``)."""
        if lx in self._kills:
            return self._kills[lx]
        got = None
        rt, tt = self.rt, self.tt
        if rt.lex.winner(lx) >= 0:
            table = rt.lex.expand(np.array([lx]))
            dead_first = np.flatnonzero(table[lx] == 0)
            rows = np.concatenate([tt.first_rows[b] for b in dead_first]) \
                if dead_first.size else np.zeros(0, dtype=np.int64)
            got = TokenMask.from_ids(tt.ids[rows], tt.size).words
        self._kills[lx] = got
        return got

    def mask(self, state: int) -> TokenMask:
        """The tokens legal in ``state`` (EOS left to the caller). Memoized per state
        value, the after-newline flag left out (it does not change the mask), and per the
        top of the stack that its evaluation read."""
        return self._mask(state)[0]

    def _mask(self, state: int) -> tuple[TokenMask, int, int, int]:
        """The mask of ``state`` and what it depends on (see ``_eval``)."""
        key = self.rt.key(state)
        mk = key[:5]
        got = self._masks.get(mk)
        if got is None:
            lx, ind, stack, paren, levels = mk
            base = (-1, lx, ind, stack == FREE)
            got = self._lookup(base, stack, paren, levels)
            if got is None:
                words = np.zeros((self.size + 31) // 32, dtype=np.uint32)
                ids: list[np.ndarray] = []
                low, llow, pk = self._eval(self.top_node(lx), ind, stack, paren, levels,
                                           words, ids)
                kill = self._kill(lx)
                if kill is not None:
                    ended, lo, ll, k = self.rt.end_lexeme_low(state)
                    low, llow, pk = min(low, lo), min(llow, ll), max(pk, k)
                    if ended:
                        sub, lo, ll, k = self._mask(ended)
                        low, llow = min(low, lo), min(llow, ll)
                        pk = max(pk, max(0, k + paren - self.rt.key(ended)[3]) if k else 0)
                        words |= sub.words & kill
                m = TokenMask(words, self.size)
                if ids:
                    m = m | TokenMask.from_ids(np.concatenate(ids), self.size)
                got = self._store(base, stack, paren, levels, (low, llow, pk), m)
            self._masks[mk] = got
        return self._reads(got, key, key[3])


__all__ = ["MaskBuilder", "apply_effect", "groups_of"]
