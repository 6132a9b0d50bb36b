"""Vocabulary: the exact bytes each token id stands for.

A constraint works on bytes, a model on token ids; this module is the bridge. It reads a
Hugging Face tokenizer once and records, for every id, the bytes the token adds to the
text — for byte-level BPE (GPT-2 style ``Ġ``), SentencePiece (``▁`` and byte-fallback
``<0x0A>``) and plain tokenizers alike — plus which ids end a sequence (EOS) and which are
special (control tokens that never spell text). A fingerprint identifies the vocabulary
for caches.

A :class:`Vocabulary` is an immutable value: safe to share between threads. This module
does not import torch or transformers; it only calls methods of the tokenizer it is given.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from structspec.errors import VocabularyError

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPIECE_SPACE = "\u2581"  # "▁", SentencePiece's visible space


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: the printable stand-in of each byte.

    Written out here (a dozen lines) rather than imported from transformers so that this
    module stays free of heavy imports.
    """
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_GPT2_DECODE = _gpt2_unicode_to_byte()


@dataclass(frozen=True)
class Vocabulary:
    """Token id -> bytes, with the end-of-sequence and special ids.

    Attributes:
        tokens: ``tokens[i]`` is the bytes token ``i`` adds to the text; ``b""`` for
            special tokens and for ids the tokenizer does not define.
        eos_token_ids: ids that end generation.
        special_token_ids: control tokens (BOS, EOS, chat markers, padding); they never
            spell text, so constraints never allow them except EOS where the output may end.
        kind: how the token strings were read: ``"byte_level"``, ``"sentencepiece"`` or
            ``"plain"``.

    Thread-safe and immutable.
    """

    tokens: tuple[bytes, ...]
    eos_token_ids: frozenset[int]
    special_token_ids: frozenset[int] = frozenset()
    kind: str = "plain"
    _index: dict[bytes, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.tokens:
            raise VocabularyError("vocabulary is empty")
        if not self.eos_token_ids:
            raise VocabularyError("vocabulary has no end-of-sequence token id")
        for i in self.eos_token_ids | self.special_token_ids:
            if not 0 <= i < len(self.tokens):
                raise VocabularyError(f"special token id {i} is outside the vocabulary")

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_tokens(
        cls,
        tokens: Sequence[bytes | str],
        eos_token_ids: Iterable[int],
        special_token_ids: Iterable[int] = (),
    ) -> Vocabulary:
        """Build a vocabulary from explicit token texts (tests and toy vocabularies).

        ``str`` items are encoded as UTF-8. Special and EOS ids are stored as ``b""``.
        """
        eos = frozenset(eos_token_ids)
        special = frozenset(special_token_ids) | eos
        raw = [t.encode() if isinstance(t, str) else bytes(t) for t in tokens]
        raw = [b"" if i in special else t for i, t in enumerate(raw)]
        return cls(tuple(raw), eos, special, "plain")

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        eos_token_ids: Iterable[int] | None = None,
        vocab_size: int | None = None,
    ) -> Vocabulary:
        """Read a Hugging Face tokenizer (fast or slow).

        Args:
            tokenizer: a ``PreTrainedTokenizer(Fast)``.
            eos_token_ids: ids that end generation; default: the tokenizer's EOS id (a chat
                model should also pass its end-of-turn id, as ``generation_config`` lists).
            vocab_size: the model's logits width when it exceeds the tokenizer's length
                (padded embedding matrices); the extra ids map to ``b""`` and are never
                allowed.

        Raises:
            VocabularyError: the tokenizer has no EOS token or its tokens cannot be read.
        """
        try:
            id_to_token: dict[int, str] = {i: t for t, i in tokenizer.get_vocab().items()}
        except Exception as exc:  # pragma: no cover - depends on third-party tokenizers
            raise VocabularyError(f"cannot read the tokenizer's vocabulary: {exc}") from exc
        size = max(len(tokenizer), max(id_to_token, default=-1) + 1, vocab_size or 0)

        eos = set(eos_token_ids) if eos_token_ids is not None else set()
        if eos_token_ids is None and tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        if not eos:
            raise VocabularyError("the tokenizer defines no EOS token; pass eos_token_ids")

        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        for i, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
            if getattr(added, "special", False):
                special.add(int(i))
        special |= eos

        kind = _detect_kind(tokenizer)
        tokens: list[bytes] = [b""] * size
        for i, piece in id_to_token.items():
            if i in special or not 0 <= i < size:
                continue
            tokens[i] = _piece_bytes(piece, kind, tokenizer, i)
        return cls(tuple(tokens), frozenset(eos), frozenset(special), kind)

    # -- queries --------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` adds to the text (``b""`` for special tokens)."""
        return self.tokens[token_id]

    def decode(self, token_ids: Iterable[int]) -> bytes:
        """Concatenate the bytes of ``token_ids`` (special tokens contribute nothing)."""
        tokens = self.tokens
        return b"".join(tokens[i] for i in token_ids)

    def decode_text(self, token_ids: Iterable[int]) -> str:
        """:meth:`decode`, then UTF-8 with replacement for incomplete characters."""
        return self.decode(token_ids).decode("utf-8", errors="replace")

    def ids_for(self, text: bytes) -> tuple[int, ...]:
        """All ids whose bytes equal ``text`` exactly (several tokenizers have duplicates)."""
        if not self._index:
            # Tuples, not lists grown then converted: 49k small lists woke the cyclic
            # garbage collector over a heap holding a model, 10x the time (0.22 vs 0.02 s).
            index: dict[bytes, tuple[int, ...]] = {}
            for i, t in enumerate(self.tokens):
                if t:
                    prev = index.get(t)
                    index[t] = (i,) if prev is None else (*prev, i)
            self._index.update(index)
        return self._index.get(text, ())

    def text_token_ids(self) -> list[int]:
        """Ids that spell at least one byte (not special, not empty)."""
        return [i for i, t in enumerate(self.tokens) if t]

    @cached_property
    def fingerprint(self) -> str:
        """A stable hex digest of tokens, EOS and special ids: the cache key of a vocabulary."""
        h = hashlib.sha256()
        h.update(json.dumps([self.kind, sorted(self.eos_token_ids),
                             sorted(self.special_token_ids), len(self.tokens)]).encode())
        for t in self.tokens:
            h.update(len(t).to_bytes(4, "little"))
            h.update(t)
        return h.hexdigest()[:32]


def _detect_kind(tokenizer: Any) -> str:
    """Tell byte-level BPE, SentencePiece and plain tokenizers apart from the decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        try:
            spec = json.loads(backend.to_str())
        except Exception:  # pragma: no cover - defensive: unusual backends
            spec = {}
        # ensure_ascii=False: else "▁" is written as "\\u2581" and the test below never matches.
        decoder = json.dumps(spec.get("decoder") or {}, ensure_ascii=False)
        pre = json.dumps(spec.get("pre_tokenizer") or {}, ensure_ascii=False)
        if '"ByteLevel"' in decoder or '"ByteLevel"' in pre:
            return "byte_level"
        if '"ByteFallback"' in decoder or '"Metaspace"' in decoder or _SPIECE_SPACE in decoder:
            return "sentencepiece"
        return "plain"
    if getattr(tokenizer, "sp_model", None) is not None:
        return "sentencepiece"
    if getattr(tokenizer, "byte_encoder", None) is not None:
        return "byte_level"
    return "plain"


def _piece_bytes(piece: str, kind: str, tokenizer: Any, token_id: int) -> bytes:
    """The bytes one token string stands for, by tokenizer kind."""
    if kind == "byte_level":
        try:
            return bytes(_GPT2_DECODE[c] for c in piece)
        except KeyError:
            # Added (non-special) tokens are stored as plain text, not in byte-level form.
            return piece.encode("utf-8")
    if kind == "sentencepiece":
        m = _BYTE_FALLBACK.match(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        return piece.replace(_SPIECE_SPACE, " ").encode("utf-8")
    if piece.startswith("##"):  # WordPiece continuation: the plain text without the marker
        return piece[2:].encode("utf-8")
    return piece.encode("utf-8")
