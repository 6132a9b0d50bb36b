"""Speculative decoding end to end on a tiny random model with the real tokenizer: greedy is
token-identical to plain constrained greedy (same errors too), sampling is valid, seeded,
and follows the target distribution, stats add up."""

from __future__ import annotations

import math
import re
from typing import ClassVar

import pytest
from conftest import exact_pairs, fixed_drafter, run_decode, sampled_pairs_chi_square
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automata.regex import compile_regex
from structspec.engine import decode, free_text
from structspec.errors import GenerationError
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, SpecStats, speculative_decode
from structspec.spec.cost import AcceptanceModel
from structspec.spec.decode import certain_tokens
from structspec.spec.drafters import register_drafter
from structspec.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")

PATTERNS = {
    "call": (r'\{"name":"(get_weather|get_time)","arguments":\{"city":"[A-Za-z ]{1,12}",'
             r'"days":[0-9]{1,2}(,"unit":"(celsius|fahrenheit)")?\}\}'),
    "tag": r'\{"id":[0-9]{1,3},"tag":"(red|green|blue)","ok":(true|false)\}',
    "list": r'\[("(red|green|blue)",){0,3}"(red|green|blue)"\]',
    "digits": r"[0-9]{1,6}",
}
WORDS = ["weather", "in", "Paris", "for", "3", "days", "red", "green", "the", "id", "is", "42",
         "hello", "hello", "{", '"name"', ":", "blue", "tag", ","]
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def tiny(tiny_model):
    vocab = Vocabulary.from_tokenizer(tiny_model.tokenizer, eos_token_ids=tiny_model.eos_token_ids)
    constraints = {k: compile_regex(v, vocab) for k, v in PATTERNS.items()}
    constraints["free"] = free_text(vocab)
    return tiny_model.model, tiny_model.tokenizer, vocab, constraints


_run = run_decode


@pytest.fixture(scope="module")
def packed(tiny):
    """The tiny model on the fast CPU paths a ``Generator`` installs (packed linears, the
    row-exact attention kernel): a tree pass's rows are bitwise one-token steps' there,
    which sampled identity needs (an inverse-CDF pick on a near-flat distribution moves with
    the running sum's last bit)."""
    import copy

    from structspec.spec.cpu_paths import use_fast_cpu_paths

    model, tok, vocab, constraints = tiny
    return use_fast_cpu_paths(copy.deepcopy(model)), tok, vocab, constraints


#: A request and tree bounds, for the identity tests below.
REQUESTS = dict(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=12),
                name=st.sampled_from(sorted([*PATTERNS, "free"])),
                max_new=st.integers(1, 48),
                nodes=st.sampled_from([0, 4, 16]), depth=st.sampled_from([1, 4, 32]),
                adaptive=st.booleans())


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**REQUESTS)
def test_speculative_greedy_equals_plain_greedy(tiny, words, name, max_new, nodes, depth,
                                                 adaptive):
    model, tok, vocab, constraints = tiny
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    c = constraints[name]
    plain = _run(decode, model, vocab, prompt, c, max_new_tokens=max_new, sampling=GREEDY)
    cfg = SpecConfig(max_nodes=nodes, draft_length=depth, adaptive=adaptive, window=2)
    spec = _run(speculative_decode, model, vocab, prompt, c, max_new_tokens=max_new,
                sampling=GREEDY, config=cfg, tokenizer=tok)
    assert spec[:3] == plain[:3]
    if spec[3] is not None:
        stats = spec[3].stats
        assert isinstance(stats, SpecStats) and stats.new_tokens == len(spec[0])
        assert stats.forward_passes <= plain[3].stats.forward_passes


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**REQUESTS, seed=st.integers(0, 2**63),
       temperature=st.sampled_from([0.5, 1.0, 2.0]), top_k=st.sampled_from([None, 1, 3, 50]),
       top_p=st.sampled_from([None, 0.5, 0.95]))
def test_speculative_sampling_equals_plain_sampling_under_a_seed(packed, words, name, max_new,
                                                                 nodes, depth, adaptive, seed,
                                                                 temperature, top_k, top_p):
    """Each output position's token is the one its seeded number picks from the target's
    distribution, in both modes: the same tokens, whatever the trees were."""
    model, tok, vocab, constraints = packed
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    c = constraints[name]
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    plain = _run(decode, model, vocab, prompt, c, max_new_tokens=max_new, sampling=sampling)
    cfg = SpecConfig(max_nodes=nodes, draft_length=depth, adaptive=adaptive, window=2)
    spec = _run(speculative_decode, model, vocab, prompt, c, max_new_tokens=max_new,
                sampling=sampling, config=cfg, tokenizer=tok)
    assert spec[:3] == plain[:3]


def test_a_seed_gives_one_output_whatever_the_generator_learned(packed):
    """A learned acceptance model changes the trees from one request to the next; the
    sampled output of a seed stays the same (and is plain decoding's)."""
    model, tok, vocab, constraints = packed
    prompt = tok.encode("the id is 42 and the tag is red", add_special_tokens=False)
    sampling = SamplingParams(temperature=1.0, seed=11)
    habits = AcceptanceModel()
    plain = _run(decode, model, vocab, prompt, constraints["tag"], max_new_tokens=40,
                 sampling=sampling)
    for words in (["red", "blue"], ["hello"], ["the", "id", "is", "42"]):  # other requests
        other = tok.encode(" ".join(words), add_special_tokens=False)
        _run(speculative_decode, model, vocab, other, constraints["tag"], max_new_tokens=40,
             sampling=GREEDY, tokenizer=tok, acceptance=habits)
        again = _run(speculative_decode, model, vocab, prompt, constraints["tag"],
                     max_new_tokens=40, sampling=sampling, tokenizer=tok, acceptance=habits)
        assert again[:3] == plain[:3]


_HABITS = AcceptanceModel()  # learned across the examples below, as a Generator's requests do


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=12),
       name=st.sampled_from(["call", "tag", "list"]), max_new=st.integers(1, 48))
def test_learned_splits_never_change_the_output(tiny, words, name, max_new):
    """Tokenization habits learned over earlier requests (and the ``splits`` drafter that
    hedges from them) shape the trees, never the output; nor does the opt-in ``topk``."""
    model, tok, vocab, constraints = tiny
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    c = constraints[name]
    plain = _run(decode, model, vocab, prompt, c, max_new_tokens=max_new, sampling=GREEDY)
    cfg = SpecConfig(drafters=("splits", "values", "closers", "lookup", "alternatives", "topk"))
    spec = _run(speculative_decode, model, vocab, prompt, c, max_new_tokens=max_new,
                sampling=GREEDY, config=cfg, tokenizer=tok, acceptance=_HABITS)
    assert spec[:3] == plain[:3]


@pytest.mark.parametrize("name", ["call", "tag", "list", "free"])
def test_speculation_saves_passes_and_stats_add_up(tiny, name):
    model, tok, vocab, constraints = tiny
    prompt = tok.encode('hello hello {"name":"get_weather","arguments":{"city":"Paris"',
                        add_special_tokens=False)
    c = constraints[name]
    plain = decode(model, vocab, prompt, c, max_new_tokens=80, sampling=GREEDY)
    spec = speculative_decode(model, vocab, prompt, c, max_new_tokens=80, sampling=GREEDY,
                              tokenizer=tok)
    assert spec.token_ids == plain.token_ids
    s = spec.stats
    assert s.forward_passes < plain.stats.forward_passes
    assert s.steps == s.forward_passes  # the first pass also prefills
    # Each step commits its accepted drafts plus at most one bonus/EOS token; tokens the
    # constraint leaves no choice about are committed without a pass.
    drafted = s.accepted_tokens + s.certain_tokens
    assert drafted <= s.new_tokens <= drafted + s.steps
    assert sum(a for _, a in s.per_drafter.values()) == s.accepted_tokens
    assert all(a <= p for p, a in s.per_drafter.values())
    d = s.as_dict()
    assert d["tokens_per_pass"] > 1 and "acceptance_per_drafter" in d
    # Every pass after the prefill is timed, with its tree size and the cache it read.
    assert len(s.pass_log) == s.forward_passes - 1
    contexts = [ctx for _, ctx, _ in s.pass_log]
    assert contexts == sorted(set(contexts)) and contexts[0] >= len(prompt)
    assert all(nodes >= 1 and sec > 0 for nodes, _, sec in s.pass_log)
    by = d["pass_ms_by_nodes"]
    assert sum(n for n, _ in by.values()) == len(s.pass_log)
    assert set(by) == {nodes for nodes, _, _ in s.pass_log}
    # The time to the first token: set-up, then the prompt's pass (both decoders).
    for stats in (s, plain.stats):
        assert 0 < stats.setup_seconds < stats.prefill_seconds < stats.seconds
        assert stats.as_dict()["setup_seconds"] == round(stats.setup_seconds, 4)


def test_disabled_speculation_is_plain_decoding(tiny):
    model, tok, vocab, constraints = tiny
    prompt = tok.encode("the id is 42", add_special_tokens=False)
    c = constraints["tag"]
    plain = decode(model, vocab, prompt, c, max_new_tokens=40, sampling=GREEDY)
    off = speculative_decode(model, vocab, prompt, c, max_new_tokens=40, sampling=GREEDY,
                             config=SpecConfig(enabled=False), tokenizer=tok)
    assert off.token_ids == plain.token_ids
    assert off.stats.draft_nodes == 0
    assert off.stats.forward_passes == plain.stats.forward_passes


class _Oracle:
    """Drafts a decoy branch, then the known reference continuation (test only)."""

    name = "oracle_test"
    reference: ClassVar[list[int]] = []

    def propose(self, ctx, builder, frontier):
        done = ctx.history.tokens[ctx.prompt_len:]
        node, path = frontier, []
        while node > 0:
            path.append(builder.tokens[node])
            node = builder.parents[node]
        pos = len(done) + len(path)
        want = self.reference[pos:pos + builder.room(frontier)]
        if not want:
            return
        mask = ctx.constraint.allowed(builder.states[frontier])
        decoy = next((int(t) for t in mask.ids()[:50] if int(t) != want[0]
                      and int(t) not in builder.eos_ids), None)
        if decoy is not None:
            builder.add_branch(frontier, [decoy], "decoy")
        builder.add_branch(frontier, want, self.name)


register_drafter("oracle_test", _Oracle)


@pytest.mark.parametrize("name", ["call", "free"])
def test_deep_acceptance_off_the_first_branch(tiny, name):
    """Accepted paths that skip sibling nodes compact the cache correctly."""
    model, tok, vocab, constraints = tiny
    prompt = tok.encode("weather in Paris", add_special_tokens=False)
    c = constraints[name]
    plain = decode(model, vocab, prompt, c, max_new_tokens=40, sampling=GREEDY)
    _Oracle.reference = plain.token_ids
    cfg = SpecConfig(drafters=("oracle_test",), max_nodes=12, num_speculations=4, adaptive=False,
                     forced=False)
    spec = speculative_decode(model, vocab, prompt, c, max_new_tokens=40, sampling=GREEDY,
                              config=cfg, tokenizer=tok)
    assert spec.token_ids == plain.token_ids
    n = len(plain.token_ids)
    assert spec.stats.steps <= math.ceil(n / 11) + 1
    assert spec.stats.per_drafter["decoy"][1] == 0


def test_token_limit_raises_like_plain_decoding(tiny):
    model, tok, vocab, constraints = tiny
    prompt = tok.encode("the id is", add_special_tokens=False)
    for max_new in (1, 2, 5):
        with pytest.raises(GenerationError) as a:
            decode(model, vocab, prompt, constraints["tag"], max_new_tokens=max_new,
                   sampling=GREEDY)
        with pytest.raises(GenerationError) as b:
            speculative_decode(model, vocab, prompt, constraints["tag"], max_new_tokens=max_new,
                               sampling=GREEDY, tokenizer=tok)
        assert a.value.token_ids == b.value.token_ids and len(b.value.token_ids) == max_new
        assert str(a.value) == str(b.value)


def test_bad_arguments(tiny):
    model, _, vocab, constraints = tiny
    with pytest.raises(ValueError, match="prompt_ids"):
        speculative_decode(model, vocab, [], constraints["tag"], max_new_tokens=5,
                           sampling=GREEDY)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_decode(model, vocab, [1], constraints["tag"], max_new_tokens=0,
                           sampling=GREEDY)
    with pytest.raises(ValueError, match="validation_threshold"):
        SpecConfig(validation_threshold=1.5)
    with pytest.raises(ValueError, match="unknown drafters"):
        SpecConfig(drafters=("nope",))
    with pytest.raises(ValueError, match="drafters must be a sequence"):
        SpecConfig(drafters="lookup")
    with pytest.raises(ValueError, match="enabled must be true or false"):
        SpecConfig(enabled="no")
    with pytest.raises(ValueError, match="min_acceptance must be a number"):
        SpecConfig(min_acceptance="0.5")
    with pytest.raises(ValueError, match="max_nodes must be a non-negative integer"):
        SpecConfig(max_nodes=True)


@pytest.mark.parametrize("threshold", [None, 0.09])
def test_sampling_is_valid_and_reproducible(tiny, threshold):
    model, tok, vocab, constraints = tiny
    prompt = tok.encode("red green blue red", add_special_tokens=False)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=3)
    cfg = SpecConfig(validation_threshold=threshold)
    for name in ("tag", "list"):
        a = speculative_decode(model, vocab, prompt, constraints[name], max_new_tokens=60,
                               sampling=params, config=cfg, tokenizer=tok)
        b = speculative_decode(model, vocab, prompt, constraints[name], max_new_tokens=60,
                               sampling=params, config=cfg, tokenizer=tok)
        assert a.token_ids == b.token_ids
        assert re.fullmatch(PATTERNS[name], vocab.decode_text(a.token_ids))


def test_sampled_pairs_follow_the_target_distribution(tiny):
    """Two-token outputs under top-k=3: chi-square against exact probabilities."""
    model, tok, vocab, constraints = tiny
    c = constraints["free"]
    prompt = tok.encode("red green blue", add_special_tokens=False)
    exact = exact_pairs(model, prompt, c, SamplingParams(temperature=1.0, top_k=3))
    firsts = list(dict.fromkeys(a for a, _ in exact))
    likeliest = max((p, b) for (a, b), p in exact.items() if a == firsts[0])[1]
    # The likeliest first token with its likeliest follower, and the third first token.
    drafter = fixed_drafter([[firsts[0], likeliest], [firsts[2]]])
    cfg = SpecConfig(drafters=(drafter,), forced=False, adaptive=False)
    stat, counts, _ = sampled_pairs_chi_square(model, vocab, tok, prompt, c, cfg, exact, 800)
    assert stat < 36.0, (stat, counts, exact)  # chi-square, 8 df: P(X > 36) ≈ 2e-5


def test_json_schema_constraint_greedy_equals_plain(tiny):
    import structspec

    model, tok, vocab, _ = tiny
    schema = {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 8},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 0, "maximum": 14}},
            "required": ["city", "unit", "days"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False}
    c = structspec.compile_json_schema(schema, vocab)
    for text in ("weather in Paris for 3 days", "Lisbon 10 celsius"):
        prompt = tok.encode(text, add_special_tokens=False)
        plain = _run(decode, model, vocab, prompt, c, max_new_tokens=60, sampling=GREEDY)
        spec = _run(speculative_decode, model, vocab, prompt, c, max_new_tokens=60,
                    sampling=GREEDY, tokenizer=tok)
        assert spec[:3] == plain[:3]
        if spec[3] is not None:
            assert spec[3].stats.forward_passes < plain[3].stats.forward_passes


def test_certain_tokens_are_committed_without_a_pass(tiny):
    model, tok, vocab, _ = tiny
    c = compile_regex(r"a[0-9]b", vocab)
    assert certain_tokens(c, c.initial, 10) == list(vocab.ids_for(b"a"))
    assert certain_tokens(c, c.initial, 0) == []
    prompt = tok.encode("the id is", add_special_tokens=False)
    plain = decode(model, vocab, prompt, c, max_new_tokens=8, sampling=GREEDY)
    spec = speculative_decode(model, vocab, prompt, c, max_new_tokens=8, sampling=GREEDY,
                              tokenizer=tok)
    assert spec.token_ids == plain.token_ids and plain.stats.forward_passes == 3
    # "a" before the pass and "b" after the digit are certain: one pass chooses the digit.
    assert spec.stats.forward_passes == 1 and spec.stats.certain_tokens == 2
    off = speculative_decode(model, vocab, prompt, c, max_new_tokens=8, sampling=GREEDY,
                             config=SpecConfig(enabled=False), tokenizer=tok)
    assert off.stats.forward_passes == 3 and off.stats.certain_tokens == 0
