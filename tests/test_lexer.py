"""The pieces under the Lark constraint: Python-regex rewriting, the combined lexer DFA,
interned LALR stacks."""

from __future__ import annotations

import re

import lark
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec.automata.dfa import compile_dfa, literal_dfa
from structspec.automata.lalr import ParserStacks, ParseTables
from structspec.automata.lexer import ContextualLexer, TerminalSpec
from structspec.automata.pyregex import to_dfa_pattern
from structspec.errors import GrammarError

PATTERNS = [
    (r"[^\W\d]\w*", 0),
    (r"\d+(\.\d*)?", 0),
    (r"\s+", 0),
    (r"(?i:select|from)", 0),
    (r"#[^\n]*", 0),
    (r"(?s:/\*.*?\*/)", 0),
    (r"\"(\\.|[^\"\\])*\"", 0),
    (r"[a-f]+", re.IGNORECASE),
    (r"\w+", re.ASCII),
    (r".+", 0),
    (r".+", re.DOTALL),
]
ALPHABET = "aZ_09 \t\n\r#/*\"\\.éß٣日\u00a0SELECTselectfromFROM"


@pytest.mark.parametrize(("pattern", "flags"), PATTERNS)
@given(text=st.text(alphabet=ALPHABET, max_size=8))
@settings(max_examples=60, deadline=None)
def test_rewritten_regex_matches_like_python(pattern: str, flags: int, text: str) -> None:
    dfa = _compiled(pattern, flags)
    assert dfa.matches(text.encode()) == bool(re.fullmatch(pattern, text, flags))


_DFAS: dict[tuple[str, int], object] = {}


def _compiled(pattern: str, flags: int):
    key = (pattern, flags)
    if key not in _DFAS:
        _DFAS[key] = compile_dfa(to_dfa_pattern(pattern, flags))
    return _DFAS[key]


@pytest.mark.parametrize("pattern", [r"a(?=b)", r"(a)\1", r"\bword", r"(?>a)"])
def test_unsupported_regex_constructs_raise(pattern: str) -> None:
    with pytest.raises(GrammarError):
        to_dfa_pattern(pattern)


def _lexer() -> ContextualLexer:
    name = compile_dfa(to_dfa_pattern(r"[a-z_]\w*"))
    return ContextualLexer([
        TerminalSpec("NAME", name, 0, False, 1 << 30, 10),
        TerminalSpec("RETURN", literal_dfa(b"return"), 0, True, 6, 6),
        TerminalSpec("IF", literal_dfa(b"if"), 0, True, 2, 2),
        TerminalSpec("HI", literal_dfa(b"hi"), 5, True, 2, 2),
    ])


def _run(lx: ContextualLexer, s: int, text: bytes) -> int:
    for b in text:
        s = lx.step(s, b)
    return s


def test_keyword_beats_name_only_on_the_exact_text() -> None:
    lx = _lexer()
    start = lx.start(frozenset({0, 1, 2, 3}))
    assert lx.terminals[lx.winner(_run(lx, start, b"return"))].name == "RETURN"
    assert lx.terminals[lx.winner(_run(lx, start, b"returnx"))].name == "NAME"
    assert lx.terminals[lx.winner(_run(lx, start, b"retur"))].name == "NAME"
    assert lx.terminals[lx.winner(_run(lx, start, b"hi"))].name == "HI"  # priority 5
    # A lexeme may still become any terminal that is alive in its state.
    s = _run(lx, start, b"re")
    assert lx.terms(s) == 0b0011


def test_contextual_start_sets_restrict_terminals() -> None:
    lx = _lexer()
    only_name = lx.start(frozenset({0}))
    assert lx.terminals[lx.winner(_run(lx, only_name, b"return"))].name == "NAME"
    assert lx.start(frozenset({0})) == only_name  # interned
    assert lx.is_start(only_name)


def test_vocabulary_walk_splits_inside_and_crossing(byte_vocab) -> None:
    from structspec.automata.token_walk import token_table

    lx = _lexer()
    tt = token_table(byte_vocab)
    start = lx.start(frozenset({0, 1, 2}))
    walk = lx.walk(start, tt)
    inside = {bytes(byte_vocab.tokens[i]) for i in tt.ids[walk.inside_rows]}
    assert b"name" in inside and b"a" in inside and b"{" not in inside
    crossing = {bytes(byte_vocab.tokens[i]) for i in tt.ids[walk.cross_rows]}
    assert b'":' not in crossing and b"name" not in crossing
    assert np.all(walk.cross_k >= 1)


def _tables(grammar: str) -> tuple[ParseTables, lark.Lark]:
    p = lark.Lark(grammar, parser="lalr")
    table = p.parser.parser.parser.parse_table
    return ParseTables.from_lark(table, "start", [t.name for t in p.terminals]), p


def test_stacks_are_interned_values_and_reduce_exactly() -> None:
    tables, _ = _tables('start: "a" start "b" | "c"')
    st_ = ParserStacks(tables)
    a, b, c = (tables.index[n] for n in ("A", "B", "C"))
    s1 = st_.feed(0, a)
    assert st_.feed(0, a) == s1  # memoized, same id
    s2 = st_.feed(s1, a)
    assert st_.depth(s2) == 3
    s3 = st_.feed(s2, c)
    assert not st_.accepts_end(s3)
    assert st_.feed(s3, b) >= 0 and st_.feed(st_.feed(s3, b), b) >= 0
    assert st_.accepts_end(st_.feed(st_.feed(s3, b), b))
    assert st_.feed(0, b) == -1
