"""Compile caches: a bounded in-memory LRU and an optional on-disk store.

Compiling a constraint is the expensive step of a request (an outlines-core ``Index`` for a
function-call schema over a 49k vocabulary takes 0.05–3 s), while the compiled artifact is
immutable and shareable. Two layers:

- :class:`CompileCache`: per process, in memory, LRU-bounded, thread-safe. Concurrent
  requests for one key compile it once; the others wait for that result.
- :class:`DiskCache`: pickled artifacts under ``$STRUCTSPEC_CACHE/compiled`` (default
  ``~/.cache/structspec/compiled``), written atomically (temp file + ``os.replace``), keyed by
  a digest that includes the structspec and outlines-core versions, pruned to a bounded
  number of files. Loading a pickled ``Index`` takes milliseconds where building it took
  hundreds of them. Files are pickles: the directory must be trusted like any user cache.

This module does not import :mod:`structspec.models` (automata sit below it); it reads the
same environment variables itself.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from contextlib import suppress
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, TypeVar

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


def cache_dir() -> Path:
    """The user cache directory: ``$STRUCTSPEC_CACHE``, else ``$XDG_CACHE_HOME/structspec``,
    else ``~/.cache/structspec`` (the same rule as :func:`structspec.models.cache_root`)."""
    env = os.environ.get("STRUCTSPEC_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "structspec"


@cache
def versions_tag() -> str:
    """``structspec-<v>/outlines_core-<v>``: part of every disk key, so upgrades miss cleanly."""
    parts = []
    for dist in ("structspec", "outlines_core"):
        try:
            parts.append(f"{dist}-{metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist}-0")
    return "/".join(parts)


class DiskCache:
    """Pickled artifacts in one directory, one file per key.

    Args:
        directory: where the files live; default ``cache_dir() / "compiled"``, resolved at
            each call so tests can point ``STRUCTSPEC_CACHE`` elsewhere.
        max_files: after a store, the oldest files beyond this count are removed.
        max_file_bytes: larger pickles are not kept (an ``Index`` with many string states
            can pickle to hundreds of MB, and loading that is no faster than building it).
        max_total_bytes: after a store, the oldest files are removed until the directory
            holds at most this much.

    Disabled (every load misses, stores do nothing) when ``STRUCTSPEC_DISK_CACHE=0``.
    Errors of the file system never propagate: a cache that cannot be read or written is a
    miss. Thread- and process-safe: writes go to a temporary file renamed into place.
    """

    def __init__(self, directory: Path | None = None, max_files: int = 256,
                 max_file_bytes: int = 128 << 20, max_total_bytes: int = 1 << 30) -> None:
        self._directory = directory
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes

    @property
    def directory(self) -> Path:
        """The directory files are read from and written to."""
        return self._directory if self._directory is not None else cache_dir() / "compiled"

    @staticmethod
    def enabled() -> bool:
        """Whether the disk layer is on (``STRUCTSPEC_DISK_CACHE`` is not ``0``/``false``)."""
        return os.environ.get("STRUCTSPEC_DISK_CACHE", "1").lower() not in {"0", "false", "no"}

    def path_for(self, key: str) -> Path:
        """The file that stores ``key`` (a digest of the key and :func:`versions_tag`)."""
        digest = hashlib.sha256(f"{versions_tag()}\0{key}".encode()).hexdigest()[:40]
        return self.directory / f"{digest}.pkl"

    def load(self, key: str, *, persistent_load: Callable[[Any], Any] | None = None) -> Any:
        """The object stored under ``key``, or ``None`` when absent or unreadable.

        ``persistent_load`` resolves the ids that :meth:`store`'s ``persistent_id`` wrote
        (e.g. a vocabulary that is kept out of the file).
        """
        if not self.enabled():
            return None
        path = self.path_for(key)
        try:
            with open(path, "rb") as fh:
                return _Unpickler(fh, persistent_load).load()
        except FileNotFoundError:
            return None
        except Exception:  # a corrupt or stale file is a miss; remove it
            with suppress(OSError):
                path.unlink()
            return None

    def store(
        self, key: str, value: Any, *, persistent_id: Callable[[Any], Any] | None = None
    ) -> bool:
        """Write ``value`` under ``key`` atomically; ``False`` if it could not be written."""
        if not self.enabled():
            return False
        path = self.path_for(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pkl")
            try:
                with os.fdopen(fd, "wb") as fh:
                    _Pickler(fh, persistent_id).dump(value)
                if os.path.getsize(tmp) > self.max_file_bytes:
                    os.unlink(tmp)
                    return False
                os.replace(tmp, path)
            except BaseException:
                with suppress(OSError):
                    os.unlink(tmp)
                raise
        except Exception:
            return False
        self._prune()
        return True

    def _prune(self) -> None:
        """Keep at most ``max_files`` files and ``max_total_bytes``, newest first."""
        try:
            stats = [(p, p.stat()) for p in self.directory.glob("*.pkl") if p.is_file()]
        except OSError:
            return
        stats.sort(key=lambda item: item[1].st_mtime, reverse=True)
        total = 0
        for i, (path, st) in enumerate(stats):
            total += st.st_size
            if i >= self.max_files or total > self.max_total_bytes:
                with suppress(OSError):
                    path.unlink()


class _Pickler(pickle.Pickler):
    """A pickler whose ``persistent_id`` hook is a given function (or none)."""

    def __init__(self, fh: Any, persistent_id: Callable[[Any], Any] | None) -> None:
        super().__init__(fh, protocol=pickle.HIGHEST_PROTOCOL)
        self._pid = persistent_id

    def persistent_id(self, obj: Any) -> Any:
        return None if self._pid is None else self._pid(obj)


class _Unpickler(pickle.Unpickler):
    """An unpickler whose ``persistent_load`` hook is a given function (or none)."""

    def __init__(self, fh: Any, persistent_load: Callable[[Any], Any] | None) -> None:
        super().__init__(fh)
        self._pload = persistent_load

    def persistent_load(self, pid: Any) -> Any:
        if self._pload is None:
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        return self._pload(pid)
