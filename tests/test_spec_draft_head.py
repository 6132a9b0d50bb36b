"""The learned draft head (:mod:`structspec.spec.draft_head`) on the tiny random model with the
real tokenizer: speculative greedy with the head is token-identical to plain constrained
greedy, every node it proposes is legal, a head file loads for its own model and is refused
with a typed error for another; and (real model) the shipped head loads for the default model
and keeps speculative == plain on a prose prompt."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import legal_prefix, random_draft_head, run_decode, tiny_llama
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automata.regex import compile_regex
from structspec.engine import decode, free_text
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec.canonical import CanonicalTokenizer
from structspec.spec.cost import CostCurve
from structspec.spec.draft_context import DraftContext
from structspec.spec.draft_head import (
    DraftHead,
    DraftHeadDrafter,
    DraftHeadMismatchError,
    DraftHeadNet,
    fingerprint,
    head_path,
    resolve_head,
    save_head,
)
from structspec.spec.ngram import NgramIndex
from structspec.spec.tree import TreeBuilder
from structspec.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")

PATTERNS = {
    "tag": r'\{"id":[0-9]{1,3},"tag":"(red|green|blue)","ok":(true|false)\}',
    "words": r"( ?[a-z]{1,8}){1,12}\.",
}
WORDS = ["weather", "in", "Paris", "for", "3", "days", "red", "the", "id", "is", "42", "hello",
         "{", '"name"', ":", "blue", "tag", ","]
GREEDY = SamplingParams()
FLAT = CostCurve((1, 64), (1.0, 1.0))  # every tree size costs the same: nothing is pruned


@pytest.fixture(scope="module")
def tiny(tiny_model):
    vocab = Vocabulary.from_tokenizer(tiny_model.tokenizer, eos_token_ids=tiny_model.eos_token_ids)
    constraints = {k: compile_regex(v, vocab) for k, v in PATTERNS.items()}
    constraints["free"] = free_text(vocab)
    return tiny_model.model, tiny_model.tokenizer, vocab, constraints, random_draft_head(
        tiny_model.model)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=10),
       name=st.sampled_from(sorted([*PATTERNS, "free"])), max_new=st.integers(1, 40),
       topk=st.sampled_from([1, 3]), only=st.booleans(), flat=st.booleans())
def test_greedy_with_the_draft_head_equals_plain_greedy(tiny, words, name, max_new, topk, only,
                                                        flat):
    model, tok, vocab, constraints, head = tiny
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    c = constraints[name]
    plain = run_decode(decode, model, vocab, prompt, c, max_new_tokens=max_new, sampling=GREEDY)
    cfg = SpecConfig(draft_head=head, draft_head_topk=topk, window=2, draft_head_min_prob=0.0,
                     drafters=("draft_head",) if only else SpecConfig().drafters,
                     cost_curve=FLAT if flat else None)
    spec = run_decode(speculative_decode, model, vocab, prompt, c, max_new_tokens=max_new,
                      sampling=GREEDY, config=cfg, tokenizer=tok)
    assert spec[:3] == plain[:3]
    if spec[3] is not None:
        assert spec[3].stats.draft_head == "tiny-random-head"


def test_the_head_drafts_and_its_nodes_are_counted(tiny):
    model, tok, vocab, constraints, head = tiny
    prompt = tok.encode("the id is 42 and the tag is red", add_special_tokens=False)
    cfg = SpecConfig(draft_head=head, drafters=("draft_head",), cost_curve=FLAT,
                     adaptive=False, max_nodes=8, draft_head_min_prob=0.0)
    out = speculative_decode(model, vocab, prompt, constraints["free"], max_new_tokens=1,
                             sampling=GREEDY, config=cfg, tokenizer=tok)
    assert out.stats.per_drafter.get("draft_head") is None  # first pass: no hidden state yet
    out = run_decode(speculative_decode, model, vocab, prompt, constraints["free"],
                     max_new_tokens=24, sampling=GREEDY, config=cfg, tokenizer=tok)[3]
    if out is not None:
        proposed, accepted = out.stats.per_drafter["draft_head"]
        assert proposed > 0 and 0 <= accepted <= proposed
        assert out.stats.as_dict()["draft_head"] == "tiny-random-head"


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.text(alphabet='{}"abcdeirgtnl:0123456789,', max_size=12),
       name=st.sampled_from(sorted(PATTERNS)), seed=st.integers(0, 2**16),
       topk=st.integers(1, 4))
def test_the_head_never_proposes_illegal_nodes(tiny, prefix, name, seed, topk):
    model, tok, vocab, constraints, head = tiny
    c = constraints[name]
    state, root = legal_prefix(c, tok, prefix)
    if not c.allowed(state).count():
        return
    g = torch.Generator().manual_seed(seed)
    ctx = DraftContext(constraint=c, vocab=vocab, canon=CanonicalTokenizer(tok, vocab),
                       history=NgramIndex(3), prompt_len=1,
                       options={"draft_head_topk": topk, "draft_head_branch_levels": 2,
                                "draft_head_min_prob": 0.0})
    ctx.history.extend([root])
    ctx.draft_head = head
    ctx.head_anchor = (torch.randn(model.config.hidden_size, generator=g), [root])
    builder = TreeBuilder(c, root, state, max_depth=8, max_nodes=16, max_branches=6,
                          eos_ids=frozenset(vocab.eos_token_ids))
    DraftHeadDrafter().propose(ctx, builder, 0)
    tree = builder.freeze()
    for i in range(1, len(tree)):
        parent_state = tree.states[tree.parents[i]]
        assert bool(c.allowed(parent_state).to_bool()[tree.tokens[i]])
        assert tree.tokens[i] not in vocab.eos_token_ids
        assert int(tree.tokens[i]) in set(head.vocab.tolist())


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("room", [1, 4, 9])
def test_the_head_drafts_its_likeliest_paths_scored_within_the_room(tiny, width, room):
    model, tok, vocab, constraints, head = tiny
    c = constraints["free"]
    root = tok.encode("x", add_special_tokens=False)[0]
    ctx = DraftContext(constraint=c, vocab=vocab, canon=CanonicalTokenizer(tok, vocab),
                       history=NgramIndex(3), prompt_len=1,
                       options={"draft_head_topk": width, "draft_head_min_prob": 0.0})
    ctx.history.extend([root])
    ctx.draft_head = head
    h = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(room))
    ctx.head_anchor = (h, [root])
    builder = TreeBuilder(c, root, c.advance(c.initial, root), max_depth=6, max_nodes=room,
                          max_branches=8, eos_ids=frozenset(vocab.eos_token_ids))
    DraftHeadDrafter().propose(ctx, builder, 0)
    tree = builder.freeze()
    # The head fills the room it is given (one path: as deep as draft_head_max_depth).
    assert len(tree) - 1 == (min(room, 6) if width == 1 else room)
    assert all(0.0 < tree.score(i) <= 1.0 for i in range(1, len(tree)))
    # Its greedy chain from the frontier is the main source; the rest are side branches.
    node, chain = 0, []
    while tree.children[node]:
        node = tree.children[node][0]
        chain.append(node)
    assert all(tree.sources[i] == "draft_head" for i in chain)
    assert all(tree.sources[i] == "draft_head_alt" for i in range(1, len(tree))
               if i not in chain)
    if width == 1:
        assert len(chain) == len(tree) - 1  # one path: a chain
    # Every node is at least as likely as any node the room left out below the same
    # parent would be: siblings are ordered by the head's probability.
    for kids in tree.children:
        scores = [tree.score(k) for k in kids]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("first", [0.0, 1.0])
def test_an_unsure_head_still_offers_its_first_level(tiny, first):
    """Below ``draft_head_min_prob`` the head expands nothing, but its first level (already
    computed) is offered down to ``draft_head_first_min_prob``; the plan prices it."""
    model, tok, vocab, constraints, head = tiny
    c = constraints["free"]
    root = tok.encode("x", add_special_tokens=False)[0]
    ctx = DraftContext(constraint=c, vocab=vocab, canon=CanonicalTokenizer(tok, vocab),
                       history=NgramIndex(3), prompt_len=1,
                       options={"draft_head_topk": 3, "draft_head_min_prob": 1.0,
                                "draft_head_first_min_prob": first})
    ctx.history.extend([root])
    ctx.draft_head = head
    h = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    ctx.head_anchor = (h, [root])
    builder = TreeBuilder(c, root, c.advance(c.initial, root), max_depth=6, max_nodes=9,
                          max_branches=8, eos_ids=frozenset(vocab.eos_token_ids))
    DraftHeadDrafter().propose(ctx, builder, 0)
    tree = builder.freeze()
    if first == 1.0:
        assert len(tree) == 1  # a random head is never sure
    else:
        assert len(tree) - 1 == 3 and set(tree.depths[1:]) == {1}
        assert tree.sources[1:].count("draft_head") == 1
    with pytest.raises(ValueError, match="draft_head_first_min_prob"):
        SpecConfig(draft_head_first_min_prob=1.5)


def test_a_head_file_loads_for_its_model_and_is_refused_by_another(tiny, tiny_model, tmp_path):
    model, tok, vocab, constraints, head = tiny
    path = tmp_path / "tiny.pt"
    save_head(path, head.net, head.vocab, fingerprint(model), name="tiny-random")
    loaded = DraftHead.load(path, model)
    s = torch.randn(2, model.config.hidden_size)
    ids = torch.tensor([5, 7])
    torch.testing.assert_close(loaded.step(s, ids), head.step(s, ids), atol=1e-2, rtol=1e-2)
    other = tiny_llama(tok, seed=3)
    with pytest.raises(DraftHeadMismatchError, match="trained for model 'tiny-random'"):
        DraftHead.load(path, other)
    with pytest.raises(DraftHeadMismatchError, match="bound to another model"):
        speculative_decode(other, vocab, [5, 6], constraints["free"], max_new_tokens=2,
                           sampling=GREEDY, config=SpecConfig(draft_head=head))
    with pytest.raises(DraftHeadMismatchError):
        speculative_decode(other, vocab, [5, 6], constraints["free"], max_new_tokens=2,
                           sampling=GREEDY, config=SpecConfig(draft_head=str(path)))
    bad = tmp_path / "bad.pt"
    torch.save({"hello": 1}, bad)
    with pytest.raises(DraftHeadMismatchError, match="not a structspec draft head"):
        DraftHead.load(bad, model)
    with pytest.raises(ValueError, match="draft_head must be"):
        SpecConfig(draft_head=3)


def test_a_head_reading_a_middle_layer_keeps_greedy_identical_and_round_trips(tiny,
                                                                            tmp_path):
    """A head whose first state also reads a decoder layer's output: the decoder hooks that
    layer, speculative greedy still equals plain greedy, and the layer it reads survives a
    save and load; a file that reads a layer the model lacks, or does not say which, is
    refused with the typed error."""
    model, tok, vocab, constraints, _ = tiny
    head = random_draft_head(model, seed=5, mid_layer=1)
    assert head.mid_layer == 1
    for words, name in (("the id is 42 and the tag is red", "free"), ("hello", "tag")):
        prompt = tok.encode(words, add_special_tokens=False)
        plain = run_decode(decode, model, vocab, prompt, constraints[name], max_new_tokens=24,
                           sampling=GREEDY)
        cfg = SpecConfig(draft_head=head, drafters=("draft_head",), cost_curve=FLAT,
                         draft_head_min_prob=0.0)
        spec = run_decode(speculative_decode, model, vocab, prompt, constraints[name],
                          max_new_tokens=24, sampling=GREEDY, config=cfg, tokenizer=tok)
        assert spec[:3] == plain[:3]
    h, m = torch.randn(2, model.config.hidden_size), torch.randn(2, model.config.hidden_size)
    assert not torch.equal(head.start(h, m), h)  # it reads the layer
    path = tmp_path / "mid.pt"
    save_head(path, head.net, head.vocab, fingerprint(model), name="tiny-mid",
              meta={"mid_layer": 1})
    loaded = DraftHead.load(path, model)
    assert loaded.mid_layer == 1
    torch.testing.assert_close(loaded.start(h, m), head.start(h, m), atol=1e-2, rtol=1e-2)
    for meta, match in (({"mid_layer": 99}, "decoder layer 99"), ({}, "does not say which")):
        save_head(path, head.net, head.vocab, fingerprint(model), name="tiny-mid", meta=meta)
        with pytest.raises(DraftHeadMismatchError, match=match):
            DraftHead.load(path, model)
    fresh = DraftHeadNet(model.config.hidden_size, 48, mid=True)  # starts as a head without
    torch.testing.assert_close(fresh.start(h, m), h)


def test_a_head_of_several_blocks_round_trips_and_keeps_greedy_identical(tiny, tmp_path):
    """A deeper head (``blocks=3``): its drafting step is the network's step, its file
    records the blocks and loads back, a one-block file (no ``blocks`` entry, as files
    before it) loads as one block, new blocks start as the identity, and greedy decoding
    with it is plain greedy."""
    model, tok, vocab, constraints, _ = tiny
    head = random_draft_head(model, seed=5, blocks=3)
    assert head.net.blocks == 3
    s = torch.randn(4, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([5, 7, 11, 13])
    with torch.inference_mode():
        torch.testing.assert_close(
            head.step(s, ids), head.net.step(s, head.embedding.weight[ids]), atol=1e-5,
            rtol=1e-5)
    path = tmp_path / "deep.pt"
    save_head(path, head.net, head.vocab, fingerprint(model), name="tiny-deep")
    loaded = DraftHead.load(path, model)
    assert loaded.net.blocks == 3
    # The file holds half-precision weights: the loaded head is the network with those
    # weights, bit for bit (its 8-bit panels may round a weight the other way than the
    # unrounded network's did, so against ``head`` only closeness of the weights holds).
    saved = torch.load(path, weights_only=True)["state"]
    rounded = DraftHeadNet(model.config.hidden_size, 48, blocks=3)
    rounded.load_state_dict({k: v.float() for k, v in saved.items()})
    original = {k.replace(".original.", "."): v for k, v in head.net.state_dict().items()}
    for name, value in rounded.state_dict().items():
        torch.testing.assert_close(value, original[name], atol=2e-3, rtol=2e-3)
    reference = DraftHead(rounded, head.vocab, model, name="tiny-deep-rounded")
    with torch.inference_mode():
        assert torch.equal(loaded.step(s, ids), reference.step(s, ids))
    one = random_draft_head(model, seed=6)
    save_head(path, one.net, one.vocab, fingerprint(model), name="tiny-one")
    blob = torch.load(path, weights_only=True)
    del blob["blocks"]
    torch.save(blob, path)
    assert DraftHead.load(path, model).net.blocks == 1
    for bad, match in [(0, "positive integer"), ("2", "positive integer"),
                       (2, "do not match its declared layout")]:
        torch.save({**blob, "blocks": bad}, tmp_path / "bad.pt")
        with pytest.raises(DraftHeadMismatchError, match=match):
            DraftHead.load(tmp_path / "bad.pt", model)
    grown = DraftHeadNet(model.config.hidden_size, 48, blocks=2)  # as train --init does
    missing, unexpected = grown.load_state_dict(
        {k: v.float() for k, v in blob["state"].items()}, strict=False)
    assert missing and not unexpected and all(k.startswith("extra.") for k in missing)
    plain_one = DraftHeadNet(model.config.hidden_size, 48)
    plain_one.load_state_dict({k: v.float() for k, v in blob["state"].items()})
    e = one.embedding.weight[ids]
    with torch.inference_mode():
        torch.testing.assert_close(grown.step(s, e), plain_one.step(s, e))
    with pytest.raises(ValueError, match="blocks"):
        DraftHeadNet(model.config.hidden_size, 48, blocks=0)
    prompt = tok.encode("the id is 42 and the tag is red", add_special_tokens=False)
    plain = run_decode(decode, model, vocab, prompt, constraints["free"], max_new_tokens=20,
                       sampling=GREEDY)
    cfg = SpecConfig(draft_head=head, drafters=("draft_head",), cost_curve=FLAT,
                     draft_head_min_prob=0.0)
    spec = run_decode(speculative_decode, model, vocab, prompt, constraints["free"],
                      max_new_tokens=20, sampling=GREEDY, config=cfg, tokenizer=tok)
    assert spec[:3] == plain[:3]


def test_auto_finds_no_head_for_a_random_model_and_off_switches_it_off(tiny):
    model, tok, vocab, constraints, _ = tiny
    prompt = tok.encode("hello the weather", add_special_tokens=False)
    for cfg in (SpecConfig(), SpecConfig(draft_head=False)):
        out = run_decode(speculative_decode, model, vocab, prompt, constraints["free"],
                         max_new_tokens=6, sampling=GREEDY, config=cfg, tokenizer=tok)[3]
        assert out is None or out.stats.draft_head is None


def _training_script():
    """``scripts/train_draft_head.py`` as a module (it is a script, not part of the package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "train_draft_head.py"
    spec = importlib.util.spec_from_file_location("train_draft_head", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_data_from_batched_generation_matches_a_plain_forward(tiny_model):
    """The states and labels the training script records during one left-padded batched
    ``generate`` equal what a single-row forward of each answered sequence computes."""
    from structspec.spec.draft_head import final_norm

    script = _training_script()
    model, tok = tiny_model.model, tiny_model.tokenizer
    eos = sorted(tiny_model.eos_token_ids)
    group = [tok.encode(t, add_special_tokens=False)
             for t in ("the weather in Paris", "hello", "red green blue tag id is 42")]
    rec = script.answer_records(model, final_norm(model), group, pad=eos[0], eos=eos,
                                max_new=12, mid=model.model.layers[0])
    assert rec["prompt_len"] == [len(g) for g in group]
    with torch.inference_mode():
        for ids, hidden, mid, labels, g in zip(rec["ids"], rec["hidden"], rec["mid"],
                                               rec["argmax"], group, strict=True):
            p = len(g)
            assert ids[:p].tolist() == g and len(ids) > p
            assert hidden.shape == mid.shape == (len(ids), model.config.hidden_size)
            out = model.model(input_ids=ids.long()[None], output_hidden_states=True)
            plain = out.last_hidden_state[0]  # [T, H]
            torch.testing.assert_close(hidden.float(), plain, atol=2e-2, rtol=1e-2)
            # hidden_states[1]: the first decoder layer's output
            torch.testing.assert_close(mid.float(), out.hidden_states[1][0], atol=2e-2,
                                       rtol=1e-2)
            choice = model.lm_head(plain).argmax(-1)  # [T]
            end = len(ids) - (1 if int(ids[-1]) in eos else 0)
            assert labels[p - 1:end].tolist() == choice[p - 1:end].tolist()
            assert labels[:end - 1].tolist() == ids[1:end].tolist()


def test_training_prompts_are_deterministic_and_avoid_benchmark_and_evaluation_prompts():
    script = _training_script()
    prompts = script.build_prompts(3000)
    assert prompts == script.build_prompts(3000)
    assert len(set(prompts)) == len(prompts) and 2900 <= len(prompts) <= 3000
    assert not set(prompts) & (set(script.benchmark_prose()) | set(script.EVAL_PROMPTS))


def test_code_prompts_are_deterministic_python_and_share_nothing_with_humaneval():
    import json
    from pathlib import Path

    script = _training_script()
    prompts = script.code_prompts(300, group=50)
    assert prompts == script.code_prompts(300, group=50)
    assert len(prompts) == 300 and len(set(prompts)) == 300
    for prompt in prompts:  # a documented def, cut at a line end
        assert "def " in prompt and prompt.endswith("\n") and len(prompt) <= 1600
        assert '"' in prompt or "'" in prompt  # its docstring
    humaneval = Path(__file__).resolve().parents[2] / "shared" / "data" / "code"
    files = sorted(humaneval.glob("*.jsonl")) if humaneval.is_dir() else []
    if not files:
        pytest.skip("../shared/data/code is absent: HumanEval overlap not checked")
    entry_points = {json.loads(line).get("entry_point") for line in
                    files[0].read_text().splitlines() if line.strip()}
    assert not any(f"def {name}(" in p for p in prompts for name in entry_points if name)


@pytest.mark.real_model
def test_the_shipped_head_loads_and_keeps_prose_identical():
    from structspec.api import Generator

    if not head_path("smollm2-135m-instruct").exists():
        pytest.skip("no shipped head")
    gen = Generator(None)
    ids = gen.prompt_ids("Describe a quiet library on a rainy afternoon.")
    c = free_text(gen.vocab)
    plain = decode(gen.loaded.model, gen.vocab, ids, c, max_new_tokens=40, sampling=GREEDY)
    spec = run_decode(speculative_decode, gen.loaded.model, gen.vocab, ids, c,
                      max_new_tokens=40, sampling=GREEDY, config=SpecConfig(),
                      tokenizer=gen.loaded.tokenizer)
    assert spec[0] == plain.token_ids
    assert spec[3] is None or spec[3].stats.draft_head == "smollm2-135m-instruct"
    off = speculative_decode(gen.loaded.model, gen.vocab, ids, c, max_new_tokens=40,
                             sampling=GREEDY, config=SpecConfig(draft_head=False),
                             tokenizer=gen.loaded.tokenizer)
    assert off.stats.draft_head is None and off.token_ids == plain.token_ids


def test_the_steps_layers_run_on_integer_panels_where_they_can_and_save_unrounded(tiny,
                                                                                  tmp_path):
    """Where the integer kernel runs, a head's step layers whose input width is a multiple
    of 32 run on 8-bit panels (``fc1`` here: 2 x 32 inputs), the others keep the float
    kernels (``fc2``: 48 inputs); the file saved from it holds the unrounded weights."""
    from structspec.spec import fastlinear as fl

    model, *_ = tiny
    head = random_draft_head(model, seed=9)
    if "panel_int8" not in fl.available_kernels(approx=True):
        pytest.skip("the integer kernel does not run here")
    fc1, fc2 = head.net.fc1, head.net.fc2
    assert isinstance(fc1, fl.PackedLinear) and fc1.int8
    assert not (isinstance(fc2, fl.PackedLinear) and fc2.int8)
    path = tmp_path / "rounded.pt"
    save_head(path, head.net, head.vocab, fingerprint(model), name="tiny-rounded")
    blob = torch.load(path, weights_only=True)
    assert torch.equal(blob["state"]["fc1.weight"], fc1.original.weight.half())
    assert not torch.equal(fc1.original.weight.half(),
                           torch.from_numpy(_q8(fc1.original.weight)).half())


@pytest.mark.parametrize("blocks", [1, 2])
def test_the_lean_step_gives_the_networks_bits(tiny, blocks):
    """Where every step layer runs on integer panels (an inner width that is a multiple of
    32), :meth:`DraftHead.step` takes its lean path: the same bits as the network's step
    through its modules, for token ids given as a tensor, a list or one id, and the same
    logits as the output layer's module."""
    from structspec.spec import fastlinear as fl

    model, *_ = tiny
    if "panel_int8" not in fl.available_kernels(approx=True):
        pytest.skip("the integer kernel does not run here")
    head = random_draft_head(model, seed=11, blocks=blocks, hidden_dim=64)
    assert head._lean is not None
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        for n in (1, 2, 5):
            s = torch.randn(n, model.config.hidden_size, generator=g) * 2
            ids = torch.randint(0, model.get_input_embeddings().weight.shape[0], (n,),
                                generator=g)
            want = head.net.step(s.clone(), head.embedding.weight[ids])
            e = head.embedding.weight[ids].float()
            assert torch.equal(head._torch_step(s.clone(), e), want)
            native, head._native_blocks = head._native_blocks, None
            assert torch.equal(head.step(s, ids), want)
            assert torch.equal(head.step(s, ids.tolist()), want)
            head._native_blocks = native
            assert torch.equal(head.logits(want), head.reduced.forward(want))
    lean, head._lean = head._lean, None  # the modules' path: the same numbers
    with torch.inference_mode():
        assert torch.equal(head.step(s, ids), want)
    head._lean = lean


@pytest.mark.parametrize("blocks", [1, 2])
def test_the_native_step_and_choices_match_torchs(tiny, blocks):
    """Where headstep runs, a step is one native call per block and a level's choices one
    call: the torch path's numbers to float rounding (a rounding of an 8-bit activation may
    flip: the head only ranks drafts), and the same choices, log-probabilities, order."""
    from structspec import _native

    model, *_ = tiny
    model = copy.deepcopy(model)  # its output rows exactly Q8_0, as the default model's are
    out = model.get_output_embeddings().weight
    with torch.no_grad():
        out.copy_(torch.from_numpy(_q8(out)))
    head = random_draft_head(model, seed=5, blocks=blocks, hidden_dim=64)
    if _native.runnable("headstep") is None or head._native_blocks is None:
        pytest.skip("the native head step does not run here")
    assert head._native_top is not None and len(head._native_blocks) == blocks
    g = torch.Generator().manual_seed(8)
    vr = len(head.vocab_ids)
    with torch.inference_mode():
        for n in (1, 3, 6):
            s = torch.randn(n, model.config.hidden_size, generator=g) * 3
            ids = torch.randint(0, model.get_input_embeddings().weight.shape[0], (n,),
                                generator=g)
            e = head.embedding.weight[ids].float()
            want = head._torch_step(s.clone(), e)
            got = head.step(s, ids.tolist())
            assert got.shape == want.shape
            assert (got - want).abs().max() <= 1e-2 * (want.abs().max() + 1)
            logp = torch.log_softmax(head.logits(got), -1)  # [n, Vr]
            for k in (1, 4, vr + 5):
                vals, idx = head.top(got, k)
                assert len(vals) == len(idx) == n
                for row in range(n):
                    assert len(idx[row]) == min(k, vr)
                    assert vals[row] == sorted(vals[row], reverse=True)
                    picked = logp[row, idx[row]]
                    assert torch.allclose(picked, torch.tensor(vals[row]), atol=1e-4)
                    kth = torch.topk(logp[row], min(k, vr)).values[-1]
                    assert float(picked.min()) >= float(kth) - 1e-4
        assert head.top(s[:0], 3) == ([], [])


def test_the_native_choices_break_ties_to_the_lower_id(tiny):
    """Two reduced-vocabulary entries with the same output row tie everywhere: the native
    choices list the lower index first, both with the same log-probability (torch's top-k
    leaves the order of ties unspecified; the head's drafts should not depend on it)."""
    from structspec import _native

    model, *_ = tiny
    model = copy.deepcopy(model)
    vocab = random_draft_head(model, seed=6, hidden_dim=64).vocab
    out = model.get_output_embeddings().weight
    direction = torch.randn(out.shape[1], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out[vocab[5]] = out[vocab[9]] = direction  # the same row twice
        out.copy_(torch.from_numpy(_q8(out)))
    head = random_draft_head(model, seed=6, hidden_dim=64)
    if _native.runnable("headstep") is None or head._native_top is None:
        pytest.skip("the native head choices do not run here")
    with torch.inference_mode():
        vals, idx = head.top((direction * 4)[None], 3)
    assert idx[0][:2] == [5, 9]
    assert vals[0][0] == vals[0][1] > vals[0][2]


def test_the_native_head_calls_refuse_bad_shapes():
    """headstep checks its shapes and says which (the caller's layers are its job)."""
    from structspec import _native

    hs = _native.runnable("headstep")
    if hs is None:
        pytest.skip("the native head step does not run here")
    with pytest.raises(ValueError, match="multiples of 32"):
        hs.step(0, 0, 1, 50, 0, 1e-6, 0, 64, 0, False, False, 0, 0, False, False, 0, 1)
    with pytest.raises(ValueError, match="k <= 64"):
        hs.top(0, 1, 64, 0, 100, False, False, 65, 1)


def _q8(weight: torch.Tensor):
    """``weight`` rounded to Q8_0 blocks (numpy, float32)."""
    from structspec.spec.block_quant import dequantize, quantize_q8_0

    return dequantize(quantize_q8_0(weight.detach().numpy()))


def test_a_head_file_is_loaded_once_per_model_until_it_changes(tiny, tmp_path):
    """``SpecConfig(draft_head=PATH)`` resolves to the same loaded head request after
    request (loading packs its layers), to a fresh one once the file changes on disk, and
    a missing file raises ``FileNotFoundError``."""
    import os

    model, *_ = tiny
    head = random_draft_head(model, seed=4)
    path = tmp_path / "cached.pt"
    save_head(path, head.net, head.vocab, fingerprint(model), name="tiny-cached")
    first = resolve_head(str(path), model)
    assert resolve_head(path, model) is first
    save_head(path, head.net, head.vocab, fingerprint(model), name="tiny-cached-2")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a later version
    second = resolve_head(str(path), model)
    assert second is not first and second.name == "tiny-cached-2"
    with pytest.raises(FileNotFoundError):
        resolve_head(str(tmp_path / "missing.pt"), model)
