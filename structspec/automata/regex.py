"""Regular expression -> token-level constraint.

A regex is a one-terminal grammar: its byte DFA (:mod:`.dfa`) runs under the same
token-level runtime as JSON Schemas and Lark grammars (:mod:`.grammar`), so masks are
exact (tokens that pass through a non-accepting state after an accepting one included —
outlines-core 0.2.14's ``Index`` drops those) and memoized per state.

Syntax is Python's ``re`` (whole-text match), with ASCII ``\\d``/``\\w`` and ECMA-262
``.``; look-arounds, back-references and flags are refused with :class:`GrammarError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from structspec.automata.base import TokenMask
from structspec.automata.dfa import ByteDFA, compile_dfa, literal_dfa, product, trimmed
from structspec.automata.grammar import GrammarConstraint
from structspec.automata.grammar_ir import GrammarBuilder, opt, term
from structspec.automata.limits import Limits, check_input_size, compiling
from structspec.errors import VocabularyError

if TYPE_CHECKING:
    from structspec.vocab import Vocabulary


def spellable(dfa: ByteDFA, vocab: Vocabulary) -> ByteDFA:
    """``dfa`` restricted to the bytes some token of ``vocab`` contains."""
    present = np.zeros(256, dtype=bool)
    for t in vocab.tokens:
        if t:
            present[np.frombuffer(t, dtype=np.uint8)] = True
    table = np.where(present[None, :], dfa.table, 0).astype(np.int32)
    return trimmed(table, dfa.accepting.copy(), dfa.start)


class RegexConstraint:
    """Outputs that match a regular expression in full, token by token.

    Args:
        pattern: the regex (Python ``re`` syntax, see the module docstring).
        vocab: the vocabulary the masks are for.

    Raises:
        GrammarError: the pattern does not parse or uses an unsupported construct.
        VocabularyError: the vocabulary cannot spell any text the pattern matches.
        ResourceLimitError: the automaton exceeds ``limits`` (states, bytes, seconds).

    Immutable and thread-safe; states are small ints.
    """

    def __init__(self, pattern: str, vocab: Vocabulary, limits: Limits | None = None) -> None:
        self.pattern = pattern
        self.vocab = vocab
        with compiling(limits, "compiling the regex"):
            check_input_size(pattern, "the regex")
            self._build(pattern, vocab)

    def _build(self, pattern: str, vocab: Vocabulary) -> None:
        dfa = compile_dfa(pattern)
        if spellable(dfa, vocab).is_empty():
            raise VocabularyError(
                f"no text matching {pattern[:80]!r} can be spelled with this vocabulary"
            )
        b = GrammarBuilder()
        if dfa.accepting[dfa.start]:  # terminals are non-empty: the empty match is optional
            nonempty = product(dfa, literal_dfa(b""), "minus")
            body = opt(term(b.terminal(nonempty, "regex"))) if not nonempty.is_empty() \
                else None
        else:
            body = term(b.terminal(dfa, "regex"))
        if body is None:  # the pattern matches only the empty string
            raise VocabularyError(f"regex {pattern!r} matches only the empty string")
        self._inner = GrammarConstraint(b.build(b.rule("regex", body)), vocab)

    @property
    def initial(self) -> int:
        """The state before any token."""
        return self._inner.initial

    @property
    def vocab_size(self) -> int:
        """The number of ids a mask covers."""
        return len(self.vocab)

    def advance(self, state: int, token: int) -> int | None:
        """The state after ``token`` or ``None`` if it is illegal; EOS keeps an accepting state."""
        return self._inner.advance(state, token)

    def allowed(self, state: int) -> TokenMask:
        """The legal ids in ``state``; memoized."""
        return self._inner.allowed(state)

    def is_accepting(self, state: int) -> bool:
        """Whether the text so far matches the whole pattern."""
        return self._inner.is_accepting(state)

    def forced(self, state: int) -> bytes:
        """The bytes every continuation from ``state`` starts with; memoized."""
        return self._inner.forced(state)

    def memo_size(self) -> int:
        """How much has been memoized (see the disk cache)."""
        return self._inner.memo_size()


def compile_regex(pattern: str, vocab: Vocabulary, *,
                  limits: Limits | None = None) -> RegexConstraint:
    """Compile ``pattern`` into a token-level constraint for ``vocab``.

    The whole output must match (an implicit ``^...$``). Pure; the result is immutable and
    thread-safe.

    Raises:
        GrammarError: the pattern is not a valid regular expression.
        VocabularyError: the vocabulary cannot spell any text the pattern matches.
        ResourceLimitError: the automaton exceeds ``limits`` (states, bytes, seconds).
    """
    from structspec.errors import GrammarError

    if not isinstance(pattern, str) or not pattern:
        raise GrammarError("the regex pattern must be a non-empty string")
    return RegexConstraint(pattern, vocab, limits)
