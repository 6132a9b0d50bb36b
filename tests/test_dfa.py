"""The byte-DFA engine: agreement with Python's ``re`` on whole-text matches, UTF-8, limits,
products, minimization and the counted JSON string automaton."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec.automata.dfa import (
    DFALimits,
    compile_dfa,
    literal_dfa,
    minimized,
    product,
    utf8_sequences,
)
from structspec.automata.json_grammar import JSON_CHAR, json_string_dfa
from structspec.errors import GrammarError, ResourceLimitError

PATTERNS = [
    r"[a-c]+", r"(ab|a)*c?", r"x{2,4}", r"[^a-z]{1,3}", r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?",
    r"é+|ü", r"[α-ω]{2}", r"a.b", r"\d+-\w*", r"(a|bc|def){0,3}", r"[\u00e0-\u00ff]+z",
]
ALPHABET = "abcdefxz019-.éüαωà \n"


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=120, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=8))
def test_whole_text_match_agrees_with_re(pattern, text):
    dfa = compile_dfa(pattern)
    # \d and \w are ASCII here (ECMA-262); the chosen alphabet keeps the two readings equal
    expected = re.fullmatch(pattern, text, flags=re.ASCII if "\\" in pattern else 0) is not None
    assert dfa.matches(text.encode()) == expected


@given(lo=st.integers(0, 0x10FFFF), size=st.integers(0, 5000))
@settings(max_examples=200, deadline=None)
def test_utf8_sequences_cover_exactly_the_range(lo, size):
    hi = min(lo + size, 0x10FFFF)
    seqs = utf8_sequences(lo, hi)
    for cp in {lo, hi, (lo + hi) // 2}:
        if 0xD800 <= cp <= 0xDFFF:
            continue
        enc = chr(cp).encode()
        assert any(len(s) == len(enc) and all(a <= b <= c for (a, c), b in zip(s, enc))
                   for s in seqs)


def test_every_live_state_can_still_accept():
    dfa = compile_dfa(r"ab(c|d)e|abx")
    for s in range(1, dfa.n_states):
        seen, todo, ok = {s}, [s], False
        while todo:
            q = todo.pop()
            if dfa.accepting[q]:
                ok = True
                break
            for t in set(dfa.table[q].tolist()) - {0}:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        assert ok


def test_products():
    a, b = compile_dfa(r"[a-z]+"), compile_dfa(r"a.c")
    both = product(a, b, "and")
    assert both.matches(b"abc") and not both.matches(b"a1c") and not both.matches(b"ab")
    minus = product(a, literal_dfa(b"abc"), "minus")
    assert minus.matches(b"abd") and not minus.matches(b"abc")
    assert product(a, compile_dfa("[0-9]"), "and").is_empty()


def test_literals_and_minimization():
    assert compile_dfa("hello").literal() == b"hello"
    assert compile_dfa("a|b").literal() is None
    big = compile_dfa(r"(a|a)(b|b)(c|c)")
    assert minimized(big).n_states <= big.n_states and minimized(big).matches(b"abc")


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)a", r"a\bb", r"(?i)a", r"a^b"])
def test_unsupported_constructs_are_grammar_errors(pattern):
    with pytest.raises(GrammarError):
        compile_dfa(pattern)


def test_invalid_regex_is_a_grammar_error():
    with pytest.raises(GrammarError, match="invalid regular expression"):
        compile_dfa("(")


def test_state_budget_is_enforced():
    with pytest.raises(ResourceLimitError):
        compile_dfa(r"[a-z]{0,500}[0-9]", DFALimits(max_states=100))


@given(st.text(max_size=12), st.integers(0, 6), st.integers(0, 10))
@settings(max_examples=300, deadline=None)
def test_counted_json_strings_match_json_semantics(text, lo, extra):
    hi = lo + extra
    dfa = json_string_dfa(lo, hi)
    for encoded in (json.dumps(text), json.dumps(text, ensure_ascii=False)):
        surrogate_escape = re.search(r"\\u[dD][89a-fA-F]", encoded) is not None
        expected = lo <= len(json.loads(encoded)) <= hi and not surrogate_escape
        assert dfa.matches(encoded.encode()) == expected, encoded


def test_counted_strings_unbounded_and_the_character_class():
    assert json_string_dfa(2, None).matches(b'"' + b"x" * 300 + b'"')
    assert not json_string_dfa(2, None).matches(b'"x"')
    assert compile_dfa(JSON_CHAR).matches('é'.encode())
    assert not compile_dfa(JSON_CHAR).matches(b'"')


def test_long_counted_strings_compute_transitions_on_demand():
    lazy, table = json_string_dfa(2, 40_000), json_string_dfa(2, 300)
    assert type(lazy.table).__name__ == "_CountedTable"
    assert lazy.matches(b'"' + b"y" * 40_000 + b'"')
    assert not lazy.matches(b'"' + b"y" * 40_001 + b'"')
    for text in (b'"a"', b'"ab"', '"é\\u00e9"'.encode(), b'"\\ud800"'):
        assert lazy.matches(text) == table.matches(text)


def test_literals_dfa_is_exactly_the_words():
    from structspec.automata.dfa import literals_dfa

    words = [b"", b"a", b"ab", b"abc", b"b\xff", b"zz"]
    dfa = literals_dfa(words)
    for w in [*words, b"abcd", b"ba", b"z", b"zzz", b"c"]:
        assert dfa.matches(w) == (w in words), w
    assert literals_dfa([]).is_empty()
