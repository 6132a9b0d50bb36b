"""Compilers from schemas, regexes and grammars to token-level constraints.

Everything here is torch-free: ``import structspec.automata`` loads numpy and jsonschema,
never torch. Compiled constraints are immutable and thread-safe; their states
are small hashable values (see :mod:`structspec.automata.base`).
"""

from __future__ import annotations

from structspec.automata.base import Constraint, State, TokenMask, accepts, walk
from structspec.automata.json_schema import JsonSchemaConstraint, compile_json_schema
from structspec.automata.lark_compile import LarkConstraint, compile_grammar
from structspec.automata.lark_grammar import PYTHON_INDENTER, IndenterSpec
from structspec.automata.limits import Limits
from structspec.automata.regex import RegexConstraint, compile_regex

__all__ = [
    "PYTHON_INDENTER",
    "Constraint",
    "IndenterSpec",
    "JsonSchemaConstraint",
    "LarkConstraint",
    "Limits",
    "RegexConstraint",
    "State",
    "TokenMask",
    "accepts",
    "compile_grammar",
    "compile_json_schema",
    "compile_regex",
    "walk",
]
