"""JSON Schema -> token constraint (interim, through outlines-core). Work in progress."""

from __future__ import annotations

from structspec.automata.regex import RegexConstraint


class JsonSchemaConstraint(RegexConstraint):
    """Placeholder while the interim compiler is written."""


def compile_json_schema(schema, vocab, *, whitespace="compact", lenient=False):  # type: ignore[no-untyped-def]
    """Placeholder while the interim compiler is written."""
    raise NotImplementedError("compile_json_schema is being written")
