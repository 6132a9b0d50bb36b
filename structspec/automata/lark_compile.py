"""``compile_grammar``: a Lark grammar -> :class:`LarkConstraint`, the public face.

The constraint follows :mod:`structspec.automata.base`'s contract (states are ints; EOS is
allowed exactly in accepting states; special tokens never). On top of it, for code
completion:

- :meth:`LarkConstraint.state_after` parses the text above the cursor and returns the
  state to constrain the completion from (``tolerant=True`` falls back to a parser-free,
  lexer-only state when the prefix does not parse);
- :meth:`LarkConstraint.with_suffix` gives a constraint whose accepting states are those
  where prefix + completion + suffix parses (fill-in-the-middle), at a chosen stopping
  point (``"eof"``: anywhere; ``"line"``: the completion ends a line — its last byte is
  ``\\n``, or the suffix starts a new line — and once the completion has ended a line
  where the text parses, it stops there: only EOS follows; ``"statement"``/``"block"``:
  the completion ends where the statement or block holding the cursor ends, see
  :mod:`.lark_stops`); its masks drop the tokens after which no continuation can be
  accepted, where ``_dead`` is certain of it (see ``docs/lark_grammars.md``, dead ends).

The tolerant state (``state_after(..., tolerant=True)`` on a prefix that does not parse):
lexing restarts at the beginning of the line where parsing failed and runs over *every*
terminal of the grammar with no parser; a token is allowed when it keeps the text
lexically valid (every lexeme completes as some terminal), any state between lexemes is
accepting, and nothing is forced. The state is a normal state of the same constraint.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from structspec.automata.base import TokenMask
from structspec.automata.cache import CompileCache
from structspec.automata.lark_constraint import FREE, LINE_END, LarkRuntime
from structspec.automata.lark_grammar import IndenterSpec, LoadedGrammar, load_grammar
from structspec.automata.lark_stops import (
    CONSTRUCT_STOPS,
    ConstructStops,
    Key,
    construct_rules,
    construct_terminators,
)
from structspec.automata.limits import Limits, check_input_size, compiling
from structspec.errors import GrammarError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from structspec.vocab import Vocabulary

STOPS = ("eof", "line", *CONSTRUCT_STOPS)

HORIZON = 16
"""How many tokens ahead a fill-in-the-middle view looks for dead ends (see ``_dead``)."""

NARROW = 64
"""A state with more legal tokens than this is never expanded by the dead-end search."""

NEAR_BLOCK = 6
"""``block`` views look for tokens that close the cursor's block behind code (``}``, a
dedent inside a token) only where the parser stack is at most this many entries above the
cursor's: deeper, such a token closes an inner construct first (the search is skipped, not
wrong: pruning less is always sound)."""


#: All 256 bytes, those that most often follow in code and text first (see
#: :meth:`LarkConstraint._only_byte`).
_BYTE_ORDER: tuple[int, ...] = tuple(dict.fromkeys(
    b" \n(e)t,a:.s=ri_nol'\"d[cpf]mu0g1hy-b2x{}+*v/k#wj<>qz3456789" + bytes(range(256))))


class LarkConstraint:
    """A token-level constraint for a Lark LALR(1) grammar (see :mod:`.lark_constraint`).

    Immutable from the outside and thread-safe; states are ints, state 0 is never returned.
    ``with_suffix`` views share the memo tables of the constraint they come from.
    """

    def __init__(self, runtime: LarkRuntime, suffix: bytes = b"", stop: str = "eof",
                 initial: int | None = None) -> None:
        if stop not in STOPS:
            raise ValueError(f"stop must be one of {STOPS}, got {stop!r}")
        self._rt = runtime
        self.suffix = suffix
        self.stop = stop
        self._initial = runtime.initial if initial is None else initial
        self._accepting: dict[int, bool] = {}
        self._allowed: dict[int, TokenMask] = {}
        self._forced: dict[int, bytes] = {}
        self._tokens = runtime.vocab.tokens
        self._eos = runtime.vocab.eos_token_ids
        self._special = runtime.vocab.special_token_ids
        self._steps: dict[tuple[int, int], int] = {}
        # Dead-end pruning: only in a view that accepts less than the grammar, and only for
        # grammars without %ignore (after an ignorable separator more text can always
        # follow, so no state is ever a dead end of the grammar itself; see ``_dead``).
        self._prune = (bool(suffix) or stop != "eof") and not runtime.g.ignore
        self._dead_memo: dict[tuple[int, int], bool] = {}
        self._byte_tokens_memo: list[tuple[int, int]] | None = None

    # -- the constraint protocol --------------------------------------------------------------

    @property
    def initial(self) -> int:
        """The state before any token (the start of the text, or ``state_after``'s)."""
        return self._initial

    @property
    def vocab_size(self) -> int:
        """The number of ids a mask covers."""
        return len(self._rt.vocab)

    @property
    def grammar(self) -> LoadedGrammar:
        """The loaded grammar (lark's parser included, as ``grammar.lark``)."""
        return self._rt.g

    def advance(self, state: int, token: int) -> int | None:
        """The state after ``token``, ``None`` if illegal; EOS keeps an accepting state."""
        ck = (state, token)
        got = self._steps.get(ck)
        if got is None:
            if token in self._eos:
                got = state if self.is_accepting(state) else 0
            elif not 0 <= token < len(self._tokens) or token in self._special \
                    or not self._tokens[token] or self._final(state):
                got = 0
            else:
                got = self._step_view(state, self._tokens[token])
            self._steps[ck] = got
        return got or None

    def allowed(self, state: int) -> TokenMask:
        """The ids legal in ``state`` (EOS exactly when accepting); memoized per state."""
        got = self._allowed.get(state)
        if got is None and self._final(state):  # the completion ends here: EOS only
            got = TokenMask.from_ids(np.fromiter(sorted(self._eos), dtype=np.int64),
                                     len(self._rt.vocab))
            self._allowed[state] = got
        if got is None:
            got = self._grammar_mask(state)
            if self._prune:
                got = self._drop_dead_ends(state, got)
            if self.is_accepting(state) and self._eos:
                eos = np.fromiter(sorted(self._eos), dtype=np.int64)
                got = got | TokenMask.from_ids(eos, got.size)
            self._allowed[state] = got
        return got

    def known_allowed(self, state: int) -> TokenMask | None:
        """:meth:`allowed` if it has been computed for ``state`` already, else ``None``.
        A mask of a code grammar costs milliseconds; drafters that only want to know whether
        a draft node allows a single token ask this and fall back to cheaper checks
        (:func:`structspec.spec.forced.forced_tokens`)."""
        return self._allowed.get(state)

    def is_accepting(self, state: int) -> bool:
        """Whether the output may stop here: the text (+ suffix) is a complete program, at
        the chosen stopping point."""
        got = self._accepting.get(state)
        if got is None:
            rs = self._rstate(state)
            end = self._rt.step_bytes(rs, self.suffix) if self.suffix else rs
            got = bool(end) and self._rt.accepts_eof(end) and self._stop_ok(state)
            self._accepting[state] = got
        return got

    # -- hooks a view with its own states overrides (here: view state = runtime state) -----

    def _rstate(self, state: int) -> int:
        """The runtime state of ``state``."""
        return state

    def _grammar_mask(self, state: int) -> TokenMask:
        """The tokens the grammar allows in ``state`` (before dead-end pruning)."""
        return self._rt.mask(state)

    def _step_view(self, state: int, data: bytes) -> int:
        """The state after ``data`` (0: illegal)."""
        return self._rt.step_bytes(state, data)

    def _step1(self, state: int, b: int) -> int:
        """The state after byte ``b`` (0: illegal)."""
        return self._rt.step_byte(state, b)

    def _drop_dead_ends(self, state: int, mask: TokenMask) -> TokenMask:
        """``mask`` less the tokens after which no continuation can reach acceptance (as far
        as ``_dead`` can tell): a state with many legal tokens is only checked one token
        ahead, a narrow one ``HORIZON`` tokens ahead."""
        ids = mask.ids()
        depth = HORIZON if len(ids) <= NARROW else 0
        dead = [t for t in ids.tolist() if self._dead(self._step_token(state, t), depth)]
        if not dead:
            return mask
        keep = np.setdiff1d(ids, np.asarray(dead, dtype=ids.dtype))
        return TokenMask.from_ids(keep, mask.size)

    def _step_token(self, state: int, token: int) -> int:
        ck = (state, token)
        got = self._steps.get(ck)
        if got is None:
            got = self._step_view(state, self._tokens[token])
            self._steps[ck] = got
        return got

    def _byte_tokens(self) -> list[tuple[int, int]]:
        """(byte, id) of the one-byte tokens; built on the first dead-end search (a scan of
        the vocabulary: ~35 ms for 49k tokens, not paid by views that never prune)."""
        got = self._byte_tokens_memo
        if got is None:
            got = [(tok[0], i) for i, tok in enumerate(self._tokens)
                   if len(tok) == 1 and i not in self._special and i not in self._eos]
            self._byte_tokens_memo = got
        return got

    def _dead(self, state: int, depth: int) -> bool:
        """Whether no text of at most ``depth`` more tokens leads from ``state`` to an
        accepting state of this view, and every such text ends where the grammar allows no
        token at all. ``True`` only when certain (a state with more than ``NARROW`` legal
        tokens counts as live beyond depth 0). A pure function of (state, depth): the same
        mask whatever was asked before. Memoized."""
        ck = (state, depth)
        got = self._dead_memo.get(ck)
        if got is None:
            got = self._dead_uncached(state, depth)
            self._dead_memo[ck] = got
        return got

    def _dead_uncached(self, state: int, depth: int) -> bool:
        if not state:
            return False
        step = self._step1
        rs = self._rstate(state)
        if any(step(state, b) for b, _ in self._byte_tokens()):
            if depth == 0:  # a one-byte token is legal: the grammar mask is not empty
                return False
            mask = self._rt.mask(rs)
        else:
            mask = self._rt.mask(rs)
            if depth == 0 and mask.count():
                return False
        if self.is_accepting(state):
            return False
        ids = mask.ids()
        if not len(ids):
            return True
        if depth == 0 or len(ids) > NARROW:
            return False
        return all(self._dead(self._step_token(state, t), depth - 1) for t in ids.tolist())

    def _final(self, state: int) -> bool:
        """``stop="line"``: the completion has just ended a line and the text (+ suffix)
        parses — the completion stops here (nothing but EOS may follow). Never the
        initial state: a prefix that ends a line does not end the (empty) completion."""
        return self.stop == "line" and state != self._initial \
            and self._rt.key(state)[5] == LINE_END and self.is_accepting(state)

    def _stop_ok(self, state: int) -> bool:
        if self.stop == "eof":
            return True
        return self._rt.key(state)[5] == LINE_END or self.suffix[:1] in (b"\n", b"\r")

    def forced(self, state: int) -> bytes:
        """Bytes every valid continuation from ``state`` must emit next (maybe ``b""``)."""
        got = self._forced.get(state)
        if got is None:
            out = bytearray()
            s = state
            for _ in range(256):
                if self.is_accepting(s):
                    break
                only = self._only_byte(s)
                if only is None:
                    break
                out.append(only)
                s = self._step1(s, only)
            got = bytes(out)
            self._forced[state] = got
        return got

    def _only_byte(self, state: int) -> int | None:
        """The one byte legal in ``state``, or ``None`` (none, or several). Stops at the
        second legal byte, trying the likeliest first: where text is free (most states of
        code) that answers in a few byte steps instead of 256, and the drafters ask this of
        every node they add."""
        only = None
        for b in _BYTE_ORDER:
            if self._step1(state, b):
                if only is not None:
                    return None
                only = b
        return only

    # -- code completion --------------------------------------------------------------------

    def state_after(self, prefix: str | bytes, *, tolerant: bool = False,
                    state: int | None = None) -> int:
        """The state after ``prefix`` (the text above the cursor), from ``state`` (default:
        the start of the text). Pure.

        Raises:
            GrammarError: ``prefix`` is not the start of any valid program (with the
                line/column of the first byte that cannot continue it), unless
                ``tolerant`` (then: the lexer-only fallback state, see the module doc).
        """
        data = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        s = self._initial if state is None else state
        for i, b in enumerate(data):
            nxt = self._step1(s, b)
            if not nxt:
                if tolerant:
                    return self._tolerant_state(data, i)
                line = data.count(b"\n", 0, i) + 1
                col = len(data[data.rfind(b"\n", 0, i) + 1:i].decode(errors="replace")) + 1
                raise GrammarError(f"the text does not parse here: {_context(data, i)}", line,
                                   col)
            s = nxt
        return s

    def _tolerant_state(self, data: bytes, failed_at: int) -> int:
        line_start = data.rfind(b"\n", 0, failed_at) + 1
        s = self._rt.step_bytes(self._rt.free_initial, data[line_start:])
        return self._from_runtime(s or self._rt.free_initial)

    def _from_runtime(self, rs: int) -> int:
        """The state of runtime state ``rs`` (a view with states of its own: the cursor
        being there)."""
        return rs

    def is_tolerant(self, state: int) -> bool:
        """Whether ``state`` is in the parser-free fallback mode."""
        return self._rt.key(self._rstate(state))[2] == FREE

    def with_suffix(self, suffix: str | bytes = b"", *, stop: str = "eof",
                    prefix: str | bytes | None = None, tolerant: bool = False,
                    stop_rules: str | Iterable[str] | None = None) -> LarkConstraint:
        """A view of this constraint for fill-in-the-middle: accepting only where the text
        so far + ``suffix`` parses, at the stopping point ``stop``:

        - ``"eof"``: anywhere;
        - ``"line"``: at a line end (module doc); the first one where it parses is final;
        - ``"statement"``: where the statement holding the cursor (or the one the output
          began) ends; final where that end is certain (``x = 1\\n``);
        - ``"block"``: where the block holding the cursor ends (Python: the suffix dedents
          after the output; braces: the output's ``}``); see :mod:`.lark_stops`.

        With ``prefix``, its initial state is ``state_after(prefix)``; the cursor is
        there. ``stop_rules`` names the statement or block rules (default: the grammar's
        ``stop_statement=``/``stop_block=`` options, see :mod:`structspec.grammars`).
        Its ``allowed`` drops tokens that lead only to dead ends (``_drop_dead_ends``).
        Shares the grammar's memo tables; pure.

        Raises:
            ValueError: ``stop`` is not one of ``STOPS``.
            GrammarError: ``prefix`` does not parse (not ``tolerant``); the grammar has no
                rule for ``stop`` (JSON has no statements; SQL no blocks), or a name in
                ``stop_rules`` is not one of its rules.
        """
        if stop not in STOPS:
            raise ValueError(f"stop must be one of {', '.join(STOPS)}, got {stop!r}")
        if stop_rules is not None and stop not in CONSTRUCT_STOPS:
            raise ValueError(f"stop_rules needs stop='statement' or 'block', not {stop!r}")
        data = suffix.encode() if isinstance(suffix, str) else bytes(suffix)
        start = self._initial if prefix is None else self.state_after(prefix,
                                                                      tolerant=tolerant)
        start = self._rstate(start)
        if stop in CONSTRUCT_STOPS:
            rules = construct_rules(self._rt.g, stop, stop_rules)
            stops = ConstructStops(self._rt, stop, rules, data,
                                   construct_terminators(self._rt.g, stop))
            return _ConstructView(self._rt, data, stop, start, stops)
        return LarkConstraint(self._rt, data, stop, start)

    def state_count(self) -> int:
        """How many states have been interned so far (for budgets and stats)."""
        return self._rt.n_states()


class _ConstructView(LarkConstraint):
    """A ``with_suffix`` view for ``stop="statement"``/``"block"``: its states are ints of
    its own for (runtime state, cursor bookkeeping) (:data:`.lark_stops.Key`), interned
    per view; masks come from the runtime state, acceptance and finality from
    :class:`.lark_stops.ConstructStops`. Thread-safe as the base (dicts only grow)."""

    def __init__(self, runtime: LarkRuntime, suffix: bytes, stop: str, start: int,
                 stops: ConstructStops) -> None:
        self._stops = stops
        self._keys: list[Key] = [(0, 0, False, False, False, False, False, False)]  # 0 = dead
        self._ids: dict[Key, int] = {}
        self._lock = threading.Lock()
        self._bytes1: dict[tuple[int, int], int] = {}
        self._final_memo: dict[int, bool] = {}
        self._doomed_memo: dict[int, bool] = {}
        super().__init__(runtime, suffix, stop, 0)
        self._initial = self._intern(stops.start(start))

    def _intern(self, key: Key | None) -> int:
        if key is None:
            return 0
        got = self._ids.get(key)
        if got is None:
            with self._lock:
                got = self._ids.get(key)
                if got is None:
                    got = len(self._keys)
                    self._keys.append(key)
                    self._ids[key] = got
        return got

    def _from_runtime(self, rs: int) -> int:
        return self._intern(self._stops.start(rs))

    def _rstate(self, state: int) -> int:
        return self._keys[state][0]

    def _grammar_mask(self, state: int) -> TokenMask:
        """The runtime's mask, less (``block``) the tokens after which the block holding the
        cursor is closed behind code of C: a line dedented out of it
        (``ConstructStops.dedent_drop``), and, near the block's level, the candidate tokens
        (``}``, a newline then code) whose successor ``_doomed`` says never accepts."""
        mask = self._rt.mask(self._rstate(state))
        stops = self._stops
        cands = stops.candidates()
        if cands is None:
            return mask
        drop = stops.dedent_drop(self._keys[state])
        words = mask.words & ~drop.words if drop is not None else mask.words
        rs, anchor = self._keys[state][:2]
        stack = self._rt.key(rs)[2]
        if stack >= 0 and self._rt.stacks.depth(stack) <= anchor + NEAR_BLOCK:
            near = _word_ids(words & cands.words)
            dead = [t for t in near if (nxt := self._step_token(state, t)) and self._doomed(nxt)]
            if dead:
                words = words & ~TokenMask.from_ids(dead, mask.size).words
        return mask if words is mask.words else TokenMask(words, mask.size)

    def _doomed(self, state: int) -> bool:
        """Whether no continuation from ``state`` accepts, as ``ConstructStops`` can tell."""
        got = self._doomed_memo.get(state)
        if got is None:
            key = self._keys[state]
            got = self._stops.doomed(key)
            if got is None:  # a closer ends C: dead if the block surely ends and S misfits
                got = not self.is_accepting(state) and self._stops.certain(key)
            self._doomed_memo[state] = got
        return got

    def _step_view(self, state: int, data: bytes) -> int:
        return self._intern(self._stops.step(self._keys[state], data))

    def _step1(self, state: int, b: int) -> int:
        ck = (state, b)
        got = self._bytes1.get(ck)
        if got is None:
            got = self._step_view(state, bytes((b,)))
            self._bytes1[ck] = got
        return got

    def _stop_ok(self, state: int) -> bool:
        return self._stops.accepting(self._keys[state])

    def _final(self, state: int) -> bool:
        """Accepting, and the end is certain (``ConstructStops.certain``): EOS only."""
        got = self._final_memo.get(state)
        if got is None:
            got = self.is_accepting(state) and self._stops.certain(self._keys[state])
            self._final_memo[state] = got
        return got

    def state_count(self) -> int:
        """How many view states have been interned so far."""
        return len(self._keys)


def _word_ids(words: np.ndarray) -> list[int]:
    """The ids set in a packed bitset (``TokenMask.words``), reading only its non-zero
    words (cheap when few are set)."""
    out = []
    for w in np.flatnonzero(words).tolist():
        bits = int(words[w])
        while bits:
            low = bits & -bits
            out.append(32 * w + low.bit_length() - 1)
            bits ^= low
    return out


def _context(data: bytes, i: int) -> str:
    line_start = data.rfind(b"\n", 0, i) + 1
    line_end = data.find(b"\n", i)
    line = data[line_start:line_end if line_end >= 0 else len(data)]
    return repr(line.decode(errors="replace")[:120])


def compile_grammar(grammar: str | os.PathLike[str], vocab: Vocabulary, *,
                    start: str | None = None, postlex: IndenterSpec | str | Any | None = "auto",
                    keywords: str = "reserved", limits: Limits | None = None) -> LarkConstraint:
    """Compile a Lark grammar into a token-level constraint for ``vocab``.

    Args:
        grammar: Lark grammar text, or a path to a ``.lark`` file.
        vocab: the tokenizer's vocabulary.
        start: the start rule (default: the grammar's ``// structspec: start=NAME``
            header comment, else ``"start"``).
        postlex: the indentation postlexer: ``"auto"`` (the header's ``postlex=``, else
            Python's when the grammar ``%declare``\\ s ``_INDENT`` and ``_DEDENT``),
            ``"python"``, ``None``, an :class:`IndenterSpec` or a lark ``Indenter``.
        keywords: ``"reserved"`` (default): a string terminal that a regex terminal of
            equal priority also matches (``"or"`` and ``NAME``) is lexed the same in
            every context, as Python's tokenizer does: ``or`` is always the keyword and
            ``indexes`` always one ``NAME`` (never ``in`` + ``dexes``); soft keywords are
            the grammar's business (``name: NAME | "match"``). ``"contextual"``: exactly
            lark's contextual lexer, where ``or`` is a ``NAME`` wherever the parser does
            not expect the keyword, and ``indexes`` may split where it expects ``in``.
        limits: budgets of this compilation (:class:`~structspec.automata.limits.Limits`:
            terminal automaton states and bytes, seconds, grammar size); defaults if ``None``.

    Returns:
        An immutable, thread-safe :class:`LarkConstraint` (lazy: masks are built on use).
        Cached: the same grammar, options and vocabulary give the same object (in memory),
        and the loaded grammar is kept in the disk compile cache.

    Raises:
        GrammarError: the grammar does not load, is not LALR(1), or has a terminal our
            DFA compiler refuses; the error carries line/column where known.
        ResourceLimitError: the compilation exceeds ``limits``.
    """
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a structspec.Limits, not {type(limits).__name__}")

    def build() -> LarkConstraint:
        with compiling(limits, "compiling the grammar"):
            if isinstance(grammar, str) and "\n" in grammar:
                check_input_size(grammar, "the grammar")
            return LarkConstraint(LarkRuntime(
                load_grammar(grammar, start=start, postlex=postlex), vocab, keywords))

    if not isinstance(postlex, (str, IndenterSpec)) and postlex is not None:
        return build()  # a lark Indenter object: no stable cache key
    source = os.fspath(grammar) if isinstance(grammar, os.PathLike) else grammar
    try:
        mtime = os.stat(source).st_mtime_ns if "\n" not in source else 0
    except OSError:
        mtime = 0
    # (IndenterSpec.tabs is runtime-only, so not in its repr, but it changes the constraint)
    key = (source, mtime, start, repr(postlex), getattr(postlex, "tabs", None), keywords,
           limits, vocab.fingerprint)
    return _COMPILED.get_or_compile(key, build)


_COMPILED: CompileCache[LarkConstraint] = CompileCache(maxsize=16)
"""Compiled grammars by (text or path + mtime, options, vocabulary): repeated calls share
one constraint and therefore its memo tables."""


__all__ = ["LarkConstraint", "compile_grammar"]
