"""Hand the C heap's free pages back to the OS after packing a model, and tell which
tensors live in file-backed pages.

Packing (:mod:`structspec.spec.fastlinear`) makes short-lived copies of every linear's
weight (the recovered quantized blocks), and :mod:`structspec.spec.hugepages` then copies
the panels into one arena and frees the originals. torch takes that memory from glibc's
``malloc``, which keeps freed chunks in its heap for later requests instead of returning
them: on the default model ~120–160 MB a process, about a tenth of its resident memory,
held for nothing after start-up (``benchmarks/memory.py``) — per replica, in
:class:`~structspec.replicas.Replicas`. ``malloc_trim(0)`` gives those pages back; nothing
that is in use moves. Why by hand: neither torch nor Python's standard library exposes it.

Elsewhere (no glibc: macOS, musl, Windows) this is a no-op.

A weight mapped from its checkpoint file (safetensors loads so where no conversion is
needed: the default model's float32 cache) costs the process nothing of its own: its pages
are the OS's page cache, shared with every process that maps the file and dropped under
pressure. :func:`file_backed` tells such tensors apart, so that
:func:`~structspec.spec.fastlinear.release_originals` lets go only of weights whose memory
is the process's own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_MAPS = Path("/proc/self/maps")


@functools.cache
def _malloc_trim() -> Any | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS. True where glibc's ``malloc_trim`` ran
    (whether or not it found pages to give back); False where this platform has none.
    ~10 ms after packing the default model (no garbage collection first: packing's
    temporaries are freed as they go, and a full collection costs a quarter of a second
    with transformers loaded), so call it after a start-up step that freed a lot, not per
    request."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def file_backed(addresses: Sequence[int]) -> list[bool]:
    """For each address, whether it lies in a mapping of a file (Linux' ``/proc/self/maps``:
    a mapping with an inode). All False where the maps cannot be read (another OS): memory
    of unknown origin counts as the process's own."""
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return [False] * len(addresses)
    ranges: list[tuple[int, int]] = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) >= 6 and parts[4] != "0" and parts[5].startswith("/"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            ranges.append((lo, hi))
    return [any(lo <= at < hi for lo, hi in ranges) for at in addresses]
