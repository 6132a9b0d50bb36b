"""The forced continuation: text every valid output must write next, as the model splits it.

Where the constraint forces text (a key, ``'": '``, a closing brace), every valid output
writes it, so the drafts follow it as a chain that is nearly always accepted. The tokens are
the canonical tokenization in context, corrected by what the model was seen to do: it does
not always write forced text as the tokenizer would (``'{'`` + ``'"'`` for ``'{"'``), and
:func:`learn_choice` records its splits per context, in this output and across requests
(``AcceptanceModel.splits``). :func:`learn_closer` records the punctuation it ends free
values with, which the closers drafter ranks by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from structspec.automata.base import Constraint, State, TokenMask
from structspec.spec.draft_context import FORCED, DraftContext
from structspec.spec.tree import TreeBuilder
from structspec.vocab import Vocabulary

if TYPE_CHECKING:
    from collections.abc import Callable

    from structspec.spec.cost import AcceptanceModel


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
    legal: Callable[[int], bool]
    if mask is None:
        def legal(token: int) -> bool:
            return c.advance(state, token) is not None
    else:
        legal = mask.__contains__
    tokens = ctx.vocab.tokens
    prev = tokens[prev_token]
    ids = list(ctx.canon.tokens_after(prev, text))
    if len(ids) > 1 and mask is not None and value_openers(ctx.vocab, tokens[ids[-1]]):
        # The last token (the ' ' of '": ') may run on into the value (' false', ' ["'),
        # which depends on what is legal after it: drafted from its own state, the chain's
        # next step (extend_forced), where value_slot() can tell.
        text = text[: len(text) - len(tokens[ids[-1]])]
        ids = ids[:-1]
    if ctx.choices or ctx.split_suffixes or split_habits(ctx) is not None:
        slot = value_slot(ctx.vocab, text, legal) if len(ids) == 1 and mask is not None else b""
        out: list[int] = []
        pos = 0
        while ids:
            first = _preferred(ctx, ids[0], prev, slot if pos == 0 else b"")
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


def split_habits(ctx: DraftContext) -> AcceptanceModel | None:
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


#: How a JSON value starts. A model writing ``"detailed": false`` after a forced ``": `` writes
#: the space and the value's start as one token (``' false'``, ``' ["'``), and which one
#: depends on the value's type: where the forced text and such an opener make one token, the
#: learned choice is keyed by which of those tokens are legal (:func:`value_slot`).
VALUE_OPENERS = (b"true", b"false", b"null", b"[", b'["', b"[[", b"[{", b"{", b'{"', b'"',
                 b"-")
_OPENERS: dict[tuple[str, bytes], tuple[int, ...]] = {}  # (vocabulary, text) -> ids; a memo


def value_openers(vocab: Vocabulary, text: bytes) -> tuple[int, ...]:
    """The tokens spelled ``text`` + a value opener (memoized; legal or not)."""
    key = (vocab.fingerprint, text)
    hit = _OPENERS.get(key)
    if hit is None:
        hit = _OPENERS[key] = tuple(i for o in VALUE_OPENERS for i in vocab.ids_for(text + o))
    return hit


def value_slot(vocab: Vocabulary, text: bytes, legal: Callable[[int], bool]) -> bytes:
    """Which tokens of forced ``text`` run on into a value here (``b"| false| true"`` where a
    boolean starts after ``' '``), as a suffix of the context a choice is learned in; ``b""``
    where none is legal or ``text`` makes none. Pure but for the memo."""
    legal_ids = [i for i in value_openers(vocab, text) if legal(i)]
    return b"".join(sorted(b"|" + vocab.tokens[i] for i in legal_ids))


def _preferred(ctx: DraftContext, canonical: int, prev: bytes, slot: bytes = b"") -> int:
    """The token the model is expected to write where ``canonical`` is the canonical split,
    after a token ``prev`` (where a value of kind ``slot`` follows, :func:`value_slot`): its
    choice in the same context earlier in this output, else its usual choice there over
    earlier requests (``ctx.acceptance``) — first for this kind of value, then for any —
    else ``canonical`` shortened by a suffix it split off after a separator in this output,
    else ``canonical``."""
    tokens = ctx.vocab.tokens
    cb = tokens[canonical]
    key = (split_context(prev), cb)
    habits = split_habits(ctx)
    for k in ((key[0] + slot, cb), key) if slot else (key,):
        exact = ctx.choices.get(k)
        if exact is not None:
            return exact
        shares = habits.split_shares(k, canonical) if habits is not None else []
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
    keys = [key]
    if len(ids) == 1:
        mask = cheap_allowed(ctx.constraint, state)
        slot = value_slot(ctx.vocab, text, mask.__contains__) if mask is not None else b""
        if slot:
            keys.append((key[0] + slot, canonical))
    for k in keys:
        ctx.choices[k] = chosen
        if ctx.acceptance is not None:
            ctx.acceptance.record_split(k, chosen)
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
