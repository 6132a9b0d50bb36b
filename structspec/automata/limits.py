"""Resource limits of one compilation: automaton states, table bytes, wall-clock seconds.

A hostile ``pattern``, a schema with thousands of properties or a deeply nested one must end
in :class:`~structspec.errors.ResourceLimitError`, never in a hang or an out-of-memory. The
caller states the budget once (``compile_json_schema(..., limits=Limits(...))``) and every
builder below the call — regex DFAs, automaton products, the grammar runtime — checks the
same budget: the active compilation's :class:`Budget` lives in a context variable, so the
limits reach code that is shared (and cached) across compilations without being threaded
through every signature, and concurrent compilations on other threads keep their own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from structspec.errors import ResourceLimitError


@dataclass(frozen=True)
class Limits:
    """Budgets for compiling one schema, regex or grammar (all positive).

    Attributes:
        max_states: DFA states of any one automaton (a pattern, a string with length
            bounds, a product of automata).
        max_nfa_states: NFA states while a regex is being compiled.
        max_bytes: bytes of automaton tables built by one compilation, summed.
        max_seconds: wall-clock seconds for one compilation.
        max_input_bytes: size of the schema or grammar text.
        max_depth: nesting depth the runtime offers while generating (deeper continuations
            are not offered: a documented narrowing, never an error).
        max_runtime_states: states the runtime interns over the constraint's lifetime.
    """

    max_states: int = 20_000
    max_nfa_states: int = 200_000
    max_bytes: int = 512 * 2**20
    max_seconds: float = 10.0
    max_input_bytes: int = 16 * 2**20
    max_depth: int = 512
    max_runtime_states: int = 2_000_000

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, not {value!r}")


DEFAULT_LIMITS = Limits()


@dataclass
class Budget:
    """What one compilation has spent of its :class:`Limits`."""

    limits: Limits
    deadline: float
    bytes_used: int = 0
    what: str = "compilation"
    _last: list[str] = field(default_factory=list)

    def remaining_seconds(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def check_time(self) -> None:
        """Raise once the deadline has passed."""
        if time.monotonic() > self.deadline:
            raise ResourceLimitError(
                f"{self.what} took over {self.limits.max_seconds:g} s (Limits.max_seconds)")

    def charge(self, nbytes: int, item: str = "automaton") -> None:
        """Count ``nbytes`` of tables built for ``item``; raise past ``max_bytes``."""
        self.bytes_used += int(nbytes)
        if self.bytes_used > self.limits.max_bytes:
            raise ResourceLimitError(
                f"{self.what} needs over {self.limits.max_bytes} bytes of automaton tables "
                f"(Limits.max_bytes; the last was {item})")


_ACTIVE: ContextVar[Budget | None] = ContextVar("structspec_budget", default=None)


def active_limits() -> Limits:
    """The limits of the compilation in progress on this thread (defaults outside one)."""
    budget = _ACTIVE.get()
    return budget.limits if budget is not None else DEFAULT_LIMITS


def active_budget() -> Budget | None:
    """The budget of the compilation in progress on this thread, if any."""
    return _ACTIVE.get()


@contextlib.contextmanager
def compiling(limits: Limits | None, what: str = "compilation") -> Iterator[Budget]:
    """Run a compilation under ``limits`` (defaults if ``None``). Nested calls keep the
    outer budget: a regex compiled inside a schema compilation counts against the schema."""
    outer = _ACTIVE.get()
    if outer is not None:
        yield outer
        return
    limits = limits or DEFAULT_LIMITS
    budget = Budget(limits, time.monotonic() + limits.max_seconds, what=what)
    token = _ACTIVE.set(budget)
    try:
        yield budget
    finally:
        _ACTIVE.reset(token)


def check_input_size(text: str | bytes, what: str) -> None:
    """Raise if ``text`` is longer than the active ``max_input_bytes``."""
    limit = active_limits().max_input_bytes
    size = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if size > limit:
        raise ResourceLimitError(f"{what} is {size} bytes, over Limits.max_input_bytes={limit}")


def check_time() -> None:
    """Raise if the active compilation is past its deadline (no-op outside one)."""
    budget = _ACTIVE.get()
    if budget is not None:
        budget.check_time()


def charge(nbytes: int, item: str = "automaton") -> None:
    """Count table bytes against the active compilation (no-op outside one)."""
    budget = _ACTIVE.get()
    if budget is not None:
        budget.charge(nbytes, item)


__all__ = ["DEFAULT_LIMITS", "Budget", "Limits", "active_budget", "active_limits", "charge",
           "check_input_size", "check_time", "compiling"]
