"""The ``counting`` drafter: a run of numbers continued at its step, a repeated line's
number plus one; drafted only where the constraint allows it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from structspec.automata.regex import compile_regex
from structspec.spec.canonical import CanonicalTokenizer
from structspec.spec.config import DEFAULT_DRAFTERS
from structspec.spec.counting import increment_continuation, run_continuation
from structspec.spec.draft_context import DraftContext
from structspec.spec.drafters import build_tree, make_drafters
from structspec.spec.ngram import NgramIndex
from structspec.spec.tree import TreeBuilder


def test_a_run_goes_on_at_its_step_with_its_separator():
    assert run_continuation(b"[1, 2, 3, ") == b"4, 5, 6, "
    assert run_continuation(b"[1, 2, 3") == b", 4, 5, 6, "  # the separator first
    assert run_continuation(b"[10,20,") == b"30,40,50,"
    assert run_continuation(b"xs = [5, 3, ", count=2) == b"1, -1, "
    assert run_continuation(b"f(7; ") == b"8; 9; 10; "  # one number: counts up by one
    assert run_continuation(b"a 1 2 3 ") == b"4 5 6 "


def test_no_run_no_guess():
    assert run_continuation(b"[1, 2, 4, ") is None  # no constant step
    assert run_continuation(b"f(3, 3, ") is None  # step 0
    assert run_continuation(b"[1, 2; 3, ") is None  # two separators
    assert run_continuation(b"return 1 ") is None  # one number between spaces
    assert run_continuation(b"x = 1 + 2 ") is None
    assert run_continuation(b"[7") is None  # one number, no separator yet
    assert run_continuation(b"no digits here, ") is None
    assert run_continuation(b"") is None


def test_a_repeated_line_counts_up():
    text = b"    >>> largest_divisor(15)\n    5\n    >>> largest_divisor(1"
    assert increment_continuation(text) == b"6)"
    assert increment_continuation(b"1. Foo\n2. Bar\n") == b"3. "  # a numbered list
    assert increment_continuation(b"f(9)\nf(") == b"10)"
    assert increment_continuation(b"f(99)\nf(1") == b"00)"


def test_a_repeated_line_guesses_nothing_where_it_cannot_count():
    assert increment_continuation(b"x = 3\ny = 4\n") is None  # no earlier line begins so
    assert increment_continuation(b"a(-1)\na(-") is None  # negative numbers
    assert increment_continuation(b"f(15)\nf(2") is None  # 16 does not begin with 2
    assert increment_continuation(b"f(15)\nf(16") is None  # written already
    assert increment_continuation(b">>> f(1)\n    5\n    ") is None  # indentation alone
    assert increment_continuation(b"f(1") is None  # no earlier line


@given(start=st.integers(-50, 50), step=st.integers(-9, 9).filter(bool),
       n=st.integers(2, 6), sep=st.sampled_from([", ", ",", "; ", " , "]),
       open_=st.sampled_from(["[", "(", "x = [", ""]), ends_with_sep=st.booleans())
def test_runs_continue_exactly(start, step, n, sep, open_, ends_with_sep):
    numbers = [start + step * i for i in range(n)]
    if any(x < 0 for x in numbers):
        return  # a minus sign inside a run reads as a separator's neighbour; not guessed
    text = open_ + sep.join(map(str, numbers)) + (sep if ends_with_sep else "")
    out = run_continuation(text.encode(), count=3)
    nxt = [numbers[-1] + step * (i + 1) for i in range(3)]
    body = sep.join(map(str, nxt)) + sep
    assert out == ((body if ends_with_sep else sep + body).encode())


@given(text=st.binary(max_size=80))
def test_guesses_are_digits_and_punctuation(text):
    for out in (run_continuation(text), increment_continuation(text)):
        if out is not None:
            assert out and not any(chr(b).isalpha() for b in out)


def test_the_drafter_is_a_default_and_drafts_only_legal_tokens(smollm_tokenizer, smollm_vocab):
    assert "counting" in DEFAULT_DRAFTERS
    tok, vocab = smollm_tokenizer, smollm_vocab
    canon = CanonicalTokenizer(tok, vocab)

    def tree_after(pattern: str, written: str):
        constraint = compile_regex(pattern, vocab)
        out = tok.encode(written, add_special_tokens=False)
        state = constraint.initial
        for t in out:
            state = constraint.advance(state, t)
            assert state is not None
        history = NgramIndex(3)
        history.extend(out)
        ctx = DraftContext(constraint=constraint, vocab=vocab, canon=canon, history=history,
                           prompt_len=0)
        builder = TreeBuilder(constraint, out[-1], state, max_depth=12, max_nodes=16,
                              max_branches=4, eos_ids=vocab.eos_token_ids)
        build_tree(ctx, builder, make_drafters(["counting"]), forced=False)
        return builder.freeze()

    free = tree_after(r"\[[0-9, ]*\]?", "[1, 2, 3, ")
    text = vocab.decode(list(free.tokens[1:])) if len(free) > 1 else b""
    assert "counting" in free.sources and text.startswith(b"4, 5"), text
    # single digits only: the run "9, 10, 11, " is drafted up to its last legal token
    digits = tree_after(r"\[([0-9], )*[0-9]?\]?", "[7, 8, ")
    text = vocab.decode(list(digits.tokens[1:]))
    assert text.startswith(b"9,") and b"10" not in text, text


def test_a_non_ascii_byte_after_a_number_is_not_punctuation():
    """The repeated-line rule drafts ASCII punctuation after the number only: a UTF-8
    letter's bytes ended it (found by a random walk: ``0\\xb5\\n``)."""
    assert increment_continuation(b"x0\xb5\nx") == b"1"
    assert increment_continuation(b"f(1)\xc2\xb5\nf(") == b"2)"
