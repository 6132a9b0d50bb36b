"""The token-level constraint of a Lark grammar: our lexer DFA + lark's LALR(1) tables.

A state is an interned int for the value ``(lexer state, indent, stack, paren level,
indent levels, after newline)``: the pending lexeme's combined-DFA state, the columns
after its last ``\\n`` (only while it may still become the indenter's newline, since the
width decides INDENT/DEDENT), the interned LALR stack (:mod:`.lalr`), the postlexer's
bracket depth and block levels, and whether the last byte was ``\\n`` (for the ``"line"``
stopping point). For a grammar with automatic semicolon insertion (:mod:`.lark_asi`) the
bracket-depth slot holds the line-break bit instead, and the lexer is ECMAScript's
(``_asi_start``). ``advance`` is pure; everything is memoized.

**Semantics.** Maximal munch without backtracking, lark's contextual lexer choice
(:mod:`.lexer`), lark's ``Indenter`` (:mod:`.lark_grammar`), exact LALR reductions. A
pending lexeme is alive when one of the terminals it may still become can be fed to the
parser (for the newline terminal: when some reachable final indentation is valid). At end
of input the pending lexeme ends, a final newline is implied if the text needs one, every
open block is closed, and the parser must accept ``$END``.

**Masks** follow XGrammar's split between tokens the lexer alone decides and tokens that
cross a lexeme boundary; see :mod:`.lark_masks`.

**Documented dead ends** (allowed tokens after which no completion exists): two lexemes
that maximal munch would merge and that nothing (no ``%ignore``d separator) can split;
a terminal whose every string is claimed by a higher-priority terminal.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from structspec.automata.base import TokenMask
from structspec.automata.lalr import ParserStacks, Signatures
from structspec.automata.lark_asi import AsiRules
from structspec.automata.lark_grammar import TAB_REFUSED
from structspec.automata.lark_masks import MaskBuilder
from structspec.automata.lexer import ContextualLexer
from structspec.automata.token_walk import token_table

if TYPE_CHECKING:
    from structspec.automata.lark_grammar import LoadedGrammar
    from structspec.vocab import Vocabulary

FREE = -2  # stack value of the tolerant, parser-free mode
_Key = tuple[int, int, int, int, tuple[int, ...], int]

# The last slot of a state: what its last byte was. A line end is the `\n` of a line, a
# join end the `\n` of an explicit line join (`\` + `\n`), after which Python refuses the
# end of the input ("unexpected EOF"; CPython takes `\` + `\r\n` there, and so do we).
OTHER, LINE_END, JOIN_BACKSLASH, JOIN_END = 0, 1, 2, 3


def _embedded_strings(g: LoadedGrammar) -> dict[int, set[int]]:
    """For each regex terminal, the string terminals of equal priority whose text it
    matches (keywords inside ``NAME``): lark's basic lexer turns those lexemes into the
    keyword; its contextual lexer only where the parser expects the keyword."""
    literals = {i: t.dfa.literal() for i, t in enumerate(g.terminals) if t.is_string}
    out: dict[int, set[int]] = {}
    for i, t in enumerate(g.terminals):
        if t.is_string:
            continue
        for j, lit in literals.items():
            if lit and g.terminals[j].priority == t.priority and t.matches(lit):
                out.setdefault(i, set()).add(j)
    return out


class LarkRuntime:
    """The shared, growing memo of one compiled grammar for one vocabulary.

    Thread-safe: tables only grow; interning is locked.
    """

    INF = 1 << 60  # "no stack height read"

    def __init__(self, g: LoadedGrammar, vocab: Vocabulary, keywords: str = "reserved"
                 ) -> None:
        if keywords not in ("reserved", "contextual"):
            raise ValueError(f"keywords must be 'reserved' or 'contextual', got {keywords!r}")
        self.g = g
        self.vocab = vocab
        self._embedded = _embedded_strings(g) if keywords == "reserved" else {}
        self._embedders: dict[int, set[int]] = {}
        for r, strings in self._embedded.items():
            for j in strings:
                self._embedders.setdefault(j, set()).add(r)
        self.lex = ContextualLexer(list(g.terminals), g.ignore)
        self.stacks = ParserStacks(g.tables)
        self.tt = token_table(vocab)
        self._lock = threading.RLock()
        self._keys: list[_Key] = [(0, 0, -1, 0, (), OTHER)]  # 0 = dead
        self._ids: dict[_Key, int] = {}
        self._bytes: dict[tuple[int, int], int] = {}
        self._eof: dict[int, bool] = {}
        self._ends: dict[int, tuple[int, int, int, int]] = {}
        self._viable: dict[tuple[int, int, tuple[int, ...]], int] = {}
        self._viable_low: dict[tuple[int, int], tuple[bool, int]] = {}
        self._viable_sig: dict[int, Signatures] = {}  # per terms (lalr.py)
        # With the lalr_sim kernel: per stack, every candidate terminal's answer at once
        # (_takes_row) instead of a memo and signatures per (stack, terminal set).
        self._rows: dict[int, tuple[int, tuple[tuple[int, int], ...], int, int]] | None = \
            {} if self.stacks.native() else None
        self._cand_arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._newlines: dict[tuple[int, tuple[int, ...], int],
                             tuple[int, tuple[int, ...], int, int]] = {}
        self._nl_ok: dict[tuple[int, int, int, tuple[int, ...]], tuple[bool, int, int]] = {}
        self._nl_reach: dict[tuple[int, int, int], frozenset[int]] = {}
        self._nl_moves_list: list[list[tuple[int, int]]] | None = None
        self._starts: dict[int, int] = {}  # per LALR top state (ASI: -2, -3)
        self._cands: dict[int, list[tuple[int, int]]] = {}
        self._cbits: dict[int, int] = {}
        self._sbits: dict[int, int] = {}
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
        # A refused tab counts TAB_REFUSED columns: no level is ever that deep (see
        # _feed_newline), and every count from there on is kept at TAB_REFUSED.
        self.tab_len = (TAB_REFUSED if pl.tabs == "refuse" else pl.tab_len) if pl else 8
        self.ignore_bits = sum(1 << i for i in g.ignore)
        # ASI grammars (lark_asi.py): the bracket-depth slot of a state holds "a line break
        # came since the last token" (0/1); line-break lexemes set it, other tokens clear it.
        self.asi = AsiRules(g, self.stacks) if g.asi is not None else None
        self.line_break_bits = self.asi.line_break_bits if self.asi else 0
        self._asi_rows: dict[tuple[int, int], tuple[int, int]] = {}
        self._slash: dict[int, list[int]] = {}
        self.free_start = self.lex.start(frozenset(range(len(g.terminals))))
        # The terminals that can begin with `/` (division, `/=`), for the regexp goal.
        self._slash_ids = frozenset(
            i for i in range(len(g.terminals))
            if self.asi is not None and self.asi.regex_goal and i not in g.ignore
            and i not in self.asi.regex_goal
            and self.lex.step(self.lex.start(frozenset({i})), 47))
        self.eos = np.fromiter(sorted(vocab.eos_token_ids), dtype=np.int64)
        self.masks = MaskBuilder(self)
        self.initial = self.intern((self.start_lexer(0), -1, 0, 0, (0,), OTHER))
        if g.postlex is not None and g.postlex.line_start:
            # The text begins a line: its first line's indentation counts, as in Python
            # (" x = 1" is an unexpected indent), when the grammar takes a leading newline.
            first_line = self.step_byte(self.initial, 10)
            if first_line and self.stacks.feed(0, g.parser_index[self.nl]) >= 0:
                self.initial = first_line
        self.free_initial = self.intern((self.free_start, -1, FREE, 0, (0,), False))

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
        """The lexer start state for the parser stack ``stack`` (lark's contextual set;
        for an ASI grammar ECMAScript's lexer, see ``_asi_start``)."""
        return self.start_low(stack)[0]

    def start_low(self, stack: int) -> tuple[int, int]:
        """``start_lexer`` and the lowest stack height it read."""
        if stack == FREE:
            return self.free_start, self.INF
        if self.asi is not None:
            return self._asi_start(stack)
        top = self.stacks.top(stack)
        got = self._starts.get(top)
        if got is None:
            acts = self.g.tables.actions[top]
            ids = {i for i, p in enumerate(self.g.parser_index) if p >= 0 and p in acts}
            ids |= set(self.g.ignore)
            if self.nl >= 0:
                ids.add(self.nl)
            # Reserved keywords: "or" never lexes as a NAME, and "indexes" never as
            # "in" + "dexes": a keyword and the regex that matches it come together.
            for i in list(ids):
                ids |= self._embedders.get(i, set())
            for i in list(ids):
                ids |= self._embedded.get(i, set())
            got = self.lex.start(frozenset(ids))
            self._starts[top] = got
        return got, self.stacks.depth(stack)

    def _asi_start(self, stack: int) -> tuple[int, int]:
        """The lexer start state of an ASI grammar (ECMAScript's lexer) and the lowest
        height read. ECMAScript lexes without the parser but for the regexp goal: `1++x`
        is `1 ++ x` (an error), never `1 + +x` as a contextual lexer would read it, so
        every terminal is in the set — but where the parser takes a `/` (after its
        reductions: the top state's action keys are not enough, LALR merges the `}` of a
        block with that of a function expression) a `/` is a division, and the regexp
        goal's terminals are left out."""
        asi = self.asi
        assert asi is not None
        top = self.stacks.top(stack)
        low = self.stacks.depth(stack)
        div = False
        for p in self._slash_terms(top):
            ok, lo = self.stacks.takes_low(stack, p)
            low = min(low, lo)
            if ok:
                div = True
                break
        got = self._starts.get(-2 - div)
        if got is None:
            ids = set(range(len(self.g.terminals)))
            if div:
                ids -= asi.regex_goal
            got = self._starts[-2 - div] = self.lex.start(frozenset(ids))
        return got, low

    def _slash_terms(self, top: int) -> list[int]:
        """Parser ids of the terminals of LALR state ``top`` (none ignored, none of the
        regexp goal) whose text can begin with ``/`` (division, ``/=``)."""
        got = self._slash.get(top)
        if got is None:
            got = [p for i, p in self._candidates(top) if i in self._slash_ids]
            self._slash[top] = got
        return got

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
        stack, levels, _, _ = self.feed_newline_low(stack, levels, indent)
        return stack, levels

    def feed_newline_low(self, stack: int, levels: tuple[int, ...], indent: int
                         ) -> tuple[int, tuple[int, ...], int, int]:
        """``feed_newline``, the lowest stack height it read (see
        ``ParserStacks.feed_low``) and the lowest index of ``levels`` it read (``INF``:
        none). Memoized."""
        ck = (stack, levels, indent)
        got = self._newlines.get(ck)
        if got is None:
            got = self._feed_newline(stack, levels, indent)
            self._newlines[ck] = got
        return got

    def _feed_newline(self, stack: int, levels: tuple[int, ...], indent: int
                      ) -> tuple[int, tuple[int, ...], int, int]:
        feed = self.stacks.feed_low
        stack, low = feed(stack, self.g.parser_index[self.nl])
        if stack < 0:
            return -1, levels, low, self.INF
        if indent >= TAB_REFUSED:  # a refused tab in the indentation (IndenterSpec.tabs)
            return -1, levels, low, self.INF
        if indent < 0:  # no \n in the lexeme (a comment at the end): no change
            indent = levels[-1]
        if indent > levels[-1]:
            stack, lo = feed(stack, self.p_indent)
            return stack, (*levels, indent), min(low, lo), len(levels) - 1
        while indent < levels[-1]:
            levels = levels[:-1]
            stack, lo = feed(stack, self.p_dedent)
            low = min(low, lo)
            if stack < 0:
                return -1, levels, low, len(levels)  # the popped level was read last
        if indent != levels[-1]:
            return -1, levels, low, len(levels) - 1
        return stack, levels, low, len(levels) - 1

    def nl_ok(self, q: int, indent: int, stack: int, levels: tuple[int, ...]) -> bool:
        """Whether a pending newline lexeme at its DFA state ``q`` with ``indent`` columns
        can still end with a valid indentation."""
        return self.nl_ok_low(q, indent, stack, levels)[0]

    def nl_ok_low(self, q: int, indent: int, stack: int,
                  levels: tuple[int, ...]) -> tuple[bool, int, int]:
        """``nl_ok``, the lowest stack height and the lowest index of ``levels`` it read:
        the indentations the newline lexeme can still end with (a stack-free search) are
        tried cheapest first — the current level, one deeper, then dedents from the
        innermost — and the first valid one decides, so most answers read only the tops.
        """
        ck = (q, indent, stack, levels)
        got = self._nl_ok.get(ck)
        if got is None:
            got = self._nl_ok_low(q, indent, stack, levels)
            self._nl_ok[ck] = got
        return got

    def _nl_ok_low(self, q: int, indent: int, stack: int,
                   levels: tuple[int, ...]) -> tuple[bool, int, int]:
        nl, low = self.stacks.feed_low(stack, self.g.parser_index[self.nl])
        if nl < 0:  # every indentation starts with NL
            return False, low, self.INF
        top = len(levels) - 1
        llow = top
        cap = levels[-1] + 1
        # indent -1: no \n yet; TAB_REFUSED stays (no level is that deep)
        reach = self._nl_reach_set(q, indent if indent >= TAB_REFUSED else min(indent, cap),
                                   cap)
        tries = []
        if -1 in reach or levels[-1] in reach:
            tries.append(levels[-1])
        if cap in reach:
            tries.append(cap)
        for lv in tries:
            st, _, lo, ll = self.feed_newline_low(stack, levels, lv)
            if st >= 0:
                return True, lo, min(ll, llow)
            low, llow = min(low, lo), min(llow, ll)
        for i in range(top - 1, -1, -1):  # dedents, innermost first
            llow = min(llow, i)
            if levels[i] in reach:
                st, _, lo, ll = self.feed_newline_low(stack, levels, levels[i])
                if st >= 0:
                    return True, lo, min(ll, llow)
                low, llow = min(low, lo), min(llow, ll)
        return False, low, llow

    def _nl_reach_set(self, q: int, indent: int, cap: int) -> frozenset[int]:
        """The indentations (-1: no ``\n`` yet; ``cap``: ``cap`` or more) a newline lexeme
        at DFA state ``q`` with ``indent`` columns can end with. Stack-free; memoized."""
        ck = (q, indent, cap)
        got = self._nl_reach.get(ck)
        if got is None:
            acc = self.g.terminals[self.nl].dfa.accepting
            moves = self._nl_moves()
            after = self._indent_after
            seen = {(q, indent)}
            todo = list(seen)
            out = set()
            while todo:
                s, d = todo.pop()
                if acc[s]:
                    out.add(d)
                for t, b in moves[s]:
                    nd = after(d, b, cap)
                    if (t, nd) not in seen:
                        seen.add((t, nd))
                        todo.append((t, nd))
            got = frozenset(out)
            self._nl_reach[ck] = got
        return got

    def _nl_moves(self) -> list[list[tuple[int, int]]]:
        """Per state of the newline terminal's DFA: its distinct moves as (target, byte),
        with every byte other than ``\n``, form feed, space and tab standing for all the
        others."""
        if self._nl_moves_list is None:
            table = self.g.terminals[self.nl].dfa.table
            out = []
            for row in table:
                moves = set()
                for b in np.flatnonzero(row).tolist():
                    moves.add((int(row[b]), b if b in (9, 10, 12, 32) else 0))
                out.append(sorted(moves))
            self._nl_moves_list = out
        return self._nl_moves_list

    def _indent_after(self, ind: int, b: int, cap: int) -> int:
        """Columns after the last ``\n`` once byte ``b`` is added (-1: none yet). A form
        feed sets the column back to 0, as CPython's tokenizer does in indentation."""
        if b == 10:
            return 0
        if ind < 0:
            return -1
        if b == 12:
            return 0
        ind += 1 if b == 32 else self.tab_len if b == 9 else 0
        return TAB_REFUSED if ind >= TAB_REFUSED else min(cap, ind)

    def any_viable(self, terms: int, stack: int, paren: int) -> bool:
        """Whether one of the lexer terminals in the bitmask ``terms`` can end a lexeme here
        (the newline terminal only where the indenter drops it; see ``nl_ok``)."""
        return self.viable_low(terms, stack, paren)[0]

    def viable_low(self, terms: int, stack: int, paren: int) -> tuple[bool, int, int]:
        """``any_viable``, the lowest stack height it read (``INF``: none) and whether it
        read ``paren`` (1) or not (0). A true answer reads only what one terminal that can
        be taken reads (the lowest-numbered one, after the terminals the top shifts at
        once). With the ``lalr_sim`` kernel: bit operations on the stack's row of answers
        (``_takes_row``); without it: memoized per ``(stack, terms)`` and by signature.
        Both give the same answer and reads."""
        if terms & self.ignore_bits:
            return True, self.INF, 0
        if stack == FREE:
            return bool(terms), self.INF, 0
        if self.asi is not None:
            if terms & self.line_break_bits:  # never fed: only sets the line-break bit
                return True, self.INF, 0
            taken, low = self._asi_row(stack, paren)
            return bool(terms & taken), low, 1
        pk = 0
        if terms & self.nl_bit:
            if paren > 0:
                return True, self.INF, 1
            pk = 1
        if self._rows is not None:  # the kernel's rows: the same answers as below
            taken, levels, shift, depth = self._rows.get(stack) or self._takes_row(stack)
            if terms & shift:  # shifted at once: reads the top only
                return True, depth, pk
            hit = terms & taken
            if hit:  # the lowest taken terminal is the witness (as _viable_compute tries)
                hit &= -hit
                for h, bits in levels:
                    if bits & hit:
                        return True, h, pk
            for h, bits in levels:  # refused: the lowest read of any candidate
                if bits & terms:
                    return False, h, pk
            return False, depth, pk
        ck = (stack, terms)
        got = self._viable_low.get(ck)
        if got is None:
            got = self._viable_low[ck] = self._viable_compute(terms, stack)
        return got[0], got[1], pk

    def _viable_compute(self, terms: int, stack: int) -> tuple[bool, int]:
        """``viable_low``'s answer and lowest height read for a parser stack (no memo)."""
        stacks = self.stacks
        top = stacks.top(stack)
        low = stacks.depth(stack)
        if terms & self._shift_bits(top):  # shifted at once: reads the top only
            return True, low
        todo = terms & self._cand_bits(top)
        if not todo:  # no action for any of them: reads the top only
            return False, low
        sig = self._viable_sig.get(terms)
        if sig is None:
            sig = self._viable_sig.setdefault(terms, Signatures())
        hit = stacks.find_signature(sig, stack)
        if hit is not None:
            return hit[0], low - hit[1] + 1
        got = (False, low)
        index = self.g.parser_index
        while todo:
            bit = todo & -todo
            res, lo = stacks.takes_low(stack, index[bit.bit_length() - 1])
            if res:
                got = (True, min(stacks.depth(stack), lo))
                break
            low = min(low, lo)
            got = (False, low)
            todo ^= bit
        stacks.store_signature(sig, stack, got[1], got[0])
        return got

    def _asi_row(self, stack: int, brk: int) -> tuple[int, int]:
        """An ASI grammar's lexer terminals (a bitmask) whose lexeme the parser takes on
        ``stack`` with line-break bit ``brk`` (``AsiRules.sequence``), and the lowest
        height any of them read. Memoized per (stack, bit)."""
        ck = (stack, brk)
        got = self._asi_rows.get(ck)
        if got is None and self._rows is not None:
            got = self._asi_rows[ck] = self._asi_row_native(stack, brk)
        if got is None:
            asi = self.asi
            assert asi is not None
            stacks = self.stacks
            cands = set(self._candidates(stacks.top(stack)))
            after = stacks.feed(stack, asi.p_asi)
            if after >= 0:
                cands.update(self._candidates(stacks.top(after)))
            bits, low = 0, stacks.depth(stack)
            for i, p in cands:
                seq, _, lo = asi.sequence(stack, brk, p)
                low = min(low, lo)
                if seq is not None:
                    bits |= 1 << i
            got = self._asi_rows[ck] = (bits, low)
        return got

    def _asi_row_native(self, stack: int, brk: int) -> tuple[int, int]:
        """``_asi_row`` from the kernel's rows of the stack and of the stack after
        ``_ASI`` (``_takes_row``): the same terminals as ``AsiRules.sequence`` per
        terminal; the reads are every candidate's (conservative, never too few)."""
        asi = self.asi
        assert asi is not None
        stacks = self.stacks
        never, before, close = asi.never_bits, asi.before_bits, asi.close_bits
        taken, levels, _, depth = self._rows.get(stack) or self._takes_row(stack)  # type: ignore[union-attr]
        low = min([depth, *(h for h, _ in levels)])
        after, lo = stacks.feed_low(stack, asi.p_asi)
        low = min(low, lo)
        if brk and stacks.top(stack) in asi.after_states:
            direct = 0
        else:
            direct = taken & ~never if brk else taken
            if brk and after >= 0:
                direct &= ~before
        extra = 0
        if after >= 0:
            t2, lv2, _, d2 = self._rows.get(after) or self._takes_row(after)  # type: ignore[union-attr]
            low = min([low, d2, *(h for h, _ in lv2)])
            extra = t2 & ~never if brk else t2 & close
        return direct | extra, low

    def _takes_row(self, stack: int) -> tuple[int, tuple[tuple[int, int], ...], int, int]:
        """For a parser stack: the lexer terminals (as a bitmask) among the candidates of
        its top state that it takes, the lowest height each candidate's check read as
        ``(height, bitmask)`` pairs ascending (``ParserStacks.takes``), the terminals the
        top shifts at once, and the stack's height. Memoized per stack."""
        got = self._rows.get(stack)  # type: ignore[union-attr]
        if got is None:
            stacks = self.stacks
            top = stacks.top(stack)
            arrays = self._cand_arrays.get(top)
            if arrays is None:
                cands = self._candidates(top)
                arrays = self._cand_arrays[top] = (
                    np.array([p for _, p in cands], dtype=np.int64).reshape(-1),
                    np.array([i for i, _ in cands], dtype=np.int64).reshape(-1))
            taken, levels = stacks.takes(stack, *arrays)
            got = (taken, levels, self._shift_bits(top), stacks.depth(stack))
            self._rows[stack] = got  # type: ignore[index]
        return got

    def _cand_bits(self, top: int) -> int:
        got = self._cbits.get(top)
        if got is None:
            got = sum(1 << i for i, _ in self._candidates(top))
            self._cbits[top] = got
        return got

    def _shift_bits(self, top: int) -> int:
        """The lexer terminals LALR state ``top`` shifts (no reduction first)."""
        got = self._sbits.get(top)
        if got is None:
            acts = self.g.tables.actions[top]
            got = sum(1 << i for i, p in self._candidates(top) if acts[p] >= 0)
            self._sbits[top] = got
        return got

    def alive(self, key: _Key) -> bool:
        """Whether the pending lexeme of ``key`` can still end as a terminal the parser
        (and the indenter) can take."""
        lx, ind, stack, paren, levels, _ = key
        if self.lex.is_start(lx):
            return True
        terms = self.lex.terms(lx)
        if self.any_viable(terms, stack, paren):
            return True
        if terms & self.nl_bit and paren == 0 and stack != FREE:
            return self.nl_ok(self.lex.component(lx, self.nl), ind, stack, levels)
        return False

    def end_lexeme(self, state: int) -> int:
        """The state after the pending lexeme ends here (0 if it cannot). Memoized."""
        got = self._ends.get(state)
        if got is None:
            got = self.end_lexeme_low(state)
        return got[0]

    def end_lexeme_low(self, state: int) -> tuple[int, int, int, int]:
        """``end_lexeme``, the lowest stack height and the lowest index of the indent
        levels it read (``INF``: none), and whether it read the bracket depth (1) or not
        (0). Memoized."""
        got = self._ends.get(state)
        if got is None:
            got = self._end_lexeme(self._keys[state])
            self._ends[state] = got
        return got

    def _end_lexeme(self, key: _Key) -> tuple[int, int, int, int]:
        lx, ind, stack, paren, levels, last_nl = key
        t = self.lex.winner(lx)
        inf = self.INF
        if t < 0:
            return 0, inf, inf, 0
        low, llow, pk = inf, inf, 0
        if stack != FREE and self.asi is not None:
            return self._end_lexeme_asi(t, stack, paren, levels, last_nl)
        if stack != FREE:
            low = self.stacks.depth(stack)  # the next start set reads the top
            if t not in self.g.ignore:
                if t == self.nl:
                    pk = 1
                    if paren == 0:
                        stack, levels, low, llow = self.feed_newline_low(stack, levels, ind)
                else:
                    stack, low = self.stacks.feed_low(stack, self.g.parser_index[t])
                    if t in self.opens:
                        paren += 1
                    elif t in self.closes:
                        pk = 1
                        if paren > 0:
                            paren -= 1
                if stack < 0:
                    return 0, low, llow, pk
        y = self.intern((self.start_lexer(stack), -1, stack, paren, levels, last_nl))
        return y, low, llow, pk

    def _end_lexeme_asi(self, t: int, stack: int, brk: int, levels: tuple[int, ...],
                        last_nl: int) -> tuple[int, int, int, int]:
        """``_end_lexeme`` for an ASI grammar: a line break sets the bit, a token is fed
        by ``AsiRules.sequence`` and clears it, an ignored lexeme keeps it."""
        asi = self.asi
        assert asi is not None
        inf = self.INF
        low = inf
        if t in asi.line_breaks:
            brk = 1
        elif t not in self.g.ignore:
            _, stack, low = asi.sequence(stack, brk, self.g.parser_index[t])
            if stack < 0:
                return 0, low, inf, 1
            brk = 0
        lx, lo = self.start_low(stack)
        y = self.intern((lx, -1, stack, brk, levels, last_nl))
        return y, min(low, lo), inf, 1

    def accepts_eof(self, state: int) -> bool:
        """Whether the input may end in ``state``. Memoized."""
        got = self._eof.get(state)
        if got is None:
            got = self._accepts_eof(state)
            self._eof[state] = got
        return got

    def _accepts_eof(self, state: int) -> bool:
        key = self._keys[state]
        lx, ind, stack = key[:3]
        if key[5] == JOIN_END:
            return False
        if not self.lex.is_start(lx):
            if self.nl >= 0 and ind >= 0 and stack != FREE and self.lex.winner(lx) == self.nl:
                # The input ends in a line without code (blanks, a comment): like Python,
                # do not read its indentation (`if x:\n    y\n  ` ends the block).
                state = self._end_lexeme((lx, -1, *key[2:]))[0]
            else:
                state = self.end_lexeme(state)  # memoized: masks end the same lexemes
            if not state:
                return False
        _, _, stack, paren, levels, _ = self._keys[state]
        if stack == FREE:
            return True
        if self.asi is not None:
            return self.asi.end_sequence(stack) is not None
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
        lx, ind, stack, paren, levels, last = self._keys[state]
        nxt = self.lex.step(lx, b)
        if nxt:
            if self.lex.terms(nxt) & self.nl_bit:
                ind = self._indent_after(-1 if self.lex.absorbs(lx, b) else ind, b, 1 << 30)
            else:
                ind = -1
            if b == 10:
                last = JOIN_END if last == JOIN_BACKSLASH else LINE_END
            elif b == 92 and self.nl >= 0 and self.lex.only_line_end(nxt):
                last = JOIN_BACKSLASH
            else:
                last = OTHER
            key = (nxt, ind, stack, paren, levels, last)
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

    def mask(self, state: int) -> TokenMask:
        """The tokens legal in ``state`` (EOS excluded; the constraint adds it). Memoized."""
        return self.masks.mask(state)

    def n_states(self) -> int:
        """How many constraint states exist so far."""
        return len(self._keys)


__all__ = ["FREE", "LarkRuntime"]
