"""The native LALR simulation (``structspec/_native/lalr_sim.c``) equals its Python twin.

``ParserStacks.feed_low`` and ``ParserStacks.takes`` run lark's reductions in the kernel
when it is built, else in Python (``_feed_python``, ``_takes_python``). Stacks reached by
random parses of the shipped grammars must give the same answers both ways — the same
resulting stack (as its LALR states), the same lowest height read — and so must the
viable-terminal checks of ``LarkRuntime`` built on them; masks along real programs must be
identical with the kernel and without it (``STRUCTSPEC_NATIVE=off``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec import _native
from structspec.automata.lalr import NO_ACTION, ParserStacks
from structspec.automata.lark_grammar import load_grammar
from structspec.grammars import grammar_path

needs_kernel = pytest.mark.skipif(_native.load("lalr_sim") is None,
                                  reason="the lalr_sim kernel is not built")

GRAMMARS = ("python", "sql", "javascript", "json")
_LOADED: dict[str, object] = {}


def _grammar(name: str):
    if name not in _LOADED:
        _LOADED[name] = load_grammar(grammar_path(name))
    return _LOADED[name]


def _pair(name: str) -> tuple[ParserStacks, ParserStacks]:
    """Stacks over one grammar's tables: the kernel's and the Python twin's."""
    tables = _grammar(name).tables
    native, twin = ParserStacks(tables), ParserStacks(tables)
    twin._lib = None
    assert native.native() and not twin.native()
    return native, twin


def _random_stack(stacks: ParserStacks, choices: list[int]) -> int:
    """A stack reached by feeding terminals the top state has an action for, picked by
    ``choices`` (a terminal the reductions refuse is skipped)."""
    s = 0
    for c in choices:
        exp = stacks.expected(s)
        if not exp:
            break
        nxt = stacks.feed(s, exp[c % len(exp)])
        if nxt >= 0:
            s = nxt
    return s


@needs_kernel
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(GRAMMARS),
       path=st.lists(st.integers(0, 1 << 16), min_size=0, max_size=60),
       probe=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=12))
def test_feed_and_takes_equal_the_python_twin(name: str, path: list[int],
                                               probe: list[int]) -> None:
    native, twin = _pair(name)
    a, b = _random_stack(native, path), _random_stack(twin, path)
    assert native.states(a) == twin.states(b)
    n_terms = len(native.tables.terminals)
    terms = np.array(sorted({p % n_terms for p in probe}), dtype=np.int64)
    bits = np.arange(terms.size, dtype=np.int64) * 3 + terms % 3  # distinct, sparse
    assert native.takes(a, terms, bits) == twin.takes(b, terms, bits)
    for t in terms.tolist():
        ra, la = native.feed_low(a, t)
        rb, lb = twin.feed_low(b, t)
        assert la == lb and (ra < 0) == (rb < 0)
        if ra >= 0:
            assert native.states(ra) == twin.states(rb)
        assert native.takes_low(a, t) == twin.takes_low(b, t) == (ra >= 0, la)


@needs_kernel
@pytest.mark.parametrize("name", GRAMMARS)
def test_viable_checks_equal_without_the_kernel(name: str, smollm_vocab,
                                                monkeypatch) -> None:
    """``LarkRuntime.viable_low`` (kernel: one row of answers per stack; Python: a memo
    and signatures per terminal set) gives the same answer and the same reads on random
    parses for every terminal set."""
    from structspec.automata.lark_constraint import LarkRuntime

    g = _grammar(name)
    rt = LarkRuntime(g, smollm_vocab)
    monkeypatch.setenv("STRUCTSPEC_NATIVE", "off")
    rt_off = LarkRuntime(g, smollm_vocab)
    assert rt.stacks.native() and not rt_off.stacks.native()
    rng = np.random.default_rng(7)
    term_sets = sorted({rt.lex.terms(s) for s in range(1, rt.lex.n_states())} |
                       {1 << i for i in range(len(g.terminals))})
    for _ in range(20):
        path = rng.integers(0, 1 << 16, size=int(rng.integers(0, 40))).tolist()
        a, b = _random_stack(rt.stacks, path), _random_stack(rt_off.stacks, path)
        assert rt.stacks.states(a) == rt_off.stacks.states(b)
        for terms in term_sets:
            for paren in (0, 1):
                assert rt.viable_low(terms, a, paren) == rt_off.viable_low(terms, b, paren)


@needs_kernel
def test_kernel_validates_its_inputs() -> None:
    k = _native.load("lalr_sim")
    # Two states, one terminal, one rule A -> x (length 1): state 0 shifts x to 1; state
    # 1 reduces on x; goto(0, A) = 0.
    actions = np.array([[3], [-1]], dtype=np.int32)
    actions[0, 0] = 1
    gotos = np.array([[0], [-1]], dtype=np.int32)
    rule_len = np.array([1], dtype=np.int32)
    rule_lhs = np.array([0], dtype=np.int32)
    parent = np.array([-1, 0], dtype=np.int64)
    state = np.array([0, 1], dtype=np.int32)
    head = (actions, gotos, rule_len, rule_lhs, parent, state)
    assert k.feed(*head, 0, 1, 0) == (0, 1, (1,))
    assert k.feed(*head, 1, 2, 0) == (0, 1, (0, 1))  # reduce (pop to height 1), then shift
    two = np.array([0, 0], dtype=np.int64)
    assert k.takes(*head, 1, 2, two, np.array([0, 9], dtype=np.int64)) == (
        b"\x01\x02", [(1, b"\x01\x02")])
    assert k.takes(*head, 1, 2, two[:0], two[:0]) == (b"\x00", [])
    refused = actions.copy()
    refused[0, 0] = NO_ACTION
    assert k.feed(refused, *head[1:], 0, 1, 0) == (-1, 1, ())
    assert k.takes(refused, *head[1:], 0, 1, two[:1], two[:1]) == (b"\x00", [(1, b"\x01")])
    with pytest.raises(ValueError, match="one entry per terminal"):
        k.takes(*head, 0, 1, two, two[:1])
    with pytest.raises(ValueError, match="bit"):
        k.takes(*head, 0, 1, two[:1], np.array([-1], dtype=np.int64))
    with pytest.raises(ValueError, match="stack node"):
        k.feed(*head, 2, 1, 0)
    with pytest.raises(ValueError, match="terminal"):
        k.feed(*head, 0, 1, 1)
    with pytest.raises(ValueError, match="bottom"):  # the reduction pops past the root
        k.feed(actions, gotos, rule_len, rule_lhs, parent, np.array([1, 1], np.int32),
               0, 1, 0)
    bad_shift = actions.copy()
    bad_shift[1, 0] = -5  # rule 4 does not exist
    with pytest.raises(ValueError, match="rule"):
        k.feed(bad_shift, *head[1:], 1, 2, 0)
    with pytest.raises(ValueError, match="LALR state"):
        k.feed(actions, gotos, rule_len, rule_lhs, parent, np.array([0, 9], np.int32),
               1, 2, 0)
    loop = np.array([[-1], [-1]], dtype=np.int32)  # reduce forever: A -> x, goto stays
    with pytest.raises(ValueError, match="does not end"):
        k.feed(loop, np.array([[1], [1]], np.int32), np.array([0], np.int32), rule_lhs,
               parent, state, 1, 2, 0)
    with pytest.raises(TypeError):
        k.feed(actions.astype(np.int64), *head[1:], 0, 1, 0)
    with pytest.raises(ValueError, match="one entry per node"):
        k.feed(*head[:5], state[:1], 0, 1, 0)


def test_dense_tables_match_the_dicts() -> None:
    t = _grammar("python").tables
    actions, gotos, rule_len, rule_lhs = t.dense()
    for s, row in enumerate(t.actions):
        got = {int(i): int(c) for i, c in enumerate(actions[s]) if c != NO_ACTION}
        assert got == row
    names: dict[str, int] = {}
    for r, lhs in enumerate(t.rule_lhs):
        names.setdefault(lhs, int(rule_lhs[r]))
        assert names[lhs] == int(rule_lhs[r])
    for s, row in enumerate(t.gotos):
        for nt, dst in row.items():
            if nt in names:
                assert gotos[s, names[nt]] == dst
    assert rule_len.tolist() == list(t.rule_len)


@needs_kernel
@pytest.mark.parametrize("name", ["sql", "javascript"])
def test_masks_equal_without_the_kernels(name: str, smollm_vocab, smollm_tokenizer,
                                         monkeypatch) -> None:
    """Masks along the corpus programs of ``name`` are the same with every native kernel
    and with none (``STRUCTSPEC_NATIVE=off``: the Python/NumPy twins)."""
    from pathlib import Path

    from structspec.automata.lark_constraint import LarkRuntime

    folder = Path(__file__).parent / "data" / "grammars" / name
    programs = [smollm_tokenizer.encode(p.read_text(encoding="utf-8")[:1500],
                                        add_special_tokens=False)
                for p in sorted(folder.iterdir())[:2]]

    def masks() -> list[bytes]:
        rt = LarkRuntime(_grammar(name), smollm_vocab)
        out = []
        for ids in programs:
            s = rt.initial
            for t in ids:
                out.append(rt.mask(s).words.tobytes())
                s = rt.step_bytes(s, smollm_vocab.tokens[t])
                if not s:  # a program cut short mid-token: stop there
                    break
        return out

    native = masks()
    monkeypatch.setenv("STRUCTSPEC_NATIVE", "off")
    assert native == masks()


@needs_kernel
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(("python", "sql")),
       paths=st.lists(st.lists(st.integers(0, 1 << 16), max_size=40), min_size=1,
                      max_size=8),
       lows=st.lists(st.integers(0, 30), min_size=8, max_size=8))
def test_find_signature_equals_the_python_twin(name: str, paths: list[list[int]],
                                               lows: list[int]) -> None:
    """Values stored under the top states of random stacks are found the same way by the
    kernel and by Python, for those stacks and for stacks that share their tops."""
    from structspec.automata.lalr import Signatures

    stacks, _ = _pair(name)
    sigs = Signatures()
    made = [_random_stack(stacks, path) for path in paths]
    for i, s in enumerate(made):
        # a height from 1 (the whole stack read) to depth + 1 (nothing read)
        stacks.store_signature(sigs, s, 1 + lows[i] % (stacks.depth(s) + 1), ("v", i))
    probes = made + [_random_stack(stacks, path[: len(path) // 2]) for path in paths]
    probes += [_random_stack(stacks, [*path, 7, 11]) for path in paths]
    assert stacks._head is not None
    for s in probes:
        assert stacks.find_signature(sigs, s) == stacks._find_python(sigs, s)
    k = _native.load("lalr_sim")
    with pytest.raises(ValueError, match="stack node"):
        k.find({0: 1}, {}, *stacks._head[4:], stacks._head[4].size, 5)
