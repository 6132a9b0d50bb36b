"""Acceptance: which drafted tokens the target model's verification pass agrees with.

Pure functions over tensors. Per tree node the target distribution is exactly what plain
constrained decoding would use at that point: the node's logits, masked with the
constraint's allowed set in the node's state, through :func:`structspec.sampling.probabilities`.
Walking the tree from the root, each node either accepts one of its children (and the walk
moves there) or emits one *bonus* token drawn from what is left, which ends the step.

- **Greedy** (temperature 0): the child equal to the masked argmax is accepted; otherwise the
  masked argmax is the bonus. Token for token what plain greedy decoding emits.
- **Sampling** (temperature, top-k, top-p): the token at each output position is the one the
  position's uniform number picks from the node's distribution by inverse CDF
  (:class:`~structspec.sampling.TokenDraws`, as plain decoding picks it), and the child
  holding that token is accepted; otherwise that token is the bonus. So the output is
  token for token plain sampling's under the same seed, whatever was drafted — exactly
  distributed as constrained sampling, and reproducible from the seed although trees
  differ from call to call. A drafted token ``x`` is accepted with probability ``p(x)``,
  several siblings with their summed probability: what the recursive rejection scheme for
  deterministic drafts gives (SpecInfer, Miao et al. 2023; Chen et al. 2023 and Leviathan
  et al. 2023 for one draft). That scheme, :func:`multi_draft_sample`, is kept for drafts
  drawn from distributions ``q_i`` (accept ``x_i`` with probability ``min(1, r(x_i) /
  q_i(x_i))``, ``r`` the residual); structspec's drafters are all deterministic, and the
  decode loop does not use it.
- **Typical acceptance** (opt-in, lossy; Medusa, Cai et al. 2024): accept the most likely child
  whose probability exceeds ``min(ε, √ε · exp(-H(p)))``, ``ε = validation_threshold``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from structspec.automata.base import Constraint, State, TokenMask
from structspec.masks import apply_mask, mask_to_bool
from structspec.sampling import (
    SamplingParams,
    TokenDraws,
    argmax,
    choose,
    probabilities,
    sample,
)
from structspec.spec.tree import DraftTree

Outcome = Literal["bonus", "eos", "complete", "limit", "dead"]


def multi_draft_sample(
    p: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None = None,
    draft_probs: torch.Tensor | None = None,
) -> tuple[int, int | None]:
    """One token distributed exactly as ``p``, accepting a draft where possible.

    Args:
        p: target distribution ``[V]`` (sums to 1).
        drafts: candidate tokens ``x_1..x_k``, tried in order.
        generator: random source (seeded for reproducibility).
        draft_probs: ``[k, V]`` draft distributions ``q_i`` the drafts were sampled from
            (independently); ``None`` means each draft is deterministic (a point mass).

    Returns:
        ``(token, i)``: the emitted token and the index of the accepted draft, or ``None``
        when every draft was rejected and ``token`` came from the residual distribution.

    Pure apart from drawing from ``generator``.
    """
    if draft_probs is None:
        return _point_drafts_sample(p, drafts, generator)
    residual = p.float().clone()  # [V]
    for i, x in enumerate(drafts):
        qx = float(draft_probs[i, x])
        rx = float(residual[x])
        u = float(torch.rand((), generator=generator, device=p.device))
        if qx > 0 and u * qx < rx:  # u < r(x)/q(x): accept (always when r(x) >= q(x))
            return int(x), i
        residual = torch.clamp(residual - draft_probs[i].float(), min=0.0)  # [V]
        total = float(residual.sum())
        if total <= 1e-12:  # r ≤ q everywhere means r == q: acceptance was certain
            return int(x), i
        residual /= total
    return sample(residual, generator), None


def _point_drafts_sample(p: torch.Tensor, drafts: Sequence[int],
                         generator: torch.Generator | None) -> tuple[int, int | None]:
    """:func:`multi_draft_sample` for deterministic drafts, in scalars: the residual after
    rejecting ``x_1..x_{i-1}`` is ``p`` without them, renormalized, so ``x_i`` is accepted
    with probability ``p(x_i) / (total - p(x_1) - ... - p(x_{i-1}))`` (0 for a repeated
    draft), and only a bonus token needs the vector (one ``[V]`` pass instead of three per
    draft: ~0.1 ms instead of ~1 ms per node on a 49k-token vocabulary)."""
    total = float(p.sum())
    left = total
    rejected: list[int] = []
    for i, x in enumerate(drafts):
        px = 0.0 if x in rejected else float(p[x])
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * left < px:  # u < p(x) / left
            return int(x), i
        rejected.append(x)
        left -= px
        if left <= 1e-12 * total:  # every id is a rejected draft: acceptance was certain
            return int(x), i
    residual = p.float().clone()  # [V]
    residual[rejected] = 0.0
    return sample(residual, generator), None


def typical_choice(p: torch.Tensor, drafts: Sequence[int], threshold: float) -> int | None:
    """Medusa's typical acceptance: the index of the most likely draft whose probability
    exceeds ``min(threshold, sqrt(threshold) * exp(-entropy(p)))``, or ``None``. Lossy."""
    if not drafts:
        return None
    nz = p[p > 0]  # [V']
    entropy = float(-(nz * nz.log()).sum())
    cut = min(threshold, math.sqrt(threshold) * math.exp(-entropy))
    best, best_p = None, cut
    for i, x in enumerate(drafts):
        px = float(p[x])
        if px > best_p:
            best, best_p = i, px
    return best


class MaskCache:
    """Bool mask tensors per :class:`TokenMask` (constraints memoize masks per state, so the
    same few objects recur). Not thread-safe; one per decode."""

    def __init__(self, width: int, device: torch.device | str) -> None:
        self.width = width
        self.device = device
        self._masks: dict[int, tuple[TokenMask, torch.Tensor]] = {}

    def get(self, mask: TokenMask) -> torch.Tensor:
        """``[width]`` bool tensor for ``mask``."""
        hit = self._masks.get(id(mask))
        if hit is None:
            hit = (mask, mask_to_bool(mask, self.width, self.device))
            self._masks[id(mask)] = hit
        return hit[1]


@dataclass(frozen=True)
class Acceptance:
    """The result of walking one verified tree.

    Attributes:
        path: accepted node indices, root first (``path[1:]`` are accepted drafts).
        token: the token emitted after the last accepted node: the bonus (``outcome ==
            "bonus"``), an EOS id (``"eos"``), else ``None``.
        outcome: ``"bonus"`` — continue after ``token``; ``"eos"`` — EOS chosen, output
            complete; ``"complete"`` — the constraint admits nothing but the end;
            ``"limit"`` — the token budget is spent; ``"dead"`` — no legal token.
        masked_logits: ``[V]`` masked logits of the last accepted node (the distribution
            ``token`` came from), for drafters that look at the target's last distribution;
            ``None`` where that node's was not computed (greedy, a drafted child chosen).
    """

    path: tuple[int, ...]
    token: int | None
    outcome: Outcome
    masked_logits: torch.Tensor | None = None


def walk_tree(
    tree: DraftTree,
    logits: torch.Tensor,
    constraint: Constraint,
    masks: MaskCache,
    sampling: SamplingParams,
    draws: TokenDraws | None,
    *,
    eos_ids: frozenset[int],
    budget: int,
    position: int = 0,
    validation_threshold: float | None = None,
    done: Callable[[State], bool] | None = None,
) -> Acceptance:
    """Accept the longest path of ``tree`` the target agrees with, then one bonus token.

    Stopping rules mirror :func:`structspec.engine.decode` position by position: the output
    is complete where the constraint accepts and allows nothing but EOS; at most ``budget``
    tokens are emitted (drafts + bonus); choosing EOS completes the output.

    Args:
        tree: the verified tree (``q`` nodes).
        logits: ``[q, V]`` logits of the verification pass.
        constraint: the constraint the tree's states belong to.
        masks: bool-mask cache of matching width.
        sampling: greedy or sampling parameters (the exact distribution of plain decoding).
        draws: the per-position uniform numbers of a sampled decode (``None`` when greedy).
        eos_ids: end-of-sequence ids.
        budget: tokens that may still be emitted (>= 1).
        position: the output position of the root's children (tokens emitted before).
        validation_threshold: ``None`` for lossless acceptance; else typical acceptance.
        done: optional override of the "nothing but EOS can follow" test.

    Returns:
        An :class:`Acceptance`. Pure.
    """
    if done is None:
        def done(s: State) -> bool:
            return constraint.is_accepting(s) and constraint.allowed(s).count() <= len(eos_ids)

    # Greedy, lossless: where the unmasked argmax is a drafted child, it is legal (every
    # node is), so it is also the masked argmax (the first maximal index of the row), and
    # the node's mask is never needed. A code grammar's masks cost ~0.15 ms a node here.
    exact_greedy = sampling.greedy and validation_threshold is None
    path = [0]
    row: torch.Tensor | None = None
    while True:
        node = path[-1]
        state = tree.states[node]
        if done(state):
            return Acceptance(tuple(path), None, "complete", row)
        if len(path) - 1 >= budget:
            return Acceptance(tuple(path), None, "limit", row)
        children = tree.children[node]
        drafts = [tree.tokens[c] for c in children]
        if exact_greedy and drafts:
            top = argmax(logits[node])
            if top in drafts:
                path.append(children[drafts.index(top)])
                row = None  # not computed: this node's distribution is not kept
                continue
        mask = constraint.allowed(state)
        if mask.count() == 0:
            return Acceptance(tuple(path), None, "dead", row)
        row = apply_mask(logits[node], masks.get(mask))  # [V]
        u = None if draws is None else draws(position + len(path) - 1)
        token, accepted = _choose(row, drafts, sampling, u, validation_threshold)
        if token in eos_ids:
            return Acceptance(tuple(path), token, "eos", row)
        if accepted is None:
            return Acceptance(tuple(path), token, "bonus", row)
        path.append(children[accepted])


def _choose(
    row: torch.Tensor, drafts: list[int], sampling: SamplingParams, u: float | None,
    threshold: float | None,
) -> tuple[int, int | None]:
    """The token at one node and the accepted draft index (``None``: a bonus token): the
    token plain decoding would choose there (:func:`~structspec.sampling.choose`; ``u`` is
    the position's uniform number when sampling), unless typical acceptance takes a draft."""
    if threshold is not None and drafts:
        typical = SamplingParams(temperature=sampling.temperature or 1.0, top_k=sampling.top_k,
                                 top_p=sampling.top_p)
        p = probabilities(row, typical)  # [V]
        i = typical_choice(p, drafts, threshold)
        if i is not None:
            return drafts[i], i
    token = choose(row, sampling, u)
    # A drafted token is taken as that child (its key/values are computed).
    return token, drafts.index(token) if token in drafts else None
