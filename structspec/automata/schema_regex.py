"""Regex text for the regular pieces of a JSON Schema: ECMA-262 ``pattern``s, ``format``s,
integer ranges and the spellings of literal values — each as a regex over JSON string (or
number) text, for :mod:`structspec.automata.dfa` to compile.

Why by hand: a pattern is matched against the *decoded* string, while the automaton reads
JSON text, so every character class becomes the set of its JSON spellings (raw or escaped),
and ECMA-262 classes (``\\d``, ``\\s``, ``.``) differ from Python's.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from structspec.automata.byte_nfa import Ranges, complement, normalize

try:  # Python >= 3.11
    import re._constants as _sre
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_MAX_REPEAT_LOW = 256  # larger lower bounds (minLength, {m,}) are refused


class _Refuse(Exception):
    """Internal: a regex helper cannot express something exactly (the message says what)."""



# -- character sets (sorted disjoint inclusive code point ranges) ---------------------------

_ALL: Ranges = [(0, 0x10FFFF)]
_norm = normalize
_complement = complement


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return _complement(_complement(a) + _complement(b))


def _contains(ranges: Ranges, c: int) -> bool:
    return any(lo <= c <= hi for lo, hi in ranges)


# ECMA-262 and Python disagree on \d \w \s; a pattern's character sets are the intersection
# of both readings, so outputs satisfy the spec and the ``jsonschema`` validator alike.
_ECMA_SPACE = _norm([(9, 13), (32, 32), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                     (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
                     (0xFEFF, 0xFEFF)])
_ECMA = {"digit": [(48, 57)], "word": _norm([(48, 57), (65, 90), (95, 95), (97, 122)]),
         "space": _ECMA_SPACE}
_LINE_TERMINATORS = [(10, 10), (13, 13), (0x2028, 0x2029)]


@cache
def _python_class(name: str) -> Ranges:
    """The code points Python's ``re`` puts in ``\\d``/``\\w``/``\\s`` (str patterns)."""
    text = "".join(map(chr, range(0x110000)))
    rx = {"digit": r"\d+", "word": r"\w+", "space": r"\s+"}[name]
    return [(m.start(), m.end() - 1) for m in re.finditer(rx, text)]


def _category(cat: Any) -> tuple[Ranges, Ranges]:
    """(ECMA set, Python set) of a ``re`` category such as ``CATEGORY_NOT_DIGIT``."""
    name = str(cat).lower()
    base = next(k for k in ("digit", "word", "space") if k in name)
    ecma, py = _ECMA[base], _python_class(base)
    if "not" in name:
        return _complement(ecma), _complement(py)
    return ecma, py


# JSON string text of a character set: safe code points verbatim, others as escapes.
_JSON_UNSAFE = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0xD800, 0xDFFF)]
_SHORT_ESCAPES = {0x22: r'\\"', 0x5C: r"\\\\", 0x08: r"\\b", 0x0C: r"\\f", 0x0A: r"\\n",
                  0x0D: r"\\r", 0x09: r"\\t"}


def _rx_char(c: int) -> str:
    ch = chr(c)
    return ch if ch.isascii() and ch.isalnum() else f"\\x{{{c:X}}}"


def _json_chars(ranges: Ranges, quote: bool = True) -> str:
    """A regex over JSON string text that spells exactly the characters in ``ranges``
    (without ``"`` when ``quote`` is false)."""
    if not quote:
        ranges = _intersect(ranges, _complement([(0x22, 0x22)]))
    alts = []
    safe = _intersect(ranges, _complement(_JSON_UNSAFE))
    if safe:
        body = "".join(_rx_char(a) if a == b else f"{_rx_char(a)}-{_rx_char(b)}" for a, b in safe)
        alts.append(f"[{body}]")
    hex_escapes = []
    for c in [0x22, 0x5C, *range(0x20)]:
        if _contains(ranges, c):
            if c in _SHORT_ESCAPES:
                alts.append(_SHORT_ESCAPES[c])
            else:
                hex_escapes.append(f"{c:02x}")
    if hex_escapes:
        alts.append(r"\\u00(?:" + "|".join(hex_escapes) + ")")
    if not alts:
        raise _Refuse("a character class in the pattern matches no character")
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


# -- pattern: ECMA-262 regex -> regex over JSON string text ------------------------------------


def _anchors(items: Any) -> tuple[bool, bool]:
    """Whether a parsed pattern uses a start anchor / an end anchor anywhere."""
    start = end = False
    for op, av in items:
        if op is _sre.AT:
            start |= av in (_sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING)
            end |= av in (_sre.AT_END, _sre.AT_END_STRING)
        subs = []
        if op is _sre.BRANCH:
            subs = list(av[1])
        elif op is _sre.SUBPATTERN:
            subs = [av[-1]]
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
            subs = [av[2]]
        for sub in subs:
            s2, e2 = _anchors(list(sub))
            start, end = start or s2, end or e2
    return start, end


# -- ECMA-262 Unicode property escapes (\p{...}), which Python's re lacks --------------------

#: General category names of ECMA-262 ``\p{...}`` (long and short), to Unicode categories.
_CATEGORY_NAMES: dict[str, tuple[str, ...]] = {}
for _short, _long in [
    ("Lu", "Uppercase_Letter"), ("Ll", "Lowercase_Letter"), ("Lt", "Titlecase_Letter"),
    ("Lm", "Modifier_Letter"), ("Lo", "Other_Letter"), ("Mn", "Nonspacing_Mark"),
    ("Mc", "Spacing_Mark"), ("Me", "Enclosing_Mark"), ("Nd", "Decimal_Number"),
    ("Nl", "Letter_Number"), ("No", "Other_Number"), ("Pc", "Connector_Punctuation"),
    ("Pd", "Dash_Punctuation"), ("Ps", "Open_Punctuation"), ("Pe", "Close_Punctuation"),
    ("Pi", "Initial_Punctuation"), ("Pf", "Final_Punctuation"), ("Po", "Other_Punctuation"),
    ("Sm", "Math_Symbol"), ("Sc", "Currency_Symbol"), ("Sk", "Modifier_Symbol"),
    ("So", "Other_Symbol"), ("Zs", "Space_Separator"), ("Zl", "Line_Separator"),
    ("Zp", "Paragraph_Separator"), ("Cc", "Control"), ("Cf", "Format"),
    ("Co", "Private_Use"), ("Cn", "Unassigned"),
]:
    _CATEGORY_NAMES[_short] = _CATEGORY_NAMES[_long] = (_short,)
for _short, _long in [("L", "Letter"), ("M", "Mark"), ("N", "Number"), ("P", "Punctuation"),
                      ("S", "Symbol"), ("Z", "Separator"), ("C", "Other")]:
    _CATEGORY_NAMES[_short] = _CATEGORY_NAMES[_long] = tuple(
        c for c in _CATEGORY_NAMES if len(c) == 2 and c[0] == _short)
_CATEGORY_NAMES["LC"] = _CATEGORY_NAMES["Cased_Letter"] = ("Lu", "Ll", "Lt")
_PROPERTY = re.compile(r"\\([pP])(?:\{([A-Za-z_=]+)\}|([A-Za-z]))")


@cache
def _unicode_categories() -> dict[str, Ranges]:
    """Code-point ranges of every Unicode general category (one scan, on first use)."""
    import unicodedata

    out: dict[str, Ranges] = {}
    prev, start = None, 0
    for c in range(0x110000):
        cat = "Cs" if 0xD800 <= c <= 0xDFFF else unicodedata.category(chr(c))
        if cat != prev:
            if prev is not None:
                out.setdefault(prev, []).append((start, c - 1))
            prev, start = cat, c
    out.setdefault(prev, []).append((start, 0x10FFFF))  # type: ignore[arg-type]
    return out


def _property_ranges(name: str) -> Ranges:
    if name.startswith(("General_Category=", "gc=")):
        name = name.split("=", 1)[1]
    cats = _CATEGORY_NAMES.get(name)
    if cats is None:
        raise ValueError(f"the Unicode property \\p{{{name}}} is not supported (general "
                         "categories are; scripts and binary properties are not)")
    table = _unicode_categories()
    return normalize([r for c in cats for r in table.get(c, [])])


def _class_body(ranges: Ranges) -> str:
    return "".join(f"\\U{lo:08X}" if lo == hi else f"\\U{lo:08X}-\\U{hi:08X}"
                   for lo, hi in ranges)


def python_pattern(pattern: str) -> str:
    """``pattern`` with ECMA-262 general-category escapes (``\\p{Letter}``, ``\\p{Lu}``,
    ``\\P{N}``) spelled as explicit code-point classes, for Python's ``re`` (which lacks
    them): used to compile patterns and, so the meaning is the same, to validate.

    Raises:
        ValueError: a property other than a general category, or ``\\P`` in a class.
    """
    if "\\p" not in pattern and "\\P" not in pattern:
        return pattern
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            m = _PROPERTY.match(pattern, i)
            if m is None:
                out.append(pattern[i:i + 2])
                i += 2
                continue
            ranges = _property_ranges(m.group(2) or m.group(3))
            if m.group(1) == "P":
                if in_class:
                    raise ValueError("\\P{...} inside a character class is not supported")
                ranges = complement(ranges)
            body = _class_body(ranges)
            out.append(body if in_class else f"[{body}]")
            i = m.end()
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


def pattern_regex(pattern: str, *, quote: bool = True,
                  max_repeat: int | None = None, search: bool = False,
                  wide: bool = False) -> str:
    """A regex over the *text inside the quotes* of a JSON string whose decoded value fully
    matches ``pattern``: a subset of the strings ``pattern`` accepts under both ECMA-262 and
    Python ``re.search`` semantics.

    Leading ``^`` and trailing ``$`` are implied (an unanchored pattern is matched in full:
    narrowing). Characters that JSON must escape are spelled as escapes; ``quote=False``
    leaves out ``"`` (see :meth:`_Lowering.lower_string`). Repetition upper bounds above
    ``max_repeat`` are narrowed to it (``None``: kept).

    ``wide=True`` (with ``search=True``) gives a *superset* instead, in the same spelling: the
    union of both readings of ``\\d``/``\\w``/``\\s`` and ``.``, a side anchored only where the
    whole pattern starts (ends) with its anchor, and ``$`` also before a final newline (as
    Python's ``re`` reads it) — for keys that must *not* match a pattern.

    Raises:
        _Refuse: look-arounds, back-references, word boundaries, inner anchors, possessive
            quantifiers, or a repetition lower bound above 256.
    """
    try:
        parsed = _sre_parse.parse(python_pattern(pattern))
    except (re.error, ValueError) as exc:
        raise _Refuse(f"the pattern does not parse: {exc}") from exc
    if parsed.state.flags & ~re.UNICODE:  # (?i), (?s), (?m), (?x)... at the top
        raise _Refuse("inline flags are not supported in patterns")
    core = _rx_seq(list(parsed), True, True, (quote, max_repeat, wide))
    if not search:
        return core
    anything = f"{_json_chars([(0, 0x10FFFF)])}*"
    if wide:  # anchored only by a leading (trailing) anchor of the whole pattern
        items = list(parsed)
        starts = bool(items) and items[0][0] is _sre.AT and items[0][1] in (
            _sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING)
        ends = bool(items) and items[-1][0] is _sre.AT and items[-1][1] in (
            _sre.AT_END, _sre.AT_END_STRING)
        newline = f"(?:{_json_chars([(10, 10)], quote)})?" \
            if ends and items[-1][1] is _sre.AT_END else ""
        return (f"{'' if starts else anything}(?:{core}){newline}"
                f"{'' if ends else anything}")
    # Search semantics (``search=True``): an unanchored side may have any text around the
    # match. Only where the pattern has no anchor of that kind at all, so that an anchored
    # branch of an alternation is never widened (anchored patterns stay narrowed instead).
    start, end = _anchors(list(parsed))
    return f"{'' if start else anything}(?:{core}){'' if end else anything}"


_Opts = tuple[bool, "int | None", bool]  # (quote, max_repeat, wide) of pattern_regex


def _rx_seq(items: list[tuple[Any, Any]], at_start: bool, at_end: bool, opts: _Opts) -> str:
    consuming = [i for i, (op, _) in enumerate(items) if op is not _sre.AT]
    first = consuming[0] if consuming else len(items)
    last = consuming[-1] if consuming else -1
    out = []
    for i, (op, av) in enumerate(items):
        if op is _sre.AT:
            if av in (_sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING) and at_start and i < first:
                continue
            if av in (_sre.AT_END, _sre.AT_END_STRING) and at_end and i > last:
                continue
            raise _Refuse("anchors are supported only at the start and end, word boundaries "
                          "not at all")
        out.append(_rx_item(op, av, at_start and i == first, at_end and i == last, opts))
    return "".join(out)


def _rx_item(op: Any, av: Any, at_start: bool, at_end: bool, opts: _Opts) -> str:
    quote, max_repeat, wide = opts
    if op is _sre.LITERAL:
        return _json_chars([(av, av)], quote)
    if op is _sre.NOT_LITERAL:
        return _json_chars(_complement([(av, av)]), quote)
    if op is _sre.ANY:  # ECMA '.' excludes all line terminators, Python only '\n'
        return _json_chars(_complement([(10, 10)] if wide else _LINE_TERMINATORS), quote)
    if op is _sre.IN:
        ecma: Ranges = []
        py: Ranges = []
        negate = False
        for sub_op, sub_av in av:
            if sub_op is _sre.NEGATE:
                negate = True
            elif sub_op is _sre.LITERAL:
                ecma.append((sub_av, sub_av))
                py.append((sub_av, sub_av))
            elif sub_op is _sre.RANGE:
                ecma.append(sub_av)
                py.append(sub_av)
            elif sub_op is _sre.CATEGORY:
                e, p = _category(sub_av)
                ecma += e
                py += p
            else:
                raise _Refuse(f"unsupported character class item {sub_op}")
        both, either = _intersect(_norm(ecma), _norm(py)), _norm(ecma + py)
        if negate:
            return _json_chars(_complement(both if wide else either), quote)
        return _json_chars(either if wide else both, quote)
    if op is _sre.BRANCH:
        return "(?:" + "|".join(_rx_seq(list(b), at_start, at_end, opts) for b in av[1]) + ")"
    if op is _sre.SUBPATTERN:
        if av[1] or av[2]:  # (?i:...) and friends change what the items mean
            raise _Refuse("inline flags are not supported in patterns")
        return "(?:" + _rx_seq(list(av[-1]), at_start, at_end, opts) + ")"
    if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
        lo, hi, sub = av
        if lo > _MAX_REPEAT_LOW:
            raise _Refuse(f"repetition lower bounds above {_MAX_REPEAT_LOW} are too costly")
        if max_repeat is not None and hi != _sre.MAXREPEAT and hi > max_repeat:
            hi = max(lo, max_repeat)  # narrowing
        body = _rx_seq(list(sub), False, False, opts)
        quant = f"{{{lo},}}" if hi == _sre.MAXREPEAT else f"{{{lo},{hi}}}"
        quant = {"{0,}": "*", "{1,}": "+", "{0,1}": "?"}.get(quant, quant)
        return f"(?:{body}){quant}"
    names = {"GROUPREF": "back-references", "ASSERT": "look-ahead/behind",
             "ASSERT_NOT": "negative look-ahead/behind", "POSSESSIVE_REPEAT": "possessive "
             "quantifiers", "ATOMIC_GROUP": "atomic groups", "GROUPREF_EXISTS": "conditionals"}
    raise _Refuse(f"{names.get(str(op), str(op))} are not supported in patterns")


# -- formats: exact regexes (a subset of the RFC grammar and of what jsonschema checks) --------

_YEAR = r"(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"  # 0001-9999
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = (r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
              r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_HOUR_MIN = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]"
_TIME = rf"{_HOUR_MIN}:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-]{_HOUR_MIN})"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,18}[A-Za-z0-9])?"  # <= 20 of RFC 1035's 63
_PCHAR = r"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"

#: ``format`` -> regex of the string body (JSON-safe: no quote, backslash or control char).
FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}T{_TIME}",
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    # RFC 5321 Mailbox: local part of <= 4 dot-separated atoms (<= 63 of 64 characters),
    # <= 3 labels and a TLD.
    "email": (rf"{_ATEXT}{{1,15}}(?:\.{_ATEXT}{{1,15}}){{0,3}}@(?:{_LABEL}\.){{1,3}}"
              r"[A-Za-z]{2,16}"),
    # RFC 1123 host name: <= 5 labels of <= 32 characters (<= 164 of 253).
    "hostname": rf"{_LABEL}(?:\.{_LABEL}){{0,4}}",
    # RFC 4291 IPv6: the full form of 8 groups, or "::" with at most one group after it.
    "ipv6": r"(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|::(?:[0-9a-fA-F]{1,4})?",
    # RFC 3339 Appendix A duration, exactly its ABNF.
    "duration": (r"P(?:[0-9]+W|(?:[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?|[0-9]+M(?:[0-9]+D)?"
                 r"|[0-9]+D)(?:T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?"
                 r"|[0-9]+S))?|T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?"
                 r"|[0-9]+S))"),
    # RFC 3986 URI, http(s) with a registered-name host.
    "uri": (rf"https?://(?:{_LABEL}\.)*{_LABEL}(?::[0-9]{{1,5}})?(?:/{_PCHAR}*)*"
            rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"),
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
}
# RFC 3986 URI-reference: a URI as above, or a relative reference (absolute or relative
# path — the first segment of a relative path has no ":" — with optional query/fragment).
_SEG_NC = r"(?:[A-Za-z0-9._~!$&'()*+,;=@-]|%[0-9A-Fa-f]{2})"
FORMATS["uri-reference"] = (
    rf"(?:{FORMATS['uri']}|(?:/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_SEG_NC}+(?:/{_PCHAR}*)*)?"
    rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?)"
)


# -- numbers with bounds ------------------------------------------------------------------
#
# _longest_first: outlines-core's DFA has leftmost-first semantics, so where the whole regex
# matches before the end of the text (a number at the top level of a document), an earlier
# alternative that matches a prefix cuts off later ones: `(?:[0-9]|[1-9][0-9])` never
# accepts "99". Alternatives are therefore ordered longest first.


def _uint_range(lo: int, hi: int | None) -> str:
    """Regex of the canonical decimals (no leading zero) of the integers in ``[lo, hi]``."""
    if hi is None:
        digits = len(str(lo))
        return f"(?:[1-9][0-9]{{{digits},}}|{_uint_range(lo, 10**digits - 1)})"
    parts = []
    for n in range(len(str(hi)), len(str(lo)) - 1, -1):  # longest first: see _longest_first
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10**n - 1)
        if a <= b:
            parts.append(_same_length(str(a), str(b)))
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _same_length(a: str, b: str) -> str:
    """Regex of the digit strings of ``len(a)`` between ``a`` and ``b`` inclusive."""
    if len(a) == 1:
        return a if a == b else f"[{a}-{b}]"
    if a[0] == b[0]:
        return a[0] + _same_length(a[1:], b[1:])
    rest = len(a) - 1
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return f"[{a[0]}-{b[0]}][0-9]{{{rest}}}"
    parts = [a[0] + _same_length(a[1:], "9" * rest)]
    first, last = int(a[0]) + 1, int(b[0]) - 1
    if first <= last:
        mid = f"{first}" if first == last else f"[{first}-{last}]"
        parts.append(f"{mid}[0-9]{{{rest}}}")
    parts.append(b[0] + _same_length("0" * rest, b[1:]))
    return "(?:" + "|".join(parts) + ")"


def _int_range(lo: int | None, hi: int | None) -> str | None:
    """Regex of the JSON integers in ``[lo, hi]`` (``None``: unbounded), or ``None`` if empty."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_uint_range(max(lo or 0, 0), hi))
    if lo is None or lo < 0:
        parts.append("-" + _uint_range(max(-hi, 1) if hi is not None else 1,
                                       -lo if lo is not None else None))
    if lo is not None and hi is not None and lo > hi:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


Bound = tuple[int, bool]  # (value, exclusive)


