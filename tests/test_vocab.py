"""Tests of :mod:`structspec.vocab`: token id -> exact bytes, EOS/special ids, fingerprint.

Three tokenizer families are covered:

* the real SmolLM2 tokenizer (byte-level BPE, 49,152 ids) from the shared fixture;
* SentencePiece-style, byte-level BPE and plain WordLevel tokenizers built here with the
  ``tokenizers`` library on a tiny in-memory corpus — nothing is downloaded.

The central property: concatenating the bytes of a token sequence equals what the
tokenizer itself decodes (SentencePiece's start-of-decode space aside, see
:func:`_sp_vocab_text`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec.errors import VocabularyError
from structspec.vocab import Vocabulary

REPO = Path(__file__).resolve().parents[1]

TEXTS = [
    "",
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    '{"name": "Maria Lopez", "age": 34, "tags": ["a", "b"], "ok": true, "x": null}',
    '[{"id":1,"v":-2.5e10},{"id":2,"v":"\\u00e9\\n"}]',
    "def f(x):\n    if x:\n\treturn {'a': [1, 2]}\n    return None\n",
    "  leading spaces, trailing spaces   \n\n\n",
    "\t\ttabs\tand\r\nCRLF\r\n",
    "café, naïve, Ærøskøbing, São Paulo, Zürich, élève",
    "漢字とかなカナ、中文，한국어",
    "emoji: 🎉🚀 family: 👩‍👩‍👧 flag: 🇪🇸 skin: 👍🏽",
    "mixed: x=ƒ(α)+β² ≤ ∞ — “quotes” ‘single’ …",
    "\x00\x01 control \x7f chars",
]

MULTIBYTE_CHARS = ["é", "ñ", "ß", "€", "—", "漢", "字", "한", "🎉", "🇪🇸", "👩‍💻", "\U0001f9ec"]

# -- helpers: tokenizers built in-test ------------------------------------------------------

CORPUS = [
    "hello world",
    "hello there, world",
    "the quick brown fox jumps over the lazy dog",
    "a new line\nand another line\n",
    '{"name": "value", "list": [1, 2, 3]}',
    "def main():\n    return 0\n",
] * 4


def _llama_style_tokenizer(decoder=None, eos: bool = True):
    """A SentencePiece-style BPE like Llama's: ``▁`` for spaces, byte fallback ``<0xNN>``.

    BpeTrainer only learns the corpus's characters and merges, and any ``special_tokens``
    it is given become special (they would decode to nothing). Llama's byte tokens are
    ordinary vocabulary entries, so they are appended to the trained model's vocabulary.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=160, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    n = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = n + b
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoder or decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    kwargs = {"bos_token": "<s>", "unk_token": "<unk>"}
    if eos:
        kwargs["eos_token"] = "</s>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def _byte_level_tokenizer():
    """A GPT-2 style byte-level BPE (``Ġ`` for space) trained on the tiny corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=340,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def _word_level_tokenizer():
    """A plain WordLevel tokenizer: each token is a whole word, stored as plain text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[EOS]", "hello", "world", "naïve", "漢字", "{", "}", ":", "42"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="[EOS]", unk_token="[UNK]")


@pytest.fixture(scope="module")
def sp_tokenizer():
    return _llama_style_tokenizer()


@pytest.fixture(scope="module")
def sp_vocab(sp_tokenizer) -> Vocabulary:
    return Vocabulary.from_tokenizer(sp_tokenizer)


@pytest.fixture(scope="module")
def bl_tokenizer():
    return _byte_level_tokenizer()


@pytest.fixture(scope="module")
def bl_vocab(bl_tokenizer) -> Vocabulary:
    return Vocabulary.from_tokenizer(bl_tokenizer)


def _hf_decode(tokenizer, ids) -> bytes:
    """What the tokenizer itself decodes, as UTF-8 (special tokens skipped, no clean-up)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return text.encode("utf-8")


def _assert_same_decode(vocab: Vocabulary, tokenizer, ids) -> None:
    """The vocabulary's bytes are what the tokenizer decodes; where they are not valid
    UTF-8, both replace each maximal invalid subpart with U+FFFD."""
    raw = vocab.decode(ids)
    expected = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        assert vocab.decode_text(ids) == expected
    else:
        assert text == expected


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _sp_vocab_text(vocab: Vocabulary, ids) -> bytes:
    """The vocabulary's decode as a SentencePiece tokenizer prints a *whole* decode.

    The Llama decoder ends with ``Strip(" ", 1, 0)``: it removes one space from the start
    of the decoded text — the space that ``Metaspace(prepend_scheme="first")`` put in front
    of the text at encode time. The vocabulary must keep that space in the token's bytes
    (``▁hello`` adds " hello" wherever it appears mid-output, and a constraint sees exactly
    the bytes the token adds), so the two agree after stripping one leading space here,
    and only here: spaces anywhere else must match byte for byte.
    """
    raw = vocab.decode(ids)
    return raw[1:] if raw.startswith(b" ") else raw


# -- the real tokenizer (byte-level BPE) ----------------------------------------------------


def test_smollm_kind_and_size(smollm_tokenizer, smollm_vocab):
    assert smollm_vocab.kind == "byte_level"
    assert len(smollm_vocab) == len(smollm_tokenizer) == 49152
    assert smollm_vocab.eos_token_ids == {smollm_tokenizer.eos_token_id}


@pytest.mark.parametrize("text", TEXTS)
def test_smollm_round_trip_texts(smollm_tokenizer, smollm_vocab, text):
    ids = _encode(smollm_tokenizer, text)
    assert smollm_vocab.decode(ids) == _hf_decode(smollm_tokenizer, ids)
    # Byte-level BPE without a normalizer is lossless: the bytes are the original text.
    assert smollm_vocab.decode(ids) == text.encode("utf-8")
    assert smollm_vocab.decode_text(ids) == text


def test_smollm_known_tokens(smollm_tokenizer, smollm_vocab):
    for piece, expected in [("Ġworld", b" world"), ("Ċ", b"\n"), ("ĉ", b"\t"), ("Ġ", b" ")]:
        token_id = smollm_tokenizer.convert_tokens_to_ids(piece)
        assert smollm_vocab.token_bytes(token_id) == expected


@settings(deadline=None, max_examples=150)
@given(text=st.text(max_size=60))
def test_smollm_round_trip_property(smollm_tokenizer, smollm_vocab, text):
    ids = _encode(smollm_tokenizer, text)
    _assert_same_decode(smollm_vocab, smollm_tokenizer, ids)
    if all(smollm_vocab.ids_for(bytes([b])) for b in text.encode("utf-8")):
        assert smollm_vocab.decode(ids) == text.encode("utf-8")


def test_smollm_unspellable_bytes_are_dropped(smollm_tokenizer, smollm_vocab):
    # SmolLM2's byte-level vocabulary lacks a few byte values (rare control bytes, bytes
    # that never occur in UTF-8, and the lead bytes 0xF1/0xF2 of planes 4-11): the
    # tokenizer silently drops them when encoding, and no id sequence can spell them.
    missing = [b for b in range(256) if not smollm_vocab.ids_for(bytes([b]))]
    assert 0xF1 in missing and 0xFF in missing
    assert all(smollm_vocab.ids_for(bytes([b])) for b in b"\t\n\r" + bytes(range(0x20, 0x7F)))
    assert not any(bytes([b]) in t for t in smollm_vocab.tokens for b in missing)
    ids = _encode(smollm_tokenizer, "\U00040000")
    _assert_same_decode(smollm_vocab, smollm_tokenizer, ids)
    assert smollm_vocab.decode(ids) != "\U00040000".encode("utf-8")


@pytest.fixture(scope="module")
def smollm_single_byte_ids(smollm_vocab) -> list[int]:
    return [i for i, t in enumerate(smollm_vocab.tokens) if len(t) == 1]


@settings(deadline=None, max_examples=200)
@given(data=st.data())
def test_smollm_random_ids_match_tokenizer_decode(
    smollm_tokenizer, smollm_vocab, smollm_single_byte_ids, data
):
    # Mix in single-byte tokens so that many sequences split a UTF-8 character.
    single = smollm_single_byte_ids
    any_id = st.integers(0, len(smollm_vocab) - 1)  # specials included: they decode to b""
    ids = data.draw(st.lists(st.one_of(any_id, st.sampled_from(single)), max_size=24))
    _assert_same_decode(smollm_vocab, smollm_tokenizer, ids)


@pytest.mark.parametrize("char", MULTIBYTE_CHARS)
def test_smollm_multibyte_characters(smollm_tokenizer, smollm_vocab, char):
    ids = _encode(smollm_tokenizer, char)
    pieces = [smollm_vocab.token_bytes(i) for i in ids]
    assert all(pieces)
    assert b"".join(pieces) == char.encode("utf-8")


def test_smollm_tokens_split_inside_a_character(smollm_tokenizer, smollm_vocab):
    # A rare emoji is spelled with several tokens, none of them a whole character: the
    # vocabulary must hold the raw bytes, not a decoded (replacement) string.
    ids = _encode(smollm_tokenizer, "\U0001f9ec")
    assert len(ids) > 1
    for i in ids:
        with pytest.raises(UnicodeDecodeError):
            smollm_vocab.token_bytes(i).decode("utf-8")
    partial = smollm_vocab.decode_text(ids[:-1])
    assert partial.endswith("\ufffd")
    assert smollm_vocab.decode_text(ids) == "\U0001f9ec"


def test_smollm_specials_decode_to_nothing(smollm_tokenizer, smollm_vocab):
    specials = set(smollm_tokenizer.all_special_ids)
    specials |= {i for i, t in smollm_tokenizer.added_tokens_decoder.items() if t.special}
    assert specials <= smollm_vocab.special_token_ids
    assert smollm_vocab.eos_token_ids <= smollm_vocab.special_token_ids
    for i in smollm_vocab.special_token_ids:
        assert smollm_vocab.token_bytes(i) == b""
    ids = _encode(smollm_tokenizer, "hello world")
    im_start = smollm_tokenizer.convert_tokens_to_ids("<|im_start|>")
    im_end = smollm_tokenizer.convert_tokens_to_ids("<|im_end|>")
    with_specials = [im_start, *ids, smollm_tokenizer.eos_token_id, im_end]
    assert smollm_vocab.decode(with_specials) == b"hello world"
    assert _hf_decode(smollm_tokenizer, with_specials) == b"hello world"


def test_smollm_text_token_ids(smollm_vocab):
    text_ids = smollm_vocab.text_token_ids()
    assert text_ids == sorted(text_ids)
    assert not set(text_ids) & smollm_vocab.special_token_ids
    assert all(smollm_vocab.token_bytes(i) for i in text_ids)
    # Every id is either text or special: no normal token of this tokenizer is empty.
    assert len(text_ids) + len(smollm_vocab.special_token_ids) == len(smollm_vocab)


def test_smollm_ids_for(smollm_tokenizer, smollm_vocab):
    world = smollm_tokenizer.convert_tokens_to_ids("Ġworld")
    assert world in smollm_vocab.ids_for(b" world")
    newline = smollm_tokenizer.convert_tokens_to_ids("Ċ")
    assert newline in smollm_vocab.ids_for(b"\n")
    assert smollm_vocab.ids_for(b"") == ()
    assert smollm_vocab.ids_for(b"\xff\xfe no such token \x00") == ()
    for i in smollm_vocab.ids_for(b"{"):
        assert smollm_vocab.token_bytes(i) == b"{"


def test_smollm_fingerprint_stable_across_loads(smollm_tokenizer, smollm_vocab):
    from structspec.models import load_tokenizer

    again = Vocabulary.from_tokenizer(load_tokenizer(None))
    assert again == smollm_vocab
    assert again.fingerprint == smollm_vocab.fingerprint
    assert Vocabulary.from_tokenizer(smollm_tokenizer).fingerprint == smollm_vocab.fingerprint
    assert len(smollm_vocab.fingerprint) == 32
    int(smollm_vocab.fingerprint, 16)


def test_smollm_eos_override(smollm_tokenizer, smollm_vocab):
    im_end = smollm_tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = smollm_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    vocab = Vocabulary.from_tokenizer(smollm_tokenizer, eos_token_ids=[im_end, endoftext])
    assert vocab.eos_token_ids == {im_end, endoftext}
    assert vocab.tokens == smollm_vocab.tokens
    assert vocab.fingerprint != smollm_vocab.fingerprint


def test_smollm_padded_vocab_size(smollm_tokenizer, smollm_vocab):
    padded = Vocabulary.from_tokenizer(smollm_tokenizer, vocab_size=len(smollm_tokenizer) + 64)
    assert len(padded) == len(smollm_tokenizer) + 64
    assert padded.tokens[: len(smollm_vocab)] == smollm_vocab.tokens
    assert padded.tokens[len(smollm_vocab) :] == (b"",) * 64
    assert padded.text_token_ids() == smollm_vocab.text_token_ids()
    assert padded.fingerprint != smollm_vocab.fingerprint
    # A smaller vocab_size never truncates the tokenizer.
    assert len(Vocabulary.from_tokenizer(smollm_tokenizer, vocab_size=10)) == len(smollm_tokenizer)


# -- SentencePiece-style (Llama) tokenizer built in-test --------------------------------------

SP_TEXTS = [
    "hello world",
    "hello\nworld",
    "the lazy dog\n\nand a new line",
    "  two  spaces  ",
    " leading space",
    '{"name": "value"}',
    "tab\there",
    # Characters absent from the training corpus: spelled with <0xNN> byte tokens.
    "Zebra QX",
    "ñandú, café",
    "漢字 and 🎉",
    "👩‍💻 ok",
]


def test_sp_kind_and_pieces(sp_tokenizer, sp_vocab):
    assert sp_vocab.kind == "sentencepiece"
    assert len(sp_vocab) == len(sp_tokenizer)
    pieces = sp_tokenizer.get_vocab()
    assert sp_vocab.token_bytes(pieces["▁hello"]) == b" hello"
    assert sp_vocab.token_bytes(pieces["▁"]) == b" "
    assert sp_vocab.token_bytes(pieces["<0x0A>"]) == b"\n"
    for b in range(256):
        assert sp_vocab.token_bytes(pieces[f"<0x{b:02X}>"]) == bytes([b])
    for piece, i in pieces.items():
        if i not in sp_vocab.special_token_ids:
            assert "▁".encode() not in sp_vocab.token_bytes(i), piece


def test_sp_specials(sp_tokenizer, sp_vocab):
    assert sp_vocab.eos_token_ids == {sp_tokenizer.eos_token_id}
    assert set(sp_tokenizer.all_special_ids) <= sp_vocab.special_token_ids
    for name in ("<s>", "</s>", "<unk>"):
        assert sp_vocab.token_bytes(sp_tokenizer.convert_tokens_to_ids(name)) == b""
    # The byte tokens are ordinary tokens, not specials.
    assert sp_tokenizer.convert_tokens_to_ids("<0x41>") not in sp_vocab.special_token_ids


@pytest.mark.parametrize("text", SP_TEXTS)
def test_sp_round_trip(sp_tokenizer, sp_vocab, text):
    ids = _encode(sp_tokenizer, text)
    assert _sp_vocab_text(sp_vocab, ids) == _hf_decode(sp_tokenizer, ids)
    assert sp_vocab.decode(ids).decode("utf-8")  # whole characters, even via byte fallback


def test_sp_byte_fallback_used(sp_tokenizer, sp_vocab):
    ids = _encode(sp_tokenizer, "漢🎉")
    pieces = sp_tokenizer.convert_ids_to_tokens(ids)
    assert sum(p.startswith("<0x") for p in pieces) == 7  # 3 + 4 UTF-8 bytes
    assert sp_vocab.decode(ids) == " 漢🎉".encode()


def test_sp_space_is_kept_mid_sequence(sp_tokenizer, sp_vocab):
    # Only the first token of a whole decode loses its space: with a fixed prefix in front,
    # the tokenizer prints the same bytes the vocabulary concatenates.
    prefix = _encode(sp_tokenizer, "hello")
    for text in SP_TEXTS:
        ids = _encode(sp_tokenizer, text)
        assert _hf_decode(sp_tokenizer, prefix + ids) == b"hello" + sp_vocab.decode(ids)


@settings(deadline=None, max_examples=100)
@given(text=st.text(alphabet="helo wrd\n\tthé漢🎉{}\":,ZQ▁", max_size=40) | st.text(max_size=30))
def test_sp_round_trip_property(sp_tokenizer, sp_vocab, text):
    ids = _encode(sp_tokenizer, text)
    assert _sp_vocab_text(sp_vocab, ids) == _hf_decode(sp_tokenizer, ids)


def test_sp_eos_override_and_duplicates(sp_tokenizer, sp_vocab):
    pieces = sp_tokenizer.get_vocab()
    hello = pieces["▁hello"]
    vocab = Vocabulary.from_tokenizer(sp_tokenizer, eos_token_ids=[hello])
    assert vocab.eos_token_ids == {hello}
    assert vocab.token_bytes(hello) == b""
    assert hello in vocab.special_token_ids
    # The tokenizer's own EOS stays special (it never spells text) but no longer ends.
    assert sp_tokenizer.eos_token_id in vocab.special_token_ids
    # A learned character and its byte-fallback token spell the same byte.
    assert set(sp_vocab.ids_for(b"h")) == {pieces["h"], pieces["<0x68>"]}
    assert set(sp_vocab.ids_for(b"\n")) >= {pieces["<0x0A>"]}


def test_sp_replace_only_decoder_is_sentencepiece():
    # Some SentencePiece conversions have no ByteFallback: only Replace("▁", " ") tells.
    from tokenizers import decoders

    tok = _llama_style_tokenizer(
        decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    )
    vocab = Vocabulary.from_tokenizer(tok)
    assert vocab.kind == "sentencepiece"
    assert vocab.token_bytes(tok.convert_tokens_to_ids("▁hello")) == b" hello"
    ids = _encode(tok, "hello world, the dog")
    assert _sp_vocab_text(vocab, ids) == _hf_decode(tok, ids)


def test_sp_metaspace_decoder_is_sentencepiece():
    from tokenizers import decoders

    tok = _llama_style_tokenizer(decoders.Metaspace(replacement="▁", prepend_scheme="first"))
    vocab = Vocabulary.from_tokenizer(tok)
    assert vocab.kind == "sentencepiece"
    ids = _encode(tok, "hello world, the dog")
    assert _sp_vocab_text(vocab, ids) == _hf_decode(tok, ids)


def test_sp_without_eos_needs_eos_ids():
    tok = _llama_style_tokenizer(eos=False)
    with pytest.raises(VocabularyError, match="EOS"):
        Vocabulary.from_tokenizer(tok)
    with pytest.raises(VocabularyError):
        Vocabulary.from_tokenizer(tok, eos_token_ids=[])
    bos = tok.convert_tokens_to_ids("<s>")
    vocab = Vocabulary.from_tokenizer(tok, eos_token_ids=[bos])
    assert vocab.eos_token_ids == {bos}
    with pytest.raises(VocabularyError, match="outside"):
        Vocabulary.from_tokenizer(tok, eos_token_ids=[len(tok)])
    with pytest.raises(VocabularyError, match="outside"):
        Vocabulary.from_tokenizer(tok, eos_token_ids=[-1])
    # ... but a padded vocabulary covers ids past the tokenizer's length.
    padded = Vocabulary.from_tokenizer(tok, eos_token_ids=[len(tok)], vocab_size=len(tok) + 8)
    assert padded.eos_token_ids == {len(tok)}


# -- byte-level BPE built in-test -------------------------------------------------------------


def test_byte_level_built(bl_tokenizer, bl_vocab):
    assert bl_vocab.kind == "byte_level"
    pieces = bl_tokenizer.get_vocab()
    assert bl_vocab.token_bytes(pieces["Ġworld"]) == b" world"
    assert bl_vocab.token_bytes(pieces["Ċ"]) == b"\n"
    assert bl_vocab.token_bytes(pieces["<|endoftext|>"]) == b""
    assert bl_vocab.eos_token_ids == {pieces["<|endoftext|>"]}
    # The initial alphabet holds all 256 bytes.
    assert all(bl_vocab.ids_for(bytes([b])) for b in range(256))
    for text in TEXTS:
        ids = _encode(bl_tokenizer, text)
        assert bl_vocab.decode(ids) == _hf_decode(bl_tokenizer, ids) == text.encode("utf-8")


def test_byte_level_added_tokens():
    tok = _byte_level_tokenizer()
    tok.add_tokens(["<tool>", "naïve word"])  # added, not special: stored as plain text
    tok.add_tokens(["<|call|>"], special_tokens=True)
    vocab = Vocabulary.from_tokenizer(tok)
    tool, naive, call = tok.convert_tokens_to_ids(["<tool>", "naïve word", "<|call|>"])
    assert vocab.token_bytes(tool) == b"<tool>"
    assert vocab.token_bytes(naive) == "naïve word".encode()
    assert vocab.token_bytes(call) == b""
    assert call in vocab.special_token_ids
    ids = _encode(tok, "say <tool> then naïve word <|call|> done")
    assert call in ids and tool in ids
    expected = "say <tool> then naïve word  done".encode()
    assert vocab.decode(ids) == _hf_decode(tok, ids) == expected


@settings(deadline=None, max_examples=100)
@given(text=st.text(max_size=40))
def test_byte_level_built_property(bl_tokenizer, bl_vocab, text):
    ids = _encode(bl_tokenizer, text)
    assert bl_vocab.decode(ids) == _hf_decode(bl_tokenizer, ids) == text.encode("utf-8")


# -- plain WordLevel tokenizer ----------------------------------------------------------------


def test_word_level_plain():
    tok = _word_level_tokenizer()
    vocab = Vocabulary.from_tokenizer(tok)
    assert vocab.kind == "plain"
    pieces = tok.get_vocab()
    assert vocab.eos_token_ids == {pieces["[EOS]"]}
    assert vocab.token_bytes(pieces["[EOS]"]) == b""
    assert vocab.token_bytes(pieces["[UNK]"]) == b""
    for word in ("hello", "naïve", "漢字", "{", "42"):
        assert vocab.token_bytes(pieces[word]) == word.encode("utf-8")
        # A single plain token decodes to its text.
        assert vocab.decode([pieces[word]]) == _hf_decode(tok, [pieces[word]])
    assert vocab.ids_for("漢字".encode()) == (pieces["漢字"],)
    assert vocab.text_token_ids() == sorted(
        i for w, i in pieces.items() if w not in ("[UNK]", "[EOS]")
    )


def test_wordpiece_continuation_marker():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[SEP]", "play", "##ing", "##ed"]
    backend = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="[SEP]", unk_token="[UNK]")
    vocab = Vocabulary.from_tokenizer(tok)
    assert vocab.kind == "plain"
    ids = _encode(tok, "playing")
    assert vocab.decode(ids) == b"playing" == _hf_decode(tok, ids)


# -- construction errors, from_tokens, fingerprint --------------------------------------------


def test_errors_are_vocabulary_errors():
    with pytest.raises(VocabularyError, match="empty"):
        Vocabulary.from_tokens([], eos_token_ids=[0])
    with pytest.raises(VocabularyError, match="empty"):
        Vocabulary((), frozenset({0}))
    with pytest.raises(VocabularyError, match="end-of-sequence"):
        Vocabulary.from_tokens(["a", "b"], eos_token_ids=[])
    with pytest.raises(VocabularyError, match="outside"):
        Vocabulary.from_tokens(["a", "b"], eos_token_ids=[2])
    with pytest.raises(VocabularyError, match="outside"):
        Vocabulary.from_tokens(["a", "b"], eos_token_ids=[-1])
    with pytest.raises(VocabularyError, match="outside"):
        Vocabulary.from_tokens(["a", "b"], eos_token_ids=[0], special_token_ids=[5])
    with pytest.raises(ValueError):  # VocabularyError is also a ValueError
        Vocabulary.from_tokens(["a"], eos_token_ids=[1])


def test_from_tokens():
    vocab = Vocabulary.from_tokens(
        ["</s>", "a", b"\xe6\xbc", "a", "<pad>", "\u6f22"], eos_token_ids=[0], special_token_ids=[4]
    )
    assert vocab.kind == "plain"
    assert vocab.tokens == (b"", b"a", b"\xe6\xbc", b"a", b"", "漢".encode())
    assert vocab.eos_token_ids == {0}
    assert vocab.special_token_ids == {0, 4}
    assert vocab.ids_for(b"a") == (1, 3)
    assert vocab.ids_for(b"\xe6\xbc") == (2,)
    assert vocab.ids_for(b"") == ()
    assert vocab.text_token_ids() == [1, 2, 3, 5]
    assert vocab.decode([1, 0, 4, 3]) == b"aa"
    assert vocab.decode([]) == b""
    assert vocab.decode_text([2]) == "\ufffd"
    assert vocab.decode_text([2, 1]) == "\ufffda"
    assert vocab.decode_text([5, 1]) == "漢a"


def test_fingerprint_sensitivity():
    base = ["</s>", "a", "b", "ab", " c"]
    fp = Vocabulary.from_tokens(base, eos_token_ids=[0]).fingerprint
    assert Vocabulary.from_tokens(list(base), eos_token_ids=[0]).fingerprint == fp
    assert Vocabulary.from_tokens([*base[:-1], " d"], eos_token_ids=[0]).fingerprint != fp
    swapped = ["</s>", "a", "ab", "b", " c"]
    assert Vocabulary.from_tokens(swapped, eos_token_ids=[0]).fingerprint != fp
    assert Vocabulary.from_tokens(base, eos_token_ids=[0, 1]).fingerprint != fp
    assert Vocabulary.from_tokens(base, eos_token_ids=[1]).fingerprint != fp
    assert Vocabulary.from_tokens(base, eos_token_ids=[0], special_token_ids=[4]).fingerprint != fp
    assert Vocabulary.from_tokens([*base, ""], eos_token_ids=[0]).fingerprint != fp
    # Token boundaries count, not just the concatenation.
    one = Vocabulary.from_tokens(["</s>", "ab", "c"], eos_token_ids=[0]).fingerprint
    two = Vocabulary.from_tokens(["</s>", "a", "bc"], eos_token_ids=[0]).fingerprint
    assert one != two
    vocab = Vocabulary.from_tokens(base, eos_token_ids=[0])
    assert dataclasses.replace(vocab, kind="byte_level").fingerprint != fp


def test_fingerprint_same_in_another_process():
    # No dependence on hash randomisation (frozenset order) or anything per-process.
    code = (
        "from structspec.vocab import Vocabulary;"
        "v = Vocabulary.from_tokens("
        "['</s>', 'x', '\\u00e9', b'\\xff'] + [str(i) for i in range(50)],"
        " eos_token_ids=[0, 7, 3], special_token_ids=[9, 20]);"
        "print(v.fingerprint)"
    )
    here = Vocabulary.from_tokens(
        ["</s>", "x", "é", b"\xff"] + [str(i) for i in range(50)],
        eos_token_ids=[0, 7, 3],
        special_token_ids=[9, 20],
    ).fingerprint
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env,
            cwd=REPO, check=True, timeout=120,
        )
        assert out.stdout.strip() == here


def test_vocabulary_is_hashable_value():
    a = Vocabulary.from_tokens(["</s>", "a"], eos_token_ids=[0])
    b = Vocabulary.from_tokens(["</s>", "a"], eos_token_ids=[0])
    a.ids_for(b"a")  # fills a's lazy index: must not change equality or hash
    assert a == b
    assert hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.kind = "byte_level"  # type: ignore[misc]


def test_ids_for_lists_every_duplicate_in_id_order():
    vocab = Vocabulary.from_tokens(["a", "b", "a", "<eos>", "a", "b"], eos_token_ids=[3])
    assert vocab.ids_for(b"a") == (0, 2, 4) and vocab.ids_for(b"b") == (1, 5)
    assert vocab.ids_for(b"") == () and vocab.ids_for(b"c") == ()
