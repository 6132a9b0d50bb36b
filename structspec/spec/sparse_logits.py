"""Logits only where the constraint leaves a choice, bit for bit.

Under a constraint, a verification pass needs a node's logits only at the tokens its state
allows: in JSON most tree nodes sit where a few tokens are legal (a key's next piece, a
digit, a separator), yet the output layer computes all ~49k logits of every row — about a
fifth of a row's arithmetic for the default model. This module computes, for each row, only
what masking will keep:

- rows whose state allows at most :data:`MAX_GATHERED` tokens get the dot products of those
  tokens' output-layer rows alone (one small packed linear over the union of their ids);
- the other rows go through the output layer as before (``logits_to_keep`` with their
  indices, which ``transformers``' causal LMs accept as a tensor);
- everything else in the ``[q, V]`` result is ``-inf``, which is what masking puts there.

The packed kernels (``structspec/_native/smallgemm.c``, and ``qdot.c`` for a head on
integer panels) compute each output as one in-order chain over the input features, whatever
the pass and whatever the packing, so a gathered logit is **bitwise** the logit the whole row
would have held: the masked rows — hence greedy
choices, sampled tokens and every statistic read from them — are unchanged
(``tests/test_spec_sparse_logits.py``). Hence only models whose output layer is a
``"panel"``- or ``"panel_int8"``-packed :class:`~structspec.spec.fastlinear.PackedLinear`
and whose logits are that layer's output as is (no soft-capping or scaling;
:func:`supports`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from structspec.automata.base import TokenMask
from structspec.spec import fastlinear
from structspec.spec.draft_head import final_norm

#: Rows whose state allows at most this many tokens get only those logits.
MAX_GATHERED = 64
#: At most this many distinct ids gathered per pass (beyond, rows go whole).
MAX_UNION = 1024
#: Model types whose causal-LM head returns ``lm_head(hidden)`` unchanged, per row.
PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3", "olmo2", "smollm3"})
_NO_SCALING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def supports(model: Any) -> bool:
    """Whether :func:`row_plan`/:func:`assemble` give ``model`` the logits its own head would:
    a causal LM of a :data:`PLAIN_HEADS` type, no logit scaling or capping, an output layer
    packed for the ``"panel"`` or ``"panel_int8"`` kernel, a final norm to read its input
    from. Pure."""
    config = getattr(model, "config", None)
    if final_norm(model) is None:
        return False
    if getattr(config, "model_type", None) not in PLAIN_HEADS:
        return False
    if any(getattr(config, name, None) not in (None, 0, 1, 1.0) for name in _NO_SCALING):
        return False
    head = model.get_output_embeddings()
    return isinstance(head, fastlinear.PackedLinear) and head.kernel in ("panel", "panel_int8")


@dataclass(frozen=True)
class RowPlan:
    """Which logits a pass of ``q`` rows computes.

    Attributes:
        full: rows that go through the output layer whole, ascending.
        gathered: per row computed in part, the allowed ids ``[n]`` (long).
    """

    full: tuple[int, ...]
    gathered: dict[int, torch.Tensor]


class IdCache:
    """Allowed ids per :class:`TokenMask` (constraints memoize masks per state, so the same
    few objects recur), ``None`` where there are more than :data:`MAX_GATHERED`. One per
    decode; not thread-safe."""

    def __init__(self, limit: int = MAX_GATHERED) -> None:
        self.limit = limit
        self._ids: dict[int, tuple[TokenMask, torch.Tensor | None]] = {}

    def get(self, mask: TokenMask) -> torch.Tensor | None:
        """``mask``'s ids as a long tensor, or ``None`` if it allows more than ``limit``."""
        hit = self._ids.get(id(mask))
        if hit is None:
            ids = (torch.from_numpy(mask.ids()).long() if mask.count() <= self.limit
                   else None)
            hit = (mask, ids)
            self._ids[id(mask)] = hit
        return hit[1]


def row_plan(masks: Sequence[TokenMask | None], ids: IdCache) -> RowPlan:
    """The plan for rows whose allowed sets are ``masks`` (one per row, in order; ``None``
    where the set is not known — a grammar whose masks cost milliseconds is not asked for
    rows decoding may never reach —: the row goes whole). Pure apart from filling ``ids``."""
    full: list[int] = []
    gathered: dict[int, torch.Tensor] = {}
    union = 0
    for row, mask in enumerate(masks):
        allowed = None if mask is None else ids.get(mask)
        if allowed is None or union + len(allowed) > MAX_UNION:
            full.append(row)
        else:
            gathered[row] = allowed
            union += len(allowed)
    return RowPlan(tuple(full), gathered)


def gathered_logits(head: fastlinear.PackedLinear, x: torch.Tensor, ids: torch.Tensor
                    ) -> torch.Tensor:
    """``x @ W[ids]^T + b[ids]`` ``[m, n]`` for rows ``x`` ``[m, H]``, bitwise what ``head(x)``
    holds at ``ids``: the selected weight rows packed as float32 panels, through the same
    kernel (one in-order FMA chain per output) — or, for a head on integer panels, those
    columns' panels through its integer kernel."""
    if head.int8:
        return fastlinear.gathered_int8(head, x, ids)
    gemm = fastlinear.smallgemm()
    k = head.in_features
    n = int(ids.numel())
    sub = head.weight_rows(ids)  # [n, H]
    packed = torch.empty(gemm.packed_size(n, k), dtype=torch.float32)
    gemm.pack(packed.data_ptr(), sub.data_ptr(), n, k, False)
    bias = None if head._bias is None else (
        head._bias.index_select(0, ids).to(torch.float32).contiguous())
    x = x.to(torch.float32).contiguous()
    m = x.numel() // k
    out = torch.empty(m, n, dtype=torch.float32)
    if m and n:
        gemm.linear(x.data_ptr(), m, k, packed.data_ptr(), n,
                    0 if bias is None else bias.data_ptr(), out.data_ptr(), 1, 0)
    return out


def assemble(plan: RowPlan, full_logits: torch.Tensor, hidden: torch.Tensor,
             head: fastlinear.PackedLinear) -> torch.Tensor:
    """The pass's ``[q, V]`` logits: ``full_logits`` ``[len(plan.full), V]`` in the full
    rows, the gathered ids' logits (from ``hidden`` ``[q, H]``, the output layer's input) in
    the others, ``-inf`` elsewhere — equal, after masking, to the whole rows. Pure."""
    q = hidden.shape[0]
    width = head.out_features
    logits = torch.full((q, width), float("-inf"), dtype=torch.float32)  # [q, V]
    if plan.full:
        logits[list(plan.full)] = full_logits.to(torch.float32)
    if plan.gathered:
        rows = list(plan.gathered)
        ids = [plan.gathered[r] for r in rows]
        flat = torch.cat(ids)  # [N]
        union, inverse = torch.unique(flat, return_inverse=True)  # [u], [N]
        if int(union[-1]) >= width:  # as masking the whole row would say
            raise ValueError(f"mask allows ids beyond the logits width {width}")
        values = gathered_logits(head, hidden[rows], union)  # [len(rows), u]
        sizes = torch.tensor([len(i) for i in ids])
        local = torch.repeat_interleave(torch.arange(len(rows)), sizes)  # [N]
        logits[torch.tensor(rows)[local], flat] = values[local, inverse]
    return logits


class SparseLogits:
    """One decode's output layer, computed where the constraint leaves a choice: the id
    cache and the layer. The decode loop captures the final norm's output (the layer's
    input) with a forward hook on :func:`~structspec.spec.draft_head.final_norm`."""

    def __init__(self, model: Any) -> None:
        self.head: fastlinear.PackedLinear = model.get_output_embeddings()
        self.norm = final_norm(model)
        self.ids = IdCache()

    @classmethod
    def of(cls, model: Any, enabled: bool = True) -> SparseLogits | None:
        """One for ``model`` where it is ``enabled`` and :func:`supports` it, else ``None``."""
        return cls(model) if enabled and supports(model) else None

    def plan(self, masks: Sequence[TokenMask | None]) -> RowPlan | None:
        """The row plan for a pass whose rows' allowed sets are ``masks``, or ``None``
        where every row goes whole."""
        plan = row_plan(masks, self.ids)
        return plan if plan.gathered else None

    def assemble(self, plan: RowPlan, full_logits: torch.Tensor, hidden: torch.Tensor
                 ) -> torch.Tensor:
        """:func:`assemble` with this decode's output layer."""
        return assemble(plan, full_logits, hidden, self.head)
