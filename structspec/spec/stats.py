"""What speculation did in one request: :class:`SpecStats`.

Passes, drafted and accepted tokens, acceptance per drafter and per depth, the budgets the
scheduler set and the nodes the cost plan kept, the time split, and each pass's cost inside
the decode loop — data, shown by ``structspec generate --stats`` and summed over requests by
:class:`~structspec.spec.totals.StatsTotals`.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from structspec.engine import DecodeStats


def count_pair() -> list[int]:
    """A ``[proposed, accepted]`` count pair (a module function: the stats pickle)."""
    return [0, 0]


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
            nothing else (see :func:`~structspec.spec.decode.certain_tokens`); the next pass
            computes their KV.
        memory_pressure_steps: steps whose budget was halved under memory pressure.
        cost_curve: the device cost curve the plan used (ms and relative), if any.
        wide: the curve carried more nodes for free than
            :data:`~structspec.spec.config.AUTO_BUDGETS` bounds a tree by, so an unset
            ``max_nodes`` was widened to them.
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
    per_drafter: dict[str, list[int]] = field(default_factory=lambda: defaultdict(count_pair))
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
