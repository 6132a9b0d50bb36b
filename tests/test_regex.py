"""``compile_regex`` / ``RegexConstraint`` and ``TokenMask`` on toy vocabularies (no model)."""

from __future__ import annotations

import numpy as np
import pytest

from structspec.automata import RegexConstraint, TokenMask, accepts, compile_regex, walk
from structspec.errors import GrammarError, VocabularyError
from structspec.vocab import Vocabulary

EOS = 0


def ids_of(vocab: Vocabulary, *pieces: str) -> list[int]:
    """The ids of ``pieces``, each an exact token of ``vocab``."""
    return [vocab.ids_for(p.encode())[0] for p in pieces]


def single_bytes(vocab: Vocabulary, text: str) -> list[int]:
    return [vocab.ids_for(bytes([b]))[0] for b in text.encode()]


@pytest.fixture(scope="module")
def small_vocab() -> Vocabulary:
    """EOS, a special token, single letters/digits/punctuation, and a few multi-byte pieces."""
    singles = [chr(c) for c in range(0x20, 0x7F)]
    tokens = ["", "<|special|>", *singles, "ab", "abc", "12", "-x", "hello", " wor"]
    return Vocabulary.from_tokens(tokens, eos_token_ids=[EOS], special_token_ids=[1])


@pytest.mark.parametrize(("pattern", "good", "bad"), [
    (r"[0-9]{3}-[a-z]+", ["123-abc", "000-x"], ["12-abc", "123-", "123-ABC", "1234-a"]),
    (r"(cat|dog)s?", ["cat", "dogs"], ["cats!", "bird", ""]),
    (r"a+b*", ["a", "aab", "abbb"], ["b", "ba"]),
    (r"hello world", ["hello world"], ["hello", "hello world!"]),
    (r"-?[0-9]+", ["-12", "7"], ["-", "1-"]),
])
def test_accepts_and_rejects(small_vocab, pattern, good, bad):
    constraint = compile_regex(pattern, small_vocab)
    for text in good:
        assert accepts(constraint, single_bytes(small_vocab, text)), text
    for text in bad:
        assert not accepts(constraint, single_bytes(small_vocab, text)), text


def test_multi_byte_tokens_are_allowed(small_vocab):
    constraint = compile_regex(r"abc[0-9]+-x", small_vocab)
    assert accepts(constraint, ids_of(small_vocab, "abc", "12", "-x"))
    assert accepts(constraint, ids_of(small_vocab, "ab", "c", "1", "2", "-", "x"))
    assert not accepts(constraint, ids_of(small_vocab, "ab", "12"))


def test_mask_is_exactly_the_legal_tokens(small_vocab):
    constraint = compile_regex(r"a(b|c)[0-9]", small_vocab)
    first = constraint.allowed(constraint.initial)
    assert set(first.ids().tolist()) == set(ids_of(small_vocab, "a", "ab"))
    after_a = constraint.advance(constraint.initial, ids_of(small_vocab, "a")[0])
    assert set(constraint.allowed(after_a).ids().tolist()) == set(ids_of(small_vocab, "b", "c"))
    assert constraint.allowed(constraint.initial) is first  # memoized per state


def test_advance_rejects_illegal_tokens(small_vocab):
    constraint = compile_regex(r"[a-c]+", small_vocab)
    assert constraint.advance(constraint.initial, ids_of(small_vocab, "z")[0]) is None
    assert walk(constraint, ids_of(small_vocab, "a", "z", "b")) is None


def test_eos_only_when_accepting(small_vocab):
    constraint = compile_regex(r"ab?c", small_vocab)
    states = [constraint.initial]
    for token in single_bytes(small_vocab, "abc"):
        states.append(constraint.advance(states[-1], token))
    for state in states:
        accepting = constraint.is_accepting(state)
        assert (EOS in constraint.allowed(state)) == accepting
        assert constraint.advance(state, EOS) == (state if accepting else None)
    assert constraint.is_accepting(states[-1])


def test_all_eos_ids_are_allowed_at_the_end():
    tokens = ["", "a", "b", "</s>"]
    vocab = Vocabulary.from_tokens(tokens, eos_token_ids=[0, 3])
    constraint = compile_regex("a", vocab)
    end = constraint.advance(constraint.initial, 1)
    assert set(constraint.allowed(end).ids().tolist()) == {0, 3}
    assert constraint.advance(end, 3) == end


def test_special_tokens_are_never_allowed(small_vocab):
    constraint = compile_regex(r".*", small_vocab)
    for state in (constraint.initial, walk(constraint, single_bytes(small_vocab, "ab"))):
        assert 1 not in constraint.allowed(state)
        assert constraint.advance(state, 1) is None


def test_forced_text(small_vocab):
    constraint = compile_regex(r"hello (world|wide)!", small_vocab)
    assert constraint.forced(constraint.initial) == b"hello w"
    state = walk(constraint, ids_of(small_vocab, "hello", " wor"))
    assert constraint.forced(state) == b"ld!"
    done = walk(constraint, single_bytes(small_vocab, "hello wide!"))
    assert constraint.forced(done) == b""
    branching = compile_regex(r"[ab]c", small_vocab)
    assert branching.forced(branching.initial) == b""


@pytest.mark.parametrize("pattern", ["(", "[a-", "a{2,1}", "", "(?P<x>a)(?P=x)"])
def test_bad_pattern_is_a_grammar_error(small_vocab, pattern):
    with pytest.raises(GrammarError):
        compile_regex(pattern, small_vocab)


def test_non_string_pattern_is_a_grammar_error(small_vocab):
    with pytest.raises(GrammarError):
        compile_regex(None, small_vocab)  # type: ignore[arg-type]


def test_vocabulary_that_cannot_spell_the_pattern():
    vocab = Vocabulary.from_tokens(["", "a", "b"], eos_token_ids=[0])
    with pytest.raises(VocabularyError):
        compile_regex("ac", vocab)
    assert isinstance(compile_regex("ab", vocab), RegexConstraint)


def test_continuation_after_an_accepting_prefix(small_vocab):
    """outlines-core 0.2.14's Index drops these tokens; our runtime keeps them."""
    constraint = compile_regex(r"a(bc)?", small_vocab)
    assert accepts(constraint, single_bytes(small_vocab, "abc"))


def test_continuation_after_an_accepting_prefix_with_a_whole_token(small_vocab):
    constraint = compile_regex(r"a(bc)?", small_vocab)
    assert accepts(constraint, ids_of(small_vocab, "a")) and accepts(constraint, ids_of(
        small_vocab, "abc"))


# -- TokenMask -----------------------------------------------------------------------------------


def test_token_mask_from_ids_and_queries():
    mask = TokenMask.from_ids([0, 5, 31, 32, 69], size=70)
    assert mask.words.shape == (3,) and mask.words.dtype == np.uint32
    assert [i in mask for i in (0, 5, 31, 32, 69)] == [True] * 5
    assert 1 not in mask and 70 not in mask and -1 not in mask and "x" not in mask
    assert mask.count() == 5
    assert mask.ids().tolist() == [0, 5, 31, 32, 69]
    as_bool = mask.to_bool()
    assert as_bool.shape == (70,) and as_bool.sum() == 5 and not as_bool.flags.writeable
    assert "5 of 70" in repr(mask)


def test_token_mask_set_operations_and_equality():
    a = TokenMask.from_ids([1, 2, 40], size=50)
    b = TokenMask.from_ids([2, 3, 40], size=50)
    assert (a | b).ids().tolist() == [1, 2, 3, 40]
    assert (a & b).ids().tolist() == [2, 40]
    assert a == TokenMask.from_ids([40, 2, 1], size=50) and a != b
    assert hash(a) == hash(TokenMask.from_ids([1, 2, 40], size=50))
    assert TokenMask.empty(50).count() == 0 and TokenMask.from_ids([], 50) == TokenMask.empty(50)


def test_token_mask_rejects_bad_input():
    with pytest.raises(ValueError):
        TokenMask.from_ids([50], size=50)
    with pytest.raises(ValueError):
        TokenMask.from_ids([1], size=50) | TokenMask.from_ids([1], size=60)
    with pytest.raises(ValueError):
        TokenMask(np.zeros(3, dtype=np.int64), 70)
    mask = TokenMask.from_ids([1], size=40)
    with pytest.raises(ValueError):
        mask.words[0] = 7  # read-only: masks are shared between threads
