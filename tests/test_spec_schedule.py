"""The adaptive speculation budget and the per-drafter gate (pure, no model)."""

from __future__ import annotations

from structspec.spec.schedule import DrafterGate, Scheduler


def test_budget_shrinks_to_none_and_probes_back():
    s = Scheduler(16, 8, window=4, min_acceptance=0.6, probe_every=5)
    assert s.budget().nodes == 16 and s.levels == [16, 8, 4, 2, 0]
    for _ in range(4 * 4):
        s.budget()
        s.record(offered=5, accepted=0)
    assert s.levels[s.level] == 0
    budgets = [s.budget().nodes for _ in range(10)]
    assert budgets.count(2) == 2 and budgets.count(0) == 8  # a probe every 5 steps
    s.record(offered=2, accepted=1)
    s.record(offered=2, accepted=2)  # two probes that hit: step back up
    assert s.levels[s.level] == 2
    for _ in range(4):
        s.record(offered=2, accepted=1)
    assert s.levels[s.level] == 4


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


def test_budget_never_shrinks_below_the_free_nodes():
    """Where a pass of a few nodes costs what a pass of the root does, the lowest level is
    that size, not none: a lookup that hits after many misses is still drafted."""
    s = Scheduler(16, 8, window=2, min_acceptance=0.6, min_nodes=3)
    assert s.levels == [16, 8, 4, 3]
    for _ in range(20):
        s.budget()
        s.record(offered=3, accepted=0)
    assert s.levels[s.level] == 3 and all(s.budget().nodes == 3 for _ in range(20))


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
