"""Cumulative statistics over many requests: what a :class:`~structspec.api.Generator` (or a
service around one) did since it started, with the same measures a single request's
:class:`~structspec.spec.stats.SpecStats` gives — passes, drafted and accepted tokens,
acceptance per drafter and per depth, mean accepted length, the time split — plus what only
exists across attempts: validation failures and failed requests.

Sums are kept, never per-request averages, so the rates are exact over the whole workload
(a long answer weighs more than a short one). Thread-safe: requests finishing on several
threads may add at once.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from structspec.engine import DecodeStats
from structspec.spec.stats import SpecStats, count_pair

# DecodeStats fields that add up across decodes.
_SUMMED = ("prompt_tokens", "new_tokens", "forward_passes", "seconds", "prefill_seconds",
           "setup_seconds", "mask_seconds", "sparse_rows")
# SpecStats fields that add up across speculative decodes (kept apart from the plain ones:
# the time split and the mean accepted length are over speculative decodes only).
_SPEC_SUMMED = ("new_tokens", "seconds", "mask_seconds", "steps", "draft_nodes",
                "accepted_tokens", "draft_seconds", "verify_seconds", "certain_tokens",
                "memory_pressure_steps", "draft_model_passes")


class StatsTotals:
    """Running totals over decodes and requests. See the module docstring.

    A *decode* is one generation attempt (:meth:`add`); a *request* is one call of
    ``Generator.run``, which may take several attempts when a lenient schema's output fails
    validation (:meth:`validation_failed`) and ends done or failed (:meth:`finish`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Start again from zero."""
        with self._lock:
            self.requests = 0
            self.failed_requests = 0
            self.decodes = 0
            self.speculative_decodes = 0
            self.validation_failures = 0
            self.sums: dict[str, float] = dict.fromkeys(_SUMMED, 0)
            self.spec_sums: dict[str, float] = dict.fromkeys(_SPEC_SUMMED, 0)
            self.per_drafter: dict[str, list[int]] = defaultdict(count_pair)
            self.per_depth: list[list[int]] = []

    def add(self, stats: DecodeStats | None) -> None:
        """Count one decode (a successful one, or a failed one's partial stats; ``None``
        counts the decode without figures)."""
        with self._lock:
            self.decodes += 1
            if stats is None:
                return
            for name in _SUMMED:
                self.sums[name] += getattr(stats, name)
            # speculation on (its scheduler set a budget each step), not a SpecStats of a
            # decode with speculation switched off
            if isinstance(stats, SpecStats) and stats.budgets:
                self.speculative_decodes += 1
                for name in _SPEC_SUMMED:
                    self.spec_sums[name] += getattr(stats, name)
                self._count_drafts(stats.per_drafter, stats.per_depth)

    def _count_drafts(self, per_drafter: dict[str, list[int]],
                      per_depth: list[list[int]]) -> None:
        """Add ``[proposed, accepted]`` per drafter and ``[reached, accepted]`` per depth
        (the caller holds the lock)."""
        for source, (proposed, accepted) in per_drafter.items():
            row = self.per_drafter[source]
            row[0] += proposed
            row[1] += accepted
        for d, (reached, accepted) in enumerate(per_depth):
            if d == len(self.per_depth):
                self.per_depth.append([0, 0])
            self.per_depth[d][0] += reached
            self.per_depth[d][1] += accepted

    def validation_failed(self) -> None:
        """Count one output that failed validation (a lenient schema's; retried or not)."""
        with self._lock:
            self.validation_failures += 1

    def finish(self, ok: bool) -> None:
        """Count one request, done (``ok``) or failed."""
        with self._lock:
            self.requests += 1
            self.failed_requests += 0 if ok else 1

    def merge(self, other: StatsTotals) -> None:
        """Add ``other``'s counts to these (another process's totals: a replica's per
        request, :mod:`structspec.replicas`). Mutates ``self`` only."""
        with other._lock:
            counts = (other.requests, other.failed_requests, other.decodes,
                      other.speculative_decodes, other.validation_failures)
            sums, spec_sums = dict(other.sums), dict(other.spec_sums)
            per_drafter = {k: list(v) for k, v in other.per_drafter.items()}
            per_depth = [list(row) for row in other.per_depth]
        with self._lock:
            self.requests += counts[0]
            self.failed_requests += counts[1]
            self.decodes += counts[2]
            self.speculative_decodes += counts[3]
            self.validation_failures += counts[4]
            for name, value in sums.items():
                self.sums[name] += value
            for name, value in spec_sums.items():
                self.spec_sums[name] += value
            self._count_drafts(per_drafter, per_depth)

    def __getstate__(self) -> dict[str, Any]:
        """The counts without the lock (totals travel between processes)."""
        with self._lock:
            state = dict(self.__dict__)
        del state["_lock"]
        state["per_drafter"] = dict(state["per_drafter"])
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.per_drafter = defaultdict(count_pair, state["per_drafter"])
        self._lock = threading.Lock()

    def as_dict(self) -> dict[str, Any]:
        """The totals and the rates derived from them, as a plain dict (for JSON)."""
        with self._lock:
            s = dict(self.sums)
            decode_s = s["seconds"] - s["prefill_seconds"]
            out: dict[str, Any] = {
                "requests": self.requests,
                "failed_requests": self.failed_requests,
                "decodes": self.decodes,
                "validation_failures": self.validation_failures,
                **_rounded(s),
                "tokens_per_pass": _ratio(s["new_tokens"], s["forward_passes"]),
                "tokens_per_second": _ratio(s["new_tokens"], decode_s, 2),
            }
            if self.speculative_decodes:
                p = dict(self.spec_sums)
                other = (p["seconds"] - p["draft_seconds"] - p["verify_seconds"]
                         - p["mask_seconds"])
                out["speculative"] = {
                    "decodes": self.speculative_decodes,
                    **_rounded(p),
                    "acceptance_rate": _ratio(p["accepted_tokens"], p["draft_nodes"]),
                    "mean_accepted_length": _ratio(p["new_tokens"], p["steps"]),
                    "per_drafter": {k: list(v) for k, v in sorted(self.per_drafter.items())},
                    "acceptance_per_drafter": {k: _ratio(a, p) for k, (p, a)
                                               in sorted(self.per_drafter.items())},
                    "acceptance_per_depth": [_ratio(a, r) for r, a in self.per_depth],
                    "time_split": {"draft": round(p["draft_seconds"], 4),
                                   "verify": round(p["verify_seconds"], 4),
                                   "mask": round(p["mask_seconds"], 4),
                                   "other": round(max(0.0, other), 4)},
                }
            return out


def _rounded(sums: dict[str, float]) -> dict[str, float]:
    """``sums`` with the seconds rounded for output (counts stay integers)."""
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in sums.items()}


def _ratio(num: float, den: float, digits: int = 4) -> float:
    return round(num / den, digits) if den else 0.0
