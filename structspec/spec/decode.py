"""Speculative constrained decoding: draft a tree, verify it in one pass, keep what agrees.

Each step (DESIGN.md, "Data flow of one request"):

1. drafters grow a :class:`~structspec.spec.tree.DraftTree` rooted at the last committed
   token — every node legal under the constraint;
2. one forward pass of the target over all nodes (tree attention on the KV cache);
3. acceptance walks the tree with each node's masked logits: greedy is token-identical to
   :func:`structspec.engine.decode`, and so is sampling under one seed (each position's token
   is the one its seeded number picks), and a lossy typical-acceptance mode is opt-in;
4. the KV cache keeps only the accepted path; the bonus token becomes the next root.

The cache holds the committed sequence *minus its last token*, which is the next root, and
minus any committed tokens still pending: the next pass runs them before the tree, like a
prefix. The prompt is not prefilled on its own: the first verification pass runs the prompt
and the first tree together (the prompt's last token is the first root), so that pass computes
the first token's distribution and already checks drafts after it — as many passes as plain
decoding when nothing is drafted. ``stats.prefill_seconds`` is that first pass. Tokens the
constraint leaves no choice about (exactly one legal token, no EOS) are committed without a
pass (:func:`certain_tokens`): plain decoding could only choose them, and an output whose
rest is certain (the closing ``}}`` of a JSON call) ends without a last pass.

Tree size: the scheduler bounds the speculative part (smaller for free text, shrunk when it
stops paying or under memory pressure), and within that bound keeps the nodes that maximize
expected tokens per second given the device's measured cost curve
(:mod:`structspec.spec.cost`).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from structspec.automata.base import Constraint, State
from structspec.engine import DecodeOutput, DecodeStats, advance_or_raise, dead_end
from structspec.errors import GenerationError
from structspec.sampling import SamplingParams, make_draws
from structspec.spec.accept import MaskCache, walk_tree
from structspec.spec.corpus import SOURCE as CORPUS
from structspec.spec.corpus import TokenCorpus, resolve_corpus
from structspec.spec.cost import (
    AcceptanceModel,
    CostCurve,
    device_cost_curve,
    free_nodes,
    memory_use,
)
from structspec.spec.counting import SOURCE as COUNTING
from structspec.spec.draft_head import OPTION_DEFAULTS as HEAD_DEFAULTS
from structspec.spec.draft_head import SOURCE as DRAFT_HEAD
from structspec.spec.draft_head import (
    DraftHead,
    captured_outputs,
    decoder_layer,
    final_norm,
    resolve_head,
)
from structspec.spec.draft_model import SOURCE as DRAFT_MODEL
from structspec.spec.draft_model import DraftModel
from structspec.spec.drafters import (
    DRAFTERS,
    FORCED,
    DraftContext,
    NgramIndex,
    build_tree,
    canonical_tokenizer,
    cheap_allowed,
    drafter_of,
    field_literals,
    learn_choice,
    learn_closer,
    make_drafters,
    request_literals,
)
from structspec.spec.habits import fresh_acceptance
from structspec.spec.lockstep import refuse_prefix_cache
from structspec.spec.prefix import PrefixCache
from structspec.spec.schedule import DrafterGate, Scheduler
from structspec.spec.sparse_logits import SparseLogits
from structspec.spec.text_lookup import SOURCE as TEXT_LOOKUP
from structspec.spec.text_lookup import TextIndex
from structspec.spec.tree import DraftTree, TreeBuilder
from structspec.spec.verify import (
    UnsupportedModelError,
    check_positions,
    check_tree_cache,
    check_tree_support,
    keep_path,
    probe_tree_support,
    tree_cache,
    verify_tree,
)
from structspec.vocab import Vocabulary

#: ``splits`` (hedging torn tokenizations) is opt-in: on BFCL it saved no passes once the
#: forced chain follows the learned splits (60 tasks: 525 passes with it, 517 without).
#: ``topk`` is opt-in too: the only distribution of the target a step has is the one the
#: root was chosen from, so its runners-up guess the token after the root from the wrong
#: position — 2 of 66 such nodes accepted on 30 BFCL + 10 HumanEval tasks, and the same
#: pass counts without it (105 and 172), with fewer nodes per pass.
DEFAULT_DRAFTERS = ("values", "closers", "lookup", TEXT_LOOKUP, COUNTING, "alternatives")
#: Speculative (nodes, branches) bounds when ``max_nodes``/``num_speculations`` are ``None``:
#: structured output (few legal tokens per step) vs free text.
AUTO_BUDGETS = {"structured": (16, 8), "free": (8, 4)}
#: Where the device's cost curve carries more speculative nodes than those bounds for
#: (almost) nothing (:func:`~structspec.spec.cost.free_nodes`: a GPU running a small model,
#: whose pass is bound by kernel launches — one node and 32 cost the same on the H200 of
#: session 32), the ``None`` node bound widens to those free nodes, at most
#: :data:`WIDE_MAX_NODES`: nodes that cost nothing should carry the drafts that hit less
#: often. With the H200's curve (``benchmarks/speculative.py --cost-curve``) 20 held-out code
#: tasks took 595 passes instead of 668, 40 BFCL calls 229 instead of 248 and 20 prose
#: prompts 1,187 instead of 1,222 (docs/performance.md, session 44). Not widened with it:
#: the branch bound (more branches for the other drafters: prose 1,221 passes) and the draft
#: head's beam (a lower floor drafts deeper, and on a GPU each further level of the head —
#: kernel launches and a read-back — costs about what its extra tokens save). A CPU's curve
#: rises from the second node on: its bounds stay :data:`AUTO_BUDGETS`.
WIDE_MAX_NODES = 32


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate.

    Attributes:
        enabled: ``False`` runs the same loop with a root-only tree (one token per pass):
            the baseline of the same engine.
        draft_length: maximum tree depth (drafted tokens on one path).
        num_speculations: maximum branches opened by the speculative drafters per step;
            ``None``: 8 for structured output, 4 for free text (:data:`AUTO_BUDGETS`).
        max_nodes: maximum speculative nodes per step (branches and their forced
            extensions); ``None``: 16 for structured output, 8 for free text, or where the
            device's passes carry more nodes than that for free, those nodes (at most 32;
            :data:`WIDE_MAX_NODES`). The forced chain from the root is bounded by
            ``draft_length`` only, so a pass runs at most ``1 + draft_length + max_nodes``
            tokens.
        validation_threshold: ``None`` for lossless acceptance; a float ``ε`` in (0, 1)
            enables Medusa-style typical acceptance (lossy, opt-in: which drafts it takes
            depends on what was drafted, so its output is not fixed by the seed alone).
        adaptive: shrink the speculative budget when its hit rate over ``window`` steps is
            below ``min_acceptance`` (down to none, probing every ``probe_every`` steps); for
            free text with a cost curve, below the break-even rate of a half-size tree when
            that is lower (:func:`break_even_hit_rate`).
        forced: draft the forced chain from the root.
        drafters: speculative drafters by registry name, in priority order.
        lookup_max_n: longest n-gram the lookup drafter matches.
        topk: how many top tokens the ``topk`` drafter proposes.
        alternatives_max: the ``alternatives`` drafter branches where at most this many
            tokens are allowed.
        values_max: at most this many branches from the ``values`` drafter per step.
        nested_rounds: rounds in which the ``values`` and ``closers`` drafters continue past
            the ends of other branches (value, closer, next key, next value in one tree;
            :func:`~structspec.spec.drafters.build_tree`); ``0`` drafts at the frontier only.
        draft_model: a small causal LM with the target's tokenizer, as the ``draft_model``
            drafter (added first to ``drafters`` when absent): a
            :class:`~structspec.spec.draft_model.DraftModel`, a
            :class:`~structspec.models.LoadedModel`, a model id/path (loaded once per
            process), or a ``transformers`` model (no tokenizer check then).
        draft_model_topk: the draft model's branching width at its first levels.
        draft_model_branch_levels: levels below the frontier where the draft model branches
            (deeper it extends its best candidate only).
        draft_head: the learned draft head (:mod:`~structspec.spec.draft_head`), as the
            ``draft_head`` drafter (inserted after ``values``/``closers`` when absent from
            ``drafters``): ``"auto"`` uses the head shipped for the target when one matches
            its fingerprint (none otherwise, silently), and so does ``True``; ``False``
            switches it off; a path or
            a :class:`~structspec.spec.draft_head.DraftHead` uses that head (a mismatch
            raises :class:`~structspec.spec.draft_head.DraftHeadMismatchError`).
        draft_head_topk: the head's beam width: paths expanded per level, and tokens per
            expanded path.
        draft_head_branch_levels: levels below the frontier where the head branches
            (deeper, each path is extended by its likeliest token only).
        draft_head_max_depth: the head drafts at most this many levels per step.
        draft_head_min_prob: the head drafts no path its own probabilities give less than
            this, and expands none (0.10: since the acceptance statistics learn from the
            nodes the plan drops, the plan prices the head's unlikely paths well, and
            offering them took 1-2% off the trees' modeled time on BFCL and HumanEval dev
            rows against 0.15; prose unchanged).
        draft_head_first_min_prob: the same bound for its first level (the tokens right
            below the frontier), which costs no further head step: by default 0, so its
            ``draft_head_topk`` guesses there are always offered and the cost plan decides
            (where the head is unsure, the nodes a pass carries for free otherwise went to
            drafts that hit less; 20 HumanEval tasks 352 passes instead of 357, 20 prose
            prompts 1,268 instead of 1,319, 60 BFCL calls 277 instead of 274).
        corpus: text the output is likely to copy from, as the ``corpus`` drafter
            (:mod:`~structspec.spec.corpus`; inserted after ``lookup`` when absent from
            ``drafters``): a :class:`~structspec.spec.corpus.TokenCorpus` or a path to a
            saved one (read when the config is made: ``FileNotFoundError``, or
            :class:`~structspec.spec.corpus.CorpusMismatchError` for a file that is not a
            corpus; a corpus of another vocabulary raises it when a decode starts);
            ``None`` (the default) or ``False``: none.
        corpus_branches: branches the corpus drafter opens per step.
        corpus_min_share: the corpus drafter extends a draft while at least this share of
            the corpus's occurrences agree on the next token.
        cost_model: size each tree by expected tokens per second from the device's cost
            curve (measured once per model and device) and the running acceptance.
        cost_curve: use this :class:`~structspec.spec.cost.CostCurve` instead of measuring
            one (tests, or a curve measured elsewhere).
        memory_threshold: above this fraction of memory in use (CUDA device memory, else
            system memory), budgets are halved; ``None`` never checks.
        sparse_logits: where a node's state allows few tokens, compute only their logits
            (bitwise the same; :mod:`~structspec.spec.sparse_logits`, on models it
            :func:`~structspec.spec.sparse_logits.supports`), with speculation off too.
    """

    enabled: bool = True
    draft_length: int = 32
    num_speculations: int | None = None
    max_nodes: int | None = None
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
    nested_rounds: int = 2
    draft_model: Any = None
    draft_model_topk: int = 2
    draft_model_branch_levels: int = 2
    draft_head: Any = "auto"
    draft_head_topk: int = int(HEAD_DEFAULTS["draft_head_topk"])
    draft_head_branch_levels: int = int(HEAD_DEFAULTS["draft_head_branch_levels"])
    draft_head_max_depth: int = int(HEAD_DEFAULTS["draft_head_max_depth"])
    draft_head_min_prob: float = HEAD_DEFAULTS["draft_head_min_prob"]
    draft_head_first_min_prob: float = HEAD_DEFAULTS["draft_head_first_min_prob"]
    corpus: Any = None
    corpus_branches: int = 1
    corpus_min_share: float = 0.3
    cost_model: bool = True
    cost_curve: CostCurve | None = None
    memory_threshold: float | None = 0.9
    sparse_logits: bool = True

    def __post_init__(self) -> None:
        for name in ("enabled", "adaptive", "forced", "cost_model", "sparse_logits"):
            if not isinstance(getattr(self, name), bool):  # "no" or "maybe" from a file
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("validation_threshold", "min_acceptance", "memory_threshold",
                     "draft_head_min_prob", "draft_head_first_min_prob", "corpus_min_share"):
            value = getattr(self, name)
            if value is None and name in ("validation_threshold", "memory_threshold"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if isinstance(self.drafters, str) or not all(isinstance(d, str) for d in self.drafters):
            raise ValueError(f"drafters must be a sequence of drafter names, got "
                             f"{self.drafters!r}")
        for name in ("draft_length", "num_speculations", "max_nodes", "window", "probe_every",
                     "lookup_max_n", "topk", "alternatives_max", "values_max", "nested_rounds",
                     "draft_model_topk", "draft_model_branch_levels", "draft_head_topk",
                     "draft_head_branch_levels", "draft_head_max_depth", "corpus_branches"):
            value = getattr(self, name)
            if value is None and name in ("num_speculations", "max_nodes"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.draft_model is not None and not isinstance(self.draft_model, str | DraftModel):
            # Wrap once, so the tokenizer check is memoized across requests.
            object.__setattr__(self, "draft_model", DraftModel.resolve(self.draft_model))
        if self.draft_model is not None and DRAFT_MODEL not in self.drafters:
            object.__setattr__(self, "drafters", (DRAFT_MODEL, *self.drafters))
        if self.draft_model is None and DRAFT_MODEL in self.drafters:
            raise ValueError("the draft_model drafter needs SpecConfig(draft_model=...)")
        if self.draft_head in ("auto", True, False, None) or isinstance(self.draft_head,
                                                                          DraftHead):
            pass
        elif isinstance(self.draft_head, str) or hasattr(self.draft_head, "__fspath__"):
            if not Path(self.draft_head).expanduser().is_file():
                # Checked here, before a model loads, rather than at the first request.
                raise ValueError(f"draft_head: no such file {str(self.draft_head)!r}")
        else:
            raise ValueError(f"draft_head must be 'auto', False, a path or a DraftHead, got "
                             f"{self.draft_head!r}")
        if not (self.corpus in (False, None) or isinstance(self.corpus, str | TokenCorpus)
                or hasattr(self.corpus, "__fspath__")):
            raise ValueError(f"corpus must be None, a path or a TokenCorpus, got "
                             f"{self.corpus!r}")
        if self.corpus not in (False, None) and not isinstance(self.corpus, TokenCorpus):
            # Read once, here: a path kept as is would be read, and its index built, again
            # by every request made with this config.
            object.__setattr__(self, "corpus", TokenCorpus.load(self.corpus))
        for name in ("draft_head_min_prob", "draft_head_first_min_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if not 0 <= self.corpus_min_share <= 1:
            raise ValueError(f"corpus_min_share must be in [0, 1], got "
                             f"{self.corpus_min_share!r}")
        if self.memory_threshold is not None and not 0 < self.memory_threshold <= 1:
            raise ValueError(f"memory_threshold must be in (0, 1], got {self.memory_threshold!r}")
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
                "alternatives_max": self.alternatives_max, "values_max": self.values_max,
                "nested_rounds": self.nested_rounds,
                "draft_model_topk": self.draft_model_topk,
                "draft_model_branch_levels": self.draft_model_branch_levels,
                "draft_head_topk": self.draft_head_topk,
                "draft_head_branch_levels": self.draft_head_branch_levels,
                "draft_head_max_depth": self.draft_head_max_depth,
                "draft_head_min_prob": self.draft_head_min_prob,
                "draft_head_first_min_prob": self.draft_head_first_min_prob,
                "corpus_branches": self.corpus_branches,
                "corpus_min_share": self.corpus_min_share}

    def budgets(self, structured: bool, free: int = 0) -> tuple[int, int]:
        """``(max_nodes, num_speculations)``, the ``None`` ones from :data:`AUTO_BUDGETS`, or
        where the device's passes carry ``free`` speculative nodes for (almost) nothing, the
        node bound widened to them (at most :data:`WIDE_MAX_NODES`)."""
        nodes, branches = AUTO_BUDGETS["structured" if structured else "free"]
        nodes = max(nodes, min(free, WIDE_MAX_NODES))
        return (nodes if self.max_nodes is None else self.max_nodes,
                branches if self.num_speculations is None else self.num_speculations)


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
        per_drafter_depth: ``{source: [[proposed, accepted] at depth d, ...]}`` for
            ``d = 1, 2, ...`` (depth from the root).
        budgets: speculative node budget per step (the scheduler's upper bound).
        planned: speculative nodes kept per step (the cost plan's choice within the bound).
        draft_model_passes: forward passes of the draft model (``draft_model`` drafter).
        draft_head: the name of the learned draft head used, if any (its acceptance is in
            ``per_drafter["draft_head"]``).
        certain_tokens: tokens committed without a pass because the constraint allowed
            nothing else (see :func:`certain_tokens`); the next pass computes their KV.
        memory_pressure_steps: steps whose budget was halved under memory pressure.
        cost_curve: the device cost curve the plan used (ms and relative), if any.
        wide: the curve carried more nodes for free than :data:`AUTO_BUDGETS` bounds a
            tree by, so an unset ``max_nodes`` was widened to them.
        max_nodes: the speculative node bound the scheduler started from.
        pass_log: ``(tree nodes, cached tokens before the pass, seconds)`` of each
            verification pass but the first (which also prefills the prompt): what passes
            cost inside the decode loop, to hold against the cost curve measured at start-up
            (``benchmarks/speculative.py`` prints both).
    """

    steps: int = 0
    draft_nodes: int = 0
    accepted_tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    per_drafter: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    per_depth: list[list[int]] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)
    per_drafter_depth: dict[str, list[list[int]]] = field(default_factory=dict)
    planned: list[int] = field(default_factory=list)
    draft_model_passes: int = 0
    draft_head: str | None = None
    certain_tokens: int = 0
    memory_pressure_steps: int = 0
    cost_curve: dict[str, Any] | None = None
    wide: bool = False
    max_nodes: int = 0
    pass_log: list[tuple[int, int, float]] = field(default_factory=list)

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

    def acceptance_per_depth(self) -> list[float]:
        """Per depth ``d = 1, 2, ...``: the fraction of steps whose tree reached depth ``d``
        that accepted a token at depth ``d``."""
        return [round(a / r, 4) if r else 0.0 for r, a in self.per_depth]

    def acceptance_per_drafter_depth(self) -> dict[str, list[float]]:
        """Accepted / proposed nodes per drafter and depth (``d = 1, 2, ...``)."""
        return {k: [round(a / p, 4) if p else 0.0 for p, a in rows]
                for k, rows in sorted(self.per_drafter_depth.items())}

    def time_split(self) -> dict[str, float]:
        """Seconds spent drafting, verifying (the prefill included), masking/accepting, and
        elsewhere."""
        other = self.seconds - self.draft_seconds - self.verify_seconds - self.mask_seconds
        return {"draft": round(self.draft_seconds, 4), "verify": round(self.verify_seconds, 4),
                "mask": round(self.mask_seconds, 4), "other": round(max(0.0, other), 4)}

    def pass_ms_by_nodes(self) -> dict[int, list[float]]:
        """``{tree nodes: [passes, median milliseconds]}`` over :attr:`pass_log`."""
        by: dict[int, list[float]] = defaultdict(list)
        for nodes, _, seconds in self.pass_log:
            by[nodes].append(seconds)
        return {q: [len(v), round(1000 * statistics.median(v), 3)] for q, v in sorted(by.items())}

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
            "acceptance_per_depth": self.acceptance_per_depth(),
            "per_drafter_depth": {k: [list(x) for x in v]
                                  for k, v in sorted(self.per_drafter_depth.items())},
            "acceptance_per_drafter_depth": self.acceptance_per_drafter_depth(),
            "time_split": self.time_split(),
            "mean_budget": round(sum(self.budgets) / len(self.budgets), 2) if self.budgets else 0,
            "mean_planned": round(sum(self.planned) / len(self.planned), 2) if self.planned else 0,
            "draft_model_passes": self.draft_model_passes,
            "draft_head": self.draft_head,
            "certain_tokens": self.certain_tokens,
            "memory_pressure_steps": self.memory_pressure_steps,
            "cost_curve": self.cost_curve,
            "max_nodes": self.max_nodes,
            "wide": self.wide,
            "pass_ms_by_nodes": self.pass_ms_by_nodes(),
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
    acceptance: AcceptanceModel | None = None,
    prefix_cache: PrefixCache | None = None,
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
        acceptance: the acceptance statistics to start from and update (per drafter and
            depth, and the model's splits of forced text;
            :class:`~structspec.spec.cost.AcceptanceModel`) — pass one kept across requests
            of a kind so that short requests size their trees and split forced text from
            experience;
            ``None``: a fresh one (the prior, with the model's packaged tokenization
            habits: :mod:`structspec.spec.habits`). Not shared between concurrent decodes.
        prefix_cache: a :class:`~structspec.spec.prefix.PrefixCache` to start the KV cache
            from (the prompt's stored beginning is not prefilled again) and to teach.

    Returns:
        A :class:`~structspec.engine.DecodeOutput` whose ``stats`` is a :class:`SpecStats`.

    Raises:
        GenerationError: ``max_new_tokens`` was reached before the output was complete (the
            error's ``stats`` attribute holds the :class:`SpecStats` of the run), or the
            constraint reached a state with no legal token.
        UnsupportedModelError: speculation is enabled and the model (or the draft model)
            cannot verify trees.
        DraftModelMismatchError: ``config.draft_model`` does not share the target's tokenizer.
        DraftHeadMismatchError: ``config.draft_head`` names a head of another model.
    """
    from structspec.spec.kv_cache import decoding_cache  # (imports transformers)

    config = config or SpecConfig()
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = model.device
    stats = SpecStats(prompt_tokens=len(prompt_ids))
    draws = make_draws(sampling)
    eos = frozenset(vocab.eos_token_ids)
    start = time.perf_counter()

    curve = None
    free = 0  # speculative nodes the device's passes carry for (almost) nothing
    if config.enabled:
        check_tree_support(model)  # refused before its cost curve is measured by tree passes
        probe_tree_support(model)
        if config.cost_model and config.max_nodes != 0:
            curve = (config.cost_curve if config.cost_curve is not None
                     else device_cost_curve(model))
            free = free_nodes(curve)
        # The most the cache holds at once: the prompt, the output, and a pass's tree.
        widest = max(config.budgets(True, free)[0], config.budgets(False, free)[0])
        most = len(prompt_ids) + max_new_tokens + 1 + config.draft_length + widest
        cache = decoding_cache(model, most, tree_cache(model, most))
        check_positions(model, len(prompt_ids), most)
        check_tree_cache(cache)  # the model's side was checked above
    else:
        cache = decoding_cache(model, len(prompt_ids) + max_new_tokens + 1)
    refuse_prefix_cache(model, prefix_cache)
    past_len = prefix_cache.restore(prompt_ids, cache) if prefix_cache is not None else 0
    prefix = list(prompt_ids[past_len:-1])  # prefilled in the first verification pass

    draft_model = None
    if config.enabled and config.draft_model is not None:
        draft_model = _draft_model(config.draft_model, str(device))
        draft_model.check(vocab)
    history = NgramIndex(max(1, config.lookup_max_n))
    history.extend(prompt_ids)
    prompt_bytes = vocab.decode(prompt_ids) if config.enabled else b""
    prompt_text = prompt_bytes.decode("utf-8", errors="replace")  # as vocab.decode_text
    ctx = DraftContext(
        constraint=constraint, vocab=vocab, canon=canonical_tokenizer(tokenizer, vocab),
        history=history, prompt_len=len(prompt_ids),
        literals=request_literals(vocab, prompt_ids, prompt=prompt_text) if config.enabled else [],
        field_literals=field_literals(prompt_text) if config.enabled else {},
        options=config.options, draft_model=draft_model,
        text_index=TextIndex(prompt_bytes) if config.enabled else None,
        sampling=None if draws is None else sampling, draws=draws,
    )
    structured = _structured(constraint, vocab)
    # "auto": the shipped head wherever one matches. The first head cost more than it
    # gained under a grammar (HumanEval code: 2.61x decode without it, 2.41x with it); the
    # retrained one drafts code too (benchmarks/speculative.py --task code, back to back:
    # 4.95 tokens per pass and 2.70-2.73x end to end with it, 4.14 and 2.45-2.59x
    # without) and leaves JSON where it was (12.44 tokens per pass either way).
    head = resolve_head(config.draft_head, model) if config.enabled else None
    norm = final_norm(model) if head is not None else None
    if head is not None and norm is None:
        if config.draft_head in ("auto", True):
            head = None
        else:
            raise UnsupportedModelError("the draft head needs the target's final norm module "
                                        "(model.model.norm); this model has none")
    corpus = resolve_corpus(config.corpus, vocab) if config.enabled else None
    names = _place(tuple(config.drafters), DRAFT_HEAD, head is not None,
                   after=("values", "closers"), default_end=False)
    names = _place(names, CORPUS, corpus is not None, after=("lookup",), default_end=True)
    ctx.draft_head = head
    ctx.corpus = corpus
    stats.draft_head = head.name if head is not None else None
    drafters = make_drafters(names) if config.enabled else []
    max_nodes, max_branches = config.budgets(structured, free)
    stats.cost_curve = curve.as_dict() if curve is not None else None
    stats.wide = max_nodes > config.budgets(structured)[0]  # (an explicit bound: equal)
    stats.max_nodes = max_nodes if config.enabled else 0
    threshold = config.memory_threshold
    min_acceptance = config.min_acceptance
    if curve is not None and not structured:  # free text: shrink only where it stops paying
        min_acceptance = min(min_acceptance, break_even_hit_rate(curve, max_nodes))
    scheduler = Scheduler(max_nodes, max_branches, adaptive=config.adaptive,
                          window=config.window, min_acceptance=min_acceptance,
                          probe_every=config.probe_every, curve=curve,
                          memory_probe=None if threshold is None else lambda: memory_use(device),
                          memory_threshold=threshold or 1.0,
                          acceptance=(acceptance if acceptance is not None or not config.enabled
                                      else fresh_acceptance(model)),
                          min_nodes=free)
    ctx.acceptance = scheduler.acceptance
    gate = DrafterGate.shared(scheduler.acceptance, config.window, config.probe_every,
                              adaptive=config.adaptive)
    gate.begin()
    masks: MaskCache | None = None

    # Logits only where the constraint leaves a choice, from the output layer's input.
    sparse = SparseLogits.of(model, config.sparse_logits)
    if sparse is not None and norm is None:
        norm = sparse.norm
    # The draft head reads the target's last hidden state at each tree node: a hook on the
    # final norm keeps the pass's output (the rows the logits came from).
    # A head that also reads a middle layer (DraftHead.mid_layer): a hook there too.
    mid = (decoder_layer(model, head.mid_layer)
           if head is not None and head.mid_layer is not None else None)
    with captured_outputs(norm) as captured, captured_outputs(mid) as captured_mid:
        root = prompt_ids[-1]
        state: State = constraint.initial
        out: list[int] = []
        complete = False
        certain = config.enabled and config.forced
        while True:
            if certain:  # tokens the constraint leaves no choice about need no pass
                for token in certain_tokens(constraint, state, max_new_tokens - len(out)):
                    state = advance_or_raise(constraint, state, token, vocab, out)
                    prefix.append(root)  # committed, not yet in the cache
                    out.append(token)
                    history.extend([token])
                    root = token
                    stats.certain_tokens += 1
                    if ctx.head_anchor is not None:
                        ctx.head_anchor[1].append(token)
            # The checks plain decoding makes before each forward pass.
            if constraint.is_accepting(state) and constraint.allowed(state).count() <= len(eos):
                complete = True
                break
            if len(out) >= max_new_tokens:
                break
            if constraint.allowed(state).count() == 0:
                raise dead_end(vocab, out)

            t0 = time.perf_counter()
            first = stats.forward_passes == 0
            built, tree, frontier_depth = _draft(ctx, drafters, scheduler, gate, config, root,
                                                 state, eos, remaining=max_new_tokens - len(out),
                                                 first=first, context=past_len + len(prefix))
            t1 = time.perf_counter()
            plan = (None if sparse is None  # (no mask computed here that costs much)
                    else sparse.plan([cheap_allowed(constraint, st) for st in tree.states]))
            tv = time.perf_counter()
            logits = verify_tree(model, cache, tree, past_len, prefix,
                                 rows=None if plan is None else plan.full)  # [q or f, V]
            if not first:
                if device.type == "cuda":  # the pass's own time, not its launch (the walk
                    torch.cuda.synchronize(device)  # below would wait for it anyway)
                stats.pass_log.append((len(tree), past_len, time.perf_counter() - tv))
            hidden = captured[-1][0, -len(tree):] if captured else None  # [q, H]
            hidden_mid = captured_mid[-1][0, -len(tree):] if captured_mid else None  # [q, H]
            captured.clear()
            captured_mid.clear()
            if plan is not None and sparse is not None:
                logits = sparse.assemble(plan, logits, hidden)  # [q, V]
                stats.sparse_rows += len(plan.gathered)
            past_len += len(prefix)
            prefix = []
            stats.forward_passes += 1
            stats.steps += 1
            t2 = time.perf_counter()
            if first:
                stats.prefill_seconds = t2 - start
            if masks is None:
                masks = MaskCache(logits.shape[-1], logits.device)
            acc = walk_tree(tree, logits, constraint, masks, sampling, draws, eos_ids=eos,
                            budget=max_new_tokens - len(out), position=len(out),
                            validation_threshold=config.validation_threshold)
            t3 = time.perf_counter()
            keep_path(cache, past_len, acc.path)
            past_len += len(acc.path)
            if first and prefix_cache is not None:
                prefix_cache.learn(prompt_ids, cache)
            t4 = time.perf_counter()
            stats.draft_seconds += t1 - t0
            stats.verify_seconds += (t2 - t1) + (t4 - t3)
            stats.mask_seconds += t3 - t2
            _record(stats, scheduler, gate, built, tree, acc.path, frontier_depth,
                    None if acc.token is None else int(acc.token))

            accepted = [tree.tokens[i] for i in acc.path[1:]]
            if config.enabled and config.forced:  # how the model tokenized forced text
                for a, b in itertools.pairwise(acc.path):
                    learn_choice(ctx, tree.states[a], tree.tokens[a], tree.tokens[b])
                    learn_closer(ctx, tree.states[a], tree.states[b], tree.tokens[b])
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
            before, state = state, advance_or_raise(constraint, state, token, vocab, out)
            if config.enabled and config.forced:
                learn_closer(ctx, before, state, token)
            out.append(token)
            history.extend([token])
            root = token
            if head is not None and hidden is not None:  # the head starts from the bonus's context
                at = acc.path[-1]
                ctx.head_anchor = (head.start(hidden[at:at + 1], None if hidden_mid is None
                                              else hidden_mid[at:at + 1])[0].clone(), [token])

    complete = complete or constraint.is_accepting(state)
    stats.new_tokens = len(out)
    stats.seconds = time.perf_counter() - start
    stats.budgets = scheduler.history
    stats.planned = scheduler.planned
    stats.memory_pressure_steps = scheduler.pressure_steps
    stats.draft_model_passes = sum(getattr(d, "forward_passes", 0) for d in drafters
                                   if getattr(d, "name", None) == DRAFT_MODEL)
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


def break_even_hit_rate(curve: CostCurve, max_nodes: int, floor: float = 0.1) -> float:
    """The fraction of steps that must accept a draft for a half-size tree to pay for its
    pass: ``t(1 + max_nodes // 2) / t(1) - 1`` (each hit saves at least one pass), at least
    ``floor``. On a CPU where a pass of a few tokens costs what a pass of one does, this is
    far below the default ``min_acceptance`` of 0.6: free text with a learned draft head
    (hits on ~40-60% of steps) should not be shrunk away. Pure."""
    half = 1 + max(1, max_nodes // 2)
    return max(floor, curve(half) / curve(1) - 1.0)


def certain_tokens(constraint: Constraint, state: State, limit: int) -> list[int]:
    """The tokens that follow ``state`` whatever the model says: while the constraint allows
    exactly one token and does not accept (so EOS is not an option either), that token; at
    most ``limit``. Plain decoding would spend a forward pass on each and could only choose
    it (greedy, sampling and typical acceptance alike), so committing them unverified
    changes no output. Pure."""
    out: list[int] = []
    while len(out) < limit and not constraint.is_accepting(state):
        mask = constraint.allowed(state)
        if mask.count() != 1:
            break
        token = int(mask.ids()[0])
        nxt = constraint.advance(state, token)
        if nxt is None:
            break
        out.append(token)
        state = nxt
    return out


def _draft(
    ctx: DraftContext, drafters: list[Any], scheduler: Scheduler, gate: DrafterGate,
    config: SpecConfig,
    root: int, state: State, eos: frozenset[int], *, remaining: int, first: bool = False,
    context: int = 0,
) -> tuple[DraftTree, DraftTree, int]:
    """This step's tree as built and as planned (what is verified, priced for a pass on
    ``context`` cached tokens), and the depth of its frontier (the end of the forced
    chain)."""
    if not config.enabled:
        builder = TreeBuilder(ctx.constraint, root, state, max_depth=0, max_nodes=0,
                              max_branches=0, eos_ids=eos)
        tree = builder.freeze()
        return tree, tree, 0
    budget = scheduler.budget()
    builder = TreeBuilder(ctx.constraint, root, state,
                          max_depth=min(config.draft_length, remaining),
                          max_nodes=budget.nodes, max_branches=budget.branches, eos_ids=eos)
    # The drafter that hits most drafts first: where budgets are small, a drafter that
    # never hits here (the request's literals in code) would otherwise take the branches of
    # one that does (lookup). Unseen drafters keep the configured order (equal priors).
    rate = scheduler.acceptance.rate
    ordered = sorted(drafters, key=lambda d: -rate(d.name, 1)) if budget.nodes else []
    frontier = build_tree(ctx, builder, ordered, forced=config.forced,
                          active=None if budget.probe else gate.active)
    frontier_depth = builder.depths[frontier]
    built = builder.freeze()
    return (built, scheduler.plan(built, frontier_depth, keep_all=first, context=context),
            frontier_depth)


def _record(stats: SpecStats, scheduler: Scheduler, gate: DrafterGate, built: DraftTree,
            tree: DraftTree, path: tuple[int, ...], frontier_depth: int,
            next_token: int | None = None) -> None:
    """Update per-drafter / per-depth stats for the verified ``tree``; tell the scheduler
    (the tree as drafted, and ``next_token``, the model's choice after the path: its
    acceptance statistics learn from the nodes the plan dropped too) and the gate how it
    went (the gate counts a drafter whose nodes the plan dropped as a miss: it cost
    drafting time for nothing)."""
    stats.draft_nodes += len(tree) - 1
    stats.accepted_tokens += len(path) - 1
    for i in range(1, len(tree)):
        stats.per_drafter[tree.sources[i]][0] += 1
    for i in path[1:]:
        stats.per_drafter[tree.sources[i]][1] += 1
    on_path = set(path)
    for i in range(1, len(tree)):
        rows = stats.per_drafter_depth.setdefault(tree.sources[i], [])
        d = tree.depths[i]
        while len(rows) < d:
            rows.append([0, 0])
        rows[d - 1][0] += 1
        rows[d - 1][1] += i in on_path
    depth = tree.max_depth
    while len(stats.per_depth) < depth:
        stats.per_depth.append([0, 0])
    for d in range(depth):
        stats.per_depth[d][0] += 1
    for d in range(len(path) - 1):
        stats.per_depth[d][1] += 1
    proposed = {drafter_of(built.sources[i]): False for i in range(1, len(built))
                if built.sources[i] != FORCED}
    for i in path[1:]:
        name = drafter_of(tree.sources[i])
        if name in proposed:
            proposed[name] = True
    gate.record(proposed)
    scheduler.record_tree(tree, path, frontier_depth, built=built, next_token=next_token)


def _place(names: tuple[str, ...], name: str, used: bool, *, after: tuple[str, ...],
           default_end: bool) -> tuple[str, ...]:
    """``names`` with drafter ``name``: dropped when not ``used``; when used and absent,
    inserted after the last of ``after`` present (none present: at the end if
    ``default_end``, else first). Pure."""
    if not used:
        return tuple(n for n in names if n != name)
    if name in names:
        return names
    present = [names.index(n) + 1 for n in after if n in names]
    at = max(present) if present else (len(names) if default_end else 0)
    return (*names[:at], name, *names[at:])


def _structured(constraint: Constraint, vocab: Vocabulary) -> bool:
    """Whether the constraint looks like structured output: at the start it allows at most
    half the vocabulary (free text and prose-like regexes allow nearly all of it)."""
    return constraint.allowed(constraint.initial).count() * 2 <= len(vocab)


_DRAFT_MODELS: dict[tuple[str, str], DraftModel] = {}


def _draft_model(spec: Any, device: str) -> DraftModel:
    """``spec`` as a :class:`DraftModel`; model ids are loaded once per process and device."""
    if not isinstance(spec, str):
        return DraftModel.resolve(spec)  # a DraftModel already (SpecConfig wraps the others)
    key = (spec, device)
    hit = _DRAFT_MODELS.get(key)
    if hit is None:
        hit = _DRAFT_MODELS[key] = DraftModel.resolve(spec, device=device)
    return hit
