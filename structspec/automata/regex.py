"""Regular expression -> token automaton, through outlines-core's ``Index``.

outlines-core builds, for one regex and one vocabulary, the token-level DFA (which tokens
keep the text inside the language and where they land) in Rust; that is what it does well,
so we use it for the regular pieces. On top of it this module adds what the constraint
contract needs: all EOS ids of the vocabulary (outlines-core knows one), special tokens kept
out, masks memoized per state as packed bitsets, and ``forced`` text.

States are the integers of the outlines-core index. Instances are immutable after
construction and thread-safe (memo tables only grow, and dict updates are atomic in CPython).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from structspec.automata.base import TokenMask
from structspec.errors import GrammarError, VocabularyError

if TYPE_CHECKING:
    from structspec.vocab import Vocabulary

_OC_VOCABS: dict[str, object] = {}
_OC_VOCABS_LOCK = threading.Lock()


def outlines_vocabulary(vocab: Vocabulary) -> object:
    """The outlines-core ``Vocabulary`` for ``vocab`` (built once per fingerprint).

    Special and empty tokens are left out; the smallest EOS id stands for all of them.
    """
    from outlines_core import Vocabulary as OCVocabulary

    key = vocab.fingerprint
    with _OC_VOCABS_LOCK:
        oc = _OC_VOCABS.get(key)
        if oc is None:
            mapping: dict[bytes, list[int]] = {}
            for i, t in enumerate(vocab.tokens):
                if t and i not in vocab.special_token_ids:
                    mapping.setdefault(t, []).append(i)
            oc = OCVocabulary(min(vocab.eos_token_ids), mapping)
            _OC_VOCABS[key] = oc
    return oc


class RegexConstraint:
    """Outputs that match a regular expression (whole-text match), token by token.

    Args:
        pattern: the regex, in the syntax of Rust's ``regex`` crate (outlines-core).
        vocab: the vocabulary the masks are for.

    Raises:
        GrammarError: the pattern does not parse.
        VocabularyError: no token sequence of ``vocab`` can spell some required text.
    """

    def __init__(self, pattern: str, vocab: Vocabulary) -> None:
        from outlines_core import Index

        self.pattern = pattern
        self.vocab = vocab
        try:
            self._index = Index(pattern, outlines_vocabulary(vocab))
        except ValueError as exc:
            message = str(exc)
            if "incompatible" in message or "vocabulary" in message.lower():
                raise VocabularyError(f"regex {pattern[:80]!r}: {message}") from exc
            raise GrammarError(f"invalid regular expression {pattern[:80]!r}: {message}") from exc
        self._oc_eos = min(vocab.eos_token_ids)
        self._eos = np.fromiter(sorted(vocab.eos_token_ids), dtype=np.int64)
        self._masks: dict[int, TokenMask] = {}
        self._forced: dict[int, bytes] = {}
        self._initial: int = self._index.get_initial_state()

    @property
    def initial(self) -> int:
        """The state before any token."""
        return self._initial

    @property
    def vocab_size(self) -> int:
        """The number of ids a mask covers."""
        return len(self.vocab)

    def advance(self, state: int, token: int) -> int | None:
        """The state after ``token`` or ``None`` if it is illegal; EOS keeps an accepting state."""
        if token in self.vocab.eos_token_ids:
            return state if self._index.is_final_state(state) else None
        if token in self.vocab.special_token_ids:
            return None
        return self._index.get_next_state(state, token)

    def allowed(self, state: int) -> TokenMask:
        """The legal ids in ``state``; memoized."""
        mask = self._masks.get(state)
        if mask is None:
            ids = np.asarray(self._index.get_allowed_tokens(state) or [], dtype=np.int64)
            if self._index.is_final_state(state):
                ids = np.concatenate([ids[ids != self._oc_eos], self._eos])
            else:
                ids = ids[ids != self._oc_eos]
            mask = TokenMask.from_ids(ids, len(self.vocab))
            self._masks[state] = mask
        return mask

    def is_accepting(self, state: int) -> bool:
        """Whether the text so far matches the whole pattern."""
        return bool(self._index.is_final_state(state))

    def forced(self, state: int) -> bytes:
        """The bytes every continuation from ``state`` starts with; memoized.

        Follows single-option stretches: while the state does not accept and all legal tokens
        share a common byte prefix ``p``, ``p`` is forced; if some token spells exactly ``p``
        the walk continues from where it lands.
        """
        cached = self._forced.get(state)
        if cached is not None:
            return cached
        out = bytearray()
        s: int | None = state
        seen: set[int] = set()
        while s is not None and s not in seen and not self.is_accepting(s):
            seen.add(s)
            ids = self.allowed(s).ids()
            if ids.size == 0:
                break
            prefix = _common_prefix([self.vocab.tokens[i] for i in ids])
            if not prefix:
                break
            out += prefix
            exact = [i for i in self.vocab.ids_for(prefix) if i in self.allowed(s)]
            s = self.advance(s, exact[0]) if exact else None
        result = bytes(out)
        self._forced[state] = result
        return result


def _common_prefix(items: list[bytes]) -> bytes:
    """The longest common prefix of byte strings (``b""`` for an empty list)."""
    if not items:
        return b""
    lo, hi = min(items), max(items)
    n = 0
    for a, b in zip(lo, hi):
        if a != b:
            break
        n += 1
    return lo[:n]


def compile_regex(pattern: str, vocab: Vocabulary) -> RegexConstraint:
    """Compile ``pattern`` into a token-level constraint for ``vocab``.

    The whole output must match (an implicit ``^...$``). Pure; the result is immutable and
    thread-safe.

    Raises:
        GrammarError: the pattern is not a valid regular expression.
        VocabularyError: the vocabulary cannot spell some text the pattern requires.
    """
    if not isinstance(pattern, str) or not pattern:
        raise GrammarError("the regex pattern must be a non-empty string")
    return RegexConstraint(pattern, vocab)
