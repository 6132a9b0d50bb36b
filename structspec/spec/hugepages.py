"""Packed weights in transparent huge pages.

A pass of the default model streams ~133 MB of integer weight panels through the core. In
ordinary 4 KB pages that is ~33,000 page-table walks a pass, and the hardware prefetcher
stops at every page boundary, so each 4 KB restarts its stream. Copied into one arena of
2 MB pages (Linux, ``madvise(MADV_HUGEPAGE)`` where transparent huge pages are enabled
as ``madvise`` or ``always``), in the order a pass reads them, the panels stream as one
run: on the Zen 4 of session 54 the body's linears took 0.88× the time at one row, 0.91× at
8 rows, 0.97× at 16 (``docs/performance.md``, "Session 54"). The numbers are the same: only
where the bytes live changes.

Elsewhere (another OS, huge pages off, a failed ``mmap``) nothing moves. Why by hand: torch
allocates each tensor on its own, with no way to ask for huge pages or to place tensors
together.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: Huge page size on x86-64 and aarch64 Linux (the transparent ones).
HUGE = 2 << 20
#: ``madvise`` advice MADV_HUGEPAGE (Linux).
_MADV_HUGEPAGE = 14
#: Each tensor starts on a cache line.
_ALIGN = 64
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: The attribute a moved module keeps its arena under.
ARENA_ATTR = "_structspec_huge_arena"


def huge_pages_available() -> bool:
    """Whether this process can ask for transparent huge pages (Linux with THP in
    ``always`` or ``madvise`` mode)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mode = _THP.read_text()
    except OSError:
        return False
    return "[never]" not in mode


def _no_arena() -> None:
    """What a copied or unpickled arena becomes (see :meth:`HugePageArena.__reduce__`)."""
    return None


class HugePageArena:
    """One anonymous mapping, 2 MB-aligned and advised huge, holding copies of tensors.

    Attributes:
        tensors: the copies, in the order given (each a view of the mapping; they keep
            it alive).
        nbytes: the mapping's usable size.
        base: its first 2 MB-aligned address.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], fill: bool = True) -> None:
        """Map room for ``tensors`` (their shapes and dtypes) and copy them in; with
        ``fill=False`` the copies are left to the caller (uninitialized views), who can
        then copy and release the originals one at a time."""
        sizes = [t.numel() * t.element_size() for t in tensors]
        offsets, at = [], 0
        for size in sizes:
            offsets.append(at)
            at = (at + size + _ALIGN - 1) // _ALIGN * _ALIGN
        self.nbytes = (at + HUGE - 1) // HUGE * HUGE
        self._map = mmap.mmap(-1, self.nbytes + HUGE,
                              flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = np.frombuffer(self._map, dtype=np.uint8)
        base = raw.ctypes.data
        skip = (-base) % HUGE
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(base + skip), ctypes.c_size_t(self.nbytes),
                     _MADV_HUGEPAGE)  # advice only: pages stay ordinary if refused
        self.base = base + skip
        self.tensors: list[torch.Tensor] = []
        for t, size, off in zip(tensors, sizes, offsets):
            flat = torch.from_numpy(raw[skip + off: skip + off + size])
            copy = flat.view(t.dtype).view(t.shape)
            if fill:
                copy.copy_(t)
            self.tensors.append(copy)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        """Copies and pickles of a module holding the arena hold none: the mapping cannot be
        copied, and a copied :class:`~structspec.spec.fastlinear.PackedLinear` packs its
        panels again in ordinary memory."""
        return _no_arena, ()

    def huge_bytes(self) -> int:
        """How many of the arena's bytes the kernel backs with huge pages now (Linux'
        ``/proc/self/smaps``; 0 where it cannot tell). ``madvise`` is advice: a machine
        short of free 2 MB blocks may give fewer."""
        try:
            lines = Path("/proc/self/smaps").read_text().splitlines()
        except OSError:
            return 0
        inside = False
        for line in lines:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= self.base < hi
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
        return 0


#: The packed-weight attributes of a PackedLinear that passes read, in the order they are
#: tried (an empty or missing one is skipped).
_PANEL_ATTRS = ("_ipacked", "_qpacked", "_packed")


def use_huge_pages(module: torch.nn.Module) -> HugePageArena | None:
    """Move the weight panels of ``module``'s packed linear layers
    (:class:`~structspec.spec.fastlinear.PackedLinear`, native panel kernels) into one
    huge-page arena, in module order (the order a pass reads them); returns the arena, kept
    on ``module`` too, or ``None`` where nothing moved (huge pages unavailable, no panels,
    the mapping refused, or already done). In place; the layers' outputs are unchanged."""
    from structspec.spec.fastlinear import PackedLinear

    if getattr(module, ARENA_ATTR, None) is not None or not huge_pages_available():
        return None
    slots: list[tuple[torch.nn.Module, str]] = []
    for layer in module.modules():
        if not isinstance(layer, PackedLinear) or layer.kernel == "onednn":
            continue
        for name in _PANEL_ATTRS:
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor) and t.numel() and t.device.type == "cpu" \
                    and t.is_contiguous():
                slots.append((layer, name))
    if not slots:
        return None
    try:
        arena = HugePageArena([getattr(layer, name) for layer, name in slots], fill=False)
    except (OSError, ValueError):  # no memory to map, or a size mmap refuses
        return None
    # One layer at a time, so that each original can be freed before the next is copied:
    # the arena's pages are committed as they are written, and a model's panels are not
    # held twice over.
    for (layer, name), copy in zip(slots, arena.tensors):
        copy.copy_(getattr(layer, name))
        setattr(layer, name, copy)
    setattr(module, ARENA_ATTR, arena)
    return arena


def huge_page_mb(module: torch.nn.Module) -> float:
    """Megabytes of ``module``'s packed panels in huge pages (0.0: none; see
    :func:`use_huge_pages`)."""
    arena = getattr(module, ARENA_ATTR, None)
    return round(arena.huge_bytes() / 2**20, 1) if isinstance(arena, HugePageArena) else 0.0


def release_huge_pages(module: torch.nn.Module) -> None:
    """Let go of the arena ``module`` or any of its submodules holds (the mapping is freed
    once no tensor views it), so that packing again may take a new one. In place."""
    for part in module.modules():
        if ARENA_ATTR in vars(part):
            delattr(part, ARENA_ATTR)
