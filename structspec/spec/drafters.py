"""Drafters: cheap guesses of what comes next, grown into a draft tree.

Every drafter adds branches under a node of a :class:`~structspec.spec.tree.TreeBuilder`,
which refuses any token the constraint rejects — so every node of a tree is legal. The
sources (DESIGN.md, "Speculation"):

- ``forced``: text every valid continuation must emit next (keys, punctuation, fixed
  indentation), tokenized canonically in context; where the constraint allows exactly one
  token, that token. Always accepted where only one token is legal.
- ``alternatives``: where the constraint allows few tokens (an enum, ``true|false``, the next
  key), one branch per option, each extended by its forced continuation.
- ``lookup``: n-gram matches of the latest tokens in the prompt and the output so far; the
  tokens that followed each match are a branch (prompt lookup decoding, Saxena 2023).
- ``text_lookup`` (:mod:`structspec.spec.text_lookup`): the same over the prompt's *text*,
  case folded — a value echoed into a JSON string is tokenized otherwise than in the request.
- ``values``: literals of the request (numbers first, then quoted strings, names) that fit
  the constraint here, tokenized in context; also the rest of a literal whose beginning was
  just written.
- ``closers``: where a free value (number, string) may end, the punctuation that would end
  it — the tokens this output used most — with the forced continuation (the next key).
- ``splits``: the other tokenization of forced punctuation along the forced chain where
  the model has written it both ways over earlier requests (``'{"'`` or ``'{'`` + ``'"'``
  to open an answer); with :func:`learn_choice` the forced chain itself follows the
  model's usual split, learned per context in this output and across requests
  (``AcceptanceModel.splits``).
- ``topk``: the most likely tokens of the target's last distribution, for the first free
  position (a stale guess: it predicted the token *before*; cheap and sometimes right).
- ``draft_model`` (:mod:`structspec.spec.draft_model`): a small model with the target's
  tokenizer expands its best legal tokens level by level (``ctx.draft_model``).
- ``draft_head`` (:mod:`structspec.spec.draft_head`): a learned head drafts from the
  target's own hidden state (``ctx.draft_head``).
- ``corpus`` (:mod:`structspec.spec.corpus`): the most common continuation of the latest
  n-gram in answers the target wrote before (``ctx.corpus``).

:func:`build_tree` runs them: first the forced chain from the root (bounded by the draft
depth only — forced tokens are nearly always accepted), then each drafter in priority order
at the chain's end, within the speculative node and branch budgets.

Drafters are deterministic functions of the context, which is what lossless sampling needs
(a draft is a point mass). New drafters register with :func:`register_drafter`.
"""

from __future__ import annotations

import bisect
import contextlib
import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from structspec.automata.base import Constraint, State, TokenMask
from structspec.spec.tree import TreeBuilder
from structspec.vocab import Vocabulary

if TYPE_CHECKING:
    from structspec.spec.cost import AcceptanceModel

FORCED = "forced"
#: Source of the values drafter's branches after its first at a node (the literal it ranks
#: first is far likelier than the rest: on BFCL calls the request's next unwritten number is
#: the model's value most of the time). Counted apart, so the plan prices them apart.
VALUES_ALT = "values_alt"


# -- canonical tokenization -------------------------------------------------------------


def _utf8_prefix(data: bytes) -> str:
    """The longest prefix of ``data`` that is valid UTF-8, decoded."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


class CanonicalTokenizer:
    """Tokenize text the way the tokenizer would, in the context of the previous token.

    ``tokens_after(prev, text)`` encodes ``prev + text`` and returns the ids after the part
    that spells ``prev`` — so ``text`` is split exactly as in a full re-tokenization. If the
    re-tokenization merges across the boundary (the committed token would have been cut
    differently), ``text`` is encoded alone. Results are memoized (bounded). Not thread-safe.
    """

    def __init__(self, tokenizer: Any, vocab: Vocabulary, max_entries: int = 8192) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.max_entries = max_entries
        self._memo: dict[tuple[bytes, bytes], tuple[int, ...]] = {}
        self._backend = _agreeing_backend(tokenizer)

    def encode(self, text: str) -> list[int]:
        """Plain ``tokenizer.encode`` without special tokens (by the fast tokenizer's Rust
        backend where it gives the same ids: half the time per call, ~70 calls per BFCL
        request)."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def tokens_after(self, prev: bytes, text: bytes) -> tuple[int, ...]:
        """Canonical ids for ``text`` written right after a token spelling ``prev``."""
        key = (prev, text)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        body = _utf8_prefix(text)
        result: tuple[int, ...] = ()
        if body:
            try:
                head = prev.decode("utf-8")
            except UnicodeDecodeError:
                head = ""
            tokens = self.vocab.tokens
            ids = self.encode(head + body) if head else []
            acc, i = b"", 0
            while i < len(ids) and len(acc) < len(prev):
                acc += tokens[ids[i]]
                i += 1
            if head and acc == prev and i < len(ids):
                result = tuple(ids[i:])
            else:
                result = tuple(self.encode(body))
            if self.vocab.decode(result) != body.encode("utf-8"):  # not a faithful split
                result = ()
        if len(self._memo) >= self.max_entries:
            self._memo.clear()
        self._memo[key] = result
        return result


#: Texts a fast tokenizer's backend must encode as the tokenizer does before it stands in
#: for it: structured punctuation, code, spaces, non-ASCII and a special token's spelling.
_BACKEND_PROBES = ('{"name": "f", "arguments": {"x": 1.5}}', '","', '\n    return x[0]\n',
                   '  héllo wörld 😀', '<|im_start|>user', '\t\t{}', "It's 12:30.")


def _agreeing_backend(tokenizer: Any) -> Any:
    """The Rust ``tokenizers.Tokenizer`` behind a Hugging Face fast tokenizer, where it
    encodes the probe texts exactly as ``tokenizer.encode`` does; else ``None`` (a slow
    tokenizer, or one whose Python layer changes the ids)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not callable(getattr(backend, "encode", None)):
        return None
    try:
        for text in _BACKEND_PROBES:
            if backend.encode(text, add_special_tokens=False).ids != list(
                    tokenizer.encode(text, add_special_tokens=False)):
                return None
    except Exception:  # an object that only looks like a backend
        return None
    return backend


_CANONICAL: dict[tuple[int, int], tuple[Any, Any, CanonicalTokenizer]] = {}


def canonical_tokenizer(tokenizer: Any, vocab: Vocabulary) -> CanonicalTokenizer:
    """The :class:`CanonicalTokenizer` of ``tokenizer`` and ``vocab``, one per live pair: its
    memo depends on nothing else, and the forced texts of structured output (``'", "'``, a
    schema's keys) repeat from request to request — a memo per request re-encoded them each
    time (~90 ``tokenizer.encode`` calls per BFCL call, 3-4 ms of a 300-ms request)."""
    key = (id(tokenizer), id(vocab))
    hit = _CANONICAL.get(key)
    if hit is not None and hit[0]() is tokenizer and hit[1]() is vocab:
        return hit[2]
    canon = CanonicalTokenizer(tokenizer, vocab)
    # (an object without weak references: a memo per call, as before)
    with contextlib.suppress(TypeError):
        _CANONICAL[key] = (weakref.ref(tokenizer), weakref.ref(vocab), canon)
    return canon


# -- n-gram index ---------------------------------------------------------------------


class NgramIndex:
    """Where each n-gram (``1 <= n <= max_n``) of a growing token list ends.

    ``extend`` appends tokens; ``continuations(context, ...)`` finds earlier occurrences of
    the context's last ``n`` tokens (longest ``n`` first, latest occurrence first) and returns
    the tokens that followed. Not thread-safe.
    """

    def __init__(self, max_n: int = 3) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self._ends: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_n + 1)]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` and index the n-grams that end in them."""
        for t in tokens:
            self.tokens.append(int(t))
            end = len(self.tokens)
            for n in range(1, self.max_n + 1):
                if end >= n:
                    self._ends[n].setdefault(tuple(self.tokens[end - n:end]), []).append(end)

    def ends(self, ngram: Sequence[int]) -> Sequence[int]:
        """Positions just after each occurrence of ``ngram`` (``1 <= len <= max_n``)."""
        n = len(ngram)
        if not 1 <= n <= self.max_n:
            return ()
        return self._ends[n].get(tuple(ngram), ())

    def unigram_ends(self) -> dict[tuple[int, ...], list[int]]:
        """``{(token,): positions just after each occurrence, ascending}`` — :meth:`ends`
        for every single token at once (the live table: read, do not change)."""
        return self._ends[1] if self.max_n >= 1 else {}

    def continuations(
        self, context: Sequence[int], length: int, *, min_n: int = 1, per_n: int = 4,
        scan: int = 16,
    ) -> list[tuple[int, list[int]]]:
        """``(n, tokens)`` pairs: what followed earlier matches of ``context[-n:]``.

        Longest ``n`` first; per ``n`` the ``scan`` latest matches are read and at most
        ``per_n`` continuations kept, latest first, ``length`` tokens each at most. A
        continuation that is a prefix of one already kept adds nothing (a tree shares
        prefixes) and is dropped; one that extends a kept one replaces it.
        """
        out: list[tuple[int, list[int]]] = []
        total = len(self.tokens)
        for n in range(min(self.max_n, len(context)), min_n - 1, -1):
            ends = self._ends[n].get(tuple(context[-n:]))
            if not ends:
                continue
            kept: list[list[int]] = []
            for end in reversed(ends[-scan:]):
                if end >= total:
                    continue
                cont = self.tokens[end:end + length]
                if any(k[: len(cont)] == cont for k in kept) or any(
                        k[: len(cont)] == cont for _, k in out):
                    continue
                longer = [i for i, k in enumerate(kept) if cont[: len(k)] == k]
                if longer:
                    kept[longer[0]] = cont
                    continue
                if len(kept) < per_n:
                    kept.append(cont)
            out.extend((n, k) for k in kept)
        return out


# -- literals of the request --------------------------------------------------------------

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
                     prompt: str | None = None) -> list[str]:
    """:func:`extract_literals` of the request (:func:`request_text`) first, then of the
    whole prompt (``prompt``: its text where the caller decoded it already): the values a
    call copies are the request's, while a system message and the schema shown there name
    many words no value holds (``JSON``, ``Preferred``, the schema's own names), which
    ranked first had taken the values drafter's branches."""
    if prompt is None:
        prompt = vocab.decode_text(prompt_ids)
    own = extract_literals(request_text(vocab, prompt_ids), limit)
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
    that are not numbers go first, in that order. Pure."""
    if text_first:  # words not written yet in request order, the written ones, numbers
        numbers = [lit for lit in literals if _NUMBER.fullmatch(lit)]
        words = [lit for lit in literals if not _NUMBER.fullmatch(lit)]
        fresh = [lit for lit in words if lit not in written]
        return (fresh + [lit for lit in words if lit in written]
                + rank_literals(numbers, written))
    last, last_pos = -1, -1
    unwritten: list[int] = []
    for i, lit in enumerate(literals):
        pos = written.rfind(lit)
        if pos < 0:
            unwritten.append(i)
        elif pos + len(lit) > last_pos:
            last, last_pos = i, pos + len(lit)
    after = [literals[i] for i in unwritten if i > last]
    ranked = after + [lit for lit in literals if lit not in after]
    return ranked + [d for d in DEFAULT_VALUES if d not in ranked]


def drafter_of(source: str) -> str:
    """The drafter a node's source belongs to: a drafter's alternative branches
    (:data:`VALUES_ALT`, ``draft_head_alt``) are its own where the drafter gate asks whether
    it still pays. Pure."""
    return source[: -len("_alt")] if source.endswith("_alt") else source


# -- context, protocol, registry -------------------------------------------------------------


@dataclass
class DraftContext:
    """What drafters may look at for one step. Built by the decode loop; not thread-safe.

    Attributes:
        constraint: the compiled constraint.
        vocab: its vocabulary.
        canon: canonical tokenization in context.
        history: ``NgramIndex`` over prompt + committed output (the root token included).
        prompt_len: how many of ``history.tokens`` are the prompt.
        literals: values from the request (see :func:`extract_literals`).
        last_logits: ``[V]`` masked logits the root token was chosen from, if any.
        options: per-drafter knobs (``lookup_max_n``, ``alternatives_max``, ``topk``, ...).
        choices: ``(context, canonical first token)`` of some forced text -> the token the
            model last wrote there in this output (see :func:`learn_choice`).
        split_suffixes: suffixes the model splits off canonical tokens (ordered set).
        draft_model: a :class:`~structspec.spec.draft_model.DraftModel` for the
            ``draft_model`` drafter, or ``None``.
        acceptance: the running :class:`~structspec.spec.cost.AcceptanceModel` of this
            decode, if any (drafters may size their effort by it).
        draft_head: a :class:`~structspec.spec.draft_head.DraftHead` for the ``draft_head``
            drafter, or ``None``.
        head_anchor: ``(hidden [H], tokens)``: the target's last hidden state at a committed
            position and the committed tokens after it, the root last (set by the decode
            loop when a draft head is in use).
        corpus: a :class:`~structspec.spec.corpus.TokenCorpus` for the ``corpus`` drafter,
            or ``None``.
        field_literals: property name -> the values the prompt's note on it names
            (:func:`field_literals`): tried first where that property's value starts.
        text_index: a :class:`~structspec.spec.text_lookup.TextIndex` of the prompt for
            the ``text_lookup`` drafter, or ``None``.
        sampling: the decode's sampling parameters, ``None`` when greedy.
        draws: the decode's per-position uniform numbers
            (:class:`~structspec.sampling.TokenDraws`), ``None`` when greedy: a drafter with
            a distribution can draft the token a position's number will pick
            (:meth:`draw_below`).
    """

    constraint: Constraint
    vocab: Vocabulary
    canon: CanonicalTokenizer
    history: NgramIndex
    prompt_len: int
    literals: list[str] = field(default_factory=list)
    last_logits: torch.Tensor | None = None
    options: dict[str, Any] = field(default_factory=dict)
    choices: dict[tuple[bytes, bytes], int] = field(default_factory=dict)
    split_suffixes: dict[bytes, None] = field(default_factory=dict)
    draft_model: Any = None
    acceptance: AcceptanceModel | None = None
    draft_head: Any = None
    head_anchor: Any = None
    corpus: Any = None
    field_literals: dict[str, list[str]] = field(default_factory=dict)
    text_index: Any = None
    sampling: Any = None
    draws: Any = None

    def draw_below(self, depth: int) -> float | None:
        """The uniform number of the output position just below a tree node at ``depth``
        (the root, the last committed token, is at depth 0), or ``None`` when greedy."""
        if self.draws is None:
            return None
        return self.draws(len(self.history.tokens) - self.prompt_len + depth)

    def output_text(self, tail: int = 64) -> bytes:
        """The last ``tail`` tokens of the committed output, as bytes."""
        toks = self.history.tokens
        start = max(self.prompt_len, len(toks) - tail)
        return self.vocab.decode(toks[start:])


class Drafter(Protocol):
    """Adds branches under ``frontier``; every token goes through ``builder`` (legality)."""

    name: str

    def propose(self, ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
        """Add branches below node ``frontier`` of ``builder``. Mutates ``builder`` only."""
        ...


DRAFTERS: dict[str, Callable[[], Drafter]] = {}


def register_drafter(name: str, factory: Callable[[], Drafter]) -> None:
    """Make ``factory`` available under ``name`` for :func:`make_drafters` (overrides)."""
    DRAFTERS[name] = factory


def make_drafters(names: Sequence[str]) -> list[Drafter]:
    """Instantiate registered drafters by name, in order.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    out = []
    for name in names:
        if name == FORCED:  # the forced chain is always built by build_tree
            continue
        factory = DRAFTERS.get(name)
        if factory is None:
            raise ValueError(f"unknown drafter {name!r}; known: {sorted([*DRAFTERS, FORCED])}")
        out.append(factory())
    return out


# -- forced continuation --------------------------------------------------------------------


def costly_masks(constraint: Constraint) -> bool:
    """Whether ``constraint``'s masks cost enough that drafters should not compute them for
    nodes decoding may never reach: it offers ``known_allowed`` (a code grammar, whose masks
    cost milliseconds each)."""
    return getattr(constraint, "known_allowed", None) is not None


def cheap_allowed(constraint: Constraint, state: State) -> TokenMask | None:
    """``constraint.allowed(state)`` where that costs little: always, unless its masks are
    costly (:func:`costly_masks`); then the mask if computed already, else ``None``.
    Drafters ask about many nodes the decoding never reaches; they use this where a cheaper
    check can stand in."""
    if costly_masks(constraint):
        return constraint.known_allowed(state)  # type: ignore[attr-defined]
    return constraint.allowed(state)


def forced_tokens(ctx: DraftContext, state: State, prev_token: int) -> list[int]:
    """The tokens of the text forced in ``state``, tokenized canonically after ``prev_token``.

    Where the constraint allows exactly one token (and the state does not accept), that
    token. Where the model has shown it splits some forced text differently (learned by
    :func:`learn_choice` — e.g. ``'{'`` then ``'"'`` rather than the canonical ``'{"'`` as
    the first token of an answer), its split is used and the rest re-tokenized after it (see
    :func:`_preferred`). May be empty; the builder still checks each token's legality.

    Where the mask is not cheap (:func:`cheap_allowed`), this looks at the forced text alone
    and checks the first token with ``advance``, as the builder does: it then misses only a
    single allowed token where several bytes are legal (possible only where dead-end pruning
    removed the other tokens).
    """
    c = ctx.constraint
    mask = cheap_allowed(c, state)
    if mask is not None and mask.count() == 1 and not c.is_accepting(state):
        return [int(mask.ids()[0])]
    text = c.forced(state)
    if not text:
        return []
    if mask is None:
        def legal(token: int) -> bool:
            return c.advance(state, token) is not None
    else:
        legal = mask.__contains__
    tokens = ctx.vocab.tokens
    prev = tokens[prev_token]
    ids = list(ctx.canon.tokens_after(prev, text))
    if ctx.choices or ctx.split_suffixes or _split_habits(ctx) is not None:
        out: list[int] = []
        pos = 0
        while ids:
            first = _preferred(ctx, ids[0], prev)
            if first != ids[0] and not text.startswith(tokens[first], pos):
                # A token running on past the forced text (the model's '",' where only '"'
                # is forced, the choice of ',' or ']' after it) is taken where it is legal
                # here; otherwise the learned split does not fit this text.
                if pos == 0 and len(ids) == 1 and legal(first):
                    return [first]
                first = ids[0]
            out.append(first)
            pos += len(tokens[first])
            prev = tokens[first]
            # After the model's own split, re-tokenize what is left.
            ids = ids[1:] if first == ids[0] else list(ctx.canon.tokens_after(prev, text[pos:]))
        ids = out
    if ids and legal(ids[0]):
        return ids
    # The canonical split does not fit here: fall back to the longest allowed token that is
    # a prefix of the forced text.
    for cut in range(min(len(text), 32), 0, -1):
        for i in ctx.vocab.ids_for(text[:cut]):
            if legal(i):
                return [i]
    return []


#: Last bytes after which a split suffix is learned and applied to other tokens: separators,
#: not openers such as ``{`` or ``[``, which a model keeps glued to the quote that follows.
_SEPARATOR_ENDS = frozenset({b":", b",", b";", b"=", b" "})


def _punctuation(token: bytes) -> bool:
    """Whether ``token`` has no letter or digit: the tokens whose splits are learned (how a
    model splits ``'","'`` carries over between outputs; how it splits a name's pieces does
    not)."""
    return not any(chr(b).isalnum() or b >= 0x80 for b in token)


def _split_habits(ctx: DraftContext) -> AcceptanceModel | None:
    """``ctx.acceptance`` when it has learned how the model splits forced text, else
    ``None`` (nothing to consult)."""
    acceptance = ctx.acceptance
    return acceptance if acceptance is not None and acceptance.splits else None


def split_context(prev: bytes) -> bytes:
    """The context a tokenization choice is learned in: the previous token's last byte where
    it is punctuation or a line break (``'{'`` nested after ``'":'`` and ``'{'`` as the first
    token of an answer, after the template's ``'\\n'``, are split differently), else
    ``b"w"`` (after a word or a number). Pure."""
    last = prev[-1:]
    return b"w" if not last or last.isalnum() or last == b"_" or last[0] >= 0x80 else last


def _preferred(ctx: DraftContext, canonical: int, prev: bytes) -> int:
    """The token the model is expected to write where ``canonical`` is the canonical split,
    after a token ``prev``: its choice in the same context earlier in this output, else its
    usual choice there over earlier requests (``ctx.acceptance``), else ``canonical``
    shortened by a suffix it split off after a separator in this output, else
    ``canonical``."""
    tokens = ctx.vocab.tokens
    cb = tokens[canonical]
    key = (split_context(prev), cb)
    exact = ctx.choices.get(key)
    if exact is not None:
        return exact
    habits = _split_habits(ctx)
    if habits is not None:
        shares = habits.split_shares(key, canonical)
        if shares:
            return shares[0][0]
    for suffix in ctx.split_suffixes:
        # Only after a separator: a model that writes '",' + '"' for '","' may write '":'
        # + '"' for '":"', but keeps '{"' whole.
        if cb[: -len(suffix)][-1:] not in _SEPARATOR_ENDS:
            continue
        if len(cb) > len(suffix) and cb.endswith(suffix):
            shorter = ctx.vocab.ids_for(cb[: -len(suffix)])
            if shorter:
                return shorter[0]
    return canonical


def learn_choice(ctx: DraftContext, state: State, prev_token: int, chosen: int) -> None:
    """Remember how the model tokenized forced text: in ``state`` (after ``prev_token``) it
    wrote ``chosen``. Records the choice for this output and (in ``ctx.acceptance``) across
    requests, keyed by the canonical first token and :func:`split_context`; and when
    ``chosen`` is the canonical token minus a suffix after a separator (``'",'`` for
    ``'","'``), that suffix. Mutates ``ctx``; cheap (memoized tokenization)."""
    text = ctx.constraint.forced(state)
    if not text:
        return
    tokens = ctx.vocab.tokens
    prev = tokens[prev_token]
    ids = ctx.canon.tokens_after(prev, text)
    got = tokens[chosen]
    # a split of the forced text, or one token for all of it and the choice after it
    overhang = len(ids) == 1 and got.startswith(text)
    if not ids or not got or not (text.startswith(got) or overhang):
        return
    canonical = tokens[ids[0]]
    if not _punctuation(canonical):
        return
    key = (split_context(prev), canonical)
    ctx.choices[key] = chosen
    if ctx.acceptance is not None:
        ctx.acceptance.record_split(key, chosen)
    if (chosen != ids[0] and canonical.startswith(got) and got[-1:] in _SEPARATOR_ENDS
            and len(ctx.split_suffixes) < 8):
        ctx.split_suffixes[canonical[len(got):]] = None


def learn_closer(ctx: DraftContext, before: State, after: State, chosen: int) -> None:
    """Remember the punctuation the model ended a free value with: ``chosen`` took
    ``before``, where the value could go on (a token with a letter or digit was allowed),
    to ``after``, where it could not (``'",'`` closing a string; not ``'"'`` opening one).
    The closers drafter ranks by it: ``'",'`` after a string with keys still to come, where
    the output's other uses of ``'"'`` had ranked the bare quote first. Only where masks
    are cheap; counted in ``ctx.acceptance``, across requests."""
    if ctx.acceptance is None or chosen >= len(ctx.vocab.tokens):
        return
    struct = structural_tokens(ctx.vocab)
    if not struct[chosen]:
        return
    if _content_allowed(ctx, before) and _content_allowed(ctx, after) is False:
        ctx.acceptance.record_closer(chosen)


def _content_allowed(ctx: DraftContext, state: State) -> bool | None:
    """Whether a token with a letter or digit is allowed in ``state`` (``None``: the mask
    is not cheap here)."""
    mask = cheap_allowed(ctx.constraint, state)
    if mask is None:
        return None
    struct = structural_tokens(ctx.vocab)
    allowed = mask.to_bool()
    n = min(allowed.size, struct.size)
    return bool((allowed[:n] & ~struct[:n]).any())


def extend_forced(ctx: DraftContext, builder: TreeBuilder, node: int, *, counted: bool = True,
                  max_tokens: int | None = None) -> int:
    """Follow forced text from ``node`` as far as the builder allows; returns the last node."""
    added = 0
    while max_tokens is None or added < max_tokens:
        ids = forced_tokens(ctx, builder.states[node], builder.tokens[node])
        if max_tokens is not None:
            ids = ids[: max_tokens - added]
        end = builder.add_chain(node, ids, FORCED, counted=counted)
        if end == node:
            return node
        added += builder.depths[end] - builder.depths[node]
        node = end
    return node


# -- the drafters ----------------------------------------------------------------------------


class LookupDrafter:
    """Branches copied from what followed earlier occurrences of the latest n-gram."""

    name = "lookup"

    def propose(self, ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
        max_n = int(ctx.options.get("lookup_max_n", ctx.history.max_n))
        per_n = int(ctx.options.get("lookup_per_n", 2))
        length = builder.room(frontier)
        if length <= 0 or max_n <= 0:
            return
        context = recent_tokens(ctx, builder, frontier, max_n)
        for _, cont in ctx.history.continuations(context, length, per_n=per_n):
            end = builder.add_branch(frontier, cont, self.name)
            if end is not None:
                extend_forced(ctx, builder, end, max_tokens=4)


class ValuesDrafter:
    """Literals of the request that fit the constraint here, tokenized in context; where a
    property's value starts, the values the prompt's note on that property names first
    (``ctx.field_literals``). The first branch opened at a node is ``values``, the others
    :data:`VALUES_ALT`: the acceptance model then learns the first-ranked literal's rate
    apart from the rest, and the plan spends nodes on its continuation (closer, next key,
    next value) rather than on three less likely literals."""

    name = "values"

    def propose(self, ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
        if not ctx.literals or builder.room(frontier) <= 0:
            return
        prev = ctx.vocab.token_bytes(builder.tokens[frontier])
        state = builder.states[frontier]
        mask = ctx.constraint.allowed(state)
        max_branches = int(ctx.options.get("values_max", 4))
        opened = 0
        tail = text_before(ctx, builder, frontier)
        # After a word, a literal needs a space first (free text, code); after a quote,
        # bracket or space it does not (JSON values).
        spaced = bool(prev) and (prev[-1:].isalnum() or prev[-1:] in (b",", b".", b")"))
        text_slot = tail.endswith((b'":"', b'": "'))  # a JSON string value starts here
        written = tail.decode("utf-8", errors="replace")
        ranked = rank_literals(ctx.literals, written, text_first=text_slot)
        key = _OPEN_VALUE.search(tail[-96:]) if ctx.field_literals else None
        if key is not None:  # this property's own values (its default) first
            own = ctx.field_literals.get(key.group(1).decode("utf-8", errors="replace"), [])
            ranked = list(dict.fromkeys([*own, *ranked]))
        for literal in ranked:
            if opened >= max_branches:
                break
            raw = (b" " if spaced else b"") + literal.encode("utf-8")
            for rest in _remainders(raw, tail):
                ids = ctx.canon.tokens_after(prev, rest)
                if not ids or ids[0] not in mask:
                    continue
                end = builder.add_branch(frontier, ids,
                                         self.name if opened == 0 else VALUES_ALT)
                if end is not None:
                    opened += 1
                    extend_forced(ctx, builder, end, max_tokens=4)
                    break
            if builder.branches >= builder.max_branches or builder.room(frontier) <= 0:
                break


def _remainders(literal: bytes, tail: bytes) -> list[bytes]:
    """What is left to write of ``literal``: the rest after the longest prefix the output
    already ends with (partially written), then the whole literal."""
    out = []
    for k in range(min(len(literal) - 1, len(tail)), 0, -1):
        if tail.endswith(literal[:k]):
            out.append(literal[k:])
            break
    out.append(literal)
    return out


class AlternativesDrafter:
    """One branch per option where the constraint allows only a few tokens."""

    name = "alternatives"

    def propose(self, ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
        state = builder.states[frontier]
        mask = ctx.constraint.allowed(state)
        limit = int(ctx.options.get("alternatives_max", 8))
        n = mask.count()
        if n < 2 or n > 8 * limit + len(builder.eos_ids):
            return
        for token in choices(ctx.vocab, mask.ids(), builder.eos_ids, limit):
            if builder.child(frontier, token) is not None:
                continue
            end = builder.add_branch(frontier, [token], self.name)
            if end is None:
                break
            extend_forced(ctx, builder, end, max_tokens=4)


def choices(vocab: Vocabulary, ids: np.ndarray, eos_ids: Sequence[int] | frozenset[int],
            limit: int) -> list[int]:
    """The options among allowed ``ids``: tokens whose text is not the start of another
    allowed token's (``true|false|null`` allow ``t``, ``tr``, ``true``, ...: three options,
    not nine); empty when there are more than ``limit``."""
    tokens = vocab.tokens
    texts = sorted((tokens[int(t)], int(t)) for t in ids if int(t) not in eos_ids)
    out = [t for i, (text, t) in enumerate(texts)
           if not (i + 1 < len(texts) and texts[i + 1][0].startswith(text))]
    return out if len(out) <= limit else []


_STRUCTURAL_BYTES = frozenset(b',:{}[]" \n\t')
_STRUCTURAL: dict[str, np.ndarray] = {}  # vocabulary fingerprint -> bool [V]; a memo


def structural_tokens(vocab: Vocabulary) -> np.ndarray:
    """``[V]`` bool: tokens spelled only with JSON punctuation and whitespace (memoized)."""
    key = vocab.fingerprint
    hit = _STRUCTURAL.get(key)
    if hit is None:
        hit = np.fromiter((bool(t) and set(t) <= _STRUCTURAL_BYTES for t in vocab.tokens),
                          dtype=bool, count=len(vocab.tokens))
        hit.setflags(write=False)
        _STRUCTURAL[key] = hit
    return hit


class ClosersDrafter:
    """Where a free value may end (a number, a string), the punctuation that ends it.

    Among the allowed tokens made only of punctuation (``,"``, ``}``, ``"}}``, ...) — when
    they are not all that is allowed — first those whose first byte already ends the value
    (``'"}'`` rather than ``',"'`` in a string), then the ones this output (then the prompt)
    used most, each extended by its forced continuation (usually the next key). Numbers and
    strings are where no other draft knows when the value stops. (Its branches are not
    priced by rank as the values drafter's are: a second source for its later branches
    raised its first branch's estimate, and the plan then dropped the draft head's nodes —
    BFCL rows 60-149, 626 passes before, 656 after.)
    """

    name = "closers"

    def __init__(self) -> None:
        self._memo: dict[Any, list[int]] = {}

    def propose(self, ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
        state = builder.states[frontier]
        memo = self._memo.get(state)
        if memo is None:
            mask = ctx.constraint.allowed(state)
            allowed = mask.to_bool()
            struct = structural_tokens(ctx.vocab)[: allowed.size]
            picked = np.flatnonzero(allowed[: struct.size] & struct)
            cands = [] if picked.size == mask.count() else [
                int(t) for t in picked if int(t) not in builder.eos_ids]
            memo = self._memo[state] = (cands, _immediate_enders(ctx, state, cands))
        cands, enders = memo
        if not cands:
            return
        limit = int(ctx.options.get("closers_max", 3))
        for token in _rank_closers(ctx, cands, enders)[:limit]:
            end = builder.add_branch(frontier, [token], self.name)
            if end is None:
                break
            extend_forced(ctx, builder, end, max_tokens=int(ctx.options.get("closers_length", 4)))


def _rank_closers(ctx: DraftContext, cands: Sequence[int], enders: frozenset[int]) -> list[int]:
    """``cands`` best first: immediate enders, then by how often the model ended a value
    with them (:func:`learn_closer`), by uses in this output, then in all (prompt and
    output); ties in ``cands``' order. Pure.

    Where any punctuation is allowed (free text, the inside of a JSON string) there are ~190
    candidates at every step: a key function scanning each one's occurrences took a fifth of
    the drafting time of a prose request; here tokens never seen rank last without a look."""
    prompt_len = ctx.prompt_len
    positions = ctx.history.unigram_ends().get
    closed = ctx.acceptance.closers if ctx.acceptance is not None else {}
    seen = []
    unseen = []
    for t in cands:
        pos = positions((t,))  # ascending
        if pos:
            seen.append((t in enders, closed.get(t, 0.0),
                         len(pos) - bisect.bisect_right(pos, prompt_len), len(pos), t))
        elif t in enders or t in closed:
            seen.append((t in enders, closed.get(t, 0.0), 0, 0, t))
        else:
            unseen.append(t)
    seen.sort(key=lambda r: r[:4], reverse=True)  # stable: ties keep cands' order
    return [r[4] for r in seen] + unseen


def _immediate_enders(ctx: DraftContext, state: State, cands: Sequence[int]) -> frozenset[int]:
    """The candidates whose first byte already ends the value open in ``state``: after that
    byte alone the constraint allows fewer tokens than in ``state`` (in a JSON string,
    ``'"}'`` ends it at once, ``',"'`` writes a comma into it first). Closers that carry
    content before the end are rarely what the model writes."""
    c = ctx.constraint
    if costly_masks(c):
        # The mask after each first byte would cost more than this ranking is worth there
        # (closers hit in JSON, hardly ever in code).
        return frozenset()
    n = c.allowed(state).count()
    tokens = ctx.vocab.tokens
    out = set()
    verdict: dict[bytes, bool] = {}
    for t in cands:
        first = tokens[t][:1]
        hit = verdict.get(first)
        if hit is None:
            hit = False
            for i in ctx.vocab.ids_for(first):
                nxt = c.advance(state, i)
                if nxt is not None:
                    hit = c.allowed(nxt).count() < n
                    break
            verdict[first] = hit
        if hit:
            out.add(t)
    return frozenset(out)


class SplitsDrafter:
    """The other tokenization of forced text where the model is torn: along the forced
    chain, where this model has written a forced text's first token more than one way over
    earlier requests (``ctx.acceptance``; e.g. ``'","'`` whole or ``'",'`` then ``'"'``),
    a branch with the choice the chain did not take (its share at least ``splits_min_share``)
    and its forced continuation. Models do not always follow the canonical tokenization of
    text they did not choose, and do not always split it the same way."""

    name = "splits"

    def propose(self, ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
        acceptance = _split_habits(ctx)
        if acceptance is None:
            return
        tokens = ctx.vocab.tokens
        length = int(ctx.options.get("splits_length", 8))
        min_share = float(ctx.options.get("splits_min_share", 0.2))
        chain = []
        node = frontier
        while node > 0:
            chain.append(node)
            node = builder.parents[node]
        for child in reversed(chain):
            parent = builder.parents[child]
            if builder.sources[child] != FORCED:
                continue
            state = builder.states[parent]
            text = ctx.constraint.forced(state)
            if not text:
                continue
            prev = tokens[builder.tokens[parent]]
            ids = ctx.canon.tokens_after(prev, text)
            if not ids:
                continue
            shares = acceptance.split_shares((split_context(prev), tokens[ids[0]]), ids[0])
            mask = None
            for token, share in shares:
                if share < min_share or token == builder.tokens[child]:
                    continue
                if not text.startswith(tokens[token]):
                    continue
                mask = ctx.constraint.allowed(state) if mask is None else mask
                if token not in mask or builder.child(parent, token) is not None:
                    continue
                end = builder.add_branch(parent, [token], self.name)
                if end is None:
                    if builder.room(parent) <= 0 or builder.branches >= builder.max_branches:
                        return
                    continue
                extend_forced(ctx, builder, end, max_tokens=length)


class TopKDrafter:
    """The top-k tokens of the target's last distribution, where they are legal. Opt-in
    (not in :data:`structspec.spec.decode.DEFAULT_DRAFTERS`): that distribution is the one
    the tree's root came from, one position early, so its runners-up rarely follow the
    root."""

    name = "topk"

    def propose(self, ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
        logits = ctx.last_logits
        k = int(ctx.options.get("topk", 2))
        if logits is None or k <= 0:
            return
        candidates = torch.topk(logits, min(k + 1, logits.numel())).indices.tolist()  # [k+1]
        root = builder.tokens[0]
        for token in candidates[: k + 1]:
            if token == root or not torch.isfinite(logits[token]):
                continue
            builder.add_branch(frontier, [int(token)], self.name)


def recent_tokens(ctx: DraftContext, builder: TreeBuilder, node: int, n: int) -> list[int]:
    """The last ``n`` tokens before a draft continues below ``node``: the committed ones,
    then the drafted path to ``node``."""
    return (ctx.history.tokens[-n:] + _path_tokens(builder, node))[-n:]


def text_before(ctx: DraftContext, builder: TreeBuilder, node: int, tail: int = 64) -> bytes:
    """The text a draft below ``node`` continues: the last ``tail`` committed output tokens,
    then the drafted path to ``node``, as bytes."""
    return ctx.output_text(tail) + ctx.vocab.decode(_path_tokens(builder, node))


def _path_tokens(builder: TreeBuilder, node: int) -> list[int]:
    """Drafted tokens from the root (excluded) to ``node``."""
    out = []
    while node > 0:
        out.append(builder.tokens[node])
        node = builder.parents[node]
    return out[::-1]


for _cls in (ClosersDrafter, SplitsDrafter, LookupDrafter, ValuesDrafter, AlternativesDrafter,
             TopKDrafter):
    register_drafter(_cls.name, _cls)


#: Drafters that also continue past the ends of other branches (see :func:`build_tree`):
#: after a value, the punctuation that closes it; after a closer and the next key, a value.
NESTED = ("values", "closers")


def build_tree(ctx: DraftContext, builder: TreeBuilder, drafters: Sequence[Drafter],
               *, forced: bool = True, active: Callable[[str], bool] | None = None) -> int:
    """Grow ``builder``: the forced chain from the root (uncounted), then each drafter at
    its end (those ``active`` allows), then up to ``nested_rounds`` rounds (option, default
    2) in which the :data:`NESTED` drafters continue from the open ends of the previous
    round's branches, ``nested_branches`` (default 1) new branches per end and drafter —
    not from the values drafter's later-ranked literals (:data:`VALUES_ALT`), whose rare
    acceptance leaves their continuations out of most plans while they took the budget the
    first literal's continuation needed (BFCL dev rows 0-149, a fixed cost curve: 863 -> 852
    passes, the trees' modeled time 13.05 -> 12.82 s). The draft head's alternatives keep
    theirs: a digit the head ranked second, then its closer, is often what the model writes
    (skipping them too lost half the closers' accepted tokens on held-out calls).
    Structured output alternates free values and forced punctuation (``"a":1,"b":6,"c":5}}``):
    one tree can then carry a value, its closer, the next key and the next value. Returns the
    frontier node (the chain's end). Mutates ``builder``."""
    frontier = extend_forced(ctx, builder, 0, counted=False) if forced else 0
    first_speculative = len(builder)
    for drafter in drafters:
        if builder.room(frontier) <= 0 or builder.branches >= builder.max_branches:
            break
        if active is None or active(drafter.name):
            drafter.propose(ctx, builder, frontier)
    nested = [d for d in drafters
              if d.name in NESTED and (active is None or active(d.name))]
    rounds = int(ctx.options.get("nested_rounds", 2))
    per_end = int(ctx.options.get("nested_branches", 1))
    max_ends = int(ctx.options.get("nested_ends", 4))
    start = first_speculative
    for _ in range(rounds if nested and per_end > 0 else 0):
        ends = [i for i in range(start, len(builder)) if not builder.num_children(i)]
        start = len(builder)
        opened = 0
        for end in ends:
            if opened >= max_ends or builder.room(end) <= 0:
                continue
            if _branch_source(builder, end) == VALUES_ALT:  # the plan seldom keeps them
                continue
            end = extend_forced(ctx, builder, end, max_tokens=8)  # the rest of a key
            if not _open_end(ctx, builder.states[end]):
                continue
            opened += 1
            for drafter in nested:
                if builder.room(end) <= 0:
                    break
                with builder.extra_branches(per_end):
                    drafter.propose(ctx, builder, end)
        if builder.room(frontier) <= 0:
            break
    return frontier


def _branch_source(builder: TreeBuilder, node: int) -> str:
    """The source of the nearest node at or above ``node`` that is not forced text."""
    while node > 0 and builder.sources[node] == FORCED:
        node = builder.parents[node]
    return builder.sources[node]


def _open_end(ctx: DraftContext, state: State) -> bool:
    """Whether a branch may continue from ``state`` with a choice (more than one token, or
    one token where the output could also end). Not where the mask is costly and unknown
    (:func:`cheap_allowed`): the nested drafters would compute it, for a node that is
    rarely reached."""
    c = ctx.constraint
    mask = cheap_allowed(c, state)
    if mask is None:
        return False
    n = mask.count()
    return n > 1 and not (c.is_accepting(state) and n <= 1 + len(ctx.vocab.eos_token_ids))
