"""The ``text_lookup`` drafter: the request's text continued where the output echoes it.

The ``lookup`` drafter matches token ids, so it misses the commonest echo of structured
output: a value copied from the request into a JSON string. There the same words are
tokenized otherwise (``'New'`` right after a quote, ``' New'`` after a space in the
request), cut otherwise (``'se'`` + ``'attle'``), or written in another case
(``"seattle"`` for "Seattle"). On held-out BFCL calls the passes that ended inside such
values were the largest group left once the forced keys were drafted (session 36). This
drafter matches *bytes*, with ASCII case folded and ``-``/``_`` read as spaces, from a word
start in the output's tail to a word start in the prompt, and drafts what followed there,
tokenized canonically after the frontier token. A model often writes a phrase of the request
as one identifier (``"gas_powered_vehicle"``, ``"ice_block"``): an echo written with ``_``
goes on joined the same way, and after a string value's first word both spellings are
drafted (BFCL dev rows 0-149, a fixed cost curve: 769 -> 763 passes; held-out 150-249 686 ->
684; code and prose unchanged).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from structspec.spec.drafters import ClosersDrafter, register_drafter, text_before
from structspec.spec.forced import costly_masks

if TYPE_CHECKING:
    from structspec.spec.draft_context import DraftContext
    from structspec.spec.tree import TreeBuilder

SOURCE = "text_lookup"


def _word_char(byte: int) -> bool:
    """Letters, digits, ``_`` and any non-ASCII byte (part of a UTF-8 letter)."""
    return byte >= 0x80 or byte == 0x5F or 0x30 <= byte <= 0x39 or 0x61 <= (byte | 0x20) <= 0x7A


class TextIndex:
    """Case-folded search of a text (the prompt) for what follows an echoed phrase.

    Args:
        text: the text to copy from (UTF-8 bytes).
        min_match: the shortest echo that counts, in bytes (a single letter starts too
            many words to guess from).
        max_match: how far back in the output an echo may start, in bytes.
    """

    def __init__(self, text: bytes, *, min_match: int = 2, max_match: int = 48) -> None:
        self.text = text
        self.folded = fold(text)
        self.min_match = min_match
        self.max_match = max_match

    def continuations(self, tail: bytes, length: int, *, per: int = 2,
                      scan: int = 16) -> list[bytes]:
        """What followed the longest echo of ``tail``'s end in the text: ``tail[i:]`` for
        the earliest word start ``i`` (within ``max_match`` bytes, at least ``min_match``
        long, holding a word character) that occurs in the text at a word start; up to
        ``per`` distinct continuations of ``length`` bytes at most, latest occurrence first
        (the request comes last in a prompt), each cut at a line break. Where the output
        wrote the echo in lower case and the text did not, the continuation is lowered too
        (a model that writes "se" for "Seattle" goes on with "attle"). Pure."""
        tail = tail[-self.max_match:]
        folded_tail = fold(tail)
        for i in range(len(tail)):
            if (i and _word_char(tail[i - 1])) or not _word_char(tail[i]):
                continue
            echo = folded_tail[i:]
            if len(echo) < self.min_match:
                break
            found = self._after(echo, tail[i:], length, per, scan)
            if found:
                return found
        return []

    def _after(self, echo: bytes, written: bytes, length: int, per: int,
               scan: int) -> list[bytes]:
        out: list[bytes] = []
        end = len(self.folded)
        for _ in range(scan):
            j = self.folded.rfind(echo, 0, end)
            if j < 0:
                break
            end = j + len(echo) - 1
            if j and _word_char(self.folded[j - 1]):
                continue
            start = j + len(echo)
            cont = self.text[start:start + length].split(b"\n", 1)[0]
            if not cont:
                continue
            if written.islower() and not self.text[j:start].islower():
                cont = cont.lower()
            if b"_" in written and b"_" not in self.text[j:start]:
                cont = snake(cont)  # "gas_" echoes "gas-powered vehicle": "powered_vehicle"
            if any(k.startswith(cont) for k in out):
                continue
            out = [k for k in out if not cont.startswith(k)]
            out.append(cont)
            if len(out) >= per:
                break
        return out


#: Case and word separators folded for matching: ASCII letters lowered, ``-`` and ``_``
#: read as a space (byte for byte, so offsets stay aligned).
_FOLD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ-_", b"abcdefghijklmnopqrstuvwxyz  ")


def fold(text: bytes) -> bytes:
    """``text`` as matched: ASCII case folded, ``-`` and ``_`` as spaces. A model copying a
    phrase of the request into a JSON string often writes it as one identifier
    ("gas-powered vehicle" as ``gas_powered_vehicle``). Pure."""
    return text.translate(_FOLD)


def snake(cont: bytes) -> bytes:
    """``cont`` with the spaces and hyphens between its leading words written as ``_``, up
    to the first other punctuation (``b" block of ice, 2 kg"`` -> ``b"_block_of_ice, 2
    kg"``). Pure."""
    out = bytearray(cont)
    for k, byte in enumerate(cont):
        if byte in b" -":
            if k + 1 < len(cont) and _word_char(cont[k + 1]):
                out[k] = 0x5F
                continue
            break
        if not _word_char(byte):
            break
    return bytes(out)


def word_end(cont: bytes) -> int:
    """Where the first word of ``cont`` ends: the end of the word the echo stopped inside
    (``b"attle"`` of ``b"attle in Seattle."``), else of the next one with what precedes it
    (``b" York"`` of ``b" York, USA"``); ``len(cont)`` if no word ends inside. Pure."""
    for k in range(1, len(cont)):
        if _word_char(cont[k - 1]) and not _word_char(cont[k]):
            return k
    return len(cont)


class TextLookupDrafter:
    """Branches copied from the prompt where the output's last words echo it as text (see
    the module docstring); :attr:`per` echoes at most. Each is
    drafted to the end of its first word, where the punctuation that would close a value
    there is drafted too (a JSON string copies a word or two of the request, then ends),
    and on to the end of the line."""

    name = SOURCE
    #: Echoes drafted per step at most (the latest occurrences).
    per = 2

    def __init__(self) -> None:
        self._closers = ClosersDrafter()

    def propose(self, ctx: DraftContext, builder: TreeBuilder, frontier: int) -> None:
        index = ctx.text_index
        room = builder.room(frontier)
        if index is None or room <= 0:
            return
        tail = text_before(ctx, builder, frontier, 16)
        prev = ctx.vocab.token_bytes(builder.tokens[frontier])
        # ~4 bytes per token: enough text for the room the branch has
        conts = index.continuations(tail, 4 * room + 8, per=self.per)
        if conts and _in_value_word(tail) and conts[0][:1] in (b" ", b"-") \
                and len(conts[0]) > 1 and _word_char(conts[0][1]):
            # The value's first word, then a space in the request: the model may go on
            # with "_" ("ice block" -> "ice_block"); both spellings, the request's first.
            conts.insert(1, snake(conts[0]))
        for cont in conts:
            cut = word_end(cont)
            word = ctx.canon.tokens_after(prev, cont[:cut])
            end = builder.add_branch(frontier, word, self.name) if word else None
            if end is None:
                break
            if cut < len(cont):
                # One closer where the word ends, unless masks are costly there (a code
                # grammar: a mask for a node decoding may never reach costs milliseconds).
                if builder.max_branches and not costly_masks(ctx.constraint):
                    with builder.extra_branches(1):
                        self._closers.propose(ctx, builder, end)
                rest = ctx.canon.tokens_after(ctx.vocab.token_bytes(builder.tokens[end]),
                                              cont[cut:])
                builder.add_chain(end, rest, self.name)
            if builder.branches >= builder.max_branches or builder.room(frontier) <= 0:
                break


def _in_value_word(tail: bytes) -> bool:
    """Whether ``tail`` ends in the first word of a JSON string value (``"substance":
    "ice``). Pure."""
    k = len(tail)
    while k and _word_char(tail[k - 1]):
        k -= 1
    return 0 < k < len(tail) and tail[k - 1:k] == b'"' and tail[:k - 1].rstrip().endswith(b":")


register_drafter(SOURCE, TextLookupDrafter)
