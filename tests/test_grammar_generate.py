"""Generation under Lark grammars on a tiny random model: outputs parse, speculation is
lossless with the Lark constraint, code completion from a prefix and fill-in-the-middle,
errors with line/column.

python.lark costs ~10 s to compile cold (the tests run with the disk cache off): this module
compiles it once (the ``python`` fixture) and every later ``grammar="python"`` call hits the
in-memory compile cache.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import lark
import pytest
from conftest import run_generate

from structspec.api import Generator, resolve_grammar
from structspec.errors import GrammarError
from structspec.grammars import available, grammar_path
from structspec.spec import SpecConfig

# A finite language: every output finishes within a few tokens, even from a random model.
LET = r'''
start: "let " NAME " = " VALUE ";"
NAME: /[a-z]{1,2}/
VALUE: "true" | "false" | "null" | /[0-9]/
'''

ARITH = r'''
start: stmt+
stmt: NAME "=" expr ";"
?expr: term (("+"|"-") term)*
?term: NAME | NUMBER | "(" expr ")"
NAME: /[a-z]+/
NUMBER: /[0-9]+/
%ignore " "
'''

PY_PREFIX = "def add(a, b):\n    total = a +"
PY_SUFFIX = "\n    return total\n\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def gen(tiny_model) -> Generator:
    """A Generator over a private copy of the tiny model (it packs linears in place)."""
    from structspec.models import LoadedModel

    own = LoadedModel(copy.deepcopy(tiny_model.model), tiny_model.tokenizer, tiny_model.name,
                      tiny_model.eos_token_ids)
    return Generator(own)


@pytest.fixture(scope="module")
def python(gen):
    """The shipped python.lark compiled for the tiny model's vocabulary (once)."""
    return gen.compile_grammar("python")


# -- telling names, paths and text apart ------------------------------------------------------


def test_resolve_names_paths_and_text(tmp_path):
    assert {"json", "python", "sql", "javascript"} <= set(available())
    assert resolve_grammar("python") == grammar_path("python")
    assert resolve_grammar("sql.lark") == grammar_path("sql")
    f = tmp_path / "g.lark"
    f.write_text(LET)
    assert resolve_grammar(str(f)) == f
    assert resolve_grammar(f) == f
    other = tmp_path / "python"  # a file named like a shipped grammar: the name wins
    other.write_text(LET)
    assert resolve_grammar("python") == grammar_path("python")
    assert resolve_grammar(LET) == LET
    assert resolve_grammar('start: "a"') == 'start: "a"'


@pytest.mark.parametrize("bad", ["pyhton", "missing.lark", "./no/such/file.lark"])
def test_resolve_unknown_name_lists_the_shipped_ones(bad):
    with pytest.raises(GrammarError, match="python"):
        resolve_grammar(bad)


def test_resolve_rejects_non_strings_and_missing_paths(tmp_path):
    with pytest.raises(ValueError, match="grammar"):
        resolve_grammar("  ")
    with pytest.raises(ValueError, match="grammar"):
        resolve_grammar(3)  # type: ignore[arg-type]
    with pytest.raises(GrammarError, match="no such grammar file"):
        resolve_grammar(tmp_path / "nope.lark")


# -- generation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(2))
def test_sampled_outputs_parse(gen, seed):
    parser = lark.Lark(LET, parser="lalr")
    r = gen.run("Write a binding.", grammar=LET, temperature=1.0, seed=seed, max_new_tokens=20)
    parser.parse(r.text)
    assert r.value == r.text and r.token_ids


def test_grammar_from_a_file(gen, tmp_path):
    path = tmp_path / "let.lark"
    path.write_text(LET)
    r = gen.run("Write a binding.", grammar=str(path), max_new_tokens=20)
    lark.Lark(LET, parser="lalr").parse(r.text)


@pytest.mark.parametrize("grammar", [LET, ARITH])
def test_speculation_on_and_off_give_the_same_greedy_output(gen, grammar):
    plain = run_generate(gen, prompt="Write code:", grammar=grammar, max_new_tokens=40,
                 speculative=False)
    fast = run_generate(gen, prompt="Write code:", grammar=grammar, max_new_tokens=40)
    tuned = run_generate(gen, prompt="Write code:", grammar=grammar, max_new_tokens=40,
                 speculative=SpecConfig(max_nodes=4, draft_length=8))
    assert plain[1] == fast[1] == tuned[1]
    assert plain[2] == fast[2] == tuned[2]


def test_forced_text_is_drafted_and_accepted(gen):
    r = gen.run("Write a binding.", grammar=LET, max_new_tokens=20)
    forced = r.stats.per_drafter.get("forced", [0, 0])
    assert forced[1] >= 1  # "let " and " = " are written without the model's choosing


KEYWORDS = ('start: "let " NAME " = " VALUE ";"\nNAME: /[a-z]{1,2}/\n'
            'VALUE: "true" | "false" | "null"\n')


def test_alternatives_drafter_branches_at_keyword_choices(gen):
    # After " = " the grammar allows 10 tokens (t, tr, true, f, fa, fal, false, n, nu, null)
    # but three options: the drafter branches on the options (every drafted node kept).
    # Where the Generator's earlier requests wrote the space and a keyword as one token
    # (' true'), the forced chain drafts that habit and the other two go beside it.
    spec = SpecConfig(cost_model=False)
    plain = gen.run("Bind.", grammar=KEYWORDS, max_new_tokens=20, speculative=False)
    fast = gen.run("Bind.", grammar=KEYWORDS, max_new_tokens=20, speculative=spec)
    assert plain.token_ids == fast.token_ids
    assert fast.stats.per_drafter.get("alternatives", [0, 0])[0] >= 2
    assert fast.stats.forward_passes < plain.stats.forward_passes


def test_python_completion_from_a_prefix(gen, python):
    text, ids, _ = run_generate(gen, prompt="def add(a, b):\n    total = a +", grammar=python,
                        grammar_prefix=PY_PREFIX, max_new_tokens=12, chat=False,
                        speculative=False)
    assert ids
    python.state_after(PY_PREFIX + text)  # the output continues the prefix legally
    spec = run_generate(gen, prompt="def add(a, b):\n    total = a +", grammar="python",
                grammar_prefix=PY_PREFIX, max_new_tokens=12, chat=False)
    assert spec[1] == ids


@pytest.mark.parametrize("stop", ["eof", "line"])
def test_python_fill_in_the_middle_is_final_only_where_it_parses(gen, python, stop):
    plain = run_generate(gen, prompt=PY_PREFIX, grammar="python", grammar_prefix=PY_PREFIX,
                 grammar_suffix=PY_SUFFIX, stop=stop, max_new_tokens=16, chat=False,
                 speculative=False)
    fast = run_generate(gen, prompt=PY_PREFIX, grammar="python", grammar_prefix=PY_PREFIX,
                grammar_suffix=PY_SUFFIX, stop=stop, max_new_tokens=16, chat=False)
    assert plain == fast
    text, _, complete = plain
    python.state_after(PY_PREFIX + text)
    if complete:
        ast.parse(PY_PREFIX + text + PY_SUFFIX)
        if stop == "line":
            assert text.endswith("\n") or PY_SUFFIX.startswith("\n")


def test_fim_view_accepts_exactly_where_the_whole_parses(python):
    fim = python.with_suffix(PY_SUFFIX, prefix=PY_PREFIX, stop="line")
    assert fim.is_accepting(fim.state_after(" b", state=fim.initial))
    assert not fim.is_accepting(fim.state_after(" (b", state=fim.initial))
    eof = python.with_suffix("\n", prefix="x = 1 +", stop="eof")
    assert eof.is_accepting(eof.state_after(" 2", state=eof.initial))
    line = python.with_suffix("y = 2\n", prefix="x = 1 +", stop="line")
    assert not line.is_accepting(line.state_after(" 2", state=line.initial))
    assert line.is_accepting(line.state_after(" 2\n", state=line.initial))


def test_fim_view_has_no_dead_ends(byte_vocab):
    from structspec import compile_grammar

    tok = byte_vocab.tokens.index
    fim = compile_grammar(LET, byte_vocab).with_suffix(" = 1;", prefix="let ")
    s = fim.state_after("a = 2", state=fim.initial)
    assert tok(b";") not in fim.allowed(s)  # after it nothing can follow, and no suffix fits
    assert fim.allowed(s).count() == 0 and not fim.is_accepting(s)
    a = fim.state_after("a", state=fim.initial)
    assert fim.is_accepting(a) and tok(b" ") not in fim.allowed(a)  # " = 2;" is a dead end
    assert tok(b"b") in fim.allowed(a)  # "ab" + " = 1;" still parses


def _live(c, state, memo):
    """Ground truth on a finite language: some continuation from ``state`` accepts."""
    if state not in memo:
        memo[state] = c.is_accepting(state) or any(
            _live(c, c._step_token(state, t), memo) for t in c._rt.mask(state).ids().tolist())
    return memo[state]


@pytest.mark.parametrize(("prefix", "suffix", "stop"), [
    ("let ", " = 1;", "eof"), ("let ", ";", "eof"), ("let a = ", "", "line"),
    ("let ", "", "eof"), ("", "x = null;", "eof"), ("let a", " = 12;", "eof"),
])
def test_fim_view_prunes_exactly_the_dead_ends_of_a_finite_language(byte_vocab, prefix,
                                                                     suffix, stop):
    from structspec import compile_grammar

    fim = compile_grammar(LET, byte_vocab).with_suffix(suffix, prefix=prefix, stop=stop)
    truth: dict[int, bool] = {}
    seen, todo = set(), [fim.initial]
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.add(s)
        allowed = set(fim.allowed(s).ids().tolist()) - set(byte_vocab.eos_token_ids)
        grammar = fim._rt.mask(s).ids().tolist()
        assert allowed == {t for t in grammar if _live(fim, fim._step_token(s, t), truth)}
        assert allowed or fim.is_accepting(s) or s == fim.initial
        todo.extend(fim._step_token(s, t) for t in allowed)


def test_views_of_grammars_with_ignore_and_plain_constraints_keep_the_grammar_mask(byte_vocab):
    from structspec import compile_grammar

    let = compile_grammar(LET, byte_vocab)
    s = let.state_after("let a = 2")
    assert byte_vocab.tokens.index(b";") in let.allowed(s)  # no suffix: the plain mask
    arith = compile_grammar(ARITH, byte_vocab).with_suffix("x = 1;", prefix="y = 2")
    s = arith.state_after(";", state=arith.initial)
    eos = set(byte_vocab.eos_token_ids)
    assert set(arith.allowed(s).ids().tolist()) - eos == set(arith._rt.mask(s).ids().tolist())
    assert not arith._dead_memo  # %ignore: the dead-end search never runs


def test_tolerant_prefix_does_not_raise(gen, python):
    broken = "def f(:\n    x = "
    with pytest.raises(GrammarError) as info:
        gen.run("x", grammar=python, grammar_prefix=broken, max_new_tokens=2)
    assert (info.value.line, info.value.column) == (1, 7)
    text, ids, _ = run_generate(gen, prompt="x", grammar=python, grammar_prefix=broken,
                        tolerant=True, max_new_tokens=4)
    assert ids
    assert python.is_tolerant(python.state_after(broken + text, tolerant=True))


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grammar", "needle", "line"),
    [
        ('start: "a"\nfoo: bar\n', "bar", 2),
        ('start: "a" |\n  ) b\n', "", 2),
        ("start: a\na: \"x\"\na: \"y\" \"z\"\n", "", None),
    ],
)
def test_bad_grammar_is_a_grammar_error_with_a_line(gen, grammar, needle, line):
    with pytest.raises(GrammarError) as info:
        gen.run("x", grammar=grammar, max_new_tokens=2)
    assert needle in str(info.value)
    if line is not None:
        assert info.value.line == line


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"schema": {"type": "string"}, "grammar": LET}, "schema or regex or grammar"),
        ({"regex": "a", "grammar": LET}, "regex and grammar"),
        ({"grammar_prefix": "x"}, "grammar_prefix"),
        ({"grammar_suffix": "x"}, "grammar_suffix"),
        ({"stop": "line"}, "stop"),
        ({"grammar": LET, "stop": "block"}, "stop"),
        ({"tolerant": True}, "tolerant"),
    ],
)
def test_bad_grammar_arguments_name_themselves(gen, kwargs, name):
    with pytest.raises(ValueError, match=name):
        gen.run("x", **kwargs)


def test_compiled_constraint_for_another_vocabulary_is_refused(gen, byte_vocab):
    from structspec import compile_grammar

    other = compile_grammar(LET, byte_vocab)
    with pytest.raises(ValueError, match="vocabulary"):
        gen.run("x", grammar=other)


def test_module_level_generate_takes_a_grammar(monkeypatch, gen):
    import structspec
    from structspec import api

    monkeypatch.setitem(api._GENERATORS, "tiny", gen)
    text = structspec.generate("Write a binding.", grammar=LET, model="tiny",
                               max_new_tokens=20)
    lark.Lark(LET, parser="lalr").parse(text)


def test_shipped_grammars_resolve_to_files():
    for name in available():
        assert Path(resolve_grammar(name)).is_file()


def test_stop_line_ends_the_completion_at_the_first_parsing_line_end(byte_vocab):
    from structspec import compile_grammar

    grammar = 'start: stmt+\nstmt: NAME "=" NAME _NL\nNAME: /[a-z]+/\n_NL: "\\n"\n'
    view = compile_grammar(grammar, byte_vocab).with_suffix(b"c=d\n", prefix=b"a=", stop="line")
    s = view.initial
    for b in b"b\n":
        s = view.advance(s, b + 1)
    assert view.is_accepting(s)
    assert view.allowed(s).ids().tolist() == [0]  # only EOS: the completion ends here
    assert view.advance(s, ord("x") + 1) is None
    mid = view.advance(view.initial, ord("b") + 1)
    assert not view.is_accepting(mid) and view.allowed(mid).count() > 1
