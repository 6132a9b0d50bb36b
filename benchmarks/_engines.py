"""Engine adapters for ``maskbench.py``: structspec and its peers behind one small interface.

Every adapter is built once per worker process from the Hugging Face tokenizer and then
answers, per schema:

- ``compile(schema)``: the compiled artifact; raises :class:`Refused` when the engine declines
  the schema (unsupported or invalid), any other exception is a crash;
- ``start(compiled)``: a fresh cursor (a state value, or a mutable matcher for the peers);
- ``mask(cursor)``: compute the next-token mask (this is the call that is timed);
- ``allows(mask, token)``: whether ``token`` is set in that mask (not timed);
- ``advance(cursor, token)``: the cursor after ``token``, or ``None`` when it is illegal
  (peers mutate and return the same matcher);
- ``accepting(cursor)``: whether the text so far is complete (EOS may come now);
- ``strict``: whether ``mask`` and ``advance``/``accepting`` must agree (structspec's
  Constraint contract); for the peers the mask alone decides, as it does in decoding.

All engines run with compact JSON (no whitespace between tokens, ``,`` and ``:`` separators)
and a single thread. Peers are optional: :func:`availability` says why one is missing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from typing import Any

import numpy as np

# Compile time is measured: a disk-cache hit from an earlier run would not be a compilation.
os.environ.setdefault("STRUCTSPEC_COMPILE_CACHE", "off")

#: name -> (module that must be importable, distribution whose version is reported)
_REQUIRES = {
    "structspec": ("structspec", "structspec"),
    "llguidance": ("llguidance", "llguidance"),
    "xgrammar": ("xgrammar", "xgrammar"),
    "outlines": ("outlines_core", "outlines_core"),
}
ENGINE_NAMES = tuple(_REQUIRES)


class Refused(Exception):
    """The engine declined the schema (a compile error, not a crash)."""


def availability(name: str) -> tuple[bool, str]:
    """``(True, version)`` when engine ``name`` can run here, else ``(False, why not)``."""
    if name not in _REQUIRES:
        return False, f"unknown engine {name!r} (known: {', '.join(ENGINE_NAMES)})"
    module, dist = _REQUIRES[name]
    if importlib.util.find_spec(module) is None:
        hint = "pip install -e '.[bench]'" if name in ("llguidance", "xgrammar") else ""
        return False, f"{module} is not installed" + (f" ({hint})" if hint else "")
    try:
        return True, importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return True, "unknown"


def _bit(words: np.ndarray, token: int) -> bool:
    """Bit ``token`` of a packed little-endian 32-bit bitmask row."""
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)


class StructspecEngine:
    """structspec through its public API: ``compile_json_schema`` and the Constraint protocol."""

    name = "structspec"
    strict = True

    def __init__(self, tokenizer: Any) -> None:
        from structspec.vocab import Vocabulary

        self.vocab = Vocabulary.from_tokenizer(tokenizer)
        self.eos = min(self.vocab.eos_token_ids)

    def compile(self, schema: Any) -> Any:
        from structspec import compile_json_schema
        from structspec.errors import StructSpecError

        try:
            # The spec-faithful mode: extra properties and unbounded arrays, as MaskBench needs.
            return compile_json_schema(schema, self.vocab, whitespace="compact",
                                       extra_properties=True, max_array_items=None)
        except StructSpecError as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc

    def start(self, compiled: Any) -> Any:
        return (compiled, compiled.initial)

    def mask(self, cursor: Any) -> Any:
        constraint, state = cursor
        return constraint.allowed(state)

    def allows(self, mask: Any, token: int) -> bool:
        return token in mask

    def advance(self, cursor: Any, token: int) -> Any:
        constraint, state = cursor
        nxt = constraint.advance(state, token)
        return None if nxt is None else (constraint, nxt)

    def accepting(self, cursor: Any) -> bool:
        constraint, state = cursor
        return bool(constraint.is_accepting(state))


class LLGuidanceEngine:
    """llguidance: ``LLMatcher`` over the JSON-schema grammar, no flexible whitespace."""

    name = "llguidance"
    strict = False

    def __init__(self, tokenizer: Any) -> None:
        import llguidance
        import llguidance.hf

        self._ll = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self.eos = self.tokenizer.eos_token
        self._bitmask = np.zeros(((self.tokenizer.vocab_size + 31) // 32,), dtype=np.int32)

    def compile(self, schema: Any) -> Any:
        matcher_cls = self._ll.LLMatcher
        try:
            if isinstance(schema, bool):  # its options apply to object schemas only
                grammar = matcher_cls.grammar_from_json_schema(json.dumps(schema))
            else:
                grammar = matcher_cls.grammar_from_json_schema(
                    json.dumps(schema), defaults={"whitespace_flexible": False})
        except Exception as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc
        matcher = matcher_cls(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise Refused(matcher.get_error())
        return matcher

    def start(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def mask(self, cursor: Any) -> Any:
        cursor.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        if cursor.is_error():
            raise RuntimeError(f"llguidance mask: {cursor.get_error()}")
        return self._bitmask

    def allows(self, mask: Any, token: int) -> bool:
        return _bit(mask, token)

    def advance(self, cursor: Any, token: int) -> Any:
        return cursor if cursor.consume_token(token) and not cursor.is_error() else None

    def accepting(self, cursor: Any) -> bool:
        return bool(cursor.is_accepting())


class XGrammarEngine:
    """xgrammar in its default JSON configuration, with compact separators, one thread."""

    name = "xgrammar"
    strict = False

    def __init__(self, tokenizer: Any) -> None:
        import xgrammar

        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        self.eos = int(info.stop_token_ids[0])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
        self._view = self._bitmask.numpy()[0]  # [words] shares memory with the tensor

    def compile(self, schema: Any) -> Any:
        try:
            return self.compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        except Exception as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc

    def start(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled)

    def mask(self, cursor: Any) -> Any:
        cursor.fill_next_token_bitmask(self._bitmask)
        return self._view

    def allows(self, mask: Any, token: int) -> bool:
        return _bit(mask, token)

    def advance(self, cursor: Any, token: int) -> Any:
        return cursor if cursor.accept_token(token) else None

    def accepting(self, cursor: Any) -> bool:
        return bool(cursor.is_completed())


class OutlinesEngine:
    """outlines-core: the whole schema as one regex (``build_regex_from_schema``) + ``Index``."""

    name = "outlines"
    strict = False

    def __init__(self, tokenizer: Any) -> None:
        import outlines_core

        from structspec.vocab import Vocabulary

        self._oc = outlines_core
        vocab = Vocabulary.from_tokenizer(tokenizer)
        self.eos = min(vocab.eos_token_ids)
        mapping: dict[bytes, list[int]] = {}
        for i, t in enumerate(vocab.tokens):
            if t and i not in vocab.special_token_ids:
                mapping.setdefault(t, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(self.eos, mapping)

    def compile(self, schema: Any) -> Any:
        from outlines_core.json_schema import build_regex_from_schema

        try:
            regex = build_regex_from_schema(json.dumps(schema), "")
            return self._oc.Index(regex, self.vocabulary)
        except Exception as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc

    def start(self, compiled: Any) -> Any:
        return (compiled, compiled.get_initial_state())

    def mask(self, cursor: Any) -> Any:
        index, state = cursor
        return index.get_allowed_tokens(state)

    def allows(self, mask: Any, token: int) -> bool:
        return mask is not None and token in mask

    def advance(self, cursor: Any, token: int) -> Any:
        index, state = cursor
        if token == self.eos:
            return cursor if index.is_final_state(state) else None
        nxt = index.get_next_state(state, token)
        return None if nxt is None else (index, nxt)

    def accepting(self, cursor: Any) -> bool:
        index, state = cursor
        return bool(index.is_final_state(state))


_CLASSES = {
    "structspec": StructspecEngine,
    "llguidance": LLGuidanceEngine,
    "xgrammar": XGrammarEngine,
    "outlines": OutlinesEngine,
}


def make_engine(name: str, tokenizer: Any) -> Any:
    """Build engine ``name`` for ``tokenizer`` (a Hugging Face fast tokenizer)."""
    return _CLASSES[name](tokenizer)
