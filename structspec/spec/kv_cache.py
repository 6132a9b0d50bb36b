"""A key-value cache that grows in place, for CPU decoding (plain and speculative alike).

``transformers``' ``DynamicLayer`` appends each pass's keys and values with ``torch.cat``:
every pass copies the whole cache of every layer. For the default model on one thread that
is 0.6 ms a pass at 150 cached tokens, 3.0 ms at 500 and 6.7 ms at 1,000 (session 45) — a
tenth of a pass over a long JSON-schema prompt. :class:`RoomyLayer` keeps its keys and values
as views of storage with room to grow (doubling, up to the request's token bound, known
before the first pass) and writes each pass's rows in place; cropping, the pruning of a
verified tree (:func:`~structspec.spec.verify.keep_path`) and rollback stay views of the
same storage, and the row-exact attention kernel reads the views in place. Anything that
hands the layer a tensor of its own (a batch reorder, another library's code) is copied back
into storage at the next update, so the layer behaves as a ``DynamicLayer`` in every case.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

#: The least room a layer adds when it grows (tokens).
GROW_MIN = 256


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of storage with room to grow.

    Args:
        capacity: the most tokens the request should need (prompt, output, largest tree):
            room grows by doubling up to it, and past it only if it is outgrown.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = max(1, int(capacity))
        self._k: torch.Tensor | None = None  # [B, H, room, D]
        self._v: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key_states``/``value_states`` ``[B, H, m, D]``; returns the whole keys
        and values (views of the storage), as ``DynamicLayer.update`` does."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.get_seq_length()
        m = key_states.shape[-2]
        if not (_within(self.keys, self._k, key_states) and _within(self.values, self._v,
                                                                     value_states)) \
                or n + m > self._k.shape[-2]:  # type: ignore[union-attr]
            self._reseat(n, n + m, key_states, value_states)
        assert self._k is not None and self._v is not None
        self._k[..., n:n + m, :] = key_states
        self._v[..., n:n + m, :] = value_states
        self.keys = self._k[..., :n + m, :]
        self.values = self._v[..., :n + m, :]
        return self.keys, self.values

    def _reseat(self, n: int, need: int, key_states: torch.Tensor,
                value_states: torch.Tensor) -> None:
        """New storage for at least ``need`` tokens, holding the first ``n`` cached ones:
        room for twice that (at least 256 more), but not past the request's bound unless it
        is outgrown — a request that may run long but stops early holds little, and one
        that grows copies its cache a logarithmic number of times."""
        grow = max(2 * need, need + GROW_MIN)
        room = min(grow, self.capacity) if need <= self.capacity else grow
        k = key_states.new_empty((*key_states.shape[:-2], room, key_states.shape[-1]))
        v = value_states.new_empty((*value_states.shape[:-2], room, value_states.shape[-1]))
        if n:
            assert self.keys is not None and self.values is not None  # n tokens are cached
            k[..., :n, :] = self.keys
            v[..., :n, :] = self.values
        self._k, self._v = k, v

    def reset(self) -> None:
        """Drop the cached tokens and the storage."""
        self._k = self._v = None
        super().reset()


def _within(view: Any, store: torch.Tensor | None, new: torch.Tensor) -> bool:
    """Whether ``view`` is the leading tokens of ``store`` (and ``new`` fits its layout)."""
    if store is None or not isinstance(view, torch.Tensor) or view.dim() != store.dim():
        return False
    return (view.data_ptr() == store.data_ptr() and view.stride() == store.stride()
            and view.shape[:-2] == store.shape[:-2] == new.shape[:-2]
            and view.shape[-1] == store.shape[-1] == new.shape[-1]
            and view.dtype == store.dtype == new.dtype and view.device == new.device)


#: Whether :func:`decoding_cache` makes caches that grow in place (:func:`use_roomy`).
_ROOMY = [True]


def use_roomy(on: bool) -> bool:
    """Switch :func:`decoding_cache`'s roomy layers on or off (for A/B runs and tests);
    returns the setting before."""
    before = _ROOMY[0]
    _ROOMY[0] = bool(on)
    return before


def roomy(cache: Any, tokens: int) -> Any:
    """``cache`` (a ``DynamicCache``, empty) with each plain full-attention layer replaced by
    a :class:`RoomyLayer` for ``tokens`` tokens; layers of other kinds (sliding windows) are
    kept, and a cache that makes its layers as passes fill them makes roomy ones. In place;
    returns ``cache``."""
    cache.layers = [RoomyLayer(tokens) if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = functools.partial(RoomyLayer, tokens)
    return cache


def decoding_cache(model: Any, tokens: int, base: Any | None = None) -> Any:
    """The cache a decode of ``model`` uses for a request of up to ``tokens`` tokens (prompt,
    output and the largest tree at once): ``base`` (default: ``DynamicCache`` for the
    model's config), its full-attention layers made to grow in place on CPU. Elsewhere
    ``base`` unchanged (not measured on a GPU)."""
    cache = base if base is not None else DynamicCache(config=model.config)
    if not _ROOMY[0] or getattr(model, "device", torch.device("cpu")).type != "cpu":
        return cache
    return roomy(cache, tokens)
