"""The regular-expression literal terminal of ``javascript.lark`` (``/ab+c/gi``), built
from parts.

A regular-expression literal is a SyntaxError when its pattern is not a valid pattern
(``/(/``, ``/a**/``, ``/[z-a]/``) or its flags repeat (``/a/gg``), so a lexical
``/[^/]+/[a-z]*`` would let invalid programs through. This module writes a regex (no
look-arounds, no back-references: the terminal compiles to a byte DFA) for a *sound*
subset of ECMAScript patterns, checked by ``tests/test_javascript_regex.py`` against
V8 where ``node`` is on the PATH:

- terms: literal characters, ``.``, escapes (``\\d\\w\\s`` and their negations, control
  and hex/unicode escapes, escaped syntax characters, ``\\cX``; back-references ``\\1``-``\\9``
  without the ``u`` flag), character classes, groups ``(...)`` and ``(?:...)`` nested up
  to three deep, each optionally quantified (``*``, ``+``, ``?``, ``{n}``, ``{n,}``,
  ``{n,m}`` with single-digit ``n <= m`` or a two-digit-or-more ``m``; lazy ``?``);
  assertions ``^``, ``$``, ``\\b``, ``\\B`` and look-arounds ``(?=``, ``(?!``, ``(?<=``,
  ``(?<!``, unquantified; alternatives with ``|``;
- classes: ``[...]`` and ``[^...]`` of characters and escapes, ranges between two
  letters of one case or two digits in order (``a-z``, ``A-F``, ``0-9``) or between two
  ``\\x``/``\\u`` escapes whose first differing digit is in order at once
  (``\\x20-\\x7e``, ``\\u0080-\\u00ff``), a ``-`` first or last;
- flags: distinct letters of ``dgimsy``, up to four, or with ``u`` (then no
  back-references and no ``\\-`` outside a class, as the ``u`` grammar requires).

Left out (refused), all valid in some mode: named groups and ``\\k<name>``, ``\\0``,
``\\u{...}``, the ``v`` flag, Annex B's lone ``{``, ``}``, ``]`` and quantified
look-aheads, other ranges (``[\\x41-\\x4f]``, ``[\\uD800-\\uDBFF]``, ``[!-~]``), a
``-`` in the middle of a class, ``{n,m}`` with a two-digit ``n``, more than three nested
groups. Line terminators never occur in a literal.

Run ``python -m structspec.grammars.javascript_regex`` to print the terminal after a
change; ``tests/test_grammars_corpus.py`` checks ``javascript.lark`` holds it.
"""

from __future__ import annotations

from itertools import permutations

_HEX = "[0-9a-fA-F]"
_NO_LT = r"\n\r\u2028\u2029"
_PCHAR = rf"[^\\^$.*+?()[\]{{}}|\/{_NO_LT}]"  # (lark ends its regex at a bare /)
_SYNTAX = r"[\^$\\.*+?()[\]{}|\/]"
_ESC_COMMON = rf"[dDwWsSnrtfv]|c[A-Za-z]|x{_HEX}{{2}}|u{_HEX}{{4}}|{_SYNTAX}"


def _ranges() -> str:
    """``a-[a-z]``, ``b-[b-z]``, ...: ranges whose ends are in order."""
    out = []
    for lo, hi in (("a", "z"), ("A", "Z"), ("0", "9")):
        for c in range(ord(lo), ord(hi) + 1):
            out.append(f"{chr(c)}-[{chr(c)}-{hi}]" if chr(c) != hi else f"{hi}-{hi}")
    return "|".join(out)


def _escape_ranges() -> str:
    """Ranges between two ``\\xHH`` or two ``\\uHHHH`` escapes whose order the first
    differing digit shows at once: ``\\x20-\\x7e`` (2 < 7), ``\\u0080-\\u00ff`` (past
    ``00``: 8 < f), ``\\u4e00-\\u9fa5``. Telling ``\\x41-\\x4f`` from ``\\x4f-\\x41`` would
    need the whole low end remembered (a state per value): refused."""
    def digit(v: int) -> str:
        c = "0123456789abcdef"[v]
        return c if v < 10 else f"[{c}{c.upper()}]"

    def above(v: int) -> str:
        digits = "0123456789abcdef"[v + 1:]
        return "[" + digits + "".join(c.upper() for c in digits if c.isalpha()) + "]"

    out = []
    for v in range(15):
        d, g = digit(v), above(v)
        out.append(rf"\\x{d}{_HEX}-\\x{g}{_HEX}")
        out.append(rf"\\u{d}{_HEX}{{3}}-\\u{g}{_HEX}{{3}}")
        out.append(rf"\\u00{d}{_HEX}-\\u00{g}{_HEX}")
    return "|".join(out)


def _class() -> str:
    char = rf"[^\\\]\-{_NO_LT}]"
    esc = rf"\\(?:[dDwWsSbnrtfv]|c[A-Za-z]|x{_HEX}{{2}}|u{_HEX}{{4}}|{_SYNTAX}|-)"
    item = f"(?:{_ranges()}|{_escape_ranges()}|{char}|{esc})"
    return rf"\[\^?-?{item}*-?\]"


def _quantifier() -> str:
    ordered = "|".join(f"{n},[{n}-9]" for n in range(10))
    return rf"(?:[*+?]|\{{[0-9]+,?\}}|\{{(?:{ordered})\}}|\{{[0-9],[1-9][0-9]+\}})\??"


def _body(unicode: bool, depth: int = 3) -> str:
    """The pattern: a non-empty disjunction (``//`` is a comment)."""
    esc = rf"\\(?:{_ESC_COMMON})" if unicode else rf"\\(?:{_ESC_COMMON}|-|[1-9])"
    klass, quant = _class(), _quantifier()
    assertion = r"\^|\$|\\[bB]"
    disj = ""
    for level in range(depth + 1):
        atoms = [_PCHAR, r"\.", esc, klass]
        looks = []
        if level:
            atoms.append(rf"\((?:\?:)?{disj}\)")
            looks.append(rf"\(\?(?:=|!|<=|<!){disj}\)")
        term = f"(?:(?:{'|'.join(atoms)})(?:{quant})?|{'|'.join([assertion, *looks])})"
        disj = f"(?:{term}|\\|)*"  # alternatives: terms and bars in any order
    return f"(?:{term}|\\|)+"


def _flags(letters: str, must: str = "", most: int = 4) -> str:
    """Distinct letters of ``letters`` (including ``must`` when given), at most ``most``:
    a regex over the trie of those words."""
    words = {"".join(p) for n in range(most + 1) for p in permutations(letters, n)
             if must in p or not must}

    def trie(prefix: str) -> str:
        nxt = sorted({w[len(prefix)] for w in words if len(w) > len(prefix)
                      and w.startswith(prefix)})
        parts = [c + trie(prefix + c) for c in nxt]
        if not parts:
            return ""
        inner = "|".join(parts)
        return f"(?:{inner})" + ("?" if prefix in words else "")

    return trie("")


def regex_terminal() -> str:
    """The ``REGEX`` terminal line of ``javascript.lark``."""
    plain = rf"\/{_body(False)}\/{_flags('dgimsy')}"
    uni = rf"\/{_body(True)}\/{_flags('dgimsuy', 'u')}"
    return f"REGEX: /{plain}/\n     | /{uni}/"


if __name__ == "__main__":
    print(regex_terminal())
