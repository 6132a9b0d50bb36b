"""A combined, lazily built lexer DFA over many terminals, with lark's contextual choice.

Every terminal is a trimmed :class:`.dfa.ByteDFA`. A lexer state is the interned tuple of
``(terminal part, dfa state)`` pairs still alive for the current lexeme — a subset
construction over the terminals, built row by row on first use and stored in one growing
``int32 [n, 256]`` table, so a whole vocabulary can be walked through it with numpy.

Start states are per *terminal set*: like lark's ``ContextualLexer`` the set is what the
parser accepts in its current state plus the ``%ignore``d terminals (and the postlexer's
always-accepted newline). Semantics are **maximal munch without backtracking**: a lexeme
ends exactly when the next byte cannot extend it; if it dies in a non-accepting state the
text is an error. When several terminals accept the lexeme, the winner is the one lark's
lexer would produce: highest priority; at equal priority a string literal before a regex
(lark's ``UnlessCallback`` turns ``NAME "return"`` into ``RETURN``, while ``returnx`` stays
one ``NAME``); then lark's own order (longer max width, longer pattern, name).

Because every terminal DFA is trimmed, every terminal in a live state can still be reached:
``terms(s)`` is the set of terminals the lexeme may still become.

``%ignore``d lexemes change nothing in the parser, so the lexeme after one starts from the
*same* start set: when the winner of a state is an ignored terminal, the bytes that cannot
extend it continue from the state's start state (an "absorbed" boundary). Tokens such as
`` foo`` or ``  return`` then stay inside the lexer DFA — decided without the parser, the
way most BPE tokens with a leading space should be. A state remembers its start state
(only where an ignored terminal is still alive in it; other states are shared).

State 0 is dead. Thread-safe: tables only grow; growth is locked.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from structspec import _native
from structspec.automata.dfa import ByteDFA

if TYPE_CHECKING:
    from structspec.automata.token_walk import TokenTable


PENDING, INSIDE, CROSS, DEAD = 0, 1, 2, 3
"""Outcomes of :meth:`ContextualLexer.walk_rows` (and of the ``lark_walk`` kernel)."""


@dataclass(frozen=True)
class TerminalSpec:
    """One lexer terminal: its name, DFA and lark's tie-breaking attributes.

    ``extra``: more DFAs whose union with ``dfa`` is the terminal's language — a terminal
    too large for one DFA (``STRING: _STR | _FSTR | ...``) is kept as its alternatives,
    and the lexer's lazy subset construction unites them only where text goes.
    """

    name: str
    dfa: ByteDFA
    priority: int = 0
    is_string: bool = False
    max_width: int = 0
    pattern_len: int = 0
    extra: tuple[ByteDFA, ...] = ()

    @property
    def parts(self) -> tuple[ByteDFA, ...]:
        """Every DFA of the terminal."""
        return (self.dfa, *self.extra)

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` is in the terminal's language."""
        return any(d.matches(data) for d in self.parts)


@dataclass(frozen=True)
class TokenWalk:
    """Where every vocabulary token goes from one lexer state (rows of a token table).

    ``inside``: rows whose whole text stays inside the current lexeme, with their end
    states. ``cross``: rows whose lexeme ends after ``k >= 1`` bytes (the lexeme was
    accepting at ``state`` and byte ``k`` could not extend it); the rest of the token
    starts the next lexeme. Rows dying in a non-accepting state are absent (illegal), and
    rows whose first byte cannot extend the lexeme are left to the caller.
    """

    inside_rows: np.ndarray  # [I]
    inside_states: np.ndarray  # [I]
    cross_rows: np.ndarray  # [C]
    cross_k: np.ndarray  # [C]
    cross_states: np.ndarray  # [C]


class ContextualLexer:
    """The combined lexer DFA over ``terminals`` (see the module docstring)."""

    def __init__(self, terminals: list[TerminalSpec], absorb: frozenset[int] = frozenset()
                 ) -> None:
        self.terminals = terminals
        self.absorb = absorb
        order = sorted(range(len(terminals)), key=lambda i: (
            -terminals[i].priority, not terminals[i].is_string, -terminals[i].max_width,
            -terminals[i].pattern_len, terminals[i].name))
        self._rank = [0] * len(terminals)
        for r, i in enumerate(order):
            self._rank[i] = r
        # Components are (part, DFA state); a part is one DFA of one terminal.
        parts = [(tid, d) for tid, t in enumerate(terminals) for d in t.parts]
        self._part_tid = [tid for tid, _ in parts]
        self._part_rank = [0] * len(parts)
        self._parts_of: list[list[int]] = [[] for _ in terminals]
        for pid, (tid, _) in enumerate(parts):
            self._parts_of[tid].append(pid)
        self._tables = [d.table for _, d in parts]
        self._accepting = [d.accepting for _, d in parts]
        self._starts_of = [d.start for _, d in parts]
        self._lock = threading.RLock()
        self._comps: list[tuple[tuple[int, int], ...]] = [()]
        self._line_end: dict[int, bool] = {}
        self._origin: list[int] = [0]  # the start state each state's lexeme began at
        self._ids: dict[tuple[int, tuple[tuple[int, int], ...]], int] = {(0, ()): 0}
        self._absorbed: dict[int, np.ndarray] = {}  # [256] bool: boundary absorbed
        self._table = np.zeros((64, 256), dtype=np.int32)  # grows; rows valid when expanded
        self._expanded = np.zeros(64, dtype=bool)
        self._expanded[0] = True
        self.winner_arr = np.full(64, -1, dtype=np.int32)  # [n] winning terminal or -1
        self._terms: list[int] = [0]  # bitmask of terminals per state
        self._starts: dict[frozenset[int], int] = {}
        self._start_set: set[int] = set()
        self._walks: dict[int, TokenWalk] = {}
        self._first_walks: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}

    # -- states ---------------------------------------------------------------------------

    def _intern(self, comps: tuple[tuple[int, int], ...], origin: int) -> int:
        if not comps:
            return 0
        if origin >= 0 and not any(self._part_tid[p] in self.absorb for p, _ in comps):
            origin = -2  # no ignored lexeme can end here: the start state does not matter
        got = self._ids.get((origin, comps))
        if got is None:
            got = len(self._comps)
            if got >= self._table.shape[0]:
                n = self._table.shape[0] * 2
                table = np.zeros((n, 256), dtype=np.int32)
                table[:got] = self._table[:got]
                expanded = np.zeros(n, dtype=bool)
                expanded[:got] = self._expanded[:got]
                winner = np.full(n, -1, dtype=np.int32)
                winner[:got] = self.winner_arr[:got]
                self._table, self._expanded, self.winner_arr = table, expanded, winner
            self._comps.append(comps)
            self._origin.append(got if origin == -1 else max(origin, 0))
            self._ids[(origin, comps)] = got
            best, best_rank, bits = -1, 1 << 30, 0
            for pid, q in comps:
                tid = self._part_tid[pid]
                bits |= 1 << tid
                if self._accepting[pid][q] and self._rank[tid] < best_rank:
                    best, best_rank = tid, self._rank[tid]
            self.winner_arr[got] = best
            self._terms.append(bits)
        return got

    def start(self, terminal_ids: frozenset[int]) -> int:
        """The start state for a lexeme that may be any terminal of ``terminal_ids``."""
        got = self._starts.get(terminal_ids)
        if got is None:
            with self._lock:
                comps = tuple(sorted((p, self._starts_of[p]) for t in terminal_ids
                                     for p in self._parts_of[t] if self._starts_of[p]))
                got = self._intern(comps, -1)
                self._start_set.add(got)
                self._starts[terminal_ids] = got
        return got

    def is_start(self, state: int) -> bool:
        """Whether ``state`` begins a lexeme (nothing pending)."""
        return state in self._start_set

    def winner(self, state: int) -> int:
        """The terminal the lexeme becomes if it ends in ``state``, or ``-1``."""
        return int(self.winner_arr[state])

    def terms(self, state: int) -> int:
        """Bitmask of the terminals the lexeme may still become."""
        return self._terms[state]

    def only_line_end(self, state: int) -> bool:
        """Whether the lexeme in ``state`` can go on only with ``\r`` or ``\n``: just after
        the ``\\`` of an explicit line join (inside a string or a comment a backslash can
        be followed by more). Memoized."""
        got = self._line_end.get(state)
        if got is None:
            comps = self._comps[state]
            got = bool(comps) and all(
                not np.delete(self._tables[pid][q], (10, 13)).any() for pid, q in comps)
            self._line_end[state] = got
        return got

    def component(self, state: int, terminal: int) -> int:
        """The DFA state of ``terminal`` inside lexer ``state`` (0 when it is not alive)."""
        for pid, q in self._comps[state]:
            if self._part_tid[pid] == terminal:
                return q
        return 0

    def expand(self, states: np.ndarray) -> np.ndarray:
        """Make sure the rows of ``states`` exist; returns the current table ``[n, 256]``."""
        if self._expanded[states].all():
            return self._table
        todo = [int(s) for s in np.unique(states) if not self._expanded[s]]
        if todo:
            with self._lock:
                for s in todo:
                    if not self._expanded[s]:
                        self._expand_one(s)
        return self._table

    def _expand_one(self, s: int) -> None:
        comps = self._comps[s]
        origin = self._origin[s]
        tids = [tid for tid, _ in comps]
        m = np.ascontiguousarray(np.stack([self._tables[tid][q] for tid, q in comps]).T,
                                 dtype=np.int32)  # [256, C]
        # The distinct columns, by their bytes (np.unique(axis=0) costs ~10x more).
        keys = m.view(np.dtype((np.void, 4 * len(comps)))).reshape(-1)  # [256]
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        cols = m[first]  # [U, C]
        ids = np.zeros(len(cols), dtype=np.int32)
        for u, col in enumerate(cols.tolist()):
            nxt = tuple((tid, q) for tid, q in zip(tids, col) if q)
            ids[u] = self._intern(nxt, origin)
        row = ids[inverse.reshape(-1)]
        if self.winner_arr[s] >= 0 and int(self.winner_arr[s]) in self.absorb:
            if not self._expanded[origin]:
                self._expand_one(origin)
            absorbed = (row == 0) & (self._table[origin] != 0)
            row = np.where(absorbed, self._table[origin], row)
            self._absorbed[s] = absorbed
        self._table[s] = row
        self._expanded[s] = True

    def absorbs(self, state: int, byte: int) -> bool:
        """Whether ``byte`` ends ``state``'s ignored lexeme and starts the next one."""
        got = self._absorbed.get(state)
        return bool(got[byte]) if got is not None else False

    def step(self, state: int, byte: int) -> int:
        """The state after one byte (0 when the lexeme cannot take it)."""
        if not self._expanded[state]:
            self.expand(np.array([state]))
        return int(self._table[state, byte])

    def n_states(self) -> int:
        """How many lexer states exist so far."""
        return len(self._comps)

    # -- vocabulary walks ------------------------------------------------------------------

    def walk(self, state: int, tt: TokenTable) -> TokenWalk:
        """Walk every token of ``tt`` from ``state`` at once (see :class:`TokenWalk`).
        Memoized per state.

        The tokens are walked per first byte ``b`` from the state ``b`` leads to
        (:meth:`_walk_first`, memoized per that pair): lexer states that agree on where a
        byte leads share that part of the walk — every start state that allows a name
        sends each letter to the same state, and most of the vocabulary starts with one.
        """
        got = self._walks.get(state)
        if got is not None:
            return got
        table = self.expand(np.array([state]))
        row = table[state]
        parts = [self._walk_first(tt, b, int(row[b])) for b in np.flatnonzero(row).tolist()]
        if parts:
            got = TokenWalk(*(np.concatenate([p[i] for p in parts]) for i in range(5)))
        else:
            empty = np.zeros(0, dtype=np.int64)
            got = TokenWalk(empty, empty.astype(np.int32), empty, empty,
                            empty.astype(np.int32))
        self._walks[state] = got
        return got

    def _walk_first(self, tt: TokenTable, b: int, s1: int) -> tuple[np.ndarray, ...]:
        """The part of a vocabulary walk (:class:`TokenWalk`'s five arrays) of the tokens
        whose first byte ``b`` has led to lexer state ``s1``. Memoized per ``(b, s1)``."""
        key = (b, s1)
        got = self._first_walks.get(key)
        if got is None:
            rows = tt.first_rows[b].astype(np.int64)
            # Walked from their second byte; the lexeme began one byte earlier, so a
            # row that dies at that second byte in an accepting state crosses there
            # (the walk takes the start offset as the lexeme's beginning).
            status, pos, ends = self.walk_rows(tt, rows, np.ones(rows.size, dtype=np.int64),
                                               np.full(rows.size, s1, dtype=np.int32))
            if self.winner_arr[s1] >= 0:
                status[(status == DEAD) & (pos == 1)] = CROSS
            inside, cross = status == INSIDE, status == CROSS
            got = (rows[inside], ends[inside], rows[cross], pos[cross], ends[cross])
            self._first_walks[key] = got
        return got

    def walk_rows(self, tt: TokenTable, rows: np.ndarray, offs: np.ndarray,
                  states: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Walk token rows ``rows`` of ``tt`` from byte ``offs[i]`` in lexer state
        ``states[i]``, each until its bytes run out (``INSIDE``), its lexeme ends before
        a byte after the first (``CROSS``: the lexeme accepts and the byte cannot extend
        it) or it dies (``DEAD``). Returns ``(status int8, pos int64, state int32)`` per
        row: where each ended (the byte that ended or killed it; the state there). The
        native kernel ``lark_walk`` when built, else :meth:`_walk_rows_numpy` (the same
        arrays). Grows the table as the walk goes; pure otherwise."""
        native = _native.load("lark_walk")
        if native is None:
            return self._walk_rows_numpy(tt, rows, offs, states)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        offs = np.ascontiguousarray(offs, dtype=np.int64)
        pos = offs.copy()
        ends = np.array(states, dtype=np.int32)
        status = np.zeros(rows.size, dtype=np.int8)
        idx = None  # after the first round: the rows still pending, walked on their own
        while rows.size:
            with self._lock:  # growth swaps the three arrays together
                expanded, table, winner = self._expanded, self._table, self.winner_arr
            if idx is None:
                pending = native.walk(table, expanded, winner, tt.data, tt.lengths, rows,
                                      offs, pos, ends, status)
            else:
                sub = [a[idx] for a in (rows, offs, pos, ends, status)]
                pending = native.walk(table, expanded, winner, tt.data, tt.lengths, *sub)
                pos[idx], ends[idx], status[idx] = sub[2], sub[3], sub[4]
            if not pending:
                break
            idx = np.flatnonzero(status == PENDING)
            self.expand(ends[idx])
        return status, pos, ends

    def _walk_rows_numpy(self, tt: TokenTable, rows: np.ndarray, offs: np.ndarray,
                         states: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The NumPy twin of the ``lark_walk`` kernel (see :meth:`walk_rows`): all rows
        one byte per round."""
        rows = np.asarray(rows, dtype=np.int64)
        offs = np.asarray(offs, dtype=np.int64)
        status = np.zeros(rows.size, dtype=np.int8)
        pos = offs.copy()
        ends = np.array(states, dtype=np.int32)
        lengths = tt.lengths[rows]
        act = np.arange(rows.size)
        while act.size:
            p, s = pos[act], ends[act]
            done = p >= lengths[act]
            if done.any():
                status[act[done]] = INSIDE
                act, p, s = act[~done], p[~done], s[~done]
                if not act.size:
                    break
            table = self.expand(s)
            nxt = table[s, tt.data[rows[act], p]]
            dead = nxt == 0
            if dead.any():
                gone = act[dead]
                cross = (self.winner_arr[s[dead]] >= 0) & (p[dead] > offs[gone])
                status[gone] = np.where(cross, CROSS, DEAD)
                live = ~dead
                act, p, nxt = act[live], p[live], nxt[live]
            pos[act] = p + 1
            ends[act] = nxt
        return status, pos, ends


__all__ = ["CROSS", "DEAD", "INSIDE", "PENDING", "ContextualLexer", "TerminalSpec", "TokenWalk"]
