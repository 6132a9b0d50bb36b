"""Canonical tokenization in context: how the tokenizer itself would split forced text.

Forced text (a schema's keys, punctuation, fixed indentation) is drafted as the tokens a
re-tokenization of the whole output would give, not as the text's own tokenization: ``'":'``
after a key is one token in context, two alone. :class:`CanonicalTokenizer` answers "the ids
of ``text`` right after a token spelling ``prev``", memoized, and is shared per live
(tokenizer, vocabulary) pair (:func:`canonical_tokenizer`) because the same forced texts
recur from request to request.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from structspec.vocab import Vocabulary


def _utf8_prefix(data: bytes) -> str:
    """The longest prefix of ``data`` that is valid UTF-8, decoded."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


class CanonicalTokenizer:
    """Tokenize text the way the tokenizer would, in the context of the previous token.

    ``tokens_after(prev, text)`` encodes ``prev + text`` and returns the ids after the part
    that spells ``prev`` — so ``text`` is split exactly as in a full re-tokenization. If the
    re-tokenization merges across the boundary (the committed token would have been cut
    differently), ``text`` is encoded alone. Results are memoized (bounded). Not thread-safe.
    ``tokenizer`` ``None`` (a decode given none): the longest matching token at each step.
    """

    def __init__(self, tokenizer: Any, vocab: Vocabulary, max_entries: int = 8192) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.max_entries = max_entries
        self._memo: dict[tuple[bytes, bytes], tuple[int, ...]] = {}
        self._backend = _agreeing_backend(tokenizer) if tokenizer is not None else None
        self._longest = 0  # the longest token's bytes (without a tokenizer; read when needed)

    def encode(self, text: str) -> list[int]:
        """Plain ``tokenizer.encode`` without special tokens (by the fast tokenizer's Rust
        backend where it gives the same ids: half the time per call, ~70 calls per BFCL
        request). Without a tokenizer, the longest matching token at each step."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        if self.tokenizer is None:
            return self._longest_match(text.encode("utf-8"))
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _longest_match(self, data: bytes) -> list[int]:
        """``data`` split greedily into the longest vocabulary tokens, left to right (``[]``
        where some byte has no token): the split a decode without a tokenizer drafts."""
        if not self._longest:
            self._longest = max(len(t) for t in self.vocab.tokens)
        out: list[int] = []
        pos = 0
        while pos < len(data):
            for cut in range(min(self._longest, len(data) - pos), 0, -1):
                ids = self.vocab.ids_for(data[pos:pos + cut])
                if ids:
                    out.append(ids[0])
                    pos += cut
                    break
            else:
                return []
        return out

    def tokens_after(self, prev: bytes, text: bytes) -> tuple[int, ...]:
        """Canonical ids for ``text`` written right after a token spelling ``prev``."""
        key = (prev, text)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        body = _utf8_prefix(text)
        result: tuple[int, ...] = ()
        if body:
            try:
                head = prev.decode("utf-8")
            except UnicodeDecodeError:
                head = ""
            tokens = self.vocab.tokens
            # (without a tokenizer there is no context to split in: the text alone)
            ids = self.encode(head + body) if head and self.tokenizer is not None else []
            acc, i = b"", 0
            while i < len(ids) and len(acc) < len(prev):
                acc += tokens[ids[i]]
                i += 1
            if head and acc == prev and i < len(ids):
                result = tuple(ids[i:])
            else:
                result = tuple(self.encode(body))
            if self.vocab.decode(result) != body.encode("utf-8"):  # not a faithful split
                result = ()
        if len(self._memo) >= self.max_entries:
            self._memo.clear()
        self._memo[key] = result
        return result


#: Texts a fast tokenizer's backend must encode as the tokenizer does before it stands in
#: for it: structured punctuation, code, spaces, non-ASCII and a special token's spelling.
_BACKEND_PROBES = ('{"name": "f", "arguments": {"x": 1.5}}', '","', '\n    return x[0]\n',
                   '  héllo wörld 😀', '<|im_start|>user', '\t\t{}', "It's 12:30.")


def _agreeing_backend(tokenizer: Any) -> Any:
    """The Rust ``tokenizers.Tokenizer`` behind a Hugging Face fast tokenizer, where it
    encodes the probe texts exactly as ``tokenizer.encode`` does; else ``None`` (a slow
    tokenizer, or one whose Python layer changes the ids)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not callable(getattr(backend, "encode", None)):
        return None
    try:
        for text in _BACKEND_PROBES:
            if backend.encode(text, add_special_tokens=False).ids != list(
                    tokenizer.encode(text, add_special_tokens=False)):
                return None
    except Exception:  # an object that only looks like a backend
        return None
    return backend


_CANONICAL: dict[tuple[int, int], tuple[Any, Any, CanonicalTokenizer]] = {}


def canonical_tokenizer(tokenizer: Any, vocab: Vocabulary) -> CanonicalTokenizer:
    """The :class:`CanonicalTokenizer` of ``tokenizer`` and ``vocab``, one per live pair: its
    memo depends on nothing else, and the forced texts of structured output (``'", "'``, a
    schema's keys) repeat from request to request — a memo per request re-encoded them each
    time (~90 ``tokenizer.encode`` calls per BFCL call, 3-4 ms of a 300-ms request)."""
    key = (id(tokenizer), id(vocab))
    hit = _CANONICAL.get(key)
    if hit is not None and hit[0]() is tokenizer and hit[1]() is vocab:
        return hit[2]
    canon = CanonicalTokenizer(tokenizer, vocab)
    # (an object without weak references: a memo per call, as before)
    with contextlib.suppress(TypeError):
        _CANONICAL[key] = (weakref.ref(tokenizer), weakref.ref(vocab), canon)
    return canon
