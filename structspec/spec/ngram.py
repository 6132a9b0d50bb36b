"""An n-gram index over a growing token list: where each recent n-gram occurred before.

The lookup drafters (prompt lookup decoding, Saxena 2023) copy what followed earlier
occurrences of the latest tokens; :class:`NgramIndex` keeps, per ``n``, the positions just
after each n-gram of the prompt and the output so far, appended to as tokens are committed.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Where each n-gram (``1 <= n <= max_n``) of a growing token list ends.

    ``extend`` appends tokens; ``continuations(context, ...)`` finds earlier occurrences of
    the context's last ``n`` tokens (longest ``n`` first, latest occurrence first) and returns
    the tokens that followed. Not thread-safe.
    """

    def __init__(self, max_n: int = 3) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self._ends: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_n + 1)]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` and index the n-grams that end in them."""
        for t in tokens:
            self.tokens.append(int(t))
            end = len(self.tokens)
            for n in range(1, self.max_n + 1):
                if end >= n:
                    self._ends[n].setdefault(tuple(self.tokens[end - n:end]), []).append(end)

    def ends(self, ngram: Sequence[int]) -> Sequence[int]:
        """Positions just after each occurrence of ``ngram`` (``1 <= len <= max_n``)."""
        n = len(ngram)
        if not 1 <= n <= self.max_n:
            return ()
        return self._ends[n].get(tuple(ngram), ())

    def unigram_ends(self) -> dict[tuple[int, ...], list[int]]:
        """``{(token,): positions just after each occurrence, ascending}`` — :meth:`ends`
        for every single token at once (the live table: read, do not change)."""
        return self._ends[1] if self.max_n >= 1 else {}

    def continuations(
        self, context: Sequence[int], length: int, *, min_n: int = 1, per_n: int = 4,
        scan: int = 16,
    ) -> list[tuple[int, list[int]]]:
        """``(n, tokens)`` pairs: what followed earlier matches of ``context[-n:]``.

        Longest ``n`` first; per ``n`` the ``scan`` latest matches are read and at most
        ``per_n`` continuations kept, latest first, ``length`` tokens each at most. A
        continuation that is a prefix of one already kept adds nothing (a tree shares
        prefixes) and is dropped; one that extends a kept one replaces it.
        """
        out: list[tuple[int, list[int]]] = []
        total = len(self.tokens)
        for n in range(min(self.max_n, len(context)), min_n - 1, -1):
            ends = self._ends[n].get(tuple(context[-n:]))
            if not ends:
                continue
            kept: list[list[int]] = []
            for end in reversed(ends[-scan:]):
                if end >= total:
                    continue
                cont = self.tokens[end:end + length]
                if any(k[: len(cont)] == cont for k in kept) or any(
                        k[: len(cont)] == cont for _, k in out):
                    continue
                longer = [i for i, k in enumerate(kept) if cont[: len(k)] == k]
                if longer:
                    kept[longer[0]] = cont
                    continue
                if len(kept) < per_n:
                    kept.append(cont)
            out.extend((n, k) for k in kept)
        return out
