"""Tensor-parallel verification: rank 0 decodes, the other ranks run its forward passes.

DESIGN.md's multi-device mode: the target is split over the ranks of a ``torch.distributed``
group (:mod:`structspec.spec.shard`: NCCL on GPUs, gloo on CPUs); the draft side, the
constraint, the walk over the tree and every decision stay on rank 0 (the *leader*), which
runs the ordinary decode loops — plain or speculative — unchanged. Every forward pass of its
decoder is mirrored: a pre-hook on the leader's decoder broadcasts the pass's inputs (token
ids, positions, the tree's 4D mask) and the follower ranks run the same pass on their shard,
meeting the leader inside each layer where the partial sums are gathered.

Each rank keeps its own heads' KV cache. The leader's cache edits between passes — a tree
pass's compaction to the accepted path (:func:`~structspec.spec.verify.keep_path`), a
rollback — are logged on its cache object (:func:`~structspec.spec.verify.log_op`) and
replayed by the followers on theirs before the next pass, so the caches never part. Rank
0's choices are the only choices: nothing a follower computes is read back, and a follower
needs no constraint, tokenizer or drafter.

Speculation stays lossless: speculative and plain decoding on the same group give the same
tokens (the shards' rows are as pass-independent as one process's; see
:mod:`~structspec.spec.shard` for the sums across ranks). What a group does not do: a
prefix KV cache (each rank would need its own; refused), and recovery from an exception in
the middle of a pass (the followers would wait in the next collective until the group's
timeout: :func:`init_group` sets it).
"""

from __future__ import annotations

import datetime
import functools
import os
from collections import OrderedDict
from typing import Any

import torch

from structspec.errors import StructSpecError
from structspec.hf_compat import CACHE_KEYWORDS, base_model, cache_kwargs
from structspec.spec.shard import shard_of
from structspec.spec.verify import keep_path, rollback, tree_pass_attention

#: Caches a follower keeps (a leader uses one per request, plus the probes' and the cost
#: curve's short-lived ones; older ones are dropped first).
FOLLOWER_CACHES = 4


class LockstepError(StructSpecError, RuntimeError):
    """The ranks of a tensor-parallel group lost step: a follower was sent a pass for a
    cache it does not hold, or a pass in a form it cannot replay."""


def init_group(backend: str | None = None, timeout_s: float = 600.0) -> tuple[int, int]:
    """Join the default process group from the launcher's environment (``torchrun``:
    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) unless one is set up
    already; ``backend`` defaults to NCCL where CUDA is available, gloo elsewhere.
    Returns ``(rank, world)``. ``timeout_s`` bounds how long a rank waits in a collective
    (a rank that died or raised mid-pass then fails the others instead of hanging them)."""
    import torch.distributed as dist

    if not dist.is_available():
        raise LockstepError("tensor parallelism needs torch.distributed, which this torch "
                            "build lacks")
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if k not in os.environ]
        if missing:
            raise LockstepError(
                f"tensor parallelism: no process group and no launcher environment "
                f"({', '.join(missing)} unset); start the program with torchrun "
                f"--nproc-per-node N, or call torch.distributed.init_process_group first")
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def group_up() -> bool:
    """Whether this process is in a default process group."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def leave_group() -> None:
    """Leave the default process group in step with the other ranks (a barrier, then
    ``destroy_process_group``); a no-op without a group. A rank that exits with its group
    still up can abort at exit when a peer has already torn its side down (gloo's threads:
    "terminate called without an active exception"), so the ranks that set the group up
    leave it together."""
    import torch.distributed as dist

    if group_up():
        dist.barrier()
        dist.destroy_process_group()


def _base(model: Any) -> Any:
    base = base_model(model)
    if base is None:
        raise LockstepError(f"{type(model).__name__} has no decoder module to mirror")
    return base


def refuse_prefix_cache(model: Any, prefix_cache: Any) -> None:
    """Raise ``ValueError`` where a prefix KV cache is given for a leader's model: it would
    restore rank 0's heads only, and the followers' caches would lack the prefix."""
    if prefix_cache is not None and getattr(model, "_structspec_leader", None) is not None:
        raise ValueError("prefix_cache: a tensor-parallel model's KV cache is split over its "
                         "ranks, which a prefix cache cannot restore; pass None")


def _describe(cache: Any) -> tuple:
    """How to build a follower's cache like ``cache``: per layer its kind, and the kind of
    layer it makes as passes fill it."""
    from structspec.spec.kv_cache import RoomyLayer

    def kind(layer: Any) -> tuple:
        if isinstance(layer, RoomyLayer):
            return ("roomy", layer.capacity)
        window = getattr(layer, "sliding_window", None)
        return ("sliding", int(window)) if window is not None else ("dynamic",)

    rep = getattr(cache, "layer_class_to_replicate", None)
    if isinstance(rep, functools.partial) and rep.func is RoomyLayer:
        made: tuple | None = ("roomy", int(rep.args[0]))
    elif rep is not None:
        made = ("dynamic",)
    else:
        made = None
    return tuple(kind(layer) for layer in cache.layers), made


def _build(desc: tuple) -> Any:
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    from structspec.spec.kv_cache import RoomyLayer

    def make(kind: tuple) -> Any:
        if kind[0] == "roomy":
            return RoomyLayer(kind[1])
        if kind[0] == "sliding":
            return DynamicSlidingWindowLayer(sliding_window=kind[1])
        return DynamicLayer()

    layers, made = desc
    cache = DynamicCache()
    cache.layers = [make(k) for k in layers]
    if made is not None:
        make_layer = (functools.partial(RoomyLayer, made[1]) if made[0] == "roomy"
                      else DynamicLayer)
        # transformers types this a layer class: it only calls it (kv_cache sets a partial too)
        cache.layer_class_to_replicate = make_layer  # type: ignore[assignment]
    else:
        cache.layer_class_to_replicate = None
    return cache


def _pack_mask(mask: torch.Tensor) -> tuple:
    """A 4D additive mask as the leader sends it: a bool mask where it holds only ``0`` and
    the dtype's minimum (a tree mask; 1/4 of the bytes), else the tensor itself."""
    low = torch.finfo(mask.dtype).min if mask.is_floating_point() else None
    if low is not None:
        visible = mask == 0
        if bool(((mask == low) | visible).all()):
            return ("bool", visible.cpu(), str(mask.dtype).removeprefix("torch."))
    return ("tensor", mask.cpu())


def _unpack_mask(packed: tuple, device: torch.device) -> torch.Tensor:
    if packed[0] == "bool":
        dtype = getattr(torch, packed[2])
        visible = packed[1].to(device)
        return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(
            ~visible, torch.finfo(dtype).min)
    return packed[1].to(device)


class Leader:
    """Rank 0's side: mirrors every pass of ``model``'s decoder to the group (see the module
    docstring). Made by :func:`lead`; :meth:`stop` releases the followers."""

    def __init__(self, model: Any, group: Any = None, src: int = 0) -> None:
        self.model = model
        self.group = group
        self.src = src
        self._next_id = 0
        self._stopped = False
        self._hook = _base(model).register_forward_pre_hook(self._pre, with_kwargs=True)
        model._structspec_leader = self

    def _send(self, message: tuple) -> None:
        import torch.distributed as dist

        dist.broadcast_object_list([message], src=self.src, group=self.group)

    def _pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        if self._stopped:
            raise LockstepError("this tensor-parallel group was stopped; its model cannot "
                                "run passes any more")
        if args:
            raise LockstepError("tensor parallelism mirrors decoder calls made with keyword "
                                "arguments only (as transformers' causal LMs make them)")
        cache, desc, ops, cid = None, None, [], None
        payload: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in CACHE_KEYWORDS:
                cache = value
            elif key == "attention_mask" and isinstance(value, torch.Tensor):
                payload[key] = ("mask", _pack_mask(value))
            elif isinstance(value, torch.Tensor):
                payload[key] = ("tensor", value.detach().cpu())
            elif value is None or isinstance(value, (bool, int, float, str)):
                payload[key] = ("value", value)
            else:
                raise LockstepError(f"tensor parallelism cannot send the decoder argument "
                                    f"{key!r} ({type(value).__name__}) to the other ranks")
        if cache is not None:
            cid = getattr(cache, "_structspec_id", None)
            if cid is None:
                if cache.get_seq_length() != 0:
                    raise LockstepError("a cache that already holds tokens was handed to a "
                                        "tensor-parallel model: the other ranks lack them")
                cid = cache._structspec_id = self._next_id
                self._next_id += 1
                cache._structspec_ops = []
                desc = _describe(cache)
            ops, cache._structspec_ops = cache._structspec_ops, []
        self._send(("pass", cid, desc, ops, payload))

    def stop(self) -> None:
        """Tell the followers to return from :func:`serve` (once; later passes raise)."""
        if not self._stopped:
            self._stopped = True
            self._hook.remove()
            self._send(("stop",))


def lead(model: Any, group: Any = None, src: int = 0) -> Leader:
    """Make this rank (``src``) the leader of ``model``'s group: it decodes as usual and its
    passes run on every rank. Call :meth:`Leader.stop` when done."""
    if shard_of(model) is None:
        raise LockstepError("lead() takes a model split by structspec.spec.shard.shard_model")
    return Leader(model, group, src)


def serve(model: Any, group: Any = None, src: int = 0) -> int:
    """Follow the leader ``src``: run each pass it sends on this rank's shard of ``model``,
    replaying its cache edits first, until it stops. Returns the number of passes run.

    Raises:
        LockstepError: a message named a cache this rank does not hold.
    """
    import torch.distributed as dist

    base = _base(model)
    device = model.device
    caches: OrderedDict[int, Any] = OrderedDict()
    passes = 0
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=src, group=group)
        message = box[0]
        if message[0] == "stop":
            return passes
        _, cid, desc, ops, payload = message
        kwargs: dict[str, Any] = {}
        for key, (kind, value) in payload.items():
            if kind == "mask":
                kwargs[key] = _unpack_mask(value, device)
            elif kind == "tensor":
                kwargs[key] = value.to(device)
            else:
                kwargs[key] = value
        cache = None
        if cid is not None:
            if desc is not None:
                caches[cid] = _build(desc)
                while len(caches) > FOLLOWER_CACHES:
                    caches.popitem(last=False)
            cache = caches.get(cid)
            if cache is None:
                raise LockstepError(f"the leader sent a pass for cache {cid}, which this rank "
                                    f"no longer holds")
            caches.move_to_end(cid)
            for op in ops:
                if op[0] == "crop":
                    rollback(cache, op[1])
                elif op[0] == "keep":
                    keep_path(cache, op[1], op[2])
                else:
                    raise LockstepError(f"unknown cache edit {op[0]!r} from the leader")
            kwargs.update(cache_kwargs(base, cache))
        with torch.inference_mode(), tree_pass_attention(device):
            base(**kwargs)
        passes += 1
