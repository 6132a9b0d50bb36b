"""The keyword tables of the JSON Schema lowering: which keywords are annotations, which
belong to one JSON type, which the lowering knows, and the size caps it enforces.

Shared by the lowering's mixins (:mod:`.schema_lowering`, :mod:`.schema_scalars`,
:mod:`.schema_unions`, :mod:`.schema_objects`), so none of them imports another for a table.
"""

from __future__ import annotations

from structspec.automata.schema_negation import INTERNAL

#: Integers between bounds at most this far apart may be enumerated (``multipleOf``), and
#: ``oneOf`` branches with at most this many values are checked value by value.
MAX_ENUMERATED = 1024
MAX_MODULUS = 100_000  # integer multipleOf up to this is a residue automaton
MAX_BOUND = 10**30  # numeric bounds beyond this magnitude are refused


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


#: Keywords with no effect on validation: allowed anywhere and ignored.
ANNOTATIONS = frozenset({
    "title", "description", "examples", "default", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$schema", "$anchor",
    "$dynamicAnchor", "$recursiveAnchor", "$vocabulary", "$defs", "definitions",
    "discriminator",  # OpenAPI/pydantic; its oneOf is checked for disjointness on its own
})


#: Type-specific keywords: they constrain only instances of one JSON type.
FAMILY = {
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
KNOWN = frozenset(FAMILY) | {
    "type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
    "$dynamicRef", "$recursiveRef", "$id",
} | INTERNAL  # (the internal keywords of negations count: e.g. merged beside an anyOf)


#: ``oneOf`` branches that are not provably disjoint are made exact by negating each other
#: branch; beyond this many the grammar grows too much.
MAX_ONEOF_NEGATED = 8
