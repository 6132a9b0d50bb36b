"""Draft-model drafter: a small causal LM with the target's tokenizer proposes a tree.

The draft model expands its most likely *legal* tokens level by level below the frontier
(the end of the forced chain; or, where the draft model would split the forced text
otherwise, below the chain node where it first disagrees): its greedy chain, plus at the
first ``draft_model_branch_levels`` levels the next ``draft_model_topk - 1`` candidates as
side branches, each extended greedily while the draft model stays confident (a draft tree
in the manner of SpecInfer, Miao et al. 2023, and EAGLE-2, Li et al. 2024 — with greedy
verification the greedy chain is what a faithful draft model gets right). Every candidate
is masked by the constraint in its node's state before ranking, so every proposed node is
legal (the :class:`~structspec.spec.tree.TreeBuilder` checks it again). Each level is one
forward pass of the draft model over that level's new nodes, with a tree mask on top of its
own KV cache; it goes deeper only while its running acceptance says the next level is
likely enough to be reached.

The draft model keeps its own ``DynamicCache`` in sync with the committed sequence cheaply:

- its cache holds a *prefix* of committed tokens, followed by the nodes it drafted last step
  (in the order it ran them);
- next step, the newly committed tokens are matched against that prefix and then against its
  drafted nodes: the accepted draft path is compacted in place
  (:func:`~structspec.spec.verify.keep_path`: no recomputation), anything else is cropped
  away (:func:`~structspec.spec.verify.rollback`: a slice), and only the tokens it has not
  seen — usually the bonus token and the forced chain, in one pass that also checks the
  forced chain against the draft model's own choices — are run.

Drafts are a deterministic function of the context, so they are point masses and acceptance
stays lossless in both greedy and sampling modes. Under sampling the first candidate at a
node — the one its chain continues from — is the token the output position's seeded number
picks from the draft model's distribution (:meth:`DraftModelDrafter._coupled`), the
likeliest tokens its side branches as before: the target's token there is the one the same
number picks from the target's distribution, so the closer the draft model, the more often
they agree (always, for a draft model that computes the target's numbers).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch

from structspec.errors import VocabularyError
from structspec.hf_compat import cache_kwargs
from structspec.masks import mask_to_bool
from structspec.sampling import probabilities, sample_at
from structspec.spec.drafters import register_drafter
from structspec.spec.tree import TreeBuilder
from structspec.spec.verify import (
    check_tree_support,
    keep_path,
    probe_tree_support,
    rollback,
    tree_pass_attention,
)
from structspec.vocab import Vocabulary

SOURCE = "draft_model"


class DraftModelMismatchError(VocabularyError):
    """The draft model does not share the target's tokenizer (token ids would not match)."""


def _text_tokens(tokens: list[bytes]) -> list[bytes]:
    """``tokens`` without the trailing empty entries (padding of the embedding matrix)."""
    n = len(tokens)
    while n and not tokens[n - 1]:
        n -= 1
    return tokens[:n]


def _signature(tokens: list[bytes]) -> str:
    h = hashlib.sha256()
    for t in tokens:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    return h.hexdigest()[:32]


class DraftModel:
    """A small causal LM used as a drafter, with what is needed to check it fits the target.

    Args:
        model: a ``transformers`` causal LM whose attention takes custom 4D masks
            (``eager`` or ``sdpa``).
        tokenizer: its tokenizer; when given, its vocabulary must equal the target's token
            for token (checked by :meth:`check`). Without it only the logits width is checked.
        name: for messages and stats.

    Holds no per-request state (each decode's drafter owns its KV cache), so one instance can
    serve many requests — one at a time per model, like the target.
    """

    def __init__(self, model: Any, tokenizer: Any = None, *, name: str = "draft") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self._checked: set[str] = set()

    @classmethod
    def resolve(cls, spec: Any, *, device: str = "cpu", pack: bool = True) -> DraftModel:
        """A :class:`DraftModel` from a model id/path (loaded), a
        :class:`~structspec.models.LoadedModel`, a ``DraftModel`` (returned as is) or a bare
        ``transformers`` model.

        Raises:
            ModelLoadError: ``spec`` names a model that cannot be loaded.
        """
        if isinstance(spec, DraftModel):
            return spec
        from structspec.models import LoadedModel, load_model

        if isinstance(spec, str):
            spec = load_model(spec, device=device)
            if pack:
                from structspec.spec.cpu_paths import use_fast_cpu_paths

                use_fast_cpu_paths(spec.model, prompt_panels=False)  # (drafts: no prompts)
        if isinstance(spec, LoadedModel):
            return cls(spec.model, spec.tokenizer, name=spec.name)
        return cls(spec, None, name=type(spec).__name__)

    @property
    def vocab_size(self) -> int:
        """Width of the draft model's logits."""
        head = self.model.get_output_embeddings() if hasattr(
            self.model, "get_output_embeddings") else None
        width = getattr(head, "out_features", None) or getattr(
            getattr(head, "weight", None), "shape", [None])[0]
        return int(width or self.model.config.vocab_size)

    def check(self, vocab: Vocabulary) -> None:
        """Refuse a draft model whose token ids do not mean what the target's mean.

        Args:
            vocab: the target's vocabulary (the one the constraint was compiled for).

        Raises:
            DraftModelMismatchError: the draft tokenizer's tokens differ from the target's
                (the message names the first differing id), or its logits are narrower than
                the target's text vocabulary.

        Memoized per vocabulary; cheap after the first call.
        """
        key = vocab.fingerprint
        if key in self._checked:
            return
        target = _text_tokens(list(vocab.tokens))
        width = self.vocab_size
        if width < len(target):
            raise DraftModelMismatchError(
                f"draft model {self.name!r} has {width} output ids but the target's vocabulary "
                f"has {len(target)} tokens: a draft model must share the target's tokenizer"
            )
        if self.tokenizer is not None:
            mine = _text_tokens(list(Vocabulary.from_tokenizer(self.tokenizer).tokens))
            if _signature(mine) != _signature(target):
                first = next((i for i, (a, b) in enumerate(zip(mine, target, strict=False))
                              if a != b), min(len(mine), len(target)))
                detail = (f"token {first} is {mine[first]!r} there and {target[first]!r} in the "
                          f"target" if first < min(len(mine), len(target))
                          else f"{len(mine)} tokens vs {len(target)}")
                raise DraftModelMismatchError(
                    f"draft model {self.name!r} does not share the target's tokenizer "
                    f"({detail}); pick a draft model of the same family"
                )
        self._checked.add(key)


class DraftModelDrafter:
    """Registered as ``"draft_model"``; reads the model from ``ctx.draft_model``.

    Per-decode state: the draft KV cache and what it holds. Options (``ctx.options``):
    ``draft_model_topk`` (branching width, default 2), ``draft_model_branch_levels`` (levels
    with branching, default 2), ``draft_model_min_prob`` (a side branch needs at least this
    cumulative draft probability, default 0.05), ``draft_model_min_reach`` (with
    ``ctx.acceptance``, the drafter goes one level deeper only while the product of its
    running acceptance rates down to that depth stays above this, default 0.05 — each level
    is a draft pass, and a weak draft model stops paying for them). Not thread-safe.

    Attributes:
        forward_passes: draft-model forward calls so far.
    """

    name = SOURCE

    def __init__(self) -> None:
        self.cache: Any = None
        self.prefix: list[int] = []  # committed tokens whose key/values are in the cache
        # Nodes run after the prefix last step: (token, parent slot or -1), in cache order.
        self.nodes: list[tuple[int, int]] = []
        self.forward_passes = 0
        self._model: Any = None
        self._masks: dict[int, tuple[Any, torch.Tensor, int, torch.Tensor]] = {}

    # -- cache bookkeeping ---------------------------------------------------------------

    def sync(self, draft: DraftModel, sequence: list[int],
             need_from: int | None = None) -> torch.Tensor:
        """Bring the cache to ``sequence``; returns the draft logits ``[n, V]`` after each of
        ``sequence[need_from:]`` (default: the last token only). Mutates the cache.

        Reuses the longest part already cached: the common prefix, then the drafted nodes
        that ``sequence`` continues with (compacted in place); crops the rest, and whatever
        lies at or after ``need_from`` (those positions must be run for their logits).
        """
        model = draft.model
        if need_from is None:
            need_from = len(sequence) - 1
        if not 0 <= need_from < len(sequence):
            raise ValueError(f"need_from={need_from} outside a sequence of {len(sequence)}")
        if self.cache is None or self._model is not model:
            from transformers import DynamicCache

            # Full layers even for a sliding-window model: its tree passes compact the cache,
            # which a window's dropped keys would break; past its window it then sees more
            # than it was trained on, which only changes its guesses, never the output.
            self.cache = DynamicCache()
            check_tree_support(model, self.cache)
            probe_tree_support(model)
            self._model = model
            self.prefix, self.nodes = [], []
        common = 0
        limit = min(len(self.prefix), len(sequence))
        while common < limit and self.prefix[common] == sequence[common]:
            common += 1
        if common == len(self.prefix) and self.nodes:
            kids: dict[tuple[int, int], int] = {(p, t): i for i, (t, p) in enumerate(self.nodes)}
            path: list[int] = []
            parent = -1
            for token in sequence[common:need_from]:
                slot = kids.get((parent, token))
                if slot is None:
                    break
                path.append(slot)
                parent = slot
            if path:  # an accepted draft path: compact it in place, no recompute
                keep_path(self.cache, common, path)
                common += len(path)
        common = min(common, need_from)
        rollback(self.cache, common)
        self.nodes = []
        feed = sequence[common:]
        ids = torch.tensor([feed], dtype=torch.long, device=model.device)  # [1, n]
        logits = model(input_ids=ids, **cache_kwargs(model, self.cache), use_cache=True,
                       logits_to_keep=len(sequence) - need_from).logits
        self.forward_passes += 1
        self.prefix = list(sequence)
        return logits[0]  # [len(sequence) - need_from, V]

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` tokens of the cached prefix (no drafted nodes)."""
        rollback(self.cache, length)
        self.prefix = self.prefix[:length]
        self.nodes = []

    def _run_level(self, draft: DraftModel, tokens: list[int], parents: list[int],
                   depths: list[int]) -> torch.Tensor:
        """Run new tree nodes (``parents``: slots, -1 = below the prefix end; ``depths``: 1 for
        a child of the prefix end) on top of the cache; returns logits ``[m, V]``."""
        model = draft.model
        past = len(self.prefix) + len(self.nodes)
        m = len(tokens)
        base = len(self.prefix)
        visible = torch.zeros((m, past + m), dtype=torch.bool)  # [m, P+m]
        visible[:, :base] = True
        for i, parent in enumerate(parents):
            slot = parent
            while slot >= 0:
                visible[i, base + slot] = True
                slot = self.nodes[slot][1]
            visible[i, past + i] = True
        mask = torch.zeros((1, 1, m, past + m), dtype=model.dtype)  # [1, 1, m, P+m]
        mask[0, 0].masked_fill_(~visible, torch.finfo(model.dtype).min)
        positions = torch.tensor([[base - 1 + d for d in depths]], dtype=torch.long)  # [1, m]
        ids = torch.tensor([tokens], dtype=torch.long, device=model.device)  # [1, m]
        try:
            with tree_pass_attention(model.device):
                out = model(input_ids=ids, **cache_kwargs(model, self.cache), use_cache=True,
                            attention_mask=mask.to(model.device),
                            position_ids=positions.to(model.device))
        except BaseException:
            rollback(self.cache, past)
            raise
        self.forward_passes += 1
        first = len(self.nodes)
        for k, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
            assert first + k == len(self.nodes)
            self.nodes.append((token, parent))
        return out.logits[0]  # [m, V]

    def _legal(self, ctx: Any, state: Any, width: int, device: torch.device,
               eos: frozenset[int]) -> tuple[torch.Tensor, int, torch.Tensor]:
        """``[width]`` bool: tokens legal in ``state``, EOS excluded, how many there are, and
        ``[width]`` bool: the legal tokens EOS included (the target's mask there). Memoized
        per mask object (constraints memoize masks per state)."""
        mask = ctx.constraint.allowed(state)
        hit = self._masks.get(id(mask))
        if hit is None:
            legal = mask_to_bool(mask, width, device)
            allowed = legal.clone()
            for e in eos:
                if e < width:
                    allowed[e] = False
            if len(self._masks) > 256:
                self._masks.clear()
            hit = (mask, allowed, int(allowed.sum()), legal)
            self._masks[id(mask)] = hit
        return hit[1], hit[2], hit[3]

    @staticmethod
    def _coupled(ctx: Any, row: torch.Tensor, legal: torch.Tensor, n_allowed: int, depth: int,
                 eos: frozenset[int]) -> int | None:
        """Under sampling, the token the output position below a node at ``depth`` will be
        sampled with, picked from the draft model's own distribution there (the target's
        mask, temperature, top-k and top-p) by that position's number; ``None`` when greedy,
        where it is EOS (never drafted) or where a single token besides EOS is legal (then
        the likeliest is that one: no distribution over the vocabulary is needed, and forced
        chains are long).

        Why: the target's token at that position is the one the same number picks from the
        target's distribution (:class:`~structspec.sampling.TokenDraws`), so a draft model
        close to the target drafts the sampled token itself — always, for a draft model
        that computes the target's numbers — where its likeliest token is the sampled one
        only with the target's probability of it."""
        u = ctx.draw_below(depth)
        if u is None or n_allowed <= 1:
            return None
        q = probabilities(row.float().masked_fill(~legal, float("-inf")), ctx.sampling)
        token = sample_at(q, u)
        return None if token in eos else token

    # -- drafting --------------------------------------------------------------------------

    def propose(self, ctx: Any, builder: TreeBuilder, frontier: int) -> None:
        """Expand the draft model's best legal tokens below ``frontier`` — or below the first
        node of the forced chain where the draft model would have written another token (see
        the module docstring). Mutates ``builder`` and this drafter's cache."""
        draft: DraftModel | None = getattr(ctx, "draft_model", None)
        if draft is None or builder.room(frontier) <= 0:
            return
        topk = max(1, int(ctx.options.get("draft_model_topk", 2)))
        branch_levels = int(ctx.options.get("draft_model_branch_levels", 2))
        min_logp = math.log(max(1e-12, float(ctx.options.get("draft_model_min_prob", 0.05))))
        min_reach = float(ctx.options.get("draft_model_min_reach", 0.05))
        acceptance = getattr(ctx, "acceptance", None)
        reach = 1.0
        chain = [frontier]  # the forced chain, root first
        while chain[-1] > 0:
            chain.append(builder.parents[chain[-1]])
        chain.reverse()
        committed = list(ctx.history.tokens)
        sequence = committed + [builder.tokens[i] for i in chain[1:]]
        rows = self.sync(draft, sequence, need_from=len(committed) - 1)  # [len(chain), V]
        width = rows.shape[-1]
        # Start where the draft model first disagrees with the forced chain (forced text can
        # be split in several ways; the model may prefer another), else at its end.
        start = len(chain) - 1
        for j in range(len(chain) - 1):
            allowed, n_allowed, legal = self._legal(ctx, builder.states[chain[j]], width,
                                                    rows.device, builder.eos_ids)
            if not n_allowed:
                continue
            mine = self._coupled(ctx, rows[j], legal, n_allowed, builder.depths[chain[j]],
                                 builder.eos_ids)
            if mine is None:
                mine = int(torch.argmax(rows[j].masked_fill(~allowed, float("-inf"))))
            if mine != builder.tokens[chain[j + 1]]:
                start = j
                break
        if start < len(chain) - 1:
            self.truncate(len(committed) + start)
        frontier = chain[start]
        if builder.room(frontier) <= 0:
            return
        base_depth = builder.depths[frontier]
        # Beams: (builder node, draft slot (-1: the start), logits [V], log-prob since the
        # branch point, whether it is the greedy chain). The chain is the draft model's
        # greedy continuation; side branches open off it at the first levels and are
        # extended greedily while the draft model is confident enough.
        beams: list[tuple[int, int, torch.Tensor, float, bool]] = [
            (frontier, -1, rows[start], 0.0, True)]
        level = 0
        while beams:
            if level and acceptance is not None:
                # Each level costs a draft pass: go deeper only while this decode's draft
                # nodes at that depth are likely enough to be reached (depth 1 always).
                reach *= acceptance.rate(self.name, level + 1)
                if reach < min_reach:
                    break
            new: list[tuple[int, int, float, bool]] = []  # (node, parent slot, score, chain)
            for node, slot, row, cum, is_chain in beams:
                if builder.room(node) <= 0:
                    continue
                allowed, n_allowed, legal = self._legal(ctx, builder.states[node], width,
                                                        row.device, builder.eos_ids)
                if not n_allowed:  # only EOS (or nothing) may follow
                    continue
                k = topk if is_chain and level < branch_levels else 1
                logp = torch.log_softmax(row.float().masked_fill(~allowed, float("-inf")), -1)
                top = torch.topk(logp, min(k, n_allowed))  # [k]
                ranked = list(zip(top.values.tolist(), top.indices.tolist(), strict=True))
                coupled = self._coupled(ctx, row, legal, n_allowed, builder.depths[node],
                                        builder.eos_ids)
                if coupled is not None:  # sampling: the position's token first
                    # ... then the likeliest ones as before, none of them dropped: for a
                    # draft model far from the target (the draft head's distance, 0.56 in
                    # total variation) the position's token beat its likeliest as a single
                    # guess (0.383 against 0.373 first-level hits) but not as one of two
                    # (0.439 against 0.498).
                    ranked = [(float(logp[coupled]), coupled),
                              *[c for c in ranked if c[1] != coupled]][:k + 1 if k > 1 else 1]
                for rank, (lp, tok) in enumerate(ranked):
                    main = is_chain and rank == 0
                    score = 0.0 if main else (lp if is_chain else cum + lp)
                    if not math.isfinite(lp) or (not main and score < min_logp):
                        break  # side branches need some draft confidence
                    existing = builder.child(node, tok)
                    if existing is not None:
                        child: int | None = existing
                    elif node == frontier or builder.num_children(node):
                        child = builder.add_branch(node, [tok], self.name)
                    else:
                        child = builder.add(node, tok, self.name)
                    if child is not None:
                        new.append((child, slot, score, main))
            level += 1
            new = [n for n in new if builder.room(n[0]) > 0]  # nothing to expand below the rest
            if not new:
                break
            rows = self._run_level(draft, [builder.tokens[c] for c, _, _, _ in new],
                                   [s for _, s, _, _ in new],
                                   [builder.depths[c] - base_depth for c, _, _, _ in new])
            first = len(self.nodes) - len(new)  # rows: [m, V]
            beams = [(c, first + i, rows[i], score, main)
                     for i, (c, _, score, main) in enumerate(new)]


register_drafter(SOURCE, DraftModelDrafter)
