"""Load a Lark grammar: lark parses the ``.lark`` text and builds the LALR(1) tables; we
compile every terminal into our own byte DFA.

lark does what it does well — the grammar language (``%import common.*``, ``%ignore``,
priorities, templates, ``?rule`` inlining) and the LALR(1) construction with its conflict
reports. The lexer is ours (:mod:`.lexer`): each terminal's Python regex is rewritten by
:mod:`.pyregex` and compiled by :mod:`.dfa`, so lexing is a DFA the constraint can walk a
whole vocabulary through.

Every lark failure becomes :class:`structspec.errors.GrammarError` with the line and
column lark reports (or, for "undefined rule/terminal" messages that carry none, the first
place the name occurs in the text).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structspec.automata.cache import CompileCache, disk_cache, disk_key
from structspec.automata.dfa import ByteDFA, compile_dfa, literal_dfa
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
    (``tab_len`` each) after the last ``\\n`` of the newline lexeme, exactly as lark does.
    At end of input a final newline is implied when missing and every block is closed.
    With ``line_start`` (Python's rule, not lark's) the text begins at the start of a
    line, so indentation on its first line is an unexpected indent.
    """

    nl_type: str = "_NEWLINE"
    open_paren_types: tuple[str, ...] = ("LPAR", "LSQB", "LBRACE")
    close_paren_types: tuple[str, ...] = ("RPAR", "RSQB", "RBRACE")
    indent_type: str = "_INDENT"
    dedent_type: str = "_DEDENT"
    tab_len: int = 8
    line_start: bool = True

    @classmethod
    def from_indenter(cls, indenter: Any) -> IndenterSpec:
        """Read the attributes of a lark ``Indenter`` (class or instance)."""
        return cls(indenter.NL_type, tuple(indenter.OPEN_PAREN_types),
                   tuple(indenter.CLOSE_PAREN_types), indenter.INDENT_type,
                   indenter.DEDENT_type, int(indenter.tab_len))

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


PYTHON_INDENTER = IndenterSpec()
"""The preset for Python grammars (lark's ``PythonIndenter``)."""


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


def _build_lark(text: str, start: str, postlex: IndenterSpec | None,
                import_paths: list[str]) -> Any:
    import lark
    from lark.exceptions import GrammarError as LarkGrammarError
    from lark.exceptions import LarkError, UnexpectedInput

    try:
        return lark.Lark(text, parser="lalr", lexer="contextual", start=start,
                         postlex=postlex.lark_postlex() if postlex else None,
                         import_paths=import_paths, maybe_placeholders=False)
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


def _terminal_dfas(term: Any) -> tuple[ByteDFA, ...]:
    """The DFA(s) of a lark terminal: one, or — when one DFA would exceed the state budget
    — one per alternative of its top-level alternation (recursively), united lazily by the
    lexer."""
    from lark.lexer import PatternStr

    pattern = term.pattern
    try:
        if isinstance(pattern, PatternStr) and not pattern.flags:
            dfas: tuple[ByteDFA, ...] = (literal_dfa(pattern.value.encode()),)
        else:  # to_regexp() carries the flags inline, as (?i:...)
            dfas = _split_compile(pattern.to_regexp(), 0)
    except GrammarError as exc:
        raise GrammarError(f"terminal {term.name}: {exc}") from exc
    except ResourceLimitError as exc:
        raise ResourceLimitError(f"terminal {term.name}: {exc}") from exc
    dfas = tuple(d for d in dfas if not d.is_empty())
    if not dfas:
        raise GrammarError(f"terminal {term.name} matches nothing")
    if any(d.accepting[d.start] for d in dfas):
        raise GrammarError(f"terminal {term.name} matches the empty string")
    return dfas


def _split_compile(regexp: str, depth: int) -> tuple[ByteDFA, ...]:
    alternatives = to_dfa_alternatives(regexp)
    if len(regexp) < _SPLIT_CHARS or len(alternatives) < 2:
        try:
            return (compile_dfa(alternatives[0] if len(alternatives) == 1
                                else to_dfa_pattern(regexp)),)
        except ResourceLimitError:
            if len(alternatives) < 2 or depth > 4:
                raise
    return tuple(d for alt in alternatives for d in _split_compile(alt, depth + 1))


_SPLIT_CHARS = 20_000  # longer alternations are compiled one alternative at a time


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
    import lark

    key = disk_key("lark-grammar", text, start, repr(postlex), tuple(import_paths),
                   lark.__version__)
    if not cache:
        return _load(text, start, postlex, import_paths, None, key)
    # In this process, once (concurrent callers wait for the first); across processes, from
    # the disk cache when it is on.
    return _LOADED.get_or_compile(
        key, lambda: _load(text, start, postlex, import_paths, disk_cache(), key))


_LOADED: CompileCache[LoadedGrammar] = CompileCache(maxsize=16)


def _load(text: str, start: str, postlex: IndenterSpec | None, import_paths: list[str],
          disk: Any, key: str) -> LoadedGrammar:
    if disk is not None:
        got = disk.load(key, None)
        if isinstance(got, LoadedGrammar):
            return got
    parser = _build_lark(text, start, postlex, import_paths)
    lark_terms = list(parser.terminals)
    ignore_names = set(parser.ignore_tokens)
    specs: list[TerminalSpec] = []
    for t in lark_terms:
        from lark.lexer import PatternStr

        dfas = _terminal_dfas(t)
        specs.append(TerminalSpec(
            t.name, dfas[0], int(t.priority), isinstance(t.pattern, PatternStr),
            int(min(t.pattern.max_width, 1 << 30)), len(t.pattern.value), dfas[1:]))
    try:
        table = parser.parser.parser.parser.parse_table
    except AttributeError as exc:  # pragma: no cover - lark internals moved
        raise GrammarError("this lark version does not expose its LALR tables") from exc
    tables = ParseTables.from_lark(table, start, [t.name for t in lark_terms])
    parser_index = tuple(tables.index.get(t.name, -1) for t in lark_terms)
    ignore = frozenset(i for i, t in enumerate(lark_terms) if t.name in ignore_names)
    if postlex is not None:
        names = {t.name for t in lark_terms}
        if postlex.nl_type not in names:
            raise GrammarError(f"the indenter's newline terminal {postlex.nl_type} is not "
                               "defined by the grammar")
        if any(s.extra for s in specs if s.name == postlex.nl_type):
            raise GrammarError(f"the newline terminal {postlex.nl_type} is too large")
        for name in (postlex.indent_type, postlex.dedent_type):
            if name not in tables.index:
                raise GrammarError(f"the grammar does not use the indenter's {name}")
    loaded = LoadedGrammar(tuple(specs), parser_index, ignore, tables, postlex, start,
                           (text, tuple(import_paths)))
    loaded.__dict__["lark"] = parser  # already built: keep it
    if disk is not None:
        disk.remember(key, loaded)  # written at the cache's flush, off the compile path
    return loaded


__all__ = ["PYTHON_INDENTER", "IndenterSpec", "LoadedGrammar", "load_grammar"]
