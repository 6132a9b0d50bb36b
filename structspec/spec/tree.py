"""Draft trees: the candidate continuations one verification pass checks at once.

A :class:`DraftTree` is a frozen record of token ids and parent indices in topological
order (every parent comes before its children). Node 0 — the root — is the last committed
token: its key/values are *not* in the KV cache yet, so the same pass that verifies the
drafts also computes them, and the root's logits give the distribution of the first new
token. Every other node is a drafted token, legal under the constraint after its ancestors;
``states[i]`` is the constraint state *after* node ``i``'s token.

:func:`tree_attention` turns a tree into what a Hugging Face causal LM needs to run all nodes
in one forward pass on top of a KV cache of ``past_len`` tokens (SpecInfer, Miao et al. 2023;
Medusa, Cai et al. 2024): an additive float mask where each node sees the whole past, its
ancestors and itself, and position ids ``past_len + depth``.

:class:`TreeBuilder` is the mutable side used by drafters: it checks legality with
``constraint.advance`` and enforces the depth / node / branch budgets.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from structspec.automata.base import Constraint, State

ROOT_SOURCE = "root"


@dataclass(frozen=True)
class DraftTree:
    """A frozen draft tree (see the module docstring).

    Attributes:
        tokens: token id per node; ``tokens[0]`` is the last committed token.
        parents: parent index per node; ``parents[0] == -1`` and ``parents[i] < i``.
        depths: depth per node (root 0).
        states: constraint state after each node's token (``states[0]``: the current state).
        sources: the drafter that proposed each node (``"root"`` for node 0).
        scores: per node, the drafter's own estimate of P(accepted | parent accepted) (a
            learned drafter's probability of the token), NaN where it gave none; empty when
            no node has one.
        children: child indices per node, in insertion order (derived).

    Immutable and thread-safe.
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    states: tuple[State, ...]
    sources: tuple[str, ...]
    scores: tuple[float, ...] = ()
    children: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0:
            raise ValueError("a draft tree has at least its root")
        lengths = {len(self.parents), len(self.depths), len(self.states), len(self.sources)}
        if lengths != {n}:
            raise ValueError("tokens, parents, depths, states and sources need one entry per node")
        if self.scores and len(self.scores) != n:
            raise ValueError("scores needs one entry per node (or none at all)")
        if self.parents[0] != -1 or self.depths[0] != 0:
            raise ValueError("node 0 must be the root (parent -1, depth 0)")
        kids: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            p = self.parents[i]
            if not 0 <= p < i:
                raise ValueError(f"node {i} has parent {p}; parents must precede their children")
            if self.depths[i] != self.depths[p] + 1:
                raise ValueError(
                    f"node {i} has depth {self.depths[i]}, its parent {self.depths[p]}")
            kids[p].append(i)
        object.__setattr__(self, "children", tuple(tuple(k) for k in kids))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        """The depth of the deepest node."""
        return max(self.depths)

    def score(self, node: int) -> float | None:
        """The drafter's estimate for ``node`` (see ``scores``), or ``None``."""
        if not self.scores or math.isnan(self.scores[node]):
            return None
        return self.scores[node]

    def path(self, node: int) -> list[int]:
        """Node indices from the root to ``node``, both included."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def path_tokens(self, node: int) -> list[int]:
        """Token ids of the drafted nodes from the root (excluded) down to ``node``."""
        return [self.tokens[i] for i in self.path(node)[1:]]

    def subtree(self, keep: Iterable[int]) -> DraftTree:
        """The tree restricted to the nodes ``keep`` (the root is always kept; every kept
        node's parent must be kept too), in the original order. Pure.

        Raises:
            ValueError: a kept node whose parent is not kept.
        """
        kept = sorted({0, *keep})
        new_index = {old: new for new, old in enumerate(kept)}
        parents = []
        for old in kept:
            p = self.parents[old]
            if p >= 0 and p not in new_index:
                raise ValueError(f"node {old} is kept but its parent {p} is not")
            parents.append(-1 if p < 0 else new_index[p])
        return DraftTree(tuple(self.tokens[i] for i in kept), tuple(parents),
                         tuple(self.depths[i] for i in kept), tuple(self.states[i] for i in kept),
                         tuple(self.sources[i] for i in kept),
                         tuple(self.scores[i] for i in kept) if self.scores else ())

    def ancestors_matrix(self) -> np.ndarray:
        """``[q, q]`` bool: ``m[i, j]`` when ``j`` is ``i`` or an ancestor of ``i``."""
        n = len(self.tokens)
        m = np.zeros((n, n), dtype=bool)  # [q, q]
        for i in range(n):
            p = self.parents[i]
            if p >= 0:
                m[i] = m[p]
            m[i, i] = True
        return m


def chain(tokens: Sequence[int], states: Sequence[State], source: str = "chain") -> DraftTree:
    """A tree that is a single chain: ``tokens[0]`` is the root. Convenience for tests."""
    n = len(tokens)
    return DraftTree(tuple(tokens), tuple(range(-1, n - 1)), tuple(range(n)), tuple(states),
                     (ROOT_SOURCE,) + (source,) * (n - 1))


def tree_attention(
    tree: DraftTree, past_len: int, dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu", prefix_len: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention mask and position ids that run ``tree`` in one pass after ``past_len``.

    Args:
        tree: the draft tree (``q`` nodes).
        past_len: tokens already in the KV cache (they precede the root).
        dtype: the model's compute dtype (the mask is additive in this dtype).
        device: where the tensors go.
        prefix_len: ``L`` committed tokens not yet in the cache, run in the same pass before
            the tree (the prompt, so that the prefill also verifies the first tree): they
            attend causally, and every tree node sees all of them.

    Returns:
        ``(mask, position_ids)``: ``mask`` is ``[1, 1, L + q, past_len + L + q]`` float, ``0``
        where a query may attend (the past, the prefix causally, a node's ancestors and
        itself) and ``finfo(dtype).min`` elsewhere — additive, because a bool mask is silently
        wrong under eager attention; ``position_ids`` is ``[1, L + q]`` long: ``past_len + i``
        for the prefix, ``past_len + L + depth`` for the tree.
    """
    if past_len < 0 or prefix_len < 0:
        raise ValueError(f"past_len and prefix_len must be >= 0, got {past_len}, {prefix_len}")
    n = prefix_len + len(tree)
    visible = torch.ones((n, n), dtype=torch.bool).tril_()  # [L+q, L+q] causal
    visible[prefix_len:, prefix_len:] = torch.from_numpy(tree.ancestors_matrix())  # [q, q]
    mask = torch.zeros((1, 1, n, past_len + n), dtype=dtype)  # [1, 1, L+q, P+L+q]
    mask[0, 0, :, past_len:].masked_fill_(~visible, torch.finfo(dtype).min)
    positions = torch.cat([
        torch.arange(prefix_len, dtype=torch.long),  # [L]
        torch.tensor(tree.depths, dtype=torch.long) + prefix_len,  # [q]
    ]).unsqueeze(0) + past_len  # [1, L+q]
    return mask.to(device), positions.to(device)


class TreeBuilder:
    """Grows a :class:`DraftTree` from a root, keeping every node legal and within budget.

    Args:
        constraint: the compiled constraint (legality is ``constraint.advance``).
        root_token: the last committed token.
        root_state: the constraint state after ``root_token``.
        max_depth: no node deeper than this (the root is depth 0).
        max_nodes: at most this many *counted* nodes (speculative branches and their
            forced extensions; the main forced chain is added uncounted).
        max_branches: at most this many branches (new children opened by
            :meth:`add_branch`).
        eos_ids: end-of-sequence ids, never drafted (nothing follows them).

    Mutable; not thread-safe. :meth:`freeze` returns the immutable tree.
    """

    def __init__(
        self, constraint: Constraint, root_token: int, root_state: State, *,
        max_depth: int, max_nodes: int, max_branches: int, eos_ids: Iterable[int] = (),
    ) -> None:
        self.constraint = constraint
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.max_branches = max_branches
        self.eos_ids = frozenset(eos_ids)
        self.tokens: list[int] = [root_token]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]
        self.states: list[State] = [root_state]
        self.sources: list[str] = [ROOT_SOURCE]
        self.scores: list[float] = [math.nan]
        self._children: list[dict[int, int]] = [{}]
        self.counted = 0
        self.branches = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, parent: int, token: int) -> int | None:
        """The existing child of ``parent`` with ``token``, if any."""
        return self._children[parent].get(token)

    def num_children(self, parent: int) -> int:
        """How many children ``parent`` has so far."""
        return len(self._children[parent])

    @contextlib.contextmanager
    def extra_branches(self, n: int) -> Iterator[None]:
        """Within the block, the branch budget is ``n`` more than the branches opened so far
        (whatever the bound was: drafting past the ends of other branches gets its own
        allowance); restored after."""
        cap = self.max_branches
        self.max_branches = self.branches + n
        try:
            yield
        finally:
            self.max_branches = cap

    def room(self, parent: int) -> int:
        """How many more nodes a chain under ``parent`` could get (depth and node budget)."""
        return max(0, min(self.max_depth - self.depths[parent], self.max_nodes - self.counted))

    def add(self, parent: int, token: int, source: str, *, counted: bool = True,
            score: float | None = None) -> int | None:
        """Add ``token`` under ``parent``; returns its node index, or ``None`` if refused.

        ``score``: the drafter's estimate of P(accepted | parent accepted), if it has one.
        An existing child with the same token is returned as is (taking ``score`` if it had
        none). Refused: EOS, a token the constraint rejects, beyond ``max_depth``, or
        (``counted``) beyond ``max_nodes``.
        """
        existing = self._children[parent].get(token)
        if existing is not None:
            if score is not None and math.isnan(self.scores[existing]):
                self.scores[existing] = float(score)
            return existing
        if token in self.eos_ids or self.depths[parent] >= self.max_depth:
            return None
        if counted and self.counted >= self.max_nodes:
            return None
        state = self.constraint.advance(self.states[parent], token)
        if state is None:
            return None
        index = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.states.append(state)
        self.sources.append(source)
        self.scores.append(math.nan if score is None else float(score))
        self._children.append({})
        self._children[parent][int(token)] = index
        if counted:
            self.counted += 1
        return index

    def add_chain(self, parent: int, tokens: Iterable[int], source: str, *,
                  counted: bool = True) -> int:
        """Add ``tokens`` one under the other from ``parent``, stopping at the first refusal.

        Returns the index of the last node reached (``parent`` if none was added).
        """
        node = parent
        for t in tokens:
            nxt = self.add(node, t, source, counted=counted)
            if nxt is None:
                break
            node = nxt
        return node

    def add_branch(self, parent: int, tokens: Sequence[int], source: str, *,
                   score: float | None = None) -> int | None:
        """Open a branch: like :meth:`add_chain`, counted, and charged one branch if it adds a
        new child under ``parent``; ``score`` goes to its first node (see :meth:`add`).
        Returns the last node, or ``None`` when the branch budget is spent or nothing could
        be added (not even an existing child to follow)."""
        if not tokens:
            return None
        is_new = self._children[parent].get(tokens[0]) is None
        if is_new and self.branches >= self.max_branches:
            return None
        first = self.add(parent, tokens[0], source, score=score)
        if first is None:
            return None
        end = self.add_chain(first, tokens[1:], source)
        if is_new:
            self.branches += 1
        return end

    def freeze(self) -> DraftTree:
        """The immutable :class:`DraftTree` built so far."""
        scored = any(not math.isnan(x) for x in self.scores)
        return DraftTree(tuple(self.tokens), tuple(self.parents), tuple(self.depths),
                         tuple(self.states), tuple(self.sources),
                         tuple(self.scores) if scored else ())
