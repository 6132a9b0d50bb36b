"""Tensor-parallel verification (structspec.spec.shard, structspec.spec.lockstep): a group
of gloo processes started by torchrun decodes what one process would, speculation stays
lossless on it, and bad set-ups are refused with clear errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import tiny_llama

WORKER = Path(__file__).with_name("tp_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def group_report(tmp_path_factory, smollm_tokenizer) -> dict:
    """What rank 0 of a 2-process gloo group saw (tests/tp_worker.py)."""
    out = tmp_path_factory.mktemp("tp") / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(WORKER),
           str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    said = done.stdout[-3000:] + done.stderr[-3000:]
    if done.returncode != 0 and _torn_down_only(done.stdout) and out.exists():
        # Both ranks finished their work and the report is written; what failed is torch's
        # own teardown of the group after our barrier (gloo, "terminate called without an
        # active exception", rare). It is not what these tests check: say so and go on.
        warnings.warn(f"tensor-parallel group: a rank aborted in the group's teardown after "
                      f"its work was done (exit {done.returncode}): {done.stderr[-500:]}",
                      stacklevel=1)
    else:
        assert done.returncode == 0, said
    assert "served" in done.stdout, said
    return json.loads(out.read_text())


def _torn_down_only(stdout: str) -> bool:
    """Whether rank 0 wrote its report and rank 1 served until released (the phases
    tests/tp_worker.py prints), so that a failure can only be in leaving the group."""
    return "rank 0: decoded" in stdout and "rank 1: served" in stdout


def test_split_model_gives_the_whole_models_logits(group_report):
    assert group_report["world"] == 2
    assert group_report["logits_max_diff"] <= 1e-4 * max(1.0, group_report["logits_scale"])


def test_speculation_on_a_group_is_lossless(group_report):
    greedy = [r for r in group_report["runs"] if r["greedy"]]
    assert greedy
    for r in greedy:
        assert r["spec"]["ids"] == r["plain"]["ids"], r["schema"]
    # speculation did run multi-node passes somewhere (fewer passes than tokens)
    assert any(r["spec"]["passes"] is not None and r["spec"]["passes"] < len(r["spec"]["ids"])
               for r in greedy)


def test_every_complete_output_on_a_group_is_valid(group_report):
    for r in group_report["runs"]:
        for side in ("plain", "spec"):
            if r[side]["complete"]:
                assert r[side]["valid"], (side, r["schema"], r[side])


def test_sizes_that_do_not_divide_are_refused(smollm_tokenizer):
    from structspec.spec.shard import check_shardable, shard_model
    from structspec.spec.verify import UnsupportedModelError

    model = tiny_llama(smollm_tokenizer, seed=0)  # 2 key-value heads, 64 intermediate
    with pytest.raises(UnsupportedModelError, match=r"num_key_value_heads \(2\).*3"):
        check_shardable(model, 3)
    with pytest.raises(ValueError, match="rank"):
        shard_model(model, 2, 2)
    assert shard_model(model, 0, 1) is model  # one rank: nothing to split


def test_models_of_another_layout_are_refused():
    from structspec.spec.shard import check_shardable
    from structspec.spec.verify import UnsupportedModelError

    class NoLayers(torch.nn.Module):
        base_model_prefix = "model"

        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Linear(2, 2)

    with pytest.raises(UnsupportedModelError, match="layers"):
        check_shardable(NoLayers(), 2)


def test_no_group_no_launcher_is_a_clear_error(monkeypatch):
    import torch.distributed as dist

    from structspec.spec.lockstep import LockstepError, init_group

    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(LockstepError, match="torchrun"):
        init_group()


def test_a_generator_without_a_group_decodes_and_cannot_serve(tiny_model):
    from structspec.api import Generator
    from structspec.spec.lockstep import LockstepError

    gen = Generator(tiny_model, pack=False)
    assert gen.leader
    with pytest.raises(LockstepError, match="serve"):
        gen.serve()
    gen.close()  # no group: nothing to release


def test_tree_masks_travel_exactly():
    from structspec.spec.lockstep import _pack_mask, _unpack_mask

    low = torch.finfo(torch.float32).min
    mask = torch.zeros(1, 1, 3, 5).masked_fill_(torch.rand(1, 1, 3, 5) < 0.5, low)
    packed = _pack_mask(mask)
    assert packed[0] == "bool"
    assert torch.equal(_unpack_mask(packed, torch.device("cpu")), mask)
    other = torch.full((1, 1, 2, 2), -3.5)  # not a 0/min mask: sent as it is
    assert _pack_mask(other)[0] == "tensor"
    assert torch.equal(_unpack_mask(_pack_mask(other), torch.device("cpu")), other)


def test_a_followers_cache_is_built_like_the_leaders(tiny_model):
    from structspec.spec.kv_cache import RoomyLayer, decoding_cache
    from structspec.spec.lockstep import _build, _describe

    cache = decoding_cache(tiny_model.model, 100)
    built = _build(_describe(cache))
    assert len(built.layers) == len(cache.layers)
    assert all(type(a) is type(b) for a, b in zip(built.layers, cache.layers, strict=True))
    assert all(layer.capacity == 100 for layer in built.layers if isinstance(layer, RoomyLayer))


def test_cache_edits_are_logged_once_each():
    from transformers import DynamicCache

    from structspec.spec.verify import keep_path, rollback

    cache = DynamicCache()
    k = torch.arange(2 * 6 * 4, dtype=torch.float32).view(1, 2, 6, 4)
    cache.update(k, k.clone(), 0)
    cache._structspec_ops = []
    keep_path(cache, 2, [0, 1])  # in place: a crop inside, logged as the keep alone
    keep_path(cache, 1, [0, 2])
    rollback(cache, 2)
    assert cache._structspec_ops == [("keep", 2, [0, 1]), ("keep", 1, [0, 2]), ("crop", 2)]
    assert cache.get_seq_length() == 2


def test_a_prefix_cache_is_refused_on_a_leaders_model(tiny_model, smollm_vocab):
    from structspec.engine import decode, free_text
    from structspec.sampling import SamplingParams
    from structspec.spec.prefix import PrefixCache

    model = tiny_model.model
    model._structspec_leader = object()
    try:
        with pytest.raises(ValueError, match="prefix_cache"):
            decode(model, smollm_vocab, [1, 2, 3], free_text(smollm_vocab), max_new_tokens=2,
                   sampling=SamplingParams(), prefix_cache=PrefixCache())
    finally:
        del model._structspec_leader


def test_leaving_without_a_group_is_a_no_op():
    from structspec.spec.lockstep import group_up, leave_group

    assert not group_up()
    leave_group()  # nothing to leave
    assert not group_up()
