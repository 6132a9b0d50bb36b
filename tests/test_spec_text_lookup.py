"""The ``text_lookup`` drafter: echoes of the request found as text (case folded, from word
starts), drafted to the end of a word with a closer there; and the request found inside a
chat prompt, whose literals rank first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from structspec.automata.regex import compile_regex
from structspec.spec.canonical import CanonicalTokenizer
from structspec.spec.draft_context import DraftContext
from structspec.spec.drafters import build_tree, make_drafters
from structspec.spec.literals import request_literals, request_text
from structspec.spec.ngram import NgramIndex
from structspec.spec.text_lookup import TextIndex, fold, snake, word_end
from structspec.spec.tree import TreeBuilder
from structspec.vocab import Vocabulary

REQUEST = "Find restaurants within 10 miles that offer Chinese cuisine in Seattle."


def test_an_echo_continues_from_a_word_start_case_folded():
    index = TextIndex(REQUEST.encode())
    # a value written in lower case goes on in lower case
    assert index.continuations(b'{"location":"se', 12) == [b"attle."]
    assert index.continuations(b'"cuisine":"ch', 6) == [b"inese "]
    # written as in the text: copied as is
    assert index.continuations(b'"city":"Chin', 14) == [b"ese cuisine in"]
    # the longest echo wins: "offer Chinese" names one place only
    assert index.continuations(b"that offer", 8) == [b" Chinese"]


def test_no_echo_inside_a_word_or_below_the_minimum():
    index = TextIndex(REQUEST.encode())
    assert index.continuations(b'"x":"attl', 8) == []  # "attl" starts no word of the text
    assert index.continuations(b'"x":"S', 8) == []  # one letter is too short a guess
    assert index.continuations(b'"x":"', 8) == []  # nothing echoed yet
    assert TextIndex(b"").continuations(b"abc", 8) == []


def test_latest_occurrences_first_distinct_and_cut_at_line_breaks():
    index = TextIndex(b"from New Delhi\nto New York, then New York City")
    assert index.continuations(b'"New', 10, per=3) == [b" York City", b" York, the", b" Delhi"]
    assert index.continuations(b'"New', 10, per=1) == [b" York City"]
    # a continuation that is a prefix of a kept one adds nothing
    assert TextIndex(b"New York. New York").continuations(b"New", 6, per=2) == [b" York."]


@given(text=st.binary(max_size=60), tail=st.binary(max_size=60),
       length=st.integers(0, 20), per=st.integers(1, 3))
def test_continuations_are_what_followed_an_echo_in_the_text(text, tail, length, per):
    out = TextIndex(text).continuations(tail, length, per=per)
    assert len(out) <= per
    folded = fold(text)
    for cont in out:
        assert 0 < len(cont) <= length and b"\n" not in cont
        assert any(folded[i:].startswith(fold(cont)) for i in range(len(text)))


def test_an_echo_written_as_one_identifier_goes_on_as_one():
    index = TextIndex(b"Emissions of a gas-powered vehicle in 2020. Melt an ice block.")
    # "gas_" echoes "gas-": the request's next words, joined the same way
    assert index.continuations(b'{"vehicle_type": "gas_', 18) == [b"powered_vehicle_in"]
    assert index.continuations(b'{"kind": "ice', 8) == [b" block."]  # not joined yet
    assert fold(b"Gas-Powered_X") == b"gas powered x"
    assert snake(b" block of ice, 2 kg") == b"_block_of_ice, 2 kg"
    assert snake(b"-powered vehicle.") == b"_powered_vehicle."
    assert snake(b", then") == b", then" and snake(b"") == b""


def test_word_end():
    assert word_end(b"attle in Seattle.") == 5
    assert word_end(b" York, USA") == 5
    assert word_end(b", Massachusetts with") == 15
    assert word_end(b"abc") == 3
    assert word_end(b"") == 0


def _text_lookup_tree(tok, vocab, pattern: str, request: str, output: str):
    """The tree the text_lookup drafter alone grows after ``output``, under ``pattern``."""
    constraint = compile_regex(pattern, vocab)
    prompt = tok.encode(request, add_special_tokens=False)
    out = tok.encode(output, add_special_tokens=False)
    state = constraint.initial
    for t in out:
        state = constraint.advance(state, t)
    history = NgramIndex(3)
    history.extend(prompt + out)
    ctx = DraftContext(constraint=constraint, vocab=vocab, canon=CanonicalTokenizer(tok, vocab),
                       history=history, prompt_len=len(prompt),
                       text_index=TextIndex(vocab.decode(prompt)))
    builder = TreeBuilder(constraint, out[-1], state, max_depth=12, max_nodes=16,
                          max_branches=4, eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters(["text_lookup"]), forced=False)
    return builder.freeze()


def test_the_drafter_ends_the_word_then_closes_the_value(smollm_tokenizer, smollm_vocab):
    tok, vocab = smollm_tokenizer, smollm_vocab
    tree = _text_lookup_tree(tok, vocab, r'\{"city":"[A-Za-z ]+","n":[0-9]\}', REQUEST,
                             '{"city":"Se')
    paths = set()
    for i in range(1, len(tree)):
        if not any(p == i for p in tree.parents):
            path, j = [], i
            while j:
                path.append(tree.tokens[j])
                j = tree.parents[j]
            paths.add(vocab.decode(path[::-1]))
    assert any(p.startswith(b'attle","n":') for p in paths), paths  # word, closer, next key
    assert all(p.startswith(b"attle") for p in paths), paths
    assert "text_lookup" in tree.sources


def test_a_value_s_first_word_may_go_on_joined(smollm_tokenizer, smollm_vocab):
    # BFCL: "ice block" written as "ice_block", "plasma membrane" as "plasma_membrane".
    tok, vocab = smollm_tokenizer, smollm_vocab
    tree = _text_lookup_tree(tok, vocab, r'\{"substance": "[a-z_ ]+"\}',
                             "How much heat melts an ice block of 2 kg?", '{"substance": "ice')
    firsts = {vocab.decode([tree.tokens[i]]) for i in range(1, len(tree)) if tree.parents[i] == 0}
    assert b" block" in firsts and any(f.startswith(b"_") for f in firsts), firsts


@pytest.fixture()
def chat(smollm_tokenizer, smollm_vocab):
    messages = [{"role": "system", "content": 'Answer as JSON: {"city": string} // e.g. Paris'},
                {"role": "user", "content": "Weather in Boston for 3 days?"}]
    text = smollm_tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=False)
    return smollm_vocab, smollm_tokenizer.encode(text, add_special_tokens=False)


def test_the_request_is_the_last_turn_of_a_chat_prompt(chat):
    vocab, ids = chat
    assert request_text(vocab, ids) == "Weather in Boston for 3 days?"
    literals = request_literals(vocab, ids)
    assert literals[:3] == ["3", "Boston", "Weather"]  # the request's own, first
    assert "Paris" in literals[3:]  # the system message's, after


def test_a_prompt_without_chat_markers_is_all_request():
    vocab = Vocabulary.from_tokens([b"a", b" b", b"\n", b"<s>"], eos_token_ids=[3])
    assert request_text(vocab, [0, 1, 2, 0]) == "a b\na"
    assert request_text(vocab, []) == ""
