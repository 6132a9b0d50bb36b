"""Tensor-parallel sharding of a decoder-only model: each rank keeps a share of every layer.

Megatron-style (Shoeybi et al. 2019): in every decoder layer a rank keeps its share of the
attention heads (the rows of ``q/k/v_proj`` for them, the matching columns of ``o_proj``)
and of the MLP's intermediate units (rows of ``gate/up_proj``, columns of ``down_proj``);
``o_proj`` and ``down_proj`` then give partial sums, which :class:`RowParallelLinear` adds
up across the ranks. Embeddings, norms and the output layer stay whole on every rank, so
each rank's hidden states are the same after each layer, and each rank's KV cache holds its
own heads only.

**Why the partial sums are gathered and added in rank order, not all-reduced.** Speculation
is lossless only where a row's numbers do not depend on the pass it is in (DESIGN.md): a
ring all-reduce adds a vector's elements in an order set by where they fall in the buffer
— which moves with the pass's row count — so with three ranks or more a tree pass and a
one-row pass could round a row differently and greedy outputs could part. Gathering every
rank's partial and adding them ``0 + 1 + 2 + ...`` rounds each element the same way in any
pass, on every rank (so the ranks' hidden states stay bitwise equal). It moves ``world``
times the bytes of an all-reduce: nothing beside a layer's weights for the models this
runs (a pass's activations are a few hundred KB at most).

Supported: the Llama family's module layout (Llama, Mistral, Qwen2/3, SmolLM, Gemma, Phi-3
style MLPs with separate ``gate/up`` projections), with ``num_key_value_heads`` and the
intermediate size divisible by the number of ranks. Others are refused with
:class:`~structspec.spec.verify.UnsupportedModelError` naming what is missing.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from structspec.hf_compat import base_model
from structspec.spec.verify import UnsupportedModelError

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


class RowParallelLinear(nn.Module):
    """A linear layer whose input features are split across the ranks of ``group``: each
    rank computes ``inner(x_share)``, the partials are gathered and added in rank order
    (see the module docstring), then the bias, kept whole, is added once.

    ``inner`` is an ordinary ``nn.Linear`` without bias (the CPU packer may later swap it
    for a packed layer: it is a child module like any other).
    """

    def __init__(self, inner: nn.Module, bias: torch.Tensor | None, group: Any,
                 world: int) -> None:
        super().__init__()
        self.inner = inner
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group = group
        self.world = world

    @property
    def weight(self) -> torch.Tensor:
        """The rank's share of the weight (``[out, in / world]``), for code that reads a
        linear layer's dtype or device."""
        return cast(torch.Tensor, self.inner.weight)  # a linear layer's (or a packed one's)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        part = self.inner(x).contiguous()
        parts = [torch.empty_like(part) for _ in range(self.world)]
        dist.all_gather(parts, part, group=self.group)
        total = parts[0]
        for p in parts[1:]:
            total = total + p  # rank order: the same rounding in every pass, on every rank
        return total if self.bias is None else total + self.bias

    def extra_repr(self) -> str:
        return f"world={self.world}"


def decoder_layers(model: Any) -> Any:
    """The model's list of decoder layers (``model.model.layers``), or raise
    :class:`UnsupportedModelError`."""
    layers = getattr(base_model(model), "layers", None)
    if layers is None:
        raise UnsupportedModelError(
            f"tensor parallelism needs a decoder-only model with its layers at "
            f"model.{getattr(model, 'base_model_prefix', 'model')}.layers; "
            f"{type(model).__name__} has none")
    return layers


def _module(layer: Any, index: int, path: str) -> nn.Linear:
    obj = layer
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            break
    if not isinstance(obj, nn.Linear):
        raise UnsupportedModelError(
            f"tensor parallelism supports the Llama family's layout (self_attn.q/k/v/o_proj, "
            f"mlp.gate/up/down_proj as nn.Linear); layer {index} has no nn.Linear at {path}")
    return obj


def _rows(linear: nn.Linear, start: int, stop: int) -> nn.Linear:
    """A new linear keeping output features ``start:stop`` of ``linear``."""
    out = nn.Linear(linear.in_features, stop - start, bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[start:stop])
        if linear.bias is not None:
            out.bias.copy_(linear.bias[start:stop])
    return out.requires_grad_(False)


def _columns(linear: nn.Linear, start: int, stop: int, group: Any,
             world: int) -> RowParallelLinear:
    """A :class:`RowParallelLinear` keeping input features ``start:stop`` of ``linear``."""
    inner = nn.Linear(stop - start, linear.out_features, bias=False,
                      device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        inner.weight.copy_(linear.weight[:, start:stop])
    bias = None if linear.bias is None else linear.bias.detach().clone()
    return RowParallelLinear(inner.requires_grad_(False), bias, group, world)


def _head_counts(config: Any) -> tuple[int, int]:
    """``(query heads, key-value heads)`` of a model's configuration."""
    heads = int(config.num_attention_heads)
    return heads, int(getattr(config, "num_key_value_heads", None) or heads)


def check_shardable(model: Any, world: int) -> None:
    """Raise :class:`UnsupportedModelError` unless :func:`shard_model` can split ``model``
    over ``world`` ranks (the message names the size that does not divide)."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    layers = decoder_layers(model)
    kv = _head_counts(model.config)[1]
    for i, layer in enumerate(layers):
        for name in _ATTENTION:
            _module(layer, i, f"self_attn.{name}")
        for name in _MLP:
            _module(layer, i, f"mlp.{name}")
    inter = _module(layers[0], 0, "mlp.up_proj").out_features
    for what, n in (("num_key_value_heads", kv), ("intermediate size", inter)):
        if n % world:
            raise UnsupportedModelError(
                f"tensor parallelism over {world} ranks splits the {what} ({n}) evenly; "
                f"{n} is not divisible by {world}. Use a number of ranks dividing it.")


def shard_model(model: Any, rank: int, world: int, group: Any = None) -> Any:
    """Keep rank ``rank``'s share (of ``world``) of every decoder layer of ``model``, in
    place (see the module docstring); returns ``model``. ``group``: the process group the
    row-parallel layers gather over (``None``: the default group). With ``world == 1`` the
    model is returned as it is.

    Raises:
        UnsupportedModelError: the model's layout or sizes do not allow it.
    """
    if not 0 <= rank < max(world, 1):
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    check_shardable(model, world)
    if world == 1:
        return model
    heads, kv = _head_counts(model.config)
    for i, layer in enumerate(decoder_layers(model)):
        attn, mlp = layer.self_attn, layer.mlp
        q = _module(layer, i, "self_attn.q_proj")
        head_dim = q.out_features // heads
        qs, ks = heads // world, kv // world  # query / key-value heads per rank
        attn.q_proj = _rows(q, rank * qs * head_dim, (rank + 1) * qs * head_dim)
        for name in ("k_proj", "v_proj"):
            setattr(attn, name, _rows(getattr(attn, name), rank * ks * head_dim,
                                      (rank + 1) * ks * head_dim))
        attn.o_proj = _columns(attn.o_proj, rank * qs * head_dim, (rank + 1) * qs * head_dim,
                               group, world)
        for name in ("num_heads", "num_attention_heads"):
            if isinstance(getattr(attn, name, None), int):
                setattr(attn, name, qs)
        if isinstance(getattr(attn, "num_key_value_heads", None), int):
            attn.num_key_value_heads = ks
        share = mlp.up_proj.out_features // world
        mlp.gate_proj = _rows(mlp.gate_proj, rank * share, (rank + 1) * share)
        mlp.up_proj = _rows(mlp.up_proj, rank * share, (rank + 1) * share)
        mlp.down_proj = _columns(mlp.down_proj, rank * share, (rank + 1) * share, group, world)
    model._structspec_shard = (rank, world)
    return model


def shard_of(model: Any) -> tuple[int, int] | None:
    """``(rank, world)`` of a model :func:`shard_model` split, else ``None``."""
    return getattr(model, "_structspec_shard", None)
