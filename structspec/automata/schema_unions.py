"""``anyOf``/``oneOf`` for the lowering (``UnionLowering``, a mixin of ``_Lowering``).

``anyOf`` lowers each branch (intersected with its siblings). ``oneOf`` is exact in two ways:
branches that are provably disjoint (different types, different ``const``/``enum`` values,
a required property with different ``const`` values) are an ``anyOf`` as they are; others
become "branch *i* and the exact complement of every other branch"
(:func:`.schema_negation.exactly_one`), up to ``MAX_ONEOF_NEGATED`` branches. Anything else
is refused.
"""

from __future__ import annotations

from typing import Any

from structspec.automata.schema_keywords import (
    ANNOTATIONS,
    FAMILY,
    MAX_ENUMERATED,
    MAX_ONEOF_NEGATED,
)
from structspec.automata.schema_merge import MergeError, merge_all
from structspec.automata.schema_negation import NegationError, exactly_one
from structspec.automata.schema_values import json_equal, json_type


class UnionLowering:
    """``anyOf``/``oneOf`` and the cheap disjointness proofs ``oneOf`` needs."""

    # Provided by _Lowering.
    known: frozenset[str]
    lower: Any
    refuse: Any
    nothing: Any
    deref: Any
    is_valid: Any

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
        except NegationError as exc:
            if not common:
                raise
            first = exc
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
            object_keys = {k for k, fam in FAMILY.items() if fam == "object"}
            if keys - object_keys and node.get("type") != "object":
                return branches
            out.append(node if node.get("type") == "object" else {**node, "type": "object"})
        return out


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
            return {json_type(v) for v in values}
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
                        json_equal(x, y) for x in va for y in vb):
                    continue
                # a branch of listed values none of which the other accepts (the validator
                # decides each value: exact)
                if va is not None and len(va) <= MAX_ENUMERATED and not any(
                        self.is_valid(branches[j], x) for x in va):
                    continue
                if vb is not None and len(vb) <= MAX_ENUMERATED and not any(
                        self.is_valid(branches[i], x) for x in vb):
                    continue
                if any(not any(json_equal(x, y) for x in ga[k] for y in gb[k])
                       for k in ga.keys() & gb.keys()):
                    continue
                return False
        return True
