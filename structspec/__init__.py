"""structspec: structured output from language models.

JSON Schemas (and Pydantic models), regexes and grammars compile into token-level constraint
automata that mask a model's next-token choices, so every output is valid by construction.

Quick start::

    import structspec
    person = structspec.generate("Extract: Ana, 31, from Lisbon", schema=Person)

The automata (``structspec.automata``) import without torch; the decoding side (``Generator``,
``generate``) loads torch and transformers on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from structspec._version import __version__
from structspec.automata import (
    Constraint,
    JsonSchemaConstraint,
    LarkConstraint,
    Limits,
    RegexConstraint,
    TokenMask,
    compile_grammar,
    compile_json_schema,
    compile_regex,
)
from structspec.errors import (
    DistributedError,
    GenerationError,
    GrammarError,
    ModelLoadError,
    ResourceLimitError,
    SchemaError,
    StructSpecError,
    UnsupportedSchemaError,
    VocabularyError,
)
from structspec.vocab import Vocabulary

if TYPE_CHECKING:
    from structspec.api import Generator, Result, generate
    from structspec.replicas import Replicas

_LAZY = {"Generator": "structspec.api", "Result": "structspec.api", "generate": "structspec.api",
         "Replicas": "structspec.replicas"}


def __getattr__(name: str) -> Any:
    """Import the torch-dependent API on first use, so ``import structspec`` stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'structspec' has no attribute {name!r}")


__all__ = [
    "Constraint",
    "DistributedError",
    "GenerationError",
    "Generator",
    "GrammarError",
    "JsonSchemaConstraint",
    "LarkConstraint",
    "Limits",
    "ModelLoadError",
    "RegexConstraint",
    "Replicas",
    "ResourceLimitError",
    "Result",
    "SchemaError",
    "StructSpecError",
    "TokenMask",
    "UnsupportedSchemaError",
    "Vocabulary",
    "VocabularyError",
    "__version__",
    "compile_grammar",
    "compile_json_schema",
    "compile_regex",
    "generate",
]
