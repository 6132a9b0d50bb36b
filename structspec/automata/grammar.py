"""The token-level pushdown constraint that runs a grammar (:mod:`.grammar_ir`).

Runtime (a recursive transition network): a *configuration* is "inside terminal ``t`` at
DFA state ``q``, and when ``t`` ends, continue at the return stack ``k``"; a constraint
state is the interned set of configurations that are still possible (several only where
the grammar is ambiguous at this point). Bytes step configurations; when a terminal can
end, the stack predicts the next terminals. Every step is memoized, so a state is a small
int, ``advance`` is pure, and repeated contexts cost a dictionary lookup.

Masks follow XGrammar's split. For a configuration inside terminal ``t`` at ``q``, one
vectorized walk of the whole vocabulary through ``t``'s DFA (memoized per ``(t, q)``)
yields the tokens that stay inside ``t`` — legal whatever the context — and the few
tokens that may end ``t`` midway (``",``, ``"}``, ``},{``…). Only those are checked
against the stack, byte by byte. Tokens cross lexeme boundaries exactly when the text
they spell is legal.

Invariant that makes "alive" mean "completable": every terminal DFA is trimmed, every
terminal is non-empty, and rule NFAs keep only states from which the rule can finish
through productive symbols.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

from structspec.automata.base import TokenMask
from structspec.automata.dfa import ByteDFA
from structspec.automata.grammar_ir import (
    EMPTY,
    Expr,
    Grammar,
    GrammarBuilder,
    GrammarLimits,
    Rule,
    alt,
    current_grammar_limits,
    opt,
    ref,
    rep,
    seq,
    term,
)
from structspec.automata.token_walk import (
    VocabWalk,
    first_bytes,
    native_walker,
    token_table,
    token_trie,
    walk_vocabulary,
)
from structspec.errors import GrammarError, ResourceLimitError

if TYPE_CHECKING:
    from structspec.vocab import Vocabulary


# -- the runtime constraint ----------------------------------------------------------------------

_END = (-1, 0, 0)  # the configuration "the whole output is complete"


@dataclass
class _Memo:
    states: list[frozenset[tuple[int, int, int]]] = field(default_factory=list)
    state_ids: dict[frozenset[tuple[int, int, int]], int] = field(default_factory=dict)
    stacks: list[tuple[int, int, int]] = field(default_factory=list)  # (rule, rstate, parent)
    stack_ids: dict[tuple[int, int, int], int] = field(default_factory=dict)
    depths: list[int] = field(default_factory=list)  # frames below each stack
    completions: dict[int, frozenset[tuple[int, int, int]]] = field(default_factory=dict)
    byte_steps: dict[tuple[int, int], int] = field(default_factory=dict)
    token_steps: dict[tuple[int, int], int] = field(default_factory=dict)
    masks: dict[int, TokenMask] = field(default_factory=dict)
    accepting: dict[int, bool] = field(default_factory=dict)
    forced: dict[int, bytes] = field(default_factory=dict)
    walks: dict[tuple[int, int], VocabWalk] = field(default_factory=dict)
    follow: dict[int, int] = field(default_factory=dict)
    crossing: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict)
    token_words: dict[int, np.ndarray] = field(default_factory=dict)
    live_first: dict[int, np.ndarray] = field(default_factory=dict)
    row_bits: dict[tuple[int, int], int] = field(default_factory=dict)
    stack_bits: dict[int, int] = field(default_factory=dict)
    closures: dict[tuple[int, int], tuple[tuple[tuple[int, int], ...], bool]] = field(
        default_factory=dict)


class GrammarConstraint:
    """A token-level constraint for a :class:`Grammar` (see the module docstring).

    States are ints; state 0 is dead (never returned by ``advance``, which returns ``None``).
    Thread-safe: memo tables only grow; interning is locked.
    """

    def __init__(self, grammar: Grammar, vocab: Vocabulary,
                 limits: GrammarLimits | None = None) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self.limits = limits or current_grammar_limits()
        self._lock = threading.RLock()
        self._memo = _Memo()
        self._tables = [d.table for d in grammar.terminals]
        self._acc = [d.accepting for d in grammar.terminals]
        self._eos = np.fromiter(sorted(vocab.eos_token_ids), dtype=np.int64)
        self._intern_state(frozenset())  # 0 = dead
        self._stack_id((-1, -1, -1))  # 0 = bottom of every stack
        start = frozenset(self._predict(grammar.start, grammar.rules[grammar.start].start, 0))
        self._initial = self._intern_state(start)
        if self._initial == 0:
            raise GrammarError("the grammar derives no complete output")

    # -- protocol ----------------------------------------------------------------------------

    @property
    def initial(self) -> int:
        """The state before any token."""
        return self._initial

    @property
    def vocab_size(self) -> int:
        """The number of ids a mask covers."""
        return len(self.vocab)

    def advance(self, state: int, token: int) -> int | None:
        """The state after ``token``, ``None`` if illegal; EOS keeps an accepting state."""
        key = (state, token)
        got = self._memo.token_steps.get(key)
        if got is None:
            if token in self.vocab.eos_token_ids:
                got = state if self.is_accepting(state) else 0
            elif not 0 <= token < len(self.vocab) or token in self.vocab.special_token_ids:
                got = 0
            else:
                got = self.step_bytes(state, self.vocab.tokens[token])
            self._memo.token_steps[key] = got
        return got or None

    def allowed(self, state: int) -> TokenMask:
        """The ids legal in ``state`` (EOS when accepting); memoized per state."""
        mask = self._memo.masks.get(state)
        if mask is None:
            mask = self._compute_mask(state)
            self._memo.masks[state] = mask
        return mask

    def is_accepting(self, state: int) -> bool:
        """Whether the text so far is a complete output."""
        got = self._memo.accepting.get(state)
        if got is None:
            got = any(self._can_end(c) for c in self._memo.states[state])
            self._memo.accepting[state] = got
        return got

    def forced(self, state: int) -> bytes:
        """Bytes every continuation from ``state`` must emit next; memoized."""
        got = self._memo.forced.get(state)
        if got is None:
            out = bytearray()
            s = state
            for _ in range(4096):
                if s == 0 or self.is_accepting(s):
                    break
                live = self._live_bytes(s)
                if len(live) != 1:
                    break
                out.append(live[0])
                s = self.step_bytes(s, bytes(live))
            got = bytes(out)
            self._memo.forced[state] = got
        return got

    def state_count(self) -> int:
        """How many states have been interned so far (for budgets and stats)."""
        return len(self._memo.states)

    def memo_size(self) -> int:
        """How much has been memoized (masks and token steps): the disk cache rewrites an
        entry once this grows."""
        return len(self._memo.masks) + len(self._memo.token_steps)

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        del state["_lock"]  # locks do not pickle; the memo tables do (the disk cache)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        for f in fields(_Memo):  # a memo pickled by an older version lacks the newer tables
            if not hasattr(self._memo, f.name):
                assert callable(f.default_factory)  # every table has one
                setattr(self._memo, f.name, f.default_factory())

    # -- bytes ---------------------------------------------------------------------------------

    def step_bytes(self, state: int, data: bytes) -> int:
        """The state after ``data`` (0 if it is illegal). Pure; memoized per byte."""
        steps = self._memo.byte_steps
        for b in data:
            if state == 0:
                return 0
            nxt = steps.get((state, b))
            if nxt is None:
                nxt = self._step(state, b)
                steps[(state, b)] = nxt
            state = nxt
        return state

    def _step(self, state: int, b: int) -> int:
        out: set[tuple[int, int, int]] = set()
        tables, acc = self._tables, self._acc
        for cfg in self._memo.states[state]:
            tid, q, k = cfg
            if tid < 0:
                continue
            q2 = int(tables[tid][q, b])
            if q2:
                out.add((tid, q2, k))
            if acc[tid][q]:
                for nt, nq, nk in self._complete(k):
                    if nt < 0:
                        continue
                    q3 = int(tables[nt][nq, b])
                    if q3:
                        out.add((nt, q3, nk))
        if len(out) > self.limits.max_configs:
            raise ResourceLimitError(
                f"grammar state has over {self.limits.max_configs} configurations "
                "(the grammar is too ambiguous here)"
            )
        return self._intern_state(frozenset(out))

    def _live_bytes(self, state: int) -> list[int]:
        live: set[int] = set()
        for tid, q, k in self._memo.states[state]:
            if tid < 0:
                continue
            live.update(np.flatnonzero(self._tables[tid][q]).tolist())
            if self._acc[tid][q]:
                for nt, nq, _ in self._complete(k):
                    if nt >= 0:
                        live.update(np.flatnonzero(self._tables[nt][nq]).tolist())
            if len(live) > 1:
                break
        return sorted(live)

    # -- the pushdown part ---------------------------------------------------------------------

    def _stack_id(self, frame: tuple[int, int, int]) -> int:
        got = self._memo.stack_ids.get(frame)
        if got is None:
            with self._lock:
                got = self._memo.stack_ids.get(frame)
                if got is None:
                    depth = self._memo.depths[frame[2]] + 1 if self._memo.stacks else 0
                    if depth > self.limits.max_depth:
                        return -1  # too deep: the caller drops this continuation
                    got = len(self._memo.stacks)
                    self._memo.stacks.append(frame)
                    self._memo.depths.append(depth)
                    self._memo.stack_ids[frame] = got
        return got

    def _intern_state(self, configs: frozenset[tuple[int, int, int]]) -> int:
        got = self._memo.state_ids.get(configs)
        if got is None:
            with self._lock:
                got = self._memo.state_ids.get(configs)
                if got is None:
                    if len(self._memo.states) >= self.limits.max_states:
                        raise ResourceLimitError(
                            f"constraint exceeds {self.limits.max_states} states"
                        )
                    got = len(self._memo.states)
                    self._memo.states.append(configs)
                    self._memo.state_ids[configs] = got
        return got

    def _closure(self, rule_id: int, rstate: int) -> tuple[tuple[tuple[int, int], ...], bool]:
        """The edges ``(symbol, target)`` leaving the epsilon closure of ``(rule, rstate)``
        and whether the closure may accept. Memoized per constraint: it depends on the rule
        alone, while ``_predict`` runs once per new return stack and recomputed it each time
        (a third of its own time under cProfile, MaskBench 800)."""
        key = (rule_id, rstate)
        got = self._memo.closures.get(key)
        if got is None:
            rule = self.grammar.rules[rule_id]
            seen = {rstate}
            todo = [rstate]
            while todo:
                s = todo.pop()
                for t in rule.eps[s]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            edges = tuple(e for s in seen for e in rule.edges[s])
            got = (edges, any(s in rule.accept for s in seen))
            self._memo.closures[key] = got
        return got

    def _predict(self, rule_id: int, rstate: int, parent: int,
                 depth: int = 0) -> set[tuple[int, int, int]]:
        """Configurations starting the next terminal from rule position ``(rule, rstate)``
        with return stack ``parent``; ``_END`` when the whole output may end here."""
        if depth > self.limits.max_depth:
            raise ResourceLimitError(
                f"grammar nesting exceeds depth {self.limits.max_depth} (or is left-recursive)"
            )
        edges, accepts = self._closure(rule_id, rstate)
        out: set[tuple[int, int, int]] = set()
        terminals, rules, stack_id = self.grammar.terminals, self.grammar.rules, self._stack_id
        for sym, t in edges:
            # Nesting beyond ``limits.max_depth`` is not offered (narrowing, documented).
            frame = stack_id((rule_id, t, parent))
            if frame < 0:
                continue
            if sym >= 0:
                out.add((sym, terminals[sym].start, frame))
            else:
                callee = -sym - 1
                out |= self._predict(callee, rules[callee].start, frame, depth + 1)
        if accepts:
            got = self._memo.completions.get(parent)
            out |= got if got is not None else self._complete(parent, depth + 1)
        return out

    def _complete(self, stack: int, depth: int = 0) -> frozenset[tuple[int, int, int]]:
        """What may follow once the current terminal (or rule) ends, with ``stack`` on top."""
        got = self._memo.completions.get(stack)
        if got is None:
            if stack == 0:
                got = frozenset({_END})
            else:
                rule_id, rstate, parent = self._memo.stacks[stack]
                got = frozenset(self._predict(rule_id, rstate, parent, depth))
            self._memo.completions[stack] = got
        return got

    def _can_end(self, cfg: tuple[int, int, int]) -> bool:
        tid, q, k = cfg
        if tid < 0:
            return True
        return bool(self._acc[tid][q]) and _END in self._complete(k)

    # -- masks -----------------------------------------------------------------------------------

    def _walk(self, tid: int, q: int) -> VocabWalk:
        """The vocabulary walk through terminal ``tid`` from ``q`` (see :class:`VocabWalk`)."""
        key = (tid, q)
        got = self._memo.walks.get(key)
        if got is None:
            # The walk depends on the DFA and the vocabulary only: share it across grammars.
            dfa = self.grammar.terminals[tid]
            trie = token_trie(self.vocab)
            shared_key = ("trie-walk", self.vocab.fingerprint, dfa.walk_key(q, trie.max_len))
            got = dfa.memo.get(shared_key)  # type: ignore[assignment]
            if got is None:
                # Per-first-byte parts pay for the NumPy walk where states differ after a few
                # first bytes only (products such as "a key other than these"); a structured
                # DFA has its own sharing (``walk_key``) and would only keep the parts in
                # memory. The native walk is faster without them (MaskBench 300: mask CPU
                # 1.55 -> 1.14 s, p99 540 -> 330 us): gluing parts costs more than walking.
                native = native_walker(self._tables[tid], self._acc[tid]) is not None
                subtrees = None if native or type(dfa).walk_key is not ByteDFA.walk_key else \
                    dfa.memo.setdefault(("trie-subtrees", self.vocab.fingerprint), {})
                got = walk_vocabulary(trie, self.vocab, self._tables[tid], self._acc[tid], q,
                                      subtrees)  # type: ignore[arg-type]
                dfa.memo[shared_key] = got
            self._memo.walks[key] = got
        return got

    def _follow(self, stack: int) -> int:
        """The state "a terminal starts here" once the current one ends with ``stack`` on
        top (the completions, interned)."""
        got = self._memo.follow.get(stack)
        if got is None:
            got = self._intern_state(self._complete(stack))
            self._memo.follow[stack] = got
        return got

    def _crossing(self, tid: int, q: int, k: int) -> np.ndarray:
        """Ids of the tokens that end terminal ``tid`` midway (from ``q``) and whose remainder
        is legal after it, with return stack ``k``.

        Memoized per ``(tid, q, k)`` and, underneath, per ``(tid, q, follow state)``: the
        result depends on what may follow only, and distinct return stacks often complete
        alike (the same member list inside different parents), so their remainders are
        checked once."""
        key = (tid, q, k)
        got = self._memo.crossing.get(key)
        if got is None:
            walk = self._walk(tid, q)
            if walk.cand_ids.size:
                follow = self._follow(k)
                fkey = (tid, q, -1 - follow)  # follow-state keys: negative, beside stack keys
                got = self._memo.crossing.get(fkey)
                if got is None:
                    first = walk.rem_first if walk.rem_first is not None \
                        else first_bytes(walk.remainders)  # a walk from an older cache
                    # Most remainders die at their first byte: only the others step the
                    # runtime.
                    legal = self._live_first(follow)[first]  # [R]
                    remainders, step = walk.remainders, self.step_bytes
                    for i in np.flatnonzero(legal).tolist():
                        legal[i] = step(follow, remainders[i]) != 0
                    got = walk.cand_ids[legal[walk.cand_rem]]
                    self._memo.crossing[fkey] = got
            else:
                got = walk.cand_ids
            self._memo.crossing[key] = got
        return got

    def _live_first(self, state: int) -> np.ndarray:
        """``bool [257]``: the bytes that may come first in ``state`` (the tables' rows of its
        configurations and, where a terminal may end, of what follows), and at 256 whether
        ``state`` is alive (the empty text is legal). Memoized; the result is read-only."""
        got = self._memo.live_first.get(state)
        if got is None:
            # The rows of the configurations, and the first bytes of what follows once per
            # distinct return stack (ambiguous states hold ~1,500 configurations over a few
            # stacks: iterating each one's completions took most of their mask time).
            rows: set[tuple[int, int]] = set()
            stacks: set[int] = set()
            acc = self._acc
            for tid, q, k in self._memo.states[state]:
                if tid < 0:
                    continue
                rows.add((tid, q))
                if acc[tid][q]:
                    stacks.add(k)
            bits = 1 << 256 if state != 0 else 0  # bit 256: alive
            for tid, q in rows:
                bits |= self._row_bits(tid, q)
            for k in stacks:
                bits |= self._stack_bits(k)
            got = np.unpackbits(np.frombuffer(bits.to_bytes(33, "little"), dtype=np.uint8),
                                bitorder="little")[:257].astype(bool)
            got.setflags(write=False)
            self._memo.live_first[state] = got
        return got

    def _stack_bits(self, k: int) -> int:
        """The bytes that may come first once a terminal ends with return stack ``k`` (the
        rows of its completions), as a 256-bit int; memoized per stack."""
        got = self._memo.stack_bits.get(k)
        if got is None:
            got = 0
            for nt, nq in {(nt, nq) for nt, nq, _ in self._complete(k) if nt >= 0}:
                got |= self._row_bits(nt, nq)
            self._memo.stack_bits[k] = got
        return got

    def _row_bits(self, tid: int, q: int) -> int:
        """The bytes with a transition from ``q`` in terminal ``tid``, as a 256-bit int
        (memoized per constraint: follow states share their rows)."""
        got = self._memo.row_bits.get((tid, q))
        if got is None:
            live = np.asarray(self._tables[tid][q]) != 0  # [256]
            got = int.from_bytes(np.packbits(live, bitorder="little").tobytes(), "little")
            self._memo.row_bits[(tid, q)] = got
        return got

    def _token_words(self, state: int) -> np.ndarray:
        """The mask words of the tokens legal in ``state`` (EOS aside); memoized.

        A state is a union of configurations, so its tokens are the union of each one's:
        those inside its terminal, those crossing the terminal's end midway (checked by
        their remainder against what follows), and — when the terminal may end right here —
        the tokens of what follows."""
        got = self._memo.token_words.get(state)
        if got is None:
            # Configurations of one state often share their DFA position (tid, q) or their
            # follow state (the same value inside different parents, overlapping anyOf
            # branches): each walk, crossing set and follow state is ORed in once.
            got = np.zeros((len(self.vocab) + 31) // 32, dtype=np.uint32)
            extra: dict[int, np.ndarray] = {}
            walked: set[tuple[int, int]] = set()
            followed: set[int] = set()
            acc = self._acc
            for tid, q, k in self._memo.states[state]:
                if tid < 0:
                    continue
                if (tid, q) not in walked:
                    walked.add((tid, q))
                    got |= self._walk(tid, q).words
                crossing = self._crossing(tid, q, k)
                if crossing.size:
                    extra[id(crossing)] = crossing  # memoized arrays: alive, ids unique
                if acc[tid][q]:
                    follow = self._follow(k)
                    if follow not in followed:
                        followed.add(follow)
                        got |= self._token_words(follow)
            if extra:
                got |= TokenMask.from_ids(np.concatenate(list(extra.values())),
                                          len(self.vocab)).words
            got.setflags(write=False)
            self._memo.token_words[state] = got
        return got

    def _compute_mask(self, state: int) -> TokenMask:
        mask = TokenMask(self._token_words(state), len(self.vocab))
        if self.is_accepting(state):
            mask = mask | TokenMask.from_ids(self._eos, len(self.vocab))
        return mask


def compile_grammar_ir(grammar: Grammar, vocab: Vocabulary,
                       limits: GrammarLimits | None = None) -> GrammarConstraint:
    """Wrap a built :class:`Grammar` as a token-level constraint for ``vocab``."""
    return GrammarConstraint(grammar, vocab, limits)


__all__: Sequence[str] = [
    "EMPTY", "Expr", "Grammar", "GrammarBuilder", "GrammarConstraint", "GrammarLimits", "Rule",
    "alt", "compile_grammar_ir", "opt", "ref", "rep", "seq", "term", "token_table",
]
