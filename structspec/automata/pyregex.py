"""Python ``re`` patterns (with flags) -> flag-free patterns that :func:`.dfa.compile_dfa` takes.

Lark terminals are Python regexes: ``\\w`` and ``\\d`` mean the *Unicode* classes, ``.``
excludes only ``\\n``, and flags (``i``, ``s``, ``x``, ``m``, ``a``, scoped as ``(?i:...)``) are
common. :mod:`.dfa` deliberately speaks a JSON/ECMA dialect without flags, so a lark
terminal is first rewritten here into an equivalent pattern built only from explicit
code-point classes, groups, alternation and repetition — then the same DFA compiler serves
both worlds and a lexeme means what lark's own lexer would match.

Departures (documented, rare in grammars): ``IGNORECASE`` on a character *range* wider
than 4096 code points keeps the range as written (such ranges almost always contain both
cases already); case folding uses ``str.lower``/``str.upper`` of single characters.
Look-arounds, back-references, ``\\b``/``\\B``, atomic groups and possessive repeats raise
:class:`GrammarError`.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from structspec.automata.byte_nfa import MAX_CODEPOINT, Ranges, complement, normalize
from structspec.errors import GrammarError

try:  # Python >= 3.11
    import re._constants as _sre
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_MAX = MAX_CODEPOINT
_UNSUPPORTED = {
    "ASSERT": "look-arounds", "ASSERT_NOT": "look-arounds", "GROUPREF": "back-references",
    "GROUPREF_EXISTS": "conditional groups", "ATOMIC_GROUP": "atomic groups",
    "POSSESSIVE_REPEAT": "possessive repeats",
}


_normalize = normalize
_complement = complement


_ALL_CHARS = ""  # every code point in order, built on first use


@functools.cache
def _unicode_class(name: str) -> tuple[tuple[int, int], ...]:
    """Python's Unicode meaning of ``\\w``, ``\\d``, ``\\s``: the runs of code points the
    ``re`` module itself matches (one C-speed scan, cached per process)."""
    global _ALL_CHARS
    if not _ALL_CHARS:
        _ALL_CHARS = "".join(map(chr, range(_MAX + 1)))
    out: Ranges = []
    for m in re.finditer("\\" + name + "+", _ALL_CHARS):
        lo, hi = m.start(), m.end() - 1
        if lo <= 0xDFFF and hi >= 0xD800:  # no surrogates in UTF-8
            out += [r for r in ((lo, 0xD7FF), (0xE000, hi)) if r[0] <= r[1]]
        else:
            out.append((lo, hi))
    return tuple(out)


_ASCII = {
    "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "d": [(0x30, 0x39)],
    "s": [(0x09, 0x0D), (0x20, 0x20)],
}
_CATS = {
    _sre.CATEGORY_WORD: ("w", False), _sre.CATEGORY_NOT_WORD: ("w", True),
    _sre.CATEGORY_DIGIT: ("d", False), _sre.CATEGORY_NOT_DIGIT: ("d", True),
    _sre.CATEGORY_SPACE: ("s", False), _sre.CATEGORY_NOT_SPACE: ("s", True),
}


def _category(cat: Any, flags: int) -> Ranges:
    if cat not in _CATS:
        raise GrammarError(f"unsupported regex category {cat}")
    name, negate = _CATS[cat]
    base = _ASCII[name] if flags & re.ASCII else list(_unicode_class(name))
    return _complement(base) if negate else list(base)


def _fold(c: int) -> Ranges:
    ch = chr(c)
    out = {c}
    for v in (ch.lower(), ch.upper(), ch.swapcase()):
        if len(v) == 1:
            out.add(ord(v))
    return [(x, x) for x in out]


def _fold_ranges(ranges: Ranges) -> Ranges:
    out = list(ranges)
    for lo, hi in ranges:
        if hi - lo > 4096:
            continue
        for c in range(lo, hi + 1):
            out += _fold(c)
    return _normalize(out)


def _class_text(ranges: Ranges) -> str:
    ranges = _normalize(ranges)
    if not ranges:
        return "[^\\x00-\\U0010ffff]"  # matches nothing
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return _char(ranges[0][0])
    parts = [_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges]
    return "[" + "".join(parts) + "]"


def _char(c: int) -> str:
    ch = chr(c)
    if ch.isalnum() and c < 128:
        return ch
    return f"\\U{c:08x}"


def _items(items: Any, flags: int, names: dict[int, str] | None = None) -> str:
    return "".join(_item(op, av, flags, names) for op, av in items)


def _item(op: Any, av: Any, flags: int, names: dict[int, str] | None = None) -> str:
    icase = bool(flags & re.IGNORECASE)
    name = str(op)
    if op is _sre.LITERAL:
        return _class_text(_fold(av) if icase else [(av, av)])
    if op is _sre.NOT_LITERAL:
        return _class_text(_complement(_fold(av) if icase else [(av, av)]))
    if op is _sre.ANY:
        return "[\\x00-\\U0010ffff]" if flags & re.DOTALL else _class_text(_complement([(10, 10)]))
    if op is _sre.IN:
        ranges: Ranges = []
        negate = False
        for iop, iav in av:
            if iop is _sre.NEGATE:
                negate = True
            elif iop is _sre.LITERAL:
                ranges.append((iav, iav))
            elif iop is _sre.RANGE:
                ranges.append(iav)
            elif iop is _sre.CATEGORY:
                ranges += _category(iav, flags)
            else:
                raise GrammarError(f"unsupported character class item {iop}")
        if icase:
            ranges = _fold_ranges(ranges)
        return _class_text(_complement(ranges) if negate else ranges)
    if op is _sre.CATEGORY:
        return _class_text(_category(av, flags))
    if op is _sre.BRANCH:
        return "(?:" + "|".join(_items(b, flags, names) for b in av[1]) + ")"
    if op is _sre.SUBPATTERN:
        group, add, remove, sub = av
        # an excluded-words group (see structspec.automata.dfa) keeps its name
        head = f"(?P<{names[group]}>" if names and group in names else "(?:"
        return head + _items(sub, (flags | add) & ~remove, names) + ")"
    if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
        lo, hi, sub = av
        body = "(?:" + _items(sub, flags, names) + ")"
        if hi == _sre.MAXREPEAT:
            return f"{body}{{{lo},}}"
        return f"{body}{{{lo},{hi}}}"
    if op is _sre.AT:
        if av in (_sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING):
            return "^"
        if av in (_sre.AT_END, _sre.AT_END_STRING):
            return "$"
        raise GrammarError("word boundaries (\\b, \\B) are not supported in terminals")
    raise GrammarError(f"{_UNSUPPORTED.get(name, name)} are not supported in terminals")


def to_dfa_pattern(pattern: str, flags: int = 0) -> str:
    """Rewrite the Python regex ``pattern`` (compiled with ``flags``) into a flag-free
    pattern over explicit code-point classes with the same language. Pure.

    Raises:
        GrammarError: the pattern does not parse, or uses look-arounds, back-references,
            word boundaries, atomic groups or ``re.LOCALE``.
    """
    try:
        parsed = _sre_parse.parse(pattern, flags)
    except (re.error, OverflowError, RecursionError) as exc:
        raise GrammarError(f"invalid regular expression {pattern[:80]!r}: {exc}") from exc
    all_flags = parsed.state.flags | flags
    if all_flags & re.LOCALE:
        raise GrammarError("re.LOCALE is not supported")
    return _items(list(parsed), all_flags, _kept_names(parsed))


def to_dfa_alternatives(pattern: str, flags: int = 0) -> list[str]:
    """Like :func:`to_dfa_pattern`, split at the top-level alternation (groups around it
    unwrapped): the union of the returned patterns is the language. One pattern when the
    regex is not an alternation. Pure.

    Raises:
        GrammarError: as :func:`to_dfa_pattern`.
    """
    try:
        parsed = _sre_parse.parse(pattern, flags)
    except (re.error, OverflowError, RecursionError) as exc:
        raise GrammarError(f"invalid regular expression {pattern[:80]!r}: {exc}") from exc
    all_flags = parsed.state.flags | flags
    items = list(parsed)
    while len(items) == 1 and items[0][0] is _sre.SUBPATTERN:
        _group, add, remove, sub = items[0][1]
        all_flags = (all_flags | add) & ~remove
        items = list(sub)
    names = _kept_names(parsed)
    if len(items) == 1 and items[0][0] is _sre.BRANCH:
        return [_items(b, all_flags, names) for b in items[0][1][1]]
    return [_items(items, all_flags, names)]


def _kept_names(parsed: Any) -> dict[int, str]:
    """Group id -> name of the excluded-words groups (``_without_SET_N``), which the DFA
    compiler reads; other group names are dropped."""
    return {gid: name for name, gid in parsed.state.groupdict.items()
            if name.startswith("_without_")}


__all__ = ["to_dfa_alternatives", "to_dfa_pattern"]
