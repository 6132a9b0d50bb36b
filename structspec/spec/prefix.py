"""A prefix KV cache: the key/values of the beginning that prompts share, reused across
requests.

Requests to one model usually begin alike: the chat template's system message and role
markers (about 20 tokens for the default model's JSON prompts, ~12% of their prefill). A
:class:`PrefixCache` learns such headers from the prompts it sees: the longest common prefix
of a prompt with the previous *different* prompt, when it is at least ``min_tokens`` long,
is stored (its key/values copied from that request's cache after its first pass). A later
prompt that starts with a stored prefix starts its KV cache from it and prefills only the
rest. A prompt is never stored whole because it was repeated: the cache holds what distinct
requests share, not a request's own text.

Outputs are unchanged: a causal model's key/values at a position depend on the tokens up to
it only (up to float rounding from a different batch shape, the same order as the tree
pass's). Both :func:`structspec.engine.decode` and
:func:`structspec.spec.decode.speculative_decode` take one, so speculation on and off get
the same head start. Thread-safe; bounded to ``max_entries`` prefixes (least recently used
first out).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``. Pure."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    """See the module docstring.

    Args:
        min_tokens: shortest prefix worth storing.
        max_entries: prefixes kept (least recently used dropped first).
    """

    def __init__(self, min_tokens: int = 8, max_entries: int = 4) -> None:
        self.min_tokens = min_tokens
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = (
            OrderedDict())
        self._last: tuple[int, ...] | None = None
        self._lock = threading.Lock()
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def restore(self, prompt_ids: Sequence[int], cache: Any) -> int:
        """Fill the empty ``cache`` with the longest stored prefix of ``prompt_ids`` (at most
        all tokens but the last, which the first pass must run). Mutates ``cache``.

        Returns:
            How many tokens of ``prompt_ids`` the cache now holds (``0``: no stored prefix).
        """
        limit = len(prompt_ids) - 1
        with self._lock:
            best: tuple[int, ...] | None = None
            for key in self._entries:
                if len(key) <= limit and (best is None or len(key) > len(best)) \
                        and tuple(prompt_ids[: len(key)]) == key:
                    best = key
            if best is None:
                return 0
            self._entries.move_to_end(best)
            layers = self._entries[best]
            self.hits += 1
            self.reused_tokens += len(best)
        for i, (keys, values) in enumerate(layers):
            cache.update(keys, values, i)  # copies: the stored tensors are never written
        return len(best)

    def learn(self, prompt_ids: Sequence[int], cache: Any) -> None:
        """Remember what ``prompt_ids`` shares with the previous different prompt, taking the
        key/values from ``cache``, which must hold at least that many tokens of this prompt
        (call it after the first pass). Does nothing for a prompt equal to the previous one,
        a short common prefix, or one already stored."""
        key = tuple(prompt_ids)
        with self._lock:
            last, self._last = self._last, key
            if last is None or last == key:
                return
            n = min(common_prefix(last, key), len(key) - 1)
            if n < self.min_tokens or key[:n] in self._entries:
                return
        layers = []
        for layer in cache.layers:
            keys = getattr(layer, "keys", None)
            if keys is None or keys.dim() < 2 or keys.shape[-2] < n:
                return  # not a cache this prompt filled: store nothing
            if getattr(layer, "cumulative_length", keys.shape[-2]) != keys.shape[-2]:
                return  # a sliding window dropped the oldest keys: they are not the prefix's
            layers.append((keys[..., :n, :].clone(), layer.values[..., :n, :].clone()))
        with self._lock:
            self._entries[key[:n]] = layers
            self._entries.move_to_end(key[:n])
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every stored prefix and the previous prompt."""
        with self._lock:
            self._entries.clear()
            self._last = None
