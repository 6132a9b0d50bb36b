"""The compile cache: a bounded, thread-safe, in-memory LRU of compiled constraints.

Compiling is cheap with the grammar route (milliseconds), but a compiled constraint also
carries its memo tables (masks, transitions), which make repeated requests fast: sharing one
constraint object between requests is what the cache is for. Concurrent requests for one key
compile it once; the others wait for that result.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class CompileCache(Generic[T]):
    """A bounded, thread-safe LRU of compiled artifacts.

    Args:
        maxsize: how many artifacts to keep; the least recently used is evicted first.

    ``get_or_compile`` is safe to call from many threads: each key is compiled at most once
    at a time (other callers of the same key wait for it), and a failed compilation is not
    cached (the exception reaches every waiting caller, who may retry).
    """

    def __init__(self, maxsize: int = 64) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()
        self._inflight: dict[Hashable, threading.Lock] = {}
        self.hits = 0
        self.misses = 0

    def get_or_compile(self, key: Hashable, fn: Callable[[], T]) -> T:
        """The artifact for ``key``, calling ``fn()`` to build it on a miss.

        Raises whatever ``fn`` raises; nothing is stored then.
        """
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
            key_lock = self._inflight.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:  # another thread may have finished while we waited
                if key in self._items:
                    self._items.move_to_end(key)
                    self.hits += 1
                    return self._items[key]
                self.misses += 1
            try:
                value = fn()
            finally:
                with self._lock:
                    self._inflight.pop(key, None)
            with self._lock:
                self._items[key] = value
                self._items.move_to_end(key)
                while len(self._items) > self.maxsize:
                    self._items.popitem(last=False)
            return value

    def get(self, key: Hashable) -> T | None:
        """The cached artifact for ``key`` or ``None`` (counts as neither hit nor miss)."""
        with self._lock:
            return self._items.get(key)

    def clear(self) -> None:
        """Drop every cached artifact and reset the counters."""
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
