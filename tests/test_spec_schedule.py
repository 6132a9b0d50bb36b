"""The adaptive speculation budget and the per-drafter gate (pure, no model)."""

from __future__ import annotations

from structspec.spec.schedule import Budget, DrafterGate, Scheduler


def test_budget_shrinks_to_none_and_probes_back():
    s = Scheduler(16, 8, window=4, min_acceptance=0.6, probe_every=5)
    assert s.budget().nodes == 16 and s.levels == [16, 8, 4, 2, 0]
    for _ in range(4 * 4):
        s.budget()
        s.record(offered=5, accepted=0)
    assert s.levels[s.level] == 0
    budgets = [s.budget() for _ in range(10)]
    assert [b.nodes for b in budgets].count(0) == 8  # a probe every 5 steps,
    assert [(b.nodes, b.probe) for b in budgets if b.nodes] == [(16, True)] * 2  # full ones
    s.record(offered=5, accepted=1)
    s.record(offered=5, accepted=2)  # two probes that hit, within the smallest level: up
    assert s.levels[s.level] == 2
    for _ in range(4):
        s.record(offered=2, accepted=1)
    assert s.levels[s.level] == 4


def test_a_full_probe_at_level_none_that_pays_restores_the_top_level():
    """At level none the probe drafts with the full budget and every drafter (a probe of the
    smallest budget went to the draft head, ranked first, and a lookup paused for its early
    misses never drafted again while the output repeated a line: HumanEval/38 at 160 tokens,
    131 passes, 64 with the full probe); accepted beyond the smallest level, it brings the
    top level back."""
    s = Scheduler(16, 8, window=2, min_acceptance=0.6, probe_every=3)
    for _ in range(4 * 2):
        s.budget()
        s.record(offered=4, accepted=0)
    assert s.levels[s.level] == 0
    while not (b := s.budget()).probe:
        assert b.nodes == 0
    assert b.nodes == 16 and b.branches == 8
    s.record(offered=14, accepted=9)
    assert s.level == 0 and s.budget().nodes == 16


def test_steps_without_speculation_do_not_count_and_fixed_budgets_stay():
    s = Scheduler(8, 4, window=2)
    s.record(offered=0, accepted=0)
    s.record(offered=0, accepted=0)
    assert s.level == 0
    fixed = Scheduler(8, 4, adaptive=False, window=1)
    fixed.record(offered=3, accepted=0)
    assert fixed.budget().nodes == 8 and fixed.budget().branches == 4


def test_gate_pauses_a_drafter_that_never_hits():
    g = DrafterGate(window=3, pause=4)
    for _ in range(3):
        assert g.active("values")
        g.record({"values": False, "lookup": True})
    assert not g.active("values") and g.active("lookup")
    for _ in range(4):
        g.record({})
    assert g.active("values")


def test_a_paused_drafter_that_hits_in_a_probe_is_active_again():
    """A probe drafts with every drafter, paused ones too; a hit there ends the pause (it
    reset only the doubling before, and the drafter sat out the rest of its pause)."""
    g = DrafterGate(window=2, pause=64)
    for _ in range(2):
        g.record({"lookup": False})
    assert not g.active("lookup")
    g.record({"lookup": True})  # a probe's tree: the lookup's node accepted
    assert g.active("lookup")


def test_budget_never_shrinks_below_the_free_nodes():
    """Where a pass of a few nodes costs what a pass of the root does, the lowest level is
    that size, not none: a lookup that hits after many misses is still drafted."""
    s = Scheduler(16, 8, window=2, min_acceptance=0.6, min_nodes=3)
    assert s.levels == [16, 8, 4, 3]
    for _ in range(20):
        s.budget()
        s.record(offered=3, accepted=0)
    assert s.levels[s.level] == 3
    budgets = [s.budget() for _ in range(32)]  # the full budget only as a probe
    assert all(b.nodes == 3 for b in budgets if not b.probe)
    assert [b.nodes for b in budgets if b.probe] == [16, 16]


def test_a_probe_of_the_full_budget_below_the_top_level():
    """Below the top level, every ``probe_every`` steps drafts with the full budget (every
    drafter active: ``Budget.probe``); where that tree was accepted beyond what the current
    level could hold (an output that started repeating itself), the top level is back."""
    s = Scheduler(16, 8, window=2, min_acceptance=0.6, probe_every=4)
    for _ in range(4):
        s.budget()
        s.record(offered=4, accepted=0)
    assert s.levels[s.level] == 4
    seen = []
    for _ in range(8):
        b = s.budget()
        seen.append((b.nodes, b.probe))
        s.record(offered=b.nodes, accepted=1)  # small hits: level kept or raised by them
        if b.probe:
            break
    assert seen[-1] == (16, True) and s.level > 0
    while not (b := s.budget()).probe:
        s.record(offered=b.nodes, accepted=0)
    s.record(offered=16, accepted=12)  # the probe paid beyond the level's nodes
    assert s.level == 0 and s.budget() == Budget(16, 8)


def test_gate_doubles_the_pause_of_a_drafter_that_keeps_missing():
    g = DrafterGate(window=2, pause=4, max_pause=10)

    def miss_until_paused() -> int:
        n = 0
        while g.active("closers"):
            g.record({"closers": False})
            n += 1
        return n

    def paused_for() -> int:
        n = 0
        while not g.active("closers"):
            g.record({})
            n += 1
        return n

    pauses = []
    for _ in range(4):
        assert miss_until_paused() == 2
        pauses.append(paused_for())
    assert pauses == [4, 8, 10, 10]  # doubled, up to max_pause
    g.record({"closers": True})  # a hit resets the pause
    assert miss_until_paused() == 2 and paused_for() == 4


def test_a_shared_gate_starts_each_request_afresh_unless_a_drafter_never_hits():
    """A gate carried by an acceptance model from request to request (``shared``, then
    ``begin`` per request): a drafter that hit lately starts every request active, as with a
    gate of its own; one that proposed in ``carry`` steps in a row without a hit, across
    requests, starts the next request paused (``pause << 2`` steps), then probes again."""
    from structspec.spec.cost import AcceptanceModel

    acceptance = AcceptanceModel()
    g = DrafterGate.shared(acceptance, window=2, pause=3)
    assert DrafterGate.shared(acceptance, window=2, pause=3) is g  # carried
    assert DrafterGate.shared(acceptance, window=4, pause=3) is not g  # other settings
    g = DrafterGate.shared(acceptance, window=2, pause=3)
    assert g.carry == 8
    g.begin()
    for _ in range(2):  # request 1: both miss a window and are paused
        g.record({"values": False, "lookup": False})
    assert not g.active("values") and not g.active("lookup")
    g.begin()  # request 2: both afresh (neither has missed `carry` steps in a row)
    assert g.active("values") and g.active("lookup")
    for _ in range(6):
        g.record({"values": False, "lookup": g.step % 2 == 0})
        g._paused_until.clear()  # (keep both proposing: the pauses are not under test)
    assert g._since_hit["values"] == 8 and g._since_hit["lookup"] <= 1
    g.begin()  # request 3: values has missed 8 steps in a row across requests
    assert not g.active("values") and g.active("lookup")
    for _ in range(12):
        g.record({})
    assert g.active("values")  # paused 3 << 2 steps, then tried again
    g.record({"values": True})
    g.begin()
    assert g.active("values")  # a hit: afresh again
