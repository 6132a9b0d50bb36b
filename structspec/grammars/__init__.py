"""The Lark grammars shipped with structspec, as package data.

``structspec generate --grammar python`` and ``compile_grammar(grammar_path("python"))``
find them here. Each ``NAME.lark`` declares the options it needs on its first line::

    // structspec: postlex=python start=file_input

``postlex=python`` means lark's ``PythonIndenter`` (``_NEWLINE``/``_INDENT``/``_DEDENT``);
``start`` is the start rule. :func:`grammar_options` reads that line, so a loader needs no
table of its own, and a grammar dropped into this folder documents itself.

Import-light (no lark, no torch); every function is pure and thread-safe.
"""

from __future__ import annotations

from pathlib import Path

from structspec.errors import GrammarError

_HERE = Path(__file__).resolve().parent
_HEADER = "// structspec:"


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
    if not first.startswith(_HEADER):
        return options
    for item in first[len(_HEADER):].split():
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise GrammarError(f"{path.name}: malformed option {item!r} in its header", line=1)
        options[key] = value
    return options
