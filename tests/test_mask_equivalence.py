"""Masks are exact: the trie walk with remainder checks equals the definition of a mask,
``{t : advance(s, t) is not None}``, token for token (the brute force steps every token's
bytes through the pushdown runtime; see ``benchmarks/mask_equivalence.py`` for the
bit-for-bit comparison with an earlier implementation on MaskBench)."""

from __future__ import annotations

import numpy as np
import pytest

from structspec import compile_json_schema
from structspec.automata.token_walk import token_table, token_trie

SCHEMAS = [
    # extra keys beside named ones: the key automaton is "a string minus these keys"
    ({"type": "object", "properties": {"name": {"type": "string"},
                                       "nick": {"type": "string", "maxLength": 3}},
      "required": ["name"]}, '{"name":"Al","nick":"abc","namely":[1,2.5e3,null]}'),
    ({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 120}},
     "[1,-5,120,33]"),
    ({"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                       "tag": {"enum": ["a", "ab", "b\"c"]}}},
     '{"when":"2024-01-31","tag":"b\\"c"}'),
]


def _brute(constraint, state: int, n: int) -> np.ndarray:
    words = np.zeros((n + 31) // 32, dtype=np.uint32)
    for t in range(n):
        if constraint.advance(state, t) is not None:
            words[t >> 5] |= np.uint32(1 << (t & 31))
    return words


@pytest.mark.parametrize(("schema", "text"), SCHEMAS)
def test_masks_equal_brute_force_on_a_byte_vocab(byte_vocab, schema, text) -> None:
    c = compile_json_schema(schema, byte_vocab, whitespace="compact", extra_properties=True)
    state = c.initial
    for b in text.encode():
        mask = c.allowed(state)
        want = _brute(c, state, len(byte_vocab))
        if c.is_accepting(state):
            for e in byte_vocab.eos_token_ids:
                want[e >> 5] |= np.uint32(1 << (e & 31))
        assert np.array_equal(mask.words, want), text
        state = c.advance(state, b + 1)  # byte b is token b + 1 in the byte vocabulary
        assert state is not None


def test_masks_equal_brute_force_on_the_real_vocab(smollm_tokenizer, smollm_vocab) -> None:
    schema, text = SCHEMAS[0]
    c = compile_json_schema(schema, smollm_vocab, whitespace="compact", extra_properties=True)
    state = c.initial
    n = len(smollm_vocab)
    for i, token in enumerate(smollm_tokenizer.encode(text, add_special_tokens=False)):
        if i % 3 == 0:  # a brute-force mask costs ~0.1 s here: check every third state
            got = c.allowed(state).words.copy()
            if c.is_accepting(state):
                for e in smollm_vocab.eos_token_ids:
                    got[e >> 5] &= ~np.uint32(1 << (e & 31))
            assert np.array_equal(got, _brute(c, state, n)), i
        state = c.advance(state, token)
        assert state is not None


def test_token_trie_ranges_are_prefix_groups(smollm_vocab) -> None:
    trie = token_trie(smollm_vocab)
    assert trie.ids.size == token_table(smollm_vocab).ids.size
    toks = [smollm_vocab.tokens[i] for i in trie.ids.tolist()]
    assert toks == sorted(toks)
    rng = np.random.default_rng(0)
    for lvl in range(6):
        for j in rng.choice(trie.lo[lvl].size, 50):
            lo, hi = int(trie.lo[lvl][j]), int(trie.hi[lvl][j])
            prefix = toks[lo][: lvl + 1]
            assert all(t.startswith(prefix) for t in toks[lo:hi])
            assert hi == len(toks) or not toks[hi].startswith(prefix)
            assert (trie.token[lvl][j] >= 0) == (toks[lo] == prefix)
