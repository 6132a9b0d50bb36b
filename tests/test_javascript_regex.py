"""javascript.lark's regular-expression literal terminal (``javascript_regex.py``): sound
(every literal it matches is one V8 accepts) and complete on its documented subset.

Literals come from a seeded generator of the subset's constructs and from random
mutations of them (a character dropped, doubled, swapped or inserted), so most of the
mutants are near misses: unbalanced groups, quantifiers on nothing, ranges out of order,
repeated flags. V8 judges them in one ``node`` process (skipped without node).
"""

from __future__ import annotations

import random

import pytest
from conftest import run_node

from structspec.automata.lark_grammar import load_grammar
from structspec.grammars import grammar_path

NODE_CHECK = r"""
const vm = require('vm');
const rows = JSON.parse(require('fs').readFileSync(0, 'utf8'));
console.log(JSON.stringify(rows.map((lit) => {
  try { new vm.Script('x = ' + lit); return true; }
  catch (e) { if (e instanceof SyntaxError) return false; throw e; }
})));
"""


def _regex_terminal():
    g = load_grammar(grammar_path("javascript"))
    return next(t for t in g.terminals if t.name == "REGEX")


def _atom(rng: random.Random, depth: int) -> str:
    kind = rng.randrange(8 if depth < 3 else 6)
    if kind == 0:
        return rng.choice("abcxyz019 _,:=!<>-'\"#%&@~`é")
    if kind == 1:
        return "."
    if kind == 2:
        return "\\" + rng.choice(["d", "D", "w", "W", "s", "S", "n", "t", "x41", "u00e9",
                                  "cA", ".", "*", "/", "(", "[", "\\", "^", "$", "|", "-"])
    if kind in (3, 4):
        items = [rng.choice(["a-z", "A-Z", "0-9", "c-f", "x", "_", "\\d", "\\s", "\\]",
                             "\\x20-\\x7e", "\\u0080-\\u00ff", "\\-", ".", "/", "*", "(",
                             "$"]) for _ in range(rng.randrange(4))]
        return "[" + rng.choice(["", "^"]) + rng.choice(["", "-"]) + "".join(items) + \
            rng.choice(["", "-"]) + "]"
    if kind == 5:
        return rng.choice(["^", "$", "\\b", "\\B"])
    return "(" + rng.choice(["", "?:", "?=", "?!", "?<=", "?<!"]) + \
        _disjunction(rng, depth + 1) + ")"


def _disjunction(rng: random.Random, depth: int = 0) -> str:
    alts = []
    for _ in range(1 + (rng.random() < 0.3)):
        terms = []
        for _ in range(rng.randrange(1, 4)):
            a = _atom(rng, depth)
            quantifiable = not (a in ("^", "$", "\\b", "\\B") or a.startswith("(?=")
                                or a.startswith("(?!") or a.startswith("(?<"))
            if quantifiable and rng.random() < 0.4:
                a += rng.choice(["*", "+", "?", "{2}", "{1,}", "{2,5}", "{0,12}"])
                a += rng.choice(["", "", "?"])
            terms.append(a)
        alts.append("".join(terms))
    return "|".join(alts)


def _literal(rng: random.Random) -> str:
    flags = "".join(rng.sample("dgimsy", rng.randrange(4)))
    if rng.random() < 0.2:
        flags = "u" + flags
    body = _disjunction(rng)
    if "u" in flags:  # the u grammar: no `\-` outside classes
        body = body.replace("\\-", "\\.")
    return f"/{body}/{flags}"


def _mutate(rng: random.Random, lit: str) -> str:
    i = rng.randrange(1, len(lit))
    op = rng.randrange(4)
    if op == 0:
        return lit[:i] + lit[i + 1:]
    if op == 1:
        return lit[:i] + lit[i] + lit[i:]
    if op == 2 and i + 1 < len(lit):
        return lit[:i] + lit[i + 1] + lit[i] + lit[i + 2:]
    return lit[:i] + rng.choice("()[]{}|*+?\\-^$/gimu,0") + lit[i:]


def _node_valid(literals: list[str]) -> list[bool]:
    return run_node(NODE_CHECK, literals, why="to judge regular-expression literals")


def test_generated_subset_literals_are_matched_and_valid():
    rng = random.Random(0)
    term = _regex_terminal()
    lits = [_literal(rng) for _ in range(600)]
    # lookbehind/lookahead groups inside a class-free body are in the subset, as are all
    # the generator's atoms: every literal must be matched
    missed = [x for x in lits if not term.matches(x.encode())]
    assert not missed, missed[:10]
    valid = _node_valid(lits)
    assert all(valid), [x for x, v in zip(lits, valid) if not v][:10]


def test_matched_mutants_are_valid_javascript():
    """Soundness: whatever the terminal matches, V8 accepts."""
    rng = random.Random(1)
    term = _regex_terminal()
    matched = []
    tried = 0
    while tried < 6000:
        lit = _literal(rng)
        for _ in range(rng.randrange(1, 3)):
            lit = _mutate(rng, lit)
        tried += 1
        if term.matches(lit.encode()):
            matched.append(lit)
    assert len(matched) > 1000
    valid = _node_valid(matched)
    bad = [x for x, v in zip(matched, valid) if not v]
    assert not bad, bad[:10]


@pytest.mark.parametrize("lit", ["/a/gg", "/(/", "/a)/", "/[z-a]/", "/a**/", "/+a/",
                                 "/a{3,1}/", "/a/q", "/(?<=a)*/", "/\\-/u", "/a/uv",
                                 "//", "/*a/", "/[\\x7e-\\x20]/", "/[\\x41-\\x4f]/"])
def test_refused(lit):
    assert not _regex_terminal().matches(lit.encode())
