"""The native lexer walk (``structspec/_native/lark_walk.c``) equals its NumPy twin.

``ContextualLexer.walk_rows`` walks token rows through the lazily built lexer DFA; the
kernel stops at rows it has not built yet and the caller builds them. Both paths must give
the same ``(status, pos, state)`` arrays, and masks along real programs must be identical
with the kernel and without it (``STRUCTSPEC_NATIVE=off``).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import humaneval_programs

from structspec import _native
from structspec.automata.lark_constraint import LarkRuntime
from structspec.automata.lark_grammar import load_grammar
from structspec.automata.token_walk import token_table
from structspec.grammars import grammar_path

needs_kernel = pytest.mark.skipif(_native.load("lark_walk") is None,
                                  reason="the lark_walk kernel is not built")


@pytest.fixture(scope="module")
def python_grammar():
    return load_grammar(grammar_path("python"))


@needs_kernel
@pytest.mark.parametrize("text", [b"", b"x = f", b"def g(a, b", b"s = 'ab", b"# c",
                                  b"if x:\n    y = 1\n"])
def test_walk_rows_native_equals_numpy(python_grammar, smollm_vocab, text: bytes) -> None:
    rt = LarkRuntime(python_grammar, smollm_vocab)
    tt = token_table(smollm_vocab)
    state = rt.step_bytes(rt.initial, text)
    assert state
    lx = rt.key(state)[0]
    rng = np.random.default_rng(len(text))
    rows = rng.permutation(tt.ids.size)[:20_000].astype(np.int64)
    offs = np.minimum(rng.integers(0, 3, rows.size), tt.lengths[rows])
    starts = np.full(rows.size, lx, dtype=np.int32)
    got = rt.lex.walk_rows(tt, rows, offs, starts)
    want = rt.lex._walk_rows_numpy(tt, rows, offs, starts)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and (a == b).all()
    assert set(np.unique(got[0]).tolist()) <= {1, 2, 3}
    dead = np.zeros(rows.size, dtype=np.int32)  # the dead state: every row dies at once
    for a, b in zip(rt.lex.walk_rows(tt, rows, offs, dead),
                    rt.lex._walk_rows_numpy(tt, rows, offs, dead)):
        assert (a == b).all()


@needs_kernel
def test_native_masks_equal_numpy_masks(python_grammar, smollm_vocab, smollm_tokenizer,
                                        shared_data, monkeypatch) -> None:
    programs = [smollm_tokenizer.encode(p, add_special_tokens=False)
                for p in humaneval_programs(shared_data, 3)]

    def masks() -> list[bytes]:
        rt = LarkRuntime(python_grammar, smollm_vocab)
        out = []
        for ids in programs:
            s = rt.initial
            for t in ids:
                m = rt.mask(s)
                assert t in m
                out.append(m.words.tobytes())
                s = rt.step_bytes(s, smollm_vocab.tokens[t])
        return out

    native = masks()
    monkeypatch.setenv("STRUCTSPEC_NATIVE", "off")
    assert native == masks()


@needs_kernel
def test_kernel_validates_its_inputs() -> None:
    walk = _native.load("lark_walk").walk
    table = np.zeros((2, 256), dtype=np.int32)
    table[1, ord("a")] = 1
    expanded = np.ones(2, dtype=bool)
    winner = np.array([-1, 0], dtype=np.int32)
    data = np.frombuffer(b"aab\x00", dtype=np.uint8).reshape(2, 2).copy()
    lengths = np.array([2, 1], dtype=np.int64)

    def run(rows, offs=None, states=None):
        rows = np.asarray(rows, dtype=np.int64)
        offs = np.zeros(rows.size, dtype=np.int64) if offs is None else offs
        pos = offs.copy()
        st = np.ones(rows.size, dtype=np.int32) if states is None else states
        status = np.zeros(rows.size, dtype=np.int8)
        pending = walk(table, expanded, winner, data, lengths, rows, offs, pos, st, status)
        return pending, status, pos, st

    pending, status, pos, st = run([0, 1])
    assert pending == 0
    assert status.tolist() == [1, 3] and pos.tolist() == [2, 0] and st.tolist() == [1, 1]
    # the dead state (a start state with no terminal): every row dies at once
    pending, status, pos, st = run([0, 1], states=np.zeros(2, dtype=np.int32))
    assert status.tolist() == [3, 3] and pos.tolist() == [0, 0]
    with pytest.raises(ValueError, match="token row"):
        run([2])
    with pytest.raises(ValueError, match="state"):
        run([0], states=np.array([5], dtype=np.int32))
    with pytest.raises(ValueError, match="state"):
        run([0], states=np.array([-1], dtype=np.int32))
    with pytest.raises(TypeError):
        walk(table.astype(np.int64), expanded, winner, data, lengths,
             *(np.zeros(1, dtype=np.int64),) * 3, np.ones(1, np.int32), np.zeros(1, np.int8))
    expanded[1] = False  # not built yet: the row waits for the caller
    pending, status, pos, st = run([0])
    assert pending == 1 and status.tolist() == [0] and pos.tolist() == [0]


@pytest.mark.parametrize("name", ["python", "sql"])
def test_walk_by_first_byte_equals_one_walk(name, smollm_vocab) -> None:
    """``ContextualLexer.walk`` walks each first byte's tokens from the state that byte
    leads to (shared between lexer states); the result must equal one walk of every token
    from the state itself, for the states that lexing real text passes through."""
    from structspec.automata.lexer import CROSS, INSIDE

    rt = LarkRuntime(load_grammar(grammar_path(name)), smollm_vocab)
    text = {"python": b"def f(a, b=1):\n    return [x ** 2 for x in a if x] # c\n",
            "sql": b"SELECT a.x, COUNT(*) AS n FROM t a WHERE a.y >= 'q' GROUP BY 1;"}[name]
    lex, tt = rt.lex, rt.tt
    seen: set[int] = set()
    s = rt.initial
    for i in range(len(text)):
        s = rt.step_byte(s, text[i])
        assert s
        seen.add(rt.key(s)[0])
    for lx in sorted(seen):
        got = lex.walk(lx, tt)
        row = lex.expand(np.array([lx]))[lx]
        live = np.flatnonzero(row)
        rows = np.concatenate([tt.first_rows[b] for b in live]).astype(np.int64) \
            if live.size else np.zeros(0, dtype=np.int64)
        status, pos, ends = lex.walk_rows(tt, rows, np.zeros(rows.size, dtype=np.int64),
                                          np.full(rows.size, lx, dtype=np.int32))
        inside, cross = status == INSIDE, status == CROSS
        want = (rows[inside], ends[inside], rows[cross], pos[cross], ends[cross])
        have = (got.inside_rows, got.inside_states, got.cross_rows, got.cross_k,
                got.cross_states)
        for a, b in zip(have, want):
            assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
