"""What drafters see and promise: the per-step :class:`DraftContext` and the
:class:`Drafter` protocol.

A drafter is any object with a ``name`` and ``propose(ctx, builder, frontier)`` that adds
branches through the :class:`~structspec.spec.tree.TreeBuilder` (which refuses tokens the
constraint rejects). Drafters are deterministic functions of the context, which is what
lossless speculation needs: greedy, and sampled under a seed, accept exactly the tokens
plain decoding would choose. Sources are named by the strings here; a drafter's
alternative branches (``<name>_alt``) count as its own (:func:`drafter_of`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from structspec.automata.base import Constraint
from structspec.spec.canonical import CanonicalTokenizer
from structspec.spec.ngram import NgramIndex
from structspec.spec.tree import TreeBuilder
from structspec.vocab import Vocabulary

if TYPE_CHECKING:
    from structspec.spec.cost import AcceptanceModel

FORCED = "forced"
#: Source of the values drafter's branches after its first at a node (the literal it ranks
#: first is far likelier than the rest: on BFCL calls the request's next unwritten number is
#: the model's value most of the time). Counted apart, so the plan prices them apart.
VALUES_ALT = "values_alt"


def drafter_of(source: str) -> str:
    """The drafter a node's source belongs to: a drafter's alternative branches
    (:data:`VALUES_ALT`, ``draft_head_alt``) are its own where the drafter gate asks whether
    it still pays. Pure."""
    return source[: -len("_alt")] if source.endswith("_alt") else source


@dataclass
class DraftContext:
    """What drafters may look at for one step. Built by the decode loop; not thread-safe.

    Attributes:
        constraint: the compiled constraint.
        vocab: its vocabulary.
        canon: canonical tokenization in context.
        history: ``NgramIndex`` over prompt + committed output (the root token included).
        prompt_len: how many of ``history.tokens`` are the prompt.
        literals: values from the request (see :func:`~structspec.spec.literals.extract_literals`).
        last_logits: ``[V]`` masked logits the root token was chosen from, if any.
        options: per-drafter knobs (``lookup_max_n``, ``alternatives_max``, ``topk``, ...).
        choices: ``(context, canonical first token)`` of some forced text -> the token the
            model last wrote there in this output
            (see :func:`~structspec.spec.forced.learn_choice`).
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
            (:func:`~structspec.spec.literals.field_literals`): tried first where that
            property's value starts.
        request: the request inside the prompt (:func:`~structspec.spec.literals.request_text`):
            where its words name a property, the values drafter ranks the literals beside
            them first.
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
    request: str = ""
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
