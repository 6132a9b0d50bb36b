"""Load a Lark grammar: lark parses the ``.lark`` text and builds the LALR(1) tables; we
compile every terminal into our own byte DFA.

lark does what it does well — the grammar language (``%import common.*``, ``%ignore``,
priorities, templates, ``?rule`` inlining) and the LALR(1) construction with its conflict
reports. The lexer is ours (:mod:`.lexer`): each terminal's Python regex is rewritten by
:mod:`.pyregex` and compiled by :mod:`.dfa`, so lexing is a DFA the constraint can walk a
whole vocabulary through.

The shipped grammars (``structspec/grammars/NAME.lark``) come with ``NAME.tables.json``:
lark's analysis and every terminal's DFAs, precomputed (``write_shipped_analysis``), so a
cold compile parses no regex and runs no LALR construction; a test keeps them current.

Every lark failure becomes :class:`structspec.errors.GrammarError` with the line and
column lark reports (or, for "undefined rule/terminal" messages that carry none, the first
place the name occurs in the text).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from structspec.automata.cache import CompileCache, disk_cache, disk_key
from structspec.automata.dfa import (
    ByteDFA,
    DFALimits,
    LazyDFA,
    compile_dfa,
    literal_dfa,
    minimized,
)
from structspec.automata.lalr import ParseTables
from structspec.automata.lexer import TerminalSpec
from structspec.automata.pyregex import to_dfa_alternatives, to_dfa_pattern
from structspec.errors import GrammarError, ResourceLimitError


@dataclass(frozen=True)
class IndenterSpec:
    """A description of a lark ``Indenter`` postlexer (Python-style INDENT/DEDENT).

    Newlines inside brackets are dropped; otherwise the newline terminal is followed by
    INDENT (indentation deeper than the current block) or by DEDENTs down to a level on the
    stack (a level not on the stack is an error). Indentation counts the spaces and tabs
    (``tab_len`` each) after the last ``\\n`` of the newline lexeme, as lark does, and a form
    feed sets the count back to 0 (CPython's tokenizer; python.lark's newline takes them).
    At end of input a final newline is implied when missing and every block is closed,
    and a last line without code is not read for indentation (a blank line to Python).
    With ``line_start`` (Python's rule, not lark's) the text begins at the start of a
    line, so indentation on its first line is an unexpected indent.

    ``tabs``: ``"count"`` is lark's rule (a tab is ``tab_len`` columns); ``"refuse"``
    (the Python preset) refuses a tab in the indentation of a line outside brackets.
    Python compares indentation twice, with tabs to the next multiple of 8 and as one
    column, and raises ``TabError`` where the two disagree; one column count cannot tell
    those lines apart (``"        a"`` then ``"\tb"`` is one level for lark, a
    ``TabError`` for Python), so the Python preset refuses tabs there rather than accept
    code Python rejects. Tabs inside brackets and in blank or comment lines stay legal.
    """

    nl_type: str = "_NEWLINE"
    open_paren_types: tuple[str, ...] = ("LPAR", "LSQB", "LBRACE")
    close_paren_types: tuple[str, ...] = ("RPAR", "RSQB", "RBRACE")
    indent_type: str = "_INDENT"
    dedent_type: str = "_DEDENT"
    tab_len: int = 8
    line_start: bool = True
    # Runtime only (the lexer and parse tables do not depend on it): not in the repr, which
    # keys the shipped tables.
    tabs: str = field(default="refuse", repr=False)

    def __post_init__(self) -> None:
        if self.tabs not in ("count", "refuse"):
            raise ValueError(f"IndenterSpec.tabs must be 'count' or 'refuse', not {self.tabs!r}")

    @classmethod
    def from_indenter(cls, indenter: Any) -> IndenterSpec:
        """Read the attributes of a lark ``Indenter`` (class or instance)."""
        return cls(indenter.NL_type, tuple(indenter.OPEN_PAREN_types),
                   tuple(indenter.CLOSE_PAREN_types), indenter.INDENT_type,
                   indenter.DEDENT_type, int(indenter.tab_len), tabs="count")

    def lark_postlex(self) -> Any:
        """An equivalent lark ``Indenter`` instance (for lark's own parser)."""
        from lark.indenter import Indenter

        spec = self

        class _Indenter(Indenter):
            NL_type = spec.nl_type
            OPEN_PAREN_types = spec.open_paren_types  # type: ignore[assignment]
            CLOSE_PAREN_types = spec.close_paren_types  # type: ignore[assignment]
            INDENT_type = spec.indent_type
            DEDENT_type = spec.dedent_type
            tab_len = spec.tab_len

        return _Indenter()


#: Indentation at or above this value holds a tab that ``tabs="refuse"`` refuses: such a
#: tab counts this many columns, and the runtime keeps any larger count at this value.
TAB_REFUSED = 1 << 24

PYTHON_INDENTER = IndenterSpec()
"""The preset for Python grammars (lark's ``PythonIndenter``)."""


@dataclass(frozen=True)
class AsiSpec:
    """ECMAScript's automatic semicolon insertion (ASI), for a grammar that declares the
    virtual terminal ``asi_type`` (``%declare _ASI``) and writes ``(";" | _ASI)`` wherever
    a statement may end (never for the empty statement or inside a ``for`` head, where
    ECMAScript inserts none).

    The runtime feeds ``_ASI`` before the next token T exactly where ECMAScript inserts a
    semicolon: T cannot be taken, and a line break came before it, or T is ``}``, or the
    input ends. Line breaks are the lexer terminals ``line_break_types`` (a newline, a
    block comment holding one): not ``%ignore``d, since they change what may follow, but
    never fed to the parser. The restricted productions: after a line break, the tokens
    ``restricted_before`` (postfix ``++``/``--``) begin a new statement where one can end,
    ``no_line_break_before`` (``=>``) is an error, and after the tokens
    ``restricted_after`` (``return``, ``break``, ``continue``, ``throw``, ``yield``) the
    statement ends (``throw`` + line break is an error: it cannot end there).

    ``error_types``: terminals used by no rule, kept in the lexer so that maximal munch
    reads their text as one (never taken) lexeme: ECMAScript's "no name or digit right
    after a number" (``3in x`` is an error, not ``3 in x``).

    ``regex_types``: the terminals of ECMAScript's "regexp goal" (``/ab+c/g``). After a
    line break the lexer may also expect what follows an inserted ``_ASI``, but where a
    ``/`` can continue the statement it is a division, as ECMAScript lexes it (``a\n/b/
    .test(x)`` is ``a / b / .test(x)``, an error), so these terminals are left out there.

    Why in the runtime and not in the grammar: whether a line break ends a statement
    depends on the token *after* it (``a\n(b)`` continues, ``a\nb`` does not), which an
    LALR(1) grammar over a lexer that drops whitespace cannot see.
    """

    asi_type: str = "_ASI"
    line_break_types: tuple[str, ...] = ("LINE_BREAK", "BLOCK_COMMENT_NL")
    close_brace: str = "}"
    restricted_before: tuple[str, ...] = ("++", "--")
    no_line_break_before: tuple[str, ...] = ("=>",)
    restricted_after: tuple[str, ...] = ("return", "break", "continue", "throw", "yield")
    regex_types: tuple[str, ...] = ("REGEX",)
    error_types: tuple[str, ...] = ("NUMBER_NAME",)


ECMASCRIPT_ASI = AsiSpec()
"""The preset for JavaScript grammars (the names ``javascript.lark`` uses)."""


@dataclass(frozen=True)
class LoadedGrammar:
    """A grammar ready for the runtime: lexer terminals, LALR tables, postlexer.

    Attributes:
        terminals: lexer terminals (ignored ones included); their index is the lexer id.
        parser_index: for each lexer terminal, its parser terminal index (or -1).
        ignore: lexer ids of ``%ignore``d terminals.
        tables: the LALR(1) tables.
        postlex: the indenter, or ``None``.
        start: the start rule.
        asi: automatic semicolon insertion (:class:`AsiSpec`), or ``None``.
        source: (text, import paths) the grammar was loaded from.

    ``lark`` (a property) is lark's own LALR parser for the same grammar, built on first use
    (for tests and error reports); it is not pickled with the rest.
    """

    terminals: tuple[TerminalSpec, ...]
    parser_index: tuple[int, ...]
    ignore: frozenset[int]
    tables: ParseTables
    postlex: IndenterSpec | None
    start: str
    source: tuple[str, tuple[str, ...]] = ("", ())
    asi: AsiSpec | None = None

    @functools.cached_property
    def lark(self) -> Any:
        """lark's own parser (``parser="lalr"``, contextual lexer, the same postlexer)."""
        return _build_lark(self.source[0], self.start, self.postlex, list(self.source[1]))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("lark", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _read(grammar: str | os.PathLike[str]) -> tuple[str, list[str]]:
    if isinstance(grammar, os.PathLike) or (
        isinstance(grammar, str) and "\n" not in grammar and grammar.endswith(".lark")
    ):
        path = Path(grammar)
        try:
            return path.read_text(encoding="utf-8"), [str(path.parent)]
        except OSError as exc:
            raise GrammarError(f"cannot read grammar file {str(path)!r}: {exc}") from exc
    return str(grammar), []


def _locate(text: str, message: str) -> tuple[int | None, int | None]:
    """Line/column for a lark message without one: where the quoted name first occurs."""
    for name in re.findall(r"'([A-Za-z_][A-Za-z_0-9]*)'", message):
        m = re.search(rf"(?<![\w\"']){re.escape(name)}(?![\w\"'])", text)
        if m:
            line = text.count("\n", 0, m.start()) + 1
            return line, m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
    return None, None


@contextlib.contextmanager
def _lark_errors(text: str) -> Iterator[None]:
    """lark's exceptions as :class:`GrammarError` with line/column."""
    from lark.exceptions import GrammarError as LarkGrammarError
    from lark.exceptions import LarkError, UnexpectedInput

    try:
        yield
    except UnexpectedInput as exc:
        raise GrammarError(f"grammar syntax error: {str(exc).strip().splitlines()[0]}",
                           getattr(exc, "line", None), getattr(exc, "column", None)) from exc
    except LarkGrammarError as exc:
        msg = str(exc).strip()
        m = re.search(r"line (\d+)(?:,? col(?:umn)? (\d+))?", msg)
        line, col = (int(m.group(1)), int(m.group(2)) if m.group(2) else None) if m \
            else _locate(text, msg)
        first = msg.splitlines()[0] if msg else "?"
        first = "invalid grammar: " + re.sub(r",? at line \d+ col(?:umn)? \d+", "", first)
        if "collision" in msg.lower():
            rules = re.findall(r"<([^>]*)>", msg)
            first = "the grammar is not LALR(1): " + msg.splitlines()[0].rstrip(": ")
            if rules:
                first += " " + " | ".join(rules)
                found = [m.start() for r in rules for m in [re.search(
                    rf"^[?!]?{re.escape(r.split(':')[0].strip())}\s*(?:\.\d+)?\s*:", text,
                    re.M)] if m]
                if found:  # the first of the colliding rules in the text
                    line, col = text.count("\n", 0, min(found)) + 1, 1
        raise GrammarError(first, line, col) from exc
    except (LarkError, KeyError, AssertionError) as exc:
        msg = str(exc).strip() or type(exc).__name__
        line, col = _locate(text, msg)
        raise GrammarError(f"invalid grammar: {msg.splitlines()[0]}", line, col) from exc


def _build_lark(text: str, start: str, postlex: IndenterSpec | None,
                import_paths: list[str]) -> Any:
    import lark

    with _lark_errors(text):
        return lark.Lark(text, parser="lalr", lexer="contextual", start=start,
                         postlex=postlex.lark_postlex() if postlex else None,
                         import_paths=import_paths, maybe_placeholders=False)


def _asi_of(text: str) -> AsiSpec | None:
    """ECMAScript's ASI where the grammar declares its virtual ``_ASI`` terminal."""
    return ECMASCRIPT_ASI if re.search(r"%declare[^\n]*\b_ASI\b", text) else None


def _analyze(text: str, start: str, postlex: IndenterSpec | None,
             import_paths: list[str]) -> dict[str, Any]:
    """What the runtime needs from lark, as plain data (JSON-able): the terminals (name,
    pattern, lark's tie-breaking attributes), the ``%ignore``d names and the LALR(1)
    tables. lark's grammar loader and its LALR analysis, without building a ``Lark``
    object (its contextual lexer and regex validation are not needed: our lexer is ours)."""
    from lark.common import ParserConf
    from lark.lexer import PatternStr
    from lark.load_grammar import load_grammar as lark_load_grammar
    from lark.parsers.lalr_analysis import IntParseTable, LALR_Analyzer

    with _lark_errors(text):
        grammar, _ = lark_load_grammar(text, "<grammar>", import_paths, False)
        keep = {postlex.nl_type} if postlex is not None else set()
        asi = _asi_of(text)
        if asi is not None:  # line breaks are used by no rule: lark would drop them
            keep |= set(asi.line_break_types) | set(asi.error_types)
        terminals, rules, ignore = grammar.compile([start], keep)
        analysis = LALR_Analyzer(ParserConf(rules, {}, [start]), debug=False, strict=False)
        analysis.compute_lalr()
        table = IntParseTable.from_ParseTable(analysis.parse_table)
    terms = []
    for t in terminals:
        pat = t.pattern
        is_string = isinstance(pat, PatternStr)
        with _lark_errors(text):
            widths = (pat.min_width, min(pat.max_width, 1 << 30))
        terms.append({
            "name": t.name, "is_string": is_string, "priority": int(t.priority),
            "literal": pat.value if is_string and not pat.flags else None,
            "regexp": None if is_string and not pat.flags else pat.to_regexp(),
            "min_width": int(widths[0]), "max_width": int(widths[1]),
            "pattern_len": len(pat.value)})
    tables = ParseTables.from_lark(table, start, [t["name"] for t in terms])
    return {"terminals": terms, "ignore": sorted(ignore), "tables": {
        "terminals": list(tables.terminals),
        "actions": [[x for kv in sorted(row.items()) for x in kv] for row in tables.actions],
        "gotos": [dict(sorted(row.items())) for row in tables.gotos],
        "rule_len": list(tables.rule_len), "rule_lhs": list(tables.rule_lhs),
        "start_state": tables.start_state, "end_state": tables.end_state}}


def _tables(data: dict[str, Any]) -> ParseTables:
    return ParseTables(tuple(data["terminals"]),
                       tuple(dict(zip(row[::2], row[1::2])) for row in data["actions"]),
                       tuple(data["gotos"]), tuple(data["rule_len"]), tuple(data["rule_lhs"]),
                       int(data["start_state"]), int(data["end_state"]))


def analysis_key(text: str, start: str, postlex: IndenterSpec | None) -> str:
    """The key a shipped analysis is stored under: the grammar text, start rule,
    postlexer and lark's version (a new lark may build other tables)."""
    import lark

    return hashlib.sha256(repr((text, start, repr(postlex), lark.__version__)).encode()
                          ).hexdigest()


def shipped_analysis_path(grammar_file: Path) -> Path:
    """Where the precomputed analysis of a shipped grammar lives (``NAME.tables.json``)."""
    return grammar_file.with_name(grammar_file.stem + ".tables.json")


def write_shipped_analysis(grammar_file: Path, *, reuse: bool = True) -> Path:
    """(Re)compute the analysis of the shipped grammar ``grammar_file`` — lark's tables and
    terminals, and every terminal's DFAs fully built and minimized — and write it next to
    it (``python -m structspec.automata.lark_grammar [--rebuild] NAME``). Returns the path.

    ``reuse``: keep the DFAs of the file already there for every terminal whose pattern
    (regexp, literal, DFA format) is unchanged — python.lark's f-string terminals take
    ~25 minutes to build and minimize, so an edit to one small terminal should not
    rebuild them. ``--rebuild`` (after a change to the DFA compiler) builds them all."""
    text, import_paths = _read(grammar_file)
    start, postlex = _options(text, None, "auto")
    data = {"key": analysis_key(text, start, postlex), "layout": LAYOUT,
            **_analyze(text, start, postlex, import_paths)}
    out = shipped_analysis_path(grammar_file)
    before: dict[str, Any] = {}
    if reuse:
        try:
            old = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        if old.get("dfas", {}).get("format") == DFA_FORMAT:
            pattern = {t["name"]: (t["regexp"], t["literal"]) for t in old["terminals"]}
            before = {name: (pattern[name], dfas)
                      for name, dfas in old["dfas"]["terminals"].items() if name in pattern}

    def dfas_of(t: dict[str, Any]) -> list[dict[str, Any]]:
        kept = before.get(t["name"])
        if kept is not None and kept[0] == (t["regexp"], t["literal"]):
            return kept[1]
        return [encode_dfa(d) for d in eager_terminal_dfas(t)]

    data["dfas"] = {"format": DFA_FORMAT,
                    "terminals": {t["name"]: dfas_of(t) for t in data["terminals"]}}
    out.write_text(json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n",
                   encoding="utf-8")
    return out


# -- shipped terminal DFAs -----------------------------------------------------------------

LAYOUT = 2
"""Version of the shipped file's layout (2: each state's actions as one flat list
``[terminal, code, terminal, code, ...]`` — one list per state, not one per action: a
JSON parse of python.lark's tables then allocates ~2,000 containers instead of ~50,000,
and seldom sets off a full pass of the cyclic GC inside a compile)."""

DFA_FORMAT = 1
"""Version of :func:`encode_dfa`'s layout; shipped DFAs of another version are ignored."""


def encode_dfa(d: ByteDFA) -> dict[str, Any]:
    """``d`` as JSON-able data: its start, accepting states, the byte classes its table
    does not tell apart (``uint8 [256]``) and the table per class (``int32 [n, C]``,
    zlib-compressed), both base64. Small: a 2,000-state f-string DFA has ~50 classes."""
    cols, class_of = np.unique(d.table.T, axis=0, return_inverse=True)  # [C, n], [256]
    table = np.ascontiguousarray(cols.T, dtype="<i4")  # [n, C]

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    return {"start": int(d.start), "n": int(table.shape[0]),
            "accepting": np.flatnonzero(d.accepting).tolist(),
            "classes": b64(class_of.reshape(-1).astype(np.uint8).tobytes()),
            "table": b64(zlib.compress(table.tobytes(), 9))}


def decode_dfa(data: dict[str, Any]) -> ByteDFA:
    """The :class:`ByteDFA` of :func:`encode_dfa`'s ``data``."""
    n = int(data["n"])
    classes = np.frombuffer(base64.b64decode(data["classes"]), dtype=np.uint8)  # [256]
    cols = np.frombuffer(zlib.decompress(base64.b64decode(data["table"])), dtype="<i4")
    # (the gather is already a fresh native int32 array: no second copy — python.lark's
    # two string DFAs hold ~51k states, 53 MB each at 256 columns)
    table = cols.reshape(n, -1)[:, classes].astype(np.int32, copy=False)  # [n, 256]
    accepting = np.zeros(n, dtype=bool)
    accepting[data["accepting"]] = True
    return ByteDFA(table, accepting, int(data["start"]))


def eager_terminal_dfas(term: dict[str, Any]) -> tuple[ByteDFA, ...]:
    """A terminal's DFAs as :func:`_terminal_dfas` splits them, every :class:`LazyDFA`
    built in full and minimized (seconds for python.lark's f-strings: build time only)."""
    out = []
    for d in _terminal_dfas(term):
        if isinstance(d, LazyDFA):
            d = minimized(compile_dfa(d.pattern, DFALimits(
                max_states=1 << 20, max_nfa_states=1 << 26, max_seconds=3600)), 1 << 20)
        out.append(d)
    return tuple(out)


def _shipped_dfas(data: dict[str, Any], name: str) -> tuple[ByteDFA, ...] | None:
    """The shipped DFAs of terminal ``name``, when ``data`` has them in this format."""
    dfas = data.get("dfas")
    if not dfas or dfas.get("format") != DFA_FORMAT or name not in dfas["terminals"]:
        return None
    return tuple(decode_dfa(d) for d in dfas["terminals"][name])


def _shipped(grammar: str | os.PathLike[str], text: str, start: str,
             postlex: IndenterSpec | None) -> dict[str, Any] | None:
    """The precomputed analysis of a shipped grammar, when it is current."""
    from structspec.grammars import _HERE

    if not (isinstance(grammar, os.PathLike) or "\n" not in str(grammar)):
        return None
    path = Path(grammar).resolve()
    if path.parent != _HERE:
        return None
    try:
        data = json.loads(shipped_analysis_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("layout") != LAYOUT:
        return None
    return data if data.get("key") == analysis_key(text, start, postlex) else None


def _terminal_dfas(term: dict[str, Any]) -> tuple[ByteDFA, ...]:
    """The DFA(s) of a terminal: one, or — when one DFA would be too large — one per
    alternative of its top-level alternation, united lazily by the lexer. A very long
    alternative becomes a :class:`LazyDFA`, built where text goes."""
    name = term["name"]
    if term["literal"] is None and term["min_width"] == 0:
        raise GrammarError(f"terminal {name} is zero-width (it matches the empty string)")
    try:
        if term["literal"] is not None:
            dfas: tuple[ByteDFA, ...] = (literal_dfa(term["literal"].encode()),)
        else:  # to_regexp() carries the flags inline, as (?i:...)
            dfas = _split_compile(term["regexp"], 0)
    except GrammarError as exc:
        raise GrammarError(f"terminal {name}: {exc}") from exc
    except ResourceLimitError as exc:
        raise ResourceLimitError(f"terminal {name}: {exc}") from exc
    dfas = tuple(d for d in dfas if not d.is_empty())
    if not dfas:
        raise GrammarError(f"terminal {name} matches nothing")
    if any(d.accepting[d.start] for d in dfas):
        raise GrammarError(f"terminal {name} matches the empty string")
    return dfas


def _split_compile(regexp: str, depth: int) -> tuple[ByteDFA, ...]:
    if len(regexp) >= _SPLIT_CHARS:
        alternatives = top_alternatives(regexp)
        if len(alternatives) > 1:
            return tuple(d for alt in alternatives for d in _split_compile(alt, depth + 1))
        if depth > 0 and not _RISKY.search(regexp):
            # One long alternative: build it where text goes. Its pattern is rewritten
            # on first use (the terminal's min_width > 0 says its start does not accept;
            # _RISKY keeps constructs our compiler refuses on the eager path, so their
            # errors surface at load time).
            return (LazyDFA(functools.partial(to_dfa_pattern, regexp), start_accepts=False,
                            prefix=_prefix_dfa(regexp)),)
    alternatives = to_dfa_alternatives(regexp)
    try:
        return (compile_dfa(alternatives[0] if len(alternatives) == 1
                            else to_dfa_pattern(regexp)),)
    except ResourceLimitError:
        if len(alternatives) < 2 or depth > 4:
            raise
    return tuple(d for alt in alternatives for d in _split_compile(alt, depth + 1))


_SPLIT_CHARS = 20_000  # longer regexes: compiled one alternative at a time, long ones lazily
# Constructs refused by pyregex/dfa (look-arounds, back-references, \b, atomic groups,
# possessive repeats, conditionals): a lazily built alternative must not contain them.
_RISKY = re.compile(r"\(\?(?:[=!>]|<[=!]|P=|\()|\\[bB1-9]|[*+?}]\+")


def _prefix_dfa(regexp: str) -> ByteDFA | None:
    """A small DFA of prefixes every match of ``regexp`` begins with: its first atom, then
    the first atom of each top-level alternative of its second atom (``[fF]`` then one of
    the quotes, for an f-string). ``None`` when that is not cheap to tell."""
    first = _atom(regexp)
    if first is None:
        return None
    nxt = _atom(regexp[len(first):], long_group=True)
    if nxt is not None:
        heads = [_atom(alt) for alt in top_alternatives(nxt)]
        if all(heads):
            first += "(?:" + "|".join(h for h in heads if h) + ")"
    try:
        d = compile_dfa(to_dfa_pattern(first))
    except (GrammarError, ResourceLimitError):
        return None
    return None if d.is_empty() or d.accepting[d.start] else d


def _atom(regexp: str, long_group: bool = False) -> str | None:
    """The text of ``regexp``'s first atom when it is a class, a group (at most 2,000
    characters unless ``long_group``) or one literal character, not quantified."""
    if regexp.startswith("["):
        end = _class_end(regexp, 0)
    elif regexp.startswith("(?:"):
        depth, i, end = 0, 0, -1
        limit = len(regexp) if long_group else 2000
        while i < min(len(regexp), limit):
            c = regexp[i]
            if c == "\\":
                i += 2
                continue
            if c == "[":
                i = _class_end(regexp, i)
                if i < 0:
                    return None
                continue
            depth += c == "("
            depth -= c == ")"
            i += 1
            if depth == 0:
                end = i
                break
    elif regexp[:1].isalnum() or regexp[:1] in "\"'`#,;:=<>!%&/@~ -":
        end = 1
    elif regexp[:1] == "\\" and regexp[1:2] and not regexp[1:2].isalnum():
        end = 2
    else:
        return None
    if end <= 0 or regexp[end:end + 1] in ("*", "?", "+", "{"):
        return None
    return regexp[:end]


def _class_end(regexp: str, i: int) -> int:
    """The index just after the character class that opens at ``regexp[i]``."""
    i += 1
    if regexp.startswith("^", i):
        i += 1
    if regexp.startswith("]", i):
        i += 1
    while i < len(regexp):
        if regexp[i] == "\\":
            i += 2
            continue
        if regexp[i] == "]":
            return i + 1
        i += 1
    return -1


def top_alternatives(regexp: str) -> list[str]:
    """``regexp`` split at its top-level ``|`` (outer ``(?:...)`` groups unwrapped), by a
    linear scan of the text — no regex parse, which costs ~0.1 s per 50,000 characters.
    ``[regexp]`` when it is not an alternation. Pure."""
    while True:
        parts, depth, i, cut, n = [], 0, 0, 0, len(regexp)
        closes_at = -1  # where the group opened at position 0 closes
        in_class = False
        while i < n:
            c = regexp[i]
            if c == "\\":
                i += 2
                continue
            if in_class:
                if c == "]":
                    in_class = False
            elif c == "[":
                in_class = True
                if regexp.startswith("^]", i + 1):
                    i += 2
                elif regexp.startswith("]", i + 1):
                    i += 1
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0 and closes_at < 0 and regexp[0] == "(":
                    closes_at = i
            elif c == "|" and depth == 0:
                parts.append(regexp[cut:i])
                cut = i + 1
            i += 1
        parts.append(regexp[cut:])
        if len(parts) > 1:
            return parts
        if regexp.startswith("(?:") and closes_at == n - 1:
            regexp = regexp[3:-1]
            continue
        return [regexp]


def _header(text: str) -> dict[str, str]:
    """Options from a ``// structspec: key=value ...`` comment in the grammar's head."""
    for line in text.splitlines()[:20]:
        m = re.match(r"\s*//\s*structspec:\s*(.*)", line)
        if m:
            return dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
    return {}


def load_grammar(grammar: str | os.PathLike[str], *, start: str | None = None,
                 postlex: IndenterSpec | str | Any | None = "auto",
                 cache: bool = True) -> LoadedGrammar:
    """Load ``grammar`` (Lark text, or a path to a ``.lark`` file) for the runtime.

    Args:
        grammar: Lark grammar text, or a path (``%import`` resolves next to the file).
        start: the start rule; default: the grammar's ``// structspec: start=NAME`` header
            comment (within its first 20 lines), else ``"start"``.
        postlex: ``"auto"`` (the header's ``postlex=python|none`` if any, else the Python
            indenter when the grammar declares ``_INDENT`` and ``_DEDENT``), ``"python"``,
            ``None``, an :class:`IndenterSpec`, or a lark ``Indenter`` class/instance.
        cache: reuse (and store) the loaded grammar in the disk compile cache
            (:mod:`.cache`; keyed by the text, options and the lark and structspec
            versions): lark's LALR analysis and the terminal DFAs are paid once.

    Raises:
        GrammarError: syntax errors, undefined rules/terminals, LALR(1) conflicts,
            terminals our DFA compiler refuses (look-arounds, back-references…).
    """
    text, import_paths = _read(grammar)
    start, postlex = _options(text, start, postlex)
    import lark

    key = disk_key("lark-grammar", text, start, repr(postlex), tuple(import_paths),
                   lark.__version__)
    if not cache:
        return _load(grammar, text, start, postlex, import_paths, None, key)
    # In this process, once (concurrent callers wait for the first); across processes, from
    # the disk cache when it is on.
    loaded = _LOADED.get_or_compile(
        key, lambda: _load(grammar, text, start, postlex, import_paths, disk_cache(), key))
    # The key leaves out IndenterSpec.tabs (runtime only): the analysis is shared, the
    # indenter is the caller's.
    return loaded if loaded.postlex == postlex else dataclasses.replace(loaded, postlex=postlex)


def _options(text: str, start: str | None, postlex: IndenterSpec | str | Any | None
             ) -> tuple[str, IndenterSpec | None]:
    """The start rule and postlexer, defaults from the grammar's header comment."""
    header = _header(text)
    if start is None:
        start = header.get("start", "start")
    if postlex == "auto" and "postlex" in header:
        postlex = None if header["postlex"] in ("none", "None") else header["postlex"]
    if postlex == "auto":
        postlex = PYTHON_INDENTER if re.search(r"%declare[^\n]*\b_INDENT\b", text) and \
            re.search(r"%declare[^\n]*\b_DEDENT\b", text) else None
    elif postlex == "python":
        postlex = PYTHON_INDENTER
    elif postlex is not None and not isinstance(postlex, IndenterSpec):
        postlex = IndenterSpec.from_indenter(postlex)
    assert postlex is None or isinstance(postlex, IndenterSpec)
    return start, postlex


_LOADED: CompileCache[LoadedGrammar] = CompileCache(maxsize=16)


def _load(grammar: str | os.PathLike[str], text: str, start: str,
          postlex: IndenterSpec | None, import_paths: list[str], disk: Any, key: str
          ) -> LoadedGrammar:
    if disk is not None:
        got = disk.load(key, None)
        if isinstance(got, LoadedGrammar):
            return got
    # A shipped grammar comes with its analysis and terminal DFAs precomputed (checked by
    # a test); any other grammar is analyzed by lark and compiled here.
    data = _shipped(grammar, text, start, postlex) or \
        _analyze(text, start, postlex, import_paths)
    terms = data["terminals"]
    specs: list[TerminalSpec] = []
    for t in terms:
        dfas = _shipped_dfas(data, t["name"]) or _terminal_dfas(t)
        specs.append(TerminalSpec(t["name"], dfas[0], t["priority"], t["is_string"],
                                  t["max_width"], t["pattern_len"], dfas[1:]))
    tables = _tables(data["tables"])
    parser_index = tuple(tables.index.get(t["name"], -1) for t in terms)
    ignore_names = set(data["ignore"])
    ignore = frozenset(i for i, t in enumerate(terms) if t["name"] in ignore_names)
    lark_terms = [t["name"] for t in terms]
    if postlex is not None:
        names = set(lark_terms)
        if postlex.nl_type not in names:
            raise GrammarError(f"the indenter's newline terminal {postlex.nl_type} is not "
                               "defined by the grammar")
        if any(s.extra for s in specs if s.name == postlex.nl_type):
            raise GrammarError(f"the newline terminal {postlex.nl_type} is too large")
        for name in (postlex.indent_type, postlex.dedent_type):
            if name not in tables.index:
                raise GrammarError(f"the grammar does not use the indenter's {name}")
    asi = _asi_of(text)
    if asi is not None:
        if postlex is not None:
            raise GrammarError("a grammar cannot have both an indenter and _ASI")
        missing = [n for n in asi.line_break_types if n not in set(lark_terms)]
        if missing or asi.asi_type not in tables.index:
            raise GrammarError(f"a grammar that declares {asi.asi_type} must use it in a rule "
                               f"and define the line-break terminals "
                               f"{', '.join(asi.line_break_types)}")
    loaded = LoadedGrammar(tuple(specs), parser_index, ignore, tables, postlex, start,
                           (text, tuple(import_paths)), asi)
    if disk is not None:
        disk.remember(key, loaded)  # written at the cache's flush, off the compile path
    return loaded


__all__ = ["ECMASCRIPT_ASI", "PYTHON_INDENTER", "AsiSpec", "IndenterSpec", "LoadedGrammar",
           "load_grammar"]


if __name__ == "__main__":  # python -m structspec.automata.lark_grammar python
    import sys

    from structspec.grammars import grammar_path

    names = [a for a in sys.argv[1:] if a != "--rebuild"]
    for name in names:
        print(write_shipped_analysis(grammar_path(name), reuse="--rebuild" not in sys.argv))
