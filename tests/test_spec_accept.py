"""Acceptance rules as pure tensor functions: greedy, lossless multi-draft rejection sampling
(chi-square against the target distribution), typical acceptance, and the tree walk (whose
seeded sampling follows the target distribution too)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec.automata.base import TokenMask
from structspec.sampling import SamplingParams, TokenDraws, probabilities
from structspec.spec.accept import (
    MaskCache,
    _choose,
    multi_draft_sample,
    typical_choice,
    walk_tree,
)
from structspec.spec.tree import DraftTree


def _chi2_critical(df: int, alpha: float = 1e-4) -> float:
    """Upper ``alpha`` quantile of chi-square(df), Wilson–Hilferty approximation."""
    # z for alpha = 1e-4 (one-sided)
    z = 3.719016485455709
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts: torch.Tensor, p: torch.Tensor, n: int) -> tuple[float, int]:
    expected = p * n
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token with probability 0 was emitted"
    stat = float((((counts[keep] - expected[keep]) ** 2) / expected[keep]).sum())
    return stat, int(keep.sum()) - 1


P = torch.tensor([0.30, 0.05, 0.25, 0.0, 0.15, 0.25])


@pytest.mark.parametrize("drafts", [[], [2], [2, 0, 5], [3, 1], [0, 2, 4, 5, 1]])
def test_point_mass_drafts_reproduce_the_target(drafts):
    gen = torch.Generator().manual_seed(1234)
    n = 8000
    counts = torch.zeros_like(P)
    accepted = 0
    for _ in range(n):
        token, i = multi_draft_sample(P, drafts, gen)
        counts[token] += 1
        if i is not None:
            assert drafts[i] == token
            accepted += 1
    stat, df = _chi2(counts, P, n)
    assert stat < _chi2_critical(df), (stat, counts / n)
    # The acceptance rate of point-mass drafts is the target mass they cover.
    covered = float(P[list(set(drafts))].sum()) if drafts else 0.0
    assert abs(accepted / n - covered) < 0.02


def test_stochastic_drafts_reproduce_the_target():
    """Drafts sampled independently from draft distributions q_i (SpecInfer's setting)."""
    gen = torch.Generator().manual_seed(99)
    q = torch.tensor([[0.1, 0.1, 0.1, 0.3, 0.3, 0.1],
                      [0.5, 0.0, 0.0, 0.0, 0.0, 0.5],
                      [1 / 6] * 6])  # [k, V]
    n = 8000
    counts = torch.zeros_like(P)
    for _ in range(n):
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(q.shape[0])]
        token, _ = multi_draft_sample(P, drafts, gen, draft_probs=q)
        counts[token] += 1
    stat, df = _chi2(counts, P, n)
    assert stat < _chi2_critical(df), (stat, counts / n)


def test_target_from_masked_logits_with_top_k_and_top_p():
    """The walk uses sampling.probabilities on masked logits: filters carry over exactly."""
    logits = torch.tensor([2.0, 1.0, 0.5, 3.0, -1.0, 0.0, 1.5, -0.5])
    allowed = torch.tensor([1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9)
    p = probabilities(logits.masked_fill(~allowed, float("-inf")), params)
    gen = torch.Generator().manual_seed(7)
    n = 8000
    counts = torch.zeros_like(p)
    for _ in range(n):
        counts[multi_draft_sample(p, [6, 1, 2], gen)[0]] += 1
    stat, df = _chi2(counts, p, n)
    assert stat < _chi2_critical(df)


def test_greedy_and_typical_choices():
    row = torch.tensor([0.1, 2.0, float("-inf"), 1.9])
    greedy = SamplingParams()
    assert _choose(row, [3, 1], greedy, None, None) == (1, 1)  # the argmax, a draft's index
    assert _choose(row, [3], greedy, None, None) == (1, None)
    p = torch.tensor([0.7, 0.2, 0.1, 0.0])
    assert typical_choice(p, [2, 1], threshold=0.09) == 1  # 0.2 clears the bar, the best does
    assert typical_choice(p, [3], threshold=0.09) is None
    assert typical_choice(p, [], threshold=0.09) is None


class _Toy:
    """A constraint over 4 tokens (0 = EOS): anything, for ever; EOS never allowed."""

    def __init__(self):
        self.initial = 0
        self.vocab_size = 4
        self._mask = TokenMask.from_ids([1, 2, 3], 4)

    def advance(self, s, t):
        return s + 1 if t in self._mask else None

    def allowed(self, s):
        return self._mask

    def is_accepting(self, s):
        return False

    def forced(self, s):
        return b""


def test_walk_tree_samples_paths_with_the_target_probabilities():
    """First token ~ p_root; second token, given the first was a drafted child, ~ p_child."""
    c = _Toy()
    tree = DraftTree((1, 2, 3, 1), (-1, 0, 0, 1), (0, 1, 1, 2), (0, 1, 1, 2), ("r", "a", "b", "c"))
    torch.manual_seed(0)
    logits = torch.randn(4, 4)  # [q, V]
    params = SamplingParams(temperature=1.0)
    masks = MaskCache(4, "cpu")
    allowed = masks.get(c.allowed(0))
    p = [probabilities(logits[i].masked_fill(~allowed, float("-inf")), params) for i in range(4)]
    n = 8000
    first = torch.zeros(4)
    second_after_2 = torch.zeros(4)
    for seed in range(n):
        acc = walk_tree(tree, logits, c, masks, params, TokenDraws(seed), eos_ids=frozenset({0}),
                        budget=10)
        emitted = [tree.tokens[i] for i in acc.path[1:]] + [acc.token]
        assert acc.outcome == "bonus"
        first[emitted[0]] += 1
        if emitted[0] == 2:
            second_after_2[emitted[1]] += 1
    stat, df = _chi2(first, p[0], n)
    assert stat < _chi2_critical(df)
    m = int(second_after_2.sum())
    stat, df = _chi2(second_after_2, p[1], m)  # node 1 (token 2) has logits row 1
    assert stat < _chi2_critical(df)


def test_walk_tree_greedy_follows_argmax_and_respects_the_budget():
    c = _Toy()
    tree = DraftTree((1, 2, 3, 1), (-1, 0, 0, 1), (0, 1, 1, 2), (0, 1, 1, 2), ("r", "a", "b", "c"))
    logits = torch.tensor([[0, 0, 5, 1], [0, 9, 0, 0], [0, 0, 0, 0], [0, 0, 0, 7.0]])
    masks = MaskCache(4, "cpu")
    g = SamplingParams()
    acc = walk_tree(tree, logits, c, masks, g, None, eos_ids=frozenset({0}), budget=10)
    assert acc.path == (0, 1, 3) and acc.token == 3 and acc.outcome == "bonus"
    acc = walk_tree(tree, logits, c, masks, g, None, eos_ids=frozenset({0}), budget=1)
    assert acc.path == (0, 1) and acc.outcome == "limit"
    acc = walk_tree(tree, logits, c, masks, g, None, eos_ids=frozenset({0}), budget=10,
                    validation_threshold=0.3)
    assert acc.path[:2] == (0, 1)


class _ByState:
    """A constraint over 8 tokens (0 = EOS) whose mask changes with the state (the depth):
    token ``t`` is legal at depth ``s`` unless ``(t + s) % 3 == 0``; EOS from depth 2 on."""

    vocab_size = 8
    initial = 0

    def allowed(self, s):
        ids = [t for t in range(1, 8) if (t + s) % 3] + ([0] if s >= 2 else [])
        return TokenMask.from_ids(ids, 8)

    def advance(self, s, t):
        return s + 1 if t in self.allowed(s) else None

    def is_accepting(self, s):
        return s >= 2

    def forced(self, s):
        return b""


def _reference_greedy_walk(tree, logits, c, eos, budget):
    """The walk before its no-mask shortcut: every node's row masked, then its argmax."""
    path = [0]
    while True:
        node = path[-1]
        state = tree.states[node]
        if c.is_accepting(state) and c.allowed(state).count() <= len(eos):
            return tuple(path), None, "complete"
        if len(path) - 1 >= budget:
            return tuple(path), None, "limit"
        allowed = MaskCache(8, "cpu").get(c.allowed(state))
        token = int(torch.argmax(logits[node].masked_fill(~allowed, float("-inf"))))
        if token in eos:
            return tuple(path), token, "eos"
        kids = [k for k in tree.children[node] if tree.tokens[k] == token]
        if not kids:
            return tuple(path), token, "bonus"
        path.append(kids[0])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_greedy_walk_skips_masks_only_where_the_result_cannot_change(data):
    """Where the row's unmasked argmax is a drafted child the walk takes it without a mask;
    path, token and outcome equal an always-masking walk on random legal trees and logits
    with ties (small integers), illegal maxima and EOS."""
    c = _ByState()
    tokens, parents, depths, states = [3], [-1], [0], [0]
    for _ in range(data.draw(st.integers(0, 9))):
        parent = data.draw(st.integers(0, len(tokens) - 1))
        s = states[parent]
        used = {tokens[k] for k in range(1, len(tokens)) if parents[k] == parent}
        legal = [t for t in range(1, 8) if (t + s) % 3 and t not in used]
        if not legal:
            continue
        tokens.append(data.draw(st.sampled_from(legal)))
        parents.append(parent)
        depths.append(depths[parent] + 1)
        states.append(s + 1)
    tree = DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(states),
                     tuple("r" if i == 0 else "d" for i in range(len(tokens))))
    values = data.draw(st.lists(st.integers(-2, 3), min_size=8 * len(tokens),
                                max_size=8 * len(tokens)))
    logits = torch.tensor(values, dtype=torch.float32).reshape(len(tokens), 8)
    budget = data.draw(st.integers(1, 6))
    eos = frozenset({0})
    acc = walk_tree(tree, logits, c, MaskCache(8, "cpu"), SamplingParams(), None,
                    eos_ids=eos, budget=budget)
    assert (acc.path, acc.token, acc.outcome) == _reference_greedy_walk(tree, logits, c, eos,
                                                                         budget)
