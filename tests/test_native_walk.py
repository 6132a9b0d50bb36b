"""The native trie walk (``structspec/_native/trie_walk.c``) equals its NumPy twin.

``walk`` must yield the same sets as ``_walk_levels`` (tokens inside the terminal; (row,
position) pairs where the terminal may end midway) and ``finish`` the same mask words and
the same (candidate id, remainder) pairs as the Python ``_finish_walk``: on random DFAs
(Hypothesis), on real string and number DFAs over SmolLM2's vocabulary and on the byte
vocabulary. ``STRUCTSPEC_NATIVE=off`` takes the twin.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec import _native
from structspec.automata import token_walk as g
from structspec.automata.dfa import compile_dfa
from structspec.automata.json_grammar import json_string_dfa

trie_walk = _native.load("trie_walk")
needs_native = pytest.mark.skipif(trie_walk is None, reason="native kernels not built")


def _pairs(lo: np.ndarray, hi: np.ndarray, pos: np.ndarray) -> list[tuple[int, int]]:
    """Split ranges as sorted (row, position) pairs (both walks may group them apart)."""
    return sorted((r, int(p)) for a, b, p in zip(lo.tolist(), hi.tolist(), pos.tolist(),
                                                strict=True) for r in range(a, b))


def _starts(trie, table: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray]:
    st0 = np.asarray(table[q])[trie.byte[0]]
    cur = np.flatnonzero(st0)
    return cur, st0[cur]


def _walk_native(vocab, table, accepting, cur, st0):
    dfs = g.dfs_trie(vocab)
    return trie_walk.walk(dfs.nodes, dfs.below, dfs.lengths, table, accepting,
                          dfs.first[cur], st0.astype(np.int32), dfs.depth)


def _crossing_pairs(walk: g.VocabWalk) -> list[tuple[int, bytes]]:
    return sorted(zip(walk.cand_ids.tolist(), [walk.remainders[i] for i in walk.cand_rem],
                      strict=True))


def _check_walks(vocab, table: np.ndarray, accepting: np.ndarray, q: int,
                 monkeypatch, subtrees: dict | None = None) -> None:
    """Native and NumPy walks from ``q`` agree, and so do the finished walks (the native
    one through the per-first-byte memo ``subtrees`` when given)."""
    trie = g.token_trie(vocab)
    cur, st0 = _starts(trie, table, q)
    a = g._walk_levels(trie, vocab, table, accepting, cur, st0)
    b = _walk_native(vocab, table, accepting, cur, st0)
    assert np.array_equal(np.sort(a[0]), b[0])  # native rows come out ascending
    assert _pairs(*a[1:]) == _pairs(*b[1:])
    native = g.walk_vocabulary(trie, vocab, table, accepting, q, subtrees)
    monkeypatch.setenv("STRUCTSPEC_NATIVE", "off")
    twin = g.walk_vocabulary(trie, vocab, table, accepting, q)
    monkeypatch.delenv("STRUCTSPEC_NATIVE")
    assert np.array_equal(native.words, twin.words)
    assert _crossing_pairs(native) == _crossing_pairs(twin)
    assert len(set(native.remainders)) == len(native.remainders)


REGEXES = [
    r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"',  # a JSON string
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",  # a JSON number
    r"[a-z]+",  # accepting almost everywhere: many splits
    r"(true|false|null)",
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
]


@needs_native
@pytest.mark.parametrize("pattern", REGEXES)
def test_native_equals_numpy_on_real_dfas(smollm_vocab, byte_vocab, pattern, monkeypatch):
    dfa = compile_dfa(pattern)
    for vocab in (smollm_vocab, byte_vocab):
        subtrees: dict = {}  # shared across the states, as in GrammarConstraint._walk
        for q in range(1, dfa.n_states):
            _check_walks(vocab, dfa.table, dfa.accepting, q, monkeypatch)
            _check_walks(vocab, dfa.table, dfa.accepting, q, monkeypatch, subtrees)


@needs_native
@pytest.mark.parametrize(("lo", "hi"), [(2, 5), (0, None), (3, 90)])
def test_native_equals_numpy_on_counted_strings(smollm_vocab, lo, hi, monkeypatch):
    """Counted strings: the native walk takes chains of count states (bounded: the tokens
    longer than the characters left die; near the bound a chain may end dead)."""
    dfa = json_string_dfa(lo, hi)
    rng = np.random.default_rng(0)
    states = range(1, dfa.n_states) if dfa.n_states < 64 else \
        sorted({1, 2, 3, dfa.n_states - 1, *rng.integers(1, dfa.n_states, 40).tolist()})
    for q in states:
        _check_walks(smollm_vocab, dfa.table, dfa.accepting, q, monkeypatch)


@st.composite
def random_dfas(draw) -> tuple[np.ndarray, np.ndarray, int]:
    """A DFA over a few byte classes (so tokens survive several bytes), dense or sparse,
    with self-loops often (the native shortcut takes subtrees whose bytes loop)."""
    n = draw(st.integers(2, 7))
    n_classes = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    byte_class = rng.integers(0, n_classes, 256)  # [256]
    dead = draw(st.floats(0.0, 0.8))
    loop = draw(st.floats(0.0, 0.9))
    per_class = rng.integers(1, n, (n, n_classes))  # [S, C]
    per_class[rng.random((n, n_classes)) < dead] = 0
    looping = rng.random((n, n_classes)) < loop
    per_class = np.where(looping, np.arange(n)[:, None], per_class)
    table = per_class[:, byte_class].astype(np.int32)  # [S, 256]
    table[0] = 0
    accepting = rng.random(n) < draw(st.floats(0.0, 1.0))
    accepting[0] = False
    return np.ascontiguousarray(table), accepting, draw(st.integers(1, n - 1))


@needs_native
@settings(max_examples=150, deadline=None)
@given(random_dfas())
def test_native_equals_numpy_on_random_dfas_byte_vocab(byte_vocab, dfa):
    table, accepting, q = dfa
    with pytest.MonkeyPatch.context() as mp:
        _check_walks(byte_vocab, table, accepting, q, mp)


@needs_native
@settings(max_examples=25, deadline=None)
@given(random_dfas())
def test_native_equals_numpy_on_random_dfas_smollm(smollm_vocab, dfa):
    table, accepting, q = dfa
    with pytest.MonkeyPatch.context() as mp:
        _check_walks(smollm_vocab, table, accepting, q, mp)


def test_switch_off_takes_the_twin(byte_vocab, monkeypatch):
    dfa = compile_dfa(REGEXES[0])
    monkeypatch.setenv("STRUCTSPEC_NATIVE", "off")
    assert g.native_walker(dfa.table, dfa.accepting) is None
    calls: list[int] = []
    real = g._walk_levels

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(g, "_walk_levels", spy)
    g.walk_vocabulary(g.token_trie(byte_vocab), byte_vocab, dfa.table, dfa.accepting, 1)
    assert calls


@needs_native
def test_native_takes_plain_tables_only(byte_vocab):
    dfa = compile_dfa(REGEXES[1])
    assert g.native_walker(dfa.table, dfa.accepting) is trie_walk
    assert g.native_walker(dfa.table.astype(np.int64), dfa.accepting) is None
    assert g.native_walker(np.asfortranarray(dfa.table), dfa.accepting) is None


@needs_native
def test_native_rejects_bad_inputs(byte_vocab):
    trie, dfs = g.token_trie(byte_vocab), g.dfs_trie(byte_vocab)
    dfa = compile_dfa(REGEXES[1])
    cur, st0 = _starts(trie, dfa.table, 1)
    args = [dfs.nodes, dfs.below, dfs.lengths, dfa.table, dfa.accepting,
            dfs.first[cur], st0.astype(np.int32), dfs.depth]
    with pytest.raises(TypeError):
        trie_walk.walk(*args[:3], dfa.table.astype(np.int64), *args[4:])
    with pytest.raises(TypeError):
        trie_walk.walk(args[0].astype(np.int64), *args[1:])
    with pytest.raises(ValueError):
        trie_walk.walk(*args[:5], args[5] + 1, *args[6:])  # not first-byte nodes
    bad = dfa.table.copy()
    bad[bad > 0] = dfa.n_states + 3  # a state out of range
    with pytest.raises(ValueError):
        trie_walk.walk(*args[:3], bad, *args[4:])
    broken = dfs.nodes.copy()
    broken[:, 2] = 0  # subtree ends before the node
    with pytest.raises(ValueError):
        trie_walk.walk(broken, *args[1:])
    with pytest.raises(ValueError):
        trie_walk.finish(trie.ids, 3, np.arange(5, dtype=np.int32), *[np.zeros(0, np.int32)] * 3,
                         dfs.text, dfs.offsets)  # ids beyond the size


bitset = _native.load("bitset")


@pytest.mark.skipif(bitset is None, reason="native kernels not built")
@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.integers(0, max(n - 1, 0)), max_size=60)
                        if n else st.just([]))))
def test_native_packing_equals_numpy(case):
    from structspec.automata.base import TokenMask

    size, ids = case
    native = TokenMask.from_ids(np.asarray(ids, dtype=np.int64), size)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRUCTSPEC_NATIVE", "off")
        twin = TokenMask.from_ids(np.asarray(ids, dtype=np.int64), size)
    assert np.array_equal(native.words, twin.words)
    assert native.ids().tolist() == sorted(set(ids))


@pytest.mark.skipif(bitset is None, reason="native kernels not built")
def test_native_packing_rejects_bad_ids():
    with pytest.raises(ValueError):
        bitset.pack_ids(np.array([5], dtype=np.int64), 5)
    with pytest.raises(ValueError):
        bitset.pack_ids(np.array([-1], dtype=np.int64), 5)
    with pytest.raises(TypeError):
        bitset.pack_ids(np.array([1], dtype=np.int32), 5)
