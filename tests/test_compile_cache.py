"""The compile cache on disk: round trips with warm memo tables, keys, eviction, bad files."""

from __future__ import annotations

import functools
import os
import threading

import pytest
from conftest import make_byte_vocab

from structspec import compile_json_schema, compile_regex
from structspec.automata import accepts
from structspec.automata import cache as cache_mod
from structspec.automata.cache import DiskCache, configure_disk_cache, disk_key
from structspec.vocab import Vocabulary

#: The texts these tests drive through the constraint are compact JSON (``{"a":1}``), as the
#: suites write their instances: compile in that policy, not the default (spaced).
compile_json_schema = functools.partial(compile_json_schema, whitespace="compact")

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3},
                                           "b": {"type": "string", "format": "date"}},
          "required": ["a"]}


def ids(text: str) -> list[int]:
    return [b + 1 for b in text.encode()]


@pytest.fixture
def disk(tmp_path):
    before = (cache_mod._DISK, cache_mod._DISK_SET)
    d = configure_disk_cache(tmp_path / "compiled")
    yield d
    cache_mod._DISK, cache_mod._DISK_SET = before


def test_round_trip_keeps_memo_tables_and_reattaches_the_vocabulary(tmp_path) -> None:
    vocab = make_byte_vocab([])
    c = compile_json_schema(SCHEMA, vocab, extra_properties=True)
    state = c.initial
    for t in ids('{"a":9,"b":"2024-02-29"}'):
        c.allowed(state)
        state = c.advance(state, t)
    d = DiskCache(tmp_path)
    assert d.store("k", c)
    loaded = d.load("k", vocab)
    assert loaded is not c and loaded.vocab is vocab
    assert loaded.memo_size() == c.memo_size() > 0
    assert accepts(loaded, [*ids('{"a":3}'), 0]) and not accepts(loaded, [*ids('{"a":4}'), 0])
    assert loaded.validator.is_valid({"a": 3}) and not loaded.validator.is_valid({"a": 4})
    assert loaded.allowed(loaded.initial) == c.allowed(c.initial)


def test_another_vocabulary_is_a_miss_and_bad_files_are_dropped(tmp_path) -> None:
    vocab = make_byte_vocab([])
    d = DiskCache(tmp_path)
    d.store("k", compile_regex("a+b", vocab))
    other = Vocabulary.from_tokens([b"", b"a", b"b"], eos_token_ids=[0])
    assert d.load("k", other) is None
    (tmp_path / "bad.pickle").write_bytes(b"not a pickle")
    assert d.load("bad", vocab) is None and not (tmp_path / "bad.pickle").exists()
    assert d.load("absent", vocab) is None


def test_eviction_keeps_the_total_under_max_bytes(tmp_path) -> None:
    vocab = make_byte_vocab([])
    d = DiskCache(tmp_path, max_bytes=1)  # everything but the newest goes
    for i in range(3):
        d.store(f"k{i}", compile_regex(f"x{{{i + 1}}}", vocab))
    assert len(list(tmp_path.glob("*.pickle"))) <= 1


def test_flush_rewrites_grown_entries(tmp_path) -> None:
    vocab = make_byte_vocab([])
    c = compile_regex("[a-c]+z", vocab)
    d = DiskCache(tmp_path)
    d.store("k", c)
    assert d.flush() == 0
    c.allowed(c.initial)
    assert d.flush() == 1
    assert d.load("k", vocab).memo_size() == c.memo_size()


def test_compile_json_schema_reads_and_writes_the_disk_cache(disk) -> None:
    vocab = make_byte_vocab([])
    schema = {**SCHEMA, "title": "disk-cache-test"}
    compile_json_schema(schema, vocab)
    assert not list(disk.directory.glob("*.pickle"))  # deferred: nothing written yet
    assert disk.flush() == 1
    files = list(disk.directory.glob("*.pickle"))
    assert len(files) == 1 and oct(files[0].stat().st_mode & 0o777) == "0o600"
    compile_json_schema.func.__globals__["_MEMORY"].clear()  # a new process, as it were
    again = compile_json_schema(schema, vocab)
    assert disk.hits == 1 and accepts(again, [*ids('{"a":6}'), 0])


def test_keys_depend_on_everything_and_concurrent_stores_are_safe(tmp_path) -> None:
    assert disk_key("schema", "{}", 1) != disk_key("schema", "{}", 2)
    assert disk_key("schema", "{}", 1) == disk_key("schema", "{}", 1)
    vocab = make_byte_vocab([])
    d = DiskCache(tmp_path)
    c = compile_regex("[0-9]{3}", vocab)
    threads = [threading.Thread(target=d.store, args=("same", c)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert d.load("same", vocab) is not None
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


def test_environment_switches(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("STRUCTSPEC_COMPILE_CACHE", "off")
    assert cache_mod.default_disk_directory() is None
    monkeypatch.setenv("STRUCTSPEC_COMPILE_CACHE", str(tmp_path))
    assert cache_mod.default_disk_directory() == tmp_path
    monkeypatch.delenv("STRUCTSPEC_COMPILE_CACHE")
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path))
    assert cache_mod.default_disk_directory() == tmp_path / "compiled"


def test_disk_keys_change_with_the_compilers_source(monkeypatch) -> None:
    """A constraint stored by one revision of the compiler is not served to another: the
    version number stays put between releases while fixes land (a schema compiled by a
    since-fixed merge would otherwise come back from disk)."""
    revision = cache_mod.compiler_revision()
    assert len(revision) == 16 and revision == cache_mod.compiler_revision()
    before = disk_key("schema", "{}", 1)
    monkeypatch.setattr(cache_mod, "compiler_revision", lambda: "0" * 16)
    assert disk_key("schema", "{}", 1) != before
