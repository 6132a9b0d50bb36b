"""The token-level constraint of a Lark grammar: our lexer DFA + lark's LALR(1) tables.

A state is an interned int for the value ``(lexer state, indent, stack, paren level,
indent levels, after newline)``: the pending lexeme's combined-DFA state, the columns
after its last ``\\n`` (only while it may still become the indenter's newline, since the
width decides INDENT/DEDENT), the interned LALR stack (:mod:`.lalr`), the postlexer's
bracket depth and block levels, and whether the last byte was ``\\n`` (for the ``"line"``
stopping point). ``advance`` is pure; everything is memoized.

**Semantics.** Maximal munch without backtracking, lark's contextual lexer choice
(:mod:`.lexer`), lark's ``Indenter`` (:mod:`.lark_grammar`), exact LALR reductions. A
pending lexeme is alive when one of the terminals it may still become can be fed to the
parser (for the newline terminal: when some reachable final indentation is valid). At end
of input the pending lexeme ends, a final newline is implied if the text needs one, every
open block is closed, and the parser must accept ``$END``.

**Masks, the XGrammar way.** From a lexer state, the vocabulary is walked once through the
lexer DFA (numpy, memoized per lexer state). Tokens that stay inside the lexeme are grouped
by the terminals their end state may still become: one bit test per group against the
parser's viable terminals decides each group. Tokens that end the lexeme midway are
grouped by (end state, rest of the token) and each group is checked exactly (end the
lexeme, feed the parser, step the rest). When the lexeme may end right here, the tokens
whose first byte cannot extend it are exactly the mask of the state after ending it,
masked by those first bytes. Whole masks are memoized per state.

**Documented dead ends** (allowed tokens after which no completion exists): two lexemes
that maximal munch would merge and that nothing (no ``%ignore``d separator) can split;
a terminal whose every string is claimed by a higher-priority terminal.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from structspec.automata.base import TokenMask
from structspec.automata.grammar import token_table
from structspec.automata.lalr import ParserStacks
from structspec.automata.lexer import ContextualLexer

if TYPE_CHECKING:
    from structspec.automata.lark_grammar import LoadedGrammar
    from structspec.vocab import Vocabulary

FREE = -2  # stack value of the tolerant, parser-free mode
_SCALAR_ROWS = 48  # below this many rows, rests of tokens are stepped byte by byte
_Key = tuple[int, int, int, int, tuple[int, ...], bool]


class LarkRuntime:
    """The shared, growing memo of one compiled grammar for one vocabulary.

    Thread-safe: tables only grow; interning is locked.
    """

    def __init__(self, g: LoadedGrammar, vocab: Vocabulary) -> None:
        self.g = g
        self.vocab = vocab
        self.lex = ContextualLexer(list(g.terminals))
        self.stacks = ParserStacks(g.tables)
        self.tt = token_table(vocab)
        self._lock = threading.RLock()
        self._keys: list[_Key] = [(0, 0, -1, 0, (), False)]  # 0 = dead
        self._ids: dict[_Key, int] = {}
        self._bytes: dict[tuple[int, int], int] = {}
        self._masks: dict[tuple, TokenMask] = {}
        self._eof: dict[int, bool] = {}
        self._ends: dict[int, int] = {}
        self._viable: dict[tuple[int, int, tuple[int, ...]], int] = {}
        self._nl_levels: dict[tuple[int, tuple[int, ...]], tuple[frozenset[int], bool]] = {}
        self._nl_reach: dict[tuple[int, int, frozenset[int], bool, int], bool] = {}
        self._starts: dict[int, int] = {}
        self._cands: dict[int, list[tuple[int, int]]] = {}
        self._groups: dict[int, tuple] = {}
        pl = g.postlex
        names = [t.name for t in g.terminals]
        self.nl = names.index(pl.nl_type) if pl else -1
        self.nl_bit = (1 << self.nl) if pl else 0
        idx = g.tables.index
        self.p_indent = idx.get(pl.indent_type, -1) if pl else -1
        self.p_dedent = idx.get(pl.dedent_type, -1) if pl else -1
        self.opens = frozenset(i for i, n in enumerate(names) if pl and n in pl.open_paren_types)
        self.closes = frozenset(i for i, n in enumerate(names)
                                if pl and n in pl.close_paren_types)
        self.tab_len = pl.tab_len if pl else 8
        self.ignore_bits = sum(1 << i for i in g.ignore)
        self.free_start = self.lex.start(frozenset(range(len(g.terminals))))
        self._token_effects()
        self.eos = np.fromiter(sorted(vocab.eos_token_ids), dtype=np.int64)
        self.initial = self.intern((self.start_lexer(0), 0, 0, 0, (0,), False))
        self.free_initial = self.intern((self.free_start, 0, FREE, 0, (0,), False))

    # -- state values ------------------------------------------------------------------------

    def intern(self, key: _Key) -> int:
        """The int of the state value ``key``."""
        got = self._ids.get(key)
        if got is None:
            with self._lock:
                got = self._ids.get(key)
                if got is None:
                    got = len(self._keys)
                    self._keys.append(key)
                    self._ids[key] = got
        return got

    def key(self, state: int) -> _Key:
        """The value of state ``state``."""
        return self._keys[state]

    def start_lexer(self, stack: int) -> int:
        """The lexer start state for the parser stack ``stack`` (lark's contextual set)."""
        if stack == FREE:
            return self.free_start
        top = self.stacks.top(stack)
        got = self._starts.get(top)
        if got is None:
            acts = self.g.tables.actions[top]
            ids = {i for i, p in enumerate(self.g.parser_index) if p >= 0 and p in acts}
            ids |= set(self.g.ignore)
            if self.nl >= 0:
                ids.add(self.nl)
            got = self.lex.start(frozenset(ids))
            self._starts[top] = got
        return got

    def _token_effects(self) -> None:
        """Per token row: does it hold a ``\\n``, and the columns after its last one (or in
        all of it) — what the token does to a pending newline lexeme's indentation."""
        tt = self.tt
        data, lengths = tt.data, tt.lengths
        pos = np.arange(data.shape[1])[None, :]
        valid = pos < lengths[:, None]
        is_nl = (data == 10) & valid
        last_nl = np.where(is_nl.any(axis=1), data.shape[1] - 1 - np.argmax(is_nl[:, ::-1], 1),
                           -1)
        cols = np.where(data == 32, 1, np.where(data == 9, self.tab_len, 0)) * valid
        after = pos > last_nl[:, None]
        self.eff_reset = last_nl >= 0  # [T]
        self.eff_cols = (cols * after).sum(axis=1)  # [T]

    # -- the parser side ---------------------------------------------------------------------

    def _candidates(self, top: int) -> list[tuple[int, int]]:
        """(lexer id, parser id) of the terminals LALR state ``top`` has an action for."""
        got = self._cands.get(top)
        if got is None:
            acts = self.g.tables.actions[top]
            got = [(i, p) for i, p in enumerate(self.g.parser_index)
                   if i != self.nl and p >= 0 and p in acts]
            self._cands[top] = got
        return got

    def viable_bits(self, stack: int, paren: int, levels: tuple[int, ...]) -> int:
        """Bitmask of lexer terminals whose lexeme could end here and be taken (the newline
        terminal only where the postlexer drops it; see ``nl_ok`` otherwise)."""
        ck = (stack, paren, levels)
        got = self._viable.get(ck)
        if got is None:
            if stack == FREE:
                got = (1 << len(self.g.terminals)) - 1
            else:
                got = self.ignore_bits
                for i, p in self._candidates(self.stacks.top(stack)):
                    if self.stacks.feed(stack, p) >= 0:
                        got |= 1 << i
                if self.nl >= 0 and paren > 0:
                    got |= self.nl_bit
            self._viable[ck] = got
        return got

    def feed_newline(self, stack: int, levels: tuple[int, ...],
                     indent: int) -> tuple[int, tuple[int, ...]]:
        """The indenter's newline with ``indent`` columns: NL, then INDENT or DEDENTs.
        Returns the new (stack, levels); stack -1 on error."""
        stack = self.stacks.feed(stack, self.g.parser_index[self.nl])
        if stack < 0:
            return -1, levels
        if indent > levels[-1]:
            return self.stacks.feed(stack, self.p_indent), (*levels, indent)
        while indent < levels[-1]:
            levels = levels[:-1]
            stack = self.stacks.feed(stack, self.p_dedent)
            if stack < 0:
                return -1, levels
        if indent != levels[-1]:
            return -1, levels
        return stack, levels

    def nl_levels(self, stack: int, levels: tuple[int, ...]) -> tuple[frozenset[int], bool]:
        """The valid indentations of a newline here: exact levels, and whether deeper than
        the current block is valid."""
        ck = (stack, levels)
        got = self._nl_levels.get(ck)
        if got is None:
            ok = frozenset(lv for lv in levels if self.feed_newline(stack, levels, lv)[0] >= 0)
            got = (ok, self.feed_newline(stack, levels, levels[-1] + 1)[0] >= 0)
            self._nl_levels[ck] = got
        return got

    def nl_ok(self, q: int, indent: int, stack: int, levels: tuple[int, ...]) -> bool:
        """Whether a pending newline lexeme at its DFA state ``q`` with ``indent`` columns
        can still end with a valid indentation (a small search over (q, capped indent))."""
        ok, deeper = self.nl_levels(stack, levels)
        if not ok and not deeper:
            return False
        cap = levels[-1] + 1
        ck = (q, min(indent, cap), ok, deeper, cap)
        got = self._nl_reach.get(ck)
        if got is None:
            dfa = self.g.terminals[self.nl].dfa
            table, acc = dfa.table, dfa.accepting
            seen = {(q, min(indent, cap))}
            todo = list(seen)
            got = False
            while todo:
                s, d = todo.pop()
                if acc[s] and (d in ok or (d >= cap and deeper)):
                    got = True
                    break
                row = table[s]
                nxt = []
                for b in np.flatnonzero(row).tolist():
                    t = int(row[b])
                    nd = 0 if b == 10 else min(cap, d + (1 if b == 32 else
                                                         self.tab_len if b == 9 else 0))
                    nxt.append((t, nd))
                for item in nxt:
                    if item not in seen:
                        seen.add(item)
                        todo.append(item)
            self._nl_reach[ck] = got
        return got

    def alive(self, key: _Key) -> bool:
        """Whether the pending lexeme of ``key`` can still end as a terminal the parser
        (and the indenter) can take."""
        lx, ind, stack, paren, levels, _ = key
        if self.lex.is_start(lx):
            return True
        terms = self.lex.terms(lx)
        if terms & self.ignore_bits:
            return True
        if stack == FREE:
            return bool(terms)
        if terms & self.nl_bit and paren > 0:
            return True
        top = self.stacks.top(stack)
        for i, p in self._candidates(top):
            if terms >> i & 1 and self.stacks.feed(stack, p) >= 0:
                return True
        if terms & self.nl_bit and paren == 0 and stack != FREE:
            return self.nl_ok(self.lex.component(lx, self.nl), ind, stack, levels)
        return False

    def end_lexeme(self, state: int) -> int:
        """The state after the pending lexeme ends here (0 if it cannot). Memoized."""
        got = self._ends.get(state)
        if got is None:
            got = self._end_lexeme(self._keys[state])
            self._ends[state] = got
        return got

    def _end_lexeme(self, key: _Key) -> int:
        lx, ind, stack, paren, levels, last_nl = key
        t = self.lex.winner(lx)
        if t < 0:
            return 0
        if stack != FREE and t not in self.g.ignore:
            if t == self.nl:
                if paren == 0:
                    stack, levels = self.feed_newline(stack, levels, ind)
            else:
                stack = self.stacks.feed(stack, self.g.parser_index[t])
                if t in self.opens:
                    paren += 1
                elif t in self.closes and paren > 0:
                    paren -= 1
            if stack < 0:
                return 0
        return self.intern((self.start_lexer(stack), 0, stack, paren, levels, last_nl))

    def accepts_eof(self, state: int) -> bool:
        """Whether the input may end in ``state``. Memoized."""
        got = self._eof.get(state)
        if got is None:
            got = self._accepts_eof(state)
            self._eof[state] = got
        return got

    def _accepts_eof(self, state: int) -> bool:
        lx = self._keys[state][0]
        if not self.lex.is_start(lx):
            state = self.end_lexeme(state)
            if not state:
                return False
        _, _, stack, paren, levels, _ = self._keys[state]
        if stack == FREE:
            return True
        if self.nl < 0:
            return self.stacks.accepts_end(stack)
        candidates = [(stack, levels)]
        if paren == 0:  # the implied final newline
            candidates.append(self.feed_newline(stack, levels, 0))
        for s, lv in candidates:
            for _ in range(len(lv) - 1):
                if s < 0:
                    break
                s = self.stacks.feed(s, self.p_dedent)
            if s >= 0 and self.stacks.accepts_end(s):
                return True
        return False

    # -- bytes -------------------------------------------------------------------------------

    def step_byte(self, state: int, b: int) -> int:
        """The state after byte ``b`` (0 = illegal). Memoized."""
        ck = (state, b)
        got = self._bytes.get(ck)
        if got is None:
            got = self._step(state, b)
            self._bytes[ck] = got
        return got

    def _step(self, state: int, b: int) -> int:
        lx, ind, stack, paren, levels, _ = self._keys[state]
        nxt = self.lex.step(lx, b)
        if nxt:
            if self.lex.terms(nxt) & self.nl_bit:
                ind = 0 if b == 10 else ind + (1 if b == 32 else self.tab_len if b == 9 else 0)
            else:
                ind = 0
            key = (nxt, ind, stack, paren, levels, b == 10)
            return self.intern(key) if self.alive(key) else 0
        if self.lex.winner(lx) < 0:
            return 0
        ended = self.end_lexeme(state)
        return self.step_byte(ended, b) if ended else 0

    def step_bytes(self, state: int, data: bytes) -> int:
        """The state after ``data`` (0 = illegal). Pure."""
        for b in data:
            if not state:
                return 0
            state = self.step_byte(state, b)
        return state

    # -- masks -------------------------------------------------------------------------------

    def _seg_effect(self, rows: np.ndarray, lo: np.ndarray,
                    hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, what bytes ``[lo, hi)`` of the token do to a newline lexeme's
        indentation: whether they hold a ``\\n``, and the columns after the last one."""
        data = self.tt.data[rows]  # [R, Lmax]
        pos = np.arange(data.shape[1])[None, :]
        seg = (pos >= lo[:, None]) & (pos < hi[:, None])
        is_nl = (data == 10) & seg
        has = is_nl.any(axis=1)
        last = np.where(has, data.shape[1] - 1 - np.argmax(is_nl[:, ::-1], axis=1), -1)
        cols = np.where(data == 32, 1, np.where(data == 9, self.tab_len, 0))
        return has, (cols * (seg & (pos > last[:, None]))).sum(axis=1)

    def _ends_ok(self, ends: np.ndarray, rows: np.ndarray, lo: np.ndarray, ind: int,
                 ctx: tuple[int, int, tuple[int, ...]]) -> np.ndarray:
        """Whether tokens (``rows``) whose bytes from ``lo`` stayed inside one lexeme, now
        at lexer states ``ends``, leave it alive under the parser context ``ctx``."""
        stack, paren, levels = ctx
        vb = self.viable_bits(stack, paren, levels)
        nl_check = self.nl >= 0 and paren == 0 and stack != FREE
        ok = np.zeros(rows.size, dtype=bool)
        uniq, inv = np.unique(ends, return_inverse=True)
        inv = inv.reshape(-1)
        for u, end in enumerate(uniq.tolist()):
            terms = self.lex.terms(end)
            if terms & vb:
                ok[inv == u] = True
            elif nl_check and terms & self.nl_bit:
                sel = np.flatnonzero(inv == u)
                q = self.lex.component(end, self.nl)
                has, cols = self._seg_effect(rows[sel], lo[sel], self.tt.lengths[rows[sel]])
                final = np.where(has, cols, ind + cols)
                for d in np.unique(final).tolist():
                    if self.nl_ok(q, d, stack, levels):
                        ok[sel[final == d]] = True
        return ok

    def _cross_ok(self, rows: np.ndarray, ks: np.ndarray, ends: np.ndarray, lo: np.ndarray,
                  key: _Key) -> np.ndarray:
        """Whether tokens whose lexeme ends after byte ``ks`` (at lexer states ``ends``;
        the lexeme began at byte ``lo``) are legal: end it, then walk the rest. Rows are
        grouped by the state after the lexeme ends (``foo(``, ``bar(``: one walk)."""
        _, ind, stack, paren, levels, _ = key
        ended = np.zeros(rows.size, dtype=np.int64)
        uniq, inv = np.unique(ends, return_inverse=True)
        inv = inv.reshape(-1)
        for u, end in enumerate(uniq.tolist()):
            if self.lex.terms(end) & self.nl_bit:
                sel = np.flatnonzero(inv == u)
                has, cols = self._seg_effect(rows[sel], lo[sel], ks[sel])
                final = np.where(has, cols, ind + cols)
                for d in np.unique(final).tolist():
                    ended[sel[final == d]] = self.end_lexeme(
                        self.intern((end, d, stack, paren, levels, False)))
            else:
                ended[inv == u] = self.end_lexeme(
                    self.intern((end, 0, stack, paren, levels, False)))
        ok = np.zeros(rows.size, dtype=bool)
        for y in np.unique(ended).tolist():
            if y:
                part = np.flatnonzero(ended == y)
                ok[part] = self._rows_from(y, rows[part], ks[part])
        return ok

    def _rows_from(self, state: int, rows: np.ndarray, offs: np.ndarray) -> np.ndarray:
        """Whether the rest of each token (``rows``, from byte ``offs``) is legal from
        ``state`` (a state between lexemes): one vectorized walk through the lexer."""
        tt = self.tt
        if rows.size <= _SCALAR_ROWS:  # a few short rests: byte steps (memoized) are cheaper
            data, lengths = tt.data, tt.lengths
            return np.array([bool(self.step_bytes(state, data[r, k:lengths[r]].tobytes()))
                             for r, k in zip(rows.tolist(), offs.tolist())], dtype=bool)
        key = self._keys[state]
        ctx = (key[2], key[3], key[4])
        result = np.zeros(rows.size, dtype=bool)
        idx = np.arange(rows.size)
        states = np.full(rows.size, key[0], dtype=np.int32)
        pos = offs.copy()
        lengths = tt.lengths[rows]
        while idx.size:
            done = pos >= lengths[idx]
            if done.any():
                d = idx[done]
                result[d] = self._ends_ok(states[done], rows[d], offs[d], key[1], ctx)
                idx, states, pos = idx[~done], states[~done], pos[~done]
                if not idx.size:
                    break
            table = self.lex.expand(states)
            nxt = table[states, tt.data[rows[idx], pos]]
            dead = nxt == 0
            if dead.any():
                cross = dead & (self.lex.winner_arr[states] >= 0)
                if cross.any():
                    c = idx[cross]
                    result[c] = self._cross_ok(rows[c], pos[cross], states[cross], offs[c], key)
                keep = ~dead
                idx, states, pos = idx[keep], nxt[keep], pos[keep]
            else:
                states = nxt
            pos = pos + 1
        return result

    def _lexer_groups(self, lx: int) -> tuple:
        """Per lexer state: inside-token groups, the crossing tokens, first-byte kills."""
        got = self._groups.get(lx)
        if got is not None:
            return got
        tt = self.tt
        walk = self.lex.walk(lx, tt)
        inside: dict[tuple, list[np.ndarray]] = {}
        if walk.inside_rows.size:
            uniq, inv = np.unique(walk.inside_states, return_inverse=True)
            inv = inv.reshape(-1)
            order = np.argsort(inv, kind="stable")
            bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
            for u, end in enumerate(uniq.tolist()):
                rows = walk.inside_rows[order[bounds[u]:bounds[u + 1]]]
                terms = self.lex.terms(end)
                if terms & self.nl_bit:
                    q = self.lex.component(end, self.nl)
                    eff = np.stack([self.eff_reset[rows], self.eff_cols[rows]], axis=1)
                    effs, einv = np.unique(eff, axis=0, return_inverse=True)
                    einv = einv.reshape(-1)
                    for e, (reset, cols) in enumerate(effs.tolist()):
                        inside.setdefault((terms, (q, bool(reset), int(cols))), []).append(
                            rows[einv == e])
                else:
                    inside.setdefault((terms, None), []).append(rows)
        groups_in = [(terms, nl, TokenMask.from_ids(tt.ids[np.concatenate(parts)],
                                                    tt.size).words)
                     for (terms, nl), parts in inside.items()]
        kill = None
        if self.lex.winner(lx) >= 0:
            table = self.lex.expand(np.array([lx]))
            dead_first = np.flatnonzero(table[lx] == 0)
            rows = np.concatenate([tt.first_rows[b] for b in dead_first]) \
                if dead_first.size else np.zeros(0, dtype=np.int64)
            kill = TokenMask.from_ids(tt.ids[rows], tt.size).words
        got = (groups_in, walk, kill)
        self._groups[lx] = got
        return got

    def mask(self, state: int) -> TokenMask:
        """The tokens legal in ``state`` (EOS excluded; the constraint adds it). Memoized
        per state value, the after-newline flag left out (it does not change the mask)."""
        key = self._keys[state]
        mk = key[:5]
        got = self._masks.get(mk)
        if got is None:
            got = self._mask(state)
            self._masks[mk] = got
        return got

    def _mask(self, state: int) -> TokenMask:
        key = self._keys[state]
        lx, ind, stack, paren, levels, _ = key
        size = self.tt.size
        words = np.zeros((size + 31) // 32, dtype=np.uint32)
        groups_in, walk, kill = self._lexer_groups(lx)
        vb = self.viable_bits(stack, paren, levels)
        nl_check = self.nl >= 0 and paren == 0 and stack != FREE
        for terms, nl, w in groups_in:
            if terms & vb:
                words |= w
            elif nl is not None and nl_check:
                q, reset, cols = nl
                if self.nl_ok(q, cols if reset else ind + cols, stack, levels):
                    words |= w
        extra = None
        if walk.cross_rows.size:
            rows = walk.cross_rows
            ok = self._cross_ok(rows, walk.cross_k, walk.cross_states,
                                np.zeros(rows.size, dtype=np.int64), key)
            if ok.any():
                extra = self.tt.ids[rows[ok]]
        if kill is not None:
            ended = self.end_lexeme(state)
            if ended:
                words |= self.mask(ended).words & kill
        mask = TokenMask(words, size)
        if extra is not None:
            mask = mask | TokenMask.from_ids(extra, size)
        return mask

    def n_states(self) -> int:
        """How many constraint states exist so far."""
        return len(self._keys)


__all__ = ["FREE", "LarkRuntime"]
