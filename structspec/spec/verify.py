"""Verification: one forward pass of the target model over every node of a draft tree.

The pass runs on top of a ``transformers`` ``DynamicCache`` holding the committed tokens
before the tree's root. It appends the key/values of all ``q`` tree nodes; after acceptance,
:func:`keep_path` compacts the cache to the accepted path (root included), so the cache holds
exactly the committed sequence again. If the forward raises midway, the cache is cropped back
layer by layer (a partial forward leaves layers with different lengths).

Verified for transformers 5.17 and 5.24–5.25 (see DESIGN.md): the cache goes under the
keyword the model takes (:mod:`structspec.hf_compat`); a custom 4D mask is passed through as
is, so it must be additive float (a bool mask is silently wrong under eager attention);
``position_ids`` must be ``past + depth``. On CUDA a tree pass keeps PyTorch's attention off
cuDNN (:func:`tree_pass_attention`).

Which models qualify: :func:`check_tree_support` reads the configuration (attention
implementation, cache layers), :func:`probe_tree_support` runs one small tree pass per model
against the same path run causally (a model may take the mask and ignore it), and
:func:`tree_cache` / :func:`check_positions` bound the requests that sliding windows and
position-dependent rotary scaling leave exact.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from structspec import _native
from structspec.errors import StructSpecError
from structspec.hf_compat import cache_kwargs
from structspec.spec.attention import IMPLEMENTATION
from structspec.spec.tree import DraftTree, tree_attention


def tree_pass_attention(device: torch.device | str) -> contextlib.AbstractContextManager:
    """Where a tree pass runs: on CUDA, PyTorch's fused attention restricted to the backends
    the process has enabled other than cuDNN's; elsewhere, as is.

    cuDNN attention builds an execution graph for every new (query, key) shape, and a tree
    pass is always a new shape (the key length grows each step, the node count varies): on an
    H200 in bfloat16 every pass of a few nodes cost ~60 ms instead of ~21 ms (GPU check,
    session 32; float32 never takes cuDNN). The memory-efficient kernel takes the additive
    tree mask with no per-shape setup. A process that enabled cuDNN alone keeps it. (PyTorch
    keeps these switches process-wide: another thread's attention during the pass sees them
    too; a Generator runs one pass at a time.)
    """
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cuda = torch.backends.cuda
    keep = [backend for backend, on in ((SDPBackend.FLASH_ATTENTION, cuda.flash_sdp_enabled()),
                                        (SDPBackend.EFFICIENT_ATTENTION,
                                         cuda.mem_efficient_sdp_enabled()),
                                        (SDPBackend.MATH, cuda.math_sdp_enabled())) if on]
    return sdpa_kernel(keep) if keep else contextlib.nullcontext()


# Attention implementations known to honour a custom 4D additive mask.
TREE_ATTENTION_IMPLEMENTATIONS = frozenset({"eager", "sdpa", IMPLEMENTATION})


class UnsupportedModelError(StructSpecError, ValueError):
    """The model cannot verify a draft tree (no custom 4D attention masks, or a cache layout
    that :func:`keep_path` cannot compact)."""


def check_tree_support(model: Any, cache: Any | None = None) -> None:
    """Refuse models that cannot run tree attention; pure (reads the config only).

    Args:
        model: a ``transformers`` causal LM.
        cache: optionally the cache that will be used; every layer must be a plain
            (full-attention) dynamic layer with ``keys``/``values`` tensors.

    Raises:
        UnsupportedModelError: the attention implementation does not take a custom 4D mask
            (e.g. ``flash_attention_2``), or the cache has sliding-window / compressed layers.
    """
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl not in TREE_ATTENTION_IMPLEMENTATIONS:
        raise UnsupportedModelError(
            f"speculative decoding needs a model whose attention accepts a custom 4D mask "
            f"(attn_implementation in {sorted(TREE_ATTENTION_IMPLEMENTATIONS)}); this model uses "
            f"{impl!r}. Load it with attn_implementation='sdpa' or 'eager', or disable "
            f"speculation."
        )
    if cache is not None:
        check_tree_cache(cache)


def check_tree_cache(cache: Any) -> None:
    """Refuse a cache that tree verification cannot prune: every layer must be a plain
    (full-attention) dynamic layer with ``keys``/``values`` tensors. Pure.

    Raises:
        UnsupportedModelError: a sliding-window or compressed layer.
    """
    from transformers.cache_utils import DynamicLayer

    from structspec.spec.kv_cache import RoomyLayer

    for i, layer in enumerate(getattr(cache, "layers", [])):
        if type(layer) not in (DynamicLayer, RoomyLayer):
            raise UnsupportedModelError(
                f"cache layer {i} is a {type(layer).__name__}; tree verification needs "
                f"plain DynamicLayer layers"
            )


# Per model: the attention implementation it was probed with, and the refusal (``None``:
# passed). A repacked model, or one switched to another implementation, is probed again.
_PROBED: weakref.WeakKeyDictionary[Any, tuple[str, str | None]] = weakref.WeakKeyDictionary()


def probe_tree_support(model: Any) -> None:
    """Refuse a model whose forward does not honour a tree pass; probed once per model.

    The configuration says which attention implementation runs, not whether the model
    passes a 4D mask and ``position_ids`` through to it: ALiBi models build their biases
    from a 2D mask (BLOOM raises), and a model that ignored either would verify drafts
    against the wrong context — silently lossy. So a three-node tree (a root, two sibling
    children) runs on top of a two-token cache, and the second child's logits must be those
    of the same path run causally without the first child.

    Raises:
        UnsupportedModelError: the tree pass raised (the model's error is chained the first
            time), or the branch's logits differ from the causal ones by more than rounding.
    """
    impl = str(getattr(getattr(model, "config", None), "_attn_implementation", None))
    known = _PROBED.get(model)
    if known is not None and known[0] == impl:
        if known[1] is not None:
            raise UnsupportedModelError(known[1])
        return
    try:
        _probe(model)
    except UnsupportedModelError as exc:
        _PROBED[model] = (impl, str(exc))
        raise
    _PROBED[model] = (impl, None)


def _probe(model: Any) -> tuple[float, float]:
    """One probe of :func:`probe_tree_support`, uncached: ``(difference, bound)``, raising
    where the difference exceeds the bound (``scripts/device_check.sh`` prints both)."""
    from transformers import DynamicCache

    size = int(model.get_input_embeddings().weight.shape[0])
    past = [1000 % size, 2000 % size]
    root, first, second = 3000 % size, 4000 % size, 5000 % size
    device = model.device
    tree = DraftTree((root, first, second), (-1, 0, 0), (0, 1, 1), (None,) * 3, ("probe",) * 3)
    try:
        with torch.inference_mode():
            def last(ids: list[int]) -> torch.Tensor:  # causal logits after ids, [V]
                return model(input_ids=torch.tensor([ids], device=device),
                             use_cache=False).logits[0, -1].float()

            reference = last([*past, root, second])
            unmasked = last([*past, root, first, second])  # what an ignored mask gives
            cache = DynamicCache()  # full layers: the probe fits any window
            model(input_ids=torch.tensor([past], device=device), **cache_kwargs(model, cache),
                  use_cache=True)
            branch = verify_tree(model, cache, tree, len(past))[2].float()  # [V]
    except Exception as exc:
        raise UnsupportedModelError(
            f"speculative decoding needs a model that takes a custom 4D attention mask and "
            f"position ids; {type(model).__name__} failed a tree pass ({type(exc).__name__}: "
            f"{exc}). Disable speculation for it."
        ) from exc
    # Rounding: a tree pass against a causal pass of other shapes; float32 differs by far
    # less than 0.5% of the logits' scale (the default model on this CPU: 0). An ignored
    # mask or ignored positions move them by about as much as seeing the sibling does (the
    # default model: 1.7-2.9, the sibling 3.5, of 27). Half precision rounds more (float16
    # here 0.04; GPUs' kernels maybe more), so there the bound is a fifth of the sibling's
    # effect (a false refusal would switch speculation off for every request).
    scale = max(1.0, float(reference.abs().max()))
    diff = float((branch - reference).abs().max())
    tolerance = 5e-3 * scale
    if model.dtype in (torch.float16, torch.bfloat16):
        tolerance = max(2e-2 * scale, 0.2 * float((unmasked - reference).abs().max()))
    if not diff <= tolerance:
        raise UnsupportedModelError(
            f"speculative decoding needs a model that honours a custom 4D attention mask and "
            f"position ids; {type(model).__name__} does not (a branch's logits differ from "
            f"the same path run causally by {diff:.3g}, over the rounding bound "
            f"{tolerance:.3g}). Disable speculation for it."
        )
    return diff, tolerance


def tree_cache(model: Any, tokens: int | None = None) -> Any:
    """An empty ``DynamicCache`` for ``model`` whose layers tree passes can compact.

    Sliding-window layers drop keys as they go, which :func:`keep_path` cannot undo; but a
    window at least as long as the whole request masks nothing, so where the request's
    ``tokens`` (prompt, output and the largest tree at once) fit in every window, the
    cache has full layers instead and the tree mask is the exact mask (Gemma 2/3, Mistral
    with its window: identical outputs while the request fits).

    Raises:
        UnsupportedModelError: the model has sliding-window layers and ``tokens`` is
            ``None`` or longer than the window (the message names both).
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicSlidingWindowLayer

    cache = DynamicCache(config=model.config)
    if not any(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers):
        return cache
    window = int(getattr(model.config, "sliding_window", 0) or 0)
    if tokens is None or window <= 0 or tokens > window:
        need = "" if tokens is None else f"; this request needs up to {tokens}"
        raise UnsupportedModelError(
            f"speculative decoding on {type(model).__name__}: its sliding-window layers "
            f"(window {window or 'unknown'} tokens) drop keys that a tree pass's compaction "
            f"needs{need}. Shorten the request to fit the window, or disable speculation."
        )
    return DynamicCache()  # full layers, created as the first pass fills them


def position_bound(model: Any) -> tuple[int, str] | None:
    """``(tokens, rope type)``: up to ``tokens`` tokens, ``model`` encodes a position the
    same whatever else its pass holds; ``None``: always. Dynamic and LongRoPE rotary
    embeddings choose their frequencies from the largest position in the forward call once
    it passes the pretraining length, so a tree pass (whose deepest node sets them) would
    encode a node unlike the one-token step that plain decoding runs."""
    config = getattr(model, "config", None)
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return None
    # One set of parameters, or one per layer type (Gemma 3: sliding and full attention).
    sets = list(params.values()) if all(isinstance(v, dict) for v in params.values()) \
        else [params]
    bounds = []
    for p in sets:
        kind = str(p.get("rope_type", p.get("type", "")))
        if "dynamic" in kind:
            bounds.append((int(getattr(config, "max_position_embeddings", 0) or 0), kind))
        elif kind == "longrope":
            bounds.append((int(p.get("original_max_position_embeddings")
                               or getattr(config, "original_max_position_embeddings", 0) or 0),
                           kind))
    return min(bounds) if bounds else None


def check_positions(model: Any, prompt_tokens: int, tokens: int) -> None:
    """Refuse a request (a prompt of ``prompt_tokens``, at most ``tokens`` in all) whose
    positions a tree pass would encode unlike plain decoding (:func:`position_bound`): one
    that crosses the bound, or for dynamic scaling (which rescales at every longer pass)
    one that passes it at all. LongRoPE wholly beyond the bound is constant, so exact.

    Raises:
        UnsupportedModelError: naming the bound and the request's length.
    """
    found = position_bound(model)
    if found is None:
        return
    bound, kind = found
    if tokens <= bound or (kind == "longrope" and prompt_tokens > bound):
        return
    raise UnsupportedModelError(
        f"speculative decoding on {type(model).__name__}: its {kind} rotary embeddings "
        f"rescale positions beyond {bound} tokens by the longest position in a pass, so a "
        f"tree pass would encode them unlike a one-token step; this request may reach "
        f"{tokens} tokens. Shorten it, or disable speculation."
    )


def cache_length(cache: Any) -> int:
    """Tokens held by the cache (``0`` for an empty one)."""
    return int(cache.get_seq_length())


def log_op(cache: Any, op: tuple) -> None:
    """Record a cache edit ``op`` (``("crop", n)`` or ``("keep", past_len, indices)``) for
    the followers of a tensor-parallel leader, whose caches hold ``_structspec_ops``
    (:mod:`~structspec.spec.lockstep` replays them); on any other cache, nothing."""
    log = getattr(cache, "_structspec_ops", None)
    if log is not None:
        log.append(op)


def rollback(cache: Any, past_len: int) -> None:
    """Crop every layer of ``cache`` to ``past_len`` tokens. Mutates ``cache``.

    Safe after a forward that raised midway (layers of different lengths, some maybe not yet
    initialized). A tensor-parallel leader's cache logs the edit for its followers
    (:mod:`~structspec.spec.lockstep`).
    """
    log_op(cache, ("crop", past_len))
    _crop(cache, past_len)


def _crop(cache: Any, past_len: int) -> None:
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is None or not getattr(layer, "is_initialized", True) or keys.dim() < 2:
            continue
        if keys.shape[-2] > past_len:
            layer.keys = keys[..., :past_len, :]
            layer.values = layer.values[..., :past_len, :]


def verify_tree(
    model: Any, cache: Any, tree: DraftTree, past_len: int, prefix: Sequence[int] = (),
    rows: Sequence[int] | None = None,
) -> torch.Tensor:
    """Run every node of ``tree`` through ``model`` in one forward pass.

    Args:
        model: a ``transformers`` causal LM that passed :func:`check_tree_support`.
        cache: its ``DynamicCache`` holding exactly ``past_len`` tokens.
        tree: the draft tree (``q`` nodes, the root first).
        past_len: the cache length.
        prefix: committed tokens between the cache and the root, not yet in the cache
            (typically the prompt minus its last token: the prefill and the first tree then
            share one pass).
        rows: the nodes whose logits are wanted, ascending (``None``: all); the output
            layer runs on those rows only (:mod:`structspec.spec.sparse_logits`).

    Returns:
        Logits ``[q, V]`` (on the model's device): row ``i`` is the next-token logits after
        the path root → node ``i``; with ``rows``, ``[len(rows), V]``, those nodes'.

    Mutates ``cache``: afterwards it holds ``past_len + len(prefix) + q`` tokens (the prefix,
    then the tree in node order); call :func:`keep_path` with ``past_len + len(prefix)``
    next. If the forward raises, the cache is rolled back to ``past_len`` and the exception
    propagates.
    """
    device = model.device
    q = len(tree)
    input_ids = torch.tensor([[*prefix, *tree.tokens]], dtype=torch.long, device=device)  # [1, L+q]
    if q == 1:  # a lone root is an ordinary causal step: no custom mask needed
        kwargs: dict[str, Any] = {}
    else:
        mask, positions = tree_attention(tree, past_len, model.dtype, device,
                                         prefix_len=len(prefix))  # [1,1,L+q,P+L+q], [1,L+q]
        kwargs = {"attention_mask": mask, "position_ids": positions}
    keep: int | torch.Tensor = q
    if rows is not None:
        keep = torch.tensor([len(prefix) + r for r in rows], dtype=torch.long, device=device)
    try:
        with tree_pass_attention(device):
            out = model(input_ids=input_ids, **cache_kwargs(model, cache), use_cache=True,
                        logits_to_keep=keep, **kwargs)
    except BaseException:
        rollback(cache, past_len)
        raise
    return out.logits[0, -q:] if rows is None else out.logits[0]  # [q or len(rows), V]


def _native_keep(cache: Any, past_len: int, node_indices: Sequence[int]) -> bool:
    """:func:`keep_path`'s row moves by the native ``kvmove`` kernel, every layer in one
    call (``structspec/_native/kvmove.c``); ``False`` (nothing changed) where it does not
    apply: not built, or layers that are not all CPU tensors of one shape, layout and dtype,
    one batch row ``[1, H, L, D]`` with contiguous rows (a decoding cache's are). Per layer
    only a comparison with the first layer's signature: the checks, not the copies, were
    most of a compaction's time."""
    kernel = _native.load("kvmove")
    if kernel is None or len(node_indices) > kernel.MAX_PATH:  # its index buffer
        return False
    need = past_len + max(node_indices) + 1
    ref: tuple[Any, ...] | None = None
    ptrs: list[int] = []
    layers = []
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is None or keys.dim() < 2 or keys.shape[-2] <= past_len:
            continue
        for t in (keys, layer.values):
            sig = (t.shape, t.stride(), t.dtype, t.is_cpu)
            if sig != ref:
                if ref is not None or not _rows_layout(t, need):
                    return False
                ref = sig
            ptrs.append(t.data_ptr())
        layers.append(layer)
    if ref is None:
        return False
    shape, stride, size = ref[0], ref[1], layers[0].keys.element_size()
    kernel.keep_rows(ptrs, shape[1], stride[1] * size, shape[3] * size, past_len,
                     list(node_indices))
    end = past_len + len(node_indices)
    for layer in layers:
        layer.keys = layer.keys.narrow(2, 0, end)
        layer.values = layer.values.narrow(2, 0, end)
    return True


def _rows_layout(t: torch.Tensor, need: int) -> bool:
    """Whether ``t`` is what the ``kvmove`` kernel moves rows of: a CPU ``[1, H, L, D]``
    tensor of at least ``need`` rows, each row ``D`` contiguous elements, heads apart by at
    least a head's rows."""
    if not t.is_cpu or t.dim() != 4 or t.shape[0] != 1 or t.shape[2] < need:
        return False
    stride = t.stride()
    return stride[3] == 1 and stride[2] == t.shape[3] and (
        t.shape[1] == 1 or stride[1] >= t.shape[2] * t.shape[3])


def keep_path(cache: Any, past_len: int, node_indices: Sequence[int]) -> None:
    """Keep only ``node_indices`` of the tree segment in ``cache``. Mutates ``cache``.

    Args:
        cache: a cache holding ``past_len`` committed tokens followed by a tree's nodes.
        past_len: the committed length before the tree.
        node_indices: the accepted path, root first, ascending (a path in a topologically
            ordered tree always is).

    Afterwards the cache holds ``past_len + len(node_indices)`` tokens: the past, then the
    kept nodes in order (their positions ``past_len + depth`` are already right, since a
    path's depths are ``0, 1, 2, ...``).
    """
    k = len(node_indices)
    if any(b <= a for a, b in itertools.pairwise(node_indices)):
        raise ValueError(f"node_indices must be ascending, got {list(node_indices)}")
    log_op(cache, ("keep", past_len, list(node_indices)))
    # The path's leading nodes that are already where they belong (the root, and a chain
    # drafted first: node i at slot i) stay; only the rest move. A pass's compaction was
    # ~0.3 ms of index copies over every layer on one thread (prose: ~1.4% of a request).
    moved = next((i for i, node in enumerate(node_indices) if node != i), k)
    if moved == k:  # already in place: just crop
        _crop(cache, past_len + k)
        return
    if _native_keep(cache, past_len, node_indices):
        return
    rest = node_indices[moved:]
    start, end = past_len + moved, past_len + k
    index = None
    with torch.inference_mode():
        for layer in cache.layers:
            keys = getattr(layer, "keys", None)
            if keys is None or keys.dim() < 2 or keys.shape[-2] <= past_len:
                continue
            values = layer.values
            if index is None or index.device != keys.device:
                index = torch.as_tensor(rest, dtype=torch.long, device=keys.device)
                index = index + past_len  # [k - moved]
            kept_k = keys.index_select(-2, index)  # [B, H, k - moved, D]
            kept_v = values.index_select(-2, index)
            # Overwrite the tree segment in place, then crop: no copy of the past.
            keys[..., start:end, :] = kept_k
            values[..., start:end, :] = kept_v
            layer.keys = keys[..., :end, :]
            layer.values = values[..., :end, :]
