"""Size each step's draft tree by expected tokens per second: a measured cost curve of the
device against the running acceptance of each drafter at each depth.

- :class:`CostCurve`: seconds of one verification pass vs the number of tree nodes, measured
  once per model and device at start-up (:func:`device_cost_curve`, cached in-process and
  on disk; a few rounds of passes on a short and on a long prefix, ~2-3 s on the default
  model on CPU) or injected; what each cached token adds is part of it, so a plan is priced
  for the request's context.
- :class:`AcceptanceModel`: for every drafter and depth below the frontier (the end of the
  forced chain), and for the forced chain, the running rate at which a node is accepted
  *given that its parent was*; exponentially decayed counts with a prior that falls back on
  the depth above, so a few steps suffice.
- :func:`plan_tree`: estimates each node's probability of being accepted (the product of
  the conditional rates along its path), and keeps the ``k`` most likely nodes — an
  ancestor-closed set — for the ``k`` that maximizes
  ``(expected tokens) / cost(pass of that size)``, where no node is priced below a
  floor (:func:`node_floor`: a measured curve's flat stretches would make any guess look
  free). That ``k`` is the step's node budget. Pruning never affects what is generated,
  only how fast (acceptance stays lossless for any tree of legal nodes).
- :func:`memory_use`: the fraction of device (CUDA) or system memory in use, for the
  scheduler's memory-pressure rule.

Deterministic given the curve and the history of the decode (no timing is read during a
decode), so a decode is reproducible within a process.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from structspec.hf_compat import cache_kwargs
from structspec.spec.tree import DraftTree, chain
from structspec.spec.verify import rollback, verify_tree

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32)
FORCED = "forced"


@dataclass(frozen=True)
class CostCurve:
    """Seconds of one verification pass of ``q`` tree nodes, measured at ``sizes``.

    Piecewise linear between measured sizes; flat below the first; extended with the last
    segment's slope above the last. Immutable and thread-safe.

    A pass also costs more the more tokens it attends to: the times are for passes on
    ``context`` cached tokens, and ``per_token`` — ``(a, b)``, measured at a second,
    longer context (:func:`measure_cost_curve`) — says what each further cached token adds
    to a pass of ``q`` nodes: ``a + b * q`` seconds (per pass: the cache's copy and the
    per-layer work on it; per node: its attention). :meth:`at` gives the curve for another
    context. On this project's CPU (default model, one thread), 16 nodes cost 1.45x one
    node on 32 cached tokens and 1.7-1.8x on 512: a curve measured on a short prefix alone
    made trees on long prompts (the BFCL calls' ~400 tokens) too large.
    """

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    context: int = 0
    per_token: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.seconds):
            raise ValueError("a cost curve needs one time per size, at least one")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ValueError(f"sizes must be ascending, got {self.sizes}")
        if any(s <= 0 for s in self.seconds):
            raise ValueError("pass times must be positive")
        if self.context < 0 or len(self.per_token) != 2 or min(self.per_token) < 0:
            raise ValueError(f"context must be >= 0 and per_token two non-negative rates, got "
                             f"{self.context!r}, {self.per_token!r}")

    @classmethod
    def from_relative(cls, relative: dict[int, float], t1: float = 1.0) -> CostCurve:
        """A curve from times relative to a one-node pass (``{1: 1.0, 2: 1.15, ...}``)."""
        sizes = tuple(sorted(relative))
        return cls(sizes, tuple(t1 * relative[q] for q in sizes))

    def __call__(self, q: int | float) -> float:
        """Estimated seconds for a pass of ``q`` nodes."""
        s, t = self.sizes, self.seconds
        if q <= s[0] or len(s) == 1:
            return t[0] if q <= s[0] else t[0] * q / s[0]
        i = bisect.bisect_left(s, q)
        if i >= len(s):
            i = len(s) - 1
        a, b = s[i - 1], s[i]
        return t[i - 1] + (t[i] - t[i - 1]) * (q - a) / (b - a)

    def at(self, context: int) -> CostCurve:
        """This curve for passes on ``context`` cached tokens (itself where it has no
        per-token rates or was measured there). Shorter contexts than the measured one get
        the measured times: what the rates would take off is within the noise. Pure."""
        a, b = self.per_token
        extra = context - self.context
        if extra <= 0 or (a == 0 and b == 0):
            return self
        return replace(self, seconds=tuple(t + extra * (a + b * q)
                                           for q, t in zip(self.sizes, self.seconds,
                                                           strict=True)), context=context)

    def relative(self) -> dict[int, float]:
        """``{q: time(q) / time(1)}`` at the measured sizes."""
        t1 = self(1)
        return {q: round(t / t1, 3) for q, t in zip(self.sizes, self.seconds, strict=True)}

    def as_dict(self) -> dict[str, Any]:
        """For JSON output: milliseconds and relative costs per size."""
        out: dict[str, Any] = {
            "ms": {q: round(1000 * t, 3) for q, t in zip(self.sizes, self.seconds, strict=True)},
            "relative": self.relative()}
        if self.per_token != (0.0, 0.0):
            out.update(context=self.context,
                       us_per_cached_token={"pass": round(1e6 * self.per_token[0], 4),
                                            "node": round(1e6 * self.per_token[1], 4)})
        return out


def free_nodes(curve: CostCurve, tolerance: float = 0.05) -> int:
    """Speculative nodes a pass can carry at (almost) no cost: the largest ``q - 1`` among
    the curve's measured sizes ``q`` whose pass costs at most ``1 + tolerance`` times a
    pass of the root alone (on a CPU with packed linears, ~3 nodes; where a pass of two
    already costs more, ``0``). Pure."""
    t1 = curve(1)
    free = [q for q in curve.sizes if curve(q) <= t1 * (1 + tolerance)]
    return max(free, default=1) - 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def curve_sizes(steps: Sequence[tuple[int, int]] | None, top: int = 32) -> tuple[int, ...]:
    """The pass sizes to measure a cost curve at: :data:`DEFAULT_SIZES`, and where the packed
    kernel's cost is a staircase (:func:`~structspec.spec.fastlinear.cost_steps`: ``(b,
    last)`` per step) both ends of each flat stretch and the first size past it (``b, last,
    last + 1``), and 24. The curve interpolates linearly between measured sizes, and across
    a step it would price a pass of ``last + 1`` nodes at a fraction of the block it adds.
    On the default model (1 thread, blocks of 6) 7 nodes cost 1.31x one node where 6 cost
    1.12x, before the kernel ran 6+1 rows as one block (session 15); in a replay of the
    benchmark's tasks under such a curve, planning with these sizes instead of the default
    ones made modeled decoding 4% faster on 20 HumanEval tasks and 6% on 30 BFCL calls
    (``docs/performance.md``, session 15). Pure."""
    sizes = set(DEFAULT_SIZES)
    if steps:
        for b, last in steps:
            sizes.update((b, last, last + 1))
        sizes.add(24)
    return tuple(sorted(q for q in sizes if q <= top))


@torch.inference_mode()
def measure_cost_curve(model: Any, *, sizes: Sequence[int] | None = None,
                       prefix_len: int = 32, long_prefix: int | None = 384,
                       repeats: int = 2, max_repeats: int = 6,
                       budget_seconds: float = 3.0) -> CostCurve:
    """Time verification passes of ``q`` nodes (a chain) on a ``prefix_len``-token cache,
    at ``sizes`` (``None``: :func:`curve_sizes` for the steps of ``model``'s kernel), and on
    a ``long_prefix``-token cache at :data:`DEFAULT_SIZES` (``None``: not; clipped to the
    model's positions), which gives the curve's per-token rates (:class:`CostCurve`).

    A warm-up round (one node, two — the tree-mask path — and the largest size, on each
    cache; the first passes of a process ran slower), then rounds over all sizes:
    at least ``repeats``, more while the whole measurement stays within ``budget_seconds``
    (at most ``max_repeats``). What the plan reads is the curve's shape, so each size's
    cost is its time relative to the mean of the short 1-node passes timed just before and
    after it (passes moments apart share the machine's conditions), the median over rounds,
    times the median 1-node pass: on a shared CPU the fastest time per size, taken
    separately, mixed the luck of different rounds (16 nodes at 1.66-1.96x one node over
    four measurements on the default model, 1.84-1.86x by the median of ratios), and one
    1-node pass per round as every size's yardstick let one lucky or stalled pass move a
    whole round (8 nodes at 1.00-1.51x one node over six measurements; 1.23-1.39x
    bracketed). No size costs less than one node, nor more than a larger size. The
    per-token rates ``(a, b)`` are the least-squares line
    ``a + b * q`` (both non-negative) through the long-minus-short differences, per cached
    token. Token ids are arbitrary (cost does not depend on them). Does not change
    ``model``.
    """
    from transformers import DynamicCache

    from structspec.spec.fastlinear import cost_steps

    if sizes is None:
        sizes = curve_sizes(cost_steps(model))
    device = model.device
    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 1000) or 1000)
    positions = int(getattr(config, "max_position_embeddings", 0) or 0)
    long_sizes = tuple(q for q in DEFAULT_SIZES if q <= max(sizes)) or tuple(sizes)
    if long_prefix is not None and positions:
        long_prefix = min(long_prefix, positions - max(sizes) - 1)
    if long_prefix is not None and long_prefix < 2 * prefix_len:
        long_prefix = None  # too close to the short prefix to tell a rate from noise
    contexts = [prefix_len] if long_prefix is None else [prefix_len, long_prefix]
    ids = [(17 + 31 * i) % vocab for i in range(max(contexts) + max(sizes))]
    caches = {}
    for ctx in list(contexts):
        caches[ctx] = DynamicCache()  # full layers, as tree passes have (verify.tree_cache)
        try:
            model(input_ids=torch.tensor([ids[:ctx]], device=device),
                  **cache_kwargs(model, caches[ctx]),
                  use_cache=True, logits_to_keep=1)
        except (RuntimeError, IndexError, ValueError):
            if ctx == prefix_len:
                raise
            # A model whose positions its config does not name: no second context, and
            # the curve prices every context alike, as before it had one.
            del caches[ctx]
            contexts.remove(ctx)
            long_prefix = None
    first = min(sizes)

    def timed(ctx: int, q: int) -> float:
        tree: DraftTree = chain(ids[ctx:ctx + q], [None] * q)
        _sync(device)
        t0 = time.perf_counter()
        verify_tree(model, caches[ctx], tree, ctx)
        _sync(device)
        seconds = time.perf_counter() - t0
        rollback(caches[ctx], ctx)
        return seconds

    # Per round: each size's time over the mean of the two short one-node passes just
    # before and after it (why: the docstring).
    rounds: list[dict[tuple[int, int], float]] = []
    ones: list[float] = []
    start = time.perf_counter()
    round_ = 0
    while True:
        ratios: dict[tuple[int, int], float] = {}
        if round_ == 0:
            for ctx in contexts:
                for q in (1, 2, max(sizes)):
                    timed(ctx, q)
        else:
            before = timed(prefix_len, first)
            ones.append(before)
            for ctx in contexts:
                for q in (sizes if ctx == prefix_len else long_sizes):
                    if ctx == prefix_len and q == first:
                        continue
                    seconds = timed(ctx, q)
                    after = timed(prefix_len, first)
                    ones.append(after)
                    ratios[ctx, q] = 2 * seconds / (before + after)
                    before = after
            ratios[prefix_len, first] = 1.0
            rounds.append(ratios)
        round_ += 1
        spent = time.perf_counter() - start
        if round_ > repeats and (round_ > max_repeats
                                 or spent * (round_ + 1) / round_ > budget_seconds):
            break
    base = statistics.median(ones)

    def median_time(ctx: int, q: int) -> float:
        return base * statistics.median(r[ctx, q] for r in rounds)

    raw = [median_time(prefix_len, q) for q in sizes]
    times = [max(base, t) for t in raw]
    # Fewer nodes never cost more: an outlier is capped by the larger sizes.
    for i in range(len(times) - 2, -1, -1):
        times[i] = min(times[i], times[i + 1])
    rates = (0.0, 0.0)
    if long_prefix is not None:
        short = dict(zip(sizes, raw, strict=True))
        points = [(q, (median_time(long_prefix, q) - short[q]) / (long_prefix - prefix_len))
                  for q in long_sizes if q in short]
        rates = _line_fit(points)
    return CostCurve(tuple(sizes), tuple(times), context=prefix_len if long_prefix else 0,
                     per_token=rates)


def _line_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)``, both non-negative, minimizing the squared error of ``a + b * x`` over
    ``points`` ``(x, y)``. Pure."""
    if not points:
        return 0.0, 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else 0.0
    a = my - b * mx
    if b < 0:  # no growth with the size: a constant
        return max(0.0, my), 0.0
    if a < 0:  # through the origin
        sx2 = sum(x * x for x, _ in points)
        return 0.0, max(0.0, sum(x * y for x, y in points) / sx2) if sx2 > 0 else 0.0
    return a, b


_CURVES: weakref.WeakKeyDictionary[Any, dict[tuple, CostCurve]] = weakref.WeakKeyDictionary()


def device_cost_curve(model: Any) -> CostCurve:
    """The cost curve of ``model`` on its device, measured on first use and cached for the
    life of the model object (keyed by device, dtype, the kernel of its packed linears and
    whether they have exactly quantized panels, its attention implementation, the number
    of torch threads, and whether its integer layers run on AMX tiles and which of their
    passes run one panel at a time)."""
    from structspec.spec.fastlinear import int8_amx, one_panel_rows, packed_kernel, quantized_count

    kernel = packed_kernel(model)
    key = (str(model.device), str(getattr(model, "dtype", "")), kernel,
           quantized_count(model) > 0,
           getattr(getattr(model, "config", None), "_attn_implementation", None),
           torch.get_num_threads(), kernel == "panel_int8" and int8_amx(),
           kernel == "panel_int8" and one_panel_rows(),
           getattr(model, "_structspec_shard", None))  # a tensor-parallel share: its own curve
    per_model = _CURVES.setdefault(model, {})
    curve = per_model.get(key)
    if curve is None:
        disk_key = _disk_key(model, key)
        curve = _load_curve(disk_key)
        if curve is None:
            curve = measure_cost_curve(model)
            _store_curve(disk_key, curve)
        per_model[key] = curve
    return curve


#: Bumped when :func:`measure_cost_curve` measures differently: curves cached on disk by an
#: older method are measured again. 2: medians of per-round ratios (session 14); 3: sizes
#: either side of the kernel's row blocks (:func:`curve_sizes`, session 15); 4: and 8, 16;
#: 5: both ends of each flat stretch of the kernel's cost (session 16); 6: and the per-token
#: rates from a second, longer context (session 24); 7: the AVX2 integer kernels' half panels
#: from 2 rows (session 28: passes of 2-3 nodes got cheaper, curves measured before misprice
#: them).
CURVE_METHOD = 7

#: A measured curve is reused from disk for this long (a new process, e.g. each CLI call,
#: then skips the measurement, ~2-3 s on this CPU); after that it is measured again.
CURVE_MAX_AGE_S = 7 * 24 * 3600


def _curve_file() -> Any:
    from structspec.automata.cache import default_disk_directory

    directory = default_disk_directory()  # None: caches switched off by the environment
    return None if directory is None else directory.parent / "cost_curves.json"


def _disk_key(model: Any, key: tuple) -> str:
    config = getattr(model, "config", None)
    shape = {k: getattr(config, k, None) for k in (
        "_name_or_path", "model_type", "hidden_size", "intermediate_size",
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")}
    from structspec.spec.fastlinear import KERNEL_REVISION, avx512

    return repr((sorted(shape.items()), key, torch.__version__, os.cpu_count(),
                 KERNEL_REVISION, avx512(), CURVE_METHOD))


def _load_curve(disk_key: str) -> CostCurve | None:
    path = _curve_file()
    try:
        entry = json.loads(path.read_text())[disk_key] if path is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if entry is None or time.time() - float(entry.get("at", 0)) > CURVE_MAX_AGE_S:
        return None
    try:
        return CostCurve(tuple(entry["sizes"]), tuple(entry["seconds"]),
                         context=int(entry.get("context", 0)),
                         per_token=tuple(entry.get("per_token", (0.0, 0.0))))
    except (KeyError, TypeError, ValueError):
        return None


def _store_curve(disk_key: str, curve: CostCurve) -> None:
    path = _curve_file()
    if path is None:
        return
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
        data[disk_key] = {"sizes": list(curve.sizes), "seconds": list(curve.seconds),
                          "context": curve.context, "per_token": list(curve.per_token),
                          "at": time.time()}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass  # a cache: never an error


def memory_use(device: torch.device | str | None = None) -> float | None:
    """Fraction of memory in use: the CUDA device's for a CUDA device, else the system's
    (``psutil``); ``None`` when it cannot be read. Cheap (microseconds)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(device)
            return 1.0 - free / total if total else None
        except (RuntimeError, AssertionError):
            return None
    try:
        import psutil
    except ImportError:
        return None
    return float(psutil.virtual_memory().percent) / 100.0


def speculative_depths(tree: DraftTree, frontier_depth: int) -> list[int]:
    """Per node, ``0`` on the forced chain (the root, then each chain node's first child,
    ``frontier_depth`` times — :func:`~structspec.spec.drafters.build_tree` adds the chain
    first), else how far below its deepest chain ancestor it lies (``1`` for a branch's first
    node). Pure."""
    out = [0] * len(tree)
    chain_nodes = {0}
    node = 0
    for _ in range(frontier_depth):
        if not tree.children[node]:
            break
        node = tree.children[node][0]
        chain_nodes.add(node)
    for i in range(1, len(tree)):
        out[i] = 0 if i in chain_nodes else out[tree.parents[i]] + 1
    return out


class AcceptanceModel:
    """Running acceptance rate per ``(drafter, depth below the frontier)``, conditional on
    the parent being accepted, and of the forced chain; and how the model tokenizes forced
    punctuation (:meth:`record_split`), which the forced chain follows.

    Args:
        prior: the rate assumed for a drafter never seen at depth 1.
        strength: weight of the prior, in pseudo-observations (deeper levels take the
            estimate of the level above as their prior).
        decay: a count is multiplied by this in every step that observes it (recent
            observations weigh more).
        fade: ... and by this in every step that does not (old records fade slowly).

    Nodes a drafter scored (its own probability of the token, :attr:`DraftTree.scores`)
    are estimated from the score instead, times a running calibration factor
    (:meth:`score_factor`): the learned draft head's probabilities track its acceptance
    closely (on held-out answers, tokens it gives 0.1-0.2 are accepted 16% of the time,
    0.5-0.6 55%, 0.9+ 93%), far better than one rate per depth.

    Not thread-safe; one per decode.
    """

    def __init__(self, prior: float = 0.5, strength: float = 2.0, decay: float = 0.97,
                 fade: float = 0.995) -> None:
        self.prior = prior
        self.strength = strength
        self.decay = decay
        self.fade = fade
        self.counts: dict[tuple[str, int], list[float]] = {}  # -> [proposed, accepted]
        self.chain = [0.0, 0.0]  # forced-chain nodes: [proposed, accepted]
        # A request's first tree, its nodes one below the frontier, per source: [proposed,
        # accepted] (:meth:`start_rate`).
        self.start: dict[str, list[float]] = {}
        self.scored = [0.0, 0.0]  # scored nodes: [sum of their scores, accepted]
        # How the model tokenizes forced text: (context, canonical token) -> {chosen: weight}.
        self.splits: dict[tuple[bytes, bytes], dict[int, float]] = {}
        # The punctuation tokens the model ended free values with: token -> faded count.
        self.closers: dict[int, float] = {}
        # The drafter gate of the decodes that share this model (a
        # :class:`~structspec.spec.schedule.DrafterGate`, set by the decoder): which drafters
        # sit out is carried from request to request of a kind, as the rates are.
        self.gate: Any = None

    def record_split(self, key: tuple[bytes, bytes], chosen: int) -> None:
        """Count that where forced text starts with canonical token ``key[1]`` (after a token
        of context ``key[0]``), the model wrote ``chosen``; older observations fade."""
        seen = self.splits.setdefault(key, {})
        for token in seen:
            seen[token] *= self.decay
        seen[chosen] = seen.get(chosen, 0.0) + 1.0
        if len(seen) > 4:  # keep the four most common choices
            for token in sorted(seen, key=seen.__getitem__)[: len(seen) - 4]:
                del seen[token]

    def record_closer(self, token: int) -> None:
        """Count that the model ended a free value (a string, a number) with ``token``;
        older observations fade."""
        for t in self.closers:
            self.closers[t] *= self.decay
        self.closers[token] = self.closers.get(token, 0.0) + 1.0
        if len(self.closers) > 16:  # keep the sixteen most common
            del self.closers[min(self.closers, key=self.closers.__getitem__)]

    def habits(self) -> dict[str, Any]:
        """How the model tokenizes forced punctuation and ends free values, as plain data
        (JSON-ready: bytes as latin-1 text, token ids, weights), for a packaged prior
        (:mod:`structspec.spec.habits`)."""
        return {
            "splits": [[ctx.decode("latin-1"), canonical.decode("latin-1"),
                        sorted([int(t), round(w, 4)] for t, w in seen.items())]
                       for (ctx, canonical), seen in sorted(self.splits.items())],
            "closers": sorted([int(t), round(w, 4)] for t, w in self.closers.items()),
        }

    def seed(self, habits: dict[str, Any], weight: float = 1.0) -> None:
        """Start from ``habits`` (as :meth:`habits` gives them), each context's weights
        scaled so that its likeliest choice counts ``weight`` observations: a prior the
        model's own choices soon outweigh, followed from the first request on.

        Raises:
            ValueError: ``habits`` is not in that shape."""
        try:
            for ctx, canonical, seen in habits.get("splits", []):
                top = max(w for _, w in seen)
                key = (str(ctx).encode("latin-1"), str(canonical).encode("latin-1"))
                self.splits[key] = {int(t): weight * float(w) / top for t, w in seen}
            closers = habits.get("closers", [])
            top = max((w for _, w in closers), default=1.0)
            self.closers.update({int(t): weight * float(w) / top for t, w in closers})
        except (TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
            raise ValueError(f"not a habits mapping: {exc}") from exc

    def split_shares(self, key: tuple[bytes, bytes], canonical: int,
                     prior: float = 0.5) -> list[tuple[int, float]]:
        """``[(token, share)]`` of the choices recorded for ``key``, likeliest first, with
        ``prior`` pseudo-observations of the ``canonical`` token; ``[]`` when nothing was
        recorded. Half an observation: the model's first observed choice is followed from
        the next request on (a model that opens every answer with ``'{'`` + ``'"'`` pays
        for the canonical ``'{"'`` once, not twice), while a stray split after the canonical
        one was seen does not outvote it. Over 70 BFCL calls from a fresh model, 356 passes
        against 365 with a whole observation (session 23; code: the same 174)."""
        seen = self.splits.get(key)
        if not seen:
            return []
        weights = dict(seen)
        weights[canonical] = weights.get(canonical, 0.0) + prior
        total = sum(weights.values())
        return sorted(((t, w / total) for t, w in weights.items()),
                      key=lambda x: (-x[1], x[0] != canonical, x[0]))  # ties: canonical

    def rate(self, source: str, depth: int) -> float:
        """P(a ``source`` node at ``depth`` below the frontier is accepted | its parent is)."""
        prior = self.prior if depth <= 1 else self.rate(source, depth - 1)
        proposed, accepted = self.counts.get((source, depth), (0.0, 0.0))
        return (accepted + self.strength * prior) / (proposed + self.strength)

    def start_rate(self, source: str) -> float:
        """P(a ``source`` node one below the frontier of a request's *first* tree is
        accepted | its parent is). The first tree drafts from the prompt alone, and there the
        drafters fare otherwise than along the output: the lookup echoes a chat prompt's
        question (prose: 0 of 160 accepted) where it continues a code prompt (a third),
        a JSON call's second-ranked literals are seldom its first value (4%). The prior is
        the drafter's rate at depth 1, worth ``strength`` observations."""
        proposed, accepted = self.start.get(source, (0.0, 0.0))
        return (accepted + self.strength * self.rate(source, 1)) / (proposed + self.strength)

    def record_start(self, tree: DraftTree, path: Sequence[int], frontier_depth: int,
                     next_token: int | None = None) -> None:
        """Learn :meth:`start_rate` from a request's first tree (as drafted; ``path`` and
        ``next_token`` as :meth:`record` takes them): its nodes one below the frontier whose
        parent was accepted. Older first trees fade by ``decay`` per request."""
        depths = speculative_depths(tree, frontier_depth)
        for c in self.start.values():
            c[0] *= self.decay
            c[1] *= self.decay
        for i, hit in _outcomes(tree, path, next_token):
            if depths[i] != 1:
                continue
            c = self.start.setdefault(tree.sources[i], [0.0, 0.0])
            c[0] += 1.0
            c[1] += hit

    def score_factor(self) -> float:
        """How scored nodes fare against their scores: accepted / expected over the scored
        nodes whose parent was accepted (prior 1.0, worth 4 expected acceptances), within
        [0.25, 2]."""
        factor = (self.scored[1] + 4.0) / (self.scored[0] + 4.0)
        return min(2.0, max(0.25, factor))

    def chain_rate(self) -> float:
        """P(a forced-chain node is accepted | its parent is) (prior 0.9)."""
        return (self.chain[1] + 0.9 * self.strength) / (self.chain[0] + self.strength)

    def node_probabilities(self, tree: DraftTree, frontier_depth: int, *,
                           first: bool = False) -> list[float]:
        """Estimated P(node accepted) per node: the product of the conditional rates along
        its path (the root: ``1.0``). ``first``: ``tree`` is a request's first, whose nodes
        one below the frontier take :meth:`start_rate`."""
        probs = [1.0] * len(tree)
        chain_rate = self.chain_rate()
        factor = self.score_factor() if tree.scores else 1.0
        depths = speculative_depths(tree, frontier_depth)
        for i in range(1, len(tree)):
            d = depths[i]
            score = tree.score(i) if d > 0 else None
            if score is not None:
                rate = min(1.0, score * factor)
            elif first and d == 1:
                rate = self.start_rate(tree.sources[i])
            else:
                rate = chain_rate if d <= 0 else self.rate(tree.sources[i], d)
            probs[i] = probs[tree.parents[i]] * rate
        return probs

    def record(self, tree: DraftTree, path: Sequence[int], frontier_depth: int,
               next_token: int | None = None) -> None:
        """Learn from one step: ``path`` (root first) is what was accepted, ``next_token``
        the token the model chose after it (the bonus; ``None`` where the step ended
        without one). Only nodes whose parent was accepted count (the others never had a
        chance); a child of the path's last node is a hit when it holds ``next_token``.

        ``tree`` may be the tree as drafted, before the plan dropped nodes
        (:func:`plan_tree`): the model's choice at every accepted node is known, so a
        dropped node whose parent was accepted has an outcome too. Learning from the
        verified nodes alone let an estimate the plan acted on never be corrected — a
        drafter priced too low had its nodes dropped, and dropped nodes taught nothing.

        A count fades by ``decay`` in each step that observes it, and by only ``fade`` in
        the others: a drafter the gate has paused, or whose guesses sit where the path
        never reaches (fed the verified tree alone: whose guesses the plan drops), keeps
        most of its record for a few hundred steps, then drifts back toward the prior and
        gets tried again. Fading every count by ``decay`` every step let a drafter that is
        never accepted drift back to the prior while it sat out (free text: ``closers`` and
        ``values`` were estimated at 0.1-0.15 after dozens of misses, so the plan kept
        their guesses, 0.5 nodes per pass accepted 1% of the time)."""
        depths = speculative_depths(tree, frontier_depth)
        seen: set[int] = set()
        observed: list[tuple[list[float], float, bool]] = []
        for i, hit in _outcomes(tree, path, next_token):
            d = depths[i]
            c = self.chain if d <= 0 else self.counts.setdefault((tree.sources[i], d), [0.0, 0.0])
            observed.append((c, 1.0, hit))
            seen.add(id(c))
            score = tree.score(i) if d > 0 else None
            if score is not None:
                observed.append((self.scored, score, hit))
                seen.add(id(self.scored))
        for c in (*self.counts.values(), self.chain, self.scored):
            rate = self.decay if id(c) in seen else self.fade
            c[0] *= rate
            c[1] *= rate
        for c, weight, hit in observed:
            c[0] += weight
            c[1] += hit


def _outcomes(tree: DraftTree, path: Sequence[int],
              next_token: int | None) -> Iterator[tuple[int, bool]]:
    """``(node, hit)`` for each node of ``tree`` whose parent ``path`` (root first) accepted:
    a hit where the node is on the path, or holds ``next_token`` (the model's choice after
    the path) below the path's last node. What :meth:`AcceptanceModel.record` and
    :meth:`~AcceptanceModel.record_start` learn from. Pure."""
    on_path = set(path)
    last = path[-1] if path else 0
    for i in range(1, len(tree)):
        if tree.parents[i] in on_path:
            yield i, i in on_path or (next_token is not None and tree.parents[i] == last
                                      and tree.tokens[i] == next_token)


@dataclass(frozen=True)
class Plan:
    """What :func:`plan_tree` chose: the nodes kept and the expected gain."""

    keep: tuple[int, ...]
    expected_tokens: float
    seconds: float

    @property
    def speculative_nodes(self) -> int:
        """Speculative nodes kept (the step's node budget as chosen)."""
        return len(self.keep)


def node_floor(curve: CostCurve, fraction: float = 0.5) -> float:
    """The least a speculative node may be priced at by :func:`plan_tree`: ``fraction`` of
    the curve's mean cost per node between its smallest and largest measured sizes (seconds;
    ``0`` for a one-point curve). Pure.

    Why: every row of a pass costs something (its logits, its attention, its norms), but a
    measured curve has flat stretches — the staircase of the packed kernels, and noise that
    the curve's "a larger pass never costs less" rule turns into a step. Over such a stretch
    any node with a non-zero estimate raised the plan's expected tokens per second, so free
    text carried the ``closers`` and ``values`` drafters' guesses (accepted 2% and 0% of the
    time in the prose benchmark, 0.56 such nodes per pass)."""
    first, last = curve.sizes[0], curve.sizes[-1]
    if last <= first:
        return 0.0
    return max(0.0, fraction * (curve(last) - curve(first)) / (last - first))


#: What a token accepted in a request's first pass is worth, as a share of a one-node pass:
#: about what a token costs in the later passes (session 62, this project's Zen 4: JSON calls
#: ~5.8 ms, code ~6.2, prose ~9, against a one-node pass of ~14 ms).
FIRST_TOKEN_VALUE = 0.5


def plan_first_tree(tree: DraftTree, frontier_depth: int, probs: Sequence[float],
                    curve: CostCurve, *, value: float = FIRST_TOKEN_VALUE) -> Plan:
    """The speculative nodes worth adding to a request's first pass, which prefills the
    prompt: the pass is paid for anyway, so a node there costs a row — the curve's mean cost
    per node (:func:`node_floor` at 1) — and is kept where its estimated acceptance times a
    token's worth (``value`` one-node passes) covers that. :func:`plan_tree`'s tokens per
    second would keep nearly every node (the prompt's rows dwarf the tree's), as the first
    pass did before session 62: prose's first trees, 8 nodes each, were never accepted. The
    kept set is ancestor-closed (a node is never likelier than its parent). Pure."""
    depths = speculative_depths(tree, frontier_depth)
    row = node_floor(curve, 1.0)
    worth = value * curve(1)
    keep = tuple(i for i in range(len(tree)) if depths[i] > 0 and probs[i] * worth >= row)
    base = sum(1 for d in depths if d <= 0)
    return Plan(keep, 1.0 + sum(probs[i] for i in keep), curve(base + len(keep)))


def plan_tree(tree: DraftTree, frontier_depth: int, probs: Sequence[float], curve: CostCurve,
              *, overhead: float = 0.0, floor: float = 0.0) -> Plan:
    """The speculative nodes to keep: the ``k`` most likely (an ancestor-closed set, since a
    node is never likelier than its parent) for the ``k`` maximizing expected tokens per
    second. Pure.

    Args:
        tree: the built tree.
        frontier_depth: depth of the forced chain's end; the root and the forced chain are
            always kept.
        probs: estimated P(accepted) per node (see :meth:`AcceptanceModel.node_probabilities`).
        curve: pass time vs nodes.
        overhead: seconds per step outside the pass (drafting, masks).
        floor: the least each speculative node adds to the pass's cost, in seconds
            (:func:`node_floor`); a node is kept only where its estimate pays for that.

    Returns:
        A :class:`Plan`; ``keep`` lists speculative node indices (ascending).
    """
    depths = speculative_depths(tree, frontier_depth)
    base_nodes = [i for i in range(len(tree)) if depths[i] == 0]
    spec = [i for i in range(len(tree)) if depths[i] > 0]
    # The bonus token, plus the forced chain weighted by how often chain nodes get through.
    expected = 1.0 + sum(probs[i] for i in base_nodes[1:])
    q0 = len(base_nodes)
    order = sorted(spec, key=lambda i: (-probs[i], i))
    cost = curve(q0)
    best_k, best_rate, best_cost = 0, expected / (cost + overhead), cost
    best_expected, gain = expected, expected
    for k, i in enumerate(order, start=1):
        gain += probs[i]
        cost = max(curve(q0 + k), cost + floor)
        rate = gain / (cost + overhead)
        if rate > best_rate * (1 + 1e-9):
            best_k, best_rate, best_expected, best_cost = k, rate, gain, cost
    keep = tuple(sorted(order[:best_k]))
    return Plan(keep, best_expected, best_cost + overhead)
