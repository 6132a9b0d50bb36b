"""Optional native kernels (C, built by ``setup.py`` from ``structspec/_native/*.c``).

Only the hot inner loops live here — walks of the token trie through automata
(``trie_walk``, ``lark_walk``), packing (``bitset``), LALR reductions over array stacks
(``lalr_sim``) — where interpreted Python and NumPy's per-call overhead dominate (see
``docs/performance.md``); and the model side's kernels (``qdot``, ``smallgemm``,
``attend``, ``headstep``: a draft head's step in one call, its twin torch's operators,
equal to float rounding; ``promptdot``: a prompt's rows on coarser integer blocks, where
without it they take qdot's kernels, another rounding of the same prompt).
Every other kernel has a NumPy twin that gives identical results: :func:`load` returns ``None``
when a kernel was not built (no C compiler at install time) or when
``STRUCTSPEC_NATIVE=off``, and callers then take the NumPy path. Tests compare the two.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_CACHE: dict[str, ModuleType | None] = {}


def enabled() -> bool:
    """Whether native kernels may be used (``STRUCTSPEC_NATIVE`` is not ``off``/``0``)."""
    return os.environ.get("STRUCTSPEC_NATIVE", "on").lower() not in ("off", "0", "false", "no")


def load(name: str) -> ModuleType | None:
    """The built kernel module ``structspec._native.<name>``, or ``None`` (not built, or
    disabled by ``STRUCTSPEC_NATIVE=off``). Read at call time, so tests can switch it."""
    if not enabled():
        return None
    if name not in _CACHE:
        try:
            _CACHE[name] = importlib.import_module(f"structspec._native.{name}")
        except ImportError:
            _CACHE[name] = None
    return _CACHE[name]


def runnable(name: str) -> ModuleType | None:
    """The kernel module ``name`` where it is built, switched on and runs on this CPU (its
    ``available()``: the instruction sets it needs), else ``None``."""
    kernel = load(name)
    return kernel if kernel is not None and kernel.available() else None


__all__ = ["enabled", "load", "runnable"]
