"""The Lark grammars shipped with structspec, as package data.

``structspec generate --grammar python`` and ``compile_grammar(grammar_path("python"))``
find them here. Each ``NAME.lark`` declares the options it needs on its first line::

    // structspec: postlex=python start=file_input

``postlex=python`` means lark's ``PythonIndenter`` (``_NEWLINE``/``_INDENT``/``_DEDENT``);
``start`` is the start rule. :func:`grammar_options` reads that line, so a loader needs no
table of its own, and a grammar dropped into this folder documents itself.

``stop_statement=RULE[,RULE]`` and ``stop_block=RULE[,RULE]`` name the rules whose nodes
are statements and blocks for fill-in-the-middle's ``stop="statement"``/``"block"``
(:mod:`structspec.automata.lark_stops`); ``stop_terminators=NAME[,NAME]`` the terminals that
end a statement from outside its rule (SQL's ``SEMICOLON``) or separate the statements of
one node (Python's ``;`` in a ``simple_stmt``). The shipped grammars get theirs from
``STOP_RULES`` below (kept out of their headers: python.lark's precomputed LALR tables are
keyed by its text); a header's own values win.

Import-light (no lark, no torch); every function is pure and thread-safe.
"""

from __future__ import annotations

import functools
from pathlib import Path

from structspec.errors import GrammarError

_HERE = Path(__file__).resolve().parent
_HEADER = "// structspec:"

STOP_RULES: dict[str, dict[str, str]] = {
    # a simple statement (ending in its NEWLINE) or a compound one; a block is an
    # indented (or one-line) suite
    "python": {"stop_statement": "stmt,simple_stmt", "stop_block": "suite",
               # `a = 1; b = 2`: statements of one line, one simple_stmt node
               "stop_terminators": "SEMICOLON"},
    # statements, and class members between them; blocks: `{...}` bodies and class bodies
    "javascript": {"stop_statement": "_stmt,class_member", "stop_block": "block,class_body"},
    # one statement (its `;` is the separator that follows it); SQL has no blocks
    "sql": {"stop_statement": "statement", "stop_terminators": "SEMICOLON"},
}
"""The stop rules of the shipped grammars (see the module doc)."""


def available() -> list[str]:
    """Names of the shipped grammars, sorted (e.g. ``["json", "python", "sql"]``)."""
    return sorted(p.stem for p in _HERE.glob("*.lark"))


def grammar_path(name: str) -> Path:
    """The path of the shipped grammar ``name`` (``"python"``, ``"python.lark"`` also works).

    Raises:
        GrammarError: no grammar of that name ships; the message lists the known ones.
    """
    stem = name[: -len(".lark")] if name.endswith(".lark") else name
    path = _HERE / f"{stem}.lark"
    if "/" in stem or "\\" in stem or not path.is_file():
        known = ", ".join(available())
        raise GrammarError(f"no shipped grammar named {name!r} (known: {known})")
    return path


def grammar_options(name: str) -> dict[str, str]:
    """The options the first line of grammar ``name`` declares.

    Returns:
        e.g. ``{"postlex": "python", "start": "file_input"}``; ``{"start": "start"}`` when
        the grammar declares nothing.

    Raises:
        GrammarError: unknown grammar, or a malformed ``// structspec:`` line.
    """
    path = grammar_path(name)
    with path.open(encoding="utf-8") as f:
        first = f.readline().strip()
    options = {"start": "start"}
    options.update(_parse_header(first, path.name))
    return options


def _parse_header(first: str, where: str) -> dict[str, str]:
    if not first.startswith(_HEADER):
        return {}
    options = {}
    for item in first[len(_HEADER):].split():
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise GrammarError(f"{where}: malformed option {item!r} in its header", line=1)
        options[key] = value
    return options


def header_options(text: str) -> dict[str, str]:
    """The options of grammar *text*: its ``// structspec:`` first line, over the stop
    rules of the shipped grammar it is (when its text is a shipped grammar's, see
    ``STOP_RULES``). Pure.

    Raises:
        GrammarError: a malformed ``// structspec:`` line.
    """
    name = _shipped_texts().get(text)
    options = dict(STOP_RULES.get(name, {})) if name else {}
    first = text.lstrip("\ufeff").split("\n", 1)[0].strip()
    options.update(_parse_header(first, "the grammar"))
    return options


@functools.lru_cache(maxsize=1)
def _shipped_texts() -> dict[str, str]:
    return {(_HERE / f"{n}.lark").read_text(encoding="utf-8"): n for n in available()}
