"""The compile cache: a bounded, thread-safe LRU in memory, and a bounded store on disk.

Compiling is cheap with the grammar route (milliseconds), but a compiled constraint also
carries its memo tables (masks, transitions), which make repeated requests fast: sharing one
constraint object between requests is what the memory cache is for. Concurrent requests for
one key compile it once; the others wait for that result.

The disk store keeps compiled constraints *with* their memo tables across processes — a
command-line call pays neither the compilation nor the first masks again. Entries are keyed
by the canonical input, the options, the vocabulary's fingerprint and the structspec version
(:func:`disk_key`), pickled (the vocabulary itself is left out and re-attached on load), written
atomically, readable by the owner only, and evicted oldest-first beyond ``max_bytes``.
Writing is deferred: a compilation only *registers* its constraint (:meth:`DiskCache.remember`,
no latency added), and :meth:`DiskCache.flush` writes the registered constraints that are new
or whose memo tables grew — the CLI calls it before exiting, and it runs at interpreter exit.

Location: ``$STRUCTSPEC_COMPILE_CACHE`` (a directory, or ``off``), else
``$STRUCTSPEC_CACHE/compiled``, else ``~/.cache/structspec/compiled``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import io
import os
import pickle
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, TypeVar

from structspec._version import __version__

T = TypeVar("T")

#: Bumped when the pickled layout of constraints changes.
DISK_FORMAT = 1
DEFAULT_DISK_BYTES = 256 * 2**20


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


# -- on disk ------------------------------------------------------------------------------------


@functools.cache
def compiler_revision() -> str:
    """A hash of the compiler's own source (``structspec/automata/*.py``): a stored
    constraint is only as right as the code that compiled it, and the version number does not
    change with every fix between releases (a schema compiled by a buggy merge would be served
    from disk after the fix). ``""`` where the sources cannot be read."""
    h = hashlib.sha256()
    try:
        for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    except OSError:
        return ""
    return h.hexdigest()[:16]


def disk_key(kind: str, *parts: object) -> str:
    """A file-safe key for ``parts`` (canonical text of the input, options, vocabulary
    fingerprint), salted with the structspec version, the compiler's source revision and the
    disk format."""
    text = repr((kind, __version__, compiler_revision(), DISK_FORMAT, *parts)
                ).encode("utf-8", "surrogatepass")
    return f"{kind}-{hashlib.sha256(text).hexdigest()[:40]}"


def memo_size(obj: Any) -> int:
    """How much a constraint has memoized (0 if it does not say)."""
    fn = getattr(obj, "memo_size", None)
    return int(fn()) if callable(fn) else 0


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        from structspec.vocab import Vocabulary

        if isinstance(obj, Vocabulary):
            return ("vocabulary", obj.fingerprint)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, vocab: Any) -> None:
        super().__init__(io.BytesIO(data))
        self.vocab = vocab

    def persistent_load(self, pid: Any) -> Any:
        if pid == ("vocabulary", getattr(self.vocab, "fingerprint", None)):
            return self.vocab
        raise pickle.UnpicklingError("cached constraint is for another vocabulary")


class DiskCache:
    """Compiled constraints on disk (see the module docstring). Thread-safe.

    Args:
        directory: where entries live (created ``0700``).
        max_bytes: total size kept; the least recently used entries go first.
    """

    def __init__(self, directory: str | Path, max_bytes: int = DEFAULT_DISK_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # Entries this process wrote or read, with the memo size they were written with.
        self._written: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._sizes: dict[str, int] = {}
        self.hits = self.misses = self.errors = 0
        self._armed = False

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.pickle"

    def load(self, key: str, vocab: Any) -> Any | None:
        """The entry for ``key`` with ``vocab`` re-attached, or ``None`` (missing, stale or
        unreadable entries are misses; unreadable ones are removed)."""
        with self._lock:  # registered in this process, not written yet: share it
            mine = self._written.get(key) if self._sizes.get(key) == -1 else None
        if mine is not None and getattr(mine, "vocab", vocab) is vocab:
            self.hits += 1
            return mine
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        try:
            obj = _Unpickler(data, vocab).load()
        except Exception:  # a torn or foreign file: drop it, compile again
            self.errors += 1
            self.misses += 1
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        with self._lock:
            self._written[key] = obj
            self._sizes[key] = memo_size(obj)
        self.hits += 1
        return obj

    def store(self, key: str, obj: Any, *, evict: bool = True) -> bool:
        """Write ``obj`` under ``key`` (atomically); ``False`` if it could not be written.
        ``evict=False`` leaves the size bound to the caller (one pass after many writes)."""
        buf = io.BytesIO()
        for _ in range(3):  # memo tables may grow while they are pickled: try again
            try:
                buf = io.BytesIO()
                _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
                break
            except RuntimeError:
                continue
            except (pickle.PicklingError, TypeError, AttributeError):
                self.errors += 1
                return False
        else:
            self.errors += 1
            return False
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(buf.getvalue())
                os.replace(tmp, self._path(key))
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError:
            self.errors += 1
            return False
        with self._lock:
            self._written[key] = obj
            self._sizes[key] = memo_size(obj)
        if evict:
            self._evict()
        return True

    def remember(self, key: str, obj: Any) -> None:
        """Register ``obj`` to be written under ``key`` at the next :meth:`flush` (the first
        registration arms a flush at interpreter exit)."""
        with self._lock:
            self._written[key] = obj
            self._sizes.setdefault(key, -1)
            if not self._armed:
                self._armed = True
                atexit.register(self.flush)

    def flush(self) -> int:
        """Write the registered entries that are new or whose memo tables grew since they
        were written; returns how many were written."""
        with self._lock:
            grown = [(k, o) for k, o in list(self._written.items())
                     if memo_size(o) > self._sizes.get(k, 0)]
        written = sum(self.store(k, o, evict=False) for k, o in grown)
        if written:
            self._evict()
        return written

    def _evict(self) -> None:
        try:
            entries = [(st.st_mtime, st.st_size, p)
                       for p in self.directory.glob("*.pickle") for st in (p.stat(),)]
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size

    def clear(self) -> None:
        """Remove every entry."""
        for path in self.directory.glob("*.pickle"):
            path.unlink(missing_ok=True)
        with self._lock:
            self._written.clear()
            self._sizes.clear()


_DISK: DiskCache | None = None
_DISK_SET = False
_DISK_LOCK = threading.Lock()


def default_disk_directory() -> Path | None:
    """Where the disk cache lives by default (``None``: switched off by the environment)."""
    env = os.environ.get("STRUCTSPEC_COMPILE_CACHE")
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "false", "no") else Path(env)
    root = os.environ.get("STRUCTSPEC_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "structspec"
    return base / "compiled"


def configure_disk_cache(directory: str | Path | None,
                         max_bytes: int = DEFAULT_DISK_BYTES) -> DiskCache | None:
    """Use ``directory`` for compiled constraints (``None`` switches the disk cache off);
    returns the cache."""
    global _DISK, _DISK_SET
    with _DISK_LOCK:
        _DISK = DiskCache(directory, max_bytes) if directory is not None else None
        _DISK_SET = True
        return _DISK


def disk_cache() -> DiskCache | None:
    """The disk cache in use (from :func:`configure_disk_cache` or the environment)."""
    global _DISK, _DISK_SET
    with _DISK_LOCK:
        if not _DISK_SET:
            directory = default_disk_directory()
            _DISK = DiskCache(directory) if directory is not None else None
            _DISK_SET = True
        return _DISK


__all__ = ["CompileCache", "DiskCache", "configure_disk_cache", "disk_cache", "disk_key",
           "memo_size"]
