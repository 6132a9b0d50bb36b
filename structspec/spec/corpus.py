"""Corpus drafter: continuations copied from text the target wrote before.

Retrieval-based drafting (REST, He et al. 2024): a small model's greedy prose is formulaic —
"It is important to", "In conclusion,", "can help you" — and the same turns of phrase recur
from one answer to the next, whatever the question. A :class:`TokenCorpus` holds answers the
target itself wrote (greedily, to prompts unrelated to any benchmark), indexed by n-gram;
at each step the ``corpus`` drafter finds the longest n-gram of the latest tokens that the
corpus contains and drafts the continuation most of its occurrences share, token by token
while enough of them agree (a frequency trie, as REST builds from its suffix array).

The index is written here rather than taken from a library: REST's ``DraftRetriever`` is a
Rust extension not on PyPI, and what the drafter needs — exact n-gram lookup in a corpus of
a few hundred thousand tokens — is a sorted array of 64-bit n-gram hashes per ``n`` and a
binary search (numpy), built in a fraction of a second when first queried.

Opt-in (``SpecConfig(corpus=...)``): a corpus helps where outputs copy a known body of
text — a repository's own code for an editor's completions, earlier answers of a repetitive
workload. On this project's benchmarks it gained nothing measurable (prose: 66k tokens of the
default model's own answers, corpus drafts accepted 5-13% of the time; code: 2M tokens of the
Python standard library; ``docs/performance.md``), so no corpus is shipped or used by default.
A corpus records its vocabulary's fingerprint and is refused with another vocabulary
(:class:`CorpusMismatchError`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from structspec.errors import StructSpecError
from structspec.spec.drafters import recent_tokens, register_drafter
from structspec.spec.tree import TreeBuilder

SOURCE = "corpus"
FORMAT = 1
_SEP = -1  # between answers: no n-gram or continuation crosses it
_MUL = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier of the n-gram hash


class CorpusMismatchError(StructSpecError, ValueError):
    """A corpus file does not fit the model or vocabulary it is used with, or is not a
    corpus file at all."""


def _hash_step(h: np.ndarray | np.uint64, tokens: np.ndarray | int) -> np.ndarray:
    """One token more into the rolling n-gram hashes ``h`` (wrapping uint64 arithmetic)."""
    with np.errstate(over="ignore"):
        return h * _MUL + np.uint64(1) + np.asarray(tokens, dtype=np.int64).astype(np.uint64)


class TokenCorpus:
    """Token sequences indexed by n-gram (``1 <= n <= max_n``); immutable once built.

    Args:
        sequences: the texts, as token ids (one sequence per answer; no n-gram spans two).
        max_n: the longest n-gram looked up.
        vocab_fingerprint: the fingerprint of the vocabulary the ids belong to (checked
            when the corpus is used), if known.
        meta: free-form provenance (what the texts are).

    Thread-safe for queries once :meth:`continuations` has run once (the index is built
    lazily, on first use).
    """

    def __init__(self, sequences: Sequence[Sequence[int]], *, max_n: int = 6,
                 vocab_fingerprint: str = "", meta: dict[str, Any] | None = None) -> None:
        if max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {max_n}")
        parts: list[np.ndarray] = []
        for seq in sequences:
            arr = np.asarray(seq, dtype=np.int64).reshape(-1)
            if arr.size and int(arr.min()) < 0:
                raise ValueError("token ids must be non-negative")
            parts.extend([arr, np.array([_SEP], dtype=np.int64)])
        self.tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)  # [N]
        self.max_n = max_n
        self.vocab_fingerprint = vocab_fingerprint
        self.meta = dict(meta or {})
        self._index: list[tuple[np.ndarray, np.ndarray]] | None = None

    @classmethod
    def from_texts(cls, texts: Sequence[str], tokenizer: Any, vocab: Any = None, *,
                   max_n: int = 6, meta: dict[str, Any] | None = None) -> TokenCorpus:
        """A corpus of ``texts`` tokenized by ``tokenizer`` (a Hugging Face tokenizer; no
        special tokens added); ``vocab`` (the :class:`~structspec.vocab.Vocabulary` of the
        model) records its fingerprint."""
        ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return cls(ids, max_n=max_n, meta=meta,
                   vocab_fingerprint=vocab.fingerprint if vocab is not None else "")

    def __len__(self) -> int:
        """Tokens held (separators excluded)."""
        return int((self.tokens != _SEP).sum())

    @property
    def num_sequences(self) -> int:
        return int((self.tokens == _SEP).sum())

    # -- index --------------------------------------------------------------------------

    def _build(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per ``n``: the sorted hashes of every n-gram and the position just after each
        (ascending within equal hashes)."""
        t = self.tokens
        index: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0, np.uint64),
                                                      np.zeros(0, np.int64))]
        h = np.zeros(len(t), dtype=np.uint64)
        clean = np.ones(len(t), dtype=bool)  # the n-gram ending here holds no separator
        for n in range(1, self.max_n + 1):
            # h[i]: hash of t[i-n+1 .. i]
            shifted = np.zeros(len(t), dtype=np.uint64)
            shifted[1:] = h[:-1]
            h = _hash_step(shifted, t)  # (n = 1: ``shifted`` is all zeros)
            prev_clean = np.zeros(len(t), dtype=bool)
            prev_clean[1:] = clean[:-1]
            clean = (t != _SEP) & (prev_clean if n > 1 else True)
            pos = np.flatnonzero(clean)  # [m] n-gram ends (inclusive)
            order = np.argsort(h[pos], kind="stable")
            index.append((h[pos][order], pos[order] + 1))
        return index

    def _ends(self, ngram: Sequence[int]) -> np.ndarray:
        """Positions just after each occurrence of ``ngram`` (ascending)."""
        if self._index is None:
            self._index = self._build()
        n = len(ngram)
        keys, ends = self._index[n]
        h: np.ndarray | np.uint64 = np.uint64(0)
        for tok in ngram:
            h = _hash_step(h, int(tok))
        lo, hi = np.searchsorted(keys, h, "left"), np.searchsorted(keys, h, "right")
        found = ends[lo:hi]
        if found.size:  # hash collisions: keep exact matches only
            window = self.tokens[found[:, None] - n + np.arange(n)]  # [m, n]
            found = found[(window == np.asarray(ngram, dtype=np.int64)).all(1)]
        return found

    # -- queries ------------------------------------------------------------------------

    def continuations(self, context: Sequence[int], length: int, *, branches: int = 1,
                      min_share: float = 0.3, min_n: int = 1, scan: int = 512,
                      ) -> list[list[int]]:
        """Up to ``branches`` drafts of at most ``length`` tokens after ``context``.

        The longest suffix of ``context`` (``max_n`` tokens at most, ``min_n`` at least) that
        the corpus holds selects its occurrences (``scan`` of them at most, evenly spaced);
        the drafts are their most common continuations: the ``branches`` most common next
        tokens (each followed by at least ``min_share`` of the occurrences), each extended
        token by token while the most common next token is shared by at least ``min_share``
        of the occurrences still on the path. Pure.
        """
        if length <= 0 or branches <= 0 or not len(self.tokens):
            return []
        context = [int(t) for t in context[-self.max_n:]]
        for n in range(min(self.max_n, len(context)), max(1, min_n) - 1, -1):
            ends = self._ends(context[-n:])
            if not ends.size:
                continue
            if ends.size > scan:  # evenly spaced: deterministic, not biased to one answer
                ends = ends[np.linspace(0, ends.size - 1, scan).astype(np.int64)]
            # (the last token is a separator: reading past the end reads separators)
            at = np.minimum(ends[:, None] + np.arange(length), len(self.tokens) - 1)
            rows = self.tokens[at]  # [m, length]
            return _frequent_paths(rows, branches, min_share)
        return []

    # -- files --------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write the corpus as a compressed ``.npz`` (uint16 ids when they fit)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        top = int(self.tokens.max()) if len(self.tokens) else 0
        if top < np.iinfo(np.uint16).max:
            stored = np.where(self.tokens == _SEP, np.iinfo(np.uint16).max,
                              self.tokens).astype(np.uint16)
        else:
            stored = self.tokens.astype(np.int32)
        header = {"kind": "structspec-corpus", "format": FORMAT, "max_n": self.max_n,
                  "vocab_fingerprint": self.vocab_fingerprint, "meta": self.meta}
        with open(path, "wb") as f:
            np.savez_compressed(f, tokens=stored, header=np.array(json.dumps(header)))

    @classmethod
    def load(cls, path: str | Path) -> TokenCorpus:
        """Read a corpus file written by :meth:`save`.

        Raises:
            CorpusMismatchError: not a readable corpus file (or another format version).
            FileNotFoundError: no such file.
        """
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as blob:
                header = json.loads(str(blob["header"]))
                stored = blob["tokens"]
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise CorpusMismatchError(f"{path}: not a readable corpus file ({exc})") from exc
        if not isinstance(header, dict) or header.get("kind") != "structspec-corpus":
            raise CorpusMismatchError(f"{path}: not a structspec corpus file")
        if header.get("format") != FORMAT:
            raise CorpusMismatchError(
                f"{path}: corpus format {header.get('format')!r}, this version reads {FORMAT}")
        tokens = stored.astype(np.int64)
        if stored.dtype == np.uint16:
            tokens[stored == np.iinfo(np.uint16).max] = _SEP
        corpus = cls([], max_n=int(header.get("max_n", 6)),
                     vocab_fingerprint=str(header.get("vocab_fingerprint", "")),
                     meta=header.get("meta") or {})
        corpus.tokens = tokens
        return corpus


def _frequent_paths(rows: np.ndarray, branches: int, min_share: float) -> list[list[int]]:
    """The most common paths of ``rows`` ``[m, L]`` (``_SEP`` ends a row): see
    :meth:`TokenCorpus.continuations`."""
    first = rows[:, 0]
    values, counts = np.unique(first[first != _SEP], return_counts=True)
    if not values.size:
        return []
    order = np.argsort(-counts, kind="stable")[:branches]
    out: list[list[int]] = []
    for k in order:
        if out and counts[k] < min_share * len(rows):
            break
        sub = rows[first == values[k]]  # [m', L]
        path = [int(values[k])]
        for d in range(1, rows.shape[1]):
            col = sub[:, d]
            vals, cnts = np.unique(col[col != _SEP], return_counts=True)
            if not vals.size:
                break
            best = int(np.argmax(cnts))
            if cnts[best] < min_share * len(sub):
                break
            path.append(int(vals[best]))
            sub = sub[col == vals[best]]
        out.append(path)
    return out


def resolve_corpus(spec: Any, vocab: Any) -> TokenCorpus | None:
    """The corpus a :class:`~structspec.spec.config.SpecConfig` ``corpus`` value asks for:
    ``None``/``False`` → none; a path or a :class:`TokenCorpus` → that corpus, which must
    belong to ``vocab``.

    Raises:
        CorpusMismatchError: the corpus was made with another vocabulary (or holds token ids
            the vocabulary lacks), or the file is not a corpus.
    """
    if spec is None or spec is False:
        return None
    corpus = spec if isinstance(spec, TokenCorpus) else TokenCorpus.load(spec)
    where = f"corpus {spec}" if not isinstance(spec, TokenCorpus) else "the corpus"
    if corpus.vocab_fingerprint and corpus.vocab_fingerprint != vocab.fingerprint:
        raise CorpusMismatchError(
            f"{where} was made with vocabulary {corpus.vocab_fingerprint}, not this model's "
            f"({vocab.fingerprint}); make it again with this model's tokenizer "
            f"(TokenCorpus.from_texts)")
    if len(corpus.tokens) and int(corpus.tokens.max()) >= len(vocab):
        raise CorpusMismatchError(f"{where} holds token ids beyond this vocabulary "
                                  f"({int(corpus.tokens.max())} >= {len(vocab)})")
    return corpus


class CorpusDrafter:
    """Registered as ``"corpus"``; reads ``ctx.corpus``. Drafts the corpus's most common
    continuations of the latest tokens (the committed ones, then the forced chain) below the
    frontier: ``corpus_branches`` branches (default 1), each as long as ``corpus_min_share``
    (default 0.3) of the corpus's occurrences agree, and at most the room left."""

    name = SOURCE

    def propose(self, ctx: Any, builder: TreeBuilder, frontier: int) -> None:
        """Add the corpus's drafts below ``frontier``. Mutates ``builder`` only."""
        corpus: TokenCorpus | None = getattr(ctx, "corpus", None)
        length = builder.room(frontier)
        if corpus is None or length <= 0:
            return
        opts = ctx.options
        context = recent_tokens(ctx, builder, frontier, corpus.max_n)
        for path in corpus.continuations(
                context, length, branches=int(opts.get("corpus_branches", 1)),
                min_share=float(opts.get("corpus_min_share", 0.3))):
            builder.add_branch(frontier, path, self.name)


register_drafter(SOURCE, CorpusDrafter)
