"""Apply token masks to logits (torch side of the constraint contract).

A :class:`~structspec.automata.base.TokenMask` is a packed bitset over the vocabulary; the
model's logits may be wider than the tokenizer (padded embedding matrices), and those extra
ids are never allowed.
"""

from __future__ import annotations

import torch

from structspec.automata.base import TokenMask


def mask_to_bool(mask: TokenMask, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A ``bool`` tensor ``[width]``: ``True`` where ``mask`` allows the id.

    Ids at or beyond ``mask.size`` (padding of the logits) are ``False``.
    """
    allowed = torch.from_numpy(mask.to_bool().copy())  # [V]
    if allowed.numel() < width:
        allowed = torch.cat([allowed, torch.zeros(width - allowed.numel(), dtype=torch.bool)])
    elif allowed.numel() > width:
        if bool(allowed[width:].any()):
            raise ValueError(f"mask allows ids beyond the logits width {width}")
        allowed = allowed[:width]
    return allowed.to(device)


def apply_mask(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits`` with disallowed ids set to ``-inf``; returns a new tensor.

    Args:
        logits: ``[..., V]`` float logits.
        allowed: ``[V]`` or ``[..., V]`` bool, broadcastable to ``logits``.
    """
    # (one operation: ``masked_fill(~allowed, ...)`` inverts the mask first, ~39 µs on a 49k
    # row on CPU against ~22 µs; the same values)
    return torch.where(allowed, logits, float("-inf"))
