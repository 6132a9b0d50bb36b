"""The shipped grammars on real code they were not written against, through structspec's
own constraint (``compile_grammar`` + ``state_after``), not only lark's parser.

- Python: a deterministic sample of the running interpreter's standard library (modules,
  and top-level statements of other modules), an acceptance rate with the failures listed;
  a few stdlib functions token by token in the real SmolLM2 tokenization; and soundness
  (Hypothesis): random walks through the constraint from prefixes cut out of stdlib code
  parse with ``ast.parse``.
- SQL and JavaScript: ``tests/data/heldout/`` (TPC-H and sqlglot fixtures; the main files
  of six MIT-licensed npm packages; sources and licences in its README).

None of this reads ``../shared``. The whole-stdlib figures are in docs/lark_grammars.md
("Coverage on held-out code"); these tests keep a sample of it fast (seconds).
"""

from __future__ import annotations

import ast
import hashlib
import re
import sysconfig
import warnings
from functools import cache
from pathlib import Path

import pytest
from conftest import make_byte_vocab
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from structspec import GrammarError, compile_grammar
from structspec.grammars import grammar_path

HELDOUT = Path(__file__).resolve().parent / "data" / "heldout"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
MODULES = 25  # whole modules through the constraint
STATEMENTS = 250  # top-level statements of other modules
MIN_MODULE_RATE = 0.9
MIN_STATEMENT_RATE = 0.97
# stdlib functions walked in the real tokenization (present in CPython 3.8 to 3.13)
REAL_VOCAB_FUNCTIONS = [("shlex.py", "quote"), ("textwrap.py", "dedent"),
                        ("colorsys.py", "rgb_to_hls"), ("bisect.py", "insort_right")]

needs_stdlib = pytest.mark.skipif(
    not (STDLIB / "os.py").is_file(),
    reason=f"no Python standard library sources at {STDLIB} (sysconfig 'stdlib')",
)


@cache
def byte_constraint(name: str):
    """Shipped grammar ``name`` against a byte-level vocabulary (every text is tokens)."""
    return compile_grammar(grammar_path(name), make_byte_vocab())


def accepts(name: str, text: str) -> bool:
    """Whether the constraint takes ``text`` from its start and accepts at its end."""
    c = byte_constraint(name)
    try:
        return c.is_accepting(c.state_after(text))
    except GrammarError:
        return False


def _key(path: Path) -> str:
    return hashlib.sha256(str(path.relative_to(STDLIB)).encode()).hexdigest()


@cache
def stdlib_files() -> list[Path]:
    """The stdlib's ``.py`` files that ``ast.parse`` accepts, below 40 kB, in hash order
    of their relative paths (a fixed order on every machine with the same stdlib)."""
    out = []
    for path in sorted(STDLIB.rglob("*.py"), key=_key):
        if "site-packages" in path.parts or path.stat().st_size > 40_000:
            continue
        try:
            ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        out.append(path)
    return out


def top_level_statements(path: Path) -> list[str]:
    """The source of each top-level statement of ``path`` (decorators included)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.parse(text).body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        src = "".join(lines[first - 1 : node.end_lineno])
        if node.col_offset == 0 and src.strip():
            out.append(src if src.endswith("\n") else src + "\n")
    return out


def _report(failed: list[str], total: int) -> str:
    return f"{len(failed)}/{total} refused:\n" + "\n".join(failed[:25])


# ------------------------------------------------------------------ Python


@needs_stdlib
def test_python_stdlib_modules_accepted() -> None:
    files = stdlib_files()[:MODULES]
    assert len(files) == MODULES
    failed = [str(p.relative_to(STDLIB)) for p in files
              if not accepts("python", p.read_text(encoding="utf-8"))]
    rate = 1 - len(failed) / len(files)
    assert rate >= MIN_MODULE_RATE, _report(failed, len(files))


@needs_stdlib
def test_python_stdlib_statements_accepted() -> None:
    """Top-level statements (functions, classes, assignments, imports...) of the next
    modules in the order, at most 12 from each, until STATEMENTS."""
    sample: list[tuple[str, str]] = []
    for path in stdlib_files()[MODULES:]:
        for src in top_level_statements(path)[:12]:
            sample.append((str(path.relative_to(STDLIB)), src))
        if len(sample) >= STATEMENTS:
            break
    sample = sample[:STATEMENTS]
    assert len(sample) == STATEMENTS
    failed = [f"{where}: {src.splitlines()[0][:80]}" for where, src in sample
              if not accepts("python", src)]
    rate = 1 - len(failed) / len(sample)
    assert rate >= MIN_STATEMENT_RATE, _report(failed, len(sample))


def _function(module: str, name: str) -> str:
    path = STDLIB / module
    text = path.read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node, padded=True) + "\n"
    pytest.skip(f"{module} has no function {name} here")


@pytest.fixture(scope="module")
def python_real(smollm_vocab):
    return compile_grammar(grammar_path("python"), smollm_vocab)


@needs_stdlib
@pytest.mark.parametrize(("module", "name"), REAL_VOCAB_FUNCTIONS)
def test_python_stdlib_functions_in_real_tokenization(python_real, smollm_tokenizer,
                                                      module: str, name: str) -> None:
    """Every token of the tokenizer's own encoding is in the mask; the end accepts."""
    src = _function(module, name)
    c = python_real
    s = c.initial
    for i, t in enumerate(smollm_tokenizer.encode(src, add_special_tokens=False)):
        assert t in c.allowed(s), (name, i, smollm_tokenizer.decode([t]))
        s = c.advance(s, t)
    assert c.is_accepting(s)


@cache
def _prefix_sources() -> list[str]:
    """Functions and classes of the first modules, for the soundness walks."""
    out = []
    for path in stdlib_files()[:MODULES]:
        out += [s for s in top_level_statements(path) if s.startswith(("def ", "class "))]
    return [s for s in out if accepts("python", s)][:40]


# PEP 695 syntax (3.12) a 3.11 ast.parse cannot check: `type X = ...`, `def f[T]()`
_PY312_ONLY = re.compile(r"(?m)^\s*type\s+\w|(?:def|class)\s+\w+\s*\[")


def _ast_ok(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return bool(_PY312_ONLY.search(text))
    return True


@needs_stdlib
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_python_walks_from_real_prefixes_parse(python_real, data) -> None:
    """Soundness from the middle of real code: cut a stdlib function or class after one of
    its lines, walk up to 24 tokens of the real vocabulary through the masks (short tokens
    preferred now and then, to close brackets), and stop where the constraint accepts: the
    prefix + the walk then parses with ``ast.parse`` (Python closes the open blocks at the
    end of input, as the constraint does). Tokens holding a tab are in the walk: the
    Python preset refuses tabs in indentation (``IndenterSpec.tabs``), so no walk can
    reach Python's ``TabError``."""
    sources = _prefix_sources()
    assert sources
    src = data.draw(st.sampled_from(sources), label="source")
    lines = src.splitlines(keepends=True)
    cut = data.draw(st.integers(1, len(lines)), label="lines kept")
    prefix = "".join(lines[:cut])
    c = python_real
    vocab = c._rt.vocab
    s = c.state_after(prefix)
    out = bytearray()
    for _ in range(24):
        if c.is_accepting(s) and out and data.draw(st.booleans(), label="stop"):
            break
        ids = [i for i in c.allowed(s).ids().tolist()
               if i not in vocab.eos_token_ids]
        assert ids, (prefix, bytes(out))
        short = [i for i in ids if len(vocab.tokens[i]) <= 2]
        pool = short if short and data.draw(st.booleans(), label="short") else ids
        t = pool[data.draw(st.integers(0, len(pool) - 1), label="token")]
        out += vocab.tokens[t]
        s = c.advance(s, t)
        assert s is not None
    if c.is_accepting(s):
        text = prefix + out.decode("utf-8", errors="replace")
        assert _ast_ok(text), text


@pytest.mark.parametrize("program", [
    "if x:\n        a = 1\n\tb = 2\n",  # 8 spaces, then a tab: equal at 8, not at 1
    "if x:\n    if y:\n\ta = 1\n",
    "if x:\n\tif y:\n        a = 1\n",
])
def test_python_inconsistent_tabs_rejected(program: str) -> None:
    """Python's TabError (tabs and spaces compared inconsistently) is never accepted."""
    with pytest.raises(SyntaxError):
        ast.parse(program)
    assert not accepts("python", program)


@pytest.mark.parametrize(("program", "ok"), [
    ("if x:\n\ta = 1\n", False),  # tab indentation: refused (a documented narrowing)
    ("f(a,\n\tb)\n", True),  # inside brackets: any whitespace
    ("x = [\n\t1,\n\t2]\n", True),
    ("x = 1\n\t\ny = 2\n", True),  # a blank line holding a tab
    ("x = 1\n\t# c\ny = 2\n", True),  # a comment line indented by a tab
    ("x = 1  \t# c\n", True),  # a tab that is not indentation
])
def test_python_tabs_policy(program: str, ok: bool) -> None:
    """The Python preset refuses tabs only where they indent a line of code."""
    ast.parse(program)
    assert accepts("python", program) is ok


@pytest.mark.parametrize("program", [
    "x = 1\n\\\n + 0\n",  # a join at column 0: the blanks after it indent
    "x = 1\n\\\n\\\n y\n",
    "x = 1\n  \\\n+ 0\n",  # the first join at a column > 0 sets the indentation
    "x = 1\n\\\n  \\\n y\n",
    "x = 1\n\\\n\n  y\n",  # a join onto a blank line: the next line indents
    "if x:\n    a\n\\\nb\n  c\n",
    "x = 1\n\\\n",  # a join at the end of the file
    "x = 1\n\\",
    "def f(x):\n    \x0cy\n",  # a form feed sets the column back to 0
    "if x:\n    a\n    \x0cb\n  c\n",
])
def test_python_line_start_layout_rejected(program: str) -> None:
    """Explicit joins and form feeds before a line's code: Python's indentation
    (tokenizer.c: the first join at a column > 0 sets it, joins at column 0 leave it to
    what follows, a form feed sets the column back to 0)."""
    with pytest.raises(SyntaxError):
        ast.parse(program)
    assert not accepts("python", program)


@pytest.mark.parametrize("program", [
    "x = 1\n\\\n+ 0\n",
    "if x:\n    a\n\\\n    b\n",
    "if x:\n    a\n    \\\n    b\n",
    "if x:\n    a\n\\\nb\n",
    "if x:\n  a\n\\\n  \\\n b\n",
    "x = 1\n\\\n# c\n",
    "x = (1 +\n\\\n 2)\n",
    "x = 1 \\\n  ",  # blanks after a join: not the end of input right after it
    "x = 1\n ",  # the input ends in a line without code: its indentation is not read
    "x = 1\n# c",
    "x = 1\n\t",
    "if x:\n    y\n  ",
    "if x:\n    y\n  # c",
    "def f(x):\n    a\n\x0c\n    b\n",  # a form feed: column 0 (a page break line)
    "if x:\n\x0c    a\n",
    "if x:\n    \x0c    a\n",
    "  \x0cx = 1\n",
])
def test_python_line_start_layout_accepted(program: str) -> None:
    ast.parse(program)
    assert accepts("python", program)


_TARGETS = [
    "*a, = x\n", "() = x\n", "[] = x\n", "(a) = 1\n", "((a), [b.c, d[0]]) = x\n",
    "f(x).y = 1\n", "x = *a, *b\n", "a = *b, = c\n", "[*a, *b] = x\n", "a = yield\n",
    "x[1:2], y.z = 1, 2\n", "a = b = c = f()\n", "x = (a, b) = 1, 2\n", "match.x = 1\n",
    "match, a = x\n", "del (a), [b]\n", "del ()\n", "del (a.b, [c[0]])\n",
    "del (a, *b).c\n", "for *a, b in x: pass\n", "for (a, [b, *c]) in d: pass\n",
    "with x as (a, *b): pass\n", "[x for (*a,) in y]\n", "with (a, b as c): pass\n",
    "x = ((a, *b), c).d\n", "(a) += 1\n", "(a.b): int = 1\n", "((a)) += 1\n",
    "(a)[0] += 1\n", "(match) += 1\n", "for (a) in x: pass\n", "x = 1; (a) += 1\n",
    # refused by ast.parse
    "f() = 1\n", "a + b = c\n", "x = yield = 1\n", "(yield) = 1\n", "{a} = 1\n",
    "a if b else c = 1\n", "await x = 1\n", "-a = 1\n", "'s' = 1\n", "x = 1 = 2\n",
    "a.b.c[0](1) = 2\n", "lambda: 1 = 2\n", "(a := 1) = 2\n", "a, f() = 1, 2\n",
    "(a, b + 1) = x\n", "[x for x in y] = 1\n", "not a = 1\n", "a < b = 1\n",
    "a or b = 1\n", "match.f() = 1\n", "match, 1 = x\n", "match = yield = 1\n",
    "f() += 1\n", "a, b += 1\n", "del f()\n", "del (1, 2)\n", "del (a, *b)\n",
    "del [*a]\n", "del (a, (b, *c))\n", "del *a\n", "for (1, 2) in x: pass\n",
    "for f() in x: pass\n", "for (*a) in x: pass\n", "with x as (*a): pass\n",
    "x = 1; f() = 2\n", "((a), b) += 1\n", "(a, b): int\n", "([a]) += 1\n",
    "(f()) += 1\n", "match(a) += 1\n",
]


@pytest.mark.parametrize("program", _TARGETS)
def test_python_assignment_targets_agree_with_ast_parse(program: str) -> None:
    """Targets of `=`, `for`, `with ... as`, `del`: accepted exactly where Python parses
    them ("cannot assign to ...", "cannot delete starred" are parse errors)."""
    try:
        ast.parse(program)
        ok = True
    except SyntaxError:
        ok = False
    assert accepts("python", program) is ok


_LAYOUT = ["x = 1", "y", "pass", "if x:", "else:", "def f():", "z = [", "]", "(", ")",
           "\n", "\r\n", "\\\n", " ", "    ", "\t", "\x0c", "# c", "'s\\\n'"]
# Python's blank line made of blanks and a join (`  \` + newline + `\n`): refused (a
# documented narrowing, docs/lark_grammars.md); tabs that indent code: refused too.
_NARROWED = re.compile(r"(?:^|\n)[ \t\f]+\\\r?\n(?:[ \t\f]|\\\r?\n)*(?:[\r\n#]|$)|"
                       r"(?:^|\n)[ \f]*\t")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_LAYOUT), min_size=1, max_size=10).map("".join))
@example("\x0c\\\n x = 1")  # a join at column 0 after a form feed: the blanks after it indent
@example("y = 1\n\x0c\\\n y = 1")
def test_python_layout_agrees_with_ast_parse(text: str) -> None:
    """Texts of lines, blanks, tabs, joins, comments and brackets: accepted exactly when
    Python parses them (soundness always; completeness outside the two narrowings)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # `1if` and the like
            ast.parse(text)
        ok = True
    except SyntaxError as exc:
        ok = False
        if isinstance(exc, TabError):
            return  # refused anyway: the Python preset refuses tab indentation
    got = accepts("python", text)
    if got:
        assert ok, text
    elif ok:
        assert _NARROWED.search(text), text


def test_python_312_golden_programs_accepted() -> None:
    """Python 3.12 syntax the 3.11 stdlib cannot show, through the constraint."""
    text = (Path(__file__).parent / "data" / "grammars" / "python" / "py312.py").read_text(
        encoding="utf-8")
    assert accepts("python", text)
    for snippet in [
        "type Point = tuple[float, float]\n",
        "def first[T](xs: list[T]) -> T:\n    return xs[0]\n",
        "class Box[T: (int, str), *Ts, **P]:\n    pass\n",
        "x = f\"{a if b else c}, {', '.join(map(str, xs))}, {n:>{width}}, {v!r:^10}\"\n",
        "y = f'{d[\"k\"]:.3f} {1e3:g} {-0.5:+.1f} {f\"{inner!r}\"}'\n",
        "w = f'{\", \".join([s for s in t])} {g(a, *b, key=1, **kw)} {x[1:-1]}'\n",
        "z = rf\"C:\\path\\{name}\\{{literal}}\"\n",
        "match, rest = None, None\n",
        "match command.split():\n    case [action, *objs] if objs:\n        pass\n"
        "    case {'k': v, **kw}:\n        pass\n    case Point(x=0) | None:\n        pass\n",
        "async def f():\n    async with a as b, c:\n        await g(x := 1)\n"
        "    async for i in h():\n        yield i\n",
        "def g(a, /, b=1, *args, c, d=2, **kw) -> None:\n    global q; nonlocal_ = 1\n",
        "n = 1_000_000 + 0x_ff + 0o17 + 0b1010 + 1.5e-3 + 2j + 3.j\n",
        "s = b'\\x00' rb'\\d' Br'z'; t = u'x' R'y'\n",
        "if (a and\n        b):\n    x = [1,\n         2]\n",
        "x = 1 + \\\n    2\n",
        "try:\n    pass\nexcept* ValueError as e:\n    raise\n",
        "lam = lambda *a, k=1, **kw: (a, k, kw)\n",
    ]:
        assert accepts("python", snippet), snippet
        if not _PY312_ONLY.search(snippet):
            ast.parse(snippet)


@pytest.mark.parametrize("program", [
    "x = f'{a if b}'\n",  # a conditional needs its else
    "x = f'{x,,}'\n",
    "x = f'{1 +}'\n",
    "x = f'{012}'\n",  # leading zeros
    "x = f'{a(b=)}'\n",
    "x = rf'\\{x'\n",
    "x = f'{a + not b}'\n",  # `not` binds looser than `+`
    "x = f'{g(a=1, b)}'\n",  # a positional argument after a keyword one
    "x = f'{g(**k, *a)}'\n",
    "x = f'{x[-:]}'\n",
    "x = f'\\{x'\n",  # a backslash does not escape a brace
    "match, = \n",
])
def test_python_fstring_and_soft_keyword_rejects(program: str) -> None:
    with warnings.catch_warnings():  # ast's own warning for "\{" (the point of that case)
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(SyntaxError):
            ast.parse(program)
    assert not accepts("python", program)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from([*_LAYOUT, "\n    ", "\n\x0c", "\\\n    ", "  \\\n",
                                 "x = (1,\n", "    return y\n"]),
                min_size=1, max_size=12).map("".join))
def test_python_layout_in_real_tokens_matches_bytes(python_real, smollm_tokenizer,
                                                    text: str) -> None:
    """The same layout texts in the real tokenization (tokens such as ``\\\n``, ``\n\x0c``
    or ``\n    `` cross the newline lexeme: the masks' vectorized indentation effects): every
    token is in the mask exactly when it can be taken, and the end accepts exactly where
    the byte-level constraint does."""
    ids = smollm_tokenizer.encode(text, add_special_tokens=False)
    if smollm_tokenizer.decode(ids) != text:
        return
    c = python_real
    s = c.initial
    for t in ids:
        nxt = c.advance(s, t)
        assert (nxt is not None) == (t in c.allowed(s)), (text, t)
        if nxt is None:
            assert not accepts("python", text), text
            return
        s = nxt
    assert c.is_accepting(s) == accepts("python", text), text


# ------------------------------------------------------------------ SQL, JavaScript


def _sql_statements(path: Path) -> list[str]:
    """The statements of a corpus file: one a line (``sqlglot_identity.sql``) or ``;``-
    terminated blocks after a ``-- name`` line (``tpch.sql``)."""
    text = path.read_text(encoding="utf-8")
    parts = [p.strip() for p in text.split(";\n")]
    return [p + ";" for p in parts if p.strip()]


@pytest.mark.parametrize("name", ["tpch.sql", "sqlglot_identity.sql"])
def test_sql_heldout_corpus(name: str) -> None:
    statements = _sql_statements(HELDOUT / "sql" / name)
    assert len(statements) >= 22
    failed = [s[:100] for s in statements if not accepts("sql", s)]
    assert not failed, _report(failed, len(statements))
    # the whole file at once: statements separated by `;`, comments between them
    assert accepts("sql", (HELDOUT / "sql" / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(p.name for p in (HELDOUT / "javascript").glob("*.js")))
def test_javascript_heldout_corpus(name: str) -> None:
    text = (HELDOUT / "javascript" / name).read_text(encoding="utf-8")
    assert accepts("javascript", text)


@pytest.mark.parametrize(("name", "text"), [
    ("sql", "SELECT a FROM t WHERE ts > now() - interval '1' day;"),
    ("sql", "SELECT extract(year FROM d) AS y, count(*) FILTER (WHERE ok) FROM t GROUP BY 1;"),
    ("sql", "SELECT day, year FROM t;"),  # units of time stay usable as column names
    ("sql", "WITH c AS (SELECT 1 AS x) DELETE FROM t WHERE x IN (SELECT x FROM c);"),
    ("sql", "SELECT * FROM (SELECT 1 UNION ALL SELECT 2);"),
    ("sql", "SELECT * FROM generate_series(1, 3) AS g(n);"),
    ("sql", "SELECT (a, b) IN (SELECT 1, 2) FROM t;"),
])
def test_sql_added_forms(name: str, text: str) -> None:
    assert accepts(name, text)


@pytest.mark.parametrize("text", [
    "SELECT x day FROM t;",  # a unit is not an alias without AS
    "SELECT sum(x) OVER (ROWS BETWEEN UNBOUNDED AND CURRENT ROW) FROM t;",
    "SELECT a FROM t WHERE a = ANY (1, 2);",
])
def test_sql_outside_subset(text: str) -> None:
    """Refused by the grammar (invalid, or outside its documented subset)."""
    assert not accepts("sql", text)
