"""The constraint contract: compiled constraints, their states and token masks.

A compiled :class:`Constraint` is immutable and shareable across threads and requests; its
state is a small hashable value, so a draft tree of 16 branches is 16 values (no fork, no
rollback). :class:`TokenMask` is a packed bitset over the vocabulary (32 ids per ``uint32``
word, little-endian bit order, the layout xgrammar and llguidance use too).

End of sequence: ``allowed(s)`` contains the vocabulary's EOS ids exactly when
``is_accepting(s)``; ``advance(s, eos)`` returns ``s`` unchanged in an accepting state and
``None`` elsewhere. Special tokens other than EOS are never allowed.

No torch here: the automata import without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from structspec import _native

#: A constraint's state: an opaque hashable value (an int in every shipped constraint).
#: Typed ``Any`` rather than ``Hashable`` so that an implementation may name its own state
#: type: a method taking ``state: int`` does not match a protocol method taking
#: ``state: Hashable`` (parameters are contravariant), and a user's type checker refused
#: ``c: Constraint = compile_regex(...)``.
State = Any


class TokenMask:
    """An immutable set of token ids over a vocabulary of ``size`` ids, as a packed bitset.

    ``words`` is a read-only ``uint32`` array of ``ceil(size / 32)`` words; bit ``i % 32`` of
    word ``i // 32`` is set when id ``i`` is allowed.
    """

    __slots__ = ("_count", "size", "words")

    def __init__(self, words: np.ndarray, size: int) -> None:
        if words.dtype != np.uint32 or words.shape != ((size + 31) // 32,):
            raise ValueError("words must be a uint32 array of ceil(size/32) words")
        words.setflags(write=False)
        self.words = words
        self.size = size
        self._count: int | None = None

    @classmethod
    def from_ids(cls, ids: Iterable[int], size: int) -> TokenMask:
        """The mask allowing exactly ``ids`` (each in ``range(size)``).

        Packed by the native ``bitset`` kernel where it is built, else with NumPy (the twin:
        the same words)."""
        arr = ids.astype(np.int64, copy=False) if isinstance(ids, np.ndarray) \
            else np.fromiter(ids, dtype=np.int64)
        native = _native.load("bitset")
        if native is not None and arr.ndim == 1:
            return cls(native.pack_ids(np.ascontiguousarray(arr), size), size)
        bits = np.zeros(((size + 31) // 32) * 32, dtype=bool)
        if arr.size:
            if arr.min() < 0 or arr.max() >= size:
                raise ValueError("token id outside the vocabulary")
            bits[arr] = True
        return cls(np.packbits(bits, bitorder="little").view(np.uint32).copy(), size)

    @classmethod
    def empty(cls, size: int) -> TokenMask:
        """The mask allowing nothing."""
        return cls(np.zeros((size + 31) // 32, dtype=np.uint32), size)

    def __contains__(self, token_id: object) -> bool:
        if not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < self.size:
            return False
        return bool((int(self.words[token_id >> 5]) >> (token_id & 31)) & 1)

    def to_bool(self) -> np.ndarray:
        """A read-only ``bool`` array of length ``size``: ``True`` where allowed."""
        bits = np.unpackbits(self.words.view(np.uint8), bitorder="little")[: self.size]
        out = bits.astype(bool)
        out.setflags(write=False)
        return out

    def ids(self) -> np.ndarray:
        """The allowed ids, ascending."""
        return np.flatnonzero(self.to_bool())

    def count(self) -> int:
        """How many ids are allowed."""
        if self._count is None:
            self._count = int(np.unpackbits(self.words.view(np.uint8)).sum())
        return self._count

    def __or__(self, other: TokenMask) -> TokenMask:
        self._check_same_size(other)
        return TokenMask(self.words | other.words, self.size)

    def __and__(self, other: TokenMask) -> TokenMask:
        self._check_same_size(other)
        return TokenMask(self.words & other.words, self.size)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TokenMask)
            and self.size == other.size
            and bool(np.array_equal(self.words, other.words))
        )

    def __hash__(self) -> int:
        return hash((self.size, self.words.tobytes()))

    def __repr__(self) -> str:
        return f"TokenMask({self.count()} of {self.size} allowed)"

    def _check_same_size(self, other: TokenMask) -> None:
        if self.size != other.size:
            raise ValueError(f"mask sizes differ: {self.size} vs {other.size}")


@runtime_checkable
class Constraint(Protocol):
    """A compiled, immutable token-level constraint (see the module docstring).

    Every method is pure and thread-safe; ``allowed`` is memoized per state. A constraint
    whose masks are costly may also offer ``known_allowed(state) -> TokenMask | None`` (the
    mask if already computed): drafters then avoid computing masks of draft nodes that
    decoding may never reach (:func:`structspec.spec.forced.cheap_allowed`).
    """

    @property
    def initial(self) -> State:
        """The state before any token."""
        ...

    @property
    def vocab_size(self) -> int:
        """The number of ids a mask of this constraint covers."""
        ...

    def advance(self, state: State, token: int) -> State | None:
        """The state after ``token``, or ``None`` if ``token`` is illegal in ``state``."""
        ...

    def allowed(self, state: State) -> TokenMask:
        """The ids legal in ``state`` (EOS included exactly when ``state`` accepts)."""
        ...

    def is_accepting(self, state: State) -> bool:
        """Whether the text so far is a complete, valid output."""
        ...

    def forced(self, state: State) -> bytes:
        """Bytes every valid continuation from ``state`` must emit next (maybe ``b""``)."""
        ...


def walk(
    constraint: Constraint, token_ids: Sequence[int], state: State | None = None
) -> State | None:
    """Advance ``constraint`` through ``token_ids`` from ``state`` (default: initial).

    Returns the final state, or ``None`` at the first illegal token. Pure.
    """
    s = constraint.initial if state is None else state
    for t in token_ids:
        s = constraint.advance(s, t)
        if s is None:
            return None
    return s


def accepts(constraint: Constraint, token_ids: Sequence[int]) -> bool:
    """Whether ``token_ids`` is a complete output the constraint accepts. Pure."""
    s = walk(constraint, token_ids)
    return s is not None and constraint.is_accepting(s)
