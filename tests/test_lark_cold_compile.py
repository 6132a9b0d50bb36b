"""Cold compile of the shipped grammars: the lazily built f-string DFAs equal the eager ones
and the shipped (minimized) ones, the shipped analysis (LALR tables, terminals, DFAs) is
current, and the text splitter is exact."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from structspec.automata import lark_grammar as lg
from structspec.automata.dfa import LazyDFA, compile_dfa
from structspec.automata.limits import Limits, compiling
from structspec.grammars import grammar_path


def _equivalent(lazy: LazyDFA, full, limit: int = 100_000, bounded: bool = False) -> int:
    """Walk the product of the two DFAs; every pair must agree on acceptance and life.
    ``bounded``: stop after ``limit`` pairs instead of failing there."""
    pairs = {(lazy.start, full.start)}
    todo = list(pairs)
    while todo:
        if bounded and len(pairs) >= limit:
            break
        a, b = todo.pop()
        assert bool(lazy.accepting[a]) == bool(full.accepting[b])
        ra, rb = np.asarray(lazy.table[a]), full.table[b]
        assert ((ra == 0) == (rb == 0)).all()
        for x, y in set(zip(ra.tolist(), rb.tolist())):
            if x and (x, y) not in pairs:
                pairs.add((x, y))
                todo.append((x, y))
        assert bounded or len(pairs) < limit
    return len(pairs)


@pytest.mark.parametrize("pattern", [
    "ab*c|a(?:x|yy)+", "[a-c]{2,4}d?", "é+|\\d{3}", "(?:a|b)*abb", "x(?:[^x]|xy)*x",
])
def test_lazy_dfa_equals_compiled(pattern: str) -> None:
    full = compile_dfa(pattern)
    lazy = LazyDFA(pattern)
    _equivalent(lazy, full)
    again = pickle.loads(pickle.dumps(lazy))
    for s in range(1, lazy.n_states):
        assert (again.table[s] == lazy.table[s]).all()


def test_lazy_dfa_empty_language_dead_ends() -> None:
    lazy = LazyDFA("a[^\\x00-\\U0010ffff]")
    assert not lazy.accepting[1]
    assert not np.asarray(lazy.table[1]).any()
    assert not lazy.matches(b"a")


def test_top_alternatives() -> None:
    assert lg.top_alternatives("(?:a|b(?:c|d))") == ["a", "b(?:c|d)"]
    assert lg.top_alternatives("[|]x|\\|") == ["[|]x", "\\|"]
    assert lg.top_alternatives("[]|]|y") == ["[]|]", "y"]
    assert lg.top_alternatives("(?:a)(?:b|c)") == ["(?:a)(?:b|c)"]


def test_python_string_terminal_is_lazy_and_exact() -> None:
    """Loaded from its text (no shipped DFAs), the f-string alternatives are lazy; the
    shipped, fully built and minimized ones accept the same language."""
    text = grammar_path("python").read_text(encoding="utf-8")
    g = lg.load_grammar(text, cache=False)
    spec = next(t for t in g.terminals if t.name == "STRING")
    lazies = [d for d in spec.parts if isinstance(d, LazyDFA)]
    assert len(lazies) == 2  # the f-string and raw f-string alternatives
    assert spec.matches(b'f"a{x.y[1]!r:>{w}} b"') and spec.matches(b"rF'{a}'")
    assert not spec.matches(b'f"{"') and not spec.matches(b"from")
    shipped = next(t for t in lg.load_grammar(grammar_path("python"), cache=False).terminals
                   if t.name == "STRING")
    assert not any(isinstance(d, LazyDFA) for d in shipped.parts)
    assert len(shipped.parts) == len(spec.parts)
    for lazy, full in zip(spec.parts, shipped.parts):
        if isinstance(lazy, LazyDFA):  # ~176,000 states built lazily, ~18,700 minimized
            # the whole product has ~500,000 pairs since every name in a field is checked
            # against the keywords (minutes): the first 200,000 of a walk are checked
            assert _equivalent(LazyDFA(lazy.pattern), full, limit=200_000, bounded=True) >= 200_000
            assert full.n_states < 60_000


@pytest.mark.parametrize("name", ["json", "sql", "javascript", "python"])
def test_shipped_dfas_equal_compiled(name: str) -> None:
    """Every shipped terminal DFA accepts what the terminal's regex compiles to (the
    f-string ones are checked above)."""
    data = json.loads(lg.shipped_analysis_path(grammar_path(name)).read_text())
    assert data["dfas"]["format"] == lg.DFA_FORMAT
    for term in data["terminals"]:
        # Correctness, not speed: JavaScript's REGEX takes ~10-17 s to determinize (users
        # load it from the shipped tables), over the default 10 s budget on a loaded machine.
        with compiling(Limits(max_seconds=600), "test"):
            fresh = lg._terminal_dfas(term)
        shipped = lg._shipped_dfas(data, term["name"])
        assert shipped is not None and len(shipped) == len(fresh), term["name"]
        for a, b in zip(fresh, shipped):
            if not isinstance(a, LazyDFA):
                _equivalent(a, b)


def test_dfa_encoding_round_trips() -> None:
    d = compile_dfa("[a-c]{2,4}d?|x(?:[^x]|xy)*x")
    back = lg.decode_dfa(json.loads(json.dumps(lg.encode_dfa(d))))
    assert back.start == d.start
    assert (back.table == d.table).all() and (back.accepting == d.accepting).all()


def _canonical(t: dict) -> list:
    """The tables with states renumbered breadth-first from the start state and reductions
    named by what the runtime reads of a rule (its left side and length)."""
    names = t["terminals"]
    order = {t["start_state"]: 0}
    todo = [t["start_state"]]
    out = []
    while todo:
        s = todo.pop(0)

        def ref(target: int) -> int:
            if target not in order:
                order[target] = len(order)
                todo.append(target)
            return order[target]

        acts = []
        row = t["actions"][s]  # flat: terminal, code, terminal, code, ...
        for term, code in sorted(zip(row[::2], row[1::2]), key=lambda x: names[x[0]]):
            acts.append((names[term], ("shift", ref(code)) if code >= 0 else
                         ("reduce", t["rule_lhs"][-code - 1], t["rule_len"][-code - 1])))
        gotos = [(k, ref(v)) for k, v in sorted(t["gotos"][s].items())]
        out.append((acts, gotos))
    return [out, order.get(t["end_state"]), sorted(names)]


@pytest.mark.parametrize("name", ["json", "sql", "javascript", "python"])
def test_shipped_analysis_is_current(name: str) -> None:
    """Regenerate with ``python -m structspec.automata.lark_grammar NAME``."""
    path = grammar_path(name)
    text, paths = lg._read(path)
    start, postlex = lg._options(text, None, "auto")
    shipped = json.loads(lg.shipped_analysis_path(path).read_text())
    assert shipped["key"] == lg.analysis_key(text, start, postlex), "stale: regenerate"
    fresh = json.loads(json.dumps(lg._analyze(text, start, postlex, paths)))
    assert shipped["terminals"] == fresh["terminals"]
    assert shipped["ignore"] == fresh["ignore"]
    # lark numbers states and rules in hash order (it varies between processes): compare
    # the tables up to that numbering
    assert _canonical(shipped["tables"]) == _canonical(fresh["tables"])
    assert lg._shipped(path, text, start, postlex) is not None
