"""The grammar IR and its token-level pushdown constraint.

One IR serves every structured constraint: *rules* over *terminals*, each terminal a byte
DFA (:mod:`.dfa`). A rule is a small NFA over symbols (terminals and rule references),
built from expressions (sequence, alternative, bounded or unbounded repetition), so JSON
objects, arrays, ``anyOf`` alternatives and recursive ``$ref`` are all just rules.

Runtime (a recursive transition network): a *configuration* is "inside terminal ``t`` at
DFA state ``q``, and when ``t`` ends, continue at the return stack ``k``"; a constraint
state is the interned set of configurations that are still possible (several only where
the grammar is ambiguous at this point). Bytes step configurations; when a terminal can
end, the stack predicts the next terminals. Every step is memoized, so a state is a small
int, ``advance`` is pure, and repeated contexts cost a dictionary lookup.

Masks follow XGrammar's split. For a configuration inside terminal ``t`` at ``q``, one
vectorized walk of the whole vocabulary through ``t``'s DFA (memoized per ``(t, q)``)
yields the tokens that stay inside ``t`` — legal whatever the context — and the few
tokens that may end ``t`` midway (``",``, ``"}``, ``},{``…). Only those are checked
against the stack, byte by byte. Tokens cross lexeme boundaries exactly when the text
they spell is legal.

Invariant that makes "alive" mean "completable": every terminal DFA is trimmed, every
terminal is non-empty, and rule NFAs keep only states from which the rule can finish
through productive symbols.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

from structspec import _native
from structspec.automata.base import TokenMask
from structspec.automata.dfa import ByteDFA
from structspec.automata.limits import active_limits, check_time
from structspec.errors import GrammarError, ResourceLimitError

if TYPE_CHECKING:
    from structspec.vocab import Vocabulary


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


# -- vocabulary tables for vectorized walks ------------------------------------------------------


@dataclass(frozen=True)
class _TokenTable:
    """All text tokens as a byte matrix sorted by length (longest first)."""

    ids: np.ndarray  # [T] token ids, longest first
    data: np.ndarray  # [T, Lmax] uint8, zero-padded
    lengths: np.ndarray  # [T]
    n_longer: np.ndarray  # [Lmax]: how many tokens are longer than l
    size: int
    first_rows: tuple[np.ndarray, ...]  # [256] rows whose first byte is b, ascending


_TABLES: dict[str, _TokenTable] = {}
_TABLES_LOCK = threading.Lock()


def token_table(vocab: Vocabulary) -> _TokenTable:
    """The vectorized view of ``vocab`` (built once per fingerprint)."""
    with _TABLES_LOCK:
        table = _TABLES.get(vocab.fingerprint)
        if table is None:
            ids = [i for i, t in enumerate(vocab.tokens) if t and i not in vocab.special_token_ids]
            ids.sort(key=lambda i: -len(vocab.tokens[i]))
            lmax = len(vocab.tokens[ids[0]]) if ids else 0
            data = np.zeros((len(ids), max(lmax, 1)), dtype=np.uint8)
            lengths = np.zeros(len(ids), dtype=np.int64)
            for row, i in enumerate(ids):
                t = vocab.tokens[i]
                data[row, : len(t)] = np.frombuffer(t, dtype=np.uint8)
                lengths[row] = len(t)
            n_longer = np.array([int((lengths > k).sum()) for k in range(lmax)], dtype=np.int64)
            first = data[:, 0]
            first_rows = tuple(np.flatnonzero(first == b) for b in range(256))
            table = _TokenTable(np.asarray(ids, dtype=np.int64), data, lengths, n_longer,
                                len(vocab), first_rows)
            _TABLES[vocab.fingerprint] = table
    return table


# -- the vocabulary as a token trie, level by level ------------------------------------------------


@dataclass(frozen=True)
class _TokenTrie:
    """All text tokens as a trie stored level by level (``d = 1..depth``).

    Tokens are sorted by their bytes, so the tokens below a node form one contiguous range of
    rows ``[lo, hi)``. Level ``d`` holds the distinct ``d``-byte prefixes in that order; a walk
    steps each prefix once (about 100k nodes for 49k tokens of 330k bytes).
    """

    ids: np.ndarray  # [T] token ids in byte order
    lengths: np.ndarray  # [T] their lengths
    parent: tuple[np.ndarray, ...]  # per level d: [N_d] index of the parent in level d-1
    byte: tuple[np.ndarray, ...]  # per level d: [N_d] the node's last byte
    lo: tuple[np.ndarray, ...]  # per level d: [N_d] first row below the node
    hi: tuple[np.ndarray, ...]  # per level d: [N_d] one past the last row below the node
    token: tuple[np.ndarray, ...]  # per level d: [N_d] row of the token spelling the prefix, -1
    children: tuple[np.ndarray, ...]  # per level d: [N_d + 1] child ranges in level d+1
    size: int  # the vocabulary size (mask length)
    max_len: int  # the longest token's length


_TRIES: dict[str, _TokenTrie] = {}


def token_trie(vocab: Vocabulary) -> _TokenTrie:
    """The trie view of ``vocab`` (built once per fingerprint)."""
    trie = _TRIES.get(vocab.fingerprint)  # entries are set once: a plain read is safe
    if trie is not None:
        return trie
    tt = token_table(vocab)
    rows = sorted(range(len(tt.ids)), key=lambda r: tt.data[r, : tt.lengths[r]].tobytes())
    data = tt.data[rows]  # [T, Lmax] sorted by bytes
    lengths = tt.lengths[rows]
    n = len(rows)
    parents, bytes_, los, his, toks = [], [], [], [], []
    node_of_row = np.zeros(n, dtype=np.int64)  # [T] node at the previous level (root: 0)
    for d in range(1, data.shape[1] + 1):
        valid = lengths >= d  # [T]
        if not valid.any():
            break
        b = data[:, d - 1]
        prev_valid = np.concatenate([[False], valid[:-1]])
        boundary = valid & ~(prev_valid & (np.concatenate([[-1], node_of_row[:-1]]) == node_of_row)
                             & (np.concatenate([[-1], b[:-1].astype(np.int64)]) == b))
        starts = np.flatnonzero(boundary)  # [N_d] first row of each node
        node = np.cumsum(boundary) - 1  # [T] node of each valid row
        ends = np.append(starts[1:], n)
        # A node's rows end where the next node starts or where the valid run ends.
        valid_rows = np.flatnonzero(valid)
        last = np.searchsorted(valid_rows, ends, side="left") - 1
        his.append(valid_rows[last] + 1)
        los.append(starts)
        parents.append(node_of_row[starts])
        bytes_.append(b[starts].astype(np.int64))
        toks.append(np.where(lengths[starts] == d, starts, -1))
        node_of_row = np.where(valid, node, -1)
    children = [np.searchsorted(parents[d + 1], np.arange(parents[d].size + 1))
                for d in range(len(parents) - 1)]
    children.append(np.zeros(parents[-1].size + 1, dtype=np.int64))
    trie = _TokenTrie(tt.ids[rows], lengths, tuple(parents), tuple(bytes_), tuple(los),
                      tuple(his), tuple(toks), tuple(children), tt.size,
                      int(lengths.max(initial=0)))
    with _TABLES_LOCK:
        _TRIES.setdefault(vocab.fingerprint, trie)
    return trie


@dataclass(frozen=True)
class _DfsTrie:
    """The same trie in depth-first order, for the native walk (``_native/trie_walk.c``).

    ``nodes`` is int32 ``[N, 7]``: per node its last byte, depth, the end of its subtree (one
    past its last descendant), its token rows ``[lo, hi)``, the row of the token spelling
    it exactly (``-1`` if none) and the length of the longest token below; ``below`` is the
    set of bytes anywhere below each node (a walk takes a subtree whole when all of them
    move its state alike, see the C file). ``first`` maps the
    level-1 nodes of :class:`_TokenTrie` to their rows in ``nodes``; ``text``/``offsets``
    hold the tokens' bytes in row order (remainders are slices of them).
    """

    nodes: np.ndarray  # [N, 7] int32
    below: np.ndarray  # [N, 4] uint64: bit b of the 256 is set when byte b occurs below
    lengths: np.ndarray  # [T] int32 token lengths in row order
    first: np.ndarray  # [N_1] int32
    depth: int  # the deepest node
    text: np.ndarray  # [sum of lengths] uint8, the tokens in row order
    text_bytes: bytes  # the same bytes (remainders are sliced from it)
    offsets: np.ndarray  # [T + 1] int64: row r spells text[offsets[r]:offsets[r + 1]]


_DFS_TRIES: dict[str, _DfsTrie] = {}


def _bytes_below(trie: _TokenTrie) -> list[np.ndarray]:
    """Per level, ``[N_d, 4]`` uint64 bitsets of the bytes occurring below each node
    (bottom-up: a node's set is the union of its children's bytes and sets)."""
    out: list[np.ndarray] = [np.zeros((0, 4), dtype=np.uint64)] * len(trie.byte)
    out[-1] = np.zeros((trie.byte[-1].size, 4), dtype=np.uint64)
    for lvl in range(len(trie.byte) - 2, -1, -1):
        child = trie.byte[lvl + 1]  # [N_{d+1}]
        own = np.zeros((child.size, 4), dtype=np.uint64)
        own[np.arange(child.size), child >> 6] = np.left_shift(np.uint64(1),
                                                               (child & 63).astype(np.uint64))
        own |= out[lvl + 1]
        cstart = trie.children[lvl]  # [N_d + 1]
        sets = np.zeros((trie.byte[lvl].size, 4), dtype=np.uint64)
        has = cstart[1:] > cstart[:-1]
        if own.shape[0]:
            sets[has] = np.bitwise_or.reduceat(own, cstart[:-1][has], axis=0)
        out[lvl] = sets
    return out


def dfs_trie(vocab: Vocabulary) -> _DfsTrie:
    """The depth-first view of :func:`token_trie` (built once per fingerprint).

    A node is "the prefix of row ``lo`` of length ``d``" and its subtree is the nodes of rows
    ``[lo, hi)`` that are deeper, so sorting all nodes by ``(lo, d)`` is depth-first order and
    a subtree ends at the first node of row ``hi``."""
    got = _DFS_TRIES.get(vocab.fingerprint)  # entries are set once: a plain read is safe
    if got is not None:
        return got
    trie = token_trie(vocab)
    depth = np.concatenate([np.full(b.size, d + 1, dtype=np.int64)
                            for d, b in enumerate(trie.byte)])  # [N]
    lo, hi = np.concatenate(trie.lo), np.concatenate(trie.hi)
    order = np.lexsort((depth, lo))  # [N] depth-first
    sorted_lo = lo[order]
    # The longest token of each node's rows [lo, hi): the rows from one node of a level to
    # the next beyond hi are shorter than the level, so a reduceat over lo is exact.
    deep = np.concatenate([np.maximum.reduceat(trie.lengths, lvl_lo) for lvl_lo in trie.lo])
    nodes = np.stack([np.concatenate(trie.byte)[order], depth[order],
                      np.searchsorted(sorted_lo, hi[order], side="left"), sorted_lo,
                      hi[order], np.concatenate(trie.token)[order], deep[order]],
                     axis=1).astype(np.int32)
    where = np.empty(order.size, dtype=np.int64)
    where[order] = np.arange(order.size)
    below = np.concatenate(_bytes_below(trie))[order]
    texts = [vocab.tokens[i] for i in trie.ids.tolist()]
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(t) for t in texts])
    joined = b"".join(texts)
    got = _DfsTrie(np.ascontiguousarray(nodes), np.ascontiguousarray(below),
                   trie.lengths.astype(np.int32),
                   where[: trie.byte[0].size].astype(np.int32), len(trie.byte),
                   np.frombuffer(joined, dtype=np.uint8), joined, offsets)
    with _TABLES_LOCK:
        got = _DFS_TRIES.setdefault(vocab.fingerprint, got)
    return got


def _native_walker(table: object, accepting: object) -> object | None:
    """The native ``trie_walk`` module when it can walk this DFA (a plain int32 table and
    bool array; lazy tables take the NumPy path), else ``None``."""
    mod = _native.load("trie_walk")
    if mod is None or not isinstance(table, np.ndarray) or not isinstance(accepting, np.ndarray):
        return None
    if table.dtype != np.int32 or accepting.dtype != np.bool_ or not table.flags.c_contiguous \
            or not accepting.flags.c_contiguous:
        return None
    return mod


def _walk_subtrees(trie: _TokenTrie, vocab: Vocabulary, table: np.ndarray,
                   accepting: np.ndarray, cur: np.ndarray,
                   st: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_walk_levels``'s result, from the native depth-first walk where it is built (the
    same sets; rows ascending), else from ``_walk_levels`` itself."""
    mod = _native_walker(table, accepting)
    if mod is None:
        return _walk_levels(trie, vocab, table, accepting, cur, st)
    dfs = dfs_trie(vocab)
    return mod.walk(dfs.nodes, dfs.below, dfs.lengths, table,  # type: ignore[attr-defined]
                    accepting, dfs.first[cur], st.astype(np.int32), dfs.depth)


@dataclass(frozen=True)
class _Walk:
    """What a vocabulary walk from one terminal DFA state yields.

    ``words``: the tokens that stay inside the terminal (mask words). The others that survive
    until the terminal may end midway are *crossing* candidates: token ``cand_ids[i]`` is legal
    when its remainder ``remainders[cand_rem[i]]`` (the bytes after the terminal ends) is legal
    in what follows; a token with several places where the terminal may end has one entry per
    place.
    """

    words: np.ndarray  # [ceil(V/32)] uint32
    cand_ids: np.ndarray  # [P] token ids
    cand_rem: np.ndarray  # [P] index into remainders
    remainders: tuple[bytes, ...]  # [R] distinct remainders
    rem_first: np.ndarray | None = None  # [R] their first bytes (256: empty); None: not known


def _first_bytes(remainders: tuple[bytes, ...]) -> np.ndarray:
    """``[R]`` the first byte of each remainder, 256 for an empty one."""
    return np.fromiter((r[0] if r else 256 for r in remainders), dtype=np.int64,
                       count=len(remainders))


_TAIL_ROWS = 192  # below this many live tokens a walk goes on token by token


def _walk_tail(trie: _TokenTrie, vocab: Vocabulary, table: np.ndarray, accepting: np.ndarray,
               d: int, cur: np.ndarray, st: np.ndarray, inside: list[np.ndarray],
               split_lo: list[np.ndarray], split_hi: list[np.ndarray],
               split_pos: list[int]) -> None:
    """Finish a walk below the live level-``d`` nodes ``cur`` (in states ``st``) token by
    token, appending to ``walk_vocabulary``'s lists (a split as a one-row range). Deep trie
    levels hold a few long tokens: stepping them in Python beats a numpy pass per level."""
    lvl = d - 1
    tokens, ids = vocab.tokens, trie.ids
    got: list[int] = []
    for node, s0 in zip(cur.tolist(), st.tolist(), strict=True):
        lo, hi = int(trie.lo[lvl][node]), int(trie.hi[lvl][node])
        if trie.token[lvl][node] >= 0:
            lo += 1  # that token ends at this node: already counted
        for r in range(lo, hi):
            text = tokens[int(ids[r])]
            s = s0
            for pos in range(d, len(text)):
                s = int(table[s, text[pos]])
                if not s:
                    break
                if pos + 1 == len(text):
                    got.append(r)
                elif accepting[s]:
                    split_lo.append(np.array([r]))
                    split_hi.append(np.array([r + 1]))
                    split_pos.append(pos + 1)
    inside.append(np.asarray(got, dtype=np.int64))


def _walk_levels(trie: _TokenTrie, vocab: Vocabulary, table: np.ndarray,
                 accepting: np.ndarray, cur: np.ndarray,
                 st: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Walk the subtrees of the level-1 nodes ``cur`` entered in states ``st`` (alive).

    Returns the rows of the tokens that stay inside, and the split ranges ``(lo, hi, pos)``:
    rows ``[lo, hi)`` may leave the terminal after ``pos`` bytes."""
    inside: list[np.ndarray] = []
    split_lo: list[np.ndarray] = []
    split_hi: list[np.ndarray] = []
    split_pos: list[int] = []
    depth = len(trie.byte)
    for d in range(1, depth + 1):
        lvl = d - 1
        tok = trie.token[lvl][cur]
        inside.append(tok[tok >= 0])
        ends = accepting[st]
        if ends.any():  # the terminal may end after d bytes: the rest must follow it
            a = cur[ends]
            lo = trie.lo[lvl][a] + (trie.token[lvl][a] >= 0)
            hi = trie.hi[lvl][a]
            keep = lo < hi
            if keep.any():
                split_lo.append(lo[keep])
                split_hi.append(hi[keep])
                split_pos.append(d)
        if d == depth:
            break
        if cur.size <= _TAIL_ROWS:
            lo, hi = trie.lo[lvl][cur], trie.hi[lvl][cur]
            if int((hi - lo).sum()) <= _TAIL_ROWS:  # few tokens left: finish them one by one
                _walk_tail(trie, vocab, table, accepting, d, cur, st, inside, split_lo,
                           split_hi, split_pos)
                break
        parent, byte = trie.parent[d], trie.byte[d]
        if 4 * cur.size >= trie.parent[lvl].size:  # dense: gather over the whole next level
            full = np.zeros(trie.byte[lvl].size, dtype=np.int64)
            full[cur] = st
            ps = full[parent]  # [N_{d+1}] parent states (0: dead)
            nxt = np.flatnonzero(ps)
            if nxt.size == 0:
                break
            st = table[ps[nxt], byte[nxt]]
        else:  # sparse: expand the children ranges of the alive nodes
            cstart = trie.children[lvl]
            first, counts = cstart[cur], cstart[cur + 1] - cstart[cur]
            total = int(counts.sum())
            if total == 0:
                break
            offsets = np.cumsum(counts) - counts
            nxt = np.repeat(first - offsets, counts) + np.arange(total)
            st = table[np.repeat(st, counts), byte[nxt]]
        alive = st != 0
        cur, st = nxt[alive], st[alive]
        if cur.size == 0:
            break
    empty = np.zeros(0, dtype=np.int64)
    rows = np.concatenate(inside) if inside else empty
    if not split_lo:
        return rows, empty, empty, empty
    pos = np.repeat(np.asarray(split_pos, dtype=np.int64), [x.size for x in split_lo])
    return rows, np.concatenate(split_lo), np.concatenate(split_hi), pos


_Part = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _partition(trie: _TokenTrie, nodes: np.ndarray, walked: _Part) -> list[_Part]:
    """Split a walk of the level-1 ``nodes`` (ascending) into one part per node."""
    rows, lo, hi, pos = walked
    starts = trie.lo[0][nodes]  # [K]
    r_of = np.searchsorted(starts, rows, side="right") - 1
    s_of = np.searchsorted(starts, lo, side="right") - 1
    r_cut = np.searchsorted(r_of, np.arange(nodes.size + 1), side="left") \
        if np.all(r_of[:-1] <= r_of[1:]) else None
    out: list[_Part] = []
    if r_cut is None:  # rows are not in order (tails): sort them first
        order = np.argsort(r_of, kind="stable")
        rows, r_of = rows[order], r_of[order]
        r_cut = np.searchsorted(r_of, np.arange(nodes.size + 1), side="left")
    order = np.argsort(s_of, kind="stable")
    lo, hi, pos, s_of = lo[order], hi[order], pos[order], s_of[order]
    s_cut = np.searchsorted(s_of, np.arange(nodes.size + 1), side="left")
    for i in range(nodes.size):
        a, b, c, e = r_cut[i], r_cut[i + 1], s_cut[i], s_cut[i + 1]
        out.append((rows[a:b].astype(np.int32), lo[c:e].astype(np.int32),
                    hi[c:e].astype(np.int32), pos[c:e].astype(np.int32)))
    return out


def walk_vocabulary(trie: _TokenTrie, vocab: Vocabulary, table: np.ndarray,
                    accepting: np.ndarray, q: int,
                    subtrees: dict[tuple[int, int], _Part] | None = None) -> _Walk:
    """Walk every token of ``trie`` through a terminal DFA from state ``q``, level by level:
    each distinct prefix is stepped once, only below prefixes that are still alive.

    ``subtrees`` (mutated: it grows) memoizes the walk below each first byte per state
    entered, ``(level-1 node, state) -> part``: states that go on alike after most first
    bytes (a key automaton minus the named keys) share those parts. Thread-safe as far as
    dict updates are."""
    row = np.asarray(table[q])  # [256]
    st = row[trie.byte[0]]  # [N_1] states of the level-1 nodes
    cur = np.flatnonzero(st)  # alive level-1 nodes
    st = st[cur]
    if subtrees is None:
        rows, split_lo, split_hi, split_pos = _walk_subtrees(trie, vocab, table, accepting,
                                                             cur, st)
    else:
        keys = list(zip(cur.tolist(), st.tolist(), strict=True))
        missing = [i for i, k in enumerate(keys) if k not in subtrees]
        if missing:
            m = np.asarray(missing, dtype=np.int64)
            walked = _walk_subtrees(trie, vocab, table, accepting, cur[m], st[m])
            for i, part in zip(missing, _partition(trie, cur[m], walked), strict=True):
                subtrees[keys[i]] = part
        parts = [subtrees[k] for k in keys]
        rows = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        split_lo = np.concatenate([p[1] for p in parts]) if parts else rows
        split_hi = np.concatenate([p[2] for p in parts]) if parts else rows
        split_pos = np.concatenate([p[3] for p in parts]) if parts else rows
    return _finish_walk(trie, vocab, rows, split_lo, split_hi, split_pos)


def _finish_walk(trie: _TokenTrie, vocab: Vocabulary, rows: np.ndarray, split_lo: np.ndarray,
                 split_hi: np.ndarray, split_pos: np.ndarray) -> _Walk:
    """A walk's :class:`_Walk`: the mask words of the inside ``rows``, and each split row
    whose token is not inside as a crossing candidate with its remainder (distinct
    remainders numbered in order of first appearance). Native where built."""
    mod = _native.load("trie_walk")
    if mod is not None:
        dfs = dfs_trie(vocab)
        words, cand, cand_rem, rem_rows, rem_pos = mod.finish(  # type: ignore[attr-defined]
            trie.ids, trie.size, rows.astype(np.int32, copy=False),
            split_lo.astype(np.int32, copy=False), split_hi.astype(np.int32, copy=False),
            split_pos.astype(np.int32, copy=False), dfs.text, dfs.offsets)
        if not cand.size:
            return _Walk(words, cand, cand_rem, (), cand_rem)
        text, offsets = dfs.text_bytes, dfs.offsets
        starts, ends = offsets[rem_rows] + rem_pos, offsets[rem_rows + 1]  # [R]
        remainders = tuple(text[a:b] for a, b in zip(starts.tolist(), ends.tolist(),
                                                       strict=True))
        # First bytes read from the text array at once (256: an empty remainder; widened
        # first, since NumPy 2.5 refuses 256 as a uint8 scalar).
        text = dfs.text[np.minimum(starts, dfs.text.size - 1)].astype(np.int64)
        first = np.where(starts < ends, text, 256)
        return _Walk(words, cand, cand_rem, remainders, first)
    words = TokenMask.from_ids(trie.ids[rows], trie.size).words
    empty = np.zeros(0, dtype=np.int64)
    if not split_lo.size:
        return _Walk(words, empty, empty, (), empty)
    is_inside = np.zeros(trie.ids.size, dtype=bool)
    is_inside[rows] = True
    counts = split_hi - split_lo
    pair_rows = np.repeat(split_lo - (np.cumsum(counts) - counts), counts) \
        + np.arange(int(counts.sum()))
    pair_pos = np.repeat(split_pos, counts)
    keep = ~is_inside[pair_rows]
    cand = trie.ids[pair_rows[keep]]
    rem_idx: list[int] = []
    rem_ids: dict[bytes, int] = {}
    tokens = vocab.tokens
    for tid, pos in zip(cand.tolist(), pair_pos[keep].tolist(), strict=True):
        rem_idx.append(rem_ids.setdefault(tokens[tid][pos:], len(rem_ids)))
    remainders = tuple(rem_ids)
    return _Walk(words, cand, np.asarray(rem_idx, dtype=np.int64), remainders,
                 _first_bytes(remainders))


# -- the runtime constraint ----------------------------------------------------------------------

_END = (-1, 0, 0)  # the configuration "the whole output is complete"


@dataclass
class _Memo:
    states: list[frozenset[tuple[int, int, int]]] = field(default_factory=list)
    state_ids: dict[frozenset[tuple[int, int, int]], int] = field(default_factory=dict)
    stacks: list[tuple[int, int, int]] = field(default_factory=list)  # (rule, rstate, parent)
    stack_ids: dict[tuple[int, int, int], int] = field(default_factory=dict)
    depths: list[int] = field(default_factory=list)  # frames below each stack
    completions: dict[int, frozenset[tuple[int, int, int]]] = field(default_factory=dict)
    byte_steps: dict[tuple[int, int], int] = field(default_factory=dict)
    token_steps: dict[tuple[int, int], int] = field(default_factory=dict)
    masks: dict[int, TokenMask] = field(default_factory=dict)
    accepting: dict[int, bool] = field(default_factory=dict)
    forced: dict[int, bytes] = field(default_factory=dict)
    walks: dict[tuple[int, int], _Walk] = field(default_factory=dict)
    follow: dict[int, int] = field(default_factory=dict)
    crossing: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict)
    token_words: dict[int, np.ndarray] = field(default_factory=dict)
    live_first: dict[int, np.ndarray] = field(default_factory=dict)
    row_bits: dict[tuple[int, int], int] = field(default_factory=dict)
    stack_bits: dict[int, int] = field(default_factory=dict)
    closures: dict[tuple[int, int], tuple[tuple[tuple[int, int], ...], bool]] = field(
        default_factory=dict)


class GrammarConstraint:
    """A token-level constraint for a :class:`Grammar` (see the module docstring).

    States are ints; state 0 is dead (never returned by ``advance``, which returns ``None``).
    Thread-safe: memo tables only grow; interning is locked.
    """

    def __init__(self, grammar: Grammar, vocab: Vocabulary,
                 limits: GrammarLimits | None = None) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self.limits = limits or current_grammar_limits()
        self._lock = threading.RLock()
        self._memo = _Memo()
        self._tables = [d.table for d in grammar.terminals]
        self._acc = [d.accepting for d in grammar.terminals]
        self._eos = np.fromiter(sorted(vocab.eos_token_ids), dtype=np.int64)
        self._intern_state(frozenset())  # 0 = dead
        self._stack_id((-1, -1, -1))  # 0 = bottom of every stack
        start = frozenset(self._predict(grammar.start, grammar.rules[grammar.start].start, 0))
        self._initial = self._intern_state(start)
        if self._initial == 0:
            raise GrammarError("the grammar derives no complete output")

    # -- protocol ----------------------------------------------------------------------------

    @property
    def initial(self) -> int:
        """The state before any token."""
        return self._initial

    @property
    def vocab_size(self) -> int:
        """The number of ids a mask covers."""
        return len(self.vocab)

    def advance(self, state: int, token: int) -> int | None:
        """The state after ``token``, ``None`` if illegal; EOS keeps an accepting state."""
        key = (state, token)
        got = self._memo.token_steps.get(key)
        if got is None:
            if token in self.vocab.eos_token_ids:
                got = state if self.is_accepting(state) else 0
            elif not 0 <= token < len(self.vocab) or token in self.vocab.special_token_ids:
                got = 0
            else:
                got = self.step_bytes(state, self.vocab.tokens[token])
            self._memo.token_steps[key] = got
        return got or None

    def allowed(self, state: int) -> TokenMask:
        """The ids legal in ``state`` (EOS when accepting); memoized per state."""
        mask = self._memo.masks.get(state)
        if mask is None:
            mask = self._compute_mask(state)
            self._memo.masks[state] = mask
        return mask

    def is_accepting(self, state: int) -> bool:
        """Whether the text so far is a complete output."""
        got = self._memo.accepting.get(state)
        if got is None:
            got = any(self._can_end(c) for c in self._memo.states[state])
            self._memo.accepting[state] = got
        return got

    def forced(self, state: int) -> bytes:
        """Bytes every continuation from ``state`` must emit next; memoized."""
        got = self._memo.forced.get(state)
        if got is None:
            out = bytearray()
            s = state
            for _ in range(4096):
                if s == 0 or self.is_accepting(s):
                    break
                live = self._live_bytes(s)
                if len(live) != 1:
                    break
                out.append(live[0])
                s = self.step_bytes(s, bytes(live))
            got = bytes(out)
            self._memo.forced[state] = got
        return got

    def state_count(self) -> int:
        """How many states have been interned so far (for budgets and stats)."""
        return len(self._memo.states)

    def memo_size(self) -> int:
        """How much has been memoized (masks and token steps): the disk cache rewrites an
        entry once this grows."""
        return len(self._memo.masks) + len(self._memo.token_steps)

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        del state["_lock"]  # locks do not pickle; the memo tables do (the disk cache)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        for f in fields(_Memo):  # a memo pickled by an older version lacks the newer tables
            if not hasattr(self._memo, f.name):
                setattr(self._memo, f.name, f.default_factory())  # type: ignore[misc]

    # -- bytes ---------------------------------------------------------------------------------

    def step_bytes(self, state: int, data: bytes) -> int:
        """The state after ``data`` (0 if it is illegal). Pure; memoized per byte."""
        steps = self._memo.byte_steps
        for b in data:
            if state == 0:
                return 0
            nxt = steps.get((state, b))
            if nxt is None:
                nxt = self._step(state, b)
                steps[(state, b)] = nxt
            state = nxt
        return state

    def _step(self, state: int, b: int) -> int:
        out: set[tuple[int, int, int]] = set()
        tables, acc = self._tables, self._acc
        for cfg in self._memo.states[state]:
            tid, q, k = cfg
            if tid < 0:
                continue
            q2 = int(tables[tid][q, b])
            if q2:
                out.add((tid, q2, k))
            if acc[tid][q]:
                for nt, nq, nk in self._complete(k):
                    if nt < 0:
                        continue
                    q3 = int(tables[nt][nq, b])
                    if q3:
                        out.add((nt, q3, nk))
        if len(out) > self.limits.max_configs:
            raise ResourceLimitError(
                f"grammar state has over {self.limits.max_configs} configurations "
                "(the grammar is too ambiguous here)"
            )
        return self._intern_state(frozenset(out))

    def _live_bytes(self, state: int) -> list[int]:
        live: set[int] = set()
        for tid, q, k in self._memo.states[state]:
            if tid < 0:
                continue
            live.update(np.flatnonzero(self._tables[tid][q]).tolist())
            if self._acc[tid][q]:
                for nt, nq, _ in self._complete(k):
                    if nt >= 0:
                        live.update(np.flatnonzero(self._tables[nt][nq]).tolist())
            if len(live) > 1:
                break
        return sorted(live)

    # -- the pushdown part ---------------------------------------------------------------------

    def _stack_id(self, frame: tuple[int, int, int]) -> int:
        got = self._memo.stack_ids.get(frame)
        if got is None:
            with self._lock:
                got = self._memo.stack_ids.get(frame)
                if got is None:
                    depth = self._memo.depths[frame[2]] + 1 if self._memo.stacks else 0
                    if depth > self.limits.max_depth:
                        return -1  # too deep: the caller drops this continuation
                    got = len(self._memo.stacks)
                    self._memo.stacks.append(frame)
                    self._memo.depths.append(depth)
                    self._memo.stack_ids[frame] = got
        return got

    def _intern_state(self, configs: frozenset[tuple[int, int, int]]) -> int:
        got = self._memo.state_ids.get(configs)
        if got is None:
            with self._lock:
                got = self._memo.state_ids.get(configs)
                if got is None:
                    if len(self._memo.states) >= self.limits.max_states:
                        raise ResourceLimitError(
                            f"constraint exceeds {self.limits.max_states} states"
                        )
                    got = len(self._memo.states)
                    self._memo.states.append(configs)
                    self._memo.state_ids[configs] = got
        return got

    def _closure(self, rule_id: int, rstate: int) -> tuple[tuple[tuple[int, int], ...], bool]:
        """The edges ``(symbol, target)`` leaving the epsilon closure of ``(rule, rstate)``
        and whether the closure may accept. Memoized per constraint: it depends on the rule
        alone, while ``_predict`` runs once per new return stack and recomputed it each time
        (a third of its own time under cProfile, MaskBench 800)."""
        key = (rule_id, rstate)
        got = self._memo.closures.get(key)
        if got is None:
            rule = self.grammar.rules[rule_id]
            seen = {rstate}
            todo = [rstate]
            while todo:
                s = todo.pop()
                for t in rule.eps[s]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            edges = tuple(e for s in seen for e in rule.edges[s])
            got = (edges, any(s in rule.accept for s in seen))
            self._memo.closures[key] = got
        return got

    def _predict(self, rule_id: int, rstate: int, parent: int,
                 depth: int = 0) -> set[tuple[int, int, int]]:
        """Configurations starting the next terminal from rule position ``(rule, rstate)``
        with return stack ``parent``; ``_END`` when the whole output may end here."""
        if depth > self.limits.max_depth:
            raise ResourceLimitError(
                f"grammar nesting exceeds depth {self.limits.max_depth} (or is left-recursive)"
            )
        edges, accepts = self._closure(rule_id, rstate)
        out: set[tuple[int, int, int]] = set()
        terminals, rules, stack_id = self.grammar.terminals, self.grammar.rules, self._stack_id
        for sym, t in edges:
            # Nesting beyond ``limits.max_depth`` is not offered (narrowing, documented).
            frame = stack_id((rule_id, t, parent))
            if frame < 0:
                continue
            if sym >= 0:
                out.add((sym, terminals[sym].start, frame))
            else:
                callee = -sym - 1
                out |= self._predict(callee, rules[callee].start, frame, depth + 1)
        if accepts:
            got = self._memo.completions.get(parent)
            out |= got if got is not None else self._complete(parent, depth + 1)
        return out

    def _complete(self, stack: int, depth: int = 0) -> frozenset[tuple[int, int, int]]:
        """What may follow once the current terminal (or rule) ends, with ``stack`` on top."""
        got = self._memo.completions.get(stack)
        if got is None:
            if stack == 0:
                got = frozenset({_END})
            else:
                rule_id, rstate, parent = self._memo.stacks[stack]
                got = frozenset(self._predict(rule_id, rstate, parent, depth))
            self._memo.completions[stack] = got
        return got

    def _can_end(self, cfg: tuple[int, int, int]) -> bool:
        tid, q, k = cfg
        if tid < 0:
            return True
        return bool(self._acc[tid][q]) and _END in self._complete(k)

    # -- masks -----------------------------------------------------------------------------------

    def _walk(self, tid: int, q: int) -> _Walk:
        """The vocabulary walk through terminal ``tid`` from ``q`` (see :class:`_Walk`)."""
        key = (tid, q)
        got = self._memo.walks.get(key)
        if got is None:
            # The walk depends on the DFA and the vocabulary only: share it across grammars.
            dfa = self.grammar.terminals[tid]
            trie = token_trie(self.vocab)
            shared_key = ("trie-walk", self.vocab.fingerprint, dfa.walk_key(q, trie.max_len))
            got = dfa.memo.get(shared_key)  # type: ignore[assignment]
            if got is None:
                # Per-first-byte parts pay for the NumPy walk where states differ after a few
                # first bytes only (products such as "a key other than these"); a structured
                # DFA has its own sharing (``walk_key``) and would only keep the parts in
                # memory. The native walk is faster without them (MaskBench 300: mask CPU
                # 1.55 -> 1.14 s, p99 540 -> 330 us): gluing parts costs more than walking.
                native = _native_walker(self._tables[tid], self._acc[tid]) is not None
                subtrees = None if native or type(dfa).walk_key is not ByteDFA.walk_key else \
                    dfa.memo.setdefault(("trie-subtrees", self.vocab.fingerprint), {})
                got = walk_vocabulary(trie, self.vocab, self._tables[tid], self._acc[tid], q,
                                      subtrees)  # type: ignore[arg-type]
                dfa.memo[shared_key] = got
            self._memo.walks[key] = got
        return got

    def _follow(self, stack: int) -> int:
        """The state "a terminal starts here" once the current one ends with ``stack`` on
        top (the completions, interned)."""
        got = self._memo.follow.get(stack)
        if got is None:
            got = self._intern_state(self._complete(stack))
            self._memo.follow[stack] = got
        return got

    def _crossing(self, tid: int, q: int, k: int) -> np.ndarray:
        """Ids of the tokens that end terminal ``tid`` midway (from ``q``) and whose remainder
        is legal after it, with return stack ``k``.

        Memoized per ``(tid, q, k)`` and, underneath, per ``(tid, q, follow state)``: the
        result depends on what may follow only, and distinct return stacks often complete
        alike (the same member list inside different parents), so their remainders are
        checked once."""
        key = (tid, q, k)
        got = self._memo.crossing.get(key)
        if got is None:
            walk = self._walk(tid, q)
            if walk.cand_ids.size:
                follow = self._follow(k)
                fkey = (tid, q, -1 - follow)  # follow-state keys: negative, beside stack keys
                got = self._memo.crossing.get(fkey)
                if got is None:
                    first = walk.rem_first if walk.rem_first is not None \
                        else _first_bytes(walk.remainders)  # a walk from an older cache
                    # Most remainders die at their first byte: only the others step the
                    # runtime.
                    legal = self._live_first(follow)[first]  # [R]
                    remainders, step = walk.remainders, self.step_bytes
                    for i in np.flatnonzero(legal).tolist():
                        legal[i] = step(follow, remainders[i]) != 0
                    got = walk.cand_ids[legal[walk.cand_rem]]
                    self._memo.crossing[fkey] = got
            else:
                got = walk.cand_ids
            self._memo.crossing[key] = got
        return got

    def _live_first(self, state: int) -> np.ndarray:
        """``bool [257]``: the bytes that may come first in ``state`` (the tables' rows of its
        configurations and, where a terminal may end, of what follows), and at 256 whether
        ``state`` is alive (the empty text is legal). Memoized; the result is read-only."""
        got = self._memo.live_first.get(state)
        if got is None:
            # The rows of the configurations, and the first bytes of what follows once per
            # distinct return stack (ambiguous states hold ~1,500 configurations over a few
            # stacks: iterating each one's completions took most of their mask time).
            rows: set[tuple[int, int]] = set()
            stacks: set[int] = set()
            acc = self._acc
            for tid, q, k in self._memo.states[state]:
                if tid < 0:
                    continue
                rows.add((tid, q))
                if acc[tid][q]:
                    stacks.add(k)
            bits = 1 << 256 if state != 0 else 0  # bit 256: alive
            for tid, q in rows:
                bits |= self._row_bits(tid, q)
            for k in stacks:
                bits |= self._stack_bits(k)
            got = np.unpackbits(np.frombuffer(bits.to_bytes(33, "little"), dtype=np.uint8),
                                bitorder="little")[:257].astype(bool)
            got.setflags(write=False)
            self._memo.live_first[state] = got
        return got

    def _stack_bits(self, k: int) -> int:
        """The bytes that may come first once a terminal ends with return stack ``k`` (the
        rows of its completions), as a 256-bit int; memoized per stack."""
        got = self._memo.stack_bits.get(k)
        if got is None:
            got = 0
            for nt, nq in {(nt, nq) for nt, nq, _ in self._complete(k) if nt >= 0}:
                got |= self._row_bits(nt, nq)
            self._memo.stack_bits[k] = got
        return got

    def _row_bits(self, tid: int, q: int) -> int:
        """The bytes with a transition from ``q`` in terminal ``tid``, as a 256-bit int
        (memoized per constraint: follow states share their rows)."""
        got = self._memo.row_bits.get((tid, q))
        if got is None:
            live = np.asarray(self._tables[tid][q]) != 0  # [256]
            got = int.from_bytes(np.packbits(live, bitorder="little").tobytes(), "little")
            self._memo.row_bits[(tid, q)] = got
        return got

    def _token_words(self, state: int) -> np.ndarray:
        """The mask words of the tokens legal in ``state`` (EOS aside); memoized.

        A state is a union of configurations, so its tokens are the union of each one's:
        those inside its terminal, those crossing the terminal's end midway (checked by
        their remainder against what follows), and — when the terminal may end right here —
        the tokens of what follows."""
        got = self._memo.token_words.get(state)
        if got is None:
            # Configurations of one state often share their DFA position (tid, q) or their
            # follow state (the same value inside different parents, overlapping anyOf
            # branches): each walk, crossing set and follow state is ORed in once.
            got = np.zeros((len(self.vocab) + 31) // 32, dtype=np.uint32)
            extra: dict[int, np.ndarray] = {}
            walked: set[tuple[int, int]] = set()
            followed: set[int] = set()
            acc = self._acc
            for tid, q, k in self._memo.states[state]:
                if tid < 0:
                    continue
                if (tid, q) not in walked:
                    walked.add((tid, q))
                    got |= self._walk(tid, q).words
                crossing = self._crossing(tid, q, k)
                if crossing.size:
                    extra[id(crossing)] = crossing  # memoized arrays: alive, ids unique
                if acc[tid][q]:
                    follow = self._follow(k)
                    if follow not in followed:
                        followed.add(follow)
                        got |= self._token_words(follow)
            if extra:
                got |= TokenMask.from_ids(np.concatenate(list(extra.values())),
                                          len(self.vocab)).words
            got.setflags(write=False)
            self._memo.token_words[state] = got
        return got

    def _compute_mask(self, state: int) -> TokenMask:
        mask = TokenMask(self._token_words(state), len(self.vocab))
        if self.is_accepting(state):
            mask = mask | TokenMask.from_ids(self._eos, len(self.vocab))
        return mask


def compile_grammar_ir(grammar: Grammar, vocab: Vocabulary,
                       limits: GrammarLimits | None = None) -> GrammarConstraint:
    """Wrap a built :class:`Grammar` as a token-level constraint for ``vocab``."""
    return GrammarConstraint(grammar, vocab, limits)


__all__: Sequence[str] = [
    "EMPTY", "Expr", "Grammar", "GrammarBuilder", "GrammarConstraint", "GrammarLimits", "Rule",
    "alt", "compile_grammar_ir", "opt", "ref", "rep", "seq", "term", "token_table",
]
