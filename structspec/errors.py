"""The exception hierarchy of structspec.

Every error a caller can provoke with bad input is a subclass of :class:`StructSpecError`,
and the ones caused by an invalid argument also inherit :class:`ValueError`, so existing
``except ValueError`` code keeps working. Errors name *where* the problem is: a JSON pointer
into a schema, a line/column in a grammar, or the argument of a request.

This module imports nothing of ours (it sits at the bottom of the dependency order).
"""

from __future__ import annotations

from typing import Any


class StructSpecError(Exception):
    """Base class of every error raised by structspec on purpose.

    Errors pickle as they are (a process pool hands them back to the caller): the message
    and every attribute, not ``type(err)(*err.args)`` — most subclasses build their message
    from their arguments, which pickle's default would do twice."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type[StructSpecError], args: tuple[Any, ...],
             state: dict[str, Any]) -> StructSpecError:
    """An error of class ``cls`` with ``args`` and attributes ``state``, its
    ``__init__`` not called (what :meth:`StructSpecError.__reduce__` pickles)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class SchemaError(StructSpecError, ValueError):
    """A JSON Schema is invalid (it fails its metaschema or cannot be resolved).

    Attributes:
        pointer: JSON pointer (RFC 6901) to the offending subschema, ``""`` for the root.
    """

    def __init__(self, message: str, pointer: str = "") -> None:
        self.pointer = pointer
        where = pointer or "/"
        super().__init__(f"{message} (at schema {where})")


class UnsupportedSchemaError(SchemaError):
    """A valid schema uses a keyword the compiler cannot enforce exactly.

    structspec never ignores or widens a keyword silently; it refuses the schema instead.

    Attributes:
        keyword: the schema keyword that cannot be enforced, e.g. ``"minimum"``.
        pointer: JSON pointer to the subschema that holds the keyword.
    """

    def __init__(self, keyword: str, pointer: str = "", detail: str = "") -> None:
        self.keyword = keyword
        self.pointer = pointer
        where = pointer or "/"
        message = f"keyword {keyword!r} at schema {where} cannot be enforced exactly"
        if detail:
            message += f": {detail}"
        message += " (pass lenient=True to generate under a superset and validate afterwards)"
        StructSpecError.__init__(self, message)


class GrammarError(StructSpecError, ValueError):
    """A grammar or regular expression is invalid or uses an unsupported construct.

    Attributes:
        line: 1-based line of the problem, when known.
        column: 1-based column of the problem, when known.
    """

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        self.line = line
        self.column = column
        if line is not None:
            message = f"{message} (line {line}" + (f", column {column})" if column else ")")
        super().__init__(message)


class VocabularyError(StructSpecError, ValueError):
    """The tokenizer cannot be read, or cannot express the constraint."""


class ResourceLimitError(StructSpecError):
    """Compiling or running a constraint exceeded a budget (states, bytes or seconds)."""


class ModelLoadError(StructSpecError, ValueError):
    """A model or tokenizer could not be found or loaded; the message says how to fix it."""


class GenerationError(StructSpecError):
    """Generation ended without a complete, valid output.

    Attributes:
        text: the partial output produced so far.
        token_ids: the generated token ids so far.
        stats: what the attempt cost (a ``DecodeStats``), when known.
    """

    def __init__(self, message: str, text: str = "", token_ids: list[int] | None = None,
                 stats: object | None = None) -> None:
        self.text = text
        self.token_ids = list(token_ids or [])
        self.stats = stats
        super().__init__(message)


class DistributedError(StructSpecError):
    """A multi-process verification step failed or the process group is misconfigured."""
