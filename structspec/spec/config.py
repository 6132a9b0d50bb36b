"""How to speculate: :class:`SpecConfig`, the drafters used by default and the tree bounds.

A frozen record, validated when made (a bad value from a YAML file or a CLI flag raises a
``ValueError`` naming the field), read by :func:`~structspec.spec.decode.speculative_decode`;
``structspec generate --config FILE`` and ``Generator.run(speculative=...)`` build one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structspec.spec.corpus import TokenCorpus
from structspec.spec.cost import CostCurve
from structspec.spec.counting import SOURCE as COUNTING
from structspec.spec.draft_context import FORCED
from structspec.spec.draft_head import OPTION_DEFAULTS as HEAD_DEFAULTS
from structspec.spec.draft_head import DraftHead
from structspec.spec.draft_model import SOURCE as DRAFT_MODEL
from structspec.spec.draft_model import DraftModel
from structspec.spec.drafters import DRAFTERS
from structspec.spec.text_lookup import SOURCE as TEXT_LOOKUP

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
            that is lower (:func:`~structspec.spec.decode.break_even_hit_rate`).
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
