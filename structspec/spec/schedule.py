"""Adaptive speculation budget: shrink the speculative part of the tree when it stops paying.

The forced chain is never scheduled (forced tokens are accepted all but always). The
*speculative* part — lookup, values, alternatives, top-k branches — has a node budget that
moves along levels ``max_nodes, max_nodes/2, ..., 2, 0``. Over a window of speculative steps
the scheduler measures the hit rate: the fraction of steps where at least one speculative
token was accepted. Below ``min_acceptance`` it steps down a level (down to none), at or
above it steps back up. Below the top level, level none included, every ``probe_every``
steps one tree is drafted with the full budget and every drafter the gate had paused
(``Budget.probe``), so a change of regime (prose turning into copying) is noticed: where that
tree is accepted beyond what the level could hold (at none: the smallest level), the top
level is back; at none, two probes that hit step one level up. (At none the probe once had
the smallest budget, which the drafter ranked first took: a HumanEval function repeating a
``print`` line to 160 tokens drafted nothing for 80 passes, its lookup never tried; 131
passes, 64 with the full probe — session 51.) Before the probe below the top level, an
output that started repeating itself had been left with one or two nodes and a lookup paused
for its early misses (a BFCL call repeating ``_2013`` to its token limit: 165 passes before,
69-71 with the probe; session 36).

That level is an upper bound. Within it, when a device cost curve is known, :meth:`Scheduler.plan`
keeps the part of the built tree that maximizes expected tokens per second
(:mod:`structspec.spec.cost`): the running acceptance per drafter and depth against the
measured pass time per tree size. Under memory pressure (memory use above
``memory_threshold``, probed every ``memory_every`` steps) the bound is halved.

Not thread-safe; one per decode.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from structspec.spec.cost import (
    AcceptanceModel,
    CostCurve,
    node_floor,
    plan_first_tree,
    plan_tree,
    speculative_depths,
)
from structspec.spec.tree import DraftTree

#: Contexts are priced in steps of this many cached tokens (:meth:`Scheduler.plan`).
CONTEXT_STEP = 32


@dataclass(frozen=True)
class Budget:
    """Limits for the speculative part of one step's tree (``probe``: the full budget tried
    below the top level, every drafter active)."""

    nodes: int
    branches: int
    probe: bool = False


class Scheduler:
    """See the module docstring.

    Args:
        max_nodes: speculative node budget at the top level.
        max_branches: branch budget at the top level (scaled with the node budget).
        adaptive: ``False`` keeps the top level for ever.
        window: speculative steps per decision.
        min_acceptance: hit rate below which the budget shrinks.
        probe_every: below the top level (level none included), draft one tree with the
            full budget and every drafter every this many steps.
        curve: the device's pass time vs tree nodes; ``None`` keeps every built node.
        acceptance: running acceptance statistics (a fresh :class:`AcceptanceModel` if
            ``None``).
        memory_probe: returns the fraction of memory in use (or ``None``); ``None`` never
            probes.
        memory_threshold: above this fraction of memory in use, budgets are halved.
        memory_every: probe memory every this many steps.
        min_nodes: the lowest level instead of none: a tree this small costs about what a
            pass of the root alone costs on the device (:func:`~structspec.spec.cost.free_nodes`),
            so shrinking below it saves nothing and loses the drafts that do hit (code that
            repeats a line of its own docstring after many misses).
    """

    def __init__(self, max_nodes: int, max_branches: int, *, adaptive: bool = True,
                 window: int = 8, min_acceptance: float = 0.6, probe_every: int = 16,
                 curve: CostCurve | None = None, acceptance: AcceptanceModel | None = None,
                 memory_probe: Callable[[], float | None] | None = None,
                 memory_threshold: float = 0.9, memory_every: int = 8,
                 min_nodes: int = 0) -> None:
        levels = []
        n = max_nodes
        floor = max(0, min(min_nodes, max_nodes))
        while n >= 2 and n > floor:
            levels.append(n)
            n //= 2
        levels.append(floor)
        self.levels = levels
        self.max_nodes = max_nodes
        self.max_branches = max_branches
        self.adaptive = adaptive
        self.window = max(1, window)
        self.min_acceptance = min_acceptance
        self.probe_every = max(1, probe_every)
        self.level = 0
        self._hits: deque[bool] = deque(maxlen=self.window)
        self._steps_at_none = 0
        self._steps_below = 0
        self._probe_level: int | None = None
        self.curve = curve
        self._floor = node_floor(curve) if curve is not None else 0.0
        self._at: dict[int, tuple[CostCurve, float]] = {}
        self.acceptance = acceptance if acceptance is not None else AcceptanceModel()
        self.memory_probe = memory_probe
        self.memory_threshold = memory_threshold
        self.memory_every = max(1, memory_every)
        self.under_pressure = False
        self.pressure_steps = 0
        self._steps = 0
        self.history: list[int] = []  # node budget (upper bound) per step, for stats
        self.planned: list[int] = []  # speculative nodes kept by the cost plan per step

    def budget(self) -> Budget:
        """The speculative budget (an upper bound) for the next step."""
        if self.memory_probe is not None and self._steps % self.memory_every == 0:
            use = self.memory_probe()
            self.under_pressure = use is not None and use > self.memory_threshold
        self._steps += 1
        nodes = self.levels[self.level]
        probe = False
        self._probe_level = None  # a probe whose step drafted nothing is not reported
        if nodes == 0 and self.adaptive:
            self._steps_at_none += 1
            if self._steps_at_none % self.probe_every == 0 and len(self.levels) > 1:
                # The full probe, as below the top level: the smallest budget went to the
                # drafter ranked first (the draft head), and a lookup paused for early
                # misses was never tried again while the output repeated itself.
                nodes, probe = self.levels[0], True
                self._probe_level = self.levels[-2]
        elif self.adaptive and self.level > 0:
            self._steps_below += 1
            if self._steps_below % self.probe_every == 0:
                nodes, probe = self.levels[0], True
                self._probe_level = self.levels[self.level]
        branches = 0
        if nodes:
            branches = max(1, round(self.max_branches * nodes / max(1, self.max_nodes)))
            if self.under_pressure:  # fewer candidates: smaller passes, smaller caches
                nodes, branches = max(1, nodes // 2), max(1, branches // 2)
                self.pressure_steps += 1
        self.history.append(nodes)
        return Budget(nodes, branches, probe)

    def plan(self, tree: DraftTree, frontier_depth: int, *, keep_all: bool = False,
             first: bool = False, context: int = 0) -> DraftTree:
        """The part of ``tree`` worth verifying: without a cost curve (or with ``keep_all``),
        all of it; with one, the speculative nodes that maximize expected tokens per second
        on ``context`` cached tokens (:meth:`CostCurve.at`), or for a request's ``first``
        tree, which rides on the prompt's prefill, those whose rows pay for themselves
        (:func:`plan_first_tree`). The root and the forced chain are always kept. Pure apart
        from recording the choice."""
        depths = speculative_depths(tree, frontier_depth)
        speculative = sum(1 for d in depths if d > 0)
        if self.curve is None or speculative == 0 or keep_all:
            self.planned.append(speculative)
            return tree
        curve, floor = self._curve_at(context)
        probs = self.acceptance.node_probabilities(tree, frontier_depth, first=first)
        plan = (plan_first_tree(tree, frontier_depth, probs, curve) if first
                else plan_tree(tree, frontier_depth, probs, curve, floor=floor))
        self.planned.append(plan.speculative_nodes)
        if plan.speculative_nodes == speculative:
            return tree
        base = [i for i in range(len(tree)) if depths[i] == 0]
        return tree.subtree([*base, *plan.keep])

    def _curve_at(self, context: int) -> tuple[CostCurve, float]:
        """The curve and node floor for ``context`` cached tokens, rounded up to a multiple
        of :data:`CONTEXT_STEP` (memoized: a decode's context grows a few tokens a step)."""
        assert self.curve is not None
        key = -(-max(0, context) // CONTEXT_STEP) * CONTEXT_STEP
        hit = self._at.get(key)
        if hit is None:
            curve = self.curve.at(key)
            hit = self._at[key] = (curve, node_floor(curve) if curve is not self.curve
                                   else self._floor)
        return hit

    def record_tree(self, tree: DraftTree, path: tuple[int, ...], frontier_depth: int, *,
                    built: DraftTree | None = None, next_token: int | None = None,
                    first: bool = False) -> None:
        """Report one verified tree and its accepted path (root first): feeds the acceptance
        statistics the plan uses, and the hit rate. ``built``: the tree as drafted, before
        :meth:`plan` dropped nodes, and ``next_token`` the model's choice after the path:
        the acceptance statistics then learn from the dropped nodes too
        (:meth:`AcceptanceModel.record`); ``first``: the request's first tree, which also
        teaches :meth:`AcceptanceModel.start_rate`."""
        drafted, drafted_path = ((tree, path) if built is None or built is tree
                                 else (built, _same_path(built, tree, path)))
        self.acceptance.record(drafted, drafted_path, frontier_depth, next_token)
        if first:
            self.acceptance.record_start(drafted, drafted_path, frontier_depth, next_token)
        depths = speculative_depths(tree, frontier_depth)
        self.record(sum(1 for d in depths if d > 0), sum(1 for i in path if depths[i] > 0))

    def record(self, offered: int, accepted: int) -> None:
        """Report one step: ``offered`` speculative nodes drafted, ``accepted`` of them
        accepted. Steps without speculative nodes are ignored."""
        if not self.adaptive or offered <= 0:
            return
        probed, self._probe_level = self._probe_level, None
        if probed is not None and accepted > probed:  # the full budget paid: back to it
            self.level = 0
            self._hits.clear()
            return
        self._hits.append(accepted > 0)
        at_none = self.level == len(self.levels) - 1
        if len(self._hits) < (min(2, self.window) if at_none else self.window):
            return
        rate = sum(self._hits) / len(self._hits)
        if rate < self.min_acceptance and self.level < len(self.levels) - 1:
            self.level += 1
        elif rate >= self.min_acceptance and self.level > 0:
            self.level -= 1
        else:
            return
        self._hits.clear()
        self._steps_at_none = 0


class DrafterGate:
    """Per-drafter on/off switch: a drafter none of whose last ``window`` proposals got a
    token accepted sits out ``pause`` steps, then is tried again; each further window
    without a hit doubles the pause (up to ``max_pause``), and a hit resets it — and ends a
    pause in progress (a paused drafter drafts in the scheduler's probes). (Free text
    gives the ``values`` and ``closers`` drafters nothing to do; JSON gives ``lookup``
    little: each stops costing nodes and drafting time. With a fixed pause such a drafter
    still drafted a third of the steps of a long answer.)

    A gate can outlive its decode where the decodes share an :class:`AcceptanceModel`
    (:meth:`shared`; call :meth:`begin` at each request's start). Each request then starts
    afresh, as with a gate of its own — except drafters that proposed in ``carry`` steps in
    a row, across requests, without a hit: those start it paused (``pause << 2`` steps, then
    probe as usual). In code ``values`` and ``closers`` hit ~nothing (1 of ~270 nodes over
    20 held-out functions) yet drafted the first ``window`` steps of every ~17-step request:
    ~0.35 ms a pass. Carrying every pause across requests instead cost JSON 9% more passes
    (``values`` and ``lookup`` hit there in bursts, each request's first steps the likeliest).

    Not thread-safe; one per decode, or per shared acceptance model (copied per request).
    """

    def __init__(self, window: int = 8, pause: int = 16, adaptive: bool = True,
                 max_pause: int = 256, carry: int | None = None) -> None:
        self.window, self.pause, self.adaptive = self._settings(window, pause, adaptive)
        self.max_pause = max(self.pause, max_pause)
        self.carry = 4 * self.window if carry is None else max(1, carry)
        self._hits: dict[str, deque[bool]] = {}
        self._paused_until: dict[str, int] = {}
        self._strikes: dict[str, int] = {}
        self._since_hit: dict[str, int] = {}  # steps proposed in a row without a hit
        self.step = 0

    @classmethod
    def shared(cls, acceptance: AcceptanceModel, window: int = 8, pause: int = 16,
               adaptive: bool = True) -> DrafterGate:
        """The gate ``acceptance`` carries (one with these settings; a new one, which it then
        carries, where it has none or one with other settings)."""
        gate = acceptance.gate
        if not (isinstance(gate, cls)
                and gate.settings == cls._settings(window, pause, adaptive)):
            gate = acceptance.gate = cls(window, pause, adaptive)
        return gate

    @staticmethod
    def _settings(window: int, pause: int, adaptive: bool) -> tuple[int, int, bool]:
        """``(window, pause, adaptive)`` as a gate made with them runs them."""
        return max(1, window), max(0, pause), adaptive

    @property
    def settings(self) -> tuple[int, int, bool]:
        """``(window, pause, adaptive)`` as in effect."""
        return self.window, self.pause, self.adaptive

    def begin(self) -> None:
        """A request starts: every drafter afresh (an empty window, no pause), except those
        that proposed in :attr:`carry` steps in a row without a hit, which start it paused
        (their pauses keep doubling)."""
        for name in set(self._hits) | set(self._paused_until):
            if self._since_hit.get(name, 0) >= self.carry:
                until = self.step + min(self.max_pause, self.pause << 2)
                self._paused_until[name] = max(self._paused_until.get(name, -1), until)
            else:
                self._hits.pop(name, None)
                self._paused_until.pop(name, None)
                self._strikes.pop(name, None)

    def active(self, name: str) -> bool:
        """Whether ``name`` may draft in the current step."""
        return not self.adaptive or self._paused_until.get(name, -1) <= self.step

    def record(self, proposed: dict[str, bool]) -> None:
        """End of a step: ``{drafter: whether any of its nodes was accepted}`` for the
        drafters that proposed nodes."""
        self.step += 1
        if not self.adaptive:
            return
        for name, hit in proposed.items():
            hits = self._hits.setdefault(name, deque(maxlen=self.window))
            hits.append(hit)
            self._since_hit[name] = 0 if hit else self._since_hit.get(name, 0) + 1
            if hit:
                self._strikes[name] = 0
                self._paused_until.pop(name, None)
            elif len(hits) == self.window and not any(hits):
                strikes = self._strikes.get(name, 0)
                self._strikes[name] = strikes + 1
                self._paused_until[name] = self.step + min(self.max_pause,
                                                           self.pause << min(strikes, 16))
                hits.clear()


def _same_path(built: DraftTree, tree: DraftTree, path: Sequence[int]) -> tuple[int, ...]:
    """``path`` (nodes of ``tree``, a subtree of ``built``) as nodes of ``built``: the same
    tokens from the root (a node's children hold distinct tokens). Pure.

    Raises:
        ValueError: ``tree`` is not a subtree of ``built`` along ``path``."""
    node = 0
    out = [0]
    for i in path[1:]:
        token = tree.tokens[i]
        match = [c for c in built.children[node] if built.tokens[c] == token]
        if not match:
            raise ValueError(f"the verified tree's path leaves the drafted tree at token {token}")
        node = match[0]
        out.append(node)
    return tuple(out)
