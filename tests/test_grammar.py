"""The grammar IR and its token-level constraint: masks equal a brute-force byte walk,
tokens cross terminal boundaries exactly when legal, random walks yield valid text."""

from __future__ import annotations

import json
import random

import pytest
from conftest import make_byte_vocab
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec.automata.base import accepts
from structspec.automata.dfa import compile_dfa, literal_dfa
from structspec.automata.grammar import (
    GrammarBuilder,
    GrammarConstraint,
    GrammarLimits,
    alt,
    opt,
    ref,
    rep,
    seq,
    term,
)
from structspec.errors import GrammarError

STRING = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"


def json_grammar():
    """Generic JSON (recursive objects and arrays) in the IR."""
    b = GrammarBuilder()
    s = b.terminal(compile_dfa(STRING), "string")
    n = b.terminal(compile_dfa(NUMBER), "number")

    def lit(x: str):
        return term(b.terminal(literal_dfa(x.encode()), x, key=x.encode()))

    value = b.declare("value")
    member = seq(term(s), lit(":"), ref(value))
    obj = b.rule("object", seq(lit("{"), opt(seq(member, rep(seq(lit(","), member)))), lit("}")))
    arr = b.rule("array", seq(lit("["), opt(seq(ref(value), rep(seq(lit(","), ref(value))))),
                              lit("]")))
    b.define(value, alt(term(s), term(n), ref(obj), ref(arr), lit("true"), lit("null")))
    return b.build(value)


@pytest.fixture(scope="module")
def vocab():
    return make_byte_vocab()


@pytest.fixture(scope="module")
def constraint(vocab):
    return GrammarConstraint(json_grammar(), vocab)


def brute_force(c, vocab, state):
    ids = {t for t in range(len(vocab)) if vocab.tokens[t] and c.step_bytes(state, vocab.tokens[t])}
    if c.is_accepting(state):
        ids |= vocab.eos_token_ids
    return ids


def tokenize(vocab, text: str) -> list[int]:
    """Greedy longest-match tokenization with the toy vocabulary."""
    data, out, i = text.encode(), [], 0
    pieces = sorted({t for t in vocab.tokens if t}, key=len, reverse=True)
    while i < len(data):
        piece = next(p for p in pieces if data.startswith(p, i))
        out.append(vocab.ids_for(piece)[0])
        i += len(piece)
    return out


json_values = st.recursive(
    st.none() | st.booleans().filter(lambda x: x) | st.integers(-999, 999)
    | st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=8,
)


@given(json_values)
@settings(max_examples=150, deadline=None)
def test_completeness_every_json_value_is_accepted(constraint, vocab, value):
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert accepts(constraint, tokenize(vocab, text)), text


@given(st.randoms(use_true_random=False))
@settings(max_examples=40, deadline=None)
def test_masks_equal_brute_force_and_walks_are_sound(constraint, vocab, rnd):
    state, out = constraint.initial, []
    for _ in range(40):
        mask = set(constraint.allowed(state).ids().tolist())
        assert mask == brute_force(constraint, vocab, state)
        if constraint.is_accepting(state) and rnd.random() < 0.3:
            break
        choices = sorted(mask - vocab.eos_token_ids)
        if not choices:
            break
        token = rnd.choice(choices)
        state = constraint.advance(state, token)
        assert state is not None
        out.append(token)
    if constraint.is_accepting(state):
        json.loads(vocab.decode(out))


def test_tokens_cross_boundaries_exactly_when_legal(constraint, vocab):
    state = constraint.advance(constraint.initial, vocab.ids_for(b'{"')[0])
    state = constraint.step_bytes(state, b"a")
    assert vocab.ids_for(b'":')[0] in constraint.allowed(state)
    assert vocab.ids_for(b'"}')[0] not in constraint.allowed(state)  # a key needs a value
    after_value = constraint.step_bytes(state, b'":1')
    assert vocab.ids_for(b"},")[0] not in constraint.allowed(after_value)  # top level ends
    assert vocab.ids_for(b"}")[0] in constraint.allowed(after_value)


def test_eos_only_when_accepting_and_forced_text(constraint, vocab):
    assert 0 not in constraint.allowed(constraint.initial)
    state = constraint.step_bytes(constraint.initial, b"[1")
    assert 0 not in constraint.allowed(state)
    done = constraint.step_bytes(state, b"]")
    assert 0 in constraint.allowed(done) and constraint.advance(done, 0) == done
    t = constraint.step_bytes(constraint.initial, b"t")
    assert constraint.forced(t) == b"rue"
    assert constraint.forced(constraint.initial) == b""


def test_deep_nesting_is_fine_and_bounded(vocab):
    c = GrammarConstraint(json_grammar(), vocab)
    assert c.is_accepting(c.step_bytes(c.initial, b"[" * 50 + b"]" * 50))
    small = GrammarConstraint(json_grammar(), vocab, GrammarLimits(max_depth=8))
    assert small.step_bytes(small.initial, b"[" * 40) == 0  # beyond the cap: not offered
    assert small.is_accepting(small.step_bytes(small.initial, b"[[1]]"))


def test_bad_grammars():
    b = GrammarBuilder()
    with pytest.raises(GrammarError, match="empty string"):
        b.terminal(compile_dfa("a*"), "maybe-empty")
    r = b.declare("undefined")
    with pytest.raises(GrammarError, match="not defined"):
        b.build(r)
    b2 = GrammarBuilder()
    loop = b2.declare("loop")
    b2.define(loop, seq(term(b2.terminal(literal_dfa(b"x"), "x")), ref(loop)))
    with pytest.raises(GrammarError, match="derives no complete output"):
        b2.build(loop)


def test_random_walks_on_recursive_grammar_stay_valid(constraint, vocab):
    rnd = random.Random(7)
    for _ in range(30):
        state, out = constraint.initial, []
        while len(out) < 60:
            if constraint.is_accepting(state) and rnd.random() < 0.2:
                break
            choices = sorted(set(constraint.allowed(state).ids().tolist()) - {0})
            if not choices:
                break
            token = rnd.choice(choices)
            out.append(token)
            state = constraint.advance(state, token)
        if constraint.is_accepting(state):
            json.loads(vocab.decode(out))
