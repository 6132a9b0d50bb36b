"""``StatsTotals``: sums over decodes, rates over the sums, safe across threads."""

from __future__ import annotations

import threading

import pytest

from structspec.engine import DecodeStats
from structspec.spec.stats import SpecStats
from structspec.spec.totals import StatsTotals


def _spec(new: int, steps: int, drafted: int, accepted: int, per_depth: list[list[int]],
          **per_drafter: list[int]) -> SpecStats:
    s = SpecStats(prompt_tokens=10, new_tokens=new, forward_passes=steps, seconds=1.0,
                  prefill_seconds=0.25, mask_seconds=0.1, steps=steps, draft_nodes=drafted,
                  accepted_tokens=accepted, draft_seconds=0.2, verify_seconds=0.6,
                  per_depth=per_depth, budgets=[8] * steps)
    for name, row in per_drafter.items():
        s.per_drafter[name] = row
    return s


def test_rates_come_from_the_sums():
    totals = StatsTotals()
    totals.add(_spec(10, 4, 12, 6, [[4, 3], [3, 2]], lookup=[8, 4], forced=[4, 2]))
    totals.add(_spec(30, 4, 40, 26, [[4, 4], [4, 4], [4, 3]], lookup=[40, 26]))
    totals.add(DecodeStats(prompt_tokens=5, new_tokens=7, forward_passes=7, seconds=0.5,
                           prefill_seconds=0.1))
    # a decode with speculation switched off (no budgets) counts as a plain one
    totals.add(SpecStats(new_tokens=3, forward_passes=3, seconds=0.2))
    totals.add(None)  # a failed decode with no figures
    totals.finish(True)
    totals.finish(False)
    totals.validation_failed()
    d = totals.as_dict()
    assert (d["requests"], d["failed_requests"], d["decodes"], d["validation_failures"]) \
        == (2, 1, 5, 1)
    assert d["new_tokens"] == 50 and d["forward_passes"] == 18
    assert d["tokens_per_pass"] == pytest.approx(50 / 18, abs=1e-4)
    assert d["tokens_per_second"] == pytest.approx(50 / (2.7 - 0.6), abs=0.01)
    spec = d["speculative"]
    assert spec["decodes"] == 2 and spec["new_tokens"] == 40 and spec["steps"] == 8
    assert spec["mean_accepted_length"] == 5.0  # 40 tokens over 8 steps, not a mean of means
    assert spec["acceptance_rate"] == pytest.approx(32 / 52, abs=1e-4)
    assert spec["per_drafter"] == {"forced": [4, 2], "lookup": [48, 30]}
    assert spec["acceptance_per_drafter"]["lookup"] == pytest.approx(30 / 48, abs=1e-4)
    assert spec["acceptance_per_depth"] == [pytest.approx(7 / 8), pytest.approx(6 / 7, abs=1e-4),
                                            0.75]
    assert spec["time_split"] == {"draft": 0.4, "verify": 1.2, "mask": 0.2,
                                  "other": pytest.approx(0.2)}


def test_empty_totals_and_reset():
    totals = StatsTotals()
    d = totals.as_dict()
    assert d["requests"] == d["decodes"] == 0 and d["tokens_per_pass"] == 0.0
    assert "speculative" not in d
    totals.add(_spec(4, 2, 2, 2, [[2, 2]]))
    totals.finish(True)
    totals.reset()
    assert totals.as_dict() == d


def test_adds_from_threads_all_count():
    totals = StatsTotals()

    def work() -> None:
        for _ in range(200):
            totals.add(_spec(3, 1, 2, 1, [[1, 1]], lookup=[2, 1]))
            totals.finish(True)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    d = totals.as_dict()
    assert d["requests"] == d["decodes"] == 800 and d["new_tokens"] == 2400
    assert d["speculative"]["per_drafter"] == {"lookup": [1600, 800]}
    assert d["speculative"]["acceptance_per_depth"] == [1.0]


def test_merged_totals_are_the_totals_of_all_their_decodes():
    import pickle

    decodes = [_spec(10, 4, 12, 6, [[4, 3], [3, 2]], lookup=[8, 4], forced=[4, 2]),
               _spec(30, 4, 40, 26, [[4, 4], [4, 4], [4, 3]], lookup=[40, 26]),
               DecodeStats(prompt_tokens=5, new_tokens=7, forward_passes=7, seconds=0.5)]
    one, parts = StatsTotals(), [StatsTotals(), StatsTotals()]
    for i, stats in enumerate(decodes):
        for totals in (one, parts[i % 2]):
            totals.add(stats)
            totals.finish(i != 1)
    one.validation_failed()
    parts[1].validation_failed()
    merged = StatsTotals()
    for part in parts:  # as replicas send theirs: through pickle, lock and all
        merged.merge(pickle.loads(pickle.dumps(part)))
    assert merged.as_dict() == one.as_dict()
    assert merged.per_drafter["never"] == [0, 0]  # still a counting dict after the trip
