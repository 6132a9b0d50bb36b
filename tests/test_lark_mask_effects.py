"""A newline lexeme's effect per token, as the mask builder computes it for whole rows of the
vocabulary at once (``MaskBuilder._effects``), equals the byte-by-byte definition: the kind
of the bytes ``[lo, hi)`` (a ``\\n``, only a form feed, neither) and the columns of spaces and
tabs after the last ``\\n`` or form feed among them — on the real 49k-token vocabulary, for
python.lark's counted tabs and for refused ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec import GrammarError, ResourceLimitError, compile_grammar
from structspec.automata.lark_constraint import LarkRuntime
from structspec.automata.lark_grammar import TAB_REFUSED

PYTHON_LARK = Path(__file__).resolve().parents[1] / "structspec" / "grammars" / "python.lark"


@pytest.fixture(scope="module")
def runtime(smollm_vocab) -> LarkRuntime:
    if not PYTHON_LARK.exists():
        pytest.skip("structspec/grammars/python.lark is not there")
    try:
        loaded = compile_grammar(PYTHON_LARK, smollm_vocab).grammar
    except (GrammarError, ResourceLimitError) as exc:
        pytest.skip(f"python.lark does not load: {exc}")
    return LarkRuntime(loaded, smollm_vocab)


def _reference(data: bytes, tab_len: int) -> tuple[int, int]:
    kind = 1 if b"\n" in data else 2 if b"\f" in data else 0
    last = max(data.rfind(b"\n"), data.rfind(b"\f"))
    cols = sum(1 if b == 32 else tab_len if b == 9 else 0 for b in data[last + 1:])
    return kind, min(cols, TAB_REFUSED)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 3000),
       refused=st.booleans(), whole=st.booleans())
def test_effects_match_the_bytewise_definition(runtime, seed, size, refused, whole) -> None:
    tt = runtime.masks.tt
    rng = np.random.default_rng(seed)
    # Rows with whitespace, line breaks and form feeds are the ones that differ: half the
    # draw from them, half from the whole vocabulary.
    data = tt.data
    special = np.flatnonzero(((data == 10) | (data == 12) | (data == 9) | (data == 32))
                             .any(axis=1))
    rows = np.concatenate([rng.choice(special, size // 2 + 1),
                           rng.integers(0, data.shape[0], size - size // 2)])
    lengths = tt.lengths[rows]
    if whole:  # the lexing trees' own segments: the whole token
        lo, hi = np.zeros_like(lengths), lengths.copy()
    else:
        lo = (rng.random(rows.size) * (lengths + 1)).astype(lengths.dtype)
        hi = lo + (rng.random(rows.size) * (lengths - lo + 1)).astype(lengths.dtype)
    saved = runtime.tab_len
    runtime.tab_len = TAB_REFUSED if refused else 8
    try:
        kind, cols = runtime.masks._effects(rows, lo, hi)
    finally:
        runtime.tab_len = saved
    for i, r in enumerate(rows.tolist()):
        want = _reference(bytes(data[r, int(lo[i]):int(hi[i])]),
                          TAB_REFUSED if refused else 8)
        assert (int(kind[i]), int(cols[i])) == want, (r, bytes(data[r, :lengths[i]]),
                                                       int(lo[i]), int(hi[i]))


def test_effects_of_no_rows(runtime) -> None:
    empty = np.zeros(0, dtype=np.int64)
    kind, cols = runtime.masks._effects(empty, empty, empty)
    assert kind.size == 0 and cols.size == 0
