"""Stopping points by construct for fill-in-the-middle: ``stop="statement"`` and ``"block"``.

A completion C is typed between a prefix P (above the cursor) and a suffix S (below it).
With these stops C is *accepting* only where P + C + S parses **and** C ends where the
construct holding the cursor ends. The construct is a node of a *stop rule* of the grammar
(``statement``: python's ``stmt``/``simple_stmt``, javascript's ``_stmt``/``class_member``,
sql's ``statement``; ``block``: python's ``suite``, javascript's ``block``/``class_body``;
see :func:`construct_rules`), read off the LALR parse of P + C + S:

- *anchor*: the stack height up to which the parser stack holds text from before the
  cursor. A node reduced at height ``<= anchor`` contains the cursor; one at
  ``anchor + 1`` starts in C (the statement C began). Tracked exactly through every
  reduction (a reduction to height ``h`` makes ``anchor = min(anchor, h)``; for
  statements, the list node that wraps C's first statement at ``anchor + 1`` raises it
  there, so C's next statement is again at ``anchor + 1``: ``ConstructStops._fold``); the
  lexeme pending at the cursor (``"x = fo|"``) counts as before the cursor.
- *layout*: ``%ignore``\\ d lexemes and the indenter's newline (with its INDENT/DEDENTs).
  "Ends at C's end" is modulo layout: the node is reduced when the first non-layout token
  after C's last non-layout token is fed (or at end of input), and that token is in S.

Let N be the first stop-rule node at the cursor's level (height ``<= anchor``, or
``anchor + 1`` for statements) reduced at or after C's end. C is accepting iff C holds a
non-layout byte, C does not end inside a token (``fo`` + ``o()``), P + C + S parses, and:

- N ends at C's end (modulo layout; SQL's ``;`` as C's last token also ends its statement,
  see ``construct_terminators``); or
- N ends further into S and contains the cursor (the suffix completes the statement or
  block the cursor is in: ``print(`` + C + ``)``) and C fed no statement terminator
  (Python's ``;``: the statement after it is C's own, though the line's ``simple_stmt``
  holds the cursor), or C and S meet at a line break (C wrote
  the head of a compound statement whose body S holds, as line-based infilling does:
  ``for x in xs:\\n`` + the indented body). In an indenter grammar the line break is read
  off the lexemes: a newline lexeme between C's last token and S's first (the indenter's
  NEWLINE, or a newline inside brackets); an explicit line join (``\\`` + newline, an
  ignored lexeme) is none: ``if x:\\`` + newline + ``return y`` is one line; or
- there is no N at all (the cursor is in no such construct, e.g. ``block`` at the top
  level): any end that parses.

Not accepting: C began a statement that S finishes on the same line (``foo(`` + ``1)``),
or (``block``) C ran past the end of the block holding the cursor.

C is *final* (nothing but EOS may follow) where it is accepting and its end is certain:
every way the pending lexeme can end and every terminal the parser can take next reduce N
there (``x = 1\\n`` in Python, ``return y;`` or a block's ``}`` in JavaScript). A Python
block can always take another line, so ``block`` never forces the end there: EOS is
allowed at each line where S closes the block, and the model chooses.

Dead ends (``block``): states from which no continuation accepts because the block holding
the cursor is closed behind code of C; the view's masks drop the tokens leading there
(``dedent_drop``, ``doomed``; see ``docs/lark_grammars.md``, stopping points).

Tolerant (parser-free) states have no parse: there every stop acts as ``"eof"``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from structspec.automata.base import TokenMask
from structspec.automata.lalr import END
from structspec.automata.lark_constraint import FREE
from structspec.automata.lark_grammar import TAB_REFUSED
from structspec.errors import GrammarError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from structspec.automata.lark_constraint import LarkRuntime
    from structspec.automata.lark_grammar import LoadedGrammar

CONSTRUCT_STOPS = ("statement", "block")

Key = tuple[int, int, bool, bool, bool, bool, bool, bool]
"""A view state: (runtime state, anchor, pre, moved, solid, left, tail_nl, sep).

``pre``: the lexeme pending at the cursor has not ended yet; ``moved``: C is not empty;
``solid``: a non-layout lexeme holding bytes of C has ended; ``left`` (``block``): the
block holding the cursor ended inside C; ``tail_nl``: in an indenter grammar, a line
break (:meth:`ConstructStops.line_break`) ended inside C after its last non-layout lexeme
(read only where the lexeme pending at C's end is layout); in others, C's last bytes after
its last non-blank one hold a ``\\n``; ``sep``: C fed a statement terminator (``;``, see
:func:`construct_terminators`), so a stop node holding the cursor that S ends is not one S
completes for the cursor: the statement after the ``;`` is C's own."""

_BLANK = frozenset(b" \t\r\f")

_Reds = tuple[tuple[bool, int], ...]  # per reduction: (its rule is a stop rule, its height)


def construct_rules(g: LoadedGrammar, stop: str, rules: str | Iterable[str] | None = None
               ) -> frozenset[str]:
    """The nonterminals that make the construct of ``stop`` (``"statement"``/``"block"``).

    Args:
        g: the loaded grammar.
        stop: ``"statement"`` or ``"block"``.
        rules: rule names (a comma-separated string or an iterable); default: the
            grammar's header comment, ``// structspec: stop_statement=a,b stop_block=c``.

    Raises:
        GrammarError: the grammar names no rule for ``stop`` (and none was given), or a
            named rule is not a nonterminal of the grammar (names listed in the message).
    """
    from structspec.grammars import header_options

    if rules is None:
        rules = header_options(g.source[0]).get(f"stop_{stop}")
        if rules is None:
            raise GrammarError(
                f"stop={stop!r} needs the grammar's {stop} rules: this grammar declares none "
                f"(add `stop_{stop}=RULE[,RULE]` to its `// structspec:` header, or pass "
                f"stop_rules= to with_suffix)")
    names = [r.strip() for r in (rules.split(",") if isinstance(rules, str) else rules)]
    names = [r for r in names if r]
    known = set(g.tables.rule_lhs)
    bad = [r for r in names if r not in known]
    if bad or not names:
        raise GrammarError(f"stop_rules for stop={stop!r}: {', '.join(map(repr, bad)) or 'none'}"
                           f" {'is not a rule' if len(bad) == 1 else 'are not rules'} of the"
                           f" grammar (rules are named as in the .lark file, e.g. "
                           f"{', '.join(sorted(n for n in known if not n.startswith('__'))[:6])})")
    return frozenset(names)


def construct_terminators(g: LoadedGrammar, stop: str) -> frozenset[int]:
    """Lexer ids of the terminals that end a statement from outside its node (SQL's
    ``;`` separates statements: ``start: statement (";" statement)*``) or between the
    statements of one node (Python's ``;`` in a ``simple_stmt``): a statement node closed by
    such a token, C's last, ends C, and after one C fed, what follows is C's own statement
    (S may not finish it). From the grammar's ``stop_terminators=NAME[,NAME]``
    option (terminal names as lark gives them, e.g. ``SEMICOLON``); none for ``block``.

    Raises:
        GrammarError: a name that is not one of the grammar's terminals.
    """
    from structspec.grammars import header_options

    if stop != "statement":
        return frozenset()
    names = [n.strip() for n in header_options(g.source[0]).get("stop_terminators", "")
             .split(",") if n.strip()]
    ids = {t.name: i for i, t in enumerate(g.terminals)}
    bad = [n for n in names if n not in ids]
    if bad:
        raise GrammarError(f"stop_terminators: {', '.join(map(repr, bad))} "
                           f"{'is not a terminal' if len(bad) == 1 else 'are not terminals'} "
                           f"of the grammar")
    return frozenset(ids[n] for n in names)


class ConstructStops:
    """The parse-side bookkeeping of one ``statement``/``block`` view: steps view states,
    decides acceptance and finality (module doc). Pure functions of their arguments,
    memoized; shares the runtime's tables (thread-safe as they are: dicts only grow)."""

    def __init__(self, rt: LarkRuntime, stop: str, rules: frozenset[str], suffix: bytes,
                 terminators: frozenset[int] = frozenset()) -> None:
        self.rt = rt
        self.terminators = terminators
        self.block = stop == "block"
        self.plus = 0 if self.block else 1  # a statement C began counts; a block must hold C
        self.rules = rules
        self.suffix = suffix
        blank = len(suffix) - len(suffix.lstrip(bytes(_BLANK) + b"\n"))
        self.suffix_nl = b"\n" in suffix[:blank]  # S starts on a new line
        g = rt.g
        self.layout = frozenset(g.ignore) | ({rt.nl} if rt.nl >= 0 else set()) | (
            rt.asi.line_breaks if rt.asi is not None else frozenset())
        self.layout_bits = sum(1 << i for i in self.layout)
        t = g.tables
        self.end = t.index[END] if END in t.terminals else -1
        self.indenter = {rt.p_indent, rt.p_dedent} - {-1}
        self.p_nl = g.parser_index[rt.nl] if rt.nl >= 0 else -1
        self._reds: dict[tuple[int, int], _Reds] = {}
        self._ends: dict[int, tuple[int, _Reds, int] | None] = {}
        self._closed: dict[int, bool] = {}
        self._closers: frozenset[int] | None = None
        self._cands: TokenMask | None = None
        self._dedent_masks: dict[tuple[int, tuple[int, ...]], TokenMask] = {}

    # -- the parser, with reductions reported ----------------------------------------------

    def reductions(self, stack: int, term: int) -> _Reds:
        """The reductions LALR makes on ``stack`` before it shifts parser terminal ``term``
        (or finds it an error), as (stop rule?, height of the new node). Memoized."""
        ck = (stack, term)
        got = self._reds.get(ck)
        if got is None:
            t = self.rt.stacks.tables
            st = self.rt.stacks.states(stack)
            out = []
            while True:
                code = t.actions[st[-1]].get(term)
                if code is None or code >= 0:
                    break
                rule = -code - 1
                n = t.rule_len[rule]
                if n:
                    del st[-n:]
                if not st:  # pragma: no cover - lark's tables never pop the start state
                    break
                nxt = t.gotos[st[-1]].get(t.rule_lhs[rule])
                if nxt is None:
                    break
                st.append(nxt)
                out.append((t.rule_lhs[rule] in self.rules, len(st)))
                if nxt == t.end_state:
                    break
            got = tuple(out)
            self._reds[ck] = got
        return got

    def _feed_all(self, stack: int, terms: list[int]) -> tuple[_Reds, int]:
        """Feed ``terms`` in turn: every reduction on the way, and the stack (-1: error)."""
        reds: list[tuple[bool, int]] = []
        for p in terms:
            reds += self.reductions(stack, p)
            stack = self.rt.stacks.feed(stack, p)
            if stack < 0:
                break
        return tuple(reds), stack

    def _feed_token(self, stack: int, brk: int, p: int) -> tuple[_Reds, int]:
        """Feed the token of parser terminal ``p`` (with ASI's ``_ASI`` before it where the
        grammar has ASI and inserts one; ``brk``: a line break came before it): the
        reductions on the way and the stack after (-1: error)."""
        asi = self.rt.asi
        if asi is None:
            return self._feed_all(stack, [p])
        seq, _, _ = asi.sequence(stack, brk, p)
        return self._feed_all(stack, list(seq)) if seq is not None else ((), -1)

    def _token_terms(self, stack: int) -> set[int]:
        """Parser terminals a token may be fed as on ``stack`` (for ASI grammars also those
        taken after an inserted ``_ASI``, which is itself no token)."""
        rt = self.rt
        acts = rt.stacks.tables.actions
        out = set(acts[rt.stacks.top(stack)])
        if rt.asi is not None:
            after = rt.stacks.feed(stack, rt.asi.p_asi)
            if after >= 0:
                out |= set(acts[rt.stacks.top(after)])
            out.discard(rt.asi.p_asi)
        return out

    def _newline_terms(self, levels: tuple[int, ...], indent: int) -> list[int] | None:
        """The indenter's tokens for a newline with ``indent`` columns (``None``: a dedent
        to no open level)."""
        out = [self.p_nl]
        if indent >= TAB_REFUSED:  # a refused tab in the indentation (IndenterSpec.tabs)
            return None
        if indent < 0:
            indent = levels[-1]
        if indent > levels[-1]:
            return [*out, self.rt.p_indent]
        while indent < levels[-1]:
            levels = levels[:-1]
            out.append(self.rt.p_dedent)
        return out if indent == levels[-1] else None

    def line_break(self, rs: int, t: int) -> bool:
        """Whether the lexeme pending in runtime state ``rs``, ending as terminal ``t``,
        ends a line in an indenter grammar: the newline lexeme holding a ``\\n`` (at
        bracket depth 0 the indenter's NEWLINE; inside brackets a physical line end the
        indenter drops, as in line-based infilling of a bracketed literal). Not one: an
        explicit line join (``\\`` + newline, an ignored lexeme of its own: it makes two
        physical lines one, ``if x:\\`` + newline + ``return y`` is ``if x: return y``),
        a comment without its newline."""
        return t == self.rt.nl and self.rt.key(rs)[1] != -1

    def lexeme_end(self, rs: int) -> tuple[int, _Reds, int] | None:
        """The pending lexeme of runtime state ``rs`` ending here: (its terminal, the
        reductions feeding it makes, the stack after), ``None`` if it cannot end. Mirrors
        the runtime's ``end_lexeme`` (the indenter included). Memoized."""
        if rs in self._ends:
            return self._ends[rs]
        rt = self.rt
        lx, ind, stack, paren, levels, _ = rt.key(rs)
        t = rt.lex.winner(lx)
        e = rt.end_lexeme(rs) if t >= 0 else 0
        got: tuple[int, _Reds, int] | None = None
        if e:
            after = rt.key(e)[2]
            reds: _Reds = ()
            if stack != FREE and t not in self.layout:
                reds, _ = self._feed_token(stack, paren, rt.g.parser_index[t])
            elif stack != FREE and t == rt.nl and paren == 0:
                reds, _ = self._feed_all(stack, self._newline_terms(levels, ind) or [])
            got = (t, reds, after)
        self._ends[rs] = got
        return got

    def eof_reductions(self, stack: int, paren: int, levels: tuple[int, ...]
                       ) -> _Reds | None:
        """The reductions at end of input on ``stack`` (no lexeme pending): the implied
        final newline, the closing DEDENTs, ``$END`` — along the path the runtime's
        ``accepts_eof`` takes; ``None`` where the input cannot end there."""
        rt = self.rt
        if stack == FREE:
            return ()
        if rt.asi is not None:
            seq = rt.asi.end_sequence(stack)
            if seq is None:
                return None
            reds, s = self._feed_all(stack, list(seq))
            return reds + self.reductions(s, self.end)
        if rt.nl < 0:
            return self.reductions(stack, self.end) if rt.stacks.accepts_end(stack) else None
        paths: list[tuple[list[int], tuple[int, ...]]] = [([], levels)]
        if paren == 0:
            terms = self._newline_terms(levels, 0)
            if terms is not None:
                paths.append((terms, levels[:1]))
        for terms, lv in paths:
            reds, s = self._feed_all(stack, [*terms, *[rt.p_dedent] * (len(lv) - 1)])
            if s >= 0 and rt.stacks.accepts_end(s):
                return reds + self.reductions(s, self.end)
        return None

    # -- view states ---------------------------------------------------------------------

    def start(self, rs: int) -> Key:
        """The view state of runtime state ``rs``, the cursor being there."""
        lx, _, stack, _, _, _ = self.rt.key(rs)
        anchor = self.rt.stacks.depth(stack) if stack != FREE else 0
        return (rs, anchor, not self.rt.lex.is_start(lx), False, False, False, False, False)

    def step(self, key: Key, data: bytes) -> Key | None:
        """The view state after ``data`` (``None``: the runtime refuses it). Pure."""
        rt = self.rt
        lex = rt.lex
        rs, anchor, pre, moved, solid, left, tail_nl, sep = key
        indented = rt.nl >= 0
        for b in data:
            lx = rt.key(rs)[0]
            if lex.is_start(lx):
                pass
            elif lex.absorbs(lx, b):  # an ignored lexeme ends: no parser change
                pre = False
            elif not lex.step(lx, b):  # the pending lexeme ends before b
                end = self.lexeme_end(rs)
                if end is None:
                    return None
                t, reds, after = end
                prev = -1
                for hit, h in reds:
                    if hit and self.block and solid and h <= anchor and not pre:
                        left = True  # the cursor's block closed, and C goes on
                    anchor, prev = self._fold(anchor, hit, h, prev)
                if t in self.terminators and not pre:
                    sep = True  # C's `;`: what follows it on the line is C's own statement
                if pre:  # the lexeme at the cursor: all of it is from before the cursor
                    anchor = rt.stacks.depth(after) if after != FREE else 0
                    pre = False
                if moved and t not in self.layout:
                    solid = True
                if indented:
                    tail_nl = t in self.layout and (tail_nl or self.line_break(rs, t))
            rs = rt.step_byte(rs, b)
            if not rs:
                return None
            moved = True
            if not indented:
                if b == 10:
                    tail_nl = True
                elif b not in _BLANK:
                    tail_nl = False
        return (rs, anchor, pre, moved, solid, left, tail_nl, sep)

    def accepting(self, key: Key) -> bool:
        """Whether C ends at the stopping point (module doc); the caller has checked that
        P + C + S parses."""
        rs, anchor, pre, moved, solid, left, tail_nl, sep = key
        if not moved or left:
            return False
        lx = self.rt.key(rs)[0]
        lex = self.rt.lex
        if not lex.is_start(lx) and lex.winner(lx) < 0 and \
                not lex.terms(lx) & ~self.layout_bits:
            # C ends inside a layout lexeme that only S can complete (Python's `\` of a
            # line join, which joins C's last line with S's first): not a stopping point
            return False
        rt, lex, data = self.rt, self.rt.lex, self.suffix
        # C and S meet at a line break. Indenter grammars: a newline lexeme between C's
        # last token and S's first (not a `\` + newline join: ``line_break``), seen in C
        # (``tail_nl``) or below in S; others: a `\n` in the blanks where C and S meet.
        indented = rt.nl >= 0
        broke = tail_nl or (not indented and self.suffix_nl)
        window, first, i, n = True, True, 0, len(data)
        s = rs
        while True:
            lx = rt.key(s)[0]
            if i < n and not lex.is_start(lx) and lex.absorbs(lx, data[i]):
                if first and not solid:
                    return False  # C is all layout
                first = pre = False  # an ignored lexeme ended: layout
            elif i < n and (lex.is_start(lx) or lex.step(lx, data[i])):
                pass
            else:  # the pending lexeme ends here (before data[i], or at the end)
                end = self.lexeme_end(s)
                if end is None:
                    return False
                t, reds, after = end
                layout = t in self.layout
                before = solid  # C held a non-layout token before this one
                if indented and window:
                    if first and not layout:
                        broke = False  # C's last token is this one: the gap is after it
                    elif layout and self.line_break(s, t):
                        broke = True
                if first:
                    solid = solid or not layout
                    if not solid:
                        return False  # C is all layout
                    if not layout and i > 0:
                        return False  # T1 ran on into S: C ended inside a token
                prev = -1
                for hit, h in reds:
                    if hit and h <= anchor + self.plus:
                        if layout or not first:
                            return window or (h <= anchor and not sep) or broke
                        # T1 is C's last token, not layout: the node ended before it
                        if t in self.terminators:
                            return True  # ... and T1 is its terminator (SQL's `;`)
                        if self.block and before and h <= anchor and not pre:
                            return False  # C ran past the end of the cursor's block
                    anchor, prev = self._fold(anchor, hit, h, prev)
                if pre:
                    anchor = rt.stacks.depth(after) if after != FREE else 0
                    pre = False
                if not layout and not first:
                    window = False  # the first token of S is fed: the window closes
                first = False
                if i == n:
                    _, _, st, paren, lv, _ = rt.key(rt.end_lexeme(s))
                    reds2 = self.eof_reductions(st, paren, lv)
                    for hit, h in reds2 or ():
                        if hit and h <= anchor + self.plus:
                            return window or (h <= anchor and not sep) or broke
                        anchor = min(anchor, h)
                    return True  # no construct holds the cursor: any end that parses
            s = rt.step_byte(s, data[i])
            if not s:
                return False
            i += 1

    def certain(self, key: Key) -> bool:
        """Whether C's end is the stopping point whatever C would add: every way the
        pending lexeme can end, then every terminal the parser takes, reduces a stop-rule
        node at the cursor's level there. Conservative (``False`` when unsure); asked of
        accepting states only (C holds a non-layout byte)."""
        rt = self.rt
        rs, anchor, pre = key[:3]
        lx, _, stack, paren, levels, _ = rt.key(rs)
        if stack == FREE or rt.lex.is_start(lx):
            return False
        terms = rt.lex.terms(lx)
        nl_bit = 1 << rt.nl if rt.nl >= 0 else 0
        # (stack, anchor, paren, levels) after the pending lexeme, where no hit happened yet
        branches: list[tuple[int, int, int, tuple[int, ...]]] = []
        if terms & ~self.layout_bits:  # a token: it must be unable to grow
            if terms & self.layout_bits or not self._closed_lexeme(lx):
                return False
            end = self.lexeme_end(rs)
            if end is None:
                return False
            t, reds, after = end
            if t in self.terminators and not pre and self._hits(reds, anchor):
                return True
            anchor = rt.stacks.depth(after) if pre else self._lowered(reds, anchor)
            e = rt.key(rt.end_lexeme(rs))
            branches.append((after, anchor, e[3], e[4]))
        else:  # layout: ignored (no feed), or the newline at some indentation
            if terms & ~nl_bit or paren > 0:
                branches.append((stack, anchor, paren, levels))
            if terms & nl_bit and paren == 0:
                for indent in sorted({*levels, levels[-1] + 1}):
                    nl_terms = self._newline_terms(levels, indent)
                    if nl_terms is None:
                        continue
                    reds, after = self._feed_all(stack, nl_terms)
                    if after < 0 or self._hits(reds, anchor):
                        continue
                    lv = (*levels, indent) if indent > levels[-1] else \
                        tuple(x for x in levels if x <= indent)
                    branches.append((after, self._lowered(reds, anchor), 0, lv))
        # (ASI: whether a line break comes before the next token is C's choice too)
        brks = (0, 1) if rt.asi is not None else (0,)
        for s, a, par, lv in branches:
            for p in self._token_terms(s):
                if p in self.indenter:
                    continue
                for brk in brks:
                    if p == self.end:
                        reds_end = self.eof_reductions(s, par, lv)
                        if reds_end is None:
                            continue
                        reds = reds_end
                    else:
                        reds, after = self._feed_token(s, brk if rt.asi else par, p)
                        if after < 0:
                            continue
                    if not self._hits(reds, a):
                        return False
        return True

    # -- dead ends: a line dedented out of the block (indentation grammars) ------------------

    def dedent_drop(self, key: Key) -> TokenMask | None:
        """``block`` on an indentation grammar, at the start of a line (the newline lexeme
        pending, after C wrote code): the tokens whose first code byte ends that line's
        indentation at a level whose dedent closes the block holding the cursor. Every
        continuation after one of them runs past the block (never accepting), so masks drop
        them. Exact for that first lexeme end (a dedent inside a multi-line token is the
        ``candidates`` scan's). ``None``: none here. Memoized per indentation."""
        rt = self.rt
        rs, anchor, pre, _, solid, _, _, _ = key
        if not self.block or rt.nl < 0 or pre or not solid:
            return None
        lx, ind, stack, paren, levels, _ = rt.key(rs)
        if paren > 0 or ind < 0 or stack == FREE or rt.lex.terms(lx) != 1 << rt.nl:
            return None
        dooms = tuple(x for x in levels[:-1] if self._doomed_after(stack, levels, x, anchor))
        if not dooms:
            return None
        ck = (ind, dooms)
        got = self._dedent_masks.get(ck)
        if got is None:
            nl_w, w_after, w_all, code = _indent_table(rt.vocab.tokens, rt.tab_len)
            final = np.where(nl_w, w_after, ind + w_all)  # [V] column of the first code byte
            got = TokenMask.from_ids(np.flatnonzero(code & np.isin(final, dooms)),
                                     len(rt.vocab))
            self._dedent_masks[ck] = got
        return got

    def doomed(self, key: Key) -> bool | None:
        """``block``: whether the view state ``key`` can never accept again because the
        block holding the cursor is closed behind C's code: C already ran past it
        (``left``), or whatever the token C is in the middle of turns out to be, feeding it
        closes the block (``x = 1\\nz`` dedented out of it). ``None``: not decided here —
        C's pending token is a closer (``}``) that ends the block right after it
        (``closer_pending``; the caller checks that and acceptance). Conservative."""
        rs, anchor, pre, _, solid, left, _, _ = key
        if left:
            return True
        if pre or not solid or not self.block:
            return False
        rt = self.rt
        lx, _, stack, paren, _, _ = rt.key(rs)
        if stack == FREE or rt.lex.is_start(lx):
            return False
        terms = rt.lex.terms(lx)
        if terms & self.layout_bits:
            return False
        taken = False
        for i in range(terms.bit_length()):
            p = rt.g.parser_index[i] if terms >> i & 1 else -1
            if p < 0:
                continue
            reds, after = self._feed_token(stack, paren, p)
            if after < 0:
                continue
            taken = True
            if not self._hits(reds, anchor):
                return None if self.closer_pending(key) else False
        return taken

    def closer_pending(self, key: Key) -> bool:
        """Whether C ends with a token that cannot grow and closes a block (``}``), in a
        grammar without an indenter (there, layout after C changes nothing: if P + C + S
        does not parse and the block's end is certain, no continuation accepts). With ASI
        a line break after C could change the parse, unless S begins on a new line."""
        rt = self.rt
        if rt.nl >= 0 or (rt.asi is not None and not self.suffix_nl) or key[2] or not key[4]:
            return False
        lx = rt.key(key[0])[0]
        if rt.lex.is_start(lx) or not self._closed_lexeme(lx):
            return False
        t = rt.lex.winner(lx)
        return t >= 0 and rt.g.parser_index[t] in self.closers()

    def closers(self) -> frozenset[int]:
        """Parser terminals whose shift completes a stop-rule node (``}`` of ``block``)."""
        got = self._closers
        if got is None:
            t = self.rt.stacks.tables
            ck = (id(t), self.rules)
            hit = _CLOSERS.get(ck)
            if hit is None or hit[1] is not t:
                hit = (frozenset(
                    p for acts in t.actions for p, q in acts.items()
                    if q >= 0 and any(c < 0 and t.rule_lhs[-c - 1] in self.rules
                                      for c in t.actions[q].values())), t)
                with _TABLES_LOCK:
                    if len(_CLOSERS) >= 8:
                        _CLOSERS.clear()
                    _CLOSERS[ck] = hit
            got = self._closers = hit[0]
        return got

    def candidates(self) -> TokenMask | None:
        """The tokens that can close the cursor's block inside them: those
        holding a closer's text (``}``) or, in an indentation grammar, a newline then a
        code byte. ``None`` for statement views. Cached per vocabulary."""
        if not self.block:
            return None
        if self._cands is None:
            rt = self.rt
            closers = self.closers()
            lits = tuple(sorted({lit for i, term in enumerate(rt.g.terminals)
                                 if rt.g.parser_index[i] in closers
                                 and (lit := term.dfa.literal())}))
            table = _candidate_table(rt.vocab.tokens, lits, rt.nl >= 0)
            self._cands = TokenMask.from_ids(np.flatnonzero(table), len(rt.vocab))
        return self._cands

    def _doomed_after(self, stack: int, levels: tuple[int, ...], indent: int, anchor: int
                      ) -> bool:
        """Whether a newline at ``indent`` columns, then any terminal the parser takes,
        closes the block holding the cursor (a stop-rule node at height ``<= anchor``)."""
        rt = self.rt
        reds, after = self._feed_all(stack, self._newline_terms(levels, indent) or [])
        if after < 0 or self._hits(reds, anchor):
            return after >= 0
        anchor = self._lowered(reds, anchor)
        lv = tuple(x for x in levels if x <= indent)
        for p in rt.stacks.tables.actions[rt.stacks.top(after)]:
            if p in self.indenter:
                continue
            if p == self.end:
                got = self.eof_reductions(after, 0, lv)
                if got is None:
                    continue
            elif rt.stacks.feed(after, p) < 0:
                continue
            else:
                got = self.reductions(after, p)
            if not self._hits(got, anchor):
                return False
        return True

    def _hits(self, reds: _Reds, anchor: int) -> bool:
        for hit, h in reds:
            if hit and h <= anchor + self.plus:
                return True
            anchor = min(anchor, h)
        return False

    def _lowered(self, reds: _Reds, anchor: int) -> int:
        """The anchor after ``reds`` (no hit among them: :meth:`_fold` each)."""
        prev = -1
        for hit, h in reds:
            anchor, prev = self._fold(anchor, hit, h, prev)
        return anchor

    def _fold(self, anchor: int, hit: bool, h: int, prev: int) -> tuple[int, int]:
        """The anchor after one reduction (stop rule? ``hit``, to height ``h``; ``prev``:
        the height of the reduction just before it in the same chain if that one was a
        stop rule, else -1), and ``prev`` for the next one. A reduction lowers the anchor
        to its height; and in a statement view, a non-stop-rule node that wraps a
        statement C completed at the cursor's level (``anchor + 1``), the list
        ``stmt+``/``_stmt*`` begun by C's first statement there, raises it to that
        height: the list joins the text before the cursor, so C's next statement beside
        it (one entry higher) is again at ``anchor + 1``. (Without this, C's second
        statement at the start of a body would count as nested: ``y = 2\\n    foo(`` +
        ``1)`` would stop.)"""
        if self.plus and not hit and h == prev == anchor + 1:
            return h, -1
        return min(anchor, h), h if hit else -1

    def _closed_lexeme(self, lx: int) -> bool:
        """Whether no byte can extend the lexeme at lexer state ``lx``."""
        got = self._closed.get(lx)
        if got is None:
            lex = self.rt.lex
            got = not any(lex.step(lx, b) and not lex.absorbs(lx, b) for b in range(256))
            self._closed[lx] = got
        return got


_CODE_STOP = frozenset(b" \t\n\r\f#\\")  # bytes that do not end a newline lexeme for sure
#: Per (vocabulary, tab width): the four ``[V]`` tables and the tokens they were built for.
_TABLES: dict[tuple[int, int],
              tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[bytes, ...]]] = {}
_TABLES_LOCK = threading.Lock()


def _indent_table(tokens: tuple[bytes, ...], tab_len: int) -> tuple[np.ndarray, ...]:
    """Per token (``[V]`` arrays): whether its leading run of spaces, tabs, form feeds and
    newlines holds a newline or a form feed (the column restarts); the run's width after
    the last of them; the whole run's width
    (spaces 1, tabs ``tab_len``: the indenter's count); and whether a code byte (not blank,
    ``#`` or ``\\``) follows the run. Cached per vocabulary."""
    ck = (id(tokens), tab_len)
    got = _TABLES.get(ck)
    if got is None or got[-1] is not tokens:
        n = len(tokens)
        nl_w = np.zeros(n, dtype=bool)
        w_after = np.zeros(n, dtype=np.int64)
        w_all = np.zeros(n, dtype=np.int64)
        code = np.zeros(n, dtype=bool)
        for i, tok in enumerate(tokens):
            run = len(tok) - len(tok.lstrip(b" \t\n\f"))
            lead = tok[:run]
            cut = max(lead.rfind(b"\n"), lead.rfind(b"\f"))  # a form feed: column 0
            after = lead[cut + 1:]
            nl_w[i] = cut >= 0
            w_after[i] = after.count(b" ") + tab_len * after.count(b"\t")
            w_all[i] = lead.count(b" ") + tab_len * lead.count(b"\t")
            code[i] = run < len(tok) and tok[run] not in _CODE_STOP
        got = (nl_w, w_after, w_all, code, tokens)
        with _TABLES_LOCK:
            if len(_TABLES) >= 4:
                _TABLES.clear()
            _TABLES[ck] = got
    return got[:4]


_CLOSERS: dict[tuple[int, frozenset[str]], tuple[frozenset[int], object]] = {}
_CANDIDATES: dict[tuple[int, tuple[bytes, ...], bool], tuple[np.ndarray, tuple]] = {}


def _candidate_table(tokens: tuple[bytes, ...], lits: tuple[bytes, ...], indented: bool
                     ) -> np.ndarray:
    """``[V]`` bool: tokens holding one of ``lits``, or (``indented``) a ``\\n`` followed
    by blanks and a code byte. Cached per vocabulary."""
    ck = (id(tokens), lits, indented)
    got = _CANDIDATES.get(ck)
    if got is None or got[1] is not tokens:
        out = np.zeros(len(tokens), dtype=bool)
        for i, tok in enumerate(tokens):
            if any(lit in tok for lit in lits):
                out[i] = True
            elif indented and b"\n" in tok:
                rest = tok[tok.index(b"\n"):].lstrip(b" \t\n")
                out[i] = bool(rest) and rest[0] not in _CODE_STOP
        got = (out, tokens)
        with _TABLES_LOCK:
            if len(_CANDIDATES) >= 8:
                _CANDIDATES.clear()
            _CANDIDATES[ck] = got
    return got[0]


__all__ = ["CONSTRUCT_STOPS", "ConstructStops", "construct_rules", "construct_terminators"]
