"""The ``counting`` drafter: the next numbers where the output counts.

Models write runs of numbers that neither the prompt lookup nor the draft head continues:
an example list (``[1, 2, 3, 4, 5]``), and a repeated line whose number goes up
(``largest_divisor(15)`` then ``largest_divisor(16)``; a numbered list's ``1.`` then
``2.``). The lookup copies the number it saw before — the wrong one — and the draft head
guesses a token ahead. On held-out HumanEval functions, passes ending at a digit were a
tenth of all (session 37). Written by hand because it is a few lines of arithmetic on the
output's text; the builder checks every drafted token against the constraint as usual.

Two rules, each one branch:

- *a run*: the output ends with numbers separated alike (``1, 2, 3, `` or ``1, 2, 3``) at a
  constant step (one number: step 1); drafted, the next numbers with that separator;
- *a repeated line*: an earlier line of the output begins as the current one does up to a
  number; drafted, the rest of that number plus one, then the punctuation that followed it
  there (up to the next letter or digit).
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING

from structspec.spec.drafters import register_drafter, text_before

if TYPE_CHECKING:
    from structspec.spec.draft_context import DraftContext
    from structspec.spec.tree import TreeBuilder

SOURCE = "counting"

#: Numbers and the separator after each, at the end of the text (a separator: a comma or
#: semicolon with optional spaces, or spaces alone).
_RUN = re.compile(rb"(?:(?<![\w.])-?\d{1,9}(?:[ \t]*[,;][ \t]*|[ \t]+))+(?:-?\d{1,9})?$")
_ITEM = re.compile(rb"(-?\d{1,9})([ \t]*[,;][ \t]*|[ \t]+)?")
#: A line's trailing digits (the number being written, maybe empty).
_TRAILING_DIGITS = re.compile(rb"\d*$")
_LEADING_NUMBER = re.compile(rb"\d{1,9}")
#: What follows a number up to the next letter, digit, ``_`` or non-ASCII byte (8 bytes at
#: most): ASCII punctuation only. A bytes pattern's ``\w`` is ASCII, and a UTF-8 letter's
#: bytes (``µ`` is ``\xc2\xb5``) passed as punctuation (a CI walk found ``0\xb5\n``).
_AFTER = re.compile(rb"[^\w\x80-\xff]{0,8}")


def run_continuation(text: bytes, count: int = 3) -> bytes | None:
    """The next ``count`` numbers of the run ``text`` ends with, each followed by the run's
    separator (the first preceded by it where ``text`` ends with a number), or ``None``
    where ``text`` does not end with a run: numbers with one separator between them, at a
    constant step (a single number followed by a comma or semicolon counts up by one;
    numbers between spaces only from three on). Pure."""
    m = _RUN.search(text)
    if m is None:
        return None
    items = _ITEM.findall(m.group(0))
    numbers = [int(n) for n, _ in items]
    seps = [s for _, s in items if s]
    if not seps or any(s != seps[0] for s in seps):
        return None
    sep = seps[0]
    ends_with_number = not items[-1][1]
    if not sep.strip() and len(numbers) < 3:
        return None  # numbers between spaces: a run only from three on ("return 1 if")
    if len(numbers) == 1:
        step = 1
    else:
        steps = {b - a for a, b in itertools.pairwise(numbers)}
        if len(steps) != 1:
            return None
        step = steps.pop()
        if step == 0:
            return None
    if ends_with_number and len(numbers) < 2:
        return None  # one number not yet followed by a separator: no run to speak of
    nxt = [numbers[-1] + step * (i + 1) for i in range(count)]
    body = sep.join(str(n).encode() for n in nxt) + sep
    return sep + body if ends_with_number else body


def increment_continuation(text: bytes, lines: int = 8) -> bytes | None:
    """Where the current line (after ``text``'s last newline) begins as one of the ``lines``
    lines before it does up to a number, the rest of that number plus one and the
    punctuation that followed it there; ``None`` where no earlier line does, the number
    plus one does not begin with the digits already written, or the line so far is only
    indentation (a docstring's expected values, ``    5``, are not a count). Pure."""
    head, _, line = text.rpartition(b"\n")
    if not head:
        return None
    written = _TRAILING_DIGITS.search(line).group(0)  # type: ignore[union-attr]
    prefix = line[:len(line) - len(written)]
    if prefix and not prefix.strip():
        return None  # indentation alone: a line of output values, not a count
    if prefix[-1:] == b"-":
        return None  # a negative number counts down: not guessed
    for earlier in reversed(head.split(b"\n")[-lines:]):
        if not earlier.startswith(prefix):
            continue
        rest = earlier[len(prefix):]
        number = _LEADING_NUMBER.match(rest)
        if number is None:
            continue
        plus_one = str(int(number.group(0)) + 1).encode()
        if len(plus_one) <= len(written) or not plus_one.startswith(written):
            return None
        after = _AFTER.match(rest, number.end()).group(0)  # type: ignore[union-attr]
        return plus_one[len(written):] + after
    return None


class CountingDrafter:
    """Registered as ``"counting"``: the run's next numbers and a repeated line's number plus
    one (see the module docstring), one branch each, tokenized canonically after the
    frontier token."""

    name = SOURCE
    #: Output text read (tokens before the frontier, then the drafted path).
    tail = 96

    def propose(self, ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
        if builder.room(frontier) <= 0:
            return
        text = text_before(ctx, builder, frontier, self.tail)
        if not any(48 <= b <= 57 for b in text[-48:]):
            return  # no number near: nothing to count (most steps)
        prev = ctx.vocab.token_bytes(builder.tokens[frontier])
        for cont in (run_continuation(text), increment_continuation(text)):
            if not cont:
                continue
            ids = ctx.canon.tokens_after(prev, cont)
            if ids:
                builder.add_branch(frontier, ids, self.name)
            if builder.branches >= builder.max_branches or builder.room(frontier) <= 0:
                return


register_drafter(SOURCE, CountingDrafter)
