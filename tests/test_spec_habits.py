"""Packaged tokenization habits: written and read back, seeding a fresh AcceptanceModel as
a weak prior, ignored where they belong to another model or are damaged; and the default
model's shipped file is found."""

from __future__ import annotations

import json

import pytest

from structspec.spec import habits as habits_mod
from structspec.spec.cost import AcceptanceModel


def _taught() -> AcceptanceModel:
    a = AcceptanceModel()
    for _ in range(3):
        a.record_split((b"w", b'":"'), 1799)
    a.record_split((b"\n", b'{"'), 107)
    a.record_split((b"\n", b'{"'), 39428)
    a.record_closer(1002)
    a.record_closer(1002)
    a.record_closer(109)
    return a


def test_habits_round_trip_as_a_weak_prior():
    data = json.loads(json.dumps(_taught().habits()))  # JSON-ready
    fresh = AcceptanceModel()
    fresh.seed(data)
    assert set(fresh.splits) == {(b"w", b'":"'), (b"\n", b'{"')}
    assert fresh.splits[(b"w", b'":"')] == {1799: 1.0}  # the likeliest counts one observation
    opener = fresh.splits[(b"\n", b'{"')]
    assert opener[39428] == 1.0 and 0 < opener[107] < 1.0
    assert fresh.closers[1002] == 1.0 and 0 < fresh.closers[109] < 1.0
    # a model choice seen once more outweighs the prior
    fresh.record_split((b"w", b'":"'), 25535)
    fresh.record_split((b"w", b'":"'), 25535)
    assert fresh.split_shares((b"w", b'":"'), 25535)[0][0] == 25535


@pytest.mark.parametrize("bad", [{"splits": [["w"]]}, {"splits": [["w", '"', [["x", 1]]]]},
                                 {"closers": [[1, 0.0]]}, {"splits": "nonsense"}])
def test_seed_refuses_what_is_not_habits(bad):
    with pytest.raises(ValueError, match="not a habits mapping"):
        AcceptanceModel().seed(bad)


@pytest.fixture()
def heads(tmp_path, monkeypatch):
    monkeypatch.setattr(habits_mod, "HEADS_DIR", tmp_path)
    monkeypatch.setattr(habits_mod, "_PACKAGED", {})
    return tmp_path


def test_saved_habits_seed_the_models_fresh_acceptance(heads, tiny_model):
    model = tiny_model.model
    habits_mod.save_habits(heads / "tiny.habits.json", _taught(), model, name="tiny",
                           meta={"requests": 5})
    blob = json.loads((heads / "tiny.habits.json").read_text())
    assert blob["kind"] == "structspec-habits" and blob["meta"] == {"requests": 5}
    assert habits_mod.packaged_habits(model)["name"] == "tiny"
    assert habits_mod.fresh_acceptance(model).splits[(b"w", b'":"')] == {1799: 1.0}


def test_habits_of_another_model_or_damaged_files_are_not_used(heads, tiny_model):
    model = tiny_model.model
    other = _taught().habits() | {"kind": "structspec-habits", "format": 1,
                                  "fingerprint": "not-this-model"}
    (heads / "other.habits.json").write_text(json.dumps(other))
    (heads / "broken.habits.json").write_text("{not json")
    assert habits_mod.packaged_habits(model) is None
    assert habits_mod.fresh_acceptance(model).splits == {}
    # right model, damaged contents: a fresh prior, no error (habits only steer drafts)
    habits_mod._PACKAGED.clear()
    mine = other | {"fingerprint": habits_mod.fingerprint(model), "splits": [["w"]]}
    (heads / "mine.habits.json").write_text(json.dumps(mine))
    assert habits_mod.fresh_acceptance(model).splits == {}
    # token ids this vocabulary does not have
    habits_mod._PACKAGED.clear()
    mine["splits"] = [["w", '":"', [[10**9, 1.0]]]]
    (heads / "mine.habits.json").write_text(json.dumps(mine))
    assert habits_mod.fresh_acceptance(model).splits == {}


def test_the_shipped_habits_were_learned_under_the_default_json_whitespace():
    # Habits learned under another separator policy steer first requests wrong (session 59:
    # compact JSON's habits under the spaced default, 480 passes on 60 fresh held-out BFCL
    # calls against 357 with habits learned again).
    from structspec.automata.json_schema import DEFAULT_WHITESPACE

    blob = json.loads((habits_mod.HEADS_DIR / "smollm2-135m-instruct.habits.json").read_text())
    contexts = {(ctx, canonical) for ctx, canonical, _ in blob["splits"]}
    expected = {"spaced": (",", ' "'), "compact": (",", '"')}[DEFAULT_WHITESPACE]
    assert expected in contexts, "run scripts/learn_habits.py: the default whitespace changed"
