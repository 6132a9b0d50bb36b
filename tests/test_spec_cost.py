"""Tree sizing from the device cost curve: the curve itself, the running acceptance per drafter
and depth, the expected-tokens-per-second plan, memory pressure, and end to end (outputs
unchanged, trees smaller where passes are dear). Injected curves keep it deterministic."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import load_benchmark

from structspec.automata.regex import compile_regex
from structspec.engine import decode, free_text
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec.cost import (
    DEFAULT_SIZES,
    AcceptanceModel,
    CostCurve,
    curve_sizes,
    device_cost_curve,
    free_nodes,
    measure_cost_curve,
    memory_use,
    node_floor,
    plan_first_tree,
    plan_tree,
)
from structspec.spec.schedule import Scheduler
from structspec.spec.tree import DraftTree
from structspec.vocab import Vocabulary

CPU_LIKE = CostCurve.from_relative({1: 1.0, 2: 1.15, 4: 1.23, 8: 1.52, 16: 1.62, 32: 2.19},
                                   t1=0.08)
STEEP = CostCurve.from_relative({1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0})  # every node costs a pass
FLAT = CostCurve((1, 64), (1.0, 1.0))
TAG = r'\{"id":[0-9]{1,3},"tag":"(red|green|blue)","ok":(true|false)\}'


def _tree(parents, sources, states=None):
    """A tree from parent indices (node 0 is the root)."""
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    n = len(parents)
    return DraftTree(tuple(range(n)), tuple(parents), tuple(depths),
                     tuple(states or [None] * n), ("root", *sources))


def test_cost_curve_interpolates_and_validates():
    c = CostCurve((1, 2, 8), (1.0, 2.0, 3.0))
    assert c(1) == 1.0 and c(0) == 1.0 and c(2) == 2.0
    assert c(5) == pytest.approx(2.5)
    assert c(14) == pytest.approx(4.0)  # the last slope, extended
    assert c.relative() == {1: 1.0, 2: 2.0, 8: 3.0}
    assert CPU_LIKE(16) == pytest.approx(0.08 * 1.62)
    assert set(CPU_LIKE.as_dict()) == {"ms", "relative"}
    with pytest.raises(ValueError):
        CostCurve((2, 1), (1.0, 1.0))
    with pytest.raises(ValueError):
        CostCurve((1,), (0.0,))
    with pytest.raises(ValueError):
        CostCurve((1,), (1.0,), per_token=(-1.0, 0.0))


def test_cost_curve_at_a_longer_context_adds_its_per_token_rates():
    c = CostCurve((1, 8), (1.0, 2.0), context=32, per_token=(0.001, 0.0005))
    assert c.at(32) is c and c.at(8) is c  # shorter contexts: as measured
    longer = c.at(132)
    assert longer.seconds == pytest.approx((1.0 + 100 * 0.0015, 2.0 + 100 * 0.005))
    assert longer.context == 132 and longer.per_token == c.per_token
    assert longer.at(132) is longer and longer.at(232).seconds == pytest.approx(
        c.at(232).seconds)
    d = c.as_dict()
    assert d["context"] == 32 and d["us_per_cached_token"] == {"pass": 1000.0, "node": 500.0}


def test_line_fit_keeps_both_rates_non_negative():
    from structspec.spec.cost import _line_fit

    assert _line_fit([(1, 3.0), (2, 5.0), (4, 9.0)]) == pytest.approx((1.0, 2.0))
    assert _line_fit([(1, 5.0), (2, 4.0), (4, 3.0)]) == pytest.approx((4.0, 0.0))  # falling
    assert _line_fit([(1, 0.5), (2, 2.0), (4, 5.0)])[0] == 0.0  # through the origin
    assert _line_fit([]) == (0.0, 0.0) and _line_fit([(3, 1.0)]) == (1.0, 0.0)


def test_plans_on_a_long_context_keep_fewer_nodes():
    """The same tree and statistics: priced on a long cache (each node attends to more
    keys), the plan keeps fewer speculative nodes."""
    curve = CostCurve.from_relative({1: 1.0, 4: 1.05, 8: 1.2, 16: 1.6}, t1=0.02)
    curve = CostCurve(curve.sizes, curve.seconds, context=32, per_token=(0.0, 2e-6))
    tree = _tree(list(range(-1, 15)), ["lookup"] * 15)
    kept = {}
    for context in (0, 400, 4000):
        s = Scheduler(16, 8, curve=curve, acceptance=AcceptanceModel(prior=0.8))
        kept[context] = len(s.plan(tree, 0, context=context)) - 1
    assert kept[0] >= kept[400] >= kept[4000] >= 0 and kept[0] > kept[4000]


@pytest.mark.usefixtures("one_thread")
def test_measured_curve_is_monotone_cached_and_cheap(tiny_model):
    import time

    model = tiny_model.model
    t0 = time.perf_counter()
    curve = measure_cost_curve(model, sizes=(1, 2, 4, 8), prefix_len=16, repeats=1)
    assert time.perf_counter() - t0 < 10
    assert curve.sizes == (1, 2, 4, 8)
    assert all(b >= a > 0 for a, b in zip(curve.seconds, curve.seconds[1:], strict=False))
    assert device_cost_curve(model) is device_cost_curve(model)  # once per model and device


@pytest.mark.usefixtures("one_thread")
def test_measured_curve_sizes_follow_the_packed_kernel(tiny_model):
    import copy

    from structspec.spec.fastlinear import (
        COST_STEPS,
        COST_STEPS_AVX512,
        available_kernels,
        avx512,
        cost_steps,
        pack_linears,
    )

    if "panel" not in available_kernels():
        pytest.skip("the panel kernel does not run here")
    model = copy.deepcopy(tiny_model.model)
    assert cost_steps(model) is None
    pack_linears(model, "panel")
    steps = (COST_STEPS_AVX512 if avx512() else COST_STEPS)["panel"]
    assert cost_steps(model) == steps
    curve = measure_cost_curve(model, prefix_len=8, repeats=1, max_repeats=1)
    assert curve.sizes == curve_sizes(steps)


def test_free_nodes_are_those_a_pass_of_the_root_alone_pays_for():
    assert free_nodes(CostCurve((1, 2, 4, 8), (1.0, 1.0, 1.04, 1.3))) == 3
    assert free_nodes(STEEP) == 0
    assert free_nodes(FLAT) == 63


def test_acceptance_model_is_conditional_per_drafter_and_depth():
    m = AcceptanceModel(prior=0.5, strength=2.0, decay=1.0, fade=1.0)
    assert m.rate("lookup", 1) == 0.5 and m.rate("lookup", 3) == 0.5
    # root -> 1 (forced chain) -> {2 lookup -> 3 lookup, 4 topk}
    tree = _tree([-1, 0, 1, 2, 1], ["forced", "lookup", "lookup", "topk"])
    for _ in range(8):
        m.record(tree, (0, 1, 2, 3), frontier_depth=1)
    assert m.rate("lookup", 1) > 0.85 and m.rate("lookup", 2) > 0.85
    assert m.rate("topk", 1) < 0.15
    assert m.chain_rate() > 0.9
    # A node whose parent was rejected teaches nothing.
    m.record(tree, (0, 1, 4), frontier_depth=1)
    assert m.counts[("lookup", 2)][0] == 8
    probs = m.node_probabilities(tree, 1)
    assert probs[0] == 1.0 and probs[3] <= probs[2] <= probs[1] <= 1.0
    assert probs[3] == pytest.approx(probs[2] * m.rate("lookup", 2))
    # Unseen depths fall back on the depth above.
    assert m.rate("lookup", 5) == pytest.approx(m.rate("lookup", 2))


def test_scored_nodes_are_estimated_from_their_calibrated_scores():
    m = AcceptanceModel(prior=0.5, strength=2.0, decay=1.0, fade=1.0)
    # root -> 1 (forced chain) -> {2 head (0.8) -> 3 head (0.5), 4 lookup (unscored)}
    tree = _tree([-1, 0, 1, 2, 1], ["forced", "head", "head", "lookup"])
    tree = DraftTree(tree.tokens, tree.parents, tree.depths, tree.states, tree.sources,
                     (float("nan"), float("nan"), 0.8, 0.5, float("nan")))
    assert m.score_factor() == 1.0
    probs = m.node_probabilities(tree, 1)
    assert probs[2] == pytest.approx(probs[1] * 0.8)
    assert probs[3] == pytest.approx(probs[2] * 0.5)
    assert probs[4] == pytest.approx(probs[1] * m.rate("lookup", 1))
    # The head proves worse than its scores: its estimates shrink (never below 1/4).
    for _ in range(20):
        m.record(tree, (0, 1), frontier_depth=1)
    assert m.scored[0] == pytest.approx(20 * 0.8) and m.scored[1] == 0
    assert m.score_factor() == 0.25
    assert m.node_probabilities(tree, 1)[2] == pytest.approx(m.chain_rate() * 0.8 * 0.25)
    # ... and better: they grow (never beyond 2, a node never beyond certainty).
    for _ in range(60):
        m.record(tree, (0, 1, 2, 3), frontier_depth=1)
    assert 1.0 < m.score_factor() <= 2.0
    assert max(m.node_probabilities(tree, 1)) <= 1.0


def test_a_drafter_keeps_its_record_while_it_sits_out():
    """Counts fade fast only in steps that observe them: a drafter that missed 40 times
    still looks bad after 100 steps in which only others drafted (before, every count
    faded every step and it was back near the prior), and drifts back toward the prior
    over a few hundred, so it gets tried again."""
    m = AcceptanceModel(prior=0.5, strength=2.0, decay=0.97, fade=0.995)
    junk = _tree([-1, 0], ["closers"])
    head = _tree([-1, 0], ["draft_head"])
    for _ in range(40):
        m.record(junk, (0,), frontier_depth=0)
    assert m.rate("closers", 1) < 0.05
    for _ in range(100):
        m.record(head, (0, 1), frontier_depth=0)
    assert m.rate("closers", 1) < 0.08
    assert m.rate("draft_head", 1) > 0.9
    for _ in range(600):
        m.record(head, (0, 1), frontier_depth=0)
    assert m.rate("closers", 1) > 0.3


def test_dropped_nodes_teach_the_acceptance_model():
    """The model's choice after the accepted path is known, so a node the plan dropped
    whose parent was accepted has an outcome: fed the tree as drafted, the statistics learn
    that the dropped ``closers`` guess was the model's choice and the kept ``lookup`` one
    was not; fed the verified tree alone they could never learn the first."""
    built = _tree([-1, 0, 0], ["lookup", "closers"])  # tokens are node indices
    kept = built.subtree([1])
    s = Scheduler(16, 8, curve=FLAT, acceptance=AcceptanceModel(prior=0.5))
    blind = AcceptanceModel(prior=0.5)
    for _ in range(30):
        s.record_tree(kept, (0,), 0, built=built, next_token=2)
        blind.record(kept, (0,), 0)
    assert s.acceptance.rate("closers", 1) > 0.9 > 0.1 > s.acceptance.rate("lookup", 1)
    assert blind.rate("closers", 1) == 0.5 and blind.rate("lookup", 1) < 0.1
    # An accepted path maps onto the drafted tree by its tokens.
    built = _tree([-1, 0, 0, 2, 2], ["lookup", "values", "forced", "closers"])
    kept = built.subtree([2, 4])  # nodes 0, 2, 4 -> 0, 1, 2
    s = Scheduler(16, 8, curve=FLAT, acceptance=AcceptanceModel(prior=0.5))
    for _ in range(30):
        s.record_tree(kept, (0, 1, 2), 0, built=built, next_token=None)
    assert s.acceptance.rate("values", 1) > 0.9 and s.acceptance.rate("closers", 2) > 0.9
    assert s.acceptance.rate("lookup", 1) < 0.1 and s.acceptance.rate("forced", 2) < 0.1
    other = _tree([-1, 0], ["lookup"])  # not drafted from ``built``: refused, by name
    other = DraftTree((0, 7), other.parents, other.depths, other.states, other.sources)
    with pytest.raises(ValueError, match="leaves the drafted tree"):
        s.record_tree(other, (0, 1), 0, built=built)


def test_plan_keeps_what_pays_for_its_cost():
    # root, then a chain of 4 speculative nodes and 4 unlikely single-node branches.
    parents = [-1, 0, 1, 2, 3, 0, 0, 0, 0]
    tree = _tree(parents, ["lookup"] * 8)
    probs = [1.0, 0.9, 0.8, 0.7, 0.6, 0.05, 0.04, 0.03, 0.02]
    flat = plan_tree(tree, 0, probs, FLAT)
    assert flat.keep == tuple(range(1, 9))
    steep = plan_tree(tree, 0, probs, STEEP)
    # On a device where each node costs a whole pass, only near-certain nodes could pay,
    # and none of these do: (1 + 0.9) / 2 < 1 / 1.
    assert steep.keep == ()
    cpu = plan_tree(tree, 0, probs, CPU_LIKE)
    assert set(cpu.keep) >= {1, 2, 3, 4} and not set(cpu.keep) & {7, 8}
    for plan in (flat, steep, cpu):  # ancestor-closed
        assert all(parents[i] == 0 or parents[i] in plan.keep for i in plan.keep)
    assert cpu.expected_tokens == pytest.approx(1 + sum(probs[i] for i in cpu.keep))


def test_plan_floor_prices_every_node_over_a_flat_stretch():
    """A flat stretch of the measured curve (a kernel's block, or noise the curve's
    monotone rule flattened) makes any node look free; the floor prices each at half the
    curve's mean cost per node, so guesses that are almost never accepted stay out while
    likely ones stay in."""
    curve = CostCurve((1, 2, 8, 16), (1.0, 1.17, 1.17, 2.15))
    floor = node_floor(curve)
    assert floor == pytest.approx(0.5 * 1.15 / 15)
    assert node_floor(CostCurve((1,), (1.0,))) == 0.0
    # root -> a likely head chain of two, then two junk branches off the root (closers,
    # values in free text), and a fair side branch.
    tree = _tree([-1, 0, 1, 0, 0, 0], ["draft_head", "draft_head", "closers", "values",
                                        "draft_head_alt"])
    probs = [1.0, 0.45, 0.2, 0.02, 0.01, 0.15]
    free = plan_tree(tree, 0, probs, curve)
    assert set(free.keep) == {1, 2, 3, 4, 5}  # 2 -> 8 nodes cost nothing: all kept
    priced = plan_tree(tree, 0, probs, curve, floor=floor)
    assert set(priced.keep) == {1, 2, 5}
    assert priced.seconds >= curve(4) and priced.seconds == pytest.approx(
        max(curve(4), curve(2) + 2 * floor))


def test_curve_sizes_bracket_the_kernels_cost_steps():
    assert curve_sizes(None) == DEFAULT_SIZES  # blocking unknown (oneDNN, unpacked, GPU)
    sizes = curve_sizes(((6, 7), (12, 14), (18, 20)))  # the panel kernel
    assert {6, 7, 8, 12, 14, 15, 18, 20, 21} | set(DEFAULT_SIZES) <= set(sizes)
    assert sizes[0] == 1 and sizes[-1] == 32 and list(sizes) == sorted(set(sizes))
    assert curve_sizes(((16, 16),)) == (1, 2, 4, 8, 16, 17, 24, 32)


def test_plan_stops_short_of_a_new_row_block():
    # Blocks of 6 rows: a 7th row costs a block; 6 cost what one does, nearly.
    stairs = CostCurve((1, 2, 4, 6, 7, 8, 12, 13, 16, 18, 19, 24, 32),
                       (1.0, 1.0, 1.02, 1.12, 1.31, 1.33, 1.53, 1.71, 1.85, 1.99, 2.23, 2.33, 3.02))
    coarse = CostCurve(DEFAULT_SIZES, tuple(stairs(q) for q in DEFAULT_SIZES))
    tree = _tree([-1, 0, 1, 2, 3, 4, 5], ["lookup"] * 6)  # root + a chain of 6
    probs = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.45]
    # Seen through 1, 2, 4, 8, 16, 32, a 7th row looks cheap (1.19 -> 1.27) and is kept;
    # the staircase prices it at a block (1.12 -> 1.31) and the plan stops at 6 rows.
    assert len(plan_tree(tree, 0, probs, coarse).keep) == 6
    assert len(plan_tree(tree, 0, probs, stairs).keep) == 5


def test_scheduler_plan_prunes():
    s = Scheduler(16, 8, curve=STEEP, acceptance=AcceptanceModel(prior=0.3))
    tree = _tree([-1, 0, 1, 2, 0], ["forced", "lookup", "lookup", "topk"])
    assert s.budget().nodes == 16
    kept = s.plan(tree, frontier_depth=1)
    assert len(kept) == 2 and kept.tokens == (0, 1)  # root + the forced chain
    assert s.planned == [0]
    assert s.plan(tree, 1, keep_all=True) is tree  # the prefill pass keeps everything
    cheap = Scheduler(16, 8, curve=FLAT)
    assert cheap.plan(tree, 1) is tree
    assert Scheduler(16, 8).plan(tree, 1) is tree  # no curve: no plan


def test_the_first_tree_keeps_the_nodes_whose_rows_pay():
    """A request's first tree rides on the prompt's prefill: a node costs a row (the curve's
    mean cost per node) and stays where its estimate times a token's worth (half a one-node
    pass) covers it; the forced chain always stays, and what is kept is ancestor-closed."""
    curve = CostCurve((1, 33), (1.0, 3.0))  # a row: 1/16 of a one-node pass
    tree = _tree([-1, 0, 1, 2, 1, 4, 1], ["forced", "values", "values", "values_alt",
                                          "values_alt", "lookup"])
    # threshold: p * 0.5 >= 0.0625, i.e. p >= 0.125
    probs = [1.0, 0.9, 0.6, 0.3, 0.1, 0.05, 0.2]
    plan = plan_first_tree(tree, 1, probs, curve)
    assert plan.keep == (2, 3, 6)
    assert plan_first_tree(tree, 1, probs, CostCurve((1,), (1.0,))).keep == (2, 3, 4, 5, 6)
    s = Scheduler(16, 8, curve=curve, acceptance=AcceptanceModel(prior=0.3))
    kept = s.plan(tree, 1, first=True)  # one below the frontier 0.27, two below 0.08
    assert kept.tokens == (0, 1, 2, 4, 6) and s.planned == [3]
    assert s.plan(tree, 1, keep_all=True) is tree


def test_first_trees_teach_their_own_rates():
    """What the drafters' nodes one below the frontier of first trees did is learned apart
    (:meth:`AcceptanceModel.start_rate`, from the depth-1 rate as its prior), from the tree
    as drafted, the model's next token included; the later passes' rates learn as before."""
    acc = AcceptanceModel(prior=0.5)
    tree = _tree([-1, 0, 1, 1, 2], ["forced", "lookup", "values", "lookup"])
    assert acc.start_rate("lookup") == acc.rate("lookup", 1) == 0.5
    for _ in range(6):  # the model took neither first-pass guess
        acc.record_start(tree, (0, 1), 1, next_token=99)
    assert acc.start_rate("lookup") < 0.15 and acc.start_rate("values") < 0.15
    assert acc.start_rate("closers") == acc.rate("closers", 1)
    acc.record_start(tree, (0, 1, 3), 1, next_token=99)  # values accepted: it climbs back
    assert acc.start_rate("values") > acc.start_rate("lookup")
    hit = AcceptanceModel()
    hit.record_start(tree, (0, 1), 1, next_token=2)  # node 2 holds token 2: a hit
    assert hit.start_rate("lookup") > 0.5
    probs = hit.node_probabilities(tree, 1, first=True)
    assert probs[2] == pytest.approx(hit.chain_rate() * hit.start_rate("lookup"))
    assert hit.node_probabilities(tree, 1)[2] == pytest.approx(
        hit.chain_rate() * hit.rate("lookup", 1))
    s = Scheduler(16, 8, curve=STEEP, acceptance=acc)
    s.record_tree(tree, (0, 1), 1, next_token=99)  # a later pass: no start record
    assert acc.start["lookup"][0] == pytest.approx(sum(0.97 ** k for k in range(7)), rel=0.05)


def test_memory_pressure_halves_the_budget():
    use = [0.5]
    s = Scheduler(16, 8, memory_probe=lambda: use[0], memory_threshold=0.9, memory_every=1)
    b = s.budget()
    assert (b.nodes, b.branches) == (16, 8)
    use[0] = 0.95
    b = s.budget()
    assert (b.nodes, b.branches) == (8, 4) and s.pressure_steps == 1
    use[0] = None  # unreadable: no pressure
    assert s.budget().nodes == 16
    value = memory_use("cpu")
    assert value is None or 0.0 <= value <= 1.0


@pytest.fixture(scope="module")
def tiny(tiny_model):
    vocab = Vocabulary.from_tokenizer(tiny_model.tokenizer, eos_token_ids=tiny_model.eos_token_ids)
    return tiny_model.model, tiny_model.tokenizer, vocab


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("curve", [STEEP, CPU_LIKE, FLAT, None])
def test_planned_trees_keep_outputs_identical(tiny, curve):
    model, tok, vocab = tiny
    prompt = tok.encode('the id is 42 {"id":42,"tag":"red" and red red', add_special_tokens=False)
    for c in (compile_regex(TAG, vocab), free_text(vocab)):
        plain = decode(model, vocab, prompt, c, max_new_tokens=40, sampling=SamplingParams())
        cfg = SpecConfig(cost_curve=curve, cost_model=curve is not None)
        out = speculative_decode(model, vocab, prompt, c, max_new_tokens=40,
                                 sampling=SamplingParams(), config=cfg, tokenizer=tok)
        assert out.token_ids == plain.token_ids
        s = out.stats
        assert len(s.planned) == s.steps == len(s.budgets)
        assert all(p <= b or i == 0 for i, (p, b) in enumerate(zip(s.planned, s.budgets,
                                                                   strict=True)))
        d = s.as_dict()
        assert (d["cost_curve"] is None) == (curve is None)
        assert set(d["time_split"]) == {"draft", "verify", "mask", "other"}
        assert len(d["acceptance_per_depth"]) == len(s.per_depth)


def test_auto_budgets_structured_vs_free_text(tiny):
    model, tok, vocab = tiny
    prompt = tok.encode("the id is 42", add_special_tokens=False)
    cfg = SpecConfig(cost_model=False, adaptive=False)
    assert cfg.budgets(True) == (16, 8) and cfg.budgets(False) == (8, 4)
    assert SpecConfig(max_nodes=5, num_speculations=3).budgets(False) == (5, 3)
    with torch.inference_mode():
        tag = speculative_decode(model, vocab, prompt, compile_regex(TAG, vocab),
                                 max_new_tokens=40, sampling=SamplingParams(), config=cfg,
                                 tokenizer=tok)
        free = speculative_decode(model, vocab, prompt, free_text(vocab), max_new_tokens=5,
                                  sampling=SamplingParams(), config=cfg, tokenizer=tok)
    assert tag.stats.budgets[0] == 16 and free.stats.budgets[0] == 8


def _scripted_passes(monkeypatch, seconds):
    """Stand a scripted clock in for ``measure_cost_curve``'s passes: each pass advances it
    by ``seconds(tree, past_len)``."""
    from structspec.spec import cost

    now = [0.0]

    def fake_verify(model, cache, tree, past_len, prefix=None):
        now[0] += seconds(tree, past_len)

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            return now[0]

    monkeypatch.setattr(cost, "verify_tree", fake_verify)
    monkeypatch.setattr(cost, "rollback", lambda cache, past_len: None)
    monkeypatch.setattr(cost, "time", Clock)


def test_measured_curve_is_the_median_shape_of_its_rounds(monkeypatch, tiny_model):
    """Each size's cost is its time over the mean of the one-node passes just before and
    after it, the median over rounds, times the median one-node pass: a machine that slows
    down between rounds, a stalled pass of some size, or a stalled one-node pass (the
    yardstick itself) does not bend the curve (a scripted clock stands in for the passes)."""

    shape = {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8}
    factors = [1.0, 1.3, 1.1, 1.2]  # the machine's speed, round by round
    script = [0.5, 0.5, 0.5]  # the warm-up round: 1, 2 and 8 nodes
    for f in factors:  # 1, 2, 1, 4, 1, 8, 1
        script += [0.01 * f]
        for q in (2, 4, 8):
            script += [0.01 * shape[q] * f, 0.01 * f]
    script[3 + 5] *= 2  # a stall: the first round's 8-node pass
    script[3 + 7 + 2] *= 3  # another: the second round's one-node pass after 2 nodes
    calls = iter(script)
    _scripted_passes(monkeypatch, lambda tree, past_len: next(calls))
    curve = measure_cost_curve(tiny_model.model, sizes=(1, 2, 4, 8), prefix_len=4,
                               long_prefix=None, repeats=4, max_repeats=4,
                               budget_seconds=100.0)
    assert next(calls, None) is None  # every scripted pass ran, no more
    assert curve.seconds[0] == pytest.approx(0.0115)  # the median one-node pass
    assert curve.relative() == pytest.approx(shape)
    assert curve.per_token == (0.0, 0.0) and curve.at(10_000) is curve


def test_measured_curve_prices_the_cached_context(monkeypatch, tiny_model):
    """The per-token rates come from the same sizes on a second, longer cache: a scripted
    clock whose passes cost ``t(q) + context * (a + b * q)`` gives back ``a`` and ``b``, and
    the curve at another context predicts the script's time there."""

    a, b = 2e-5, 4e-6
    seen = set()

    def seconds(tree, past_len):
        q = len(tree)  # a chain of q nodes, the first in the root's place
        seen.add(past_len)
        return 0.01 + 0.002 * q + past_len * (a + b * q)

    _scripted_passes(monkeypatch, seconds)
    curve = measure_cost_curve(tiny_model.model, sizes=(1, 2, 4, 8, 12), prefix_len=16,
                               long_prefix=200, repeats=2, max_repeats=2,
                               budget_seconds=100.0)
    assert seen == {16, 200}
    assert curve.context == 16
    assert curve.per_token == pytest.approx((a, b))
    at = curve.at(500)
    for q in (1, 4, 12):
        assert at(q) == pytest.approx(0.01 + 0.002 * q + 500 * (a + b * q))
    # A model that cannot take the second context (positions its config does not name):
    # the curve is measured without it.
    real_forward = type(tiny_model.model).forward

    def short_model(self, input_ids=None, **kw):
        if input_ids is not None and input_ids.shape[-1] > 64:
            raise IndexError("index out of range in self")
        return real_forward(self, input_ids=input_ids, **kw)

    monkeypatch.setattr(type(tiny_model.model), "forward", short_model)
    seen.clear()
    plain = measure_cost_curve(tiny_model.model, sizes=(1, 2), prefix_len=16, long_prefix=200,
                               repeats=1, max_repeats=1)
    assert plain.per_token == (0.0, 0.0) and plain.context == 0 and 200 not in seen
    monkeypatch.setattr(type(tiny_model.model), "forward", real_forward)
    # Too short a second context to tell a rate from noise: none is measured.
    short = measure_cost_curve(tiny_model.model, sizes=(1, 2), prefix_len=16, long_prefix=20,
                               repeats=1, max_repeats=1)
    assert short.per_token == (0.0, 0.0) and short.context == 0


def test_measured_curves_are_kept_on_disk(monkeypatch, tmp_path, tiny_model):
    from structspec.spec import cost

    monkeypatch.setenv("STRUCTSPEC_COMPILE_CACHE", str(tmp_path / "compiled"))
    calls = []
    real = cost.measure_cost_curve

    def counted(model, **kw):
        calls.append(1)
        return real(model, sizes=(1, 2), repeats=1, max_repeats=1)

    monkeypatch.setattr(cost, "measure_cost_curve", counted)
    model = tiny_model.model
    cost._CURVES.pop(model, None)
    first = cost.device_cost_curve(model)
    cost._CURVES.pop(model, None)  # a new process, as it were
    second = cost.device_cost_curve(model)
    assert len(calls) == 1 and second == first
    assert (tmp_path / "cost_curves.json").exists()
    cost._CURVES.pop(model, None)


def test_the_benchmark_holds_loop_passes_against_the_curve():
    """``benchmarks/speculative.py``'s ``loop_pass_costs``: passes timed in the decode loop,
    per tree size, against the start-up curve's price at each pass's context."""
    bench = load_benchmark("speculative.py")
    curve = CostCurve((1, 8), (0.020, 0.030), context=100, per_token=(1e-4, 0.0))
    log = [(1, 100, 0.022), (1, 100, 0.018), (1, 200, 0.021), (8, 200, 0.048), (8, 100, 0.036)]
    out = bench.loop_pass_costs(log, curve)
    assert list(out) == [1, 8]
    assert out[1][:2] == [3, 21.0]  # passes, median ms
    # time / price: 1 node 1.1, 0.9, 0.7 (a 30-ms price at 200 cached tokens) -> 0.9
    assert out[1][2] == pytest.approx(0.9) and out[1][3] == pytest.approx(1.0)
    # 8 nodes: 48 / 40 = 1.2 and 36 / 30 = 1.2 -> 1.2, i.e. 1.333 relative to one node's
    assert out[8][2] == pytest.approx(1.2) and out[8][3] == pytest.approx(1.333, abs=1e-3)
    assert bench.loop_pass_costs([(8, 100, 0.03)], curve) == {8: [1, 30.0, 1.0, None]}


def test_the_benchmark_sizes_trees_by_a_stored_cost_curve(tmp_path):
    """``benchmarks/speculative.py --cost-curve FILE``: the curve another run recorded (a GPU
    run's, say) is read back as that run's plan priced it; a file without one is refused
    with a message naming it."""
    bench = load_benchmark("speculative.py")
    curve = CostCurve((1, 4, 16), (0.020, 0.022, 0.030), context=32, per_token=(9e-6, 1e-6))
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"summary": {}, "cost_curve": curve.as_dict()}))
    got = bench.stored_curve(run)
    assert got.sizes == curve.sizes and got.context == 32
    assert got.seconds == pytest.approx(curve.seconds)
    assert got.per_token == pytest.approx(curve.per_token)
    flat = tmp_path / "flat.json"  # a curve measured without per-token rates (a GPU's)
    flat.write_text(json.dumps({"cost_curve": {"ms": {"1": 17.5, "32": 17.5},
                                               "relative": {"1": 1.0, "32": 1.0}}}))
    assert bench.stored_curve(flat) == CostCurve((1, 32), (0.0175, 0.0175))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary": {}}))
    with pytest.raises(SystemExit, match="bad.json"):
        bench.stored_curve(bad)


def test_the_benchmark_offsets_code_tasks_by_function():
    """``benchmarks/speculative.py --task code --offset K``: the infilling file holds several
    rows per function; a task is a function's first row, and the offset skips functions, so
    held-out tasks share no function with the first ones."""
    bench = load_benchmark("speculative.py")
    rows = [{"task_id": f"SingleLineInfilling/HumanEval/{f}/L{line}"}
            for f in range(4) for line in range(3)]
    first = bench.code_rows(rows, 0, 2)
    assert [r["task_id"] for _, r in first] == ["SingleLineInfilling/HumanEval/0/L0",
                                                "SingleLineInfilling/HumanEval/1/L0"]
    held = bench.code_rows(rows, 2, 10)
    assert [i for i, _ in held] == [6, 9]
    assert [r["task_id"] for _, r in held] == ["SingleLineInfilling/HumanEval/2/L0",
                                               "SingleLineInfilling/HumanEval/3/L0"]
    assert bench.code_rows(rows, 4, 10) == []


def test_the_benchmark_leaves_out_schemas_it_cannot_compile_and_says_why(tmp_path, tiny_model):
    """``benchmarks/speculative.py --task json --data FILE``: a held-out file's schema that
    cannot be enforced exactly is left out with its reason (the summary's ``skipped``), not
    the end of the run; ``--lenient`` compiles it under a superset instead."""
    from structspec.api import Generator
    from structspec.errors import UnsupportedSchemaError

    bench = load_benchmark("speculative.py")
    gen = Generator(tiny_model, pack=False)
    overlapping = {"oneOf": [{"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
                             {"type": "object", "required": ["b"]}]}
    data = tmp_path / "held.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in [
        {"id": "fine", "prompt": "A person.", "schema": {"type": "object", "properties": {
            "name": {"type": "string"}}, "required": ["name"]}},
        {"id": "overlap", "prompt": "Something.", "schema": overlapping},
    ]) + "\n")
    skipped: list[dict] = []
    tasks = bench.load_tasks("json", 10, gen, str(data), skipped=skipped)
    assert [t["id"] for t in tasks] == ["fine"]
    assert [s["id"] for s in skipped] == ["overlap"]
    assert "oneOf" in skipped[0]["error"] and "UnsupportedSchemaError" in skipped[0]["error"]
    with pytest.raises(UnsupportedSchemaError):  # no list to report to: the error itself
        bench.load_tasks("json", 10, gen, str(data))
    lenient = bench.load_tasks("json", 10, gen, str(data), lenient=True, skipped=skipped)
    assert [t["id"] for t in lenient] == ["fine", "overlap"] and len(skipped) == 1


def test_the_benchmark_reads_maskbench_rows_and_samples_them(tmp_path, tiny_model):
    """``--data maskbench_dev.jsonl.gz --shuffle SEED``: gzipped rows with a schema and no
    request get one made from the schema's title or description; ``--shuffle`` draws the
    rows' order from its seed before ``--offset``/``--n`` (the same seed, the same sample)."""
    import gzip

    from structspec.api import Generator

    bench = load_benchmark("speculative.py")
    gen = Generator(tiny_model, pack=False)
    rows = [{"id": f"r{i}", "schema": {"type": "object", "title": f"Thing {i}",
                                       "properties": {"n": {"type": "integer"}}}}
            for i in range(12)]
    data = tmp_path / "mb.jsonl.gz"
    with gzip.open(data, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    assert "Thing 3" in bench._prompt_of(rows[3], data)
    assert "schema." in bench._prompt_of({"schema": True}, data)
    plain = [t["id"] for t in bench.load_tasks("json", 4, gen, str(data), skipped=[])]
    assert plain == ["r0", "r1", "r2", "r3"]
    drawn = [t["id"] for t in bench.load_tasks("json", 4, gen, str(data), shuffle=7)]
    assert drawn != plain and len(set(drawn)) == 4
    assert drawn == [t["id"] for t in bench.load_tasks("json", 4, gen, str(data), shuffle=7)]
    later = [t["id"] for t in bench.load_tasks("json", 4, gen, str(data), 4, shuffle=7)]
    assert not set(later) & set(drawn)
    with pytest.raises(SystemExit):
        bench.main(["--task", "code", "--shuffle", "1"])
