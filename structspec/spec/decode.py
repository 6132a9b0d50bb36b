"""Speculative constrained decoding: draft a tree, verify it in one pass, keep what agrees.

Each step (DESIGN.md, "Data flow of one request"):

1. drafters grow a :class:`~structspec.spec.tree.DraftTree` rooted at the last committed
   token — every node legal under the constraint;
2. one forward pass of the target over all nodes (tree attention on the KV cache);
3. acceptance walks the tree with each node's masked logits: greedy is token-identical to
   :func:`structspec.engine.decode`, sampling is lossless (multi-draft rejection), and a
   lossy typical-acceptance mode is opt-in;
4. the KV cache keeps only the accepted path; the bonus token becomes the next root.

The cache always holds the committed sequence *minus its last token*, which is the next root.
The prompt is not prefilled on its own: the first verification pass runs the prompt and the
first tree together (the prompt's last token is the first root), so that pass computes the
first token's distribution and already checks drafts after it — as many passes as plain
decoding when nothing is drafted. ``stats.prefill_seconds`` is that first pass.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from structspec.automata.base import Constraint, State
from structspec.engine import DecodeOutput, DecodeStats, advance_or_raise, dead_end
from structspec.errors import GenerationError
from structspec.sampling import SamplingParams, make_generator
from structspec.spec.accept import MaskCache, walk_tree
from structspec.spec.drafters import (
    DRAFTERS,
    FORCED,
    CanonicalTokenizer,
    DraftContext,
    NgramIndex,
    build_tree,
    extract_literals,
    learn_choice,
    make_drafters,
)
from structspec.spec.schedule import DrafterGate, Scheduler
from structspec.spec.tree import DraftTree, TreeBuilder
from structspec.spec.verify import check_tree_support, keep_path, verify_tree
from structspec.vocab import Vocabulary

DEFAULT_DRAFTERS = ("values", "closers", "lookup", "alternatives", "topk")


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate.

    Attributes:
        enabled: ``False`` runs the same loop with a root-only tree (one token per pass):
            the baseline of the same engine.
        draft_length: maximum tree depth (drafted tokens on one path).
        num_speculations: maximum branches opened by the speculative drafters per step.
        max_nodes: maximum speculative nodes per step (branches and their forced
            extensions). The forced chain from the root is bounded by ``draft_length`` only,
            so a pass runs at most ``1 + draft_length + max_nodes`` tokens.
        validation_threshold: ``None`` for lossless acceptance; a float ``ε`` in (0, 1)
            enables Medusa-style typical acceptance (lossy, opt-in).
        adaptive: shrink the speculative budget when its hit rate over ``window`` steps is
            below ``min_acceptance`` (down to none, probing every ``probe_every`` steps).
        forced: draft the forced chain from the root.
        drafters: speculative drafters by registry name, in priority order.
        lookup_max_n: longest n-gram the lookup drafter matches.
        topk: how many top tokens the ``topk`` drafter proposes.
        alternatives_max: the ``alternatives`` drafter branches where at most this many
            tokens are allowed.
        values_max: at most this many branches from the ``values`` drafter per step.
    """

    enabled: bool = True
    draft_length: int = 32
    num_speculations: int = 8
    max_nodes: int = 16
    validation_threshold: float | None = None
    adaptive: bool = True
    window: int = 8
    min_acceptance: float = 0.6
    probe_every: int = 16
    forced: bool = True
    drafters: tuple[str, ...] = DEFAULT_DRAFTERS
    lookup_max_n: int = 3
    topk: int = 2
    alternatives_max: int = 8
    values_max: int = 4

    def __post_init__(self) -> None:
        for name in ("draft_length", "num_speculations", "max_nodes", "window", "probe_every",
                     "lookup_max_n", "topk", "alternatives_max", "values_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.validation_threshold is not None and not 0 < self.validation_threshold < 1:
            raise ValueError(
                f"validation_threshold must be in (0, 1) or None, got {self.validation_threshold!r}"
            )
        if not 0 <= self.min_acceptance <= 1:
            raise ValueError(f"min_acceptance must be in [0, 1], got {self.min_acceptance!r}")
        unknown = [d for d in self.drafters if d not in DRAFTERS and d != FORCED]
        if unknown:
            raise ValueError(f"unknown drafters {unknown}; known: {sorted([*DRAFTERS, FORCED])}")

    @property
    def options(self) -> dict[str, Any]:
        """Per-drafter knobs, as drafters read them from the context."""
        return {"lookup_max_n": self.lookup_max_n, "topk": self.topk,
                "alternatives_max": self.alternatives_max, "values_max": self.values_max}


@dataclass
class SpecStats(DecodeStats):
    """:class:`~structspec.engine.DecodeStats` plus what speculation did.

    Attributes:
        steps: verification passes (all forward passes: the first one also prefills).
        draft_nodes: drafted nodes over all steps (roots excluded).
        accepted_tokens: drafted tokens accepted.
        draft_seconds: time building trees.
        verify_seconds: time in verification passes and KV compaction.
        per_drafter: ``{source: [proposed nodes, accepted nodes]}`` (``"forced"`` included).
        per_depth: ``[[steps whose tree reached depth d, steps that accepted depth d], ...]``
            for ``d = 1, 2, ...``.
        budgets: speculative node budget per step (the scheduler's decisions).
    """

    steps: int = 0
    draft_nodes: int = 0
    accepted_tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    per_drafter: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    per_depth: list[list[int]] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per verification pass (accepted drafts + the bonus)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per forward pass, the prefill included."""
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    def acceptance(self) -> dict[str, float]:
        """Accepted / proposed nodes per drafter."""
        return {k: round(a / p, 4) if p else 0.0 for k, (p, a) in sorted(self.per_drafter.items())}

    def as_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The stats as a plain dict (for JSON output)."""
        out: dict[str, Any] = dict(super().as_dict())
        out.update({
            "steps": self.steps,
            "draft_nodes": self.draft_nodes,
            "accepted_tokens": self.accepted_tokens,
            "mean_accepted_length": round(self.mean_accepted_length, 3),
            "tokens_per_pass": round(self.tokens_per_pass, 3),
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
            "per_drafter": {k: list(v) for k, v in sorted(self.per_drafter.items())},
            "acceptance_per_drafter": self.acceptance(),
            "per_depth": [list(x) for x in self.per_depth],
        })
        return out


@torch.inference_mode()
def speculative_decode(
    model: Any,
    vocab: Vocabulary,
    prompt_ids: list[int],
    constraint: Constraint,
    *,
    max_new_tokens: int,
    sampling: SamplingParams,
    config: SpecConfig | None = None,
    tokenizer: Any = None,
) -> DecodeOutput:
    """Generate under ``constraint`` with speculative decoding over draft trees.

    Same contract as :func:`structspec.engine.decode` — same stopping rules, same errors,
    greedy output token-identical, sampled output identically distributed (unless
    ``config.validation_threshold`` is set).

    Args:
        model: a ``transformers`` causal LM (eager or sdpa attention, full-attention cache).
        vocab: the vocabulary the constraint was compiled for.
        prompt_ids: the prompt, already templated and tokenized (non-empty).
        constraint: the compiled constraint.
        max_new_tokens: at most this many tokens are generated.
        sampling: greedy or sampling parameters.
        config: speculation settings (default :class:`SpecConfig`).
        tokenizer: the model's tokenizer, for canonical tokenization of forced text and
            literals (``None``: forced text uses the longest matching token instead).

    Returns:
        A :class:`~structspec.engine.DecodeOutput` whose ``stats`` is a :class:`SpecStats`.

    Raises:
        GenerationError: ``max_new_tokens`` was reached before the output was complete (the
            error's ``stats`` attribute holds the :class:`SpecStats` of the run), or the
            constraint reached a state with no legal token.
        UnsupportedModelError: speculation is enabled and the model cannot verify trees.
    """
    from transformers import DynamicCache

    config = config or SpecConfig()
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = model.device
    stats = SpecStats(prompt_tokens=len(prompt_ids))
    generator = make_generator(sampling, device)
    eos = frozenset(vocab.eos_token_ids)
    start = time.perf_counter()

    cache = DynamicCache(config=model.config)
    if config.enabled:
        check_tree_support(model, cache)
    past_len = 0
    prefix = list(prompt_ids[:-1])  # prefilled in the first verification pass

    history = NgramIndex(max(1, config.lookup_max_n))
    history.extend(prompt_ids)
    ctx = DraftContext(
        constraint=constraint, vocab=vocab, canon=CanonicalTokenizer(tokenizer, vocab),
        history=history, prompt_len=len(prompt_ids),
        literals=extract_literals(vocab.decode_text(prompt_ids)) if config.enabled else [],
        options=config.options,
    )
    drafters = make_drafters(config.drafters) if config.enabled else []
    scheduler = Scheduler(config.max_nodes, config.num_speculations, adaptive=config.adaptive,
                          window=config.window, min_acceptance=config.min_acceptance,
                          probe_every=config.probe_every)
    gate = DrafterGate(config.window, config.probe_every, adaptive=config.adaptive)
    masks: MaskCache | None = None

    root = prompt_ids[-1]
    state: State = constraint.initial
    out: list[int] = []
    complete = False
    while True:
        # The checks plain decoding makes before each forward pass.
        if constraint.is_accepting(state) and constraint.allowed(state).count() <= len(eos):
            complete = True
            break
        if len(out) >= max_new_tokens:
            break
        if constraint.allowed(state).count() == 0:
            raise dead_end(vocab, out)

        t0 = time.perf_counter()
        tree, frontier_depth = _draft(ctx, drafters, scheduler, gate, config, root, state, eos,
                                      remaining=max_new_tokens - len(out))
        t1 = time.perf_counter()
        logits = verify_tree(model, cache, tree, past_len, prefix)  # [q, V]
        past_len += len(prefix)
        stats.forward_passes += 1
        stats.steps += 1
        t2 = time.perf_counter()
        if prefix:
            stats.prefill_seconds = t2 - start
            prefix = []
        if masks is None:
            masks = MaskCache(logits.shape[-1], logits.device)
        acc = walk_tree(tree, logits, constraint, masks, sampling, generator, eos_ids=eos,
                        budget=max_new_tokens - len(out),
                        validation_threshold=config.validation_threshold)
        t3 = time.perf_counter()
        keep_path(cache, past_len, acc.path)
        past_len += len(acc.path)
        t4 = time.perf_counter()
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += (t2 - t1) + (t4 - t3)
        stats.mask_seconds += t3 - t2
        _record(stats, scheduler, gate, tree, acc.path, frontier_depth)

        accepted = [tree.tokens[i] for i in acc.path[1:]]
        out.extend(accepted)
        history.extend(accepted)
        state = tree.states[acc.path[-1]]
        ctx.last_logits = acc.masked_logits
        if acc.outcome in ("eos", "complete"):
            complete = True
            break
        if acc.outcome == "limit":
            break
        if acc.outcome == "dead":
            raise dead_end(vocab, out)
        token = int(acc.token)  # type: ignore[arg-type]
        if config.enabled and config.forced:
            prev = tree.tokens[acc.path[-1]]
            learn_choice(ctx, state, prev, token)
        state = advance_or_raise(constraint, state, token, vocab, out)
        out.append(token)
        history.extend([token])
        root = token

    complete = complete or constraint.is_accepting(state)
    stats.new_tokens = len(out)
    stats.seconds = time.perf_counter() - start
    stats.budgets = scheduler.history
    if not complete:
        text = vocab.decode_text(out)
        error = GenerationError(
            f"max_new_tokens={max_new_tokens} reached before the output was complete "
            f"(partial output: {text[:200]!r}{'...' if len(text) > 200 else ''})",
            text, out,
        )
        error.stats = stats  # type: ignore[attr-defined]  # what the failed run cost
        raise error
    return DecodeOutput(out, complete, stats)


def _draft(
    ctx: DraftContext, drafters: list[Any], scheduler: Scheduler, gate: DrafterGate,
    config: SpecConfig,
    root: int, state: State, eos: frozenset[int], *, remaining: int,
) -> tuple[DraftTree, int]:
    """This step's tree and the depth of its frontier (the end of the forced chain)."""
    if not config.enabled:
        builder = TreeBuilder(ctx.constraint, root, state, max_depth=0, max_nodes=0,
                              max_branches=0, eos_ids=eos)
        return builder.freeze(), 0
    budget = scheduler.budget()
    builder = TreeBuilder(ctx.constraint, root, state,
                          max_depth=min(config.draft_length, remaining),
                          max_nodes=budget.nodes, max_branches=budget.branches, eos_ids=eos)
    frontier = build_tree(ctx, builder, drafters if budget.nodes else [], forced=config.forced,
                          active=gate.active)
    return builder.freeze(), builder.depths[frontier]


def _record(stats: SpecStats, scheduler: Scheduler, gate: DrafterGate, tree: DraftTree,
            path: tuple[int, ...], frontier_depth: int) -> None:
    """Update per-drafter / per-depth stats; tell the scheduler and the gate how it went."""
    stats.draft_nodes += len(tree) - 1
    stats.accepted_tokens += len(path) - 1
    for i in range(1, len(tree)):
        stats.per_drafter[tree.sources[i]][0] += 1
    for i in path[1:]:
        stats.per_drafter[tree.sources[i]][1] += 1
    depth = tree.max_depth
    while len(stats.per_depth) < depth:
        stats.per_depth.append([0, 0])
    for d in range(depth):
        stats.per_depth[d][0] += 1
    for d in range(len(path) - 1):
        stats.per_depth[d][1] += 1
    proposed = {tree.sources[i]: False for i in range(1, len(tree))
                if tree.sources[i] != FORCED}
    for i in path[1:]:
        if tree.sources[i] in proposed:
            proposed[tree.sources[i]] = True
    gate.record(proposed)
    speculative = sum(1 for d in tree.depths if d > frontier_depth)
    scheduler.record(speculative, max(0, len(path) - 1 - frontier_depth))
