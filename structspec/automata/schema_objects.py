"""Objects for the lowering (``ObjectLowering``, a mixin of ``_Lowering``): named properties,
extra keys, ``patternProperties``, ``propertyNames`` and the dependency keywords.

Two shapes come out:

- **named** (``properties``/``required`` name keys): the named properties in schema order
  (generation order; optional ones may be absent), then, in spec-faithful mode, extra keys
  (``x-extra``) whose key language excludes the named ones;
- **free** (no named key): ``x-free``, members in any order. Keys not tracked by name are
  split into *regions* by the patterns they match (a key matching patterns *M* and no other
  takes the schemas of *M*, or ``additionalProperties`` when *M* is empty; each region's key
  language is the intersection of *M*'s pattern automata minus the others'), intersected with
  the ``propertyNames`` language. Keys that ``dependentRequired`` mentions are *tracked*: the
  grammar carries the set of tracked keys seen so far (2^k rules for k keys, bounded by
  ``MAX_TRACKED_KEYS``), so "if *t* is present, so are its dependencies" is checked in any
  member order, exactly.

``dependentSchemas`` (and draft-7 ``dependencies`` schemas) are split first, exactly: for each
trigger *t*, "no key *t*" (``propertyNames: {not: {const: t}}``) or "key *t* and its schema".
"""

from __future__ import annotations

import re
from typing import Any

from structspec.automata.schema_keywords import FAMILY
from structspec.automata.schema_negation import SOME_EXTRA
from structspec.automata.schema_regex import _Refuse, pattern_regex
from structspec.automata.schema_values import escape_pointer, string_spellings

#: Keys ``dependentRequired`` may track on objects with arbitrary keys: the grammar has a rule
#: per subset of them.
MAX_TRACKED_KEYS = 8
#: Patterns of ``patternProperties`` on one object: their keys are split into 2^n regions.
MAX_PATTERNS = 4
#: ``dependentSchemas`` triggers split into cases (2^n branches).
MAX_DEPENDENT_SCHEMAS = 4

_MISSING: Any = object()


def key_language_ok(lowered: Any) -> bool:
    """Whether a lowered string schema is one the grammar can turn into a key automaton:
    strings (lengths, regexes, excluded values), string ``enum``s, regex placeholders and
    ``anyOf`` of those."""
    if not isinstance(lowered, dict):
        return False
    if "anyOf" in lowered:
        return all(key_language_ok(b) for b in lowered["anyOf"])
    if "enum" in lowered:
        return True  # non-strings are dropped: keys are strings
    if "const" in lowered:
        return isinstance(lowered["const"], str)
    return lowered.get("type") == "string" and not lowered.keys() - {
        "type", "minLength", "maxLength", "x-regex", "x-not-regex"}


class ObjectLowering:
    """The object half of ``_Lowering`` (see the module docstring)."""

    # Provided by _Lowering.
    extra_properties: bool
    validator_keywords: frozenset[str]
    placeholders: dict[str, str]
    lower: Any
    refuse: Any
    nothing: Any
    placeholder: Any
    is_valid: Any

    def lower_object(self, node: dict[str, Any], ptr: str) -> Any:
        if SOME_EXTRA in node:
            return self.lower_witness(node, ptr)
        dep_schemas = dict(node.get("dependentSchemas", {}))
        for key, value in node.get("dependencies", {}).items():  # drafts 4-7
            if not isinstance(value, list):
                dep_schemas[key] = value
        effective = {t: s for t, s in dep_schemas.items() if s not in (True, {})}
        # (unevaluatedProperties sees what dependentSchemas evaluates: not split then)
        if effective and len(effective) <= MAX_DEPENDENT_SCHEMAS \
                and "unevaluatedProperties" not in node:
            return self.split_dependent_schemas(node, ptr, effective)
        props = node.get("properties", {})
        required = list(dict.fromkeys(node.get("required", [])))
        extra = node.get("additionalProperties", _MISSING)
        extra_ptr = f"{ptr}/additionalProperties"
        if extra is _MISSING and "unevaluatedProperties" in node:
            extra, extra_ptr = node["unevaluatedProperties"], f"{ptr}/unevaluatedProperties"
        patterns = node.get("patternProperties", {})
        dep_required = dict(node.get("dependentRequired", {}))
        for key, value in node.get("dependencies", {}).items():
            if isinstance(value, list):
                dep_required[key] = value

        # Every generated property, with the schema and pointer its value comes from.
        sources: dict[str, tuple[Any, str]] = {}
        for name, sub in props.items():
            # A pattern that also matches the name applies too: the value takes both.
            hits = [patterns[p] for p in patterns
                    if patterns[p] not in (True, {}) and re.search(p, name)]
            sources[name] = ({"allOf": [sub, *hits]} if hits else sub,
                             f"{ptr}/properties/{escape_pointer(name)}")
        for name in required:
            if name in sources:
                continue
            value = self.key_value(name, patterns, extra, extra_ptr, ptr)
            if value is None:
                return self.nothing(ptr, f"required {name!r} is not an allowed property")
            sources[name] = value
        if not sources:
            return self.lower_free_object(node, ptr, extra, extra_ptr, patterns, dep_required,
                                          dep_schemas)

        req = set(required)
        grown = True
        while grown:  # a required trigger's dependencies are required: named here too
            grown = False
            for trigger, deps in dep_required.items():
                if trigger not in req:
                    continue
                for name in deps:
                    if name not in sources:
                        value = self.key_value(name, patterns, extra, extra_ptr, ptr)
                        if value is None:
                            return self.nothing(ptr, f"required {trigger!r} needs {name!r}, "
                                                "which is not an allowed property")
                        sources[name] = value
                    if name not in req:
                        req.add(name)
                        grown = True
        if "propertyNames" in node:
            for name in list(sources):
                if not self.is_valid(node["propertyNames"], name):
                    if name in req:
                        return self.nothing(ptr, f"required {name!r} fails propertyNames")
                    sources.pop(name)
        changed = True
        while changed:  # an optional trigger's dependencies become required (narrowing)
            changed = False
            for trigger, deps in dep_required.items():
                if trigger not in sources:
                    continue
                if any(d not in sources for d in deps):
                    if trigger in req:
                        self.refuse("dependentRequired", ptr, f"{trigger!r} needs properties "
                                    "that are not generated")
                    else:
                        sources.pop(trigger)
                        changed = True
                elif not set(deps) <= req:
                    req |= set(deps)
                    changed = True
        for trigger, sub in dep_schemas.items():  # more triggers than are split
            if trigger in sources and sub not in (True, {}):
                if trigger in req:
                    self.refuse("dependentSchemas", ptr, "not enforced")
                else:
                    sources.pop(trigger)

        lowered: dict[str, Any] = {}
        for name, (sub, sub_ptr) in sources.items():
            one = self.lower(sub, sub_ptr)
            if one is None:
                if name in req:
                    return None
                continue
            lowered[name] = one
        required_now = [n for n in lowered if n in req]
        optional = [n for n in lowered if n not in req]
        max_p, min_p = node.get("maxProperties"), int(node.get("minProperties", 0))
        if max_p is not None:
            if len(required_now) > max_p:
                return self.nothing(ptr, "more required properties than maxProperties")
            for name in optional[int(max_p) - len(required_now):]:
                del lowered[name]  # narrowing: fewer optional properties
            optional = optional[: int(max_p) - len(required_now)]
        if min_p > len(required_now):
            need = min_p - len(required_now)
            if need > len(optional):
                self.refuse("minProperties", ptr, "exceeds the properties the schema names")
            req |= set(optional[:need])  # narrowing: some optional ones become required
        out = {"type": "object", "properties": lowered,
               "required": [n for n in lowered if n in req]}
        extras = self.lower_extras(node, extra, extra_ptr, ptr)
        if extras is not None:
            out["x-extra"] = extras
            # Every name the schema mentions is settled by its own rules (possibly "never",
            # like a `false` property), so no extra key may spell one of them.
            # Nor a dependentRequired trigger: its dependencies are settled here, by name.
            out["x-exclude"] = list(dict.fromkeys([*props, *required, *lowered,
                                                   *dep_required]))
        return out

    def lower_witness(self, node: dict[str, Any], ptr: str) -> Any:
        """An object with a key beyond a (negated) ``additionalProperties``' others whose
        value is outside its schema (``SOME_EXTRA``, from :mod:`.schema_negation`): exact on
        closed objects — ``additionalProperties: false``, no patterns — as an ``anyOf`` over
        the named properties that can be that key; refused on others."""
        witness = node[SOME_EXTRA]
        rest = {k: v for k, v in node.items() if k != SOME_EXTRA}
        props = rest.get("properties", {})
        if rest.get("additionalProperties", True) is not False or rest.get("patternProperties"):
            self.refuse("additionalProperties", ptr, "its complement (some key beyond the "
                        "others with a value outside its schema) is exact only beside a closed "
                        "object")
            return self.lower_object(rest, ptr)
        branches = []
        for name, sub in props.items():
            if name in witness["exclude"] or any(re.search(q, name)
                                                 for q in witness["patterns"]):
                continue
            branches.append({**rest, "type": "object",
                             "required": list(dict.fromkeys([*rest.get("required", []), name])),
                             "properties": {**props, name: {"allOf": [sub, witness["value"]]}}})
        if not branches:
            return self.nothing(ptr, "no named property can be the key beyond the others")
        return self.lower({"anyOf": branches}, ptr)

    # -- keys and their values

    def key_value(self, name: str, patterns: dict[str, Any], extra: Any, extra_ptr: str,
                  ptr: str) -> tuple[Any, str] | None:
        """The schema (and its pointer) of the value of a key the schema does not list in
        ``properties``: every matching pattern's, else ``additionalProperties``'s; ``None``
        when the key is not allowed at all."""
        hits = [p for p in patterns if re.search(p, name)]
        if hits:
            schemas = [patterns[p] for p in hits]
            return (schemas[0] if len(schemas) == 1 else {"allOf": schemas},
                    f"{ptr}/patternProperties/{escape_pointer(hits[0])}")
        if extra is False:
            return None
        return (True if extra is _MISSING else extra), extra_ptr

    def key_names(self, node: dict[str, Any], ptr: str) -> Any:
        """The ``propertyNames`` language as a lowered string schema (``True``: any key;
        ``None``: no key at all)."""
        names = node.get("propertyNames", True)
        if names in (True, {}):
            return True
        names_ptr = f"{ptr}/propertyNames"
        if names is False:
            return None
        lowered = self.lower({"allOf": [{"type": "string"}, names]}, names_ptr)
        if lowered is not None and not key_language_ok(lowered):
            self.refuse("propertyNames", names_ptr, "only string schemas (lengths, pattern, "
                        "format, enum, const, not, anyOf) can restrict keys")
            return True
        return lowered

    def key_regions(self, patterns: dict[str, Any], extra: Any, extra_ptr: str,
                    ptr: str) -> list[dict[str, Any]] | None:
        """Keys not named, split by the patterns they match: ``[{"and": [markers], "minus":
        [markers], "value": lowered}]`` (``value`` ``True``: any value); ``None`` after a
        lenient refusal (no such keys are generated then)."""
        if len(patterns) > MAX_PATTERNS:
            self.refuse("patternProperties", ptr, f"more than {MAX_PATTERNS} patterns on one "
                        "object with arbitrary keys")
            return None
        # A key in a region matches its patterns (a subset of each: the pattern's automaton)
        # and none of the others (minus a superset of each: `wide`, as the validator's
        # Python `re` may read \d, `.` or `$` more widely than the automaton).
        markers, wide_markers = [], []
        for pattern in patterns:
            try:
                body = pattern_regex(pattern, quote=True, max_repeat=None, search=True)
                wide = pattern_regex(pattern, quote=True, max_repeat=None, search=True,
                                     wide=True)
            except _Refuse as exc:
                self.refuse("patternProperties",
                            f"{ptr}/patternProperties/{escape_pointer(pattern)}", str(exc))
                return None
            markers.append(self.placeholder(f'"(?:{body})"')["const"])
            wide_markers.append(self.placeholder(f'"(?:{wide})"')["const"])
        names = list(patterns)
        regions = []
        for mask in range(2 ** len(names)):
            hit = [i for i in range(len(names)) if mask >> i & 1]
            if hit:
                schemas = [patterns[names[i]] for i in hit]
                schema: Any = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
                sub_ptr = f"{ptr}/patternProperties/{escape_pointer(names[hit[0]])}"
            elif extra is False:
                continue
            else:
                schema, sub_ptr = (True if extra is _MISSING else extra), extra_ptr
            value = True if schema in (True, {}) else self.lower(schema, sub_ptr)
            if value is None:
                continue
            regions.append({"and": [markers[i] for i in hit],
                            "minus": [wide_markers[i] for i in range(len(names))
                                      if i not in hit],
                            "value": value})
        return regions

    def lower_extras(self, node: dict[str, Any], extra: Any, extra_ptr: str,
                     node_ptr: str = "") -> Any:
        """The members beyond the named ones (spec-faithful mode): ``{"x-regions": [...],
        "names": ...}`` (see :meth:`key_regions`, :meth:`key_names`), or ``None`` where they
        are not generated: not asked for, forbidden, or constrained by keywords that also
        count them (generating none of them is then a narrowing)."""
        if not self.extra_properties:
            return None
        # (dependentRequired: extra keys never spell a trigger, see lower_object)
        counted = ("minProperties", "maxProperties", "dependentSchemas")
        if any(k in node for k in counted) or any(
                not isinstance(v, list) for v in node.get("dependencies", {}).values()):
            return None
        names = self.key_names(node, node_ptr)
        if names is None:
            return None
        patterns = node.get("patternProperties", {})
        if not patterns and names is True:  # the plain form: one value schema
            if extra is False:
                return None
            if extra is _MISSING or extra is True:
                return True
            return self.lower(extra, extra_ptr)
        regions = self.key_regions(patterns, extra, extra_ptr, node_ptr)
        if not regions:
            return None
        return {"x-regions": regions, "names": names}

    def lower_free_object(self, node: dict[str, Any], ptr: str, extra: Any, extra_ptr: str,
                          patterns: dict[str, Any], dep_required: dict[str, list[str]],
                          dep_schemas: dict[str, Any]) -> Any:
        """An object without named properties: members in any order, keys split into
        regions, ``dependentRequired`` keys tracked (see the module docstring)."""
        min_p, max_p = int(node.get("minProperties", 0)), node.get("maxProperties")
        if max_p == 0:
            if min_p > 0:
                return self.nothing(ptr, "no property is allowed but minProperties > 0")
            return {"type": "object", "maxProperties": 0}
        names = self.key_names(node, ptr)
        regions = [] if names is None else self.key_regions(patterns, extra, extra_ptr, ptr)
        if regions is None:
            regions = []
        if any(sub not in (True, {}) for sub in dep_schemas.values()):  # too many to split
            self.refuse("dependentSchemas" if "dependentSchemas" in node else "dependencies",
                        ptr, f"more than {MAX_DEPENDENT_SCHEMAS} triggers or beside "
                        "unevaluatedProperties")
        # Keys named by dependentRequired: their presence is tracked.
        tracked_names = list(dict.fromkeys(
            [k for t, deps in dep_required.items() if deps for k in (t, *deps)]))
        if len(tracked_names) > MAX_TRACKED_KEYS:
            keyword = "dependentRequired" if "dependentRequired" in node else "dependencies"
            self.refuse(keyword, ptr, f"more than {MAX_TRACKED_KEYS} keys named by "
                        "dependencies on an object with arbitrary keys")
            tracked_names = []
        tracked: dict[str, Any] = {}
        for name in tracked_names:
            source = None if names is None else self.key_value(name, patterns, extra,
                                                               extra_ptr, ptr)
            if source is None or not self.is_valid(node.get("propertyNames", True), name):
                continue
            value = True if source[0] in (True, {}) else self.lower(*source)
            if value is not None:
                tracked[name] = value
        needs = {t: list(deps) for t, deps in dep_required.items() if deps and t in tracked}
        changed = True
        while changed:  # a trigger whose dependencies cannot all appear cannot appear
            changed = False
            for t, deps in list(needs.items()):
                if any(d not in tracked for d in deps):
                    tracked.pop(t, None)
                    needs.pop(t)
                    changed = True
        if tracked and max_p is not None:
            self.refuse("maxProperties", ptr, "beside dependencies on an object with "
                        "arbitrary keys")
            max_p = None
        if min_p > 1:
            self.refuse("minProperties", ptr, "generated keys may repeat, so only "
                        "minProperties <= 1 is exact")
            min_p = 1
        if not regions and not tracked:
            if min_p > 0:
                return self.nothing(ptr, "no property is allowed but minProperties > 0")
            return {"type": "object", "maxProperties": 0}
        if tracked_names:  # other keys never spell a tracked one, in any spelling
            marker = self.placeholder("|".join(string_spellings(n) for n in tracked_names))
            for region in regions:
                region["minus"] = [*region["minus"], marker["const"]]
        # A pattern's automaton spells the keys it matches one way (raw characters), so a
        # key escaped otherwise would land in the wrong region: with patterns, keys are
        # written without escapes (a narrowing).
        free: dict[str, Any] = {"regions": regions, "names": names, "escapes": not patterns,
                                "tracked": [[n, v] for n, v in tracked.items()],
                                "needs": needs, "minProperties": min_p}
        if max_p is not None:
            free["maxProperties"] = int(max_p)
        return {"type": "object", "x-free": free}

    def split_dependent_schemas(self, node: dict[str, Any], ptr: str,
                                deps: dict[str, Any]) -> Any:
        """``dependentSchemas`` as cases, exactly: for each trigger *t*, "no key *t*" or
        "key *t*, and the object satisfies *t*'s schema" (2^n branches for n triggers)."""
        rest = {k: v for k, v in node.items() if FAMILY.get(k) == "object"
                and k not in ("dependentSchemas", "dependencies")}
        kept = {k: v for k, v in node.get("dependencies", {}).items() if isinstance(v, list)}
        if kept:
            rest["dependencies"] = kept
        parts: list[Any] = [{**rest, "type": "object"}]
        for trigger, sub in deps.items():
            # (spelled so that the draft's validator knows it: draft 4 has no propertyNames)
            absent: dict[str, Any] = {"propertyNames": {"not": {"enum": [trigger]}}} \
                if "propertyNames" in self.validator_keywords \
                else {"properties": {trigger: {"not": {}}}}
            if sub is False:
                parts.append(absent)
                continue
            present = {"allOf": [{"required": [trigger]}, sub]}
            parts.append({"anyOf": [absent, present]})
        return self.lower({"allOf": parts}, ptr)
