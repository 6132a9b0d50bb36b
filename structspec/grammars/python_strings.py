"""The string-literal terminals of ``python.lark``, built from parts.

Python's string literals have 4 quote styles x {str, raw str, f-string, raw f-string,
bytes, raw bytes}; written by hand each terminal is an error-prone copy of the others, so
this module assembles them and ``tests/test_grammars_corpus.py`` checks that the block in
``python.lark`` equals :func:`string_terminals`. Run ``python -m
structspec.grammars.python_strings`` to print the block after a change.

The regexes use no look-arounds or back-references (each terminal compiles to a byte DFA).
They are *sound*: a literal they match is one Python 3.12 accepts — bytes hold ASCII only,
``\\x``/``\\u``/``\\U`` escapes are complete, ``\\N{...}`` is left out (its names cannot be
checked by a regex), a triple-quoted body never contains its closing quotes. f-strings keep
their replacement fields to a regular subset of expressions (names, numbers, strings,
attribute/call/subscript trailers two levels deep, binary and boolean operators,
``!r``, ``=``, format specs with nested fields); a name inside a
field is not checked against the keywords, and comprehensions, lambdas and nested f-strings
inside a field are not accepted.
"""

from __future__ import annotations

_HEX = "[0-9a-fA-F]"
_STR_ESC = (
    r"\\(?:[^xuUN\x00\r]|x" + _HEX * 2 + "|u" + _HEX * 4
    + "|U(?:000" + _HEX + "|0010)" + _HEX * 4 + ")"
)
_RAW_ESC = r"\\[^\x00\r]"
_BYTES_CHAR = r"\x01-\x09\x0b\x0c\x0e-\x7f"  # ASCII without NUL, LF, CR
_BYTES_ESC = r"\\(?:[\x01-\x09\x0b\x0c\x0e-\x77\x79-\x7f]|x" + _HEX * 2 + ")"
_RAW_BYTES_ESC = r"\\[\x01-\x09\x0b\x0c\x0e-\x7f]"

_NAME = "[A-Za-z_][A-Za-z0-9_]*"
_NUM = r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"
_WS = " *"
_BINOP = (
    "(?:" + _WS + r"(?:[-+*/%@&|^<>]|\*\*|//|==|!=|<=|>=|<<|>>)" + _WS
    + "| +(?:and|or|in|not +in|is|is +not) +)"
)


def _field_expr(other_quote: str) -> tuple[str, str]:
    """Regexes for a replacement-field expression, nesting depth 0 and 1.

    ``other_quote`` is the quote a string *inside* the field may use.
    """
    q = other_quote
    inner_str = f"{q}[^{q}\"'\\\\\\n\\r{{}}\\x00]*{q}"
    prim0 = f"(?:{_NAME}|{inner_str})"
    simple = f"(?:{_NAME}|-?{_NUM}|{inner_str})"
    tr0 = rf"(?:\.{_NAME}|\[{_WS}{simple}{_WS}\]|\({_WS}{simple}?{_WS}\))"
    opnd0 = f"[-~]?(?:{_NUM}|{prim0}{tr0}*)"
    expr0 = f"{opnd0}(?:{_BINOP}{opnd0})*"
    args = f"(?:{_WS}{expr0}(?:{_WS},{_WS}{expr0})*{_WS})?"
    prim1 = rf"(?:{prim0}|\({_WS}{expr0}{_WS}\)|\[{args}\])"
    tr1 = (
        rf"(?:\.{_NAME}|\[{_WS}{expr0}{_WS}\]"
        rf"|\[{_WS}(?:{expr0})?{_WS}:{_WS}(?:{expr0})?{_WS}\]|\({args}\))"
    )
    opnd1 = f"[-~]?(?:{_NUM}|{prim1}{tr1}*)"
    expr1 = f"{opnd1}(?:{_BINOP}{opnd1})*"
    return expr0, expr1


def _fstring_field(quote_char: str) -> str:
    """One ``{...}`` replacement field inside an f-string quoted with ``quote_char``."""
    other = "'" if quote_char == '"' else '"'
    expr0, expr1 = _field_expr(other)
    spec = (
        f"(?:[^{{}}\"'\\\\\\n\\r\\x00]|\\{{{_WS}{expr0}{_WS}\\}})*"
    )
    return rf"\{{{_WS}{expr1}{_WS}(?:={_WS})?(?:![rsa])?(?::{spec})?\}}"


def _variants(kind: str) -> list[str]:
    """All quote styles of one literal kind (``str``, ``raw``, ``f``, ``rf``, ``b``, ``rb``).

    Triple quotes come first: a first-match regex engine (lark's lexer) must not stop at
    the empty string ``""`` that begins ``\"\"\"``.
    """
    out = []
    for quote in ('"""', "\'\'\'", '"', "'"):
        c = quote[0]
        long = len(quote) == 3
        if kind in ("b", "rb"):
            # ASCII without NUL (and without LF/CR in one-line literals)
            plain = _ascii_without(r"[\x01-\x7f]" if long else f"[{_BYTES_CHAR}]", c)
            if long:  # a backslash may also escape a line end
                esc = (r"\\(?:[\x01-\x77\x79-\x7f]|x" + _HEX * 2 + ")" if kind == "b"
                       else r"\\[\x01-\x7f]")
            else:
                esc = _BYTES_ESC if kind == "b" else _RAW_BYTES_ESC
            unit_items = [plain, esc]
        else:
            nl = "" if long else r"\r\n"
            brace = "{}" if kind in ("f", "rf") else ""
            plain = f"[^{c}\\\\\\x00{nl}{brace}]"
            esc = _STR_ESC if kind in ("str", "f") else _RAW_ESC
            if long:
                esc = esc.replace(r"\x00\r]", r"\x00]")
            unit_items = [plain, esc]
            if kind in ("f", "rf"):
                unit_items += [r"\{\{", r"\}\}", _fstring_field(c)]
        unit = "(?:" + "|".join(unit_items) + ")"
        if long:
            # never three quotes in a row, never a quote just before the closing ones
            out.append(f"{quote}(?:{c}?{c}?{unit})*{quote}")
        else:
            out.append(f"{c}{unit}*{c}")
    return out


def _ascii_without(cls: str, quote: str) -> str:
    """An ASCII class ``[...]`` of ranges minus ``quote`` and the backslash."""
    allowed = set()
    body = cls[1:-1]
    i = 0
    while i < len(body):
        lo = int(body[i + 2 : i + 4], 16)
        if i + 4 < len(body) and body[i + 4] == "-":
            hi = int(body[i + 7 : i + 9], 16)
            i += 9
        else:
            hi = lo
            i += 4
        allowed.update(range(lo, hi + 1))
    allowed -= {ord(quote), ord("\\")}
    ranges, start, prev = [], None, None
    for b in sorted(allowed):
        if start is None:
            start = prev = b
        elif b == prev + 1:
            prev = b
        else:
            ranges.append((start, prev))
            start = prev = b
    ranges.append((start, prev))
    parts = [_char(a) if a == b else f"{_char(a)}-{_char(b)}" for a, b in ranges]
    return "[" + "".join(parts) + "]"


def _char(code: int) -> str:
    """One byte in a character class; lark turns ``\\xNN`` into the character itself, so
    ``[``, ``]``, ``\\``, ``^`` and ``-`` are escaped with a backslash instead."""
    return "\\" + chr(code) if chr(code) in "[]\\^-" else f"\\x{code:02x}"


_PREFIXES = {
    "str": "(?:[uU])?",
    "raw": "[rR]",
    "f": "[fF]",
    "rf": "(?:[fF][rR]|[rR][fF])",
    "b": "[bB]",
    "rb": "(?:[bB][rR]|[rR][bB])",
}


def string_terminals() -> str:
    """The lark text of the ``STRING`` and ``BYTES`` terminals of ``python.lark``."""
    lines = []
    for kind, term in (("str", "_STR"), ("raw", "_RSTR"), ("f", "_FSTR"), ("rf", "_RFSTR"),
                       ("b", "_BSTR"), ("rb", "_RBSTR")):
        alts = "|".join(_variants(kind))
        regex = f"{_PREFIXES[kind]}(?:{alts})".replace("/", "\\/")
        lines.append(f"{term}: /{regex}/")
    lines.append("STRING: _STR | _RSTR | _FSTR | _RFSTR")
    lines.append("BYTES: _BSTR | _RBSTR")
    return "\n".join(lines)


if __name__ == "__main__":
    print(string_terminals())
