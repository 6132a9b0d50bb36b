"""The JSON-Schema-Test-Suite ratchet (draft 2020-12): soundness always, coverage never worse.

For every test group of ``../shared/data/json-schema-test-suite/tests/draft2020-12/*.json``
(``optional/`` is left out) the schema is compiled with :func:`compile_json_schema` over a
byte-level toy vocabulary (id 0 is EOS, id ``b + 1`` is byte ``b``), once per group. Each
test instance is serialised compactly (``separators=(",", ":")``, ``ensure_ascii=False``,
object keys in the schema's ``properties`` order first — the order structspec generates —
then the rest in the data's order) and walked byte by byte: at every step the byte must be in
``allowed(state)`` and ``advance`` must take it, and at the end EOS must be allowed. Outcomes,
best to worst:

- ``pass``: accepted exactly when the suite says valid;
- ``refused``: the compiler declined the schema (``UnsupportedSchemaError``, ``SchemaError``,
  ``ResourceLimitError``) — an honest refusal;
- ``narrowing``: a valid instance refused (structspec narrows by design: named properties in
  schema order, short escapes, ...; see ``docs/json_schema.md``);
- ``crash``: any other exception, or a mask that disagrees with ``advance``;
- ``unsound``: an invalid instance accepted — always a failure, whatever the baseline says.

The committed baseline ``tests/data/json_schema_suite_baseline.json`` maps
``"file::group description::test description"`` to an outcome. A test fails on a regression
(an outcome worse than its baseline) and on any ``unsound``; improvements and per-file pass
rates are printed. Rewrite the baseline after an improvement with
``STRUCTSPEC_UPDATE_BASELINE=1 pytest tests/test_json_schema_suite.py``.

Remote references (``refRemote.json``) name documents the suite serves at
``localhost:1234``: here they come from the suite's ``remotes/`` folder passed as the
``registry`` (structspec never fetches); without a registry they must be refused.
There is no per-compile timeout beyond the default ``Limits`` (10 s per compilation); the
whole suite runs in a few seconds.
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from structspec.automata import compile_json_schema
from structspec.errors import ResourceLimitError, SchemaError, UnsupportedSchemaError
from structspec.vocab import Vocabulary

#: The texts these tests drive through the constraint are compact JSON (``{"a":1}``), as the
#: suites write their instances: compile in that policy, not the default (spaced).
compile_json_schema = functools.partial(compile_json_schema, whitespace="compact")

SUITE = (Path(__file__).resolve().parents[1].parent / "shared" / "data"
         / "json-schema-test-suite" / "tests" / "draft2020-12")
REMOTES = SUITE.parents[1] / "remotes"
BASELINE = Path(__file__).resolve().parent / "data" / "json_schema_suite_baseline.json"
UPDATE = os.environ.get("STRUCTSPEC_UPDATE_BASELINE", "").lower() in {"1", "true", "yes"}

RANK = {"pass": 4, "refused": 3, "narrowing": 2, "crash": 1, "unsound": 0}
REFUSALS = (UnsupportedSchemaError, SchemaError, ResourceLimitError)
EOS = 0


def byte_vocab() -> Vocabulary:
    """EOS (id 0), then one token per byte: ``conftest.make_byte_vocab([])``."""
    return Vocabulary.from_tokens([b""] + [bytes([b]) for b in range(256)], eos_token_ids=[EOS])


# -- serialisation in schema order ---------------------------------------------------------------


def _deref(schema: Any, root: Any) -> Any:
    """Follow a local ``$ref`` (``#/...``) once; anything else is returned unchanged."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if not isinstance(ref, str) or not ref.startswith("#"):
        return schema
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return {}
    return node


def _branches(schema: Any, root: Any, depth: int = 0) -> list[dict[str, Any]]:
    """``schema`` and the subschemas that apply at the same place (allOf, anyOf, $ref, ...)."""
    if not isinstance(schema, dict) or depth > 8:
        return []
    out = [schema]
    for kw in ("allOf", "anyOf", "oneOf"):
        if isinstance(schema.get(kw), list):
            for sub in schema[kw]:
                out += _branches(sub, root, depth + 1)
    for kw in ("then", "else"):
        if kw in schema:
            out += _branches(schema[kw], root, depth + 1)
    target = _deref(schema, root)
    if target is not schema:
        out += _branches(target, root, depth + 1)
    return out


def _ordered(value: Any, schema: Any, root: Any) -> Any:
    """``value`` with object keys in schema ``properties`` order first, then the data's order."""
    branches = _branches(schema, root)
    if isinstance(value, dict):
        props: dict[str, Any] = {}
        for b in branches:
            if isinstance(b.get("properties"), dict):
                for k, sub in b["properties"].items():
                    props.setdefault(k, sub)
        extra = next((b["additionalProperties"] for b in branches
                      if "additionalProperties" in b), {})
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: _ordered(value[k], props.get(k, extra), root) for k in keys}
    if isinstance(value, list):
        prefix = next((b["prefixItems"] for b in branches
                       if isinstance(b.get("prefixItems"), list)), [])
        items = next((b["items"] for b in branches if "items" in b), {})
        return [_ordered(v, prefix[i] if i < len(prefix) else items, root)
                for i, v in enumerate(value)]
    return value


def serialize(value: Any, schema: Any) -> bytes:
    """The instance as structspec would write it: compact JSON, keys in schema order."""
    ordered = _ordered(value, schema, schema)
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()


# -- running the suite -----------------------------------------------------------------------------


def _walk(constraint: Any, data: bytes) -> bool:
    """Whether ``data`` then EOS passes every mask and every ``advance``.

    Raises:
        AssertionError: the mask and ``advance`` disagree (a crash outcome).
    """
    state = constraint.initial
    for i, b in enumerate(data):
        token = b + 1
        in_mask = token in constraint.allowed(state)
        nxt = constraint.advance(state, token)
        if in_mask != (nxt is not None):
            raise AssertionError(f"byte {i}: mask says {in_mask}, advance says {nxt is not None}")
        if nxt is None:
            return False
        state = nxt
    eos = EOS in constraint.allowed(state)
    if eos != bool(constraint.is_accepting(state)):
        raise AssertionError(f"end: EOS in mask {eos}, accepting {not eos}")
    return eos


def _keys(file: str, groups: list[dict[str, Any]]) -> list[list[str]]:
    """Unique ``file::group::test`` keys (a ``#n`` suffix tells repeated descriptions apart)."""
    seen: Counter[str] = Counter()
    out = []
    for group in groups:
        row = []
        for test in group["tests"]:
            key = f"{file}::{group['description']}::{test['description']}"
            seen[key] += 1
            row.append(key if seen[key] == 1 else f"{key} #{seen[key]}")
        out.append(row)
    return out


def remote_registry(remotes: Path = REMOTES) -> dict[str, Any]:
    """The suite's remote documents, by the URI the suite serves them at."""
    if not remotes.is_dir():
        return {}
    return {f"http://localhost:1234/{p.relative_to(remotes).as_posix()}":
            json.loads(p.read_text(encoding="utf-8")) for p in sorted(remotes.rglob("*.json"))}


def run_suite(suite: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Outcome of every test of ``suite`` (draft folder), and a detail line per non-pass."""
    vocab = byte_vocab()
    registry = remote_registry()
    outcomes: dict[str, str] = {}
    details: dict[str, str] = {}
    for path in sorted(suite.glob("*.json")):
        groups = json.loads(path.read_text(encoding="utf-8"))
        for group, keys in zip(groups, _keys(path.name, groups)):
            try:
                constraint = compile_json_schema(group["schema"], vocab, extra_properties=True,
                                                 max_array_items=None, registry=registry)
                problem = None
            except REFUSALS as exc:
                constraint, problem = None, ("refused", f"{type(exc).__name__}: {exc}")
            except Exception as exc:
                constraint, problem = None, ("crash", f"compile: {type(exc).__name__}: {exc}")
            for test, key in zip(group["tests"], keys):
                if problem is not None:
                    outcomes[key], details[key] = problem
                    continue
                try:
                    accepted = _walk(constraint, serialize(test["data"], group["schema"]))
                except Exception as exc:
                    outcomes[key], details[key] = "crash", f"walk: {type(exc).__name__}: {exc}"
                    continue
                if accepted == test["valid"]:
                    outcomes[key] = "pass"
                else:
                    outcomes[key] = "narrowing" if test["valid"] else "unsound"
                    details[key] = "instance " + json.dumps(test["data"])[:200]
    return outcomes, details


@pytest.fixture(scope="module")
def suite_results() -> tuple[dict[str, str], dict[str, str]]:
    if not SUITE.is_dir():
        pytest.skip(f"JSON-Schema-Test-Suite not found at {SUITE} (see ../shared/data/README.md)")
    return run_suite(SUITE)


def _per_file(outcomes: dict[str, str]) -> str:
    by_file: dict[str, Counter[str]] = {}
    for key, outcome in outcomes.items():
        by_file.setdefault(key.split("::", 1)[0], Counter())[outcome] += 1
    total = Counter(outcomes.values())
    lines = ["JSON-Schema-Test-Suite draft2020-12: "
             + ", ".join(f"{o} {total[o]}" for o in RANK if total[o])
             + f" of {len(outcomes)} ({100 * total['pass'] / max(len(outcomes), 1):.1f}% pass)"]
    for name, c in sorted(by_file.items()):
        n = sum(c.values())
        rest = ", ".join(f"{o} {c[o]}" for o in RANK if o != "pass" and c[o])
        lines.append(f"  {name:<32} {c['pass']:>3}/{n:<3} pass" + (f"  ({rest})" if rest else ""))
    return "\n".join(lines)


def test_no_invalid_instance_accepted(suite_results) -> None:
    """Soundness, whatever the baseline: no invalid instance of the suite is accepted."""
    outcomes, details = suite_results
    unsound = sorted(k for k, o in outcomes.items() if o == "unsound")
    assert not unsound, "invalid instances accepted:\n" + "\n".join(
        f"  {k}: {details.get(k, '')}" for k in unsound)


def test_remote_refs_without_registry_are_refused(suite_results) -> None:
    """``refRemote.json`` without a registry: refused, never fetched."""
    groups = json.loads((SUITE / "refRemote.json").read_text(encoding="utf-8"))
    vocab = byte_vocab()
    for group in groups:
        if "localhost:1234" not in json.dumps(group["schema"]):
            continue
        with pytest.raises(UnsupportedSchemaError, match="registry"):
            compile_json_schema(group["schema"], vocab, extra_properties=True,
                                max_array_items=None)


def test_remote_refs_from_the_registry(suite_results) -> None:
    """With the suite's remotes as the registry, remote refs resolve (most pass)."""
    outcomes, _ = suite_results
    remote = {k: o for k, o in outcomes.items() if k.startswith("refRemote.json::")}
    assert remote, "refRemote.json has no tests"
    assert sum(o == "pass" for o in remote.values()) >= len(remote) // 2, remote


def test_ratchet_against_baseline(suite_results, capsys) -> None:
    """No test does worse than in the committed baseline; improvements are reported."""
    outcomes, details = suite_results
    if UPDATE or not BASELINE.is_file():
        BASELINE.parent.mkdir(parents=True, exist_ok=True)
        BASELINE.write_text(json.dumps(dict(sorted(outcomes.items())), indent=1,
                                       ensure_ascii=False) + "\n", encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"no baseline at {BASELINE}; wrote one — review and commit it")
    baseline: dict[str, str] = json.loads(BASELINE.read_text(encoding="utf-8"))
    regressions = sorted(k for k, o in outcomes.items()
                         if k in baseline and RANK[o] < RANK[baseline[k]])
    improvements = sorted(k for k, o in outcomes.items()
                          if k in baseline and RANK[o] > RANK[baseline[k]])
    new = sorted(set(outcomes) - set(baseline))
    gone = sorted(set(baseline) - set(outcomes))
    with capsys.disabled():
        print("\n" + _per_file(outcomes))
        if improvements:
            print(f"{len(improvements)} improvement(s) over the baseline (rerun with "
                  "STRUCTSPEC_UPDATE_BASELINE=1 to lock them in):")
            for k in improvements:
                print(f"  {baseline[k]} -> {outcomes[k]}: {k}")
        if new or gone:
            print(f"baseline out of date: {len(new)} new test(s), {len(gone)} gone")
    assert not regressions, (
        f"{len(regressions)} regression(s) against {BASELINE.name}:\n" + "\n".join(
            f"  {baseline[k]} -> {outcomes[k]}: {k}  [{details.get(k, '')[:160]}]"
            for k in regressions))


def test_serialize_puts_schema_properties_first() -> None:
    """The helper orders keys like structspec generates them, recursively and through $ref."""
    schema = {"$defs": {"p": {"properties": {"x": {}, "y": {}}}},
              "properties": {"b": {"$ref": "#/$defs/p"}, "a": {}}}
    data = {"z": 1, "a": 2, "b": {"y": 1, "x": 2}}
    assert serialize(data, schema) == b'{"b":{"x":2,"y":1},"a":2,"z":1}'
    assert serialize(["é"], {}) == '["é"]'.encode()
