"""The native-kernel switch: ``STRUCTSPEC_NATIVE=off`` forces every NumPy twin."""

from structspec import _native


def test_switch_off_returns_none(monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_NATIVE", "off")
    assert not _native.enabled()
    assert _native.load("anything") is None


def test_missing_kernel_is_none(monkeypatch):
    monkeypatch.delenv("STRUCTSPEC_NATIVE", raising=False)
    assert _native.load("no_such_kernel") is None
