"""Choosing the next token from (already masked) logits: greedy, or sampling with
temperature, top-k and top-p, reproducible under a seed.

Kept apart from the decode loop so that speculative acceptance can reuse exactly the same
distribution (lossless sampling needs the very probabilities plain decoding would use).
"""

from __future__ import annotations

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


def make_generator(
    params: SamplingParams, device: torch.device | str = "cpu"
) -> torch.Generator | None:
    """A seeded ``torch.Generator`` for sampling, or ``None`` for greedy / unseeded."""
    if params.greedy or params.seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed)
    return gen


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One id drawn from ``probs`` ``[V]`` (non-negative, not all zero, any total): the first
    id whose running sum exceeds a uniform draw times the total. An id of probability 0 is
    never drawn. ``torch.multinomial`` took ~1.2 ms for one draw over a 49k-token vocabulary
    on one CPU thread (~4% of a small model's decoding step); this ~0.1 ms."""
    cumulative = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # [V]
    u = torch.rand((), generator=generator, dtype=torch.float64, device=probs.device)
    i = int(torch.searchsorted(cumulative, (u * cumulative[-1]).reshape(1), right=True))
    if i >= probs.numel() or not float(probs[i]) > 0:  # u * total rounded up to the total
        i = int(torch.nonzero(probs > 0).max())
    return i


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


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick one id from masked ``logits`` ``[V]``."""
    if params.greedy:
        return argmax(logits)
    return sample(probabilities(logits, params), generator)
