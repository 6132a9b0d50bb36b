"""Masks memoized per stack signature equal masks computed per full state.

``MaskBuilder`` keeps each evaluation's result under the top states of the parser stack it
actually read (a trie); a new state whose stack agrees there reuses it. This test drives
real Python programs (HumanEval) through two fresh runtimes of python.lark: one with the
signature tries warmed by other programs, one with trie lookups disabled (every mask,
crossing group and terminal check evaluated for its own full state: the plain memo) —
every mask must be identical, and the tries must actually have answered.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import humaneval_programs
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec import GrammarError, ResourceLimitError, compile_grammar
from structspec.automata.lark_constraint import LarkRuntime

PYTHON_LARK = Path(__file__).resolve().parents[1] / "structspec" / "grammars" / "python.lark"


def _walk(rt: LarkRuntime, ids: list[int]) -> list[bytes]:
    """The packed mask at every step of ``ids`` (which must all be allowed)."""
    masks = []
    s = rt.initial
    for t in ids:
        m = rt.mask(s)
        masks.append(m.words.tobytes())
        assert t in m
        s = rt.step_bytes(s, rt.vocab.tokens[t])
        assert s
    return masks


def test_signature_memo_gives_the_masks_of_the_full_state_memo(
        smollm_vocab, smollm_tokenizer, shared_data):
    try:
        loaded = compile_grammar(PYTHON_LARK, smollm_vocab).grammar
    except (GrammarError, ResourceLimitError) as exc:  # pragma: no cover
        pytest.skip(f"python.lark does not load: {exc}")
    programs = [smollm_tokenizer.encode(p, add_special_tokens=False)
                for p in humaneval_programs(shared_data, 5)]
    warm = LarkRuntime(loaded, smollm_vocab)
    hits = 0
    find = warm.stacks.find_signature

    def counting_find(trie, stack):
        nonlocal hits
        got = find(trie, stack)
        hits += got is not None
        return got

    warm.stacks.find_signature = counting_find  # type: ignore[method-assign]
    for ids in programs[:3]:
        _walk(warm, ids)
    plain = LarkRuntime(loaded, smollm_vocab)
    plain.stacks.find_signature = lambda trie, stack: None  # type: ignore[method-assign]
    hits = 0
    for ids in programs[3:]:
        assert _walk(warm, ids) == _walk(plain, ids)
    assert hits > 5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.integers(-5, 40), st.integers(0, 1 << 27)), min_size=1,
                max_size=200))
def test_groups_of_groups_dense_and_sparse_values(values) -> None:
    """``groups_of`` = indices grouped by value, ascending, also where the values span far
    more than their count (refused-tab indentation counts are 2**24 and up)."""
    from structspec.automata.lark_masks import groups_of

    want: dict[int, list[int]] = {}
    for i, v in enumerate(values):
        want.setdefault(v, []).append(i)
    got = groups_of(np.array(values, dtype=np.int64))
    assert [(k, idx.tolist()) for k, idx in got] == sorted(want.items())


def test_signature_memo_on_javascript_with_asi(smollm_vocab, smollm_tokenizer):
    """The same on javascript.lark, whose reads include ASI's (the stack after ``_ASI``,
    the line-break bit, the division test of the lexical goal): corpus files with and
    without semicolons, regex literals."""
    js = Path(__file__).resolve().parent / "data" / "grammars" / "javascript"
    names = ["asi.js", "regex_literals.js", "event_emitter.js", "class_hierarchy.js",
             "debounce_throttle.js", "express_app.js"]
    loaded = compile_grammar(PYTHON_LARK.parent / "javascript.lark", smollm_vocab).grammar
    programs = [smollm_tokenizer.encode((js / n).read_text(encoding="utf-8"),
                                        add_special_tokens=False)[:400] for n in names]
    warm = LarkRuntime(loaded, smollm_vocab)
    for ids in programs[:3]:
        _walk(warm, ids)
    plain = LarkRuntime(loaded, smollm_vocab)
    plain.stacks.find_signature = lambda trie, stack: None  # type: ignore[method-assign]
    for ids in programs[3:] + programs[:1]:
        assert _walk(warm, ids) == _walk(plain, ids)
