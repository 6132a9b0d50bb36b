"""The vocabulary as tables and a trie, and the vectorized walks of it through a byte DFA.

A grammar's masks need, for a configuration inside terminal ``t`` at DFA state ``q``, the
tokens whose bytes stay inside ``t`` and those that may end it midway. Walking all ~50k
tokens byte by byte per ``(t, q)`` would cost seconds; these structures share the work:
:func:`token_table` (all tokens as a byte matrix, longest first), :func:`token_trie` (the
vocabulary as a trie, level by level) and :func:`dfs_trie` (the same in depth-first order,
for the native walker), and :func:`walk_vocabulary`, which walks every token through a DFA
at once, one trie level per step, splitting off the tokens that leave the terminal. Built
once per vocabulary fingerprint; thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from structspec import _native
from structspec.automata.base import TokenMask

if TYPE_CHECKING:
    from structspec.vocab import Vocabulary


# -- vocabulary tables for vectorized walks ------------------------------------------------------


@dataclass(frozen=True)
class TokenTable:
    """All text tokens as a byte matrix sorted by length (longest first)."""

    ids: np.ndarray  # [T] token ids, longest first
    data: np.ndarray  # [T, Lmax] uint8, zero-padded
    lengths: np.ndarray  # [T]
    n_longer: np.ndarray  # [Lmax]: how many tokens are longer than l
    size: int
    first_rows: tuple[np.ndarray, ...]  # [256] rows whose first byte is b, ascending


_TABLES: dict[str, TokenTable] = {}
_TABLES_LOCK = threading.Lock()


def token_table(vocab: Vocabulary) -> TokenTable:
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
            table = TokenTable(np.asarray(ids, dtype=np.int64), data, lengths, n_longer,
                                len(vocab), first_rows)
            _TABLES[vocab.fingerprint] = table
    return table


# -- the vocabulary as a token trie, level by level ------------------------------------------------


@dataclass(frozen=True)
class TokenTrie:
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


_TRIES: dict[str, TokenTrie] = {}


def token_trie(vocab: Vocabulary) -> TokenTrie:
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
    trie = TokenTrie(tt.ids[rows], lengths, tuple(parents), tuple(bytes_), tuple(los),
                      tuple(his), tuple(toks), tuple(children), tt.size,
                      int(lengths.max(initial=0)))
    with _TABLES_LOCK:
        _TRIES.setdefault(vocab.fingerprint, trie)
    return trie


@dataclass(frozen=True)
class DfsTrie:
    """The same trie in depth-first order, for the native walk (``_native/trie_walk.c``).

    ``nodes`` is int32 ``[N, 7]``: per node its last byte, depth, the end of its subtree (one
    past its last descendant), its token rows ``[lo, hi)``, the row of the token spelling
    it exactly (``-1`` if none) and the length of the longest token below; ``below`` is the
    set of bytes anywhere below each node (a walk takes a subtree whole when all of them
    move its state alike, see the C file). ``first`` maps the
    level-1 nodes of :class:`TokenTrie` to their rows in ``nodes``; ``text``/``offsets``
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


_DFS_TRIES: dict[str, DfsTrie] = {}


def _bytes_below(trie: TokenTrie) -> list[np.ndarray]:
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


def dfs_trie(vocab: Vocabulary) -> DfsTrie:
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
    got = DfsTrie(np.ascontiguousarray(nodes), np.ascontiguousarray(below),
                   trie.lengths.astype(np.int32),
                   where[: trie.byte[0].size].astype(np.int32), len(trie.byte),
                   np.frombuffer(joined, dtype=np.uint8), joined, offsets)
    with _TABLES_LOCK:
        got = _DFS_TRIES.setdefault(vocab.fingerprint, got)
    return got


def native_walker(table: object, accepting: object) -> object | None:
    """The native ``trie_walk`` module when it can walk this DFA (a plain int32 table and
    bool array; lazy tables take the NumPy path), else ``None``."""
    mod = _native.load("trie_walk")
    if mod is None or not isinstance(table, np.ndarray) or not isinstance(accepting, np.ndarray):
        return None
    if table.dtype != np.int32 or accepting.dtype != np.bool_ or not table.flags.c_contiguous \
            or not accepting.flags.c_contiguous:
        return None
    return mod


def _walk_subtrees(trie: TokenTrie, vocab: Vocabulary, table: np.ndarray,
                   accepting: np.ndarray, cur: np.ndarray,
                   st: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_walk_levels``'s result, from the native depth-first walk where it is built (the
    same sets; rows ascending), else from ``_walk_levels`` itself."""
    mod = native_walker(table, accepting)
    if mod is None:
        return _walk_levels(trie, vocab, table, accepting, cur, st)
    dfs = dfs_trie(vocab)
    return mod.walk(dfs.nodes, dfs.below, dfs.lengths, table,  # type: ignore[attr-defined]
                    accepting, dfs.first[cur], st.astype(np.int32), dfs.depth)


@dataclass(frozen=True)
class VocabWalk:
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


def first_bytes(remainders: tuple[bytes, ...]) -> np.ndarray:
    """``[R]`` the first byte of each remainder, 256 for an empty one."""
    return np.fromiter((r[0] if r else 256 for r in remainders), dtype=np.int64,
                       count=len(remainders))


_TAIL_ROWS = 192  # below this many live tokens a walk goes on token by token


def _walk_tail(trie: TokenTrie, vocab: Vocabulary, table: np.ndarray, accepting: np.ndarray,
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


def _walk_levels(trie: TokenTrie, vocab: Vocabulary, table: np.ndarray,
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


def _partition(trie: TokenTrie, nodes: np.ndarray, walked: _Part) -> list[_Part]:
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


def walk_vocabulary(trie: TokenTrie, vocab: Vocabulary, table: np.ndarray,
                    accepting: np.ndarray, q: int,
                    subtrees: dict[tuple[int, int], _Part] | None = None) -> VocabWalk:
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


def _finish_walk(trie: TokenTrie, vocab: Vocabulary, rows: np.ndarray, split_lo: np.ndarray,
                 split_hi: np.ndarray, split_pos: np.ndarray) -> VocabWalk:
    """A walk's :class:`VocabWalk`: the mask words of the inside ``rows``, and each split row
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
            return VocabWalk(words, cand, cand_rem, (), cand_rem)
        text, offsets = dfs.text_bytes, dfs.offsets
        starts, ends = offsets[rem_rows] + rem_pos, offsets[rem_rows + 1]  # [R]
        remainders = tuple(text[a:b] for a, b in zip(starts.tolist(), ends.tolist(),
                                                       strict=True))
        # First bytes read from the text array at once (256: an empty remainder; widened
        # first, since NumPy 2.5 refuses 256 as a uint8 scalar).
        text = dfs.text[np.minimum(starts, dfs.text.size - 1)].astype(np.int64)
        first = np.where(starts < ends, text, 256)
        return VocabWalk(words, cand, cand_rem, remainders, first)
    words = TokenMask.from_ids(trie.ids[rows], trie.size).words
    empty = np.zeros(0, dtype=np.int64)
    if not split_lo.size:
        return VocabWalk(words, empty, empty, (), empty)
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
    return VocabWalk(words, cand, np.asarray(rem_idx, dtype=np.int64), remainders,
                 first_bytes(remainders))
