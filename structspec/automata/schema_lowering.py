"""JSON Schema -> an exact dialect of small pieces, one subschema at a time (``_Lowering``).

The dialect: ``anyOf``, ``enum``, typed nodes with lengths, items and named properties,
``{"$ref": pointer}`` for recursion, and regex placeholders (``x-regex``, ``x-not-regex``,
``x-multiple``, ...) for the regular pieces; :mod:`.json_grammar` turns it into grammar rules.
Every reachable subschema is walked with a whitelist of keywords; what cannot be enforced
exactly is refused (keyword + JSON pointer) or, leniently, dropped and recorded.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import sys
from typing import Any
from urllib.parse import unquote

from structspec.automata.limits import check_time
from structspec.automata.schema_arrays import ArrayLowering
from structspec.automata.schema_merge import MergeError, merge_all
from structspec.automata.schema_negation import (
    INTERNAL,
    NON_INTEGER,
    NOT_MULTIPLE,
    NOT_PATTERN,
    NegationError,
    exactly_one,
    if_then_else,
    negate,
    public_schema,
)
from structspec.automata.schema_objects import ObjectLowering
from structspec.automata.schema_regex import (
    FORMATS,
    _int_range,
    _Refuse,
    pattern_regex,
)
from structspec.errors import SchemaError, UnsupportedSchemaError

_MAX_ENUMERATED = 1024
_MAX_MODULUS = 100_000  # integer multipleOf up to this is a residue automaton
_MAX_BOUND = 10**30  # numeric bounds beyond this magnitude are refused


#: The formats JSON Schema defines (2020-12 and earlier drafts); any other value of
#: ``format`` is an annotation.
STANDARD_FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
    "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
    "json-pointer", "relative-json-pointer", "regex", "host-name", "ip-address", "color",
    "utc-millisec", "style", "phone",
})

#: Generation-time cap on arrays without ``maxItems`` (small models otherwise repeat items
#: until the token limit); ``max_array_items=None`` is the spec-faithful mode.
DEFAULT_MAX_ARRAY_ITEMS = 16


# -- keyword tables ----------------------------------------------------------------------

#: Keywords with no effect on validation: allowed anywhere and ignored.
ANNOTATIONS = frozenset({
    "title", "description", "examples", "default", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$schema", "$anchor",
    "$dynamicAnchor", "$recursiveAnchor", "$vocabulary", "$defs", "definitions",
    "discriminator",  # OpenAPI/pydantic; its oneOf is checked for disjointness on its own
})

#: Type-specific keywords: they constrain only instances of one JSON type.
_FAMILY = {
    **dict.fromkeys(["minLength", "maxLength", "pattern", "format"], "string"),
    **dict.fromkeys(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                     "multipleOf"], "number"),
    **dict.fromkeys(["items", "prefixItems", "additionalItems", "minItems", "maxItems",
                     "uniqueItems", "contains", "minContains", "maxContains",
                     "unevaluatedItems"], "array"),
    **dict.fromkeys(["properties", "required", "additionalProperties", "patternProperties",
                     "propertyNames", "minProperties", "maxProperties", "dependentRequired",
                     "dependentSchemas", "dependencies", "unevaluatedProperties"], "object"),
}
_KNOWN = frozenset(_FAMILY) | {
    "type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
    "$dynamicRef", "$recursiveRef", "$id",
} | INTERNAL  # (the internal keywords of negations count: e.g. merged beside an anyOf)
_ABSENT: Any = object()
#: ``oneOf`` branches that are not provably disjoint are made exact by negating each other
#: branch; beyond this many the grammar grows too much.
MAX_ONEOF_NEGATED = 8



# -- JSON values ----------------------------------------------------------------------------


def _json_type(value: Any) -> str:
    """The JSON type of a Python value, with integers folded into ``number``."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "object")


def _json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality: ``1 == 1.0``, ``True != 1``, containers compared deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_json_equal, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if _json_type(a) == _json_type(b) == "number":
        return bool(a == b)
    return type(a) is type(b) and a == b


def _decimal_step(step: float) -> tuple[int, int] | None:
    """``step`` as ``(a, k)`` with ``step == a / 10**k`` exactly in decimal (``0.01`` ->
    ``(1, 2)``), or ``None`` when its automaton would need over ``_MAX_MODULUS`` states."""
    from decimal import Decimal

    _, digits, exp = Decimal(repr(float(step))).normalize().as_tuple()
    a = int("".join(map(str, digits)))
    k = -int(exp)
    if k < 0:
        a, k = a * 10 ** (-k), 0
    if a * (k + 3) > _MAX_MODULUS:
        return None
    return a, k


#: JSON numbers without an exponent: the form excluded values are removed from.
_PLAIN_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f",
                  "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string_spellings(value: str) -> str:
    """A regex of every JSON spelling of the string ``value`` (quotes included): each
    character as itself where JSON allows it, its short escape, or ``\\u`` with hex digits
    in either case."""
    parts = []
    for c in value:
        alts = []
        if c not in '"\\' and ord(c) >= 0x20:
            alts.append(re.escape(c))
        if c in _JSON_ESCAPES:
            alts.append(re.escape(_JSON_ESCAPES[c]))
        if ord(c) <= 0xFFFF and not 0xD800 <= ord(c) <= 0xDFFF:
            hex_digits = "".join(f"[{h}{h.upper()}]" if h.isalpha() else h
                                 for h in f"{ord(c):04x}")
            alts.append(r"\\u" + hex_digits)
        parts.append(f"(?:{'|'.join(alts)})")
    return '"' + "".join(parts) + '"'


def _number_spellings(value: float, integer: bool) -> str:
    """A regex of the spellings of ``value`` the grammar writes: canonical integers for
    integer schemas (``-0`` too), exponent-free decimals with any trailing zeros otherwise."""
    from decimal import Decimal

    d = Decimal(str(value))
    zero = d == 0
    text = f"{abs(d):f}"
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0")
    sign = "-?" if zero else ("-" if d < 0 else "")
    if integer:
        return f"{sign}{whole}"
    return f"{sign}{whole}\\.{frac}0*" if frac else f"{sign}{whole}(?:\\.0+)?"


_REGEX_META = set(".^$*+?()[]{}|\\\"")


def _escape_pointer(token: Any) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def _resolve_pointer(root: Any, pointer: str) -> Any:
    """The value at an RFC 6901 pointer (``KeyError``/``IndexError`` when absent)."""
    node = root
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node



# -- lowering: a schema -> the dialect outlines-core handles exactly ---------------------------


def _any_value() -> dict[str, Any]:
    """Any JSON value, spelled so that outlines-core groups it.

    outlines-core turns ``{}`` into ``A|B|...`` *without* parentheses, so nested inside an
    object it splits the whole regex (``{"k": {}}`` would accept a bare ``null``); an
    ``anyOf`` of the types is wrapped properly.
    """
    return {"anyOf": [{"type": t} for t in ("null", "boolean", "number", "string", "array",
                                            "object")]}


class _Lowering(ObjectLowering, ArrayLowering):
    """One walk over a schema: returns outlines-ready subschemas, collects refusals.

    Every ``lower_*`` method returns a subschema for outlines-core, or ``None`` when the
    subschema accepts no value (``self.unsat`` says why and where).
    """

    def __init__(self, root: Any, validator: Any, lenient: bool, *,
                 extra_properties: bool = False) -> None:
        self.root = root
        self.validator = validator
        self.lenient = lenient
        self.dropped: list[tuple[str, str, str]] = []
        self.placeholders: dict[str, str] = {}
        self.unsat: tuple[str, str] = ("the schema accepts no value", "")
        self._nonce = secrets.token_hex(6)
        self._memo: dict[tuple[str, bool], Any] = {}
        self._stack: list[str] = [""]
        # Recursion becomes rule references ({"$ref": target}); strings combine pattern,
        # format and lengths (the grammar intersects their automata).
        self.extra_properties = extra_properties
        self.validator_keywords = frozenset(getattr(validator, "VALIDATORS", {}))
        # Assertion keywords of the draft: what a negation must account for.
        self.known = frozenset((_KNOWN | self.validator_keywords) - ANNOTATIONS)
        draft4 = type(validator).__name__ in ("Draft3Validator", "Draft4Validator")
        self.id_keywords = {"$id", "id"} if draft4 else {"$id"}
        self.has_refs = '"$ref"' in json.dumps(root)
        self.recursive: set[str] = set()
        self.rules: dict[str, Any] = {}

    # -- bookkeeping

    def refuse(self, keyword: str, pointer: str, detail: str = "") -> None:
        """Raise :class:`UnsupportedSchemaError`, or record the keyword as dropped (lenient)."""
        if not self.lenient:
            raise UnsupportedSchemaError(keyword, pointer, detail)
        if (keyword, pointer, detail) not in self.dropped:
            self.dropped.append((keyword, pointer, detail))

    def nothing(self, pointer: str, reason: str) -> None:
        self.unsat = (reason, pointer)
        return None

    def placeholder(self, regex: str) -> dict[str, Any]:
        """A ``const`` whose literal is replaced by ``regex`` after outlines-core has run."""
        marker = f"ssp{self._nonce}n{len(self.placeholders)}"
        self.placeholders[marker] = regex
        return {"const": marker}

    def is_valid(self, schema: Any, value: Any) -> bool:
        """``value`` validates against a subschema of the root (refs resolve from the root)."""
        try:
            # internal keywords (from negations) spelled out, or the validator ignores them
            return bool(self.validator.evolve(schema=public_schema(schema)).is_valid(value))
        except Exception as exc:  # unresolvable $ref and the like
            raise SchemaError(f"cannot evaluate the schema: {exc}") from exc

    # -- dispatch

    def lower(self, node: Any, ptr: str, top: bool = False) -> Any:
        """Lower ``node`` (at pointer ``ptr``); ``top``: it is the whole document."""
        check_time()
        if node is True:
            return _any_value()
        if node is False:
            return self.nothing(ptr, "the schema is false")
        kws = {k for k in node if k not in ANNOTATIONS
               and (not k.startswith("x-") or k in INTERNAL)}
        for id_kw in self.id_keywords & kws:
            kws.discard(id_kw)
            ident = node[id_kw]
            # A nested id moves the base URI of the $refs below it; harmless when it is a
            # plain fragment or when the schema has no $ref at all.
            if ptr and self.has_refs and not (isinstance(ident, str) and ident.startswith("#")):
                self.refuse(id_kw, ptr, "a nested id changes how references resolve")
        # Keywords neither we nor the draft's validator know are annotations (the spec says
        # to ignore them), e.g. "example", "readonly", "_format": ignoring them is exact.
        kws &= _KNOWN | self.validator_keywords
        for k in sorted(kws - _KNOWN):
            self.refuse(k, ptr, "keyword of this draft not supported")
        kws &= _KNOWN
        if "enum" in kws or "const" in kws:
            return self.lower_enum(node, ptr, top)
        if "if" in kws and ("then" in kws or "else" in kws):
            try:  # (if and then) or (not if and else), as an anyOf beside the rest
                either = if_then_else(node["if"], node.get("then", True),
                                      node.get("else", True), self.deref, self.known)
            except NegationError as exc:
                self.refuse("if", ptr, f"the if schema has no exact complement: {exc}")
            else:
                rest = {k: v for k, v in node.items() if k not in ("if", "then", "else")}
                return self.lower({"allOf": [rest, either]}, ptr, top)
        kws -= {"if", "then", "else"}
        if "not" in kws:
            rest = {k: v for k, v in node.items() if k != "not"}
            excluded = self.excluded_values(node["not"])
            if excluded is not None:
                if not kws & {"allOf", "anyOf", "oneOf", "$ref"}:
                    kws.discard("not")
                    return self.lower_typed(rest, kws, ptr, top, exclude=excluded)
                # else: merged into the composition's parts below, then excluded there
            else:
                try:
                    negated = negate(node["not"], self.deref, 0, self.known)
                except NegationError as exc:
                    self.refuse("not", ptr, f"no exact complement: {exc}")
                    kws.discard("not")
                else:
                    return self.lower({"allOf": [rest, negated]}, ptr, top)
        for k in ("$dynamicRef", "$recursiveRef"):
            if k in kws:
                self.refuse(k, ptr, "not enforced")
                kws.discard(k)
        if "allOf" in kws or ("$ref" in kws and len(kws) > 1):
            merged = self.merged(node, kws, ptr)
            if merged is not _ABSENT:
                return self.lower(merged, ptr, top)
            kws.discard("allOf")
        if "$ref" in kws:
            for k in sorted(kws - {"$ref"}):
                self.refuse(k, ptr, "keywords beside $ref cannot be intersected with its target")
            return self.lower_ref(node["$ref"], ptr, top)
        if "anyOf" in kws or "oneOf" in kws:
            return self.lower_union(node, kws, ptr, top)
        return self.lower_typed(node, kws, ptr, top)

    def lower_enum(self, node: dict[str, Any], ptr: str, top: bool = False) -> Any:
        """``enum``/``const``: keep the values that validate against the whole subschema."""
        keyword = "const" if "const" in node else "enum"
        candidates = [node["const"]] if keyword == "const" else list(node["enum"])
        kept = [value for value in candidates if self.is_valid(node, value)]
        if not kept:
            return self.nothing(ptr, f"no {keyword} value satisfies the other keywords")
        kept.sort(key=lambda v: -len(json.dumps(v)))  # longest first: see _longest_first
        return {"enum": kept}

    def lower_ref(self, ref: Any, ptr: str, top: bool = False) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            self.refuse("$ref", ptr, f"only local references (#/...) are supported, not {ref!r}")
            return _any_value()
        target = unquote(ref[1:])  # a pointer: schema_refs rewrote every other kind
        if target in self._stack:  # recursion: one rule, referenced
            self.recursive.add(target)
            return {"$ref": target}
        if (target, top) in self._memo:
            return self._memo[target, top]
        try:
            sub = _resolve_pointer(self.root, target)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise SchemaError(f"$ref {ref!r} does not resolve", ptr) from exc
        self._stack.append(target)
        try:
            lowered = self.lower(sub, target, top)
        finally:
            self._stack.pop()
        if target in self.recursive:  # referenced from inside itself: one shared rule
            self.rules[target] = lowered
            lowered = {"$ref": target}
        self._memo[target, top] = lowered
        return lowered

    def merged(self, node: dict[str, Any], kws: set[str], ptr: str) -> Any:
        """``allOf`` (and keywords beside ``$ref``) folded into one schema; ``_ABSENT`` after a
        lenient refusal."""
        rest = {k: v for k, v in node.items() if k != "allOf" and k not in ANNOTATIONS}
        if not ptr:
            rest.pop("$id", None)  # the root's own id does not move any base
        parts = [p for p in [rest, *node.get("allOf", [])] if p not in ({}, True)]
        if len(parts) == 1 and isinstance(parts[0], dict) and set(parts[0]) == {"$ref"}:
            return parts[0]  # just a reference (maybe recursive): lowered as a rule

        def deref(part: Any) -> Any:
            ref = part.get("$ref") if isinstance(part, dict) else None
            if isinstance(ref, str) and ref.startswith("#") and unquote(ref[1:]) in self._stack:
                raise MergeError("$ref", "a recursive $ref inside allOf or beside keywords")
            return self.deref(part)

        try:
            return merge_all(parts, deref)
        except MergeError as exc:
            self.refuse("allOf" if "allOf" in kws else exc.keyword, ptr,
                        f"cannot intersect exactly: {exc}")
            return _ABSENT

    def lower_union(self, node: dict[str, Any], kws: set[str], ptr: str, top: bool) -> Any:
        key = "anyOf" if "anyOf" in kws else "oneOf"
        branches = node[key]
        siblings = {k: v for k, v in node.items() if k in kws and k != key}
        common = dict(siblings)
        if siblings:  # each branch is intersected with the siblings
            try:
                branches = [merge_all([siblings, b], self.deref) for b in branches]
                siblings = {}
            except MergeError as exc:
                self.refuse(key, ptr, f"cannot intersect the branches with their siblings: "
                            f"{exc}")
        for k in sorted(siblings):
            self.refuse(k, ptr, f"keywords beside {key} cannot be intersected with its branches")
        if key == "oneOf":
            branches = self.objects_only(branches)
        if key == "oneOf" and not self.disjoint(branches):
            # Exactly one: branch i and the complement of every other branch.
            try:
                if len(branches) > MAX_ONEOF_NEGATED:
                    raise NegationError("oneOf", f"more than {MAX_ONEOF_NEGATED} branches")
                branches = self.exactly_one(branches, node[key], common)
            except NegationError as exc:
                self.refuse("oneOf", ptr, "cannot prove the branches disjoint (different "
                            "types, different const/enum values, or a required property with "
                            f"different const values) nor negate them ({exc}); use anyOf if "
                            "overlap is fine")
        lowered = [self.lower(b, f"{ptr}/{key}/{i}", top) for i, b in enumerate(branches)]
        kept = [b for b in lowered if b is not None]
        if not kept:
            return self.nothing(ptr, f"no branch of {key} accepts a value")
        return kept[0] if len(kept) == 1 else {"anyOf": kept}

    def exactly_one(self, merged: list[Any], raw: list[Any], common: dict[str, Any]) -> Any:
        """``oneOf`` as "branch *i* and no other" over the branches merged with their
        siblings; where one of those has no exact complement, over the branches as written,
        the siblings merged in afterwards (``S ∧ oneOf(B)`` is ``∨ S ∧ Bi ∧ ¬Bj (j ≠ i)``:
        the siblings need no complement then)."""
        try:
            return exactly_one(merged, self.deref, self.known)
        except NegationError:
            if not common:
                raise
            first = sys.exc_info()[1]
        try:
            parts = exactly_one(self.objects_only(list(raw)), self.deref, self.known)
            return [merge_all([common, b], self.deref) for b in parts]
        except (NegationError, MergeError):
            raise first from None

    # -- oneOf disjointness

    def objects_only(self, branches: list[Any]) -> list[Any]:
        """If every branch constrains objects only (object keywords, no ``type``), any
        non-object matches all of them, so ``oneOf`` (2+ branches) rejects it: each branch may
        then say ``"type": "object"`` — an exact rewrite that lets tags prove disjointness."""
        if len(branches) < 2:
            return branches
        out = []
        for b in branches:
            node = self.deref(b)
            if not isinstance(node, dict):
                return branches
            keys = {k for k in node if k not in ANNOTATIONS and not k.startswith("x-")}
            object_keys = {k for k, fam in _FAMILY.items() if fam == "object"}
            if keys - object_keys and node.get("type") != "object":
                return branches
            out.append(node if node.get("type") == "object" else {**node, "type": "object"})
        return out

    def deref(self, node: Any) -> Any:
        """Follow ``$ref`` chains whose siblings are annotations (bounded)."""
        for _ in range(32):
            if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
                return node
            if any(k not in ANNOTATIONS and k != "$ref" for k in node):
                return node
            ref = node["$ref"]
            if not ref.startswith("#/") and ref != "#":
                return node
            try:
                node = _resolve_pointer(self.root, unquote(ref[1:]))
            except (KeyError, IndexError, ValueError, TypeError):
                return node
        return node

    def values_of(self, node: Any) -> list[Any] | None:
        node = self.deref(node)
        if isinstance(node, dict) and "const" in node:
            return [node["const"]]
        if isinstance(node, dict) and "enum" in node:
            return list(node["enum"])
        return None

    def types_of(self, node: Any) -> set[str] | None:
        """JSON types a subschema may accept (integer folded into number); None: any."""
        node = self.deref(node)
        if node is False:
            return set()
        if not isinstance(node, dict):
            return None
        values = self.values_of(node)
        if values is not None:
            return {_json_type(v) for v in values}
        if "type" in node:
            types = [node["type"]] if isinstance(node["type"], str) else node["type"]
            return {"number" if t == "integer" else t for t in types}
        for key in ("anyOf", "oneOf"):
            if key in node:
                out: set[str] = set()
                for branch in node[key]:
                    sub = self.types_of(branch)
                    if sub is None:
                        return None
                    out |= sub
                return out
        return None

    def tags_of(self, node: Any) -> dict[str, list[Any]]:
        """Required properties with const/enum values of an object-only subschema."""
        node = self.deref(node)
        if not isinstance(node, dict) or self.types_of(node) != {"object"}:
            return {}
        props = node.get("properties", {})
        tags = {}
        for name in node.get("required", []):
            values = self.values_of(props.get(name, True))
            if name in props and values is not None:
                tags[name] = values
        return tags

    def disjoint(self, branches: list[Any]) -> bool:
        """Whether no instance can validate against two of ``branches`` (a cheap proof)."""
        sigs = [(self.types_of(b), self.values_of(b), self.tags_of(b)) for b in branches]
        for i, (ta, va, ga) in enumerate(sigs):
            for j, (tb, vb, gb) in enumerate(sigs[i + 1:], i + 1):
                if ta is not None and tb is not None and not ta & tb:
                    continue
                if va is not None and vb is not None and not any(
                        _json_equal(x, y) for x in va for y in vb):
                    continue
                # a branch of listed values none of which the other accepts (the validator
                # decides each value: exact)
                if va is not None and len(va) <= _MAX_ENUMERATED and not any(
                        self.is_valid(branches[j], x) for x in va):
                    continue
                if vb is not None and len(vb) <= _MAX_ENUMERATED and not any(
                        self.is_valid(branches[i], x) for x in vb):
                    continue
                if any(not any(_json_equal(x, y) for x in ga[k] for y in gb[k])
                       for k in ga.keys() & gb.keys()):
                    continue
                return False
        return True

    # -- typed schemas

    def excluded_values(self, node: Any) -> list[Any] | None:
        """The values of a ``not`` that only lists values (``const``/``enum``, or an
        ``anyOf`` of those); ``None`` for any other ``not``."""
        node = self.deref(node)
        if not isinstance(node, dict):
            return None
        kws = {k for k in node if k not in ANNOTATIONS and k in self.known}
        if kws == {"anyOf"}:
            out: list[Any] = []
            for branch in node["anyOf"]:
                sub = self.excluded_values(branch)
                if sub is None:
                    return None
                out += sub
            return out
        if kws == {"const"}:
            return [node["const"]]
        if kws == {"enum"}:
            return list(node["enum"])
        return None

    def lower_typed(self, node: dict[str, Any], kws: set[str], ptr: str, top: bool,
                    exclude: list[Any] | None = None) -> Any:
        """Typed keywords; ``exclude``: values a ``not`` rules out."""
        if "type" in node:
            types = [node["type"]] if isinstance(node["type"], str) else list(node["type"])
        elif self.extra_properties:  # no type, spec-faithful: every type, each with the
            # keywords of its family (the others hold vacuously)
            if not kws & set(_FAMILY) and not exclude:
                return _any_value()
            types = ["null", "boolean", "number", "string", "array", "object"]
        else:  # no type: generate the types whose keywords are present (narrowing)
            types = sorted({_FAMILY[k] for k in kws if k in _FAMILY})
            if not types and not exclude:
                return _any_value()
            if not types:
                types = ["null", "boolean", "number", "string", "array", "object"]
        out = []
        for t in types:
            if t in ("null", "boolean"):
                lowered: Any = {"type": t}
            elif t == "string":
                lowered = self.lower_string(node, ptr, top)
            else:
                lowered = getattr(self, f"lower_{t}")(node, ptr)
            if lowered is not None and exclude:
                lowered = self.without_values(lowered, t, exclude, ptr)
            if lowered is not None:
                out.append(lowered)
        if not out:
            if len(types) == 1:  # the type's own reason is more precise
                return None
            return self.nothing(ptr, f"no value of type {types} satisfies the keywords")
        return out[0] if len(out) == 1 else {"anyOf": out}

    def without_values(self, lowered: Any, t: str, exclude: list[Any], ptr: str) -> Any:
        """``lowered`` (of type ``t``) minus the JSON values ``exclude`` (``not``/``enum``).

        Each excluded value is removed in every spelling the grammar could write it in
        (``"a"`` is also ``"\\u0061"``; ``5`` is also ``5.0``), so the exclusion is exact.
        """
        family = "number" if t == "integer" else t
        values = [v for v in exclude if _json_type(v) == family]
        if t == "integer":
            values = [v for v in values if float(v).is_integer()]
        if not values:
            return lowered
        if "enum" in lowered:
            kept = [v for v in lowered["enum"] if not any(_json_equal(v, x) for x in values)]
            return {"enum": kept} if kept else self.nothing(ptr, "every value is excluded")
        if t == "null":
            return self.nothing(ptr, "null is excluded")
        if t == "boolean":
            kept = [b for b in (True, False) if not any(_json_equal(b, x) for x in values)]
            return {"enum": kept} if kept else self.nothing(ptr, "both booleans are excluded")
        if t in ("array", "object"):
            self.refuse("not", ptr, f"excluding {t} values is not supported")
            return lowered
        if "const" in lowered and lowered["const"] in self.placeholders:  # a bare regex
            lowered = {"type": t, "x-regex": [lowered["const"]]}
        if not isinstance(lowered, dict) or lowered.get("type") != t:
            self.refuse("not", ptr, f"cannot exclude values from this {t} schema")
            return lowered
        out = dict(lowered)
        if t == "string":
            regex = "|".join(_string_spellings(v) for v in values)
        else:
            regex = "|".join(_number_spellings(v, t == "integer") for v in values)
            if t == "number":  # the spellings are exponent-free: so are the outputs here
                out["x-regex"] = [*out.get("x-regex", ()),
                                  self.placeholder(_PLAIN_NUMBER)["const"]]
        out["x-not-regex"] = [*out.get("x-not-regex", ()), self.placeholder(regex)["const"]]
        return out

    def lower_string(self, node: dict[str, Any], ptr: str, top: bool = False) -> Any:
        """Strings: lengths, pattern and format all at once (their automata are intersected
        by the grammar compiler), as ``x-regex`` placeholders beside the lengths."""
        lo, hi = node.get("minLength"), node.get("maxLength")
        if lo is not None and hi is not None and lo > hi:
            return self.nothing(ptr, "minLength exceeds maxLength")
        return self.lower_string_grammar(node, ptr, lo, hi, node.get("pattern"),
                                         node.get("format"))

    def lower_string_grammar(self, node: dict[str, Any], ptr: str, lo: Any, hi: Any,
                             pattern: Any, fmt: Any) -> Any:
        """Strings for the grammar compiler: lengths, pattern and format all at once (their
        automata are intersected there), as ``x-regex`` placeholders beside the lengths."""
        out: dict[str, Any] = {"type": "string"}
        if lo is not None:
            out["minLength"] = int(lo)
        if hi is not None:
            out["maxLength"] = int(hi)
        regexes = []
        if pattern is not None:
            try:
                body = pattern_regex(pattern, quote=True, max_repeat=None, search=True)
                regexes.append(f'"(?:{body})"')
            except _Refuse as exc:
                self.refuse("pattern", ptr, str(exc))
        not_patterns = []
        for banned in node.get(NOT_PATTERN, ()):  # (from a negation) a superset, excluded
            try:
                wide = pattern_regex(banned, quote=True, max_repeat=None, search=True, wide=True)
            except _Refuse as exc:
                self.refuse("not", ptr, f"cannot exclude the pattern {banned!r}: {exc}")
                continue
            not_patterns.append(self.placeholder(f'"(?:{wide})"')["const"])
        if not_patterns:  # within the spellings the pattern automata use
            canonical = pattern_regex("", quote=True, max_repeat=None, search=True)
            regexes.append(f'"(?:{canonical})"')
            out["x-not-regex"] = not_patterns
        if fmt is not None:
            if fmt in FORMATS:
                regexes.append(f'"(?:{FORMATS[fmt]})"')
            elif fmt in STANDARD_FORMATS:
                self.refuse("format", ptr, f"format {fmt!r} is not supported "
                            f"(supported: {', '.join(sorted(FORMATS))})")
            # Formats the specification does not define are annotations: ignored, as the
            # spec asks and as validators do (e.g. "path", "url", "topic").
        if regexes:
            out["x-regex"] = [self.placeholder(rx)["const"] for rx in regexes]
        return out

    def bounds(self, node: dict[str, Any], ptr: str, integer: bool) -> tuple[Any, Any]:
        """Lower and upper bounds as ``(value, exclusive)``; integers get inclusive ones."""
        found: list[Any] = [None, None]
        for side, plain, strict in ((0, "minimum", "exclusiveMinimum"),
                                    (1, "maximum", "exclusiveMaximum")):
            cands = []
            if plain in node:
                draft4 = node.get(strict) is True
                cands.append((node[plain], draft4))
            if strict in node and not isinstance(node[strict], bool):
                cands.append((node[strict], True))
            for value, excl in cands:
                if abs(value) > _MAX_BOUND:
                    self.refuse(strict if excl and strict in node else plain, ptr,
                                "bound too large")
                    continue
                if integer:  # fold into an inclusive integer bound
                    value = (math.floor(value) + 1 if excl else math.ceil(value)) if side == 0 \
                        else (math.ceil(value) - 1 if excl else math.floor(value))
                    excl = False
                elif value != int(value):
                    self.refuse(strict if excl and strict in node else plain, ptr,
                                "only integer bounds of numbers are supported")
                    continue
                bound = (int(value), excl)
                best = found[side]
                tighter = best is None or (bound[0] > best[0] if side == 0 else bound[0] < best[0])
                if tighter or (bound[0] == best[0] and bound[1]):
                    found[side] = bound
        return found[0], found[1]

    def lower_integer(self, node: dict[str, Any], ptr: str) -> Any:
        if node.get(NON_INTEGER) is True:  # an integer with a non-zero fraction: none
            return self.nothing(ptr, "an integer is required where integers are excluded")
        out = self.lower_integer_plain(node, ptr)
        not_multiple = node.get(NOT_MULTIPLE)
        if not_multiple is None or out is None or "enum" in out:  # (enum: is_valid checked)
            return out
        if not_multiple > _MAX_MODULUS:
            self.refuse("not", ptr, f"excluding multiples of {not_multiple} needs over "
                        f"{_MAX_MODULUS} automaton states")
            return out
        if "const" in out:  # a bare range regex
            out = {"type": "integer", "x-regex": [out["const"]]}
        return {**out, "x-not-multiple": int(not_multiple)}

    def lower_integer_plain(self, node: dict[str, Any], ptr: str) -> Any:
        """Integers: bounds, ``multipleOf`` (a residue automaton or an enumeration)."""
        low, high = self.bounds(node, ptr, integer=True)
        lo, hi = (low[0] if low else None), (high[0] if high else None)
        step = node.get("multipleOf")
        if step is not None and not float(step).is_integer():
            # An integer x is a multiple of a / 10**k iff x * 10**k is divisible by a, i.e.
            # iff x is a multiple of a / gcd(a, 10**k).
            frac = _decimal_step(step)
            if frac is not None:
                step = frac[0] // math.gcd(frac[0], 10 ** frac[1])
        if step is not None and step != 1 and float(step).is_integer() \
                and 1 < step <= _MAX_MODULUS:
            # Multiples of an integer are a regular language (a residue automaton), so no
            # enumeration is needed: intersected with the bounds in the grammar compiler.
            out: dict[str, Any] = {"type": "integer", "x-multiple": int(step)}
            if lo is not None or hi is not None:
                regex = _int_range(lo, hi)
                if regex is None:
                    return self.nothing(ptr, "empty integer range")
                out["x-regex"] = [self.placeholder(regex)["const"]]
            return out
        if step is not None and step != 1:
            if lo is not None and hi is not None and hi - lo <= _MAX_ENUMERATED:
                values = [v for v in range(hi, lo - 1, -1) if self.is_valid(node, v)]
                values.sort(key=lambda v: -len(str(v)))  # longest first: see _longest_first
                return {"enum": values} if values else self.nothing(ptr, "no multiple in range")
            self.refuse("multipleOf", ptr, "supported only for integers between bounds at "
                        f"most {_MAX_ENUMERATED} apart")
        if lo is None and hi is None:
            return {"type": "integer"}
        regex = _int_range(lo, hi)
        return self.placeholder(regex) if regex else self.nothing(ptr, "empty integer range")

    def decimal_bounds(self, node: dict[str, Any], ptr: str) -> Any:
        """Grammar mode: any decimal bounds, as one regex per side (intersected later)."""
        from decimal import Decimal

        from structspec.automata.decimal_bounds import number_at_least, number_at_most

        sides = []
        for plain, strict_kw, side in (("minimum", "exclusiveMinimum", number_at_least),
                                       ("maximum", "exclusiveMaximum", number_at_most)):
            if plain in node:
                sides.append((node[plain], node.get(strict_kw) is True, side, plain))
            if strict_kw in node and not isinstance(node[strict_kw], bool):
                sides.append((node[strict_kw], True, side, strict_kw))
        regexes = []
        for value, strict, side, keyword in sides:
            if abs(value) > _MAX_BOUND:
                self.refuse(keyword, ptr, "bound too large")
                continue
            regexes.append(side(Decimal(str(value)), strict))
        out: dict[str, Any] = {"type": "number"}
        if regexes:
            out["x-regex"] = [self.placeholder(rx)["const"] for rx in regexes]
        return out

    def lower_number(self, node: dict[str, Any], ptr: str) -> Any:
        step = _decimal_step(node["multipleOf"]) if "multipleOf" in node else None
        if "multipleOf" in node and step is None:
            self.refuse("multipleOf", ptr, f"a step of {node['multipleOf']!r} needs over "
                        f"{_MAX_MODULUS} automaton states")
        out = self.decimal_bounds(node, ptr)
        if step is not None:  # exact decimal multiples, written without exponent
            out["x-decimal-multiple"] = list(step)
        if node.get(NON_INTEGER) is True:  # written without exponent: a narrowing
            out["x-regex"] = [*out.get("x-regex", ()), self.placeholder(
                r"-?(?:0|[1-9][0-9]*)\.[0-9]*[1-9][0-9]*")["const"]]
        return out
