"""JSON Schema -> an exact dialect of small pieces, one subschema at a time (``_Lowering``).

The dialect: ``anyOf``, ``enum``, typed nodes with lengths, items and named properties,
``{"$ref": pointer}`` for recursion, and regex placeholders (``x-regex``, ``x-not-regex``,
``x-multiple``, ...) for the regular pieces; :mod:`.json_grammar` turns it into grammar rules.
Every reachable subschema is walked with a whitelist of keywords; what cannot be enforced
exactly is refused (keyword + JSON pointer) or, leniently, dropped and recorded.
"""

from __future__ import annotations

import json
import secrets
from typing import Any
from urllib.parse import unquote

from structspec.automata.limits import check_time
from structspec.automata.schema_arrays import ArrayLowering
from structspec.automata.schema_keywords import ANNOTATIONS, FAMILY, KNOWN
from structspec.automata.schema_merge import MergeError, merge_all
from structspec.automata.schema_negation import (
    INTERNAL,
    NegationError,
    if_then_else,
    negate,
    public_schema,
)
from structspec.automata.schema_objects import ObjectLowering
from structspec.automata.schema_scalars import ScalarLowering
from structspec.automata.schema_unions import UnionLowering
from structspec.automata.schema_values import (
    PLAIN_NUMBER,
    any_value,
    json_equal,
    json_type,
    number_spellings,
    resolve_pointer,
    string_spellings,
)
from structspec.errors import SchemaError, UnsupportedSchemaError

#: Returned by ``merged`` after a lenient refusal: the ``allOf`` is dropped, not lowered.
_ABSENT: Any = object()


class _Lowering(ScalarLowering, UnionLowering, ObjectLowering, ArrayLowering):
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
        self.known = frozenset((KNOWN | self.validator_keywords) - ANNOTATIONS)
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
            return any_value()
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
        kws &= KNOWN | self.validator_keywords
        for k in sorted(kws - KNOWN):
            self.refuse(k, ptr, "keyword of this draft not supported")
        kws &= KNOWN
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
            return any_value()
        target = unquote(ref[1:])  # a pointer: schema_refs rewrote every other kind
        if target in self._stack:  # recursion: one rule, referenced
            self.recursive.add(target)
            return {"$ref": target}
        if (target, top) in self._memo:
            return self._memo[target, top]
        try:
            sub = resolve_pointer(self.root, target)
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


    # -- oneOf disjointness


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
                node = resolve_pointer(self.root, unquote(ref[1:]))
            except (KeyError, IndexError, ValueError, TypeError):
                return node
        return node


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
            if not kws & set(FAMILY) and not exclude:
                return any_value()
            types = ["null", "boolean", "number", "string", "array", "object"]
        else:  # no type: generate the types whose keywords are present (narrowing)
            types = sorted({FAMILY[k] for k in kws if k in FAMILY})
            if not types and not exclude:
                return any_value()
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
        values = [v for v in exclude if json_type(v) == family]
        if t == "integer":
            values = [v for v in values if float(v).is_integer()]
        if not values:
            return lowered
        if "enum" in lowered:
            kept = [v for v in lowered["enum"] if not any(json_equal(v, x) for x in values)]
            return {"enum": kept} if kept else self.nothing(ptr, "every value is excluded")
        if t == "null":
            return self.nothing(ptr, "null is excluded")
        if t == "boolean":
            kept = [b for b in (True, False) if not any(json_equal(b, x) for x in values)]
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
            regex = "|".join(string_spellings(v) for v in values)
        else:
            regex = "|".join(number_spellings(v, t == "integer") for v in values)
            if t == "number":  # the spellings are exponent-free: so are the outputs here
                out["x-regex"] = [*out.get("x-regex", ()),
                                  self.placeholder(PLAIN_NUMBER)["const"]]
        out["x-not-regex"] = [*out.get("x-not-regex", ()), self.placeholder(regex)["const"]]
        return out


