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


# -- excluded-words groups: (?P<_without_SET_N>BODY) is BODY minus the words of SET ---------

_NAME = "[A-Za-z_][A-Za-z0-9_]*"


@pytest.mark.parametrize("build", ["eager", "lazy"])
def test_excluded_words_group_is_body_minus_words(build):
    """Every short string over the keywords' letters, and each keyword with one character
    cut, added or changed: the group matches exactly the names that are not keywords, in
    each place it stands (an operand, after `.`, repeated in a loop), eagerly and lazily."""
    import itertools
    import keyword

    from structspec.automata.dfa import LazyDFA

    pattern = (rf"\[(?P<_without_pykeywords_1>{_NAME})(?:\.(?P<_without_pystatements_2>"
               rf"{_NAME}))*(?:,(?P<_without_pykeywords_3>{_NAME}))*\]")
    dfa = compile_dfa(pattern) if build == "eager" else LazyDFA(pattern)
    values = set(keyword.kwlist) - {"True", "False", "None"}
    ident = re.compile(_NAME)

    def ok(name: str, words: set[str]) -> bool:
        return bool(ident.fullmatch(name)) and name not in words

    def matches(text: str) -> bool:
        if build == "eager":
            return dfa.matches(text.encode())
        s = dfa.step(dfa.start, text.encode())
        return bool(s) and dfa.is_accepting(s)

    letters = sorted(set("".join(keyword.kwlist)) | set("_0Zz"))
    names = {"".join(c) for n in range(4) for c in itertools.product(letters, repeat=n)}
    for w in keyword.kwlist:
        names |= {w, *(w[:i] + w[i + 1:] for i in range(len(w)))}
        names |= {w[:i] + c + w[i:] for i in range(len(w) + 1) for c in "aesz_1"}
        names |= {w[:i] + c + w[i + 1:] for i in range(len(w)) for c in "aesz_1"}
    kw = set(keyword.kwlist)
    for name in sorted(names):
        assert matches(f"[{name}]") == ok(name, kw), name
        assert matches(f"[x.{name}]") == ok(name, values), name
        assert matches(f"[x,y,{name}]") == ok(name, kw), name
        assert matches(f"[{name}.{name},{name}]") == (ok(name, kw) and ok(name, values)), name


def test_excluded_words_group_errors():
    with pytest.raises(GrammarError, match="unknown word set 'nosuch'"):
        compile_dfa(rf"(?P<_without_nosuch_1>{_NAME})")
    with pytest.raises(GrammarError, match="cannot nest"):
        compile_dfa(rf"(?P<_without_pykeywords_1>a(?P<_without_pykeywords_2>{_NAME}))")
    # other named groups are plain groups
    assert compile_dfa(rf"(?P<name>{_NAME})").matches(b"if")


def test_excluded_words_groups_survive_the_python_regex_rewrite():
    """lark terminals go through pyregex first: the group keeps its meaning there."""
    from structspec.automata.pyregex import to_dfa_alternatives, to_dfa_pattern

    rx = rf"(?i:x)(?P<_without_pykeywords_7>{_NAME})|y"
    assert not compile_dfa(to_dfa_pattern(rx)).matches(b"Xif")
    assert compile_dfa(to_dfa_pattern(rx)).matches(b"Xiff")
    first = to_dfa_alternatives(rx)[0]
    assert not compile_dfa(first).matches(b"xelse")
