"""Choosing the next token from (already masked) logits: greedy, or sampling with
temperature, top-k and top-p, reproducible under a seed.

Kept apart from the decode loop so that speculative acceptance can reuse exactly the same
distribution (lossless sampling needs the very probabilities plain decoding would use) and
the same random numbers (:class:`TokenDraws`: one per output position).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
        top_k: keep only the k most likely ids (``None``: all).
        top_p: keep the smallest set of ids whose probability reaches ``top_p`` (``None``: all).
        seed: seed of the sampling generator (``None``: nondeterministic).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be a positive integer, got {self.top_k!r}")
        if self.top_p is not None and not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None:
            try:  # any integer (a NumPy one too), not a bool
                operator.index(self.seed)
            except TypeError:
                raise ValueError(f"seed must be an integer or None, got {self.seed!r}") from None
            if isinstance(self.seed, bool):
                raise ValueError(f"seed must be an integer or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """Whether tokens are chosen by argmax."""
        return self.temperature == 0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution ``[V]`` for masked ``logits`` ``[V]`` (float32).

    Masked ids (``-inf``) get probability 0; top-k and top-p never remove the most likely id,
    so a non-empty mask always leaves something to sample.
    """
    scores = logits.float() / params.temperature  # [V]
    if params.top_k is not None and params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # [V]
    if params.top_p is not None and params.top_p < 1:
        probs = probs.masked_fill(~nucleus(probs, params.top_p), 0.0)
        probs = probs / probs.sum()
    return probs


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The ids top-p sampling keeps, as a bool mask ``[V]``: the likeliest ids, most likely
    first (equal probabilities in id order), as long as the probability of those before them
    is below ``top_p`` — so the most likely id always, and the first id at which the running
    sum reaches ``top_p``.

    Sorting the whole distribution took ~4.6 ms per token on one CPU thread over a 49k-token
    vocabulary (~17% of a small model's decoding step), so only the likely ids are sorted:
    first those of probability at least ``(1 - top_p) / 64`` (a few hundred at most), which
    settles it when they weigh clearly more than ``top_p`` (every id after them is then
    dropped); else those of at least ``(1 - top_p) / 2V``, which all the others together
    cannot outweigh (under ``(1 - top_p) / 2``), or the whole distribution where that is
    more than an eighth of it. Each way keeps exactly the ids a sort of the whole
    distribution would (``tests/test_decode.py``).
    """
    n = probs.numel()
    for floor in ((1.0 - top_p) / 64, (1.0 - top_p) / (2 * n)):
        ids = torch.nonzero(probs >= floor).flatten()  # [C] ascending ids
        if ids.numel() > n // 8:  # a flat distribution: gathering first would cost more
            ids = torch.arange(n, device=probs.device)
        values, order = torch.sort(probs[ids], descending=True, stable=True)  # [C]
        cumulative = torch.cumsum(values, dim=-1)  # [C]
        # the margin dwarfs the float32 rounding of the sums (the second floor has its own)
        if ids.numel() == n or (ids.numel() and float(cumulative[-1]) >= top_p + 1e-4):
            break
    keep = torch.zeros_like(probs, dtype=torch.bool)  # [V]
    keep[ids[order[cumulative - values < top_p]]] = True
    return keep


_MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """SplitMix64's finalizer (Steele, Lea and Flood 2014): a bijection of 64-bit words whose
    outputs for consecutive inputs pass the usual tests of randomness."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class TokenDraws:
    """The uniform number in [0, 1) that picks the sampled token at each output position.

    Why per position, not one random stream consumed per decision: speculative decoding makes
    a varying number of decisions per token — its trees depend on its drafters and on what a
    ``Generator`` has learned from earlier requests — so a stream gave one seed different
    outputs from one call to the next, and other outputs than plain decoding. A number fixed
    by (seed, position) and inverse-CDF sampling (:func:`sample_at`) make the sampled output
    a function of the seed and the model's distributions alone, as greedy output is of the
    model alone: speculative sampling emits plain sampling's tokens exactly, and a drafted
    token is accepted exactly when it is the one the position's number picks — with
    probability ``p(x)``, what rejection sampling of a deterministic draft gives it.

    The numbers are SplitMix64 (a counter-based generator: Java's ``SplittableRandom``) of
    the mixed seed plus the position; ``seed=None`` draws the key from torch's global random
    generator (so ``torch.manual_seed`` fixes unseeded sampling, as it did before).
    """

    __slots__ = ("key",)

    def __init__(self, seed: int | None) -> None:
        if seed is None:
            raw = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64)) & _MASK64
        else:
            raw = operator.index(seed) & _MASK64
        self.key = _mix64(raw ^ 0x5DEECE66D)

    def __call__(self, position: int) -> float:
        """The number of output position ``position`` (0 = the first generated token)."""
        z = (self.key + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
        return (_mix64(z) >> 11) * 2.0 ** -53


def make_draws(params: SamplingParams) -> TokenDraws | None:
    """The per-position draws of a sampled decode, or ``None`` when greedy."""
    return None if params.greedy else TokenDraws(params.seed)


def sample_at(probs: torch.Tensor, u: float) -> int:
    """The id of ``probs`` ``[V]`` (non-negative, not all zero, any total) that the uniform
    number ``u`` in [0, 1) picks: the first id whose running sum (in id order, float64)
    exceeds ``u`` times the total. An id of probability 0 is never picked; equal ``probs``
    and ``u`` pick the same id. ``torch.multinomial`` took ~1.2 ms for one draw over a
    49k-token vocabulary on one CPU thread (~4% of a small model's decoding step); this
    ~0.07 ms."""
    cumulative = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # [V]
    target = (cumulative[-1] * u).reshape(1)
    i = int(torch.searchsorted(cumulative, target, right=True))
    if i >= probs.numel() or not float(probs[i]) > 0:  # u * total rounded up to the total
        i = int(torch.nonzero(probs > 0).max())
    return i


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One id drawn from ``probs`` ``[V]`` with a uniform number from ``generator``
    (:func:`sample_at`)."""
    device = probs.device if generator is None else generator.device
    return sample_at(probs, float(torch.rand((), generator=generator, dtype=torch.float64,
                                             device=device)))


def argmax(logits: torch.Tensor) -> int:
    """The index of the first maximum of ``logits`` ``[V]`` — ``torch.argmax``'s answer, ties
    and NaN included (both take the first NaN as the maximum).

    Why not ``torch.argmax``: on CPU it reduces a 49k-token row in ~43 µs, numpy's SIMD
    argmax in ~4 µs, and greedy decoding takes one per token in both modes (a speculative
    pass one per accepted node). Elsewhere (a GPU, half precision, autograd) torch's."""
    if (logits.device.type == "cpu" and logits.dim() == 1 and not logits.requires_grad
            and logits.dtype in (torch.float32, torch.float64)):
        return int(logits.numpy().argmax())
    return int(torch.argmax(logits))


def choose(logits: torch.Tensor, params: SamplingParams, u: float | None) -> int:
    """Pick one id from masked ``logits`` ``[V]``: the argmax when greedy, else the id the
    position's uniform number ``u`` picks (:class:`TokenDraws`)."""
    if params.greedy:
        return argmax(logits)
    if u is None:
        raise ValueError("sampling needs the position's uniform number")
    return sample_at(probabilities(logits, params), u)
