"""The native-kernel switch: ``STRUCTSPEC_NATIVE=off`` forces every NumPy twin."""

import os
from pathlib import Path

import pytest

from structspec import _native


def test_switch_off_returns_none(monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_NATIVE", "off")
    assert not _native.enabled()
    assert _native.load("anything") is None


def test_missing_kernel_is_none(monkeypatch):
    monkeypatch.delenv("STRUCTSPEC_NATIVE", raising=False)
    assert _native.load("no_such_kernel") is None


def test_every_kernel_is_built_where_required(monkeypatch):
    """CI sets ``STRUCTSPEC_REQUIRE_NATIVE=1``: there a kernel that failed to build (the
    build is optional for users) must fail loudly instead of leaving the twins in place."""
    if os.environ.get("STRUCTSPEC_REQUIRE_NATIVE") != "1":
        pytest.skip("STRUCTSPEC_REQUIRE_NATIVE is not set (only CI requires the C kernels)")
    monkeypatch.delenv("STRUCTSPEC_NATIVE", raising=False)
    names = sorted(p.stem for p in Path(_native.__file__).parent.glob("*.c"))
    assert names, "no kernel sources found"
    missing = [n for n in names if _native.load(n) is None]
    assert not missing, f"native kernels not built: {missing}"
