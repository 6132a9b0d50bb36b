"""Soundness on schemas others wrote: random walks through compiled external schemas.

The suite's and MaskBench's instances test what their authors thought of; a walk through
the compiled constraint tests what the compiler made of the schema — every branch of a
merge, a complement, a ``contains`` count — against the draft's own validator. Each walk
takes random legal bytes, then finishes (:class:`test_json_schema.Walker`), and its text must
validate, numbers read as the decimals written (:meth:`JsonSchemaConstraint.problem`).

Schemas: every test group of the JSON-Schema-Test-Suite (draft 2020-12), and a fixed sample
of MaskBench (every 20th of its 7,773 schemas), from ``../shared/data`` — skipped where it is
absent. Both with and without ``extra_properties`` (the wider language has more paths), over
the toy byte vocabulary; and a smaller MaskBench sample in the default model's vocabulary.
Schemas the compiler refuses are skipped; a walk the Walker cannot finish (a long required
array, a pattern to spell inside required keys among many optional ones: ~0.3% of MaskBench's
schemas, each checked to accept a valid instance) is counted, not failed, up to a bound.
"""

from __future__ import annotations

import functools
import random
import warnings
from typing import Any

import pytest
from conftest import maskbench_rows, suite_groups
from test_json_schema import Walker

from structspec.automata import compile_json_schema
from structspec.errors import StructSpecError
from structspec.vocab import Vocabulary

#: The texts these tests drive through the constraint are compact JSON (``{"a":1}``), as the
#: suites write their instances: compile in that policy, not the default (spaced).
compile_json_schema = functools.partial(compile_json_schema, whitespace="compact")

MASKBENCH_STRIDE = 20


def _suite() -> list[tuple[str, Any]]:
    return [(name, group["schema"]) for name, group in suite_groups()]


def _maskbench(stride: int = MASKBENCH_STRIDE, start: int = 0) -> list[tuple[str, Any]]:
    return [(row["id"], row["schema"]) for row in maskbench_rows(stride, start)]


def _walk_all(schemas: list[tuple[str, Any]], vocab: Vocabulary, *, walks: int,
              extra: bool, budgets: tuple[int, ...] = (10, 30, 80)
              ) -> tuple[list[str], list[str], int]:
    """(invalid outputs, unfinished walks, schemas walked)."""
    invalid: list[str] = []
    stuck: list[str] = []
    walked = 0
    for n, (name, schema) in enumerate(schemas):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                constraint = compile_json_schema(schema, vocab, max_array_items=None,
                                                 extra_properties=extra)
        except StructSpecError:  # refused honestly: the suite ratchet counts those
            continue
        walked += 1
        walker, rng = Walker(constraint), random.Random(n)
        for _ in range(walks):
            try:
                ids = walker.walk(rng, budget=rng.choice(budgets))
            except AssertionError:
                stuck.append(name)
                break
            text = vocab.decode(ids).decode("utf-8")
            problem = constraint.problem(text)
            if problem is not None:
                invalid.append(f"{name}: {text[:200]!r}: {problem[:200]}")
                break
    return invalid, stuck, walked


@pytest.mark.parametrize("extra", [False, True], ids=["named", "extra_properties"])
def test_suite_schemas_walk_to_valid_documents(byte_vocab, extra):
    invalid, stuck, walked = _walk_all(_suite(), byte_vocab, walks=10, extra=extra)
    assert walked > 250
    assert not invalid, "invalid outputs:\n" + "\n".join(invalid)
    assert len(stuck) <= 2, f"walks that could not finish: {stuck}"


@pytest.mark.parametrize("extra", [False, True], ids=["named", "extra_properties"])
def test_maskbench_schemas_walk_to_valid_documents(byte_vocab, extra):
    invalid, stuck, walked = _walk_all(_maskbench(), byte_vocab, walks=5, extra=extra)
    assert walked > 350
    assert not invalid, "invalid outputs:\n" + "\n".join(invalid)
    assert len(stuck) <= walked // 50, f"walks that could not finish: {stuck}"


def test_maskbench_walks_in_the_real_vocabulary(smollm_vocab):
    """Random tokens of the default model's vocabulary (multi-byte pieces that cross JSON's
    lexemes), on a smaller sample (masks over 49k tokens cost more)."""
    invalid, stuck, walked = _walk_all(_maskbench(stride=80, start=3), smollm_vocab, walks=3,
                                       extra=True, budgets=(5, 15, 40))
    assert walked > 85
    assert not invalid, "invalid outputs:\n" + "\n".join(invalid)
    assert len(stuck) <= 1, f"walks that could not finish: {stuck}"
