"""compile_grammar: Lark grammars as token-level constraints (issue 5).

Toy byte vocabularies with multi-byte tokens that cross lexeme boundaries; golden
accept/reject tables; INDENT/DEDENT; bad grammars; prefixes and fill-in-the-middle; the two
Hypothesis properties (completeness against lark's own parser, soundness of random walks).
"""

from __future__ import annotations

import random

import pytest
from conftest import make_byte_vocab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec import GrammarError, compile_grammar
from structspec.automata.base import Constraint

EXPR = r"""
start: expr
?expr: expr "+" term | expr "-" term | term
?term: NAME | NUMBER | "(" expr ")" | "return" | NAME "(" [expr ("," expr)*] ")" -> call
%import common.CNAME -> NAME
%import common.NUMBER
%import common.WS
%ignore WS
"""

INDENTED = r"""
start: (_NEWLINE | stmt)*
?stmt: simple_stmt | compound_stmt
simple_stmt: small_stmt _NEWLINE
?small_stmt: NAME "=" expr -> assign | "pass" -> pass_stmt | "return" expr? -> return_stmt
           | expr
compound_stmt: "if" expr ":" suite | "def" NAME "(" [NAME ("," NAME)*] ")" ":" suite
suite: simple_stmt | _NEWLINE _INDENT stmt+ _DEDENT
?expr: expr "+" atom | atom
?atom: NAME | NUMBER | "(" expr ")" | NAME "(" [expr ("," expr)*] ")" -> call
NAME: /[^\W\d]\w*/
NUMBER: /\d+/
COMMENT: /#[^\n]*/
_NEWLINE: ( /\r?\n[\t ]*/ | COMMENT )+
%ignore /[\t \f]+/
%ignore COMMENT
%declare _INDENT _DEDENT
"""

PIECES = ["a+", "(b", ")+", "12", " (", "))", "ret", "urn", "    ", "\n    ", "):\n", "()\n",
          "pass\n", ", ", "f(", "x =", " = ", "def", "if x:", "\n\n"]


@pytest.fixture(scope="module")
def vocab():
    return make_byte_vocab(PIECES)


@pytest.fixture(scope="module")
def expr(vocab):
    return compile_grammar(EXPR, vocab)


@pytest.fixture(scope="module")
def indented(vocab):
    return compile_grammar(INDENTED, vocab)


def run_bytes(c, text: str, state=None) -> str:
    s = c.initial if state is None else state
    for b in text.encode():
        s = c.advance(s, b + 1)  # id 0 is EOS, id b+1 the byte b
        if s is None:
            return "reject"
    return "accept" if c.is_accepting(s) else "prefix"


@pytest.mark.parametrize(("text", "want"), [
    ("a", "accept"), ("a+b", "accept"), ("a +  (b-1)", "accept"), ("(a", "prefix"),
    ("a+", "prefix"), ("a b", "reject"), ("a++", "reject"), (")", "reject"),
    ("1.5e3+x", "accept"), ("f(a, b+1)", "accept"), ("f(a,)", "reject"), ("", "prefix"),
    ("return", "accept"), ("returnx", "accept"), ("return+1", "accept"), ("return(", "reject"),
])
def test_expression_grammar_golden(expr, text: str, want: str) -> None:
    assert run_bytes(expr, text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("x = 1\n", "accept"), ("x = 1", "accept"),
    ("def f(a, b):\n    return a + b\n", "accept"),
    ("def f(a, b):\n    return a + b", "accept"),
    ("if x:\n    if y:\n        pass\n    z = 1\nq = 2\n", "accept"),
    ("if x:\n    pass\n  z = 1\n", "reject"),  # dedent to a level not on the stack
    ("if x:\npass\n", "reject"),  # missing indent
    ("x = 1\n    y = 2\n", "reject"),  # unexpected indent
    ("if x:\n    pass\n\n\n# c\n    y = 1\n", "accept"),  # blank and comment lines
    ("f(a,\n  b)\n", "accept"),  # newlines inside brackets are ignored
    ("x = (1 +\n2)\n", "accept"),
    ("returnx = 1\n", "accept"), ("return = 1\n", "reject"),
    ("if x: pass\n", "accept"), ("if x:\n    pass # hi\n", "accept"),
    ("if x:\n\tpass\n", "reject"),  # tab indentation: the Python preset refuses it
    ("f(a,\n\tb)\n", "accept"), ("if x:\n", "prefix"), ("def f(", "prefix"),
    ("x = 1  # c", "accept"), ("if x:\n    y = 1  # c", "accept"), ("# only\n", "accept"),
    ("if x:\n    y = 1\n    # c\n", "accept"), ("if x:\n    y = f(1,\n# c\n 2)\n", "accept"),
])
def test_indentation_golden(indented, text: str, want: str) -> None:
    assert run_bytes(indented, text) == want


def test_indentation_tabs_count_as_lark_counts(vocab) -> None:
    """``IndenterSpec(tabs="count")`` (lark's rule; a lark ``Indenter`` class maps to it)
    takes tab indentation, a tab being ``tab_len`` columns; the Python preset refuses it,
    since one column count cannot decide Python's TabError."""
    from structspec.automata import IndenterSpec

    lark_rule = compile_grammar(INDENTED, vocab, postlex=IndenterSpec(tabs="count"))
    assert run_bytes(lark_rule, "if x:\n\tpass\n") == "accept"
    assert run_bytes(lark_rule, "if x:\n        a = 1\n\tb = 2\n") == "accept"  # 8 == 8
    with pytest.raises(ValueError, match="tabs"):
        IndenterSpec(tabs="eight")


def _mask_matches_advance(c, s) -> None:
    mask = c.allowed(s)
    for t in range(c.vocab_size):
        assert (c.advance(s, t) is not None) == (t in mask), (s, c._rt.vocab.tokens[t])


@pytest.mark.parametrize("which", ["expr", "indented"])
def test_mask_is_exactly_the_tokens_advance_takes(request, which: str) -> None:
    c = request.getfixturevalue(which)
    rnd = random.Random(7)
    for _ in range(6):
        s = c.initial
        for _ in range(25):
            _mask_matches_advance(c, s)
            ids = [i for i in c.allowed(s).ids().tolist() if i != 0]
            if not ids:
                break
            s = c.advance(s, rnd.choice(ids))


def test_protocol_eos_and_specials(expr, vocab) -> None:
    assert isinstance(expr, Constraint)
    s = expr.state_after("a+b")
    assert expr.is_accepting(s) and 0 in expr.allowed(s) and expr.advance(s, 0) == s
    s2 = expr.state_after("a+")
    assert not expr.is_accepting(s2) and 0 not in expr.allowed(s2)
    assert expr.advance(s2, 0) is None
    assert expr.vocab_size == len(vocab)


def test_tokens_crossing_lexeme_boundaries(expr, vocab) -> None:
    s = expr.state_after("a")
    allowed = {vocab.tokens[i] for i in expr.allowed(s).ids().tolist()}
    assert b"a+" in allowed  # "aa" then "+"
    assert b")+" not in allowed  # no open bracket
    s = expr.state_after("f(a")
    allowed = {vocab.tokens[i] for i in expr.allowed(s).ids().tolist()}
    assert {b")+", b"))", b", "} <= allowed | {b"))"}
    assert b")+" in allowed and b"))" not in allowed


def test_forced_text() -> None:
    c = compile_grammar('start: "(" "x" ")" "!"', make_byte_vocab([]))
    assert c.forced(c.initial) == b"(x)!"
    s = c.state_after("(x")
    assert c.forced(s) == b")!"
    e = compile_grammar(EXPR, make_byte_vocab([]))
    assert e.forced(e.state_after("f(")) == b""


@given(seed=st.integers(0, 10_000), steps=st.integers(0, 12))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
def test_forced_text_is_the_run_of_single_legal_bytes(indented, seed: int, steps: int) -> None:
    # ``forced`` stops looking at the second legal byte; the oracle tries all 256 each time.
    rnd = random.Random(seed)
    s = indented.initial
    for _ in range(steps):
        ids = [i for i in indented.allowed(s).ids().tolist() if i != 0]
        if not ids:
            break
        s = indented.advance(s, rnd.choice(ids))
    expected, t = bytearray(), s
    while not indented.is_accepting(t) and len(expected) < 256:
        live = [b for b in range(256) if indented.advance(t, b + 1) is not None]  # byte b: id b+1
        if len(live) != 1:
            break
        expected.append(live[0])
        t = indented.advance(t, live[0] + 1)
    assert indented.forced(s) == bytes(expected)


def test_state_after_errors_and_tolerant(indented) -> None:
    with pytest.raises(GrammarError) as info:
        indented.state_after("x = 1\nif x:\n    y = )\n")
    assert info.value.line == 3 and info.value.column == 9
    s = indented.state_after("x = 1\nif x:\n    y = )\n", tolerant=True)
    assert indented.is_tolerant(s)
    assert run_bytes(indented, "foo bar(", s) in ("accept", "prefix")
    assert run_bytes(indented, "x\x00", s) == "reject"  # still lexically sane


def test_fill_in_the_middle(indented) -> None:
    fim = indented.with_suffix("    return y\n", prefix="def f(x):\n    y = (")
    s = fim.initial
    assert not fim.is_accepting(s)  # the bracket is still open
    assert fim.is_accepting(fim.state_after("x + 1)\n", state=s))
    assert not fim.is_accepting(fim.state_after("x + 1", state=s))
    assert not fim.is_accepting(fim.state_after("x)\n  ", state=s))  # wrong indentation
    line = indented.with_suffix("\nz = 1\n", stop="line", prefix="x = ")
    assert line.is_accepting(line.state_after("2", state=line.initial))
    eol = indented.with_suffix("z = 1\n", stop="line", prefix="x = ")
    assert not eol.is_accepting(eol.state_after("2", state=eol.initial))
    assert eol.is_accepting(eol.state_after("2\n", state=eol.initial))


@pytest.mark.parametrize(("grammar", "line", "fragment"), [
    ('start: "a" b\nb: "b" |\nc: )', 3, "invalid grammar"),
    ('start: ("a"', 1, "syntax"),
    ("start: a b\na: \"a\"\n", 1, "not defined"),
    ('start: a | b\na: "x"\nb: "x"\n', 2, "LALR"),
    ("start: X\nX: /a*/\n", None, "zero-width"),
    ("start: X\nX: /a(?=b)/\n", None, "X"),
    ('start: "a" UNDEFINED\n', None, "UNDEFINED"),
])
def test_bad_grammars_raise_grammar_error(grammar: str, line, fragment: str, vocab) -> None:
    with pytest.raises(GrammarError) as info:
        compile_grammar(grammar, vocab)
    msg = str(info.value)
    assert fragment.lower() in msg.lower()
    if line is not None:
        assert info.value.line == line


def test_undefined_rule_has_a_line(vocab) -> None:
    with pytest.raises(GrammarError) as info:
        compile_grammar('start: "a"\n  | missing_rule\n', vocab)
    assert info.value.line == 2


def test_keywords_reserved_or_contextual(vocab) -> None:
    grammar = r"""
start: NAME "=" NAME | "if" NAME | NAME "in" NAME
NAME: /[a-z]+/
%ignore " "
"""
    reserved = compile_grammar(grammar, vocab)
    contextual = compile_grammar(grammar, vocab, keywords="contextual")
    assert run_bytes(reserved, "x = if ") == "reject"  # "if" is a keyword everywhere
    assert run_bytes(contextual, "x = if") == "accept"  # lark: a NAME where IF is unexpected
    assert run_bytes(reserved, "x = ifx") == "accept"
    assert run_bytes(reserved, "a indexes") == "reject"  # one NAME, as Python lexes it
    assert run_bytes(contextual, "a indexes") == "accept"  # lark: "in" + "dexes"
    assert run_bytes(reserved, "a in b") == "accept"


def test_first_line_indentation_counts(indented) -> None:
    assert run_bytes(indented, " x = 1\n") == "reject"  # Python: unexpected indent
    assert run_bytes(indented, "  # c\nx = 1\n") == "accept"
    assert run_bytes(indented, "\n\nx = 1\n") == "accept"


def test_lark_example_grammar_from_a_path(tmp_path, vocab) -> None:
    path = tmp_path / "calc.lark"
    path.write_text("// structspec: start=sum\n" + r"""
sum: product | sum "+" product
product: atom | product "*" atom
atom: NUMBER | "(" sum ")"
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
""")
    c = compile_grammar(path, vocab)
    assert run_bytes(c, "1 + 2*(3+4)") == "accept"
    assert run_bytes(c, "1 + * 2") == "reject"


# -- properties ----------------------------------------------------------------------------

def _lark_parses(c, text: str) -> bool:
    from lark.exceptions import LarkError

    try:
        c.grammar.lark.parse(text)
    except LarkError:
        return False
    return True


expr_texts = st.recursive(
    st.sampled_from(["a", "b1", "42", "3.5", "return", "x_y"]),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", " - ", " +\n"]), inner).map("".join),
        inner.map(lambda e: f"( {e})"),
        st.lists(inner, max_size=3).map(lambda args: "f(" + ", ".join(args) + ")"),
    ),
    max_leaves=8,
)


@given(text=expr_texts)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_completeness_texts_lark_accepts_are_accepted(expr, vocab, text: str) -> None:
    assert _lark_parses(expr, text)
    ids = _greedy_tokens(vocab, text.encode())
    s = expr.initial
    for t in ids:
        assert t in expr.allowed(s)
        s = expr.advance(s, t)
    assert expr.is_accepting(s)


def _greedy_tokens(vocab, data: bytes) -> list[int]:
    """Longest-match tokenization (so multi-byte tokens that cross lexemes get used)."""
    index = {t: i for i, t in enumerate(vocab.tokens) if t and i not in vocab.eos_token_ids}
    longest = max(len(t) for t in index)
    out, i = [], 0
    while i < len(data):
        for n in range(min(longest, len(data) - i), 0, -1):
            if data[i:i + n] in index:
                out.append(index[data[i:i + n]])
                i += n
                break
    return out


@pytest.mark.parametrize("which", ["expr", "indented"])
@given(seed=st.integers(0, 10_000))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
def test_soundness_random_walks_parse_with_lark(request, which: str, seed: int) -> None:
    c = request.getfixturevalue(which)
    text = _random_walk(c, seed, 40)
    if text is not None:
        final = text if which == "expr" or text.endswith("\n") or not text else text + "\n"
        assert _lark_parses(c, final), repr(text)


def _random_walk(c, seed: int, limit: int) -> str | None:
    """Random allowed tokens until an accepting state says stop (or the limit)."""
    rnd = random.Random(seed)
    s = c.initial
    out = bytearray()
    vocab = c._rt.vocab
    for _ in range(limit):
        if c.is_accepting(s) and rnd.random() < 0.3:
            return out.decode(errors="replace")
        ids = [i for i in c.allowed(s).ids().tolist() if i not in vocab.eos_token_ids]
        if not ids:
            break
        t = rnd.choice(ids)
        out += vocab.tokens[t]
        s = c.advance(s, t)
        assert s is not None
    return out.decode(errors="replace") if c.is_accepting(s) else None
