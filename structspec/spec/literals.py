"""Values a request mentions, and the order in which to draft them.

The ``values`` drafter copies literals of the request into the output: numbers first (the
default model spells them digit by digit, and they were most of the tokens no other draft
covered), quoted strings, names; where a property's value starts, the default its note in
the prompt names. These functions read them from the prompt's text and rank them against
what the output has written so far. All pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from structspec.vocab import Vocabulary

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
_QUOTED = re.compile(r"\"([^\"\\\n]{1,80})\"|'([^'\\\n]{1,80})'")
_KEY = re.compile(r"\"([^\"\\\n]{1,80})\"\s*:")
#: Prose inside a schema: the values of these keys are read, not copied.
_PROSE = re.compile(r"\"(?:description|title|\$comment)\"\s*:\s*\"(?:[^\"\\]|\\.)*\"")
_NAME = re.compile(r"\b[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*|\b[A-Za-z_]\w*[._]\w[\w.]*")
#: A single-quoted value inside prose (``defaults to 'units'``): the quote opens after a
#: non-word character and closes before one, so apostrophes (``what's``) do not match.
_SINGLE = re.compile(r"(?<![\w'])'([^'\\\n\"]{1,80})'(?![\w'])")

#: JSON Schema type names: values in a schema shown in the prompt, seldom in an answer.
_TYPE_NAMES = frozenset({"object", "string", "integer", "number", "boolean", "array", "null"})
#: Values a model writes without the request naming them, tried after the request's own.
DEFAULT_VALUES = ("1",)


def extract_literals(text: str, limit: int = 64) -> list[str]:
    """Values a request mentions, in priority order: numbers, quoted strings, capitalized
    names and dotted/underscored identifiers; deduplicated, at most ``limit``. Quoted
    strings used as keys anywhere in ``text`` (a JSON Schema's keywords and property names)
    and JSON type names are left out: they are structure, not values."""
    keys = {m.group(1) for m in _KEY.finditer(text)}
    prose = [m.span() for m in _PROSE.finditer(text)]
    found: list[str] = []
    for m in _NUMBER.finditer(text):
        found.append(m.group(0))
    for m in _QUOTED.finditer(text):
        value = m.group(1) or m.group(2)
        if value in keys or value in _TYPE_NAMES or (
                m.group(1) and any(a <= m.start() < b for a, b in prose)):
            continue
        found.append(value)
    # Values quoted inside a description ("defaults to 'units'") are the call's likely
    # values, though the description around them is prose.
    for a, b in prose:
        found.extend(m.group(1) for m in _SINGLE.finditer(text, a, b))
    # Capitalized words that start a sentence ("Find", "What", "The") are seldom values:
    # after the other names.
    sentence_initial: list[str] = []
    for m in _NAME.finditer(text):
        name = m.group(0)
        if " " not in name and name[:1].isupper() and _starts_sentence(text, m.start()):
            sentence_initial.append(name)
        else:
            found.append(name)
    found.extend(sentence_initial)
    out: list[str] = []
    seen: set[str] = set()
    for item in found:
        item = item.strip()
        if not any(ch.isalnum() for ch in item):  # punctuation caught between quotes
            continue
        if item and item not in seen:
            seen.add(item)
            out.append(item)
            if len(out) >= limit:
                break
    return out


def request_text(vocab: Vocabulary, prompt_ids: Sequence[int]) -> str:
    """The request inside a chat prompt: the last stretch of text between special tokens
    (chat markers) that holds more than a role name, without a first line that is one word
    (``user``). A prompt without special tokens is all request. Pure."""
    special = vocab.special_token_ids
    parts: list[list[int]] = [[]]
    for t in prompt_ids:
        if t in special:
            parts.append([])
        else:
            parts[-1].append(t)
    for part in reversed(parts):
        text = vocab.decode_text(part).strip()
        first, _, rest = text.partition("\n")
        if rest and len(first.split()) == 1:
            text = rest.strip()
        if len(text.split()) > 1:
            return text
    return vocab.decode_text(prompt_ids)


def request_literals(vocab: Vocabulary, prompt_ids: Sequence[int], limit: int = 64,
                     prompt: str | None = None, request: str | None = None) -> list[str]:
    """:func:`extract_literals` of the request (``request``, else :func:`request_text`)
    first, then of the whole prompt (``prompt``: its text where the caller decoded it
    already): the values a call copies are the request's, while a system message and the
    schema shown there name many words no value holds (``JSON``, ``Preferred``, the schema's
    own names), which ranked first had taken the values drafter's branches."""
    if prompt is None:
        prompt = vocab.decode_text(prompt_ids)
    if request is None:
        request = request_text(vocab, prompt_ids)
    own = extract_literals(request, limit)
    return list(dict.fromkeys([*own, *extract_literals(prompt, limit)]))[:limit]


#: A property's line in the typed template a prompt shows the schema as
#: (:mod:`structspec.schema_prompt`): ``"unit"?: string // The unit... default is 'cm'.``
_FIELD_NOTE = re.compile(r'^[ \t]*"([^"\\\n]{1,80})"\??:[^\n]*?//([^\n]*)$', re.M)
#: "default is km/h", "defaults to 'units'", "Default value is 'real'", "default: 10".
_DEFAULT = re.compile(r"\bdefaults?(?:\s+(?:value|unit|method))?(?:\s+(?:is|to|of))?"
                      r"\s*:?\s*('[^'\n]{1,80}'|\"[^\"\n]{1,80}\"|[^\s,;()]+)", re.I)


def field_literals(text: str, limit: int = 6) -> dict[str, list[str]]:
    """Per property name, the values the prompt's note on that property names: its default
    (``default is km/h``) first, then the other single-quoted words of the note, in order;
    at most ``limit`` each. Read from the typed template's lines (``"key"?: type // note``),
    the default way a ``Generator`` shows a schema. A model filling an optional property
    mostly writes the default its note gives ('cm', 'km/h', 'trapezoid' in BFCL calls),
    which the request itself seldom names. Pure."""
    out: dict[str, list[str]] = {}
    for m in _FIELD_NOTE.finditer(text):
        key, note = m.group(1), m.group(2)
        found = []
        for d in _DEFAULT.finditer(note):
            value = d.group(1).strip("'\"").rstrip(".")
            if any(ch.isalnum() for ch in value) and value.lower() not in _NOT_VALUES:
                found.append(value)
        found.extend(q.group(1) for q in _SINGLE.finditer(note))
        values = list(dict.fromkeys(v.strip() for v in found if v.strip()))[:limit]
        if values:
            out.setdefault(key, values)
    return out


#: Words after "default" that start a phrase, not a value ("defaults to the current date").
_NOT_VALUES = frozenset({"the", "a", "an", "is", "to", "if", "when", "not", "it", "this"})
#: The property whose value starts at the end of the output (``"unit":"`` or ``"n": ``).
_OPEN_VALUE = re.compile(rb'"([^"\\\n]{1,80})"\s*:\s*"?$')


def open_property(tail: bytes) -> str | None:
    """The property whose value starts at the end of output text ``tail`` (``"unit":"`` or
    ``"n": ``), or ``None``."""
    m = _OPEN_VALUE.search(tail[-96:])
    return m.group(1).decode("utf-8", errors="replace") if m else None


def _starts_sentence(text: str, i: int) -> bool:
    """Whether ``text[i:]`` starts a sentence or a line (only blanks after ``.!?:`` or a
    line break before it)."""
    j = i
    while j > 0 and text[j - 1] in " \t":
        j -= 1
    return j == 0 or text[j - 1] in '.!?:\n"('


def rank_literals(literals: Sequence[str], written: str, *, text_first: bool = False
                  ) -> list[str]:
    """The order in which to try ``literals`` after output ``written``: requests tend to
    list values in the order a call uses them, so first the ones not written yet that come
    after the latest one written, then all the others in request order (code repeats its
    names), then :data:`DEFAULT_VALUES`; with ``text_first`` (a JSON string value) the ones
    that are not numbers go first, in that order. A literal counts as written where it
    stands as a whole word that is not a JSON key (:func:`last_use`). Pure."""
    ends = [last_use(written, lit) for lit in literals]
    if text_first:  # words not written yet in request order, the written ones, numbers
        words = [(lit, end) for lit, end in zip(literals, ends, strict=True)
                 if not _NUMBER.fullmatch(lit)]
        numbers = [lit for lit in literals if _NUMBER.fullmatch(lit)]
        return ([lit for lit, end in words if end < 0] + [lit for lit, end in words if end >= 0]
                + rank_literals(numbers, written))
    last, last_end = -1, -1
    for i, end in enumerate(ends):
        if end > last_end:
            last, last_end = i, end
    after = [lit for i, (lit, end) in enumerate(zip(literals, ends, strict=True))
             if end < 0 and i > last]
    ranked = after + [lit for lit in literals if lit not in after]
    return ranked + [d for d in DEFAULT_VALUES if d not in ranked]


#: Words and numbers of a request, for :func:`key_distances`.
_TERM = re.compile(r"[A-Za-z]+|\d+(?:\.\d+)?")
#: How much a character of distance from the property's words weighs against one place of
#: the ranking (:func:`rank_for_key`), and the distance of a literal far from them.
KEY_WEIGHT = 0.1
KEY_FAR = 60


@lru_cache(maxsize=256)
def key_distances(request: str, key: str, literals: tuple[str, ...]) -> dict[str, int]:
    """Per literal of the request: how many characters it stands from the nearest word of
    property ``key``'s name in the request (a word of three letters or more matches where
    their first four letters agree: ``years`` / "year", ``annual_interest_rate`` / "rate");
    ``{}`` where no word of ``key`` occurs. "a deposit of $1000, annual interest rate of
    3% for 1 year": 1000 stands nearest ``deposit``, 1 nearest ``years``. Pure
    (memoized)."""
    words = [w.lower() for w in re.split(r"[_\W]+", key) if len(w) >= 3]
    anchors = [m.start() for m in _TERM.finditer(request)
               if len(m.group(0)) >= 3 and any(
                   m.group(0).lower()[:4] == w[:4] or w.startswith(m.group(0).lower()[:4])
                   for w in words)]
    if not anchors:
        return {}
    out: dict[str, int] = {}
    for lit in literals:
        starts = _whole_words(request, lit)
        if starts:
            out[lit] = min(abs(p - a) for p in starts for a in anchors)
    return out


def _whole_words(text: str, literal: str) -> list[int]:
    """Where ``literal`` starts in ``text`` as a whole word (as :func:`last_use` reads one).
    Pure."""
    out = []
    pos = text.find(literal) if literal else -1
    while pos >= 0:
        if _whole_word(text, pos, pos + len(literal)):
            out.append(pos)
        pos = text.find(literal, pos + 1)
    return out


def _whole_word(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` stands as a whole word: no letter, digit, ``_`` or ``.``
    before it, no letter, digit or ``_`` after it, nor a decimal point and digit. Pure."""
    before, nxt = text[start - 1] if start else "", text[end:end + 2]
    return (not (before and (before.isalnum() or before in "_."))
            and not (nxt and (nxt[0].isalnum() or nxt[0] == "_"
                              or (nxt[0] == "." and nxt[1:].isdigit()))))


def rank_for_key(ranked: Sequence[str], distances: dict[str, int]) -> list[str]:
    """``ranked`` reordered by place plus :data:`KEY_WEIGHT` times the distance from the
    property's words (:func:`key_distances`): a literal named right beside the property
    moves up a few places. On the default model's BFCL calls the literal ranked first was
    the model's value 218 times in 281 against 206 by order alone (held-out calls 137 / 174
    against 129). Pure."""
    if not distances:
        return list(ranked)
    return [lit for _, lit in sorted(
        (i + KEY_WEIGHT * distances.get(lit, KEY_FAR), lit) for i, lit in enumerate(ranked))]


def last_use(written: str, literal: str) -> int:
    """Where the last use of ``literal`` as a value in ``written`` ends, or ``-1``.

    A use stands as a whole word (``1`` is not used by ``1000``, nor ``rate`` by
    ``interest_rate``; a number not by a longer one, ``3`` not by ``3.5``) and is not a JSON
    key (``"annual_interest_rate":``): a key the output writes names where a value goes, and
    counting it as the latest value written sent the ranking back to the request's first
    value (BFCL ``calculate_roi``: after ``"deposit": 1000, "annual_interest_rate": ``, 1000
    was drafted before 3). Pure."""
    if not literal:
        return -1
    stop = len(written)
    while (pos := written.rfind(literal, 0, stop)) >= 0:
        end = pos + len(literal)
        if _whole_word(written, pos, end) and not _KEY_AFTER.match(written, end):
            return end
        stop = end - 1
    return -1


#: What follows a JSON key's name: its closing quote, then a colon.
_KEY_AFTER = re.compile(r'"\s*:')
