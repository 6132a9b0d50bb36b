"""Bundle a schema's references into one document of local JSON-pointer ``$ref``s.

Real schemas reach their parts in many ways: ``#/definitions/x``, ``#name`` (``$anchor``, or a
draft-6/7 ``$id: "#name"``), relative URIs against a nested ``$id`` (``item.json#/x``), and
remote documents. The lowering handles one shape only — ``#/json/pointer`` into the root — so
every reference is resolved once, here, and rewritten to that shape:

- resolution follows the JSON Schema rules of the schema's draft, as implemented by
  ``referencing`` (the library ``jsonschema`` itself uses): base URIs from ``$id``/``id``,
  anchors, percent-encoded pointers;
- remote documents come **only** from the caller's ``registry`` (URI -> schema); nothing is
  ever fetched. A referenced remote document is copied under the root's ``$defs`` and its own
  references are rewritten the same way;
- nested ``$id``s are removed after the rewrite (every reference is now relative to the root,
  and a leftover ``$id`` would move the base of the pointers below it for the validator).

The result is equivalent to the input for validation, and is what both the lowering and the
post-generation validator see.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from structspec.errors import SchemaError, UnsupportedSchemaError

#: Keywords whose values are data, never subschemas: a ``$ref`` key inside them is data.
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})

_ROOT_URI = "https://structspec.invalid/root.json"
_POINTER_SAFE = "/~!$&'()*+,;=:@"


def _escape(token: Any) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def _index(node: Any, pointer: str, out: dict[int, str]) -> None:
    """Map ``id()`` of every object/array under ``node`` to its pointer (first one wins)."""
    if isinstance(node, dict):
        out.setdefault(id(node), pointer)
        for key, value in node.items():
            if key not in DATA_KEYWORDS and isinstance(value, (dict, list)):
                _index(value, f"{pointer}/{_escape(key)}", out)
    elif isinstance(node, list):
        out.setdefault(id(node), pointer)
        for i, value in enumerate(node):
            if isinstance(value, (dict, list)):
                _index(value, f"{pointer}/{i}", out)


class _Bundler:
    def __init__(self, root: dict[str, Any], registry: Mapping[str, Any], spec: Any,
                 lenient: bool) -> None:
        from referencing import Registry

        self.lenient = lenient
        self.spec = spec
        self.root = root
        self.id_keyword = "id" if spec.name.endswith("draft4") or \
            spec.name.endswith("draft3") else "$id"
        resources = [(_ROOT_URI, spec.create_resource(root))]
        self.remote_docs: list[tuple[str, Any]] = []
        for uri, doc in registry.items():
            if not isinstance(uri, str):
                raise SchemaError(f"registry keys must be URIs (strings), not {uri!r}")
            resources.append((uri, spec.create_resource(doc)))
            self.remote_docs.append((uri, doc))
        try:
            self.registry = Registry().with_resources(resources).crawl()
        except Exception as exc:  # malformed ids and the like
            raise SchemaError(f"cannot index the schema's references: {exc}") from exc
        self.locations: dict[int, str] = {}
        _index(root, "", self.locations)
        self.remote_index: dict[int, tuple[int, str]] = {}
        for k, (_, doc) in enumerate(self.remote_docs):
            sub: dict[int, str] = {}
            _index(doc, "", sub)
            for obj, ptr in sub.items():
                self.remote_index.setdefault(obj, (k, ptr))
        self.bundled: dict[int, str] = {}  # remote doc index -> its $defs key
        self.queue: list[int] = []
        self.constants: set[bool] = set()

    def location(self, contents: Any, ref: str, where: str) -> str:
        """The pointer (in the bundled document) of resolved ``contents``."""
        if isinstance(contents, bool):
            self.constants.add(contents)
            return f"/$defs/structspec:{str(contents).lower()}"
        loc = self.locations.get(id(contents))
        if loc is not None:
            return loc
        hit = self.remote_index.get(id(contents))
        if hit is None:
            raise UnsupportedSchemaError("$ref", where, f"{ref!r} resolves to a value that is "
                                         "not a subschema of any known document")
        k, ptr = hit
        if k not in self.bundled:
            self.bundled[k] = f"structspec:remote:{k}"
            self.queue.append(k)
        return f"/$defs/{_escape(self.bundled[k])}{ptr}"

    def rewrite(self, node: Any, resolver: Any, pointer: str, top: bool) -> Any:
        """A copy of ``node`` with local-pointer refs and no nested ids."""
        if isinstance(node, list):
            return [self.rewrite(v, resolver, f"{pointer}/{i}", False)
                    for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        ident = node.get(self.id_keyword)
        if isinstance(ident, str):
            resolver = resolver.in_subresource(self.spec.create_resource(node))
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                out[key] = self.resolve(value, resolver, pointer)
            elif key == self.id_keyword and isinstance(value, str) and not top:
                continue
            elif key in DATA_KEYWORDS:
                out[key] = value
            else:
                out[key] = self.rewrite(value, resolver, f"{pointer}/{_escape(key)}", False)
        return out

    def resolve(self, ref: str, resolver: Any, where: str) -> str:
        from referencing.exceptions import NoSuchResource, Unresolvable, Unretrievable

        try:
            try:
                resolved = resolver.lookup(ref)
            except Unresolvable as exc:  # a missing document surfaces as its cause
                cause = exc.__cause__ or exc.__context__
                if isinstance(cause, (NoSuchResource, Unretrievable)):
                    raise cause from exc
                raise
        except (NoSuchResource, Unretrievable) as exc:
            if self.lenient:  # kept as it is: the lowering drops it with a warning
                return ref
            raise UnsupportedSchemaError(
                "$ref", where, f"{ref!r} names a document that is not in the registry "
                "(remote schemas are never fetched; pass them as registry={uri: schema})",
            ) from exc
        except Unresolvable as exc:
            raise SchemaError(f"$ref {ref!r} does not resolve: {exc}", where) from exc
        return "#" + quote(self.location(resolved.contents, ref, where), safe=_POINTER_SAFE)

    def bundle(self) -> Any:
        resolver = self.registry.resolver(base_uri=_ROOT_URI)
        out = self.rewrite(self.root, resolver, "", True)
        remotes: dict[str, Any] = {}
        while self.queue:
            k = self.queue.pop(0)
            uri, doc = self.remote_docs[k]
            remote_resolver = self.registry.resolver(base_uri=uri)
            remotes[self.bundled[k]] = self.rewrite(doc, remote_resolver, f"{uri}#", False)
        if remotes or self.constants:
            defs = dict(out.get("$defs", {})) if isinstance(out.get("$defs"), dict) else {}
            if "$defs" in out and not isinstance(out["$defs"], dict):
                raise UnsupportedSchemaError("$defs", "", "$defs is not an object")
            defs.update(remotes)
            for value in self.constants:
                defs[f"structspec:{str(value).lower()}"] = value
            out["$defs"] = defs
        return out


def bundle_refs(schema: Any, registry: Mapping[str, Any] | None = None, *,
                lenient: bool = False) -> Any:
    """``schema`` with every ``$ref`` rewritten to a local JSON pointer (see the module
    docstring); ``schema`` itself is not modified. Schemas without ``$ref`` come back as they
    are. ``lenient``: a reference to an unknown document is left as it is (the lowering
    then drops it with a warning) instead of refused.

    Raises:
        SchemaError: a reference does not resolve (missing pointer or anchor).
        UnsupportedSchemaError: a reference names a document outside the schema and
            ``registry`` (keyword ``$ref``, pointer of the referring subschema).
    """
    import json

    from referencing.jsonschema import specification_with

    if not isinstance(schema, dict):
        return schema
    text = json.dumps(schema)
    if '"$ref"' not in text:
        return schema
    dialect = schema.get("$schema", "https://json-schema.org/draft/2020-12/schema")
    try:
        spec = specification_with(dialect)
    except Exception:  # an unknown dialect: the metaschema check has already chosen 2020-12
        spec = specification_with("https://json-schema.org/draft/2020-12/schema")
    return _Bundler(schema, registry or {}, spec, lenient).bundle()


__all__ = ["DATA_KEYWORDS", "bundle_refs"]
