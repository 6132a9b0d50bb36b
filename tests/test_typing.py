"""The public API as a user's type checker sees it (the package ships ``py.typed``).

A snippet using the API as the README shows it is checked with mypy: the compiled
constraints must be :class:`~structspec.automata.base.Constraint` objects to a type checker
too (they were not while the protocol typed states ``Hashable`` and the constraints ``int``:
``c: Constraint = compile_regex(...)`` was an error), and the calls must take what the README
passes them. And the package itself type-checks, with the configuration in pyproject.toml.
Skipped where mypy is not installed (it is in the ``test`` extra).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SNIPPET = textwrap.dedent('''
    from pydantic import BaseModel

    import structspec
    from structspec.automata.base import Constraint
    from structspec.spec import SpecConfig


    class Person(BaseModel):
        name: str
        age: int


    def use(c: Constraint) -> bool:
        state = c.initial()
        nxt = c.advance(state, 0)
        return nxt is not None and c.is_accepting(nxt) and bool(c.allowed(state).count())


    def main() -> None:
        gen = structspec.Generator()
        regex: Constraint = structspec.compile_regex("[0-9]+", gen.vocab)
        use(regex)
        use(structspec.compile_json_schema({"type": "integer"}, gen.vocab))
        use(structspec.compile_json_schema(Person, gen.vocab))
        result = gen.run("Weather?", schema={"type": "object"}, max_new_tokens=20,
                         speculative=SpecConfig(max_nodes=8))
        print(result.value, result.text, result.token_ids, result.stats.forward_passes)
        print(structspec.generate("Maria, 34", schema=Person))
        print(gen.generate("Three digits:", regex=r"[0-9]{3}", seed=3, temperature=0.7))
        print(gen.totals.as_dict())
''')


def test_the_readme_api_type_checks(tmp_path, monkeypatch):
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (the test extra has it)")
    source = tmp_path / "user_code.py"
    source.write_text(SNIPPET)
    monkeypatch.chdir(ROOT)  # this checkout's structspec, as the tests import it
    stdout, stderr, status = api.run([
        str(source), "--python-version", "3.11", "--follow-imports", "silent",
        "--ignore-missing-imports", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
    ])
    assert status == 0, stdout + stderr


def test_the_package_type_checks(tmp_path, monkeypatch):
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (the test extra has it)")
    monkeypatch.chdir(ROOT)  # pyproject.toml's [tool.mypy]
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "structspec").rglob("*.py"))
    stdout, stderr, status = api.run([
        *files, "--python-version", "3.11",
        "--follow-imports", "silent", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
    ])
    assert status == 0, stdout + stderr
