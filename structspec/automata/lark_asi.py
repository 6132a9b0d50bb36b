"""Automatic semicolon insertion (ECMAScript's ASI) on the interned LALR stacks.

The constraint state of an ASI grammar carries one more bit: whether a line break came
since the last token (the runtime keeps it in the state's bracket-depth slot, which only
the indenter uses otherwise). Given the parser stack S, that bit and the next token T,
:meth:`AsiRules.sequence` says which parser terminals are fed — ``(T,)``, ``(_ASI, T)`` or
none (an error) — by ECMAScript's rules (see :class:`.lark_grammar.AsiSpec`):

1. after a line break, ``=>`` is an error; after a line break and ``return``, ``break``,
   ``continue``, ``throw`` or ``yield`` the statement ends (``_ASI`` first, or an error);
   after a line break, a postfix ``++``/``--`` begins a new statement where one can end;
2. T when the parser takes it;
3. else ``_ASI``, T when a line break came before T or T is ``}``; at the end of
   input, ``_ASI`` where the parser cannot end without it.

Every answer comes with the lowest stack height it read (``ParserStacks.feed_low``), so
the masks' signatures stay exact. ``_ASI`` is a terminal of its own, not ``;``: the
grammar puts it only where a statement may end, so ASI never makes an empty statement or
a ``for`` head's semicolon, as ECMAScript requires.

Hand-written because no lexer-driven parser offers it: lark has no ASI, and the choice
needs the parser's answer for the token after the line break.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from structspec.automata.lalr import ParserStacks
    from structspec.automata.lark_grammar import LoadedGrammar


class AsiRules:
    """ASI for one loaded grammar over its :class:`ParserStacks`. Memo tables only grow
    (thread-safe as the runtime's are)."""

    def __init__(self, g: LoadedGrammar, stacks: ParserStacks) -> None:
        spec = g.asi
        assert spec is not None
        self.g = g
        self.stacks = stacks
        t = g.tables
        self.p_asi = t.index[spec.asi_type]
        self.line_breaks = frozenset(i for i, term in enumerate(g.terminals)
                                     if term.name in spec.line_break_types)
        self.line_break_bits = sum(1 << i for i in self.line_breaks)
        self.regex_goal = frozenset(i for i, term in enumerate(g.terminals)
                                    if term.name in spec.regex_types)

        def parser_ids(literals: tuple[str, ...]) -> frozenset[int]:
            want = {lit.encode() for lit in literals}
            return frozenset(g.parser_index[i] for i, term in enumerate(g.terminals)
                             if term.is_string and term.dfa.literal() in want
                             and g.parser_index[i] >= 0)

        self.p_close = parser_ids((spec.close_brace,))
        self.p_before = parser_ids(spec.restricted_before)
        self.p_never = parser_ids(spec.no_line_break_before)
        after = parser_ids(spec.restricted_after)
        # The LALR states entered by shifting a restricted_after token: an LR automaton's
        # state has one accessing symbol, so "the last token was `return`" is "the top
        # state is one of these" — those that shift something next (the statement or
        # expression goes on); a state that only reduces is the word as a property name
        # (`a.return`, `{ yield: 1 }`), where no restriction applies.
        self.after_states = frozenset(
            code for row in t.actions for p, code in row.items()
            if p in after and code >= 0 and any(c >= 0 for c in t.actions[code].values()))
        # the same three sets as lexer-terminal bitmasks (the runtime's rows are bitmasks)
        self.never_bits, self.before_bits, self.close_bits = (
            sum(1 << i for i, p in enumerate(g.parser_index) if p >= 0 and p in ps)
            for ps in (self.p_never, self.p_before, self.p_close))
        self._seq: dict[tuple[int, int, int], tuple[tuple[int, ...] | None, int, int]] = {}

    def sequence(self, stack: int, brk: int, p: int
                 ) -> tuple[tuple[int, ...] | None, int, int]:
        """The parser terminals fed for the token ``p`` (a parser terminal) on ``stack``
        after a line break (``brk`` 1) or not: ``(p,)``, ``(_ASI, p)`` or ``None`` (an
        error); the stack after them (-1 on error); and the lowest height read. Memoized."""
        ck = (stack, brk, p)
        got = self._seq.get(ck)
        if got is None:
            got = self._seq[ck] = self._sequence(stack, brk, p)
        return got

    def _sequence(self, stack: int, brk: int, p: int
                  ) -> tuple[tuple[int, ...] | None, int, int]:
        # The stack after `_ASI` is built only where the answer needs it: most tokens are
        # taken as they come.
        stacks = self.stacks
        low = stacks.depth(stack)  # the top is always read
        if brk and p in self.p_never:
            return None, -1, low
        feed = stacks.feed_low
        after_restricted = brk and stacks.top(stack) in self.after_states
        if after_restricted or (brk and p in self.p_before):
            asi, lo = feed(stack, self.p_asi)
            low = min(low, lo)
            if after_restricted or asi >= 0:
                if asi < 0:
                    return None, -1, low
                out, lo = feed(asi, p)
                return ((self.p_asi, p) if out >= 0 else None), out, min(low, lo)
        out, lo = feed(stack, p)
        low = min(low, lo)
        if out >= 0:
            return (p,), out, low
        if brk or p in self.p_close:
            asi, lo = feed(stack, self.p_asi)
            low = min(low, lo)
            if asi >= 0:
                out, lo = feed(asi, p)
                return ((self.p_asi, p) if out >= 0 else None), out, min(low, lo)
        return None, -1, low

    def end_sequence(self, stack: int) -> tuple[int, ...] | None:
        """The parser terminals fed before ``$END`` at the end of input on ``stack``:
        ``()``, ``(_ASI,)`` (ECMAScript inserts one at the end of input), or ``None``
        where the input cannot end."""
        if self.stacks.accepts_end(stack):
            return ()
        asi = self.stacks.feed(stack, self.p_asi)
        return (self.p_asi,) if asi >= 0 and self.stacks.accepts_end(asi) else None
