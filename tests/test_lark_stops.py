"""Fill-in-the-middle stopping points ``stop="statement"`` and ``stop="block"``
(:mod:`structspec.automata.lark_stops`): golden completions per shipped grammar, random walks
whose every accepting state makes prefix + completion + suffix parse (Python's own
``ast.parse``; lark's parser for JavaScript and SQL) and ends at a statement or block
boundary at the cursor's level (checked on Python's AST), typed errors, and generation.
"""

from __future__ import annotations

import ast
import copy
import io
import tokenize

import pytest
from conftest import make_byte_vocab, run_generate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grammars_corpus import asi_parses

from structspec import compile_grammar
from structspec.errors import GrammarError
from structspec.grammars import grammar_path

EOS = 0


@pytest.fixture(scope="module")
def bytes_only():
    return make_byte_vocab([])


@pytest.fixture(scope="module")
def grammars(bytes_only):
    return {n: compile_grammar(grammar_path(n), bytes_only) for n in ("python", "javascript",
                                                                        "sql")}


def status(view, text: str) -> str:
    """Walk ``text`` byte by byte: ``"final"`` (accepting, only EOS may follow),
    ``"accepting"``, ``"no"`` (legal, not accepting) or ``"dead"`` (not in a mask on the
    way: refused, or dropped as a dead end)."""
    s = view.initial
    for b in text.encode():
        if b + 1 not in view.allowed(s):  # refused, or dropped as a dead end
            return "dead"
        s = view.advance(s, b + 1)
    if not view.is_accepting(s):
        return "no"
    allowed = view.allowed(s).ids().tolist()
    return "final" if allowed == [EOS] else "accepting"


PY_DEF = "def f(x):\n    "
GOLDEN = [
    # python, statement: the statement the completion writes ends it
    ("python", PY_DEF, "\n    return y\n", "statement", "y = x + 1", "accepting"),
    ("python", PY_DEF, "\n    return y\n", "statement", "y = x + 1\n", "final"),
    ("python", PY_DEF, "\n    return y\n", "statement", "y = x +", "no"),
    ("python", PY_DEF, "\n    return y\n", "statement", "y = x + 1\n    z", "dead"),
    ("python", PY_DEF, "    return y\n", "statement", "y = x + 1\n", "final"),
    # a compound statement may end at each line its block can close; the model chooses
    ("python", PY_DEF, "\n    return y\n", "statement", "if x:\n        y = 1\n", "accepting"),
    ("python", PY_DEF, "\n    return y\n", "statement", "if x:", "no"),  # swallows `return`
    ("python", "import os\n", "\nprint(1)\n", "statement", "x = 1\n", "final"),
    ("python", "import os\n", "\nprint(1)\n", "statement", "def g():\n    return 1\n",
     "accepting"),
    # the suffix goes on with the statement holding the cursor: any end that parses
    ("python", "print(", ")\n", "statement", "x", "accepting"),
    ("python", "print(", ")\n", "statement", "x, y", "accepting"),
    # ... but not inside a token (eof would take `yprint(1)`), nor a statement the
    # completion began that the suffix finishes on the same line
    ("python", "x = 1\n", "print(1)\n", "statement", "y", "no"),
    ("python", "x = 1\n", "1)\n", "statement", "print(", "no"),
    ("python", "x = 1\n", "1)\n", "eof", "print(", "accepting"),
    # line-based infilling: the head of a compound statement whose body the suffix holds
    ("python", "def f(xs):\n", "        print(x)\n    return 1\n", "statement",
     "    for x in xs:\n", "accepting"),
    ("python", "def f(xs):\n", "\n        print(x)\n    return 1\n", "statement",
     "    for x in xs:", "accepting"),
    ("python", "x = 1\n", "print(1)\n", "statement", "y\n", "final"),
    # C's second statement is C's too, also at the start of a body (where C's first one
    # opens the body's statement list)
    ("python", PY_DEF, "1)\n    return y\n", "statement", "y = 2\n    foo(", "no"),
    ("python", "def f(x):\n", "1)\n", "statement", "    y = 2\n    foo(", "no"),
    ("python", "def f(x):\n", "1)\n", "eof", "    y = 2\n    foo(", "accepting"),
    ("python", "x = 1\n", "print(1)\n", "statement", "\n", "no"),  # only layout
    # statements of one line (`;`, one simple_stmt node): the one after C's `;` is C's, and
    # the suffix may not finish it, though the line's node holds the cursor (a walk of
    # test_python_statement_walks_end_at_statement_boundaries found `);(` + `)` in CI)
    ("python", "def f(x):\n    y = f(x,\n", ")\n    return y\n", "statement", ");(", "no"),
    ("python", "def f(x):\n    y = f(x,\n", ")\n    return y\n", "statement", "); z = (1",
     "no"),
    ("python", "def f(x):\n    y = f(x,\n", ")\n    return y\n", "eof", ");(", "accepting"),
    ("python", "print(", ")\n", "statement", "1); foo(2", "no"),
    ("python", "x = 1\n", "\nprint(x)\n", "statement", "a = 1; b = 2", "accepting"),
    ("python", "x = 1\n", "\nprint(x)\n", "statement", "a = 1;", "accepting"),
    # python, block: the suffix dedents right after the completion
    ("python", PY_DEF, "\n\nprint(f(1))\n", "block", "return x", "accepting"),
    ("python", PY_DEF, "\n\nprint(f(1))\n", "block", "y = x\n    return y\n", "accepting"),
    # a line dedented out of the block: refused at its first code byte
    ("python", PY_DEF, "\n\nprint(f(1))\n", "block", "return x\nz = 1", "dead"),
    ("python", "def f(x):\n    if x:\n        ", "\n    return 2\n", "block", "return 1",
     "accepting"),
    ("python", "def f(x):\n    if x:\n        ", "\n    return 2\n", "block",
     "return 1\n    y = 2", "dead"),
    ("python", PY_DEF, "    return y\n", "block", "y = 1\n", "accepting"),  # suffix goes on
    ("python", "x = 1\n", "y = 2\n", "block", "z = 3\n", "accepting"),  # no block: eof
    # explicit line joins (`\\` + newline: layout that makes two physical lines one
    # logical line) at the cursor; Python's tokenizer is the judge (ast.parse in the walks).
    # C ending inside an unfinished join (S completes it): never a stopping point
    ("python", PY_DEF, "\n        return y\n", "statement", "if x:\\", "no"),
    ("python", PY_DEF, "\n        return y\n", "block", "if x:\\", "no"),
    ("python", PY_DEF, "\n        return y\n", "eof", "if x:\\", "accepting"),
    # a join C ends with: no line break between C and S (`if x:    return y` is one line)
    ("python", "def f(x):\n", "    return y\n", "statement", "    if x:\\\n", "no"),
    ("python", "def f(x):\n", "        return y\n    return 2\n", "statement",
     "    if x:\\\n", "no"),
    ("python", "def f(x):\n", "        return y\n    return 2\n", "statement",
     "    if x:\n", "accepting"),  # a real line break: the head of S's body
    ("python", "def f(x):\n", "    x\n    return y\n", "statement", "    y = \\\n", "no"),
    ("python", "x = 1\n", " + 1\nprint(x)\n", "statement", "y = 2 \\\n", "no"),
    ("python", "x = 1\n", " + 1\nprint(x)\n", "eof", "y = 2 \\\n", "accepting"),
    ("python", PY_DEF, "\n    return y\n", "statement", "y = x \\\n", "accepting"),
    ("python", "def f(x):\n    y = ", "    + 1\n    return y\n", "statement", "x \\\n",
     "accepting"),  # the suffix finishes the cursor's statement
    # a join C begins right after the prefix, and one inside C
    ("python", "def f(x):\n    y = x", "\n    return y\n", "statement", "\\\n + 0",
     "accepting"),
    ("python", "def f(x):\n    y = x", "\n    return y\n", "statement", "\\\n + 0\n",
     "final"),
    ("python", "def f(x):\n    y = x", "\n    return y\n", "statement", "\\\n", "no"),
    ("python", PY_DEF, "\n    return y\n", "statement", "y = x + \\\n        1\n", "final"),
    # a join in the prefix's last line: the cursor's statement goes on
    ("python", "def f(x):\n    y = x + \\\n", "\n    return y\n", "statement", "1",
     "accepting"),
    ("python", "def f(x):\n    y = x + \\\n    ", "\n    return y\n", "statement", "1\n",
     "final"),
    # inside brackets a join is whitespace too; a newline there still ends a physical
    # line (line-based infilling of a bracketed literal: `value_map = {` + newline)
    ("python", PY_DEF, "\n    return y\n", "statement", "y = f(x, \\\n  1)\n", "final"),
    ("python", "def f(x):\n    y = f(x, \\\n", ")\n    return y\n", "statement", "1",
     "accepting"),
    ("python", PY_DEF, "  1)\n    return y\n", "statement", "y = f(x, \\\n", "no"),
    ("python", PY_DEF, "        x)\n    return y\n", "statement", "y = f(\n", "accepting"),
    ("python", PY_DEF, "\n        x)\n    return y\n", "statement", "y = f(x,", "accepting"),
    ("python", PY_DEF, "x)\n    return y\n", "statement", "y = f(", "no"),
    # inside a string `\\` + newline is part of the string
    ("python", PY_DEF, "\n    return y\n", "statement", "y = 'a\\\nb'\n", "final"),
    ("python", PY_DEF, "\n    return y\n", "statement", 'y = """a\\\nb"""', "accepting"),
    ("python", PY_DEF, "b'\n    return y\n", "statement", "y = 'a\\\n", "no"),  # in a token
    ("python", "def f(x):\n    y = 'a\\\n", "\n    return y\n", "statement", "b'",
     "accepting"),
    # block: joins are layout
    ("python", PY_DEF, "\n\nprint(f(1))\n", "block", "return x \\\n    + 1", "accepting"),
    ("python", PY_DEF, "\n\nprint(f(1))\n", "block", "y = 1 \\\n", "accepting"),
    ("python", PY_DEF, "\n\nprint(f(1))\n", "block", "y = 1\\", "no"),
    ("python", "def f(x):\n    if x: \\\n", "\n    return 2\n\nprint(f(1))\n", "block",
     "return 1", "accepting"),
    # javascript
    ("javascript", "function f(x) {\n  ", "\n}\nf(1);\n", "statement", "let y = x + 1;",
     "final"),
    # ASI ends the statement at the line break before the suffix's `}`; `+ 2` may follow
    ("javascript", "function f(x) {\n  ", "\n}\nf(1);\n", "statement", "let y = x + 1",
     "accepting"),
    ("javascript", "function f(x) {\n  ", "\n}\nf(1);\n", "statement", "let y = x +", "no"),
    ("javascript", "function f(x) {\n  ", " g();\n}\n", "statement", "let y = x", "no"),
    ("javascript", "function f(x) {\n  ", "\n}\nf(1);\n", "statement", "if (x) { y(); }",
     "accepting"),  # an `else` may follow
    ("javascript", "function f(x) {\n  ", "\n}\nf(1);\n", "statement",
     "if (x) { y(); } else { z(); }", "final"),
    ("javascript", "class A {\n  ", "\n}\n", "statement", "m() { return 1; }", "final"),
    ("javascript", "function f(x) {\n  ", "\nf(1);\n", "block", "return x;\n}", "final"),
    ("javascript", "function f(x) {\n  ", "\nf(1);\n", "block", "return x;", "no"),
    ("javascript", "function f(x) {\n  if (x) {\n    ", "\n  }\n  return 2;\n}\n", "block",
     "y();", "accepting"),
    ("javascript", "function f(x) {\n  if (x) {\n    ", "\n  return 2;\n}\n", "block",
     "y();\n  }", "final"),
    # sql: the statement ends at its `;` (or where the suffix's `;` follows)
    ("sql", "SELECT 1;\n", "\nSELECT 2;", "statement", "SELECT a FROM t", "no"),
    ("sql", "SELECT 1;\n", "\nSELECT 2;", "statement", "SELECT a FROM t;", "final"),
    ("sql", "SELECT 1;\n", ";\nSELECT 2;", "statement", "SELECT a FROM t", "accepting"),
    ("sql", "SELECT 1;\n", "", "statement", "SELECT a FROM t WHERE b = 1", "accepting"),
]


@pytest.mark.parametrize(("name", "prefix", "suffix", "stop", "completion", "expect"), GOLDEN)
def test_golden_stopping_points(grammars, name, prefix, suffix, stop, completion, expect):
    view = grammars[name].with_suffix(suffix, prefix=prefix, stop=stop)
    assert status(view, completion) == expect
    if name == "python" and expect in ("accepting", "final"):
        ast.parse(prefix + completion + suffix)  # Python agrees that it parses


def test_a_completion_of_layout_only_is_never_a_statement(grammars):
    view = grammars["python"].with_suffix("\nprint(1)\n", prefix="x = 1", stop="statement")
    assert not view.is_accepting(view.initial)
    assert status(view, "\n") == "no"
    assert status(view, " + 2") == "accepting"
    assert status(view, " + 2\n") == "final"  # the cursor's statement ends with the newline


def test_no_prefix_tolerant_states_and_views_of_views(grammars):
    py = grammars["python"]
    plain = py.with_suffix("", stop="statement")  # the whole text is the completion
    assert status(plain, "x = 1") == "accepting" and status(plain, "x = 1\n") == "final"
    bad = py.with_suffix("\nprint(1)\n", prefix="x = )\n", tolerant=True, stop="statement")
    assert bad.is_tolerant(bad.initial) and status(bad, "foo") == "accepting"  # as eof
    again = plain.with_suffix("\nz = 3\n", prefix="y = 2\n", stop="statement")
    assert status(again, "w = 1\n") == "final"


def test_line_and_eof_views_are_unchanged(grammars):
    py = grammars["python"]
    eof = py.with_suffix("print(1)\n", prefix="x = 1\n", stop="eof")
    assert status(eof, "y") == "accepting"  # `yprint(1)`
    line = py.with_suffix("print(1)\n", prefix="x = 1\n", stop="line")
    assert status(line, "y") == "no" and status(line, "y\n") == "final"


def test_block_masks_drop_lines_dedented_out_of_the_block(grammars, bytes_only):
    view = grammars["python"].with_suffix("\n\nprint(f(1))\n", prefix=PY_DEF, stop="block")
    s = view.state_after("y = x\n", state=view.initial)
    allowed = set(view.allowed(s).ids().tolist())
    assert EOS in allowed and ord(" ") + 1 in allowed and ord("#") + 1 in allowed
    assert ord("z") + 1 not in allowed and view.advance(s, ord("z") + 1) is not None
    s4 = view.state_after("    ", state=s)  # back at the block's level: code again
    assert ord("z") + 1 in view.allowed(s4)
    # nothing is dropped before C wrote code (the cursor's line may dedent), nor by eof
    first = grammars["python"].with_suffix("\n", prefix="def f(x):\n    x = 1\n", stop="block")
    assert ord("z") + 1 in first.allowed(first.initial)


def test_block_masks_drop_tokens_that_close_the_block_behind_code(grammars):
    # a brace language: the `}` that closes the cursor's block where the suffix goes on
    js = grammars["javascript"].with_suffix("\n  return 2;\n}\n", prefix="function f(x) {\n  ",
                                            stop="block")
    assert status(js, "y();\n") == "accepting"  # the suffix goes on with the block
    assert status(js, "y();\n}") == "dead"
    assert status(js, "if (x) { y(); }") == "accepting"  # an inner block's `}` is fine
    closes = grammars["javascript"].with_suffix("\nf(1);\n", prefix="function f(x) {\n  ",
                                                stop="block")
    assert status(closes, "y();\n}") == "final"  # where the suffix fits, `}` ends it


def test_block_masks_drop_multi_line_tokens_that_dedent_out_of_the_block():
    vocab = make_byte_vocab(["\nz", "\n    z", "\n"])
    view = compile_grammar(grammar_path("python"), vocab).with_suffix(
        "\n\nprint(f(1))\n", prefix=PY_DEF, stop="block")
    s = view.state_after("return x", state=view.initial)
    allowed = set(view.allowed(s).ids().tolist())
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    assert ids[b"\n    z"] in allowed and EOS in allowed
    assert ids[b"\nz"] not in allowed and view.advance(s, ids[b"\nz"]) is not None


def test_errors_name_the_stop_and_the_rules(grammars, bytes_only):
    json = compile_grammar(grammar_path("json"), bytes_only)
    with pytest.raises(GrammarError, match=r"stop='statement' needs the grammar's statement"):
        json.with_suffix("", stop="statement")
    with pytest.raises(GrammarError, match=r"stop='block'.*stop_block="):
        grammars["sql"].with_suffix("", stop="block")
    with pytest.raises(GrammarError, match=r"'nope' is not a rule"):
        grammars["python"].with_suffix("", stop="statement", stop_rules="stmt,nope")
    with pytest.raises(ValueError, match=r"stop must be one of eof, line, statement, block"):
        grammars["python"].with_suffix("", stop="blok")
    with pytest.raises(ValueError, match=r"stop_rules needs stop='statement' or 'block'"):
        grammars["python"].with_suffix("", stop="line", stop_rules="stmt")
    # explicit rules, and a header of the grammar's own
    text = ('// structspec: stop_statement=stmt\nstart: stmt+\nstmt: NAME "=" NAME ";"\n'
            'NAME: /[a-z]/\n')
    own = compile_grammar(text, bytes_only).with_suffix("b=c;", stop="statement")
    assert status(own, "a=b;") == "final" and status(own, "a=b") == "no"
    with pytest.raises(GrammarError, match="stop_terminators: 'NOPE' is not a terminal"):
        compile_grammar("// structspec: stop_terminators=NOPE\n" + text.split("\n", 1)[1],
                        bytes_only).with_suffix("", stop="statement", stop_rules="stmt")


def _accepts_within(view, state, alphabet, depth):
    """Some text of at most ``depth`` tokens of ``alphabet`` leads to acceptance."""
    if view.is_accepting(state):
        return True
    return depth > 0 and any(
        _accepts_within(view, nxt, alphabet, depth - 1)
        for t in alphabet if (nxt := view.advance(state, t)) is not None)


def test_views_keep_the_protocol_on_a_grammar_without_ignore(bytes_only):
    """allowed(s) is {t : advance(s, t)} less dead ends (none of them accepts within five
    more tokens) on every reachable state (the grammar has no %ignore: dead-end pruning
    on), EOS exactly where accepting."""
    text = 'start: stmt+\nstmt: NAME "=" NAME ";" | "{" stmt+ "}"\nNAME: /[a-z]/\n'
    c = compile_grammar(text, bytes_only)
    for stop, rules in (("statement", "stmt"), ("block", "stmt")):
        view = c.with_suffix("c=d;}", prefix="{a=b;", stop=stop, stop_rules=rules)
        seen, todo = set(), [view.initial]
        while todo and len(seen) < 80:
            s = todo.pop(0)
            if s in seen:
                continue
            seen.add(s)
            allowed = set(view.allowed(s).ids().tolist())
            legal = {t for t in range(len(bytes_only)) if view.advance(s, t) is not None}
            assert allowed <= legal
            alphabet = [ord(ch) + 1 for ch in "ab=;{}"]
            for t in legal - allowed:
                assert not _accepts_within(view, view.advance(s, t), alphabet, 5)
            assert (EOS in allowed) == view.is_accepting(s)
            todo.extend(view.advance(s, t) for t in allowed - {EOS})
        assert any(view.is_accepting(s) for s in seen)


# -- random walks ------------------------------------------------------------------------

PY_PIECES = ["x", "y", " = ", "1", " + ", "(", ")", ", ", "\n", "    ", "\n    ",
             "\n        ", "if x:", "else:", "return ", "pass", "f(", "#c", " ", "\\\n",
             " \\\n", "'a\\\nb'"]
JS_PIECES = ["x", "y", " = ", "1", " + ", "(", ")", ", ", ";", "\n", "  ", "{", "}",
             "if (x) ", " else ", "return ", "let ", "f(", "// c\n", " "]
SQL_PIECES = ["SELECT ", "a", "b", " FROM ", "t", " WHERE ", " = ", "1", ";", "\n", " ",
              ", ", "(", ")", " AND ", "*"]


def _vocab(pieces):
    return make_byte_vocab(pieces)


@pytest.fixture(scope="module")
def piece_vocabs():
    return {"python": _vocab(PY_PIECES), "javascript": _vocab(JS_PIECES),
            "sql": _vocab(SQL_PIECES)}


def _walk(view, vocab, data, steps):
    """Random allowed tokens (multi-byte pieces four times as likely as bytes; printable
    ASCII, tabs and newlines only); yields (completion bytes, state) after each."""
    s, out = view.initial, b""
    n_bytes = 257
    for _ in range(steps):  # printable ASCII, tabs and newlines: the oracles' offsets
        ids = [t for t in view.allowed(s).ids().tolist() if t != EOS and all(
            32 <= b < 127 or b in (9, 10) for b in vocab.tokens[t])]
        if not ids:
            return
        pieces = [t for t in ids if t >= n_bytes]
        pick = pieces if pieces and data.draw(st.integers(0, 4)) else ids
        t = pick[data.draw(st.integers(0, len(pick) - 1))]
        s = view.advance(s, t)
        assert s is not None
        out += vocab.tokens[t]
        yield out, s


def _offset(text: str, line: int, col: int) -> int:
    """The offset of (line, column) in ASCII ``text`` (as ``ast`` and ``tokenize`` give)."""
    return sum(len(x) + 1 for x in text.split("\n")[:line - 1]) + col


_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENDMARKER}


def _code_around(src: str, cut: int) -> tuple[int, int, list[int], list[int]] | None:
    """The end of the last code token before ``cut``, the start of the first one at or
    after it (comments, newlines and indentation are layout), where logical lines end
    (NEWLINE tokens) and where other lines end (NL tokens: blank and comment lines,
    newlines inside brackets). An explicit line join (``\\`` + newline) has no token:
    it makes two physical lines one. ``None`` where the ``tokenize`` module refuses a
    source the compiler took: before Python 3.12 it is a separate tokenizer, which reads
    some indentation written with form feeds and line joins otherwise (a CI run found one
    that ``ast.parse`` accepts and ``tokenize`` calls an unindent to no outer level)."""
    lo, hi = 0, len(src)
    newlines, nls = [], []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (IndentationError, tokenize.TokenError):
        return None
    for tok in tokens:
        start = _offset(src, *tok.start)
        if tok.type == tokenize.NEWLINE:
            newlines.append(start)
        elif tok.type == tokenize.NL:
            nls.append(start)
        if tok.type in _LAYOUT:
            continue
        if start < cut:
            lo = _offset(src, *tok.end)
        else:
            hi = min(hi, start)
    return lo, hi, newlines, nls


def _straddles(body, src, lo, hi, cursor, broke):
    """Statements of ``body`` that the completion began (at or after ``cursor``) before
    ``lo`` and that end after ``hi`` (byte offsets): none may, unless a line ends between
    ``lo`` and ``hi`` that no explicit join continues (``broke``: line-based infilling,
    e.g. the head of a compound statement whose body the suffix holds). One that holds
    the cursor may go on into the suffix."""
    return [n for n in body if cursor <= _offset(src, n.lineno, n.col_offset) < lo
            and _offset(src, n.end_lineno, n.end_col_offset) > hi and not broke]


def _py_parse(src: str, mid: str) -> ast.Module | None:
    """``ast.parse(src)`` (the soundness check), ``None`` where Python refuses what
    python.lark does not check: tabs mixed with spaces (docs/lark_grammars.md)."""
    try:
        return ast.parse(src)
    except SyntaxError as exc:
        if isinstance(exc, TabError):
            return None
        raise AssertionError(repr(mid)) from exc


PY_CASES = [  # (prefix, suffix, which body holds the cursor: a path of indices)
    (PY_DEF, "\n    return y\n", (0,)),
    ("x = 1\n", "\nprint(x)\n", ()),
    ("class A:\n    def m(self):\n        ", "\n        return 1\n", (0, 0)),
    # line-based: the suffix begins with the next line's indentation (a join at C's end
    # would make the two lines one), or goes on with the line C ends
    ("def f(x):\n", "    return y\n", (0,)),
    ("def f(x):\n", "        return y\n    return 2\n", (0,)),
    ("x = 1\n", " + 1\nprint(x)\n", ()),
    # the cursor after a join, and inside brackets
    ("def f(x):\n    y = x + \\\n", "\n    return y\n", (0,)),
    ("def f(x):\n    y = f(x,\n", ")\n    return y\n", (0,)),
]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(PY_CASES), st.data())
def test_python_statement_walks_end_at_statement_boundaries(piece_vocabs, case, data):
    prefix, suffix, path = case
    vocab = piece_vocabs["python"]
    c = compile_grammar(grammar_path("python"), vocab)
    view = c.with_suffix(suffix, prefix=prefix, stop="statement")
    for out, s in _walk(view, vocab, data, 24):
        if not view.is_accepting(s):
            continue
        mid = out.decode()
        src = prefix + mid + suffix
        tree = _py_parse(src, mid)
        if tree is None:
            return
        body = tree.body
        for i in path:
            body = body[i].body
        cut = len(prefix + mid)
        around = _code_around(src, cut)
        if around is None:
            return
        lo, hi, newlines, nls = around
        broke = any(lo <= x < hi for x in newlines + nls)  # C and S meet at a line end
        assert not _straddles(body, src, lo, hi, len(prefix), broke), repr((prefix, mid, suffix))
        if view.allowed(s).ids().tolist() == [EOS]:
            # final at a statement's newline (its lexeme may hold the next indentation, or
            # a comment): a logical line ends in C after its last code (not a join's
            # newline, not one inside brackets)
            assert any(lo <= x < cut for x in newlines), repr(mid)
            break


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_python_block_walks_close_the_block_at_the_end(piece_vocabs, data):
    prefix, suffix = "def f(x):\n    ", "\n\nprint(f(1))\n"
    vocab = piece_vocabs["python"]
    view = compile_grammar(grammar_path("python"), vocab).with_suffix(
        suffix, prefix=prefix, stop="block")
    for out, s in _walk(view, vocab, data, 24):
        if view.is_accepting(s):
            mid = out.decode()
            src = prefix + mid + suffix
            tree = _py_parse(src, mid)
            if tree is None:
                return
            func = tree.body[0]
            assert isinstance(func, ast.FunctionDef)  # the completion stayed in the block
            around = _code_around(src, len(prefix + mid))
            if around is None:
                return
            lo, hi, _, _ = around
            assert lo <= _offset(src, func.end_lineno, func.end_col_offset) <= hi, repr(mid)


LARK_CASES = [
    ("javascript", "function f(x) {\n  ", "\n}\nf(1);\n", "statement"),
    ("javascript", "function f(x) {\n  ", "\nf(1);\n", "block"),
    ("javascript", "let a = ", ";\n", "statement"),
    ("sql", "SELECT 1;\n", "\nSELECT 2;", "statement"),
    ("sql", "SELECT a FROM t WHERE ", ";", "statement"),
]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(LARK_CASES), st.data())
def test_javascript_and_sql_walks_parse_where_they_accept(piece_vocabs, case, data):
    name, prefix, suffix, stop = case
    vocab = piece_vocabs[name]
    c = compile_grammar(grammar_path(name), vocab)
    view = c.with_suffix(suffix, prefix=prefix, stop=stop)
    for out, s in _walk(view, vocab, data, 20):
        if view.is_accepting(s):
            text = prefix + out.decode() + suffix
            if name == "javascript":  # lark has no ASI: its twin on lark's parser
                assert asi_parses(text), repr(text)
            else:
                c.grammar.lark.parse(text)
            if view.allowed(s).ids().tolist() == [EOS]:
                break


def test_cli_refuses_a_stop_the_grammar_has_no_rules_for_before_the_model(capsys):
    from structspec.cli import main

    assert main(["generate", "--grammar", "json", "--stop", "statement", "--prompt", "x"]) == 2
    assert "--stop statement: stop='statement' needs the grammar's statement rules" in \
        capsys.readouterr().err
    assert main(["generate", "--grammar", "sql", "--stop", "block", "--prompt", "x"]) == 2
    with pytest.raises(SystemExit):  # argparse: not a choice
        main(["generate", "--grammar", "sql", "--stop", "blocks", "--prompt", "x"])


# -- generation ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen(tiny_model):
    from structspec.api import Generator
    from structspec.models import LoadedModel

    own = LoadedModel(copy.deepcopy(tiny_model.model), tiny_model.tokenizer, tiny_model.name,
                      tiny_model.eos_token_ids)
    return Generator(own)


@pytest.mark.parametrize("stop", ["statement", "block"])
def test_generation_with_construct_stops_is_the_same_with_speculation(gen, stop):
    prefix, suffix = "def add(a, b):\n    total = a +", "\n    return total\n\nprint(1)\n"
    kw = dict(prompt=prefix, grammar="python", grammar_prefix=prefix, grammar_suffix=suffix,
              stop=stop, max_new_tokens=12, chat=False)
    plain = run_generate(gen, speculative=False, **kw)
    fast = run_generate(gen, **kw)
    assert plain == fast
    text, _, complete = plain
    if complete:
        ast.parse(prefix + text + suffix)


def test_generator_rejects_a_stop_the_grammar_has_no_rules_for(gen):
    with pytest.raises(GrammarError, match="stop='block'"):
        gen.run("SELECT", grammar="sql", grammar_suffix=";", stop="block", chat=False)
    with pytest.raises(ValueError, match="stop must be one of"):
        gen.run("x", grammar="python", stop="blocks", chat=False)
