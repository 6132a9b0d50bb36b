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
  to open an answer); with :func:`~structspec.spec.forced.learn_choice` the forced chain
  itself follows the model's usual split, learned per context in this output and across
  requests (``AcceptanceModel.splits``).
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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from structspec.automata.base import State
from structspec.spec.draft_context import FORCED, VALUES_ALT, DraftContext, Drafter
from structspec.spec.forced import (
    VALUE_OPENERS,
    cheap_allowed,
    costly_masks,
    extend_forced,
    split_context,
    split_habits,
    structural_tokens,
    value_openers,
)
from structspec.spec.literals import (
    key_distances,
    open_property,
    rank_for_key,
    rank_literals,
)
from structspec.spec.tree import TreeBuilder
from structspec.vocab import Vocabulary

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
        key = open_property(tail) if ctx.field_literals or ctx.request else None
        if key is not None and ctx.request:  # the literals named beside the property's words
            ranked = rank_for_key(ranked, key_distances(ctx.request, key, tuple(ctx.literals)))
        if key is not None and ctx.field_literals:  # its own values (its default) first
            ranked = list(dict.fromkeys([*ctx.field_literals.get(key, []), *ranked]))
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
        self._memo: dict[Any, tuple[list[int], frozenset[int]]] = {}  # state -> (cands, enders)

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
    with them (:func:`~structspec.spec.forced.learn_closer`), by uses in this output, then
    in all (prompt and output); ties in ``cands``' order. Pure.

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
        acceptance = split_habits(ctx)
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
    (not in :data:`structspec.spec.config.DEFAULT_DRAFTERS`): that distribution is the one
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
    if frontier:
        _hedge_openers(ctx, builder, frontier)
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


def _hedge_openers(ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
    """Where the forced chain from the root wrote a value's start with the forced text in one
    token (``' true'`` for the ``' '`` of ``'": '``: the model's learned habit for that kind
    of value, :func:`~structspec.spec.forced.value_slot`), the other legal starts of that
    kind (``' false'``) as ``alternatives`` branches beside it: the habit picked one of the
    values, not the value."""
    chain = []
    node = frontier
    while node > 0:
        chain.append(node)
        node = builder.parents[node]
    tokens = ctx.vocab.tokens
    for node in reversed(chain):
        token = builder.tokens[node]
        if tokens[token].lstrip() not in VALUE_OPENERS:  # (cheap: forced() is not)
            continue
        parent = builder.parents[node]
        text = ctx.constraint.forced(builder.states[parent])
        if not text or not tokens[token].startswith(text) or len(tokens[token]) <= len(text):
            continue
        openers = value_openers(ctx.vocab, text)
        if token not in openers:
            continue
        for other in openers:
            if other != token and builder.child(parent, other) is None \
                    and builder.room(parent) > 0:
                end = builder.add_branch(parent, [other], "alternatives")
                if end is not None:
                    extend_forced(ctx, builder, end, max_tokens=4)


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
