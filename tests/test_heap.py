"""Freed heap handed back after packing (:mod:`structspec.spec.heap`): glibc's
``malloc_trim`` where it exists, a no-op elsewhere, called once a model is packed."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import load_benchmark, q4_llama

from structspec.spec import cpu_paths, heap
from structspec.spec.fastlinear import is_packed, packing_available


def test_trim_heap_runs_where_glibc_has_it():
    """True on glibc Linux (the machines CI and this project run on); False, without error,
    where the C library has no ``malloc_trim``."""
    ran = heap.trim_heap()
    if sys.platform.startswith("linux") and heap._malloc_trim() is not None:
        assert ran is True
    else:
        assert ran is False


def test_trim_heap_is_a_no_op_without_malloc_trim(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.trim_heap() is False


def _count_trims(monkeypatch) -> list[int]:
    """Count use_fast_cpu_paths' calls of trim_heap (each still trims)."""
    calls: list[int] = []
    real = heap.trim_heap
    monkeypatch.setattr(cpu_paths, "trim_heap", lambda: calls.append(1) or real())
    return calls


@pytest.mark.skipif(not packing_available(), reason="no packing kernel runs here")
def test_packing_a_model_hands_freed_memory_back(monkeypatch):
    """use_fast_cpu_paths trims once it has packed a model, and the model's outputs are
    those of packing without the trim (nothing in use moves)."""
    calls = _count_trims(monkeypatch)
    model = cpu_paths.use_fast_cpu_paths(q4_llama(hidden=64))
    assert is_packed(model) and calls == [1]
    ids = torch.tensor([[5, 17, 300, 9]])
    with torch.no_grad():
        trimmed = model(ids).logits
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    plain = cpu_paths.use_fast_cpu_paths(q4_llama(hidden=64))
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, trimmed)


def test_a_model_that_is_not_packed_is_not_trimmed(monkeypatch):
    """A model no kernel packs (float64 here) leaves the heap alone: there is nothing freed
    to give back."""
    calls = _count_trims(monkeypatch)
    model = q4_llama(hidden=64).to(torch.float64)
    cpu_paths.use_fast_cpu_paths(model)
    assert not is_packed(model) and calls == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_file_backed_tells_a_mapped_file_from_the_process_memory(tmp_path):
    """A tensor over a file mapping is file-backed; one torch allocated is not."""
    import numpy as np

    path = tmp_path / "weights.bin"
    np.arange(4096, dtype=np.float32).tofile(path)
    mapped = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="r+"))
    own = torch.arange(4096, dtype=torch.float32)
    assert heap.file_backed([mapped.data_ptr(), own.data_ptr()]) == [True, False]


def test_file_backed_without_proc_counts_memory_as_own(monkeypatch, tmp_path):
    monkeypatch.setattr(heap, "_MAPS", tmp_path / "absent")
    assert heap.file_backed([1, 2]) == [False, False]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_memory_benchmark_reads_this_process():
    rollup = load_benchmark("memory.py").rollup()
    assert set(rollup) == {"rss", "pss", "anon", "file", "seconds"} and rollup["rss"] > 0
