"""The string-literal terminals of ``python.lark``, built from parts.

Python's string literals have 4 quote styles x {str, raw str, f-string, raw f-string,
bytes, raw bytes}; written by hand each terminal is an error-prone copy of the others, so
this module assembles them and ``tests/test_grammars_corpus.py`` checks that the block in
``python.lark`` equals :func:`string_terminals`. Run ``python -m
structspec.grammars.python_strings`` to print the block after a change.

The regexes use no look-arounds or back-references (each terminal compiles to a byte DFA).
They are *sound* but for the keyword gap below: a literal they match is one Python 3.12
accepts — bytes hold ASCII only, ``\\x``/``\\u``/``\\U`` escapes are complete, ``\\N{...}``
is left out (its names cannot be checked by a regex), a triple-quoted body never contains
its closing quotes. f-strings keep their replacement fields to a regular subset of
expressions, brackets nested three deep:

- the field: an expression, or a conditional ``a if b else c`` of simpler ones; then
  ``=``, ``!r``/``!s``/``!a``, and a format spec whose nested fields are dotted names,
  numbers or calls of simple arguments (``{x:>{width}}``, ``{v:{fmt(w)}}``);
- operands: names, numbers (ints without leading zeros, floats, ``1e3``, ``2j``, hex),
  strings in the other quote, nested f-strings in the other quote whose fields are dotted
  names, parenthesized expressions, tuples, lists and list comprehensions, with
  ``.name``, subscript/slice and call trailers; unary ``-``/``+``/``~``; binary,
  comparison and boolean operators between them;
- calls: positional and ``*`` arguments, then ``name=`` and ``**`` ones, or one generator
  (``", ".join(str(x) for x in xs)``); an argument may be a list comprehension
  (``", ".join([f(a) for a in b])``);
- a backslash before a brace is a character of its own (``rf"\\{x}"``; in a plain
  f-string, ``f"\\{x}"``, an invalid escape Python warns about).

Keywords: no name in a field is a keyword of Python 3.12 — operands (where ``True``,
``False`` and ``None`` are values), attributes after ``.``, keyword-argument names,
comprehension targets, the names inside brackets and nested f-strings, the nested fields of
a format spec: ``f"{if}"``, ``f"{x.class}"``, ``f"{a[if]}"``, ``f"{f(g(if))}"``,
``f"{[x for in in y]}"`` are refused; ``f"{iffy}"``, ``f"{x.match}"``, ``f"{a[None]}"`` are
not. Each name is an excluded-words group (``(?P<_without_pykeywords_N>...)``, see
:mod:`structspec.automata.dfa`): lark reads the plain name, the DFA compiler leaves out
the keywords with one shared trie instead of ~80 states of regex per name. A bare
``{yield}`` is a field of its own.

Left out: ``not``, ``await`` and ``yield`` but a bare ``{yield}`` and the three before a
bracket at the start of a field (``{not(x)}``, ``{await(f).x}``, ``{yield[a] + b}``: the
forms accepted when they were names), lambdas, walrus, dict and set displays, tuples
without parentheses (``{a, b}``), strings in the field's own quote (Python 3.12 allows
them), triple-quoted strings and line breaks inside a field, and deeper nesting.
On CPython 3.11's standard library the f-string terminal matches 2,911 of its 2,964
f-string literals (98.2%; most of the rest are in ``test/test_fstring.py`` and friends).
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

_D = "[0-9](?:_?[0-9])*"
_EXP = f"[eE][-+]?{_D}"
_FLOAT = rf"(?:{_D}\.(?:{_D})?(?:{_EXP})?|\.{_D}(?:{_EXP})?|{_D}{_EXP})"
# int, float, imaginary, hex: a number Python reads (no `012`: leading zeros are for floats)
_NUM = (
    rf"(?:[1-9](?:_?[0-9])*|0(?:_?0)*|{_FLOAT}|(?:{_D}|{_FLOAT})[jJ]|0[xX](?:_?[0-9a-fA-F])+)"
)
_SNUM = r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"  # the numbers of the inner levels
_WS = " *"
_COMMA = f"{_WS},{_WS}"
_BINOP = (
    "(?:" + _WS + r"(?:[-+*/%@&|^<>]|\*\*|//|==|!=|<=|>=|<<|>>)" + _WS
    + "| +(?:and|or|in|not +in|is|is +not) +)"
)


# The names in a field: no keyword (:data:`~structspec.automata.dfa.WORD_SETS`); where a
# value may stand ``True``, ``False`` and ``None`` are values. The groups are numbered by
# :func:`string_terminals` (``#``), so that their names are unique.
_VALUE_NAME = "(?P<_without_pystatements_#>[A-Za-z_][A-Za-z0-9_]*)"
_ATTR_NAME = "(?P<_without_pykeywords_#>[A-Za-z_][A-Za-z0-9_]*)"


def _seq(item: str, trailing: bool = True) -> str:
    """``item`` separated by commas, at least one, with an optional trailing comma."""
    return f"{item}(?:{_COMMA}{item})*" + (f"(?:{_WS},)?" if trailing else "")


def _field_expr(other_quote: str) -> str:
    """The regex of a replacement field's expression, brackets nested three deep.

    ``other_quote`` is the quote a string *inside* the field may use (before Python 3.12
    a field cannot reuse its f-string's quote, and the one-token f-string keeps that rule).
    Levels, innermost first: ``simple`` (a dotted name, a number, a string); ``expr0``
    (operands with ``.name``/``[simple]``/``(simple, ...)`` trailers, joined by binary and
    boolean operators); ``expr1`` (operands in brackets hold ``expr0``: calls with keyword,
    ``*`` and ``**`` arguments or one generator, lists, comprehensions, tuples, slices); the
    field itself is an ``expr1``, or a conditional ``a if b else c`` of them.
    """
    q = other_quote
    inner_str = f"{q}[^{q}\"'\\\\\\n\\r{{}}\\x00]*{q}"

    def nested_f_of(value: str, attr: str) -> str:
        """A nested f-string in the other quote, its fields names with attributes and
        ``!r``."""
        return (
            f"[fF]{q}(?:[^{q}\"'\\\\\\n\\r{{}}\\x00]|\\{{\\{{|\\}}\\}}"
            rf"|\{{{_WS}{value}(?:\.{attr})*{_WS}(?:![rsa])?\}})*{q}"
        )

    def tr0_of(attr: str) -> str:
        """``.name``, a subscript or slice of ``simple`` ones, a call of ``simple`` ones."""
        return (
            rf"(?:\.{attr}|\[{_WS}{simple}{_WS}\]"
            rf"|\[{_WS}(?:-?{simple})?{_WS}:{_WS}(?:-?{simple})?{_WS}\]"
            rf"|\({_WS}(?:{_seq(simple, False)})?{_WS}\))"
        )

    nested_f = nested_f_of(_VALUE_NAME, _ATTR_NAME)
    dotted = rf"{_VALUE_NAME}(?:\.{_ATTR_NAME})*"
    simple = f"(?:{dotted}|-?{_SNUM}|{inner_str})"
    prim_s = f"(?:{_VALUE_NAME}|{inner_str}|{nested_f})"
    tr0 = tr0_of(_ATTR_NAME)
    # an argument may be a list comprehension of trailed names: `", ".join([f(a) for a in b])`
    lite = f"{prim_s}{tr0}*"
    comp0 = f" +for +{_ATTR_NAME}(?:{_COMMA}{_ATTR_NAME})* +in +{lite}(?: +if +{lite})?"
    listcomp0 = rf"\[{_WS}{lite}{comp0}{_WS}\]"
    prim0 = prim_s
    unary = "[-~+]?"  # not `not`: `a + not b` is an error
    opnd0 = f"{unary}(?:{_SNUM}|{prim0}{tr0}*)"
    expr0 = f"{opnd0}(?:{_BINOP}{opnd0})*"
    comp = f" +for +{_ATTR_NAME}(?:{_COMMA}{_ATTR_NAME})* +in +{expr0}(?: +if +{expr0})*"
    items = f"(?:{_seq(expr0)})?"
    # the field's top level: its names are no keywords (`True`/`None`/`False` as values)
    prim_top = f"(?:{_VALUE_NAME}|{inner_str}|{nested_f_of(_VALUE_NAME, _ATTR_NAME)})"
    opnd0_top = f"{unary}(?:{_SNUM}|{prim_top}{tr0_of(_ATTR_NAME)}*)"
    expr0_top = f"{opnd0_top}(?:{_BINOP}{opnd0_top})*"
    prim1 = (
        rf"(?:{prim_top}|\({_WS}{expr0}{_WS}\)|\({_WS}{expr0}{_COMMA}{items}{_WS}\)"
        rf"|\[{_WS}{items}{_WS}\]|\[{_WS}{expr0}{comp}{_WS}\])"
    )
    # positional arguments (`*` ones too) before keyword ones (`**` ones too); their names
    # are checked as the top level's are (not those of a nested f-string)
    opnd0_arg = f"{unary}(?:{_SNUM}|(?:{_VALUE_NAME}|{inner_str}|{nested_f}){tr0_of(_ATTR_NAME)}*)"
    expr0_arg = f"{opnd0_arg}(?:{_BINOP}{opnd0_arg})*"
    pos = rf"(?:\*?{expr0_arg}|{listcomp0})"
    kw = rf"(?:{_ATTR_NAME}{_WS}={_WS}|\*\*){expr0_arg}"
    arglist = f"(?:{pos}(?:{_COMMA}{pos})*|{kw})(?:{_COMMA}{kw})*(?:{_WS},)?"
    args = f"(?:{_WS}(?:{arglist}|{expr0}{comp}){_WS})?"
    tr1 = (
        rf"(?:\.{_ATTR_NAME}|\[{_WS}{expr0}{_WS}\]"
        rf"|\[{_WS}(?:{expr0})?{_WS}:{_WS}(?:{expr0})?{_WS}\]|\({args}\))"
    )
    opnd1 = f"{unary}(?:{_NUM}|{prim1}{tr1}*)"
    # `not`, `await`, `yield` before a bracket may open the field (`{not(x)}`, `{await(f)}`,
    # `{yield[a]}`): whatever follows reads as their operand, or as `(not x) and ...`
    opens = (
        rf"(?:not|await|yield){_WS}(?:\({_WS}(?:{expr0}(?:{_COMMA}{items})?)?{_WS}\)"
        rf"|\[{_WS}{items}{_WS}\])(?:\.{_ATTR_NAME})*"
    )
    expr1 = f"(?:{opnd1}|{opens})(?:{_BINOP}{opnd1})*"
    # a bare `yield` is an expression (`f"{yield}"` in a generator)
    return f"(?:{expr1}|{expr0_top} +if +{expr0_top} +else +{expr0_top}|yield)"


def _fstring_field(quote_char: str) -> str:
    """One ``{...}`` replacement field inside an f-string quoted with ``quote_char``."""
    other = "'" if quote_char == '"' else '"'
    expr = _field_expr(other)
    q = other
    inner_str = f"{q}[^{q}\"'\\\\\\n\\r{{}}\\x00]*{q}"
    # a nested field of a format spec: a dotted name, a number or a call of simple args
    dotted = rf"{_VALUE_NAME}(?:\.{_ATTR_NAME})*"
    simple = f"(?:{dotted}|-?{_SNUM}|{inner_str})"
    nested = (
        rf"{_VALUE_NAME}(?:\.{_ATTR_NAME})*(?:\({_WS}(?:{_seq(simple, False)})?{_WS}\))*|{_SNUM}"
    )
    spec = (
        f"(?:[^{{}}\"'\\\\\\n\\r\\x00]|\\{{{_WS}(?:{nested}){_WS}(?:![rsa])?\\}})*"
    )
    return rf"\{{{_WS}{expr}{_WS}(?:={_WS})?(?:![rsa])?(?::{spec})?\}}"


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
            if kind in ("f", "rf"):  # a backslash before a brace escapes nothing: f"\{x}"
                esc = esc.replace(r"\x00\r]", r"\x00\r{}]")
            if long:
                esc = esc.replace(r"\x00\r", r"\x00")
            unit_items = [plain, esc]
            if kind in ("f", "rf"):
                braces = rf"\{{\{{|\}}\}}|{_fstring_field(c)}"
                unit_items.append(f"\\\\?(?:{braces})")
        unit = "(?:" + "|".join(unit_items) + ")"
        if long:
            # never three quotes in a row, never a quote just before the closing ones
            out.append(f"{quote}(?:{c}?{c}?{unit})*{quote}")
        else:
            out.append(f"{c}{unit}*{c}")
    return out


def _ascii_without(cls: str, quote: str) -> str:
    """An ASCII class ``[...]`` of ranges minus ``quote`` and the backslash."""
    allowed: set[int] = set()
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
    codes = sorted(allowed)  # never empty: the classes hold more than a quote and a backslash
    ranges: list[tuple[int, int]] = []
    start = prev = codes[0]
    for b in codes[1:]:
        if b == prev + 1:
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
    parts = "\n".join(lines).split("#>")  # number the excluded-words groups: unique names
    return "".join(f"{p}{i}>" for i, p in enumerate(parts[:-1])) + parts[-1]


if __name__ == "__main__":
    print(string_terminals())
