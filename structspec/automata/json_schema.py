"""JSON Schema -> token constraint: checking, references, lowering, grammar, caching.

A schema is checked against its metaschema (errors carry a JSON pointer), its references are
bundled into local pointers (:mod:`.schema_refs`), then it is *lowered*
(:mod:`.schema_lowering`) into a small exact dialect — ``anyOf``, ``enum``/``const``, typed
nodes with lengths, items and named properties, ``$ref`` rule references, and regex
placeholders (:mod:`.schema_regex`) for patterns, formats and numeric bounds. ``allOf`` and
keywords beside ``$ref``/``anyOf`` are intersected first (:mod:`.schema_merge`); ``not``,
``if``/``then``/``else`` and overlapping ``oneOf`` go through complements
(:mod:`.schema_negation`). :mod:`.json_grammar` turns the dialect into the grammar IR, run by
:class:`~structspec.automata.grammar.GrammarConstraint`.

What cannot be enforced exactly raises :class:`UnsupportedSchemaError` naming the keyword
and the JSON pointer — or, with ``lenient=True``, warns (:class:`LenientSchemaWarning`), is
dropped for generation, and the constraint reports ``exact=False`` (validate outputs with
``.problem(text)``, which reads numbers as the decimals written). Keywords neither we nor
the draft's validator know are annotations.

Narrowing (fewer outputs than the schema allows, never more) is documented in
``docs/json_schema.md``: named properties in schema order (others only with
``extra_properties=True``, after them), arrays without ``maxItems`` capped at
``max_array_items``, anchored alternatives of a pattern matched in full, numbers with bounds
without exponent.

Compiled constraints are cached per process (LRU of 64) and on disk (:mod:`.cache`), keyed by
the schema text in key order, the options, the registry, the limits and the vocabulary
fingerprint.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from structspec.automata.cache import CompileCache, disk_cache, disk_key
from structspec.automata.limits import Limits, check_input_size, compiling
from structspec.automata.schema_keywords import ANNOTATIONS, DEFAULT_MAX_ARRAY_ITEMS
from structspec.automata.schema_lowering import _Lowering
from structspec.automata.schema_refs import DATA_KEYWORDS, bundle_refs
from structspec.automata.schema_regex import FORMATS, pattern_regex, python_pattern
from structspec.automata.schema_validate import decimal_validator, exact_validator, text_problem
from structspec.automata.schema_values import escape_pointer
from structspec.errors import (
    GrammarError,
    ResourceLimitError,
    SchemaError,
    UnsupportedSchemaError,
)

if TYPE_CHECKING:
    from structspec.automata.base import TokenMask
    from structspec.automata.grammar import GrammarConstraint
    from structspec.vocab import Vocabulary

__all__ = [
    "ANNOTATIONS",
    "DEFAULT_WHITESPACE",
    "FLEXIBLE_WHITESPACE",
    "FORMATS",
    "JsonSchemaConstraint",
    "LenientSchemaWarning",
    "compile_json_schema",
    "pattern_regex",
]

#: Whitespace allowed between JSON tokens with ``whitespace="flexible"``. Bounded, so a model
#: cannot loop on blank space; 16 covers a newline plus indentation of most pretty-printers.
FLEXIBLE_WHITESPACE = r"[ \t\n\r]{0,16}"
#: The default policy: JSON as Python's ``json.dumps`` writes it, ``{"a": 1, "b": [2, 3]}``.
#: Small models write it more accurately than compact JSON, which they saw far less: the
#: default model got 111 of the 250 BFCL dev calls right spaced, 80 compact and 103 with the
#: whitespace left to it (``flexible``; it then pretty-prints), and spaced JSON's separators
#: stay forced text, so speculation drafts them (7.85 tokens per pass against 6.87 compact,
#: 3.42 flexible; ``benchmarks/bfcl_accuracy.py --whitespace spaced,compact,flexible``).
DEFAULT_WHITESPACE = "spaced"
_WHITESPACE = {"compact": "", "spaced": " ", "flexible": FLEXIBLE_WHITESPACE}


class LenientSchemaWarning(UserWarning):
    """A keyword was dropped for generation because ``lenient=True`` (output not exact)."""



# -- schema loading and metaschema errors -------------------------------------------------------

_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                "dependencies"}
_SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}
_SCHEMA_ONE = {"items", "additionalItems", "additionalProperties", "not", "if", "then", "else",
               "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
               "contentSchema"}


def _subschema_pointer(root: Any, path: list[Any]) -> tuple[str, list[Any]]:
    """Split a metaschema error path into (pointer of the deepest subschema, rest of path)."""
    node, depth, i = root, 0, 0
    while i < len(path) and isinstance(node, dict) and path[i] in node:
        key, value = path[i], node[path[i]]
        if key in _SCHEMA_MAPS | _SCHEMA_LISTS | {"items"} and i + 1 < len(path) and \
                isinstance(value, (dict, list)) and (key != "items" or isinstance(value, list)):
            try:
                node = value[path[i + 1]]
            except (KeyError, IndexError, TypeError):
                break
            i += 2
        elif key in _SCHEMA_ONE and isinstance(value, (dict, bool)):
            node = value
            i += 1
        else:
            break
        depth = i
    pointer = "".join(f"/{escape_pointer(p)}" for p in path[:depth])
    return pointer, list(path[depth:])


def _load_schema(schema: Any, registry: Mapping[str, Any] | None = None,
                 lenient: bool = False) -> tuple[Any, Any]:
    """Parse (if text) and check ``schema`` against its metaschema, and bundle its references
    (:func:`~structspec.automata.schema_refs.bundle_refs`, remote ones from ``registry``);
    returns (bundled schema, validator of it)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError as JsonSchemaError
    from jsonschema.validators import validator_for

    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise SchemaError(f"the schema is not valid JSON: {exc}") from exc
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema, format_checker=_schema_format_checker(cls))
    except JsonSchemaError as exc:
        pointer, _ = _subschema_pointer(schema, list(exc.path))
        full = "".join(f"/{escape_pointer(p)}" for p in exc.path)
        raise SchemaError(f"invalid schema{f' at {full}' if full else ''}: {exc.message}",
                          pointer) from exc
    schema = bundle_refs(schema, registry, lenient=lenient)
    text = json.dumps(schema)
    if "\\p" in text or "\\P" in text:
        schema = _python_patterns(schema)
    return schema, exact_validator(cls)(schema, format_checker=cls.FORMAT_CHECKER)


@cache
def _schema_format_checker(cls: Any) -> Any:
    """The metaschema's format checker, with ``regex`` accepting ECMA-262 ``\\p{...}``
    (general categories), which Python's ``re`` does not know."""
    import re

    from jsonschema import FormatChecker

    checker = FormatChecker()
    checker.checkers = dict(cls.FORMAT_CHECKER.checkers)

    def is_regex(instance: object) -> bool:
        if isinstance(instance, str):
            try:
                spelled = python_pattern(instance)
            except ValueError:  # a property we cannot spell: refused later, not "invalid"
                return True
            re.compile(spelled)
        return True

    checker.checkers["regex"] = (is_regex, re.error)
    return checker


def _python_patterns(node: Any) -> Any:
    """A copy of ``node`` with every ``pattern`` and ``patternProperties`` key spelled for
    Python's ``re`` (:func:`~.schema_regex.python_pattern`): the validator then means what
    the compiled automaton means."""
    if isinstance(node, list):
        return [_python_patterns(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in DATA_KEYWORDS:
            out[key] = value
        elif key == "pattern" and isinstance(value, str):
            out[key] = _spelled(value)
        elif key == "patternProperties" and isinstance(value, dict):
            out[key] = {_spelled(k): _python_patterns(v) for k, v in value.items()}
        else:
            out[key] = _python_patterns(value)
    return out


def _spelled(pattern: str) -> str:
    try:
        return python_pattern(pattern)
    except ValueError as exc:
        raise UnsupportedSchemaError("pattern", "", str(exc)) from exc


# -- the compiled constraint ---------------------------------------------------------------------


class JsonSchemaConstraint:
    """Outputs that are JSON documents valid against a schema, token by token.

    Implements the :class:`~structspec.automata.base.Constraint` protocol by delegating to the
    grammar constraint of the lowered schema (states are its integers). Immutable and
    thread-safe; build it with :func:`compile_json_schema`.

    Attributes:
        schema: the schema as given (a private parsed copy).
        validator: a ``jsonschema`` validator of ``schema`` with format checking on, for
            values; outputs (text) are better validated with :meth:`problem`.
        exact: whether every accepted output validates (``False`` when ``lenient=True``
            dropped a keyword). Narrowing (fewer outputs than the schema allows) keeps it true.
        whitespace: the whitespace policy, ``"spaced"``, ``"compact"`` or ``"flexible"``.
        dropped: ``(keyword, pointer, reason)`` of each keyword dropped in lenient mode.
        inner: the :class:`~structspec.automata.grammar.GrammarConstraint` this delegates to.
    """

    def __init__(self, inner: GrammarConstraint, schema: Any, validator: Any, *, whitespace: str,
                 dropped: tuple[tuple[str, str, str], ...] = ()) -> None:
        self.inner = inner
        self.schema = schema
        self.validator = validator
        self.whitespace = whitespace
        self.dropped = dropped
        self.exact = not dropped
        self._decimal_validator: Any = None

    @property
    def vocab(self) -> Vocabulary:
        """The vocabulary the masks are for."""
        return self.inner.vocab

    @property
    def initial(self) -> int:
        """The state before any token."""
        return self.inner.initial

    @property
    def vocab_size(self) -> int:
        """The number of ids a mask covers."""
        return self.inner.vocab_size

    def advance(self, state: int, token: int) -> int | None:
        """The state after ``token``, or ``None`` if it is illegal. Pure."""
        return self.inner.advance(state, token)

    def allowed(self, state: int) -> TokenMask:
        """The legal ids in ``state`` (EOS exactly when accepting); memoized."""
        return self.inner.allowed(state)

    def is_accepting(self, state: int) -> bool:
        """Whether the text so far is a complete document of the schema."""
        return self.inner.is_accepting(state)

    def forced(self, state: int) -> bytes:
        """Bytes every valid continuation from ``state`` must emit next."""
        return self.inner.forced(state)

    def memo_size(self) -> int:
        """How much has been memoized (see the disk cache)."""
        return self.inner.memo_size()

    def problem(self, text: str) -> str | None:
        """Why the output ``text`` is not a valid instance of the schema, or ``None``.

        Numbers count as the decimals written (:mod:`.schema_validate`), as the constraint
        means them: ``.validator`` on ``json.loads(text)`` sees floats, which may round
        across a bound (``0.99999999999999999`` reads as ``1.0``)."""
        if self._decimal_validator is None:
            from jsonschema import Draft202012Validator
            from jsonschema.validators import validator_for

            cls = validator_for(self.schema, default=Draft202012Validator)
            self._decimal_validator = decimal_validator(self.schema, cls)
        return text_problem(self._decimal_validator, text)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["validator"] = None  # rebuilt from the schema: validator classes are dynamic
        state["_decimal_validator"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        from jsonschema import Draft202012Validator
        from jsonschema.validators import validator_for

        self.__dict__.update(state)
        cls = validator_for(self.schema, default=Draft202012Validator)
        self.validator = exact_validator(cls)(self.schema, format_checker=cls.FORMAT_CHECKER)

    def warn(self, stacklevel: int = 2) -> None:
        """Emit one :class:`LenientSchemaWarning` per dropped keyword."""
        for keyword, pointer, reason in self.dropped:
            warnings.warn(LenientSchemaWarning(
                f"lenient=True: keyword {keyword!r} at schema {pointer or '/'} is not enforced "
                f"during generation ({reason}); validate the output"), stacklevel=stacklevel + 1)

    def __repr__(self) -> str:
        return (f"JsonSchemaConstraint(exact={self.exact}, whitespace={self.whitespace!r}, "
                f"states={self.inner.state_count()})")


# -- compiling --------------------------------------------------------------------------------

_MEMORY: CompileCache[JsonSchemaConstraint] = CompileCache(maxsize=64)


def _whitespace_pattern(whitespace: Any) -> str:
    if isinstance(whitespace, str) and whitespace in _WHITESPACE:
        return _WHITESPACE[whitespace]
    if isinstance(whitespace, int):
        raise ValueError(f"whitespace={whitespace!r}: indentation (indent=N) is not supported "
                         "yet; use 'spaced', 'compact' or 'flexible'")
    raise ValueError(f"whitespace must be 'spaced', 'compact' or 'flexible', not {whitespace!r}")


def compile_json_schema(
    schema: dict[str, Any] | bool | str | type,
    vocab: Vocabulary,
    *,
    whitespace: str = DEFAULT_WHITESPACE,
    lenient: bool = False,
    extra_properties: bool = False,
    max_array_items: int | None = DEFAULT_MAX_ARRAY_ITEMS,
    limits: Limits | None = None,
    registry: Mapping[str, Any] | None = None,
) -> JsonSchemaConstraint:
    """Compile a JSON Schema into a token-level constraint for ``vocab``.

    Args:
        schema: the schema as a dict, a boolean, JSON text, or a Pydantic model class (its
            ``model_json_schema()``, as ``Generator.run`` takes it). Its ``$schema`` picks
            the draft (default 2020-12).
        vocab: the vocabulary the masks are for.
        whitespace: ``"spaced"`` (the default: one space after each ``,`` and ``:``, none
            elsewhere, as Python's ``json.dumps`` writes; see :data:`DEFAULT_WHITESPACE` for
            why), ``"compact"`` (no whitespace between JSON tokens) or ``"flexible"`` (up to
            16 of space/tab/newline/CR between tokens; see ``FLEXIBLE_WHITESPACE``).
        extra_properties: also generate what validation allows beyond what the schema
            names: properties it does not name (``additionalProperties`` absent, true or a
            schema), after the named ones, and values of every type where a subschema has no
            ``type``; ``False`` (default) generates only named properties, and only the types
            whose keywords an untyped subschema uses — validation is the same either way,
            but small models otherwise invent keys until the token limit.
        max_array_items: cap on the length of arrays that have no ``maxItems`` (default
            16); ``None`` is spec-faithful. Together with ``extra_properties=True`` this is
            the mode the MaskBench harness uses.
        lenient: instead of refusing a keyword that cannot be enforced exactly, warn
            (:class:`LenientSchemaWarning`), drop it for generation and return a constraint
            with ``exact=False``; validate outputs with ``.validator``.
        registry: documents that ``$ref`` may name by URI (``{uri: schema}``); remote
            schemas are never fetched, a reference outside the schema and the registry is
            refused.
        limits: budgets for this compilation (states, table bytes, seconds, input size,
            nesting; :class:`~structspec.automata.limits.Limits`); defaults if ``None``.

    Returns:
        An immutable, thread-safe :class:`JsonSchemaConstraint`. Results are cached per
        process (bounded LRU); the call does not mutate
        ``schema``. Thread-safe.

    Raises:
        SchemaError: the schema is not JSON, fails its metaschema (``.pointer`` names the
            subschema), has an unresolvable ``$ref``, or accepts no value at all.
        UnsupportedSchemaError: a keyword cannot be enforced exactly (``.keyword``,
            ``.pointer``), unless ``lenient``.
        ResourceLimitError: the compilation exceeds ``limits`` (automaton states or bytes
            for very long strings or huge patterns, seconds, the schema's size) or the
            schema nests too deeply.
        ValueError: ``whitespace`` is not ``"spaced"``, ``"compact"`` or ``"flexible"``.
    """
    _whitespace_pattern(whitespace)  # validates the argument
    to_json_schema = getattr(schema, "model_json_schema", None) \
        if isinstance(schema, type) else None
    if callable(to_json_schema):
        schema = to_json_schema()  # a Pydantic model (duck-typed: no import here)
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise SchemaError(f"the schema is not valid JSON: {exc}") from exc
    try:  # insertion order kept: property order is part of what gets generated
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"the schema is not JSON-serializable: {exc}") from exc
    except RecursionError as exc:
        raise ResourceLimitError("the schema nests too deeply to compile") from exc
    if max_array_items is not None and (not isinstance(max_array_items, int)
                                        or max_array_items < 1):
        raise ValueError(f"max_array_items must be a positive integer or None, "
                         f"not {max_array_items!r}")
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a structspec.Limits, not {type(limits).__name__}")
    options = (whitespace, bool(lenient), bool(extra_properties), max_array_items, limits)
    registry_text = _registry_text(registry)
    key = (text, registry_text, *options, vocab.fingerprint)

    def build() -> JsonSchemaConstraint:
        disk = disk_cache()
        dkey = disk_key("schema", text, registry_text, *options, vocab.fingerprint)
        if disk is not None:
            hit = disk.load(dkey, vocab)
            if isinstance(hit, JsonSchemaConstraint):
                return hit
        with compiling(limits, "compiling the schema"):
            check_input_size(text, "the schema")
            try:
                built = _compile(json.loads(text), vocab, whitespace, bool(lenient),
                                 bool(extra_properties), max_array_items,
                                 json.loads(registry_text) if registry else None)
            except RecursionError as exc:  # a pathological nesting of subschemas
                raise ResourceLimitError("the schema nests too deeply to compile") from exc
        if disk is not None:
            disk.remember(dkey, built)  # written at flush (exit), not on this path
        return built

    constraint = _MEMORY.get_or_compile(key, build)
    constraint.warn(stacklevel=2)
    return constraint


def _registry_text(registry: Mapping[str, Any] | None) -> str:
    """The registry as canonical JSON text (part of the cache key)."""
    if registry is None:
        return "null"
    if not isinstance(registry, Mapping):
        raise TypeError(f"registry must be a mapping of URI -> schema, not "
                        f"{type(registry).__name__}")
    try:
        return json.dumps(dict(registry), sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"the registry is not JSON-serializable: {exc}") from exc


def check_json_schema(schema: dict[str, Any] | bool | str, *, lenient: bool = False,
                      registry: Mapping[str, Any] | None = None) -> None:
    """Raise what :func:`compile_json_schema` would raise for ``schema``, without a vocabulary.

    Cheap (no automaton is built): the CLI and servers call it before loading a model so
    that a bad schema fails fast. Pure.

    Raises:
        SchemaError, UnsupportedSchemaError: as :func:`compile_json_schema`.
    """
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise SchemaError(f"the schema is not valid JSON: {exc}") from exc
    try:
        schema, validator = _load_schema(schema, registry, lenient)
        lowering = _Lowering(schema, validator, lenient)
        lowered = lowering.lower(schema, "", top=True)
    except RecursionError as exc:
        raise ResourceLimitError("the schema nests too deeply to check") from exc
    if lowered is None and "" not in lowering.recursive:
        reason, pointer = lowering.unsat
        raise SchemaError(f"the schema accepts no value: {reason}", pointer)


def _compile(
    schema: Any, vocab: Vocabulary, whitespace: str, lenient: bool, extra_properties: bool,
    max_array_items: int | None, registry: Mapping[str, Any] | None = None,
) -> JsonSchemaConstraint:
    from structspec.automata.grammar import GrammarConstraint
    from structspec.automata.json_grammar import DialectCompiler

    schema, validator = _load_schema(schema, registry, lenient)
    lowering = _Lowering(schema, validator, lenient, extra_properties=extra_properties)
    lowered = lowering.lower(schema, "", top=True)
    if "" in lowering.recursive:  # the root refers to itself ("$ref": "#")
        lowering.rules[""] = lowered
        lowered = {"$ref": ""}
    if lowered is None:
        reason, pointer = lowering.unsat
        raise SchemaError(f"the schema accepts no value: {reason}", pointer)
    compiler = DialectCompiler(lowering.placeholders, whitespace, lowering.rules,
                               max_array_items=max_array_items)
    try:
        grammar = compiler.build(lowered)
    except GrammarError as exc:
        raise SchemaError(f"the schema accepts no value: {exc}") from exc
    return JsonSchemaConstraint(GrammarConstraint(grammar, vocab), schema, validator,
                                whitespace=whitespace, dropped=tuple(lowering.dropped))

