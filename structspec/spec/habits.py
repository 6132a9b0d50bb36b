"""Packaged tokenization habits: how a model splits forced punctuation and ends values.

A model does not always write forced text as its tokenizer would (the default model opens
an answer with ``'{'`` + ``'"'`` as often as with ``'{"'``, writes ``'":'`` + ``'"'`` for
``'":"'``, ends a string with ``'",'``). :class:`~structspec.spec.cost.AcceptanceModel`
learns this from the model's own choices, so a ``Generator``'s later requests draft it right
— but its first request, and every one-shot CLI call, paid for each habit once: on 60
held-out BFCL calls, 631 verification passes from scratch against 385 with the habits known
(session 36). A habits file, written by ``scripts/learn_habits.py`` from requests outside
the benchmarks' tasks and shipped beside the model's draft head, seeds every new
``AcceptanceModel`` as a weak prior (one observation per context) that the model's own
choices soon outweigh. Habits only steer drafts: outputs are the same with or without them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from structspec.spec.cost import AcceptanceModel
from structspec.spec.draft_head import HEADS_DIR, fingerprint, per_model

KIND = "structspec-habits"
FORMAT = 1

_PACKAGED: dict[int, tuple[Any, dict[str, Any] | None]] = {}


def habits_path(model_name: str) -> Path:
    """Where the packaged habits of ``model_name`` live (the file may not exist)."""
    return HEADS_DIR / f"{model_name}.habits.json"


def save_habits(path: Path, acceptance: AcceptanceModel, model: Any, *, name: str,
                meta: dict[str, Any] | None = None) -> None:
    """Write ``acceptance``'s habits for ``model`` (its fingerprint, ``name``, ``meta``)."""
    blob = {"kind": KIND, "format": FORMAT, "name": name, "fingerprint": fingerprint(model),
            "meta": dict(meta or {}), **acceptance.habits()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(blob, indent=1, ensure_ascii=True) + "\n")


def _read(path: Path) -> dict[str, Any] | None:
    """The habits in ``path``, or ``None`` where it is not a readable habits file."""
    try:
        blob = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(blob, dict) or blob.get("kind") != KIND or blob.get("format") != FORMAT:
        return None
    return blob


def packaged_habits(model: Any) -> dict[str, Any] | None:
    """The habits shipped in the heads folder whose fingerprint matches ``model`` (read
    once per model object), or ``None``."""

    def find() -> dict[str, Any] | None:
        mine = fingerprint(model)
        for path in sorted(HEADS_DIR.glob("*.habits.json")):
            blob = _read(path)
            if blob is not None and blob.get("fingerprint") == mine:
                return blob
        return None

    return per_model(_PACKAGED, model, find)


def fresh_acceptance(model: Any) -> AcceptanceModel:
    """A new :class:`AcceptanceModel` for ``model``, seeded with its packaged habits where
    there are any (a damaged file is a missing one: habits only steer drafts)."""
    acceptance = AcceptanceModel()
    habits = packaged_habits(model)
    if habits is not None:
        try:
            acceptance.seed(habits)
        except ValueError:
            return AcceptanceModel()
        size = model.get_input_embeddings().weight.shape[0]
        ids = [t for seen in acceptance.splits.values() for t in seen] + [*acceptance.closers]
        if any(not 0 <= t < size for t in ids):  # not this vocabulary's tokens
            return AcceptanceModel()
    return acceptance
