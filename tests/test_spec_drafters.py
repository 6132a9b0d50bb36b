"""Drafters with the real tokenizer: every proposed node is legal, forced text is tokenized
canonically, lookup and values find what the request holds."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automata.regex import compile_regex
from structspec.engine import free_text
from structspec.spec.canonical import CanonicalTokenizer, canonical_tokenizer
from structspec.spec.draft_context import VALUES_ALT, DraftContext, drafter_of
from structspec.spec.drafters import build_tree, make_drafters
from structspec.spec.forced import forced_tokens
from structspec.spec.literals import (
    extract_literals,
    field_literals,
    key_distances,
    last_use,
    rank_for_key,
    rank_literals,
)
from structspec.spec.ngram import NgramIndex
from structspec.spec.text_lookup import TextIndex
from structspec.spec.tree import TreeBuilder
from structspec.vocab import Vocabulary

CALL = (r'\{"name":"(get_weather|get_time)","arguments":\{"city":"[A-Za-z ]{1,20}",'
        r'"days":[0-9]{1,2}(,"unit":"(celsius|fahrenheit)")?\}\}')
ITEMS = r'\[("(red|green|blue)",){0,4}"(red|green|blue)"\]'
PROMPT = 'What is the weather in "New York" for the next 3 days, or 10 days, in celsius?'
ALL = ("values", "closers", "splits", "lookup", "text_lookup", "alternatives", "topk")


@pytest.fixture(scope="module")
def setup(smollm_tokenizer, smollm_vocab):
    constraints = {"call": compile_regex(CALL, smollm_vocab),
                   "items": compile_regex(ITEMS, smollm_vocab),
                   "free": free_text(smollm_vocab)}
    return smollm_tokenizer, smollm_vocab, constraints


def _context(tok, vocab, constraint, prompt_ids, output, logits=None):
    history = NgramIndex(3)
    history.extend(prompt_ids + output)
    return DraftContext(constraint=constraint, vocab=vocab,
                        canon=CanonicalTokenizer(tok, vocab), history=history,
                        prompt_len=len(prompt_ids),
                        literals=extract_literals(vocab.decode_text(prompt_ids)),
                        last_logits=logits, text_index=TextIndex(vocab.decode(prompt_ids)))


def _random_walk(constraint, vocab, rng, steps):
    state, out = constraint.initial, []
    for _ in range(steps):
        ids = [i for i in constraint.allowed(state).ids().tolist() if i not in vocab.eos_token_ids]
        if not ids:
            break
        t = rng.choice(ids)
        state = constraint.advance(state, t)
        out.append(t)
    return state, out


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), name=st.sampled_from(["call", "items", "free"]),
       steps=st.integers(0, 30), nodes=st.sampled_from([0, 2, 8, 16]))
def test_drafters_never_propose_illegal_nodes(setup, seed, name, steps, nodes):
    tok, vocab, constraints = setup
    constraint = constraints[name]
    rng = random.Random(seed)
    prompt_ids = tok.encode(PROMPT + ' {"name":"get_weather"}', add_special_tokens=False)
    state, out = _random_walk(constraint, vocab, rng, steps)
    root = out[-1] if out else prompt_ids[-1]
    logits = torch.randn(len(vocab), generator=torch.Generator().manual_seed(seed))
    ctx = _context(tok, vocab, constraint, prompt_ids, out, logits)
    builder = TreeBuilder(constraint, root, state, max_depth=12, max_nodes=nodes,
                          max_branches=4, eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters(ALL))
    tree = builder.freeze()
    assert tree.states[0] == state
    for i in range(1, len(tree)):
        assert tree.tokens[i] not in vocab.eos_token_ids
        assert constraint.advance(tree.states[tree.parents[i]], tree.tokens[i]) == tree.states[i]
        assert tree.depths[i] <= 12
    speculative = sum(1 for s in tree.sources[1:] if s != "forced")
    assert speculative <= nodes
    assert len({(tree.parents[i], tree.tokens[i]) for i in range(1, len(tree))}) == len(tree) - 1


def test_forced_text_is_tokenized_canonically(setup):
    tok, vocab, constraints = setup
    c = constraints["call"]
    ids = tok.encode('{"name":"get_', add_special_tokens=False)
    ctx = _context(tok, vocab, c, ids, [])
    state = c.initial
    builder = TreeBuilder(c, ids[-1], state, max_depth=40, max_nodes=0, max_branches=0,
                          eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, [])
    text = vocab.decode(builder.freeze().path_tokens(len(builder) - 1))
    assert text == b'{"name":"get_'  # the forced text, up to the get_weather|get_time choice
    assert builder.freeze().path_tokens(len(builder) - 1) == tok.encode(
        '{"name":"get_', add_special_tokens=False)


def test_tokens_after_uses_the_previous_token_as_context(setup):
    tok, vocab, _ = setup
    canon = CanonicalTokenizer(tok, vocab)
    ids = canon.tokens_after(b'":"', b"units")
    assert vocab.decode(ids) == b"units"
    assert list(ids) == tok.encode('":"units', add_special_tokens=False)[1:]
    assert canon.tokens_after(b"", b"") == ()


def test_without_a_tokenizer_forced_text_takes_the_longest_tokens(setup):
    """``speculative_decode(tokenizer=None)`` drafts forced text as the longest matching
    token at each step, as its docstring says (it raised AttributeError until session 61)."""
    _, vocab, _ = setup
    canon = canonical_tokenizer(None, vocab)
    ids = canon.tokens_after(b'":"', b'units": "celsius')
    assert vocab.decode(ids) == b'units": "celsius'
    for i, token in enumerate(ids):  # no longer token starts where this one does
        rest = vocab.decode(ids[i:])
        assert not any(vocab.ids_for(rest[:cut]) for cut in range(len(vocab.tokens[token]) + 1,
                                                                   len(rest) + 1))
    assert canon.tokens_after(b"", b"") == ()
    assert CanonicalTokenizer(None, Vocabulary.from_tokens([b"", b"a"], eos_token_ids=[0])
                              ).tokens_after(b"a", b"ab") == ()  # no token spells b


def test_a_single_allowed_token_is_forced(setup):
    tok, vocab, _ = setup
    c = compile_regex(r"(hello)", vocab)
    ctx = _context(tok, vocab, c, [1], [])
    state = c.initial
    got = forced_tokens(ctx, state, 1)
    assert vocab.decode(got).startswith(b"h") and c.advance(state, got[0]) is not None


def test_drafting_code_computes_no_mask_below_the_frontier(setup, monkeypatch):
    # A code grammar's mask costs milliseconds; drafters ask about many nodes decoding never
    # reaches. Only the frontier's mask (which verification needs anyway) may be computed,
    # and every node stays legal.
    from structspec import compile_grammar
    from structspec.grammars import grammar_path

    tok, vocab, _ = setup
    prefix = 'def add(a, b):\n    """Return the sum of a and b."""\n    total = a + b\n'
    code = compile_grammar(grammar_path("python"), vocab).with_suffix(b"", prefix=prefix)
    written = "    return tot"
    ids = tok.encode(prefix + written, add_special_tokens=False)
    out = tok.encode(written, add_special_tokens=False)
    state = code.initial
    for t in out:
        state = code.advance(state, t)
        assert state is not None
    computed = []
    inner = type(code)._grammar_mask
    monkeypatch.setattr(type(code), "_grammar_mask",
                        lambda self, s: computed.append(s) or inner(self, s))
    ctx = _context(tok, vocab, code, ids[: len(ids) - len(out)], out,
                   torch.randn(len(vocab), generator=torch.Generator().manual_seed(0)))
    builder = TreeBuilder(code, out[-1], state, max_depth=12, max_nodes=16, max_branches=6,
                          eos_ids=vocab.eos_token_ids)
    frontier = build_tree(ctx, builder, make_drafters(ALL))
    tree = builder.freeze()
    assert len(tree) > 1 and set(computed) <= {tree.states[frontier]}
    for i in range(1, len(tree)):
        assert code.advance(tree.states[tree.parents[i]], tree.tokens[i]) == tree.states[i]


def test_ngram_index_prefers_long_matches_and_drops_prefixes():
    idx = NgramIndex(3)
    idx.extend([1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 2, 3])
    conts = idx.continuations([2, 3], length=3)
    assert conts[0] == (2, [4, 6, 7]) and (2, [4, 5, 9]) in conts
    assert (3, [4, 5, 9]) not in conts  # no 3-gram [x, 2, 3] repeats
    idx2 = NgramIndex(2)
    idx2.extend([7, 7, 7, 7])
    # [7] (a prefix of [7, 7]) is dropped; the longer [7, 7, 7] from the 1-gram is kept.
    assert idx2.continuations([7, 7], length=5) == [(2, [7, 7]), (1, [7, 7, 7])]


def test_extract_literals_orders_numbers_first():
    lits = extract_literals('Find "New York" weather for 3 days at 10.5 degrees, ask Ana Lopez '
                            'via math.factorial')
    assert lits[:2] == ["3", "10.5"]
    assert "New York" in lits and "Ana Lopez" in lits and "math.factorial" in lits


def test_extract_literals_skips_schema_structure():
    text = ('Area of a circle of radius 4 in cm. Schema: {"type":"object","properties":'
            '{"radius":{"type":"integer","description":"The radius, e.g. \'big\'."},'
            '"unit":{"enum":["cm","in"]}},"required":["radius"]}')
    lits = extract_literals(text)
    assert lits[0] == "4" and "cm" in lits and "in" in lits
    for structure in ("type", "object", "integer", "radius", "properties", "The radius, e.g."):
        assert not any(lit.startswith(structure) for lit in lits), (structure, lits)


def test_rank_literals_continues_in_request_order():
    lits = ["2", "6", "5", "cm"]
    assert rank_literals(lits, "")[:4] == ["2", "6", "5", "cm"]
    # After "a":2 the next value is likelier the request's next one; written ones go last.
    assert rank_literals(lits, '{"a":2,"b":') == ["6", "5", "cm", "2", "1"]
    assert rank_literals(lits, '{"a":6,"b":')[:4] == ["5", "cm", "2", "6"]
    assert rank_literals(lits, '{"u":"', text_first=True)[0] == "cm"
    # In a string slot, words not written yet come before written ones.
    assert rank_literals(["kg", "cm", "mm"], '{"w":"cm","u":"', text_first=True)[:2] == ["kg", "mm"]


def test_rank_literals_counts_whole_values_not_keys():
    # BFCL calculate_roi: the request's key name written as a key, and "1" inside "1000",
    # are not values written; the next value after 1000 is 3.
    lits = ["1000", "3", "1", "annual_interest_rate"]
    written = '{"deposit": 1000, "annual_interest_rate": '
    assert rank_literals(lits, written)[0] == "3"
    assert last_use(written, "1") == -1
    assert last_use(written, "annual_interest_rate") == -1
    assert last_use('{"r": "annual_interest_rate"', "annual_interest_rate") > 0
    assert last_use("3, 3.5", "3") == 1  # 3.5 is another number
    assert last_use("x.1", "1") == -1 and last_use("1.5", "1") == -1
    assert last_use("rate_x", "rate") == -1 and last_use("", "a") == -1


def test_literals_named_beside_a_property_s_words_rank_first_for_it():
    request = ("Calculate the return of a savings account with a deposit of $1000, "
               "annual interest rate of 3% for 1 year.")
    lits = ("1000", "3", "1")
    years = key_distances(request, "years", lits)
    assert min(years, key=years.get) == "1"  # "1 year"
    assert rank_for_key(["1000", "1", "3"], years)[0] == "1"  # moved up one place
    deposit = key_distances(request, "deposit", lits)
    assert rank_for_key(["3", "1000", "1"], deposit)[0] == "1000"
    # no word of the property in the request: the order stands
    assert key_distances(request, "zz_qq", lits) == {}
    assert rank_for_key(["3", "1000", "1"], {}) == ["3", "1000", "1"]
    # whole words only: "1" is not inside "1000"
    assert key_distances("x 1000 y", "x", ("1",)) == {}


@given(st.text(alphabet='ab1._": ,', max_size=30), st.text(alphabet="ab1.", min_size=1, max_size=4))
def test_last_use_ends_an_occurrence(written, literal):
    end = last_use(written, literal)
    assert end == -1 or written[end - len(literal):end] == literal
    if literal not in written:
        assert end == -1


def test_nested_drafting_reaches_the_next_value(setup):
    tok, vocab, constraints = setup
    c = constraints["call"]
    from structspec.automata.base import walk

    prompt_ids = tok.encode(PROMPT, add_special_tokens=False)
    out = tok.encode('{"name":"get_weather","arguments":{"city":"New York',
                     add_special_tokens=False)
    state = walk(c, out)
    ctx = _context(tok, vocab, c, prompt_ids, out)
    builder = TreeBuilder(c, out[-1], state, max_depth=16, max_nodes=24, max_branches=4,
                          eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters(["values", "closers"]))
    tree = builder.freeze()
    texts = {vocab.decode(tree.path_tokens(i)) for i in range(len(tree)) if not tree.children[i]}
    # A closer, the forced key, then a value of the request: one branch.
    assert any(t.startswith(b'","days":3') for t in texts), texts
    ctx.options = {"nested_rounds": 0}
    builder = TreeBuilder(c, out[-1], state, max_depth=16, max_nodes=24, max_branches=4,
                          eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters(["values", "closers"]))
    tree = builder.freeze()
    texts = {vocab.decode(tree.path_tokens(i)) for i in range(len(tree)) if not tree.children[i]}
    assert not any(t.startswith(b'","days":3') for t in texts), texts


def test_values_and_lookup_draft_from_the_request(setup):
    tok, vocab, constraints = setup
    c = constraints["call"]
    prompt_ids = tok.encode(PROMPT, add_special_tokens=False)
    text = '{"name":"get_weather","arguments":{"city":"'
    out = tok.encode(text, add_special_tokens=False)
    from structspec.automata.base import walk

    state = walk(c, out)
    ctx = _context(tok, vocab, c, prompt_ids, out)
    builder = TreeBuilder(c, out[-1], state, max_depth=16, max_nodes=16, max_branches=8,
                          eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters(["values"]))
    tree = builder.freeze()
    texts = {vocab.decode(tree.path_tokens(i)) for i in range(len(tree)) if not tree.children[i]}
    assert any(t.startswith(b"New York") for t in texts), texts


def test_the_first_ranked_value_is_priced_apart_from_the_others(setup):
    """One ``values`` branch per node (the literal ranked first), the others ``values_alt``:
    the acceptance model learns their rates apart, and the drafter gate counts both as the
    values drafter's."""
    tok, vocab, constraints = setup
    c = constraints["call"]
    from structspec.automata.base import walk

    prompt_ids = tok.encode(PROMPT, add_special_tokens=False)
    out = tok.encode('{"name":"get_weather","arguments":{"city":"', add_special_tokens=False)
    ctx = _context(tok, vocab, c, prompt_ids, out)
    ctx.options = {"nested_rounds": 0}
    builder = TreeBuilder(c, out[-1], walk(c, out), max_depth=16, max_nodes=24,
                          max_branches=8, eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters(["values"]))
    tree = builder.freeze()
    firsts = list(tree.children[0])
    assert len(firsts) >= 2
    assert [tree.sources[i] for i in firsts] == ["values"] + [VALUES_ALT] * (len(firsts) - 1)
    # A branch keeps its source down its literal.
    for i in firsts:
        node = i
        while tree.children[node] and tree.sources[tree.children[node][0]] != "forced":
            node = tree.children[node][0]
            assert tree.sources[node] == tree.sources[i]
    assert drafter_of(VALUES_ALT) == "values" and drafter_of("draft_head_alt") == "draft_head"
    assert drafter_of("values") == "values" and drafter_of("forced") == "forced"


def test_nested_rounds_continue_only_the_first_ranked_literal(setup):
    """The closer, next key and next value are drafted after the first-ranked literal, not
    after the later-ranked ones (their continuations seldom make a plan)."""
    tok, vocab, constraints = setup
    c = constraints["call"]
    from structspec.automata.base import walk

    prompt_ids = tok.encode(PROMPT, add_special_tokens=False)
    out = tok.encode('{"name":"get_weather","arguments":{"city":"', add_special_tokens=False)
    ctx = _context(tok, vocab, c, prompt_ids, out)
    builder = TreeBuilder(c, out[-1], walk(c, out), max_depth=16, max_nodes=40,
                          max_branches=8, eos_ids=vocab.eos_token_ids)
    frontier = build_tree(ctx, builder, make_drafters(["values", "closers"]))
    tree = builder.freeze()
    alts = [i for i in tree.children[frontier] if tree.sources[i] == VALUES_ALT]
    assert alts

    def below(i):
        nodes, todo = [], [i]
        while todo:
            n = todo.pop()
            nodes.append(n)
            todo.extend(tree.children[n])
        return nodes

    for i in alts:  # the literal and its forced tail only
        assert {tree.sources[n] for n in below(i)} <= {VALUES_ALT, "forced"}
    first = [i for i in tree.children[frontier] if tree.sources[i] == "values"]
    assert any(tree.sources[n] == "closers" for n in below(first[0]))


def test_field_literals_read_each_propertys_note_in_the_template():
    template = (
        '{\n  "name": "area",\n  "arguments": {\n'
        '    "base": integer, // The base of the triangle.\n'
        '    "unit"?: string // The unit (defaults to \'units\' if not specified)\n'
        '    "method"?: string // \'trapezoid\' or \'simpson\'. Default is \'simpson\'.\n'
        '    "speed"?: string // If not provided, the default is km/h.\n'
        '    "n"?: integer // Default value is 10\n  }\n}')
    assert field_literals(template) == {"unit": ["units"], "method": ["simpson", "trapezoid"],
                                        "speed": ["km/h"], "n": ["10"]}
    assert field_literals('Find "New York" weather: {"city": {"type": "string"}}') == {}


def test_a_propertys_default_is_drafted_first_where_its_value_starts(setup):
    """Where "city"'s value starts, the default its note names comes before the request's
    own literals (one branch: the first ranked wins it)."""
    tok, vocab, constraints = setup
    c = constraints["call"]
    prompt = PROMPT + '\n{\n  "arguments": {\n    "city": string, // Default is \'Paris\'.\n  }\n}'
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    out = tok.encode('{"name":"get_weather","arguments":{"city":"', add_special_tokens=False)
    from structspec.automata.base import walk

    state = walk(c, out)

    def first_value(fields):
        ctx = _context(tok, vocab, c, prompt_ids, out)
        ctx.field_literals = fields
        ctx.options = {"values_max": 1}
        builder = TreeBuilder(c, out[-1], state, max_depth=16, max_nodes=16, max_branches=8,
                              eos_ids=vocab.eos_token_ids)
        build_tree(ctx, builder, make_drafters(["values"]))
        tree = builder.freeze()
        return {vocab.decode(tree.path_tokens(i)) for i in range(len(tree))
                if not tree.children[i]}

    text = vocab.decode_text(prompt_ids)
    assert any(t.startswith(b"Paris") for t in first_value(field_literals(text)))
    assert any(t.startswith(b"New York") for t in first_value({}))


def test_learned_splits_steer_the_forced_chain(setup):
    tok, vocab, constraints = setup
    c = constraints["call"]
    from structspec.automata.base import walk
    from structspec.spec.forced import learn_choice

    out = tok.encode('{"name":"get_weather","arguments":{"city', add_special_tokens=False)
    state = walk(c, out)
    ctx = _context(tok, vocab, c, [1], out)
    canonical = forced_tokens(ctx, state, out[-1])
    assert vocab.tokens[canonical[0]] == b'":"'
    split = vocab.ids_for(b'":')[0]
    learn_choice(ctx, state, out[-1], split)  # the model wrote '":' then '"'
    steered = forced_tokens(ctx, state, out[-1])
    assert steered[0] == split and vocab.decode(steered) == vocab.decode(canonical)
    # The suffix rule carries over to other tokens ending in '"' after a separator ('","'
    # becomes '",' + '"'), not to an opener's ('{"' stays whole).
    assert b'"' in ctx.split_suffixes
    from structspec.spec.forced import _preferred

    comma_quote, brace_quote = vocab.ids_for(b'","')[0], vocab.ids_for(b'{"')[0]
    assert vocab.tokens[_preferred(ctx, comma_quote, b"land")] == b'",'
    assert _preferred(ctx, brace_quote, b'":') == brace_quote
    learn_choice(ctx, state, out[-1], canonical[0])  # and back when the model agrees
    assert forced_tokens(ctx, state, out[-1])[0] == canonical[0]


def test_a_token_running_past_the_forced_text_is_learned_where_legal(setup):
    tok, vocab, _ = setup
    from structspec.automata.base import walk
    from structspec.spec.forced import learn_choice

    c = compile_regex(ITEMS, vocab)  # after an item only '"' is forced, then ',' or ']'
    out = tok.encode('["red', add_special_tokens=False)
    state = walk(c, out)
    ctx = _context(tok, vocab, c, [1], out)
    assert [vocab.tokens[t] for t in forced_tokens(ctx, state, out[-1])] == [b'"']
    comma = vocab.ids_for(b'",')[0]
    learn_choice(ctx, state, out[-1], comma)  # the model wrote '",' in one token
    assert forced_tokens(ctx, state, out[-1]) == [comma]
    # where the item must be the last one, '",' is illegal: the forced '"' again
    last = tok.encode('["red","red","red","red","blue', add_special_tokens=False)
    end = walk(c, last)
    assert vocab.tokens[forced_tokens(ctx, end, last[-1])[0]] in (b'"', b'"]')
    # text that is not all forced is not learned as a token for it
    learn_choice(ctx, state, out[-1], vocab.ids_for(b"ed")[0])
    assert forced_tokens(ctx, state, out[-1]) == [comma]


def test_the_value_s_opening_token_is_learned_per_kind_of_value(setup):
    # Spaced JSON: after '":' only ' ' is forced, and the model writes it with the value's
    # start in one token (' false', ' ["') where that is legal, but ' ' before a number.
    tok, vocab, _ = setup
    from structspec.automata.base import walk
    from structspec.automata.json_schema import compile_json_schema
    from structspec.spec.cost import AcceptanceModel
    from structspec.spec.forced import learn_choice, value_slot

    c = compile_json_schema({"type": "object", "properties": {
        "n": {"type": "integer"}, "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["n", "ok", "tags"], "additionalProperties": False}, vocab)
    habits = AcceptanceModel()

    def at(prefix):
        out = tok.encode(prefix, add_special_tokens=False)
        ctx = _context(tok, vocab, c, [1], out)
        ctx.acceptance = habits
        return ctx, walk(c, out), out[-1]

    space, false, brackets = (vocab.ids_for(t)[0] for t in (b" ", b" false", b' ["'))
    ctx, n_state, prev = at('{"n":')
    assert forced_tokens(ctx, n_state, prev) == [space]
    assert value_slot(vocab, b" ", c.allowed(n_state).__contains__) == b"| -"
    learn_choice(ctx, n_state, prev, space)  # a number: ' ' then its digits
    ctx, ok_state, prev = at('{"n": 1, "ok":')
    assert value_slot(vocab, b" ", c.allowed(ok_state).__contains__) == b"| false| true"
    assert forced_tokens(ctx, ok_state, prev) == [space]  # nothing known of booleans yet
    learn_choice(ctx, ok_state, prev, false)  # a boolean: ' false' in one token
    ctx, ok_state, prev = at('{"n": 2, "ok":')  # the next request, same kind of value
    assert forced_tokens(ctx, ok_state, prev) == [false]
    # The habit picked a value, not the kind: the other boolean goes beside it.
    builder = TreeBuilder(c, prev, ok_state, max_depth=8, max_nodes=8, max_branches=4,
                          eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters([]))
    tree = builder.freeze()
    firsts = {vocab.tokens[tree.tokens[i]]: tree.sources[i]
              for i in range(1, len(tree)) if tree.parents[i] == 0}
    assert firsts == {b" false": "forced", b" true": "alternatives"}
    ctx, n_state, prev = at('{"n":')
    assert forced_tokens(ctx, n_state, prev) == [space]  # numbers keep theirs
    # A chain that ends in ' ' stops before it, so that its own step can tell the kind.
    ctx, state, prev = at('{"n": 1, "ok": true, "tags')
    assert vocab.decode(forced_tokens(ctx, state, prev)) == b'":'
    learn_choice(ctx, walk(c, tok.encode('{"n": 1, "ok": true, "tags":',
                                         add_special_tokens=False)),
                 vocab.ids_for(b'":')[0], brackets)
    ctx, state, prev = at('{"n": 1, "ok": true, "tags":')
    assert forced_tokens(ctx, state, prev) == [brackets]


def test_splits_learned_over_requests_steer_the_chain_and_hedge_the_other(setup):
    tok, vocab, constraints = setup
    c = constraints["call"]
    from structspec.automata.base import walk
    from structspec.spec.cost import AcceptanceModel
    from structspec.spec.forced import learn_choice

    habits = AcceptanceModel()
    out = tok.encode('{"name":"get_weather","arguments":{"city', add_special_tokens=False)
    state = walk(c, out)
    split, whole = vocab.ids_for(b'":')[0], vocab.ids_for(b'":"')[0]

    def earlier_request(chosen):
        ctx = _context(tok, vocab, c, [1], out)
        ctx.acceptance = habits
        learn_choice(ctx, state, out[-1], chosen)

    def new_request():
        ctx = _context(tok, vocab, c, [1], out)
        ctx.acceptance = habits
        return ctx

    earlier_request(split)  # the first choice seen: the next request's chain follows it
    steered = forced_tokens(new_request(), state, out[-1])
    assert steered[0] == split and vocab.decode(steered).startswith(b'":"')
    earlier_request(whole)
    earlier_request(whole)  # the canonical token more often: the chain takes it back...
    assert forced_tokens(new_request(), state, out[-1])[0] == whole
    earlier_request(split)  # ...and one stray split after it does not outvote it
    assert forced_tokens(new_request(), state, out[-1])[0] == whole
    earlier_request(split)
    earlier_request(split)  # a habit: a new request's chain follows it
    steered = forced_tokens(new_request(), state, out[-1])
    assert steered[0] == split and vocab.decode(steered).startswith(b'":"')
    # Torn between the two: the chain takes the likelier, the splits drafter the other,
    # each branch spelling the same forced text.
    earlier_request(whole)
    earlier_request(whole)
    builder = TreeBuilder(c, out[-1], state, max_depth=16, max_nodes=16, max_branches=4,
                          eos_ids=vocab.eos_token_ids)
    build_tree(new_request(), builder, make_drafters(["splits"]))
    tree = builder.freeze()
    assert {tree.tokens[i] for i in tree.children[0]} == {split, whole}
    texts = {vocab.decode(tree.path_tokens(i)) for i in range(len(tree)) if not tree.children[i]}
    assert texts == {b'":"'}
    # Learned for punctuation only: how a name's pieces were split is not carried over.
    name_state = walk(c, tok.encode('{"name":"get_', add_special_tokens=False))
    ctx = new_request()
    learn_choice(ctx, name_state, vocab.ids_for(b"_")[0], vocab.ids_for(b"w")[0])
    assert not any(key[1].isalpha() for key in habits.splits)


def test_closers_propose_the_punctuation_that_ends_a_value(setup):
    tok, vocab, constraints = setup
    c = constraints["call"]
    from structspec.automata.base import walk

    text = '{"name":"get_weather","arguments":{"city":"Paris","days":1'
    out = tok.encode(text, add_special_tokens=False)
    state = walk(c, out)
    ctx = _context(tok, vocab, c, [1], out)
    builder = TreeBuilder(c, out[-1], state, max_depth=8, max_nodes=16, max_branches=4,
                          eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters(["closers"]))
    tree = builder.freeze()
    texts = {vocab.decode(tree.path_tokens(i)) for i in range(len(tree)) if not tree.children[i]}
    assert any(t.startswith(b',"unit":"') for t in texts), texts
    assert any(t.startswith(b"}}") for t in texts), texts
    assert not any(t[:1].isdigit() for t in texts)


def test_closers_in_a_string_end_it_first(setup):
    """Inside a string value, the closers that end the string at their first byte ('"')
    come first: ',"' would write a comma into the string."""
    tok, vocab, constraints = setup
    c = constraints["call"]
    from structspec.automata.base import walk

    text = '{"name":"get_weather","arguments":{"city":"Paris'
    out = tok.encode(text, add_special_tokens=False)
    ctx = _context(tok, vocab, c, [1], out)
    ctx.history.extend(tok.encode(' ,", ,",', add_special_tokens=False))  # ',"' used most
    builder = TreeBuilder(c, out[-1], walk(c, out), max_depth=8, max_nodes=16,
                          max_branches=1, eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters(["closers"]))
    tree = builder.freeze()
    assert vocab.tokens[tree.tokens[tree.children[0][0]]].startswith(b'"')


def test_closers_follow_how_the_model_ended_values(setup):
    """The closers the model ended free values with rank first; punctuation that opens a
    value ('":' then '"') or sits in forced text is not counted as a closer."""
    tok, vocab, constraints = setup
    c = constraints["call"]
    from structspec.automata.base import walk
    from structspec.spec.cost import AcceptanceModel
    from structspec.spec.forced import learn_closer

    text = '{"name":"get_weather","arguments":{"city":"Paris'
    out = tok.encode(text, add_special_tokens=False)
    inside = walk(c, out)
    ctx = _context(tok, vocab, c, [1], out)
    ctx.acceptance = AcceptanceModel()
    quote, comma_quote = vocab.ids_for(b'"')[0], vocab.ids_for(b'",')[0]
    ctx.history.extend([quote] * 6)  # the bare quote used most in this output
    opening = walk(c, tok.encode('{"name":"get_weather","arguments":{"city":',
                                 add_special_tokens=False))
    learn_closer(ctx, opening, c.advance(opening, quote), quote)  # opens a string: no
    assert ctx.acceptance.closers == {}
    learn_closer(ctx, inside, c.advance(inside, comma_quote), comma_quote)
    assert ctx.acceptance.closers == {comma_quote: 1.0}
    builder = TreeBuilder(c, out[-1], inside, max_depth=8, max_nodes=16, max_branches=1,
                          eos_ids=vocab.eos_token_ids)
    build_tree(ctx, builder, make_drafters(["closers"]))
    tree = builder.freeze()
    assert tree.tokens[tree.children[0][0]] == comma_quote


def test_extract_literals_reads_quoted_values_in_descriptions():
    text = ('Find the area. Schema: {"unit":{"type":"string","description":"The unit '
            '(defaults to \'units\' if it\'s not given)"}}')
    lits = extract_literals(text)
    assert "units" in lits
    assert not any("s not" in lit for lit in lits)
    # Sentence-initial words ("Find") come after other names; punctuation is left out.
    names = extract_literals('Find the flight of Air France. "a":[":["]')
    assert names.index("Air France") < names.index("Find")
    assert ":[" not in names


def test_choices_are_the_options_not_their_prefixes():
    from structspec.spec.drafters import choices
    from structspec.vocab import Vocabulary

    words = [b"", b"t", b"tr", b"true", b"f", b"fa", b"false", b"n", b"null", b"x"]
    vocab = Vocabulary.from_tokens(words, eos_token_ids=[0])
    allowed = list(range(9))  # EOS and the keyword pieces
    got = sorted(vocab.tokens[t] for t in choices(vocab, allowed, frozenset({0}), 8))
    assert got == [b"false", b"null", b"true"]
    assert choices(vocab, allowed, frozenset({0}), 2) == []  # three options: over the limit


def test_one_canonical_tokenizer_per_tokenizer_and_vocabulary(smollm_tokenizer, smollm_vocab):
    """Requests share the memo of forced texts' tokenizations (it depends on nothing else)."""
    canon = canonical_tokenizer(smollm_tokenizer, smollm_vocab)
    assert canonical_tokenizer(smollm_tokenizer, smollm_vocab) is canon
    ids = canon.tokens_after(b"{", b'"name": "')
    assert canonical_tokenizer(smollm_tokenizer, smollm_vocab).tokens_after(b"{", b'"name": "') \
        == ids == CanonicalTokenizer(smollm_tokenizer, smollm_vocab).tokens_after(b"{",
                                                                                  b'"name": "')
    other = Vocabulary.from_tokenizer(smollm_tokenizer)
    assert canonical_tokenizer(smollm_tokenizer, other) is not canon


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(list(' {}[]":,.\n\t_xyzAB019éü😀<|>\'')),
                   max_size=40) | st.text(max_size=40))
def test_the_backend_encodes_as_the_tokenizer_does(smollm_tokenizer, smollm_vocab, text):
    """Where the fast tokenizer's Rust backend stands in for ``tokenizer.encode`` (half the
    time per call), its ids are the tokenizer's for any text."""
    canon = CanonicalTokenizer(smollm_tokenizer, smollm_vocab)
    assert canon._backend is not None  # the default model's tokenizer has one that agrees
    assert canon.encode(text) == list(smollm_tokenizer.encode(text, add_special_tokens=False))


def test_a_tokenizer_whose_python_layer_changes_the_ids_keeps_its_own_encode(smollm_tokenizer,
                                                                             smollm_vocab):
    """A backend that disagrees with the tokenizer on the probes is not used."""

    class Lowering:
        _tokenizer = smollm_tokenizer._tokenizer

        def encode(self, text, add_special_tokens=False):
            return smollm_tokenizer.encode(text.lower(), add_special_tokens=add_special_tokens)

    canon = CanonicalTokenizer(Lowering(), smollm_vocab)
    assert canon._backend is None
    assert canon.encode("ABC") == list(smollm_tokenizer.encode("abc", add_special_tokens=False))
    slow = CanonicalTokenizer(type("Slow", (), {"encode": Lowering.encode})(), smollm_vocab)
    assert slow._backend is None
